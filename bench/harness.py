"""Kiln beside onnxruntime and tract on the real models, in one run.

    bash bench/run.sh [--runs N] [--threads 1,2] [model dir ...]

(`bench/run.sh` builds the release binaries, installs the pinned Python
packages of bench/requirements.txt into target/bench-venv, fetches the real
models, then calls this script.)

For every model (default: the PP-OCR cls fixture and the real models under
target/real-models) and every thread count, each engine runs in a process of
its own on the model's committed inputs: `kiln bench` on an artifact
compiled for the native target, onnxruntime's CPU provider with
intra-op threads set, tract's default optimized plan (single-threaded; its
Python API has no thread setting, so it runs only in the 1-thread rows).
Each process reports p50 and p95 over the timed runs; the harness reads its
peak RSS from the kernel (wait4). With --rounds R, Kiln and onnxruntime
alternate R times per model and thread count, and each engine's row is its
round of median p50: on a host whose speed drifts from one process to the
next (this one's two-thread runs do), a single pair can land in different
states. Kiln's throughput is the model's dense
FLOPs (MatMul, Gemm, Conv; `kiln inspect --json`) over its p50, also as a
fraction of the single-core AVX-512 FMA peak measured by the `roofline`
example in the same run.

With --int8, every model also runs quantized: Kiln compiled with
`--quantize dynamic` (engine `kiln-i8`) beside onnxruntime on the model
quantized by `onnxruntime.quantization.quantize_dynamic` with int8 weights
(engine `ort-i8`); their ratio column compares the two int8 builds.

Writes target/bench/results.json, results.md (the table printed) and
chart.png (p50 per model and engine, log scale). Reports; never fails on a
slow result.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODELS = [
    os.path.join(ROOT, "fixtures", "models", "ppocr_cls"),
    os.path.join(ROOT, "target", "real-models", "ppocrv4_det"),
    os.path.join(ROOT, "target", "real-models", "ppocrv4_rec"),
    os.path.join(ROOT, "target", "real-models", "minilm_l3"),
    os.path.join(ROOT, "target", "real-models", "silero_vad"),
]


def load_inputs(model_dir, meta):
    """The run-time inputs and, for onnxruntime and tract, the inputs Kiln
    binds at compile time (meta "bind_inputs")."""
    feeds = {i["name"]: np.load(os.path.join(model_dir, i["file"])) for i in meta["inputs"]}
    for name, f in meta.get("bind_inputs", {}).items():
        feeds[name] = np.load(os.path.join(model_dir, f))
    return feeds


def percentiles(times_ms):
    return float(np.percentile(times_ms, 50)), float(np.percentile(times_ms, 95))


def timed(run, runs, warmup):
    for _ in range(warmup):
        run()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        run()
        times.append((time.perf_counter() - t) * 1e3)
    return percentiles(times)


def worker_ort(model_dir, meta, threads, runs, warmup, onnx_path=None):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    path = onnx_path or os.path.join(model_dir, "model.onnx")
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    feeds = load_inputs(model_dir, meta)
    return timed(lambda: sess.run(None, feeds), runs, warmup)


def worker_tract(model_dir, meta, threads, runs, warmup):
    import tract

    feeds = load_inputs(model_dir, meta)
    model = tract.onnx().load(os.path.join(model_dir, "model.onnx"))
    for i in range(model.input_count()):
        name = model.input_name(i)
        x = feeds[name]
        dtype = {np.dtype("float32"): "f32", np.dtype("int64"): "i64", np.dtype("int32"): "i32"}[x.dtype]
        # A scalar's fact is its type alone.
        model.set_input_fact(i, ",".join([str(d) for d in x.shape] + [dtype]))
    args = [feeds[model.input_name(i)] for i in range(model.input_count())]
    runnable = model.into_model().into_runnable()
    return timed(lambda: runnable.run(args), runs, warmup)


def run_measured(cmd):
    """Runs cmd; returns (stdout, peak RSS in MiB) of that process alone."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        out.seek(0)
        err.seek(0)
        if os.waitstatus_to_exitcode(status) != 0:
            text = err.read().decode(errors="replace")
            # The exception line, wherever a long backtrace put it.
            errors = [ln for ln in text.splitlines() if "Error:" in ln]
            raise RuntimeError(f"{' '.join(cmd)} failed: {text[-2000:]}\n{errors[-1] if errors else ''}")
        return out.read().decode(), usage.ru_maxrss / 1024.0


def shape_args(meta):
    args = []
    for i in meta["inputs"]:
        shape = i.get("shape") or meta.get("input_shapes", {}).get(i["name"])
        if shape is not None:
            args += ["--input-shape", f"{i['name']}=" + "x".join(str(d) for d in shape)]
    for name, value in meta.get("dims", {}).items():
        args += ["--dim", f"{name}={value}"]
    return args


def bind_args(model_dir, meta):
    """`kiln compile --bind-input` for the inputs fixed at compile time."""
    args = []
    for name, f in meta.get("bind_inputs", {}).items():
        args += ["--bind-input", f"{name}={os.path.join(model_dir, f)}"]
    return args


def kiln_supports_threads(kiln):
    help_text = subprocess.run([kiln, "bench", "--help"], capture_output=True, text=True).stdout
    return "--threads" in help_text


def measure_peak(roofline):
    if not os.path.exists(roofline):
        return None
    out = subprocess.run([roofline, "64", "64", "64", "3"], capture_output=True, text=True).stdout
    m = re.search(r"peak \(AVX-512 FMA loop, 1 thread\): ([0-9.]+) GFLOP/s", out)
    return float(m.group(1)) if m else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*", default=None)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=1,
                    help="alternate Kiln and onnxruntime this many times per model and thread count and keep "
                         "each engine's round of median p50 (a host whose speed drifts between processes)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--kiln", default=os.path.join(ROOT, "target", "release", "kiln"))
    ap.add_argument("--roofline", default=os.path.join(ROOT, "target", "release", "examples", "roofline"))
    ap.add_argument("--out", default=os.path.join(ROOT, "target", "bench"))
    ap.add_argument("--int8", action="store_true", help="also time dynamic int8 builds of Kiln and onnxruntime")
    # Internal: one engine measurement in this process.
    ap.add_argument("--worker", choices=["ort", "tract", "quantize"])
    ap.add_argument("--model")
    ap.add_argument("--onnx", help="worker: the ONNX file to run instead of the model's own")
    args = ap.parse_args()

    if args.worker == "quantize":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(os.path.join(args.model, "model.onnx"), args.onnx, weight_type=QuantType.QInt8)
        return
    if args.worker:
        meta = json.load(open(os.path.join(args.model, "meta.json")))
        if args.worker == "ort":
            p50, p95 = worker_ort(args.model, meta, int(args.threads), args.runs, args.warmup, args.onnx)
        else:
            p50, p95 = worker_tract(args.model, meta, int(args.threads), args.runs, args.warmup)
        print(json.dumps({"p50_ms": p50, "p95_ms": p95}))
        return

    models = args.models or [m for m in DEFAULT_MODELS if os.path.exists(os.path.join(m, "meta.json"))]
    threads = [int(t) for t in args.threads.split(",")]
    kiln_threads = kiln_supports_threads(args.kiln)
    os.makedirs(args.out, exist_ok=True)
    peak = measure_peak(args.roofline)

    import onnxruntime
    import tract

    peak_text = f"peak {peak:.1f} GFLOP/s per core (AVX-512 FMA loop)" if peak else "peak not measured"
    header = (
        f"onnxruntime {onnxruntime.__version__}, tract (Python) {tract.version()}, {args.runs} runs after "
        f"{args.warmup} warm-up, every engine in its own process on the same inputs"
        + (f", Kiln and onnxruntime alternated {args.rounds} times (median p50 kept)" if args.rounds > 1 else "")
        + f"; {peak_text}"
    )
    print(header)
    cols = f"{'model':<12} {'thr':>3} {'engine':<7} {'p50 ms':>9} {'p95 ms':>9} {'RSS MiB':>8} {'ORT/eng':>8} {'GFLOP/s':>8} {'%peak':>6}"
    print(cols)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model_dir in models:
            name = os.path.basename(os.path.normpath(model_dir))
            meta = json.load(open(os.path.join(model_dir, "meta.json")))
            model_path = os.path.join(model_dir, "model.onnx")
            inspect = json.loads(
                subprocess.run(
                    [args.kiln, "inspect", model_path, "-O1", "--json"] + shape_args(meta)
                    + bind_args(model_dir, meta),
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
            )
            flops = inspect.get("dense_flops") or 0
            builds = {"kiln": []}
            if args.int8:
                builds["kiln-i8"] = ["--quantize", "dynamic", "--calibrate-random", "0"]
                # In a process of its own: peak RSS is inherited through
                # fork, so the harness itself must stay small.
                ort_int8 = os.path.join(tmp, name + ".int8.onnx")
                try:
                    run_measured([sys.executable, os.path.abspath(__file__), "--model", model_dir,
                                  "--worker", "quantize", "--onnx", ort_int8])
                except RuntimeError as e:
                    # onnxruntime's quantizer refuses some graphs (e.g. a
                    # Conv whose weight is computed): no ort-i8 row then.
                    reason = str(e).strip().splitlines()[-1]
                    print(f"{name}: onnxruntime quantize_dynamic failed ({reason}); no ort-i8 row")
                    ort_int8 = None
            compiled = {}
            for engine, extra in builds.items():
                art = os.path.join(tmp, f"{name}.{engine}.kiln")
                compiled[engine] = json.loads(
                    subprocess.run(
                        [args.kiln, "compile", model_path, "-o", art, "--json"] + shape_args(meta)
                        + bind_args(model_dir, meta) + extra,
                        check=True,
                        capture_output=True,
                        text=True,
                    ).stdout
                )
                compiled[engine]["path"] = art
            for t in threads:
                worker = [sys.executable, os.path.abspath(__file__), "--model", model_dir, "--threads", str(t),
                          "--runs", str(args.runs), "--warmup", str(args.warmup), "--worker"]
                # Kiln and onnxruntime alternate, round after round; each
                # engine keeps its round of median p50 (see --rounds).
                rounds = {}
                for _ in range(args.rounds):
                    for engine in builds:
                        kiln_cmd = [args.kiln, "bench", compiled[engine]["path"], "--runs", str(args.runs),
                                    "--warmup", str(args.warmup), "--json"]
                        for i in meta["inputs"]:
                            kiln_cmd += ["--input", f"{i['name']}={os.path.join(model_dir, i['file'])}"]
                        if kiln_threads:
                            kiln_cmd += ["--threads", str(t)]
                        if kiln_threads or t == 1:
                            out, rss = run_measured(kiln_cmd)
                            k = json.loads(out)
                            rounds.setdefault(engine, []).append((k["p50_ms"], k["p95_ms"], rss))
                    out, rss = run_measured(worker + ["ort"])
                    o = json.loads(out)
                    rounds.setdefault("ort", []).append((o["p50_ms"], o["p95_ms"], rss))
                    if args.int8 and ort_int8:
                        out, rss = run_measured(worker + ["ort", "--onnx", ort_int8])
                        o = json.loads(out)
                        rounds.setdefault("ort-i8", []).append((o["p50_ms"], o["p95_ms"], rss))
                results = {engine: sorted(rs)[(len(rs) - 1) // 2] for engine, rs in rounds.items()}
                if t == 1:
                    try:
                        out, rss = run_measured(worker + ["tract"])
                        o = json.loads(out)
                        results["tract"] = (o["p50_ms"], o["p95_ms"], rss)
                    except RuntimeError as e:
                        reason = str(e).strip().splitlines()[-1][:200]
                        print(f"{name}: tract failed ({reason.strip()}); no tract row")
                for engine, (p50, p95, rss) in results.items():
                    # int8 builds are compared with onnxruntime's int8 build.
                    ort_p50 = results.get("ort-i8" if engine.endswith("-i8") else "ort", results["ort"])[0]
                    gflops = flops / (p50 * 1e6) if flops else None
                    frac = gflops / (peak * t) if (gflops and peak) else None
                    row = {
                        "model": name,
                        "threads": t,
                        "engine": engine,
                        "p50_ms": p50,
                        "p95_ms": p95,
                        "peak_rss_mib": rss,
                        "ort_over_engine": ort_p50 / p50,
                        "dense_flops": flops,
                        "gflops": gflops,
                        "fraction_of_peak": frac,
                    }
                    if engine in compiled:
                        row["artifact_bytes"] = compiled[engine]["bytes"]
                        row["compile_ms"] = compiled[engine]["compile_ms"]
                    rows.append(row)
                    g = f"{gflops:8.1f}" if gflops else f"{'-':>8}"
                    f = f"{100 * frac:5.1f}%" if frac else f"{'-':>6}"
                    print(f"{name:<12} {t:>3} {engine:<7} {p50:>9.3f} {p95:>9.3f} {rss:>8.1f} {ort_p50 / p50:>7.2f}x {g} {f}")
    with open(os.path.join(args.out, "results.json"), "w") as fh:
        json.dump({"header": header, "peak_gflops": peak, "rows": rows}, fh, indent=1)
    with open(os.path.join(args.out, "results.md"), "w") as fh:
        fh.write(header + "\n\n| model | threads | engine | p50 ms | p95 ms | peak RSS MiB | ORT p50 / engine p50 | GFLOP/s | % of peak |\n")
        fh.write("|---|---|---|---|---|---|---|---|---|\n")
        for r in rows:
            g = f"{r['gflops']:.1f}" if r["gflops"] else "-"
            f = f"{100 * r['fraction_of_peak']:.1f}%" if r["fraction_of_peak"] else "-"
            fh.write(
                f"| {r['model']} | {r['threads']} | {r['engine']} | {r['p50_ms']:.3f} | {r['p95_ms']:.3f} | "
                f"{r['peak_rss_mib']:.1f} | {r['ort_over_engine']:.2f}x | {g} | {f} |\n"
            )
    chart(rows, os.path.join(args.out, "chart.png"))
    print(f"wrote {args.out}/results.json, results.md, chart.png")


def chart(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = sorted({(r["model"], r["threads"]) for r in rows}, key=lambda x: (x[0], x[1]))
    engines = [e for e in ["kiln", "ort", "tract", "kiln-i8", "ort-i8"] if any(r["engine"] == e for r in rows)]
    width = 0.8 / len(engines)
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(labels)), 4.5))
    for k, engine in enumerate(engines):
        values = []
        for model, t in labels:
            match = [r["p50_ms"] for r in rows if r["model"] == model and r["threads"] == t and r["engine"] == engine]
            values.append(match[0] if match else 0)
        xs = [i + (k - (len(engines) - 1) / 2) * width for i in range(len(labels))]
        ax.bar(xs, values, width, label=engine)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels([f"{m}\n{t} thr" for m, t in labels], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("p50 latency (ms, log scale)")
    ax.set_title("Kiln, onnxruntime and tract on the same inputs (lower is better)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
