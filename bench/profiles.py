"""Shape profiles beside onnxruntime, in one run.

    target/bench-venv/bin/python bench/profiles.py [--runs N] [--threads T] [--only PART]

1. MiniLM-L3 (target/real-models/minilm_l3) compiled once with
   `--dim batch_size=1 --dim sequence_length=16..128:16` (eight profiles,
   one artifact): p50 of each profile (`kiln bench --shape`) beside
   onnxruntime's at the same shapes; then the same profiles with
   `--pad-dim sequence_length`, timed at lengths no profile has (each run
   padded to the next profile) beside onnxruntime at those lengths.
2. A CNN (the zoo's ResNet-18, target/zoo/resnet18, its batch dim made
   symbolic) compiled once with `--dim batch=1,8,32`: time per image and
   images per second at each batch beside onnxruntime's.

Also prints each artifact's size beside the single-profile artifact's,
and the load time of an artifact of 64 profiles (the digits CNN at
batch 1..64).
Inputs are seeded random values (timing only). Reports; never fails on a
slow result. Writes target/bench/profiles.md.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KILN = os.path.join(REPO, "target", "release", "kiln")


def kiln(*args: str) -> str:
    out = subprocess.run([KILN, *args], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"kiln {' '.join(args)}: {out.stderr}")
    return out.stdout


def kiln_p50(artifact: str, shapes: dict, runs: int, threads: int) -> float:
    args = ["bench", artifact, "--random", "--runs", str(runs), "--threads", str(threads), "--json"]
    for name, shape in shapes.items():
        args += ["--shape", f"{name}={'x'.join(map(str, shape))}"]
    return json.loads(kiln(*args))["p50_ms"]


def ort_p50(model: str, feeds: dict, runs: int, threads: int) -> float:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    for _ in range(max(3, runs // 10)):
        sess.run(None, feeds)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        sess.run(None, feeds)
        times.append((time.perf_counter() - t) * 1e3)
    return float(np.median(times))


def minilm(tmp: str, runs: int, threads: int) -> list:
    model = os.path.join(REPO, "target", "real-models", "minilm_l3", "model.onnx")
    art = os.path.join(tmp, "minilm.kiln")
    one = os.path.join(tmp, "minilm128.kiln")
    kiln("compile", model, "--dim", "batch_size=1", "--dim", "sequence_length=16..128:16", "-o", art)
    kiln("compile", model, "--dim", "batch_size=1", "--dim", "sequence_length=128", "-o", one)
    rows = [f"MiniLM-L3, one artifact of 8 profiles: {os.path.getsize(art)} bytes "
            f"(one profile, seq 128: {os.path.getsize(one)} bytes); {threads} thread(s), p50 ms",
            "", "| seq | kiln | onnxruntime | ort/kiln |", "|---|---|---|---|"]
    rng = np.random.default_rng(0)

    def kiln_and_ort(artifact: str, seq: int) -> tuple:
        """p50 of Kiln and of onnxruntime on one sentence of `seq` tokens."""
        shape = [1, seq]
        feeds = {
            "input_ids": rng.integers(0, 1000, shape, dtype=np.int64),
            "attention_mask": np.ones(shape, np.int64),
        }
        k = kiln_p50(artifact, {"input_ids": shape, "attention_mask": shape}, runs, threads)
        return k, ort_p50(model, feeds, runs, threads)

    for seq in range(16, 129, 16):
        k, o = kiln_and_ort(art, seq)
        rows.append(f"| {seq} | {k:.3f} | {o:.3f} | {o / k:.2f} |")
    padded = os.path.join(tmp, "minilm_pad.kiln")
    kiln("compile", model, "--dim", "batch_size=1", "--dim", "sequence_length=16..128:16",
         "--pad-dim", "sequence_length", "-o", padded)
    rows += ["", f"The same profiles with --pad-dim sequence_length: runs of other lengths "
             f"padded to the next profile; {threads} thread(s), p50 ms",
             "", "| seq | runs as | kiln | onnxruntime | ort/kiln |", "|---|---|---|---|---|"]
    for seq in (20, 50, 72, 100, 127):
        k, o = kiln_and_ort(padded, seq)
        rows.append(f"| {seq} | {-(-seq // 16) * 16} | {k:.3f} | {o:.3f} | {o / k:.2f} |")
    return rows


def symbolic_batch(src: str, dst: str) -> None:
    """The model with dim 0 of every graph input and output named `batch`."""
    m = onnx.load(src)
    for v in list(m.graph.input) + list(m.graph.output):
        v.type.tensor_type.shape.dim[0].dim_param = "batch"
    onnx.save(m, dst)


def cnn(tmp: str, runs: int, threads: int) -> list:
    model = os.path.join(tmp, "resnet18_batch.onnx")
    symbolic_batch(os.path.join(REPO, "target", "zoo", "resnet18", "model.onnx"), model)
    art = os.path.join(tmp, "resnet18.kiln")
    one = os.path.join(tmp, "resnet18_1.kiln")
    kiln("compile", model, "--dim", "batch=1,8,32", "-o", art)
    kiln("compile", model, "--dim", "batch=1", "-o", one)
    rows = [f"ResNet-18 (zoo), one artifact of 3 profiles: {os.path.getsize(art)} bytes "
            f"(one profile: {os.path.getsize(one)} bytes); {threads} thread(s)",
            "", "| batch | kiln ms/image | ort ms/image | kiln images/s | ort images/s | ort/kiln |",
            "|---|---|---|---|---|---|"]
    rng = np.random.default_rng(0)
    for batch in (1, 8, 32):
        shape = [batch, 3, 224, 224]
        feeds = {"input": rng.standard_normal(shape, dtype=np.float32)}
        n = max(3, runs // batch)
        k = kiln_p50(art, {"input": shape}, n, threads) / batch
        o = ort_p50(model, feeds, n, threads) / batch
        rows.append(f"| {batch} | {k:.3f} | {o:.3f} | {1e3 / k:.1f} | {1e3 / o:.1f} | {o / k:.2f} |")
    return rows


def load_time(tmp: str) -> list:
    """Loading an artifact of 64 profiles (the digits CNN at batch 1..64):
    `kiln bench --json`'s load_ms, best of five processes."""
    model = os.path.join(REPO, "fixtures", "models", "digits_cnn", "model.onnx")
    art = os.path.join(tmp, "digits64.kiln")
    kiln("compile", model, "--dim", "batch=1..64", "-o", art)
    loads = []
    for _ in range(5):
        out = json.loads(kiln("bench", art, "--random", "--runs", "1", "--warmup", "0", "--json"))
        loads.append(out["load_ms"])
    return [f"Load of an artifact of {out['profiles']} profiles ({os.path.getsize(art)} bytes): "
            f"best {min(loads):.2f} ms, worst {max(loads):.2f} ms of five processes"]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--only", choices=["minilm", "cnn", "load"], help="one part only")
    a = p.parse_args()
    parts = {
        "minilm": lambda tmp: minilm(tmp, a.runs, a.threads),
        "cnn": lambda tmp: cnn(tmp, a.runs, a.threads),
        "load": load_time,
    }
    with tempfile.TemporaryDirectory() as tmp:
        rows = []
        for name, part in parts.items():
            if a.only in (None, name):
                rows += (part(tmp) + [""])
    text = "\n".join(rows).rstrip()
    print(text)
    out = os.path.join(REPO, "target", "bench")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "profiles.md"), "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
