"""Measure the rational approximations of `targets/cpu/src/lower/math.rs`
(`OddRational`: `x · N(x²) / D(x²)` on x clamped to ±clamp) in f32, the
way the kernels evaluate them, against the f64 function.

    target/bench-venv/bin/python scripts/check_rational.py

Reads the coefficients from math.rs, so it checks what the kernels use.
"""
import math
import pathlib
import re

import numpy as np

MATH_RS = pathlib.Path(__file__).resolve().parent.parent / "targets/cpu/src/lower/math.rs"
F = np.float32


def rationals():
    text = MATH_RS.read_text()
    pattern = (r"pub\(crate\) const (\w+): OddRational = OddRational \{\s*clamp: ([^,]+),"
               r"\s*numerator: &\[([^\]]*)\],\s*denominator: &\[([^\]]*)\],")
    for name, clamp, num, den in re.findall(pattern, text):
        coeffs = lambda s: [float(c.replace("_", "")) for c in s.split(",") if c.strip()]
        yield name, float(clamp.replace("_", "")), coeffs(num), coeffs(den)


def horner(coeffs, z):
    p = np.full_like(z, F(coeffs[0]))
    for c in coeffs[1:]:
        p = (p * z + F(c)).astype(F)
    return p


def evaluate(clamp, num, den, x):
    x = np.minimum(np.maximum(x, F(-clamp)), F(clamp)).astype(F)
    x2 = (x * x).astype(F)
    return ((x * horner(num, x2)).astype(F) / horner(den, x2)).astype(F)


REFERENCE = {"TANH": np.tanh, "ERF": np.vectorize(math.erf)}

for name, clamp, num, den in rationals():
    x = np.concatenate([np.linspace(-12, 12, 2_000_001, dtype=F), np.logspace(-30, 1, 200_000).astype(F)])
    x = np.concatenate([x, -x])
    if name == "ERF":
        x = x[::20]  # math.erf is scalar Python
    want = REFERENCE[name](x.astype(np.float64))
    got = evaluate(clamp, num, den, x).astype(np.float64)
    err = np.abs(got - want)
    rel = err / np.maximum(np.abs(want), 1e-30)
    ulp = err / np.spacing(np.abs(want).astype(F)).astype(np.float64)
    print(f"{name}: {x.size} points in ±12 and down to 1e-30: max abs error {err.max():.3g}, "
          f"max relative {rel.max():.3g} at {x[rel.argmax()]:.6g}, max {ulp.max():.1f} ulp")
