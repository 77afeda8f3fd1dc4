"""The shape sweep: Kiln beside onnxruntime on single-op models, one shape each.

    bash bench/sweep.sh [--filter REGEX] [--limit N] [--threads 1,2] [--runs N]

(`bench/sweep.sh` builds the release `kiln` and the `roofline` example,
makes target/bench-venv, generates the models with bench/sweep_models.py
when their manifest is missing or older than the generator, then calls this
script.)

For every model of the manifest (target/sweep/models/manifest.json; those
whose name matches --filter, the first --limit of them) the model is
compiled once for the native target (`kiln compile MODEL -o ART --json`, as
bench/harness.py compiles), then at every thread count of --threads each
engine runs in a process of its own on the same input: `kiln bench ART
--runs N --warmup W --threads T --json`, and onnxruntime's CPU provider with
intra-op threads T (bench/harness.py's worker: same run and warm-up
counts). The input is a seeded random normal .npy written next to the model
on first use (NAME.INPUT.npy).

Reported per shape and thread count: p50 and p95 of both engines, ORT p50 /
Kiln p50 (above 1: Kiln is faster), Kiln's GFLOP/s (the manifest's dense
FLOPs, 2 x MACs, over its p50) and that as a fraction of the measured peak
times the thread count (the single-core AVX-512 FMA peak of the `roofline`
example, measured once as bench/harness.py does; empty when the example is
missing or the host has no AVX-512), and the kernel Kiln chose for the op
(`dense_kernels` of `kiln compile --json`; the column is left out when the
compiler does not report it). A shape that fails to compile, crashes or
times out in either engine is an error row; the sweep goes on. Never fails
on a slow result.

Prints the table, the 10 worst ratios and the geometric mean of the ratios
at each thread count, and writes target/sweep/results.json and results.md.
"""
import argparse
import datetime
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import time
import zlib

import numpy as np

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
import harness  # noqa: E402  (bench/harness.py: peak, thread support, the onnxruntime worker)

ROOT = harness.ROOT
DEFAULT_MODELS = os.path.join(ROOT, "target", "sweep", "models")


def run_cmd(cmd, timeout):
    """Runs cmd; returns a dict of rc (negative: killed by that signal),
    stdout, stderr, the process's own peak RSS in MiB and whether it ran
    past `timeout` seconds (then it was killed)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err)
        expired = []

        def kill():
            expired.append(True)
            proc.kill()

        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return {
            "rc": proc.returncode,
            "out": out.read().decode(errors="replace"),
            "err": err.read().decode(errors="replace"),
            "rss_mib": usage.ru_maxrss / 1024.0,
            "timed_out": bool(expired),
        }


def failure(what, res, timeout):
    """One line saying why a command failed."""
    if res["timed_out"]:
        return f"{what}: timed out after {timeout} s"
    if res["rc"] < 0:
        return f"{what}: killed by signal {-res['rc']}"
    lines = [ln.strip() for ln in res["err"].splitlines() if ln.strip()]
    # Kiln's "error: ..." line, or a Python exception's last line.
    picked = [ln for ln in lines if ln.startswith("error") or "Error" in ln or "panicked" in ln]
    msg = (picked[-1] if picked else (lines[-1] if lines else "no message"))
    return f"{what}: exit {res['rc']}: {msg[:400]}"


def input_files(models_dir, entry):
    """The model's inputs as .npy files next to it, written on first use:
    standard normal float32 from a generator seeded by the model's name."""
    files = {}
    for i, spec in enumerate(entry["inputs"]):
        path = os.path.join(models_dir, f"{entry['name']}.{spec['name']}.npy")
        shape = tuple(spec["shape"])
        ok = False
        if os.path.exists(path):
            try:
                ok = np.load(path, mmap_mode="r").shape == shape
            except ValueError:
                ok = False
        if not ok:
            rng = np.random.default_rng(zlib.crc32(entry["name"].encode()) + 1000 * (i + 1))
            tmp = path + ".tmp.npy"
            np.save(tmp, rng.standard_normal(shape, dtype=np.float32))
            os.replace(tmp, path)
        files[spec["name"]] = path
    return files


def dense_kernel(compiled, op):
    """The kernel `kiln compile --json` reports for the model's dense node:
    (kernel, record) from its `dense_kernels` list (the node of most FLOPs,
    of the same op where the list says), else (None, None)."""
    records = compiled.get("dense_kernels")
    if not isinstance(records, list):
        # Another spelling: any list of per-node records with a kernel name.
        records = []

        def walk(v):
            if isinstance(v, dict):
                k = v.get("kernel") or v.get("chosen") or v.get("lowering")
                if isinstance(k, str) and ("node" in v or "op" in v):
                    records.append(v)
                for x in v.values():
                    walk(x)
            elif isinstance(v, list):
                for x in v:
                    walk(x)

        walk(compiled)
    records = [r for r in records if isinstance(r, dict) and isinstance(
        r.get("kernel") or r.get("chosen") or r.get("lowering"), str)]
    if not records:
        return None, None
    same = [r for r in records if str(r.get("op", "")).lower() == op.lower()]
    best = max(same or records, key=lambda r: r.get("flops") or 0)
    return best.get("kernel") or best.get("chosen") or best.get("lowering"), best


def worker_ort(args):
    """Internal: onnxruntime on one model at one thread count, in this process."""
    feeds = json.loads(args.feeds)
    meta = {"inputs": [{"name": n, "file": os.path.abspath(p)} for n, p in feeds.items()]}
    p50, p95 = harness.worker_ort(os.path.dirname(os.path.abspath(args.onnx)), meta, int(args.threads),
                                  args.runs, args.warmup, os.path.abspath(args.onnx))
    print(json.dumps({"p50_ms": p50, "p95_ms": p95}))


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def fmt(v, spec, empty="-"):
    return empty if v is None else format(v, spec)


def cpu_name():
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def measure(entry, models_dir, threads, args, kiln_threads, peak, tmp):
    """Compiles one model and times both engines at each thread count;
    returns its rows (one per thread count) and prints them."""
    name, op, flops = entry["name"], entry["op"], entry["flops"]
    model = os.path.join(models_dir, entry["file"])
    base = {"name": name, "family": entry["family"], "layer": entry.get("layer"), "op": op, "flops": flops,
            "inputs": entry["inputs"]}
    try:
        feeds = input_files(models_dir, entry)
    except Exception as e:  # a bad manifest entry is one error row, not the end of the sweep
        return [dict(base, threads=t, error=f"input: {e}") for t in threads]

    art = os.path.join(tmp, name + ".kiln")
    compile_cmd = [args.kiln, "compile", model, "-o", art, "--json"] + args.compile_arg
    res = run_cmd(compile_cmd, args.timeout)
    compiled, compile_error = None, None
    if res["rc"] == 0:
        try:
            compiled = json.loads(res["out"])
        except ValueError:
            compile_error = f"compile: unreadable --json output: {res['out'][:200]!r}"
    else:
        compile_error = failure("compile", res, args.timeout)
    warnings = [ln.strip() for ln in res["err"].splitlines() if ln.strip().startswith("warning")]
    kernel, record = dense_kernel(compiled or {}, op)
    base.update(kernel=kernel, kernel_record=record, compile_warnings=warnings or None,
                compile_ms=(compiled or {}).get("compile_ms"))

    rows = []
    for t in threads:
        row = dict(base, threads=t, kiln_p50_ms=None, kiln_p95_ms=None, kiln_threads=None, ort_p50_ms=None,
                   ort_p95_ms=None, ort_over_kiln=None, kiln_gflops=None, ort_gflops=None, fraction_of_peak=None)
        errors = []
        if compile_error:
            errors.append(compile_error)
        elif kiln_threads or t == 1:
            cmd = [args.kiln, "bench", art, "--runs", str(args.runs), "--warmup", str(args.warmup), "--json"]
            for n, p in feeds.items():
                cmd += ["--input", f"{n}={p}"]
            if kiln_threads:
                cmd += ["--threads", str(t)]
            res = run_cmd(cmd, args.timeout)
            if res["rc"] == 0:
                k = json.loads(res["out"])
                row.update(kiln_p50_ms=k["p50_ms"], kiln_p95_ms=k["p95_ms"], kiln_threads=k.get("threads", t),
                           kiln_rss_mib=res["rss_mib"])
            else:
                errors.append(failure("kiln bench", res, args.timeout))
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "ort", "--onnx", model,
               "--feeds", json.dumps(feeds), "--threads", str(t), "--runs", str(args.runs),
               "--warmup", str(args.warmup)]
        res = run_cmd(cmd, args.timeout)
        if res["rc"] == 0:
            o = json.loads(res["out"].strip().splitlines()[-1])
            row.update(ort_p50_ms=o["p50_ms"], ort_p95_ms=o["p95_ms"], ort_rss_mib=res["rss_mib"])
        else:
            errors.append(failure("onnxruntime", res, args.timeout))
        if row["kiln_p50_ms"]:
            row["kiln_gflops"] = flops / (row["kiln_p50_ms"] * 1e6)
            if peak:
                row["fraction_of_peak"] = row["kiln_gflops"] / (peak * t)
        if row["ort_p50_ms"]:
            row["ort_gflops"] = flops / (row["ort_p50_ms"] * 1e6)
        if row["kiln_p50_ms"] and row["ort_p50_ms"]:
            row["ort_over_kiln"] = row["ort_p50_ms"] / row["kiln_p50_ms"]
        row["error"] = "; ".join(errors) or None
        rows.append(row)
        print_row(row, kernel_col=True)
    if os.path.exists(art):
        os.remove(art)
    return rows


def print_row(r, kernel_col):
    thr = str(r["threads"])
    if r.get("kiln_threads") is not None and r["kiln_threads"] != r["threads"]:
        thr += f"({r['kiln_threads']})"
    line = (f"{r['name'][:58]:<58} {thr:>5} {fmt(r.get('kiln_p50_ms'), '9.3f', '        -')} "
            f"{fmt(r.get('ort_p50_ms'), '9.3f', '        -')} {fmt(r.get('ort_over_kiln'), '6.2f', '     -')}x "
            f"{fmt(r.get('kiln_gflops'), '7.1f', '      -')} "
            f"{fmt(r['fraction_of_peak'] * 100 if r.get('fraction_of_peak') else None, '5.1f', '    -')}%")
    if kernel_col and r.get("kernel"):
        line += f"  {r['kernel']}"
    if r.get("error"):
        line += f"  ERROR {r['error'][:300]}"
    print(line, flush=True)


def report(rows, threads, header, peak):
    """The markdown report: the table, then per thread count the geomean
    and the 10 worst ratios, then per-family geomeans, the shapes on the
    generic kernel and the failures."""
    has_kernel = any(r.get("kernel") for r in rows)
    md = [header, ""]
    cols = ["shape", "family", "op", "MFLOP", "threads", "Kiln p50 ms", "Kiln p95 ms", "ORT p50 ms", "ORT p95 ms",
            "ORT/Kiln", "Kiln GFLOP/s", "% of peak"] + (["kernel"] if has_kernel else [])
    md += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        thr = str(r["threads"])
        if r.get("kiln_threads") is not None and r["kiln_threads"] != r["threads"]:
            thr += f" (ran {r['kiln_threads']})"
        cells = [f"`{r['name']}`", r["family"], r["op"], f"{r['flops'] / 1e6:.1f}", thr,
                 fmt(r.get("kiln_p50_ms"), ".3f", "error" if r.get("error") else "-"),
                 fmt(r.get("kiln_p95_ms"), ".3f"), fmt(r.get("ort_p50_ms"), ".3f", "error" if r.get("error") else "-"),
                 fmt(r.get("ort_p95_ms"), ".3f"),
                 fmt(r.get("ort_over_kiln"), ".2f") + ("x" if r.get("ort_over_kiln") else ""),
                 fmt(r.get("kiln_gflops"), ".1f"),
                 fmt(r["fraction_of_peak"] * 100 if r.get("fraction_of_peak") else None, ".1f")
                 + ("%" if r.get("fraction_of_peak") else "")]
        if has_kernel:
            cells.append(r.get("kernel") or "-")
        md.append("| " + " | ".join(cells) + " |")

    summary = {}
    md += ["", "## Summary", ""]
    md += ["| threads | shapes timed | errors | geomean ORT/Kiln | shapes >= 0.9x | shapes >= 1.0x | "
           "shapes >= 50 MFLOP at >= 70% of peak |", "|---|---|---|---|---|---|---|"]
    for t in threads:
        rt = [r for r in rows if r["threads"] == t]
        ok = [r for r in rt if r.get("ort_over_kiln")]
        g = geomean([r["ort_over_kiln"] for r in ok])
        big = [r for r in rt if r["flops"] >= 50e6 and r.get("kiln_gflops")]
        fast = [r for r in big if r.get("fraction_of_peak") and r["fraction_of_peak"] >= 0.7]
        summary[t] = {"shapes": len(rt), "timed": len(ok), "errors": sum(1 for r in rt if r.get("error")),
                      "geomean_ort_over_kiln": g, "at_least_0.9x": sum(1 for r in ok if r["ort_over_kiln"] >= 0.9),
                      "at_least_1x": sum(1 for r in ok if r["ort_over_kiln"] >= 1.0),
                      "big_shapes": len(big), "big_at_70pct_peak": len(fast) if peak else None}
        s = summary[t]
        md.append(f"| {t} | {s['timed']} of {s['shapes']} | {s['errors']} | {fmt(g, '.3f')}x | "
                  f"{s['at_least_0.9x']} | {s['at_least_1x']} | "
                  + (f"{len(fast)} of {len(big)}" if peak else "peak not measured") + " |")
    for t in threads:
        ok = sorted((r for r in rows if r["threads"] == t and r.get("ort_over_kiln")), key=lambda r: r["ort_over_kiln"])
        md += ["", f"### The 10 worst ratios at {t} thread(s)", "",
               "| shape | op | MFLOP | Kiln p50 ms | ORT p50 ms | ORT/Kiln | Kiln GFLOP/s | % of peak"
               + (" | kernel" if has_kernel else "") + " |",
               "|---|---|---|---|---|---|---|---" + ("|---" if has_kernel else "") + "|"]
        for r in ok[:10]:
            md.append(f"| `{r['name']}` | {r['op']} | {r['flops'] / 1e6:.1f} | {r['kiln_p50_ms']:.3f} | "
                      f"{r['ort_p50_ms']:.3f} | {r['ort_over_kiln']:.2f}x | {r['kiln_gflops']:.1f} | "
                      + (f"{100 * r['fraction_of_peak']:.1f}%" if r.get("fraction_of_peak") else "-")
                      + (f" | {r.get('kernel') or '-'}" if has_kernel else "") + " |")

    families = sorted({r["family"] for r in rows}, key=lambda f: [r["family"] for r in rows].index(f))
    md += ["", "### Geomean ORT/Kiln per family", "", "| family | shapes | " + " | ".join(f"{t} thr" for t in threads)
           + " |", "|---|---|" + "---|" * len(threads)]
    for fam in families:
        cells = []
        for t in threads:
            g = geomean([r["ort_over_kiln"] for r in rows if r["family"] == fam and r["threads"] == t
                         and r.get("ort_over_kiln")])
            cells.append(fmt(g, ".2f") + ("x" if g else ""))
        n = len({r["name"] for r in rows if r["family"] == fam})
        md.append(f"| {fam} | {n} | " + " | ".join(cells) + " |")

    generic = {}
    for r in rows:
        rec = r.get("kernel_record") or {}
        if rec.get("generic") or str(r.get("kernel") or "").startswith("generic"):
            generic[r["name"]] = rec
    if generic:
        md += ["", "### Shapes on the generic kernel", ""]
        for name, rec in generic.items():
            why = "; ".join(f"{d.get('kernel')}: {d.get('reason')}" for d in rec.get("declined") or [])
            md.append(f"- `{name}`: {why or 'no reason reported'}")
    failed = [r for r in rows if r.get("error")]
    if failed:
        md += ["", "### Errors", ""]
        for r in failed:
            md.append(f"- `{r['name']}` at {r['threads']} thread(s): {r['error']}")
    return "\n".join(md) + "\n", summary


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=DEFAULT_MODELS, help="directory of manifest.json and the models")
    ap.add_argument("--filter", help="only shapes whose name (or family) matches this regex")
    ap.add_argument("--limit", type=int, help="only the first N shapes (after --filter)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--timeout", type=int, default=600, help="seconds for any one compile or timing process")
    ap.add_argument("--kiln", default=os.path.join(ROOT, "target", "release", "kiln"))
    ap.add_argument("--roofline", default=os.path.join(ROOT, "target", "release", "examples", "roofline"))
    ap.add_argument("--out", default=os.path.join(ROOT, "target", "sweep"))
    ap.add_argument("--compile-arg", action="append", default=[],
                    help="an extra argument of `kiln compile` (repeatable), e.g. --compile-arg=--threads=1")
    # Internal: onnxruntime in a process of its own.
    ap.add_argument("--worker", choices=["ort"], help=argparse.SUPPRESS)
    ap.add_argument("--onnx", help=argparse.SUPPRESS)
    ap.add_argument("--feeds", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.worker == "ort":
        worker_ort(args)
        return

    manifest_path = os.path.join(args.models, "manifest.json")
    if not os.path.exists(manifest_path):
        sys.exit(f"{manifest_path} is missing: run `python bench/sweep_models.py --out {args.models}` "
                 "(bench/sweep.sh does)")
    entries = json.load(open(manifest_path))["models"]
    if args.filter:
        rx = re.compile(args.filter)
        entries = [e for e in entries if rx.search(e["name"]) or rx.search(e["family"])]
    if args.limit is not None:
        entries = entries[: args.limit]
    threads = [int(t) for t in args.threads.split(",")]
    if not os.path.exists(args.kiln):
        sys.exit(f"{args.kiln} is missing: build it with "
                 "`cargo build --release --locked -p kiln --bin kiln --example roofline` (bench/sweep.sh does)")
    kiln_threads = harness.kiln_supports_threads(args.kiln)
    peak = harness.measure_peak(args.roofline)
    os.makedirs(args.out, exist_ok=True)

    import onnxruntime

    version = subprocess.run([args.kiln, "--version"], capture_output=True, text=True).stdout.strip()
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    peak_text = f"peak {peak:.1f} GFLOP/s per core (AVX-512 FMA loop)" if peak else "peak not measured"
    header = (f"Shape sweep, {datetime.date.today().isoformat()}, commit `{commit or '?'}` ({version}), "
              f"{cpu_name()}: {len(entries)} single-op models at {','.join(map(str, threads))} thread(s); "
              f"onnxruntime {onnxruntime.__version__}; {args.runs} runs after {args.warmup} warm-up, each engine "
              f"in its own process on the same input; {peak_text}. ORT/Kiln above 1: Kiln is faster.")
    print(header)
    if not kiln_threads:
        print("note: this kiln's `bench` has no --threads; Kiln runs only in the 1-thread rows")
    print(f"{'shape':<58} {'thr':>5} {'kiln p50':>9} {'ort p50':>9} {'ORT/K':>7} {'GFLOP/s':>7} {'%peak':>6}  kernel")

    rows = []
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="kiln-sweep-") as tmp:
        for entry in entries:
            try:
                rows += measure(entry, args.models, threads, args, kiln_threads, peak, tmp)
            except Exception as e:  # never let one shape end the sweep
                for t in threads:
                    rows.append({"name": entry["name"], "family": entry["family"], "op": entry["op"],
                                 "flops": entry["flops"], "threads": t, "error": f"sweep: {type(e).__name__}: {e}"})
                    print_row(dict(rows[-1], fraction_of_peak=None), kernel_col=False)
    md, summary = report(rows, threads, header, peak)
    print()
    print(md)
    with open(os.path.join(args.out, "results.json"), "w") as fh:
        json.dump({"header": header, "peak_gflops": peak, "threads": threads, "runs": args.runs,
                   "warmup": args.warmup, "kiln_version": version, "commit": commit,
                   "onnxruntime": onnxruntime.__version__, "elapsed_s": time.time() - started,
                   "summary": {str(k): v for k, v in summary.items()}, "rows": rows}, fh, indent=1)
    with open(os.path.join(args.out, "results.md"), "w") as fh:
        fh.write(md)
    print(f"wrote {args.out}/results.json, results.md ({time.time() - started:.0f} s)")


if __name__ == "__main__":
    main()
