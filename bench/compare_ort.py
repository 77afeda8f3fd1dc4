"""Latency of Kiln beside onnxruntime on the same fixture models, inputs and
machine, one thread each, in the same run.

    .venv/bin/python bench/compare_ort.py [--runs 300] [--target T ...] [--kiln BIN] [fixture | dir ...]

A fixture is a name under fixtures/models or a directory in the same layout
(the real models fetched by scripts/real-models.sh live in
target/real-models/<name>).

Builds nothing: expects target/release/kiln (cargo build --release -p kiln).
Prints a table of p50/p95 per fixture and the ratio ORT p50 / Kiln p50
(above 1 means Kiln is faster). With several --target values, Kiln runs
once per target on the same inputs (e.g. `--target x86_64-v3 --target
native` compares the Cranelift kernels with the AVX-512 microkernels).
"""
import argparse
import json
import os
import subprocess
import tempfile
import time

import numpy as np
import onnxruntime as ort

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KILN = os.path.join(ROOT, "target", "release", "kiln")
DEFAULT = ["ppocr_cls", "digits_cnn", "digits_mlp", "op_conv_basic", "op_gemm_basic"]


def ort_bench(fixture_dir, meta, runs, warmup):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    sess = ort.InferenceSession(os.path.join(fixture_dir, "model.onnx"), so, providers=["CPUExecutionProvider"])
    feeds = {i["name"]: np.load(os.path.join(fixture_dir, i["file"])) for i in meta["inputs"]}
    for _ in range(warmup):
        sess.run(None, feeds)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        sess.run(None, feeds)
        times.append((time.perf_counter() - t) * 1e3)
    return np.percentile(times, 50), np.percentile(times, 95)


def kiln_bench(fixture_dir, meta, runs, warmup, tmp, target):
    art = os.path.join(tmp, os.path.basename(fixture_dir) + "." + target + ".kiln")
    cmd = [KILN, "compile", os.path.join(fixture_dir, "model.onnx"), "-o", art, "--target", target]
    for name, dims in meta.get("input_shapes", {}).items():
        cmd += ["--input-shape", f"{name}=" + "x".join(str(d) for d in dims)]
    for name, value in meta.get("dims", {}).items():
        cmd += ["--dim", f"{name}={value}"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    cmd = [KILN, "bench", art, "--runs", str(runs), "--warmup", str(warmup), "--json"]
    for i in meta["inputs"]:
        cmd += ["--input", f"{i['name']}={os.path.join(fixture_dir, i['file'])}"]
    out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return out["p50_ms"], out["p95_ms"]


def main():
    global KILN
    ap = argparse.ArgumentParser()
    ap.add_argument("fixtures", nargs="*", default=DEFAULT)
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--target", action="append", help="kiln --target (repeatable; default native)")
    ap.add_argument("--kiln", default=None, help="the kiln binary (default target/release/kiln)")
    args = ap.parse_args()
    KILN = args.kiln or KILN
    targets = args.target or ["native"]
    print(f"onnxruntime {ort.__version__}, 1 thread, {args.runs} runs after {args.warmup} warm-up")
    print(f"{'fixture':<22} {'kiln target':<14} {'kiln p50':>10} {'kiln p95':>10} {'ort p50':>10} {'ort p95':>10} {'ort/kiln':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.fixtures:
            # A fixture name, or a fixture directory (e.g. target/real-models/minilm_l3).
            d = name if os.sep in name else os.path.join(ROOT, "fixtures", "models", name)
            name = os.path.basename(os.path.normpath(d))
            meta = json.load(open(os.path.join(d, "meta.json")))
            o50, o95 = ort_bench(d, meta, args.runs, args.warmup)
            for target in targets:
                k50, k95 = kiln_bench(d, meta, args.runs, args.warmup, tmp, target)
                print(f"{name:<22} {target:<14} {k50:>9.3f}ms {k95:>9.3f}ms {o50:>9.3f}ms {o95:>9.3f}ms {o50 / k50:>8.2f}x")


if __name__ == "__main__":
    main()
