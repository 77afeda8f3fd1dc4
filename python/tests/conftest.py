"""Shared paths and helpers of the pytest suite of the `kiln` package."""

import json
import os
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures" / "models"
REAL_MODELS = Path(os.environ.get("KILN_REAL_MODELS", REPO / "target" / "real-models"))

# fp32 bar of the Rust suite (tests/tests/fixtures.rs): max abs error
# relative to the largest reference magnitude.
FP32_TOLERANCE = 1e-4
# Fixtures with int8 layers (meta.json "tolerance": "int8", the contrib
# models onnxruntime quantized): tests/tests/contrib.rs's bar.
INT8_TOLERANCE = 3e-2


def rel_error(actual: np.ndarray, reference: np.ndarray) -> float:
    """Max abs error over the reference's largest finite magnitude, as
    kiln::compare does (NaN matches NaN; a shape or dtype mismatch fails)."""
    assert actual.dtype == reference.dtype, (actual.dtype, reference.dtype)
    assert actual.shape == reference.shape, (actual.shape, reference.shape)
    a = actual.astype(np.float64)
    r = reference.astype(np.float64)
    same = (a == r) | (np.isnan(a) & np.isnan(r))
    err = np.where(same, 0.0, np.abs(a - r))
    err = np.where(np.isnan(err), np.inf, err)
    finite = np.abs(r[np.isfinite(r)])
    scale = finite.max() if finite.size else 0.0
    worst = err.max() if err.size else 0.0
    return worst / scale if scale > 0 else worst


class Fixture:
    """A model directory with meta.json, reference inputs and onnxruntime's
    outputs (fixtures/models/*, target/real-models/*)."""

    def __init__(self, directory: Path):
        self.dir = directory
        self.name = directory.name
        self.meta = json.loads((directory / "meta.json").read_text())

    @property
    def tolerance(self) -> float:
        return INT8_TOLERANCE if self.meta.get("tolerance") == "int8" else FP32_TOLERANCE

    def compile_kwargs(self) -> dict:
        return {
            "input_shapes": self.meta.get("input_shapes") or None,
            "dims": self.meta.get("dims") or None,
            "bind_inputs": {
                name: str(self.dir / file) for name, file in (self.meta.get("bind_inputs") or {}).items()
            }
            or None,
        }

    def arrays(self, key: str) -> dict:
        return {io["name"]: np.load(self.dir / io["file"]) for io in self.meta[key]}


def real_model(name: str) -> Fixture:
    directory = REAL_MODELS / name
    if not (directory / "meta.json").exists():
        if os.environ.get("KILN_REQUIRE_REAL_MODELS") == "1":
            pytest.fail(f"real model {name} missing under {REAL_MODELS} (scripts/real-models.sh)")
        pytest.skip(f"real model {name} not fetched (scripts/real-models.sh)")
    return Fixture(directory)
