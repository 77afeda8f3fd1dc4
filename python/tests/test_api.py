"""The Python API beyond matching outputs: exceptions that mirror the
command line's exit codes and messages, every dtype in and out, sessions,
caller-given outputs, concurrent runs from many threads, calibration from
Python samples and signed artifacts."""

import json
import os
import subprocess
import sys
import threading

import ml_dtypes
import numpy as np
import pytest

import kiln
from conftest import FIXTURES, REPO, FP32_TOLERANCE, Fixture, rel_error

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

KILN_BIN = os.environ.get("KILN_BIN", str(REPO / "target" / "debug" / "kiln"))
DIGITS = FIXTURES / "digits_cnn" / "model.onnx"


def cli(*args) -> subprocess.CompletedProcess:
    """The `kiln` command, for comparing its exit code and message."""
    if not os.path.exists(KILN_BIN):
        pytest.fail(f"the kiln command is not built at {KILN_BIN} (cargo build, or set KILN_BIN)")
    return subprocess.run([KILN_BIN, *map(str, args)], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    path = tmp_path_factory.mktemp("digits") / "digits.kiln"
    kiln.compile(DIGITS, path, dims={"batch": 4})
    return path


def cast_model(in_type, out_type, shape=(2, 3)) -> bytes:
    """y = Cast(Cast(x, float) * 2 + 1, out_type): a model whose input and
    output are of the given ONNX element types."""
    nodes = [
        helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["xf", "two"], ["m"]),
        helper.make_node("Add", ["m", "one"], ["a"]),
        helper.make_node("Cast", ["a"], ["y"], to=out_type),
    ]
    graph = helper.make_graph(
        nodes,
        "cast",
        [helper.make_tensor_value_info("x", in_type, list(shape))],
        [helper.make_tensor_value_info("y", out_type, list(shape))],
        [
            helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
            helper.make_tensor("one", TensorProto.FLOAT, [], [1.0]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model.SerializeToString()


def test_model_describes_its_inputs_and_outputs(digits):
    model = kiln.load(digits)
    (x,) = model.inputs
    assert (x.name, x.kiln_dtype, x.dtype, x.shape) == ("input", "f32", np.float32, (4, 1, 8, 8))
    assert [(o.name, o.shape) for o in model.outputs] == [("logits", (4, 10)), ("probs", (4, 10))]
    assert len(model.content_sha256) == 64
    assert "input: f32[4, 1, 8, 8]" in repr(model)


def onnxruntime_outputs(onnx_bytes: bytes, feeds: dict) -> list:
    """onnxruntime's outputs, bfloat16 included (its numpy bridge has no
    bfloat16: inputs go in as OrtValues, outputs come out as raw bytes)."""
    import ctypes

    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(onnx_bytes, providers=["CPUExecutionProvider"])
    values = {
        k: ort.OrtValue.ortvalue_from_numpy_with_onnx_type(v.view(np.uint16), TensorProto.BFLOAT16)
        if v.dtype == ml_dtypes.bfloat16
        else ort.OrtValue.ortvalue_from_numpy(v)
        for k, v in feeds.items()
    }
    outputs = []
    for value in session.run_with_ort_values(None, values):
        if value.data_type() == "tensor(bfloat16)":
            n = int(np.prod(value.shape()))
            raw = (ctypes.c_uint16 * n).from_address(value.data_ptr())
            outputs.append(np.array(raw, np.uint16).view(ml_dtypes.bfloat16).reshape(value.shape()))
        else:
            outputs.append(value.numpy())
    return outputs


HALF_MODELS = [
    (TensorProto.FLOAT16, TensorProto.FLOAT16),
    (TensorProto.BFLOAT16, TensorProto.BFLOAT16),
    (TensorProto.FLOAT16, TensorProto.FLOAT),
    (TensorProto.BFLOAT16, TensorProto.FLOAT),
]


def half_input(in_type) -> np.ndarray:
    dtype = ml_dtypes.bfloat16 if in_type == TensorProto.BFLOAT16 else np.float16
    return np.array([[0.5, -1.25, 3.0], [1e3, -0.0, 7.75]], dtype=np.float32).astype(dtype)


@pytest.mark.parametrize("in_type,out_type", HALF_MODELS)
def test_half_precision_inputs_and_outputs_match_onnxruntime(in_type, out_type, tmp_path):
    onnx_bytes = cast_model(in_type, out_type)
    artifact = tmp_path / "cast.kiln"
    kiln.compile(onnx_bytes, artifact)
    model = kiln.load(artifact)
    x = half_input(in_type)
    assert model.inputs[0].dtype == x.dtype
    y = model.run({"x": x})["y"]
    (reference,) = onnxruntime_outputs(onnx_bytes, {"x": x})
    assert y.dtype == model.outputs[0].dtype == reference.dtype
    assert y.tobytes() == reference.tobytes()


@pytest.mark.parametrize("in_type,out_type", HALF_MODELS)
def test_half_precision_files_through_kiln_run_match_onnxruntime(in_type, out_type, tmp_path):
    """`kiln run` reads float16 as numpy's <f2 and bfloat16 as the raw
    2-byte items ml_dtypes saves, and writes its outputs the same way."""
    onnx_bytes = cast_model(in_type, out_type)
    model_path = tmp_path / "cast.onnx"
    model_path.write_bytes(onnx_bytes)
    artifact = tmp_path / "cast.kiln"
    run = cli("compile", model_path, "-o", artifact)
    assert run.returncode == 0, run.stderr
    x = half_input(in_type)
    np.save(tmp_path / "x.npy", x)
    run = cli("run", artifact, "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", tmp_path / "out")
    assert run.returncode == 0, run.stderr
    y = np.load(tmp_path / "out" / "y.npy")
    (reference,) = onnxruntime_outputs(onnx_bytes, {"x": x})
    if y.dtype.kind == "V":  # ml_dtypes' raw items
        y = y.view(reference.dtype)
    assert y.dtype == reference.dtype and y.shape == reference.shape
    assert y.tobytes() == reference.tobytes()
    # The same file through Python: raw items read as the input's type.
    loaded = np.load(tmp_path / "x.npy")
    y = kiln.load(artifact).run({"x": loaded})["y"]
    assert y.tobytes() == reference.tobytes()


@pytest.mark.parametrize("dtype", ["f8e4m3fn", "f8e5m2", "i4", "u4"])
def test_narrow_types_cross_as_ml_dtypes(dtype, tmp_path):
    onnx_type = {
        "f8e4m3fn": TensorProto.FLOAT8E4M3FN,
        "f8e5m2": TensorProto.FLOAT8E5M2,
        "i4": TensorProto.INT4,
        "u4": TensorProto.UINT4,
    }[dtype]
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["f"], to=TensorProto.FLOAT),
         helper.make_node("Cast", ["f"], ["y"], to=onnx_type)],
        "narrow",
        [helper.make_tensor_value_info("x", onnx_type, [4])],
        [helper.make_tensor_value_info("y", onnx_type, [4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    artifact = tmp_path / "narrow.kiln"
    kiln.compile(model, artifact)
    m = kiln.load(artifact)
    assert m.inputs[0].kiln_dtype == dtype
    x = np.array([1, -2, 3, 0] if dtype != "u4" else [1, 2, 3, 0], dtype=np.float32).astype(m.inputs[0].dtype)
    y = m.run({"x": x})["y"]
    assert y.dtype == x.dtype and y.tobytes() == x.tobytes()


def test_sessions_reuse_caller_outputs(digits):
    model = kiln.load(digits)
    x = np.random.default_rng(0).random((4, 1, 8, 8), dtype=np.float32)
    expected = model.run({"input": x})
    session = model.session(threads=2)
    assert 1 <= session.threads <= model.max_threads
    out = {o.name: np.empty(o.shape, o.dtype) for o in model.outputs}
    for _ in range(3):
        got = session.run({"input": x}, out=out)
        assert all(got[k] is out[k] for k in out)
    for k in expected:
        assert expected[k].tobytes() == out[k].tobytes()
    # Lists take the input's dtype; a non-contiguous array is copied.
    assert model.run({"input": x.tolist()})["logits"].tobytes() == expected["logits"].tobytes()
    strided = np.asfortranarray(x)
    assert model.run({"input": strided})["logits"].tobytes() == expected["logits"].tobytes()


def test_runs_from_many_threads_agree(digits):
    model = kiln.load(digits)
    session = model.session(threads=2)
    rng = np.random.default_rng(1)
    xs = [rng.random((4, 1, 8, 8), dtype=np.float32) for _ in range(8)]
    expected = [model.run({"input": x})["probs"] for x in xs]
    failures = []

    def worker(i):
        for r in range(25):
            runner = session if r % 2 else model
            got = runner.run({"input": xs[i]})["probs"]
            if got.tobytes() != expected[i].tobytes():
                failures.append((i, r))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert failures == []


def test_compile_calibrates_from_python_samples(tmp_path):
    fixture = Fixture(FIXTURES / "digits_cnn")
    images = fixture.arrays("inputs")["input"]
    samples = [{"input": images[i : i + 8]} for i in range(0, 64, 8)]
    artifact = tmp_path / "int8.kiln"
    report = kiln.compile(DIGITS, artifact, dims={"batch": 8}, quantize="static", calibrate=samples)
    assert report["precision"] is not None
    model = kiln.load(artifact)
    x = images[64:72]
    got = model.run({"input": x})["probs"]
    reference = fixture.arrays("outputs")["probs"][64:72]
    assert rel_error(got, reference) < 0.1
    assert (got.argmax(1) == reference.argmax(1)).mean() >= 0.75


def test_compile_report_is_the_cli_report(tmp_path):
    report = kiln.compile(DIGITS, tmp_path / "a.kiln", dims={"batch": 2})
    run = cli("compile", DIGITS, "-o", tmp_path / "b.kiln", "--dim", "batch=2", "--json")
    assert run.returncode == 0, run.stderr
    cli_report = json.loads(run.stdout)
    assert set(report) == set(cli_report)
    assert report["content_sha256"] == cli_report["content_sha256"]
    assert (tmp_path / "a.kiln").read_bytes() == (tmp_path / "b.kiln").read_bytes()


def test_signed_artifacts_need_the_matching_key(tmp_path):
    key = tmp_path / "key.pem"
    assert cli("keygen", key).returncode == 0
    other = tmp_path / "other.pem"
    assert cli("keygen", other).returncode == 0
    artifact = tmp_path / "signed.kiln"
    report = kiln.compile(DIGITS, artifact, dims={"batch": 1}, sign=key)
    assert report["signature"] == str(artifact) + ".sig"
    pub = tmp_path / "key.pem.pub"
    kiln.load(artifact, public_key=pub)
    kiln.load(artifact, public_key=pub.read_bytes())
    with pytest.raises(kiln.InvalidArtifact):
        kiln.load(artifact, public_key=tmp_path / "other.pem.pub")


def bad_model(tmp_path):
    path = tmp_path / "garbage.onnx"
    path.write_bytes(b"\x08\x07this is not protobuf\xff\xff")
    return path


def bad_artifact(tmp_path):
    path = tmp_path / "bad.kiln"
    path.write_bytes(b"KILNART\x00" + b"\x00" * 64)
    return path


# Each bad-input class of the command line: the Python call, the same
# command, and the exception the exit code maps to.
BAD = [
    ("unbound dim", lambda t: kiln.compile(DIGITS, t / "o.kiln"), lambda t: ["compile", DIGITS, "-o", t / "o.kiln"], kiln.UnsupportedModel),
    ("bad precision", lambda t: kiln.compile(DIGITS, t / "o.kiln", precision="fp7"), lambda t: ["compile", DIGITS, "-o", t / "o.kiln", "--precision", "fp7"], kiln.UsageError),
    ("missing model", lambda t: kiln.compile(t / "none.onnx", t / "o.kiln"), lambda t: ["compile", t / "none.onnx", "-o", t / "o.kiln"], kiln.FileError),
    ("malformed model", lambda t: kiln.compile(bad_model(t), t / "o.kiln"), lambda t: ["compile", bad_model(t), "-o", t / "o.kiln"], kiln.InvalidModel),
    ("invalid artifact", lambda t: kiln.load(bad_artifact(t)), lambda t: ["run", bad_artifact(t), "--random"], kiln.InvalidArtifact),
]


@pytest.mark.parametrize("case", BAD, ids=[b[0] for b in BAD])
def test_failures_mirror_the_command_line(case, tmp_path):
    _, call, argv, exception = case
    with pytest.raises(exception) as raised:
        call(tmp_path)
    run = cli(*argv(tmp_path))
    assert run.returncode == exception.exit_code == raised.value.exit_code
    assert run.stderr.strip().splitlines()[-1] == f"error: {raised.value}".splitlines()[-1]
    assert isinstance(raised.value, kiln.KilnError)
    assert not (tmp_path / "o.kiln").exists()


def test_bad_inputs_are_input_errors(digits):
    model = kiln.load(digits)
    x = np.zeros((4, 1, 8, 8), np.float32)
    cases = [
        ({}, "missing input 'input'"),
        ({"input": x, "extra": x}, "unknown input 'extra'"),
        ({"input": x[:2]}, "expected f32[4,1,8,8], given f32[2,1,8,8]"),
        ({"input": x.astype(np.float64)}, "expected f32[4,1,8,8], given f64[4,1,8,8]"),
        ({"input": x.astype(np.complex64)}, "numpy dtype complex64 has no Kiln dtype"),
    ]
    for feeds, message in cases:
        with pytest.raises(kiln.InputError, match=message.replace("[", r"\[")):
            model.run(feeds)
    with pytest.raises(kiln.InputError, match=r"out\['probs'\]: .* got float64\[3\]"):
        model.run({"input": x}, out={"probs": np.zeros(3)})
    read_only = np.zeros((4, 10), np.float32)
    read_only.flags.writeable = False
    with pytest.raises(kiln.InputError, match="got read-only"):
        model.run({"input": x}, out={"probs": read_only})
    with pytest.raises(kiln.InputError, match="out must be a mapping"):
        model.run({"input": x}, out=[read_only])


def test_outputs_may_not_overlap_inputs(tmp_path):
    artifact = tmp_path / "cast.kiln"
    kiln.compile(cast_model(TensorProto.FLOAT16, TensorProto.FLOAT16), artifact)
    model = kiln.load(artifact)
    x = np.ones((2, 3), np.float16)
    with pytest.raises(kiln.InputError, match="shares memory with input 'x'"):
        model.run({"x": x}, out={"y": x})
    y = np.empty((2, 3), np.float16)
    assert model.run({"x": x}, out={"y": y})["y"] is y
    assert (y == 3).all()
    with pytest.raises(kiln.UsageError):
        model.session(threads=0)


def test_golden_self_test_runs_from_python(tmp_path):
    fixture = Fixture(FIXTURES / "digits_cnn")
    images = fixture.arrays("inputs")["input"]
    sets = [{"input": images[i : i + 4]} for i in (0, 4)]
    artifact = tmp_path / "golden.kiln"
    report = kiln.compile(DIGITS, artifact, dims={"batch": 4}, golden=sets)
    assert report["golden"]["tolerances"] == {"logits": 1e-4, "probs": 1e-4}
    model = kiln.load(artifact)
    checks = model.verify()
    assert [(c["set"], c["output"], c["passed"]) for c in checks] == [
        (0, "logits", True),
        (0, "probs", True),
        (1, "logits", True),
        (1, "probs", True),
    ]
    assert cli("verify", artifact).returncode == 0
    # int8 at a tolerance of 0: every output is beyond it, by name.
    strict = tmp_path / "strict.kiln"
    kiln.compile(DIGITS, strict, dims={"batch": 4}, quantize="dynamic", golden=sets, golden_tolerance=0.0)
    with pytest.raises(kiln.CheckFailed, match=r"golden outputs beyond tolerance on this machine: 'logits' \(set 0\)"):
        kiln.load(strict).verify()
    assert not all(c["passed"] for c in kiln.load(strict).verify(raise_on_failure=False))
    assert cli("verify", strict).returncode == 7
    plain = tmp_path / "plain.kiln"
    kiln.compile(DIGITS, plain, dims={"batch": 4})
    with pytest.raises(kiln.UsageError, match="has no golden self-test"):
        kiln.load(plain).verify()


def test_calibration_coverage_from_python(tmp_path):
    fixture = Fixture(FIXTURES / "digits_cnn")
    images = fixture.arrays("inputs")["input"]
    narrow = [{"input": images[i : i + 8] * 0.05} for i in range(0, 32, 8)]
    held_out = [{"input": images[i : i + 8]} for i in range(200, 232, 8)]
    report = kiln.compile(
        DIGITS, tmp_path / "c.kiln", dims={"batch": 8}, quantize="static", calibrate=narrow, validate=held_out
    )
    layers = report["coverage"]["layers"]
    assert layers[0]["warning"] and layers[0]["clipped_share"] > 0.1
    assert layers[0]["samples"], layers[0]


def test_kept_values_and_debug_against_onnxruntime_values(tmp_path):
    """`keep_values` from Python; `kiln debug --reference DIR` with every
    value onnxruntime computes, dumped by scripts/dump_values.py."""
    fixture = Fixture(FIXTURES / "digits_cnn")
    images = fixture.arrays("inputs")["input"][:4]
    artifact = tmp_path / "kept.kiln"
    kiln.compile(DIGITS, artifact, dims={"batch": 4}, keep_values=["relu*"])
    outputs = kiln.load(artifact).run({"input": images})
    assert list(outputs) == ["logits", "probs", "relu1", "relu2"]

    np.save(tmp_path / "input.npy", images)
    dump = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "dump_values.py"),
            DIGITS,
            "--input",
            f"input={tmp_path / 'input.npy'}",
            "-o",
            tmp_path / "ort",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert dump.returncode == 0, dump.stderr
    index = json.loads((tmp_path / "ort" / "values.json").read_text())["values"]
    assert {"conv1", "bn1", "relu1", "logits"} <= set(index)
    args = ["debug", DIGITS, "--dim", "batch=4", "--input", f"input={tmp_path / 'input.npy'}"]
    run = cli(*args, "--reference", tmp_path / "ort", "--json")
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(run.stdout)
    assert report["compared"] == len(report["values"]) == 9
    assert report["first_failure"] is None
    # An int8 build at a tolerance of 0 departs at its first quantized layer.
    run = cli(*args, "--reference", tmp_path / "ort", "--quantize", "dynamic", "--tolerance", "0", "--json")
    assert run.returncode == 7, run.stderr
    assert json.loads(run.stdout)["first_failure"] == "conv1"


def test_debug_from_python():
    """`kiln.debug`: the value comparison and the pass bisection as reports."""
    images = Fixture(FIXTURES / "digits_cnn").arrays("inputs")["input"][:4]
    report = kiln.debug(DIGITS, {"input": images}, dims={"batch": 4})
    assert report["first_failure"] is None and report["compared"] == 9
    assert [v["value"] for v in report["values"]][:3] == ["conv1", "bn1", "relu1"]
    strict = kiln.debug(DIGITS, {"input": images}, dims={"batch": 4}, quantize="dynamic", tolerance=0.0)
    assert strict["first_failure"] == "conv1"
    bisection = kiln.debug(DIGITS, dims={"batch": 4}, bisect_passes=True)
    assert bisection["culprit"] is None and bisection["trials"][0]["matched"]
    with pytest.raises(kiln.UsageError, match="--keep-values nothing_here names no computed value"):
        kiln.debug(DIGITS, dims={"batch": 4}, keep_values="nothing_here")


def test_profiles_serve_every_batch_compiled_for(tmp_path):
    """`dims={"batch": [...]}` makes one profile per batch size in one
    artifact; each run picks the profile of its inputs and matches
    onnxruntime's rows; a batch of no profile is an InputError."""
    fixture = Fixture(FIXTURES / "digits_cnn")
    images = fixture.arrays("inputs")["input"]
    expected = fixture.arrays("outputs")["logits"]
    path = tmp_path / "profiles.kiln"
    report = kiln.compile(DIGITS, path, dims={"batch": [1, 4, 360]})
    assert [p["bindings"] for p in report["profiles"]] == ["batch=1", "batch=4", "batch=360"]
    model = kiln.load(path)
    assert [p.inputs[0].shape for p in model.profiles] == [(1, 1, 8, 8), (4, 1, 8, 8), (360, 1, 8, 8)]
    session = model.session(threads=2)
    for rows in (4, 360, 1):
        for runner in (model, session):
            got = runner.run({"input": images[:rows]})["logits"]
            assert got.shape == (rows, 10)
            assert rel_error(got, expected[:rows]) <= FP32_TOLERANCE
    with pytest.raises(kiln.InputError, match="no profile"):
        model.run({"input": images[:5]})


def test_padded_batches_run_on_the_next_profile(tmp_path):
    """With `--pad-dim batch`, a batch between profiles runs padded on the
    next larger one and returns its own rows, as an exact build does."""
    fixture = Fixture(FIXTURES / "digits_cnn")
    images = fixture.arrays("inputs")["input"]
    path = tmp_path / "padded.kiln"
    kiln.compile(DIGITS, path, dims={"batch": [1, 8, 32]}, pad_dims=["batch"])
    exact_path = tmp_path / "exact.kiln"
    kiln.compile(DIGITS, exact_path, dims={"batch": 5})
    got = kiln.load(path).run({"input": images[:5]})
    want = kiln.load(exact_path).run({"input": images[:5]})
    for name in ("logits", "probs"):
        assert got[name].shape == (5, 10)
        assert rel_error(got[name], want[name]) <= 1e-6
    with pytest.raises(kiln.InputError, match="no profile"):
        kiln.load(path).run({"input": images[:33]})
