"""onnxruntime's p50 on the models `gpu_check` ran, for comparison in the
same run: with the CUDA execution provider when this onnxruntime has it
(onnxruntime-gpu), else on the CPU with every core (the stated alternative
when only the CPU package is installed). Also checks ORT's outputs against
the committed references, so the comparison is between two correct runs.

    python3 tests/gpu/ort_p50.py [--runs 20] MODEL_DIR...

Each MODEL_DIR holds model.onnx and meta.json (fixtures/models/* or a real
model fetched by fixtures/make_real.py).
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import onnxruntime as ort


def p50(session, feeds, runs):
    for _ in range(3):
        session.run(None, feeds)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        session.run(None, feeds)
        times.append((time.perf_counter() - t) * 1e3)
    times.sort()
    return times[len(times) // 2]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("models", nargs="+")
    args = parser.parse_args()
    providers = ort.get_available_providers()
    provider = (
        "CUDAExecutionProvider"
        if "CUDAExecutionProvider" in providers
        else "CPUExecutionProvider"
    )
    options = ort.SessionOptions()
    threads = os.cpu_count() or 1
    if provider == "CPUExecutionProvider":
        options.intra_op_num_threads = threads
    where = provider if provider != "CPUExecutionProvider" else f"CPU, {threads} threads"
    print(f"onnxruntime {ort.__version__} ({where})")
    print(f"{'model':<44} {'max abs err':>12} {'p50 ms':>10}")
    for d in args.models:
        meta = json.load(open(os.path.join(d, "meta.json")))
        name = os.path.basename(os.path.normpath(d))
        try:
            session = ort.InferenceSession(
                os.path.join(d, "model.onnx"), options, providers=[provider]
            )
            feeds = {
                i["name"]: np.load(os.path.join(d, i["file"])) for i in meta["inputs"]
            }
            # Inputs Kiln compiles in (`--bind-input`) are fed to ORT.
            for input_name, f in meta.get("bind_inputs", {}).items():
                feeds[input_name] = np.load(os.path.join(d, f))
            outputs = session.run(None, feeds)
            err = max(
                float(np.max(np.abs(o.astype(np.float64) - np.load(os.path.join(d, r["file"])).astype(np.float64))))
                if o.size
                else 0.0
                for o, r in zip(outputs, meta["outputs"])
            )
            print(f"{name:<44} {err:>12.3e} {p50(session, feeds, args.runs):>10.3f}")
        except Exception as e:  # one model's failure must not hide the others
            print(f"{name:<44} {'-':>12} {'-':>10}  ERROR {e}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
