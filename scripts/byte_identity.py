#!/usr/bin/env python3
"""Compiles every fixture and real model in every build configuration with
two `kiln` binaries and says whether the artifacts are byte-identical.

    scripts/byte_identity.py BASE_KILN HEAD_KILN OUT_DIR [--only SUBSTR]

This is the proof a behaviour-preserving refactor owes (docs/architecture.md):
run it through `scripts/byte-identity.sh BASE_REV`, which builds both
binaries. A model that fails to compile must fail the same way (same exit
code) with both binaries. Exit status 0 when everything is identical, 1
otherwise; the differing artifacts are listed.
"""

import argparse
import concurrent.futures
import hashlib
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent

# name -> extra `kiln compile` arguments. Every precision, both ends of the
# optimization levels, every CPU target family and one CUDA target.
CONFIGS = {
    "O0": ["-O0"],
    "O2": ["-O2"],
    "bf16": ["--precision", "bf16"],
    "fp16": ["--precision", "fp16"],
    "mixed": ["--precision", "mixed"],
    "int8-dynamic": ["--precision", "int8"],
    "int8-static": ["--quantize", "static", "--calibrate-random", "2"],
    "x86_64-v3": ["--target", "x86_64-v3"],
    "aarch64": ["--target", "aarch64"],
    "cuda-sm80": ["--target", "cuda-sm80"],
}


def model_dirs():
    """Every fixture and real model directory with a meta.json."""
    roots = [ROOT / "fixtures" / "models", ROOT / "target" / "real-models"]
    for root in roots:
        if not root.is_dir():
            print(f"byte identity: {root} is missing, skipped", file=sys.stderr)
            continue
        for d in sorted(root.iterdir()):
            if (d / "meta.json").is_file() and (d / "model.onnx").is_file():
                yield d


def binding_args(model_dir):
    """The `--input-shape`/`--dim`/`--bind-input` arguments of a model."""
    meta = json.loads((model_dir / "meta.json").read_text())
    args = []
    for name, dims in (meta.get("input_shapes") or {}).items():
        args += ["--input-shape", f"{name}={'x'.join(str(d) for d in dims)}"]
    for name, value in (meta.get("dims") or {}).items():
        args += ["--dim", f"{name}={value}"]
    for name, file in (meta.get("bind_inputs") or {}).items():
        args += ["--bind-input", f"{name}={model_dir / file}"]
    return args


def compile_one(kiln, model_dir, config, out):
    """Compiles one model; returns (exit code, sha256 of the artifact or '')."""
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [kiln, "compile", str(model_dir / "model.onnx"), "-o", str(out), "--threads", "2"]
    cmd += binding_args(model_dir) + CONFIGS[config]
    run = subprocess.run(cmd, capture_output=True, cwd=ROOT, env={**os.environ, "RUST_BACKTRACE": "0"})
    digest = hashlib.sha256(out.read_bytes()).hexdigest() if run.returncode == 0 else ""
    return run.returncode, digest


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base")
    ap.add_argument("head")
    ap.add_argument("out", type=pathlib.Path)
    ap.add_argument("--only", help="only models whose directory name contains this")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()

    jobs = []
    for d in model_dirs():
        if args.only and args.only not in d.name:
            continue
        for config in CONFIGS:
            for side, kiln in (("base", args.base), ("head", args.head)):
                out = args.out / side / d.parent.name / d.name / f"{config}.kiln"
                jobs.append((side, d, config, kiln, out))

    results = {}
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = {pool.submit(compile_one, kiln, d, config, out): (side, d, config)
                   for side, d, config, kiln, out in jobs}
        for f in concurrent.futures.as_completed(futures):
            results[futures[f]] = f.result()

    keys = sorted({(d, config) for _, d, config in results})
    differ = []
    compiled = refused = 0
    for d, config in keys:
        base, head = results[("base", d, config)], results[("head", d, config)]
        if base != head:
            differ.append((d, config, base, head))
        elif base[0] == 0:
            compiled += 1
        else:
            refused += 1
    print(f"byte identity: {len(keys)} builds ({len({d for d, _ in keys})} models x "
          f"{len(CONFIGS)} configurations): {compiled} identical artifacts, "
          f"{refused} refused by both with the same exit code, {len(differ)} differ")
    for d, config, base, head in differ:
        rel = d.relative_to(ROOT)
        print(f"  DIFFER {rel} [{config}]: base exit {base[0]} {base[1][:16]}, head exit {head[0]} {head[1][:16]}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
