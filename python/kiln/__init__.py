"""Kiln: an ahead-of-time compiler for ONNX models, from Python.

>>> import kiln, numpy as np
>>> report = kiln.compile("model.onnx", "model.kiln")   # the CLI's --json report
>>> model = kiln.load("model.kiln")
>>> outputs = model.run({"x": np.zeros((1, 3, 224, 224), np.float32)})

``compile`` runs the command line's own code in process: the same options,
checks, messages and report as ``kiln compile --json``. ``load`` and ``run``
use the runtime: a run borrows the input arrays in place (no copy when they
are C-contiguous and of the model's dtype), writes into freshly allocated
(or caller-given) output arrays, and releases the GIL while it executes.
Every failure is a :class:`KilnError` subclass named for the ``kiln``
command's exit code, with the command's message.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from typing import Any, Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import ml_dtypes
import numpy as np

from . import _kiln
from ._kiln import (
    CheckFailed,
    FileError,
    InputError,
    InternalError,
    InvalidArtifact,
    InvalidModel,
    KilnError,
    UnsupportedModel,
    UsageError,
)

__version__ = _kiln.__version__

__all__ = [
    "compile",
    "debug",
    "load",
    "load_bytes",
    "Model",
    "Session",
    "Profile",
    "TensorInfo",
    "KilnError",
    "InternalError",
    "UsageError",
    "InvalidModel",
    "UnsupportedModel",
    "InvalidArtifact",
    "InputError",
    "CheckFailed",
    "FileError",
]

PathLike = Union[str, "os.PathLike[str]"]

# Kiln's dtype names and the numpy dtypes that hold them. The 8-, 4- and
# 2-bit kinds and bfloat16 are ml_dtypes' types: one element per byte (the
# code in its low bits), as Kiln's tensors hold them.
_NUMPY_DTYPES: Dict[str, np.dtype] = {
    name: np.dtype(t)
    for name, t in [
        ("f32", np.float32),
        ("f16", np.float16),
        ("bf16", ml_dtypes.bfloat16),
        ("f64", np.float64),
        ("i8", np.int8),
        ("u8", np.uint8),
        ("i16", np.int16),
        ("i32", np.int32),
        ("i64", np.int64),
        ("bool", np.bool_),
        ("u16", np.uint16),
        ("u32", np.uint32),
        ("u64", np.uint64),
        ("f8e4m3fn", ml_dtypes.float8_e4m3fn),
        ("f8e4m3fnuz", ml_dtypes.float8_e4m3fnuz),
        ("f8e5m2", ml_dtypes.float8_e5m2),
        ("f8e5m2fnuz", ml_dtypes.float8_e5m2fnuz),
        ("f4e2m1", ml_dtypes.float4_e2m1fn),
        ("i4", ml_dtypes.int4),
        ("u4", ml_dtypes.uint4),
        ("i2", ml_dtypes.int2),
        ("u2", ml_dtypes.uint2),
    ]
}
_KILN_DTYPES: Dict[np.dtype, str] = {d: name for name, d in _NUMPY_DTYPES.items()}


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """An input or output of a model."""

    name: str
    #: Kiln's name of the element type (``"f32"``, ``"bf16"``, ...).
    kiln_dtype: str
    #: The numpy dtype that holds it (ml_dtypes' for bfloat16 and the
    #: 8-, 4- and 2-bit kinds).
    dtype: np.dtype
    shape: Tuple[int, ...]

    @classmethod
    def _of(cls, spec: Tuple[str, str, Sequence[int]]) -> "TensorInfo":
        name, kiln_dtype, shape = spec
        return cls(name, kiln_dtype, _NUMPY_DTYPES[kiln_dtype], tuple(shape))


def _flat_bytes(a: np.ndarray) -> np.ndarray:
    """The array's element bytes as a flat uint8 view (a copy only when it
    is not C-contiguous)."""
    a = np.ascontiguousarray(a)
    return a.reshape(-1).view(np.uint8)


class Profile(NamedTuple):
    """One specialization of a model to input shapes: its inputs and
    outputs with their shapes."""

    inputs: Tuple[TensorInfo, ...]
    outputs: Tuple[TensorInfo, ...]


class _Runner:
    """What Model and Session share: input conversion and output arrays."""

    _native: Any
    _inputs: Dict[str, TensorInfo]
    _outputs: Tuple[TensorInfo, ...]
    _profiles: Tuple["Profile", ...]
    _paddable: bool
    _model_native: Any

    @property
    def inputs(self) -> Tuple[TensorInfo, ...]:
        """The inputs, in declared order."""
        return tuple(self._inputs.values())

    @property
    def outputs(self) -> Tuple[TensorInfo, ...]:
        """The outputs, in declared order (the first profile's shapes)."""
        return self._outputs

    @property
    def profiles(self) -> Tuple["Profile", ...]:
        """The input shapes the artifact was compiled for (``kiln compile
        --dim batch=1,8``: two profiles), each with its inputs and outputs.
        A run uses the profile of its inputs' shapes."""
        return self._profiles

    def _outputs_for(self, tuples: list) -> Tuple[TensorInfo, ...]:
        """The outputs of a run of these inputs: the profile their shapes
        pick, cut back where the run pads (``kiln compile --pad-dim``)."""
        if len(self._profiles) == 1 and not self._paddable:
            return self._outputs
        shapes = self._model_native.output_shapes(tuples)
        return tuple(dataclasses.replace(o, shape=tuple(s)) for o, s in zip(self._outputs, shapes))

    def _input_tuples(self, feeds: Mapping[str, Any]) -> list:
        if not isinstance(feeds, Mapping):
            raise InputError(
                f"inputs must be a mapping of input name to array, got {type(feeds).__name__}"
            )
        tuples = []
        for name, value in feeds.items():
            info = self._inputs.get(name)
            if not isinstance(value, np.ndarray):
                # Lists and scalars take the input's dtype; arrays must
                # already have it (no silent conversion of real data).
                value = np.asarray(value, dtype=info.dtype if info else None)
            elif info is not None and value.dtype.kind == "V" and value.dtype.itemsize == info.dtype.itemsize:
                # ml_dtypes arrays (bfloat16, float8, int4) saved to .npy or
                # .npz load back as raw items of their size: read them as
                # the input's type, as `kiln run` does.
                value = value.view(info.dtype)
            kiln_dtype = _KILN_DTYPES.get(value.dtype)
            if kiln_dtype is None:
                want = f"; the model wants {info.kiln_dtype}[{','.join(map(str, info.shape))}]" if info else ""
                raise InputError(
                    f"input '{name}': numpy dtype {value.dtype} has no Kiln dtype{want}"
                )
            tuples.append((str(name), kiln_dtype, list(value.shape), _flat_bytes(value)))
        return tuples

    def _output_arrays(
        self, out: Optional[Mapping[str, np.ndarray]], specs: Tuple[TensorInfo, ...]
    ) -> Dict[str, np.ndarray]:
        if out is None:
            return {o.name: np.empty(o.shape, o.dtype) for o in specs}
        if not isinstance(out, Mapping):
            raise InputError(f"out must be a mapping of output name to array, got {type(out).__name__}")
        arrays = {}
        for o in specs:
            a = out.get(o.name)
            if a is None:
                arrays[o.name] = np.empty(o.shape, o.dtype)
                continue
            want = f"{o.dtype}[{','.join(map(str, o.shape))}]"
            if not isinstance(a, np.ndarray):
                problem = f"a {type(a).__name__}"
            elif a.dtype != o.dtype or a.shape != o.shape:
                problem = f"{a.dtype}[{','.join(map(str, a.shape))}]"
            elif not a.flags.c_contiguous:
                problem = "not C-contiguous"
            elif not a.flags.writeable:
                problem = "read-only"
            else:
                arrays[o.name] = a
                continue
            raise InputError(
                f"out['{o.name}']: expected a writeable C-contiguous array of {want}, got {problem}"
            )
        return arrays

    def _check_no_overlap(self, inputs: list, outputs: Dict[str, np.ndarray]) -> None:
        # A kernel may write an output before it has read all of an input.
        for name, out in outputs.items():
            for in_name, _, _, data in inputs:
                if np.may_share_memory(out, data):
                    raise InputError(
                        f"out['{name}'] shares memory with input '{in_name}': give an output array of its own"
                    )

    def run(
        self,
        inputs: Mapping[str, Any],
        out: Optional[Mapping[str, np.ndarray]] = None,
    ) -> Dict[str, np.ndarray]:
        """Runs one inference.

        ``inputs`` maps every input name to an array of the input's dtype
        and of the shapes of one of the :attr:`profiles` (lists and scalars
        are converted to the input's dtype).
        Returns the outputs by name, in declared order. With ``out``
        (arrays of the outputs' dtype and shape, C-contiguous), writes into
        those arrays instead of allocating. An output whose size depends on
        the data (``docs/bounded.md``) is planned at its bound: its array
        (or ``out``'s) holds the run's data at its start, and the result is
        a view of the run's shape. The GIL is released while the run
        executes.
        """
        tuples = self._input_tuples(inputs)
        outputs = self._output_arrays(out, self._outputs_for(tuples))
        if out is not None:
            self._check_no_overlap(tuples, outputs)
        shapes = self._native.run_into(tuples, [_flat_bytes(a) for a in outputs.values()])
        for (name, array), shape in zip(list(outputs.items()), shapes):
            shape = tuple(shape)
            if array.shape != shape:
                outputs[name] = array.reshape(-1)[: int(np.prod(shape, dtype=np.int64))].reshape(shape)
        return outputs


class Model(_Runner):
    """A loaded artifact. Immutable and safe to share between threads:
    concurrent :meth:`run` calls each get their own working memory."""

    def __init__(self, native: Any):
        self._native = native
        self._inputs = {i.name: i for i in map(TensorInfo._of, native.inputs)}
        self._outputs = tuple(map(TensorInfo._of, native.outputs))
        self._profiles = tuple(
            Profile(tuple(map(TensorInfo._of, ins)), tuple(map(TensorInfo._of, outs)))
            for ins, outs in native.profiles
        )
        self._paddable = native.paddable
        self._model_native = native

    @property
    def target(self) -> str:
        """The artifact's target (``x86_64-avx512``, ...)."""
        return self._native.target

    @property
    def content_sha256(self) -> str:
        """The SHA-256 of the artifact's content (what a signature signs)."""
        return self._native.content_sha256

    @property
    def max_threads(self) -> int:
        """The most threads a session of this model can use."""
        return self._native.max_tasks

    def session(self, threads: Optional[int] = None) -> "Session":
        """A session for repeated runs: its own working memory and
        ``threads`` threads (default: every core, at most
        :attr:`max_threads`), kept until it is garbage-collected. A
        session's runs allocate nothing but their output arrays (none with
        ``out=``); one session runs one inference at a time."""
        if threads is None:
            threads = os.cpu_count() or 1
        if not isinstance(threads, int) or threads < 1:
            raise UsageError(f"threads must be a positive integer, got {threads!r}")
        return Session(self, self._native.session(threads))

    def verify(self, raise_on_failure: bool = True) -> List[Dict[str, Any]]:
        """Runs the artifact's golden self-test (``kiln compile --golden``)
        on this machine: every stored input set, every output against the
        source model's value. Returns one dict per set and output (``set``,
        ``output``, ``max_abs_error``, ``scale``, ``rel_error``,
        ``tolerance``, ``passed``, ``mismatch``); raises
        :class:`CheckFailed` naming the outputs beyond tolerance unless
        ``raise_on_failure`` is false, and :class:`UsageError` for an
        artifact without a self-test."""
        keys = ("set", "output", "max_abs_error", "scale", "rel_error", "tolerance", "passed", "mismatch")
        checks = [dict(zip(keys, c)) for c in self._native.verify()]
        failed = [f"'{c['output']}' (set {c['set']})" for c in checks if not c["passed"]]
        if failed and raise_on_failure:
            raise CheckFailed(
                f"{len(failed)} of {len(checks)} golden outputs beyond tolerance on this machine: "
                + ", ".join(failed)
            )
        return checks

    def __repr__(self) -> str:
        ins = ", ".join(f"{i.name}: {i.kiln_dtype}{list(i.shape)}" for i in self.inputs)
        outs = ", ".join(f"{o.name}: {o.kiln_dtype}{list(o.shape)}" for o in self.outputs)
        return f"<kiln.Model ({ins}) -> ({outs}) for {self.target}>"


class Session(_Runner):
    """Repeated runs of one model on its own threads and working memory
    (see :meth:`Model.session`)."""

    def __init__(self, model: Model, native: Any):
        self._model = model
        self._native = native
        self._inputs = model._inputs
        self._outputs = model._outputs
        self._profiles = model._profiles
        self._paddable = model._paddable
        self._model_native = model._model_native

    @property
    def threads(self) -> int:
        """Threads this session's runs use."""
        return self._native.threads


def load(path: PathLike, public_key: Optional[Union[PathLike, bytes]] = None) -> Model:
    """Loads a ``.kiln`` artifact.

    With ``public_key`` (a PEM file's path, or PEM text as ``bytes`` or a
    string starting with ``-----BEGIN``), loads only an artifact whose
    detached signature (``PATH.sig``, from ``kiln compile --sign``) was made
    with the matching secret key, as ``kiln run --public-key`` does.
    """
    key_file = key_pem = None
    if isinstance(public_key, bytes):
        key_pem = public_key.decode("ascii", errors="replace")
    elif isinstance(public_key, str) and public_key.lstrip().startswith("-----BEGIN"):
        key_pem = public_key
    elif public_key is not None:
        key_file = os.fspath(public_key)
    return Model(_kiln.Model.load(os.fspath(path), key_file, key_pem))


def load_bytes(data: Union[bytes, bytearray, memoryview]) -> Model:
    """Loads an artifact held in memory (for example, sent to a serving
    replica on another machine). The bytes are checked exactly as a file's
    are; a signed artifact's signature is checked by :func:`load` only."""
    return Model(_kiln.Model.from_bytes(bytes(data)))


def _shape_text(shape: Union[str, Sequence[int]]) -> str:
    return shape if isinstance(shape, str) else "x".join(str(int(d)) for d in shape)


def compile(
    model: Union[PathLike, bytes, Any],
    output: PathLike,
    *,
    target: str = "native",
    input_shapes: Optional[Mapping[str, Union[str, Sequence[int]]]] = None,
    dims: Optional[Mapping[str, Union[int, str, Sequence[int]]]] = None,
    precision: Optional[str] = None,
    quantize: Optional[str] = None,
    calibrate: Optional[Union[PathLike, Iterable[Mapping[str, np.ndarray]]]] = None,
    threads: Optional[int] = None,
    opt_level: int = 2,
    observer: Optional[str] = None,
    activation_type: Optional[str] = None,
    keep_fp32: Optional[Union[str, Sequence[str]]] = None,
    force: Optional[Mapping[str, Union[str, Sequence[str]]]] = None,
    max_rel_error: Optional[float] = None,
    bind_inputs: Optional[Mapping[str, Union[PathLike, np.ndarray]]] = None,
    sign: Optional[PathLike] = None,
    golden: Optional[Union[PathLike, Iterable[Mapping[str, np.ndarray]]]] = None,
    golden_tolerance: Optional[float] = None,
    validate: Optional[Union[PathLike, Iterable[Mapping[str, np.ndarray]]]] = None,
    coverage_warn: Optional[float] = None,
    keep_values: Optional[Union[str, Sequence[str]]] = None,
    pad_dims: Sequence[str] = (),
    args: Sequence[str] = (),
) -> Dict[str, Any]:
    """Compiles an ONNX model into a ``.kiln`` artifact at ``output``.

    ``model`` is a path, the model's bytes, or an ``onnx.ModelProto``. The
    keywords are ``kiln compile``'s flags (``kiln compile --help`` says
    what each accepts); ``args`` passes any other flags as written on the
    command line. ``calibrate`` (with ``quantize="static"``) is a directory
    of ``.npz`` samples or an iterable of ``{input name: array}`` samples;
    ``golden`` (the self-test :meth:`Model.verify` runs) and ``validate``
    (held-out samples for the calibration coverage report, in the result's
    ``"coverage"``; ``coverage_warn`` in percent) take the same.
    ``keep_values`` (``"all"`` or ONNX tensor-name globs) makes those
    values extra outputs of the artifact, after the model's own. A dim
    given several values (``dims={"batch": [1, 8, 32]}`` or
    ``{"seq": "16..512:16"}``) makes one profile per value in one artifact
    (:attr:`Model.profiles`); a run picks the profile of its inputs' shapes.
    ``pad_dims`` names dims a run may pad up to the next profile
    (``--pad-dim``; refused when an op combines rows along them).

    Returns the report ``kiln compile --json`` prints, as Python objects.
    Raises the :class:`KilnError` subclass of the command's exit code.
    """
    with tempfile.TemporaryDirectory(prefix="kiln-compile-") as scratch:
        argv = [_model_path(model, scratch), "-o", os.fspath(output)]
        argv += _model_flags(target, input_shapes, dims, precision, quantize, opt_level)
        for flag, value in [
            ("--threads", threads),
            ("--observer", observer),
            ("--activation-type", activation_type),
            ("--max-rel-error", max_rel_error),
            ("--sign", sign),
            ("--golden-tolerance", golden_tolerance),
            ("--coverage-warn", coverage_warn),
        ]:
            if value is not None:
                argv += [flag, os.fspath(value) if isinstance(value, os.PathLike) else str(value)]
        if keep_fp32 is not None:
            argv += ["--keep-fp32", _patterns(keep_fp32)]
        if keep_values is not None:
            argv += ["--keep-values", _patterns(keep_values)]
        for prec, patterns in (force or {}).items():
            argv += ["--force", f"{prec}={_patterns(patterns)}"]
        for name, value in (bind_inputs or {}).items():
            if isinstance(value, np.ndarray):
                path = os.path.join(scratch, f"bind-{len(argv)}.npy")
                np.save(path, value)
                value = path
            argv += ["--bind-input", f"{name}={os.fspath(value)}"]
        if calibrate is not None:
            argv += ["--calibrate", _calibration_dir(calibrate, scratch)]
        if golden is not None:
            argv += ["--golden", _calibration_dir(golden, scratch, "golden")]
        if validate is not None:
            argv += ["--validate", _calibration_dir(validate, scratch, "validate")]
        for name in pad_dims:
            argv += ["--pad-dim", name]
        argv += list(args)
        return json.loads(_kiln.compile_report(argv))


def debug(
    model: Union[PathLike, bytes, Any],
    inputs: Optional[Mapping[str, np.ndarray]] = None,
    *,
    target: str = "native",
    input_shapes: Optional[Mapping[str, Union[str, Sequence[int]]]] = None,
    dims: Optional[Mapping[str, int]] = None,
    precision: Optional[str] = None,
    quantize: Optional[str] = None,
    opt_level: int = 2,
    calibrate: Optional[Union[PathLike, Iterable[Mapping[str, np.ndarray]]]] = None,
    keep_values: Optional[Union[str, Sequence[str]]] = None,
    reference: Optional[PathLike] = None,
    tolerance: Optional[float] = None,
    bisect_passes: bool = False,
    args: Sequence[str] = (),
) -> Dict[str, Any]:
    """Where the compiled model departs from its source (``kiln debug``).

    Compiles ``model`` as :func:`compile` would (same keywords), runs it on
    ``inputs`` (``{input name: array}``; ``None``: seeded random values) and
    compares every value (or those ``keep_values`` names) with the
    reference evaluator on the source graph, or with onnxruntime's values
    in ``reference`` (``scripts/dump_values.py``). With ``bisect_passes``,
    finds the pass whose addition makes the outputs depart instead.

    Returns the report ``kiln debug --json`` prints: ``first_failure`` and
    ``values`` (or ``culprit`` and ``trials`` when bisecting). A value
    beyond tolerance is in the report, not an exception; a model or option
    that cannot work raises the :class:`KilnError` subclass of its exit
    code.
    """
    with tempfile.TemporaryDirectory(prefix="kiln-debug-") as scratch:
        argv = [_model_path(model, scratch)]
        argv += _model_flags(target, input_shapes, dims, precision, quantize, opt_level)
        if inputs is None:
            argv.append("--random")
        else:
            for i, (name, value) in enumerate(inputs.items()):
                path = os.path.join(scratch, f"input-{i}.npy")
                np.save(path, np.asarray(value))
                argv += ["--input", f"{name}={path}"]
        if calibrate is not None:
            argv += ["--calibrate", _calibration_dir(calibrate, scratch)]
        if keep_values is not None:
            argv += ["--keep-values", _patterns(keep_values)]
        if reference is not None:
            argv += ["--reference", os.fspath(reference)]
        if tolerance is not None:
            argv += ["--tolerance", str(tolerance)]
        if bisect_passes:
            argv.append("--bisect-passes")
        argv += list(args)
        return json.loads(_kiln.debug_report(argv))


def _model_flags(
    target: str,
    input_shapes: Optional[Mapping[str, Union[str, Sequence[int]]]],
    dims: Optional[Mapping[str, Union[int, str, Sequence[int]]]],
    precision: Optional[str],
    quantize: Optional[str],
    opt_level: int,
) -> List[str]:
    """The flags :func:`compile` and :func:`debug` share."""
    argv = ["-O", str(opt_level), "--target", target]
    for name, shape in (input_shapes or {}).items():
        argv += ["--input-shape", f"{name}={_shape_text(shape)}"]
    for name, value in (dims or {}).items():
        # A list of values, or "16..512:16", makes one profile each.
        if not isinstance(value, (int, str)):
            value = ",".join(str(int(v)) for v in value)
        argv += ["--dim", f"{name}={value}"]
    for flag, value in [("--precision", precision), ("--quantize", quantize)]:
        if value is not None:
            argv += [flag, str(value)]
    return argv


def _patterns(p: Union[str, Sequence[str]]) -> str:
    return p if isinstance(p, str) else ",".join(p)


def _model_path(model: Any, scratch: str) -> str:
    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model)
    if hasattr(model, "SerializeToString"):
        model = model.SerializeToString()
    if isinstance(model, (bytes, bytearray, memoryview)):
        path = os.path.join(scratch, "model.onnx")
        with open(path, "wb") as f:
            f.write(model)
        return path
    raise UsageError(
        f"model must be a path, bytes or an onnx.ModelProto, got {type(model).__name__}"
    )


def _calibration_dir(calibrate: Any, scratch: str, flag: str = "calibrate") -> str:
    """A directory of ``.npz`` samples: ``calibrate`` itself when it is a
    path, else its ``{input name: array}`` samples written under
    ``scratch`` (``flag`` names the keyword in errors)."""
    if isinstance(calibrate, (str, os.PathLike)):
        return os.fspath(calibrate)
    directory = os.path.join(scratch, flag)
    os.mkdir(directory)
    for i, sample in enumerate(calibrate):
        if not isinstance(sample, Mapping):
            raise UsageError(
                f"{flag}: sample {i} is a {type(sample).__name__}, not a mapping of "
                "input name to array"
            )
        # The driver reads the samples in name order.
        np.savez(os.path.join(directory, f"sample-{i:08d}.npz"), **sample)
    return directory
