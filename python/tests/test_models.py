"""Every committed fixture and every real model, compiled and run from
Python, matches onnxruntime: the committed reference outputs, and for a
sample the live onnxruntime session in the same process."""

import numpy as np
import pytest

import kiln
from conftest import FIXTURES, FP32_TOLERANCE, Fixture, real_model, rel_error

FIXTURE_NAMES = sorted(p.name for p in FIXTURES.iterdir() if (p / "meta.json").exists())


def compile_and_run(fixture: Fixture, tmp_path, **kwargs) -> dict:
    artifact = tmp_path / f"{fixture.name}.kiln"
    report = kiln.compile(fixture.dir / "model.onnx", artifact, **fixture.compile_kwargs(), **kwargs)
    assert report["output"] == str(artifact)
    model = kiln.load(artifact)
    assert [o.name for o in model.outputs] == [o["name"] for o in report["outputs"]]
    return model.run(fixture.arrays("inputs"))


def test_fixture_count():
    assert len(FIXTURE_NAMES) > 150, FIXTURE_NAMES


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_fixture_matches_onnxruntime_reference(name, tmp_path):
    fixture = Fixture(FIXTURES / name)
    outputs = compile_and_run(fixture, tmp_path)
    references = fixture.arrays("outputs")
    assert list(outputs) == list(references)
    for out_name, reference in references.items():
        err = rel_error(outputs[out_name], reference)
        assert err <= fixture.tolerance, f"{name}: output {out_name}: rel error {err:.3e}"


@pytest.mark.parametrize("name", ["digits_cnn", "zoo_resnet18", "zoo_bert", "zoo_lstm"])
def test_matches_a_live_onnxruntime_session(name, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    fixture = Fixture(FIXTURES / name)
    inputs = fixture.arrays("inputs")
    rng = np.random.default_rng(7)
    # Fresh inputs of the reference's dtype and shape, not the committed ones.
    fresh = {
        k: (rng.standard_normal(v.shape).astype(v.dtype) if v.dtype.kind == "f" else v)
        for k, v in inputs.items()
    }
    artifact = tmp_path / "m.kiln"
    kiln.compile(fixture.dir / "model.onnx", artifact, **fixture.compile_kwargs())
    outputs = kiln.load(artifact).session(threads=2).run(fresh)
    session = ort.InferenceSession(str(fixture.dir / "model.onnx"), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    for out_name, reference in zip(names, session.run(None, fresh)):
        err = rel_error(outputs[out_name], reference)
        assert err <= FP32_TOLERANCE, f"{name}: output {out_name}: rel error {err:.3e}"


# (model, tolerance): fp32 models at the fp32 bar; onnxruntime's own int8
# models at the bars of tests/tests/real_models.rs.
REAL = [
    ("ppocrv4_det", FP32_TOLERANCE),
    ("ppocrv4_rec", FP32_TOLERANCE),
    ("minilm_l3", FP32_TOLERANCE),
    ("minilm_l3_sentences", FP32_TOLERANCE),
    ("silero_vad", FP32_TOLERANCE),
    ("minilm_l3_int8", 3e-2),
    ("minilm_l3_qdq", 3e-2),
    ("ppocrv4_rec_qdq", 0.25),
]


@pytest.mark.parametrize("name,tolerance", REAL)
def test_real_model_matches_onnxruntime(name, tolerance, tmp_path):
    fixture = real_model(name)
    outputs = compile_and_run(fixture, tmp_path)
    for out_name, reference in fixture.arrays("outputs").items():
        err = rel_error(outputs[out_name], reference)
        assert err <= tolerance, f"{name}: output {out_name}: rel error {err:.3e}"


def test_minilm_sequences_pad_under_their_mask(tmp_path):
    """MiniLM compiled with `pad_dims=["sequence_length"]` runs sentences of
    any length up to its largest profile, padded to the next one, and
    matches a live onnxruntime session at the sentences' own length."""
    ort = pytest.importorskip("onnxruntime")
    fixture = real_model("minilm_l3")
    artifact = tmp_path / "padded.kiln"
    dims = {"batch_size": [1, 4], "sequence_length": [16, 48]}
    kiln.compile(
        fixture.dir / "model.onnx",
        artifact,
        dims=dims,
        pad_dims=["batch_size", "sequence_length"],
    )
    model = kiln.load(artifact)
    session = ort.InferenceSession(str(fixture.dir / "model.onnx"), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    rng = np.random.default_rng(3)
    for batch, length in [(1, 5), (1, 33), (3, 17), (2, 48)]:
        ids = rng.integers(1000, 30000, (batch, length), dtype=np.int64)
        mask = np.ones((batch, length), np.int64)
        for row in range(batch):
            mask[row, rng.integers(1, length + 1):] = 0
        feeds = {"input_ids": ids, "attention_mask": mask}
        got = model.run(feeds)
        for name, want in zip(names, session.run(None, feeds)):
            assert got[name].shape == want.shape, (batch, length, name)
            err = rel_error(got[name], want)
            assert err <= FP32_TOLERANCE, f"{batch}x{length}: output {name}: rel error {err:.3e}"
