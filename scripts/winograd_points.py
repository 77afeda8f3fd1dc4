"""Rounding error of Winograd F(4x4, 3x3) in f32 for a choice of
interpolation points, against the direct sum in f32, both measured
against f64 (the numbers in docs/precision.md and
targets/cpu/src/microkernel/winograd.rs).

    target/bench-venv/bin/python scripts/winograd_points.py [CHANNELS] [TRIALS]

The transforms are built from the points (Toom-Cook, as wincnn does):
A^T and G from the points, B^T solved so that the algorithm is exact.
Per trial: one 6x6 input patch and one 3x3 kernel per channel, values
uniform in [-1, 1]; the error is the largest |f32 - f64| of the 4x4
output over the largest |output|.
"""

import sys
from fractions import Fraction as F

import numpy as np

M, R = 4, 3
N = M + R - 1


def transforms(points):
    pts = [F(p) for p in points]
    at = [[p**i for p in pts] + [F(int(i == M - 1))] for i in range(M)]
    f = [np.prod([pts[j] - pts[k] for k in range(len(pts)) if k != j]) for j in range(len(pts))]
    g = [[pts[j] ** k / f[j] for k in range(R)] for j in range(len(pts))]
    g.append([F(int(k == R - 1)) for k in range(R)])
    at, g = np.array(at, dtype=float), np.array(g, dtype=float)
    # B^T: sum_j AT[i, j] G[j, k] BT[j, p] = [p == i + k] for all i, k.
    bt = np.zeros((N, N))
    for p in range(N):
        rows = [at[i, :] * g[:, k] for i in range(M) for k in range(R)]
        rhs = [float(p == i + k) for i in range(M) for k in range(R)]
        bt[:, p] = np.linalg.lstsq(np.array(rows), np.array(rhs), rcond=None)[0]
    return at, g, bt


def exact(d, w):
    return np.einsum("cijkl,ckl->ij", np.lib.stride_tricks.sliding_window_view(d, (R, R), axis=(1, 2)), w)


def winograd_error(points, channels, trials, rng):
    at, g, bt = transforms(points)
    at32, bt32 = at.astype(np.float32), bt.astype(np.float32)
    errors = []
    for _ in range(trials):
        d = rng.uniform(-1, 1, (channels, N, N))
        w = rng.uniform(-1, 1, (channels, R, R))
        u = np.einsum("ik,ckl,jl->cij", g, w, g).astype(np.float32)
        v = np.einsum("ik,ckl,jl->cij", bt32, d.astype(np.float32), bt32).astype(np.float32)
        m = np.zeros((N, N), np.float32)
        for c in range(channels):
            m = (m + u[c] * v[c]).astype(np.float32)
        y = (at32 @ m @ at32.T).astype(np.float32)
        want = exact(d, w)
        errors.append(np.max(np.abs(y - want)) / np.max(np.abs(want)))
    return np.mean(errors), np.max(errors)


def direct_error(channels, trials, rng):
    errors = []
    for _ in range(trials):
        d = rng.uniform(-1, 1, (channels, N, N))
        w = rng.uniform(-1, 1, (channels, R, R))
        taps = np.lib.stride_tricks.sliding_window_view(d, (R, R), axis=(1, 2)).astype(np.float32)
        y = np.zeros((M, M), np.float32)
        for c in range(channels):
            for k in range(R * R):
                y = (y + taps[c, :, :, k // R, k % R] * np.float32(w[c, k // R, k % R])).astype(np.float32)
        want = exact(d, w)
        errors.append(np.max(np.abs(y - want)) / np.max(np.abs(want)))
    return np.mean(errors), np.max(errors)


def main():
    channels = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    trials = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    print(f"{channels} channels, {trials} trials: error / output scale, mean and max")
    rows = [("direct sum", lambda rng: direct_error(channels, trials, rng))]
    for points in [(0, 1, -1, 2, -2), (0, 1, -1, 2, F(-1, 2)), (0, 1, -1, F(1, 2), F(-1, 2))]:
        name = "points " + ", ".join(str(p) for p in points)
        rows.append((name, lambda rng, p=points: winograd_error(p, channels, trials, rng)))
    for name, run in rows:
        mean, worst = run(np.random.default_rng(1))
        print(f"{name:32s} {mean:.2e} {worst:.2e}")


if __name__ == "__main__":
    main()
