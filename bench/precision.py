#!/usr/bin/env python3
"""Precision table: every model in every precision Kiln builds, in one run.

Builds: fp32, bf16, fp16, mixed, int8 dynamic, int8 static without
smoothing and int8 static as it comes (smoothed, biases corrected). For
each model and build: the artifact's size and weight bytes, the quality
against the fp32 artifact on inputs the calibration did not see (accuracy,
argmax agreement or cosine, as the model's job asks), the output's relative
L2 error on the calibration samples and the three worst layers from the
compile-time report, and `kiln bench` p50 at one thread, every build of a
model benchmarked in alternation with its fp32 artifact (the best p50 of
`--rounds` rounds). Prints a Markdown table and writes JSON.

    bench/precision.sh [--runs N] [--rounds R] [--models a,b] [--out DIR]

Data (all committed or made by scripts/real-models.sh):
- digits MLP / CNN: the fixture's 360 test images; calibrated on the same
  images (the static path's accuracy, not a held-out calibration).
- PP-OCR cls / PP-OCRv4 rec: fixtures/text_lines (24 rendered English
  lines): calibrated on lines 0-7, measured on lines 8-23 (cls: upright and
  turned by 180 degrees).
- PP-OCRv4 det: the fixture image and its mirror image as calibration,
  measured on the fixture image (in sample): pixels of the probability map
  on the same side of PaddleOCR's 0.3 threshold as fp32.
- MiniLM-L3: the 32 fixture sentences at batch 8: calibrated on the first
  8, measured on the other 24 (cosine of the pooled embeddings).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
KILN = ROOT / "target" / "release" / "kiln"
MODELS_DIR = ROOT / "fixtures" / "models"
REAL_DIR = Path(os.environ.get("KILN_REAL_MODELS", ROOT / "target" / "real-models"))
CALIBRATION_LINES = 8

# (label, compile flags, needs calibration for the build itself)
BUILDS = [
    ("fp32", [], False),
    ("bf16", ["--precision", "bf16"], False),
    ("fp16", ["--precision", "fp16"], False),
    ("mixed", ["--precision", "mixed"], False),
    ("int8 dynamic", ["--quantize", "dynamic"], False),
    ("int8 static --smooth off", ["--quantize", "static", "--smooth", "off"], True),
    ("int8 static", ["--quantize", "static"], True),
]


def kiln(*args, capture=True):
    r = subprocess.run([str(KILN), *map(str, args)], capture_output=capture, text=True)
    if r.returncode != 0:
        sys.exit(f"kiln {' '.join(map(str, args))}: {r.stderr.strip()}")
    return r.stdout


def save_sample(path, arrays):
    np.savez(path, **arrays)


class Model:
    """One model: its ONNX file, shape flags, calibration samples, the
    held-out inputs, a bench input, and how to score outputs."""

    def __init__(self, name, onnx, shapes, calibration, tests, score, metric):
        self.name, self.onnx, self.shapes = name, onnx, shapes
        self.calibration, self.tests = calibration, tests
        self.score, self.metric = score, metric


def text_lines(file):
    lines = np.load(ROOT / "fixtures" / "text_lines" / f"{file}.npy").astype(np.float32)
    img = (lines / 255.0 - 0.5) / 0.5
    as_input = lambda im: np.repeat(im[None, None], 3, axis=1).astype(np.float32)
    upright = [as_input(im) for im in img]
    turned = [as_input(im[::-1, ::-1]) for im in img]
    return upright, turned


def argmax_agreement(ref_runs, runs):
    agree = rows = 0
    for r, q in zip(ref_runs, runs):
        a, b = r[0], q[0]
        a = a.reshape(-1, a.shape[-1]).argmax(-1)
        b = b.reshape(-1, b.shape[-1]).argmax(-1)
        agree += int((a == b).sum())
        rows += len(a)
    return agree / rows, f"{agree}/{rows}"


def models(work):
    out = []
    for name in ["digits_mlp", "digits_cnn"]:
        d = MODELS_DIR / name
        meta = json.loads((d / "meta.json").read_text())["accuracy"]
        images = np.load(d / meta["images"]).astype(np.float32)
        labels = np.load(d / meta["labels"])
        shape = "x".join(map(str, images.shape))
        calib = work / name / "calibration"
        calib.mkdir(parents=True)
        save_sample(calib / "test_set.npz", {meta["input"]: images})

        def score(ref_runs, runs, labels=labels):
            acc = float((runs[0][1].argmax(-1) == labels).mean())
            ref = float((ref_runs[0][1].argmax(-1) == labels).mean())
            return acc - ref, f"{acc:.4f} ({(acc - ref) * 100:+.2f} pt)"

        out.append(
            Model(name, d / "model.onnx", [f"{meta['input']}={shape}"], calib,
                  [{meta["input"]: images}], score, "test-set accuracy")
        )
    for name, file, real in [("ppocr_cls", "cls", False), ("ppocrv4_rec", "rec", True)]:
        d = (REAL_DIR if real else MODELS_DIR) / name
        if not (d / "model.onnx").exists():
            print(f"skipping {name}: {d} missing (scripts/real-models.sh)", file=sys.stderr)
            continue
        upright, turned = text_lines(file)
        calib = work / name / "calibration"
        calib.mkdir(parents=True)
        samples = upright[:CALIBRATION_LINES]
        tests = upright[CALIBRATION_LINES:]
        if name == "ppocr_cls":
            samples = samples + turned[:CALIBRATION_LINES]
            tests = tests + turned[CALIBRATION_LINES:]
        for i, x in enumerate(samples):
            save_sample(calib / f"line{i:02}.npz", {"x": x})
        shape = "x".join(map(str, tests[0].shape))
        out.append(
            Model(name, d / "model.onnx", [f"x={shape}"], calib, [{"x": t} for t in tests],
                  argmax_agreement, "argmax agreement with fp32")
        )
    det = REAL_DIR / "ppocrv4_det"
    if (det / "model.onnx").exists():
        x = np.load(det / "inputs" / "x.npy")
        calib = work / "ppocrv4_det" / "calibration"
        calib.mkdir(parents=True)
        save_sample(calib / "image.npz", {"x": x})
        save_sample(calib / "mirror.npz", {"x": np.ascontiguousarray(x[..., ::-1])})

        def mask_agreement(ref_runs, runs):
            a, b = ref_runs[0][0] > 0.3, runs[0][0] > 0.3
            share = float((a == b).mean())
            return share, f"{share:.5f} of pixels"

        out.append(
            Model("ppocrv4_det", det / "model.onnx", ["x=" + "x".join(map(str, x.shape))], calib,
                  [{"x": x}], mask_agreement, "text-mask pixels as fp32 (in sample)")
        )
    mini = REAL_DIR / "minilm_l3_sentences"
    if (mini / "model.onnx").exists():
        ids = np.load(mini / "inputs" / "input_ids.npy")
        mask = np.load(mini / "inputs" / "attention_mask.npy")
        calib = work / "minilm_l3" / "calibration"
        calib.mkdir(parents=True)
        save_sample(calib / "sentences.npz", {"input_ids": ids[:8], "attention_mask": mask[:8]})
        tests = [{"input_ids": ids[i:i + 8], "attention_mask": mask[i:i + 8]} for i in (8, 16, 24)]

        def cosine(ref_runs, runs):
            cs = []
            for r, q in zip(ref_runs, runs):
                # The pooled sentence embedding (output "461", [8, 384]).
                a, b = r[3], q[3]
                cs += list((a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1))
            return float(min(cs)), f"min {min(cs):.5f}, mean {np.mean(cs):.5f}"

        out.append(
            Model("minilm_l3", mini / "model.onnx", ["input_ids=8x32", "attention_mask=8x32"],
                  calib, tests, cosine, "sentence-embedding cosine vs fp32 (24 sentences)")
        )
    return out


def run_outputs(art, inputs, work):
    """The artifact's outputs on one input dict, in output order."""
    d = Path(tempfile.mkdtemp(dir=work))
    args = []
    for k, v in inputs.items():
        np.save(d / f"in_{k}.npy", v)
        args += ["--input", f"{k}={d / f'in_{k}.npy'}"]
    out = d / "out"
    kiln("run", art, *args, "--output-dir", out)
    meta = json.loads(kiln("inspect", art, "--json"))
    names = [o["name"] for o in meta["outputs"]]
    # `kiln run` names files as npy.rs::sanitize_name does.
    safe = lambda n: "".join(c if c.isascii() and (c.isalnum() or c in "_.-") else "_" for c in n)
    return [np.load(out / (safe(n) + ".npy")) for n in names]


def bench_args(model, work):
    d = work / model.name / "bench"
    d.mkdir(exist_ok=True)
    args = []
    for k, v in model.tests[0].items():
        np.save(d / f"{k}.npy", v)
        args += ["--input", f"{k}={d / f'{k}.npy'}"]
    return args


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30, help="timed runs per bench")
    ap.add_argument("--rounds", type=int, default=2, help="alternating bench rounds")
    ap.add_argument("--models", help="comma-separated subset")
    ap.add_argument("--out", type=Path, default=ROOT / "target" / "precision")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="kiln-precision-"))
    results = []
    for m in models(work):
        if a.models and m.name not in a.models.split(","):
            continue
        print(f"== {m.name}", file=sys.stderr)
        arts = {}
        for label, flags, _ in BUILDS:
            art = work / m.name / (label.replace(" ", "_").replace("-", "") + ".kiln")
            report = art.with_suffix(".report.json")
            shape_flags = [f for s in m.shapes for f in ("--input-shape", s)]
            extra = [] if label == "fp32" else ["--calibrate", m.calibration, "--report", report]
            info = json.loads(kiln("compile", m.onnx, *shape_flags, *flags, *extra,
                                   "--threads", "1", "--json", "-o", art))
            rep = json.loads(report.read_text())["report"] if label != "fp32" else None
            arts[label] = {"art": art, "info": info, "report": rep}
        ref_runs = [run_outputs(arts["fp32"]["art"], t, work) for t in m.tests]
        p50 = {label: float("inf") for label in arts}
        bargs = bench_args(m, work)
        for _ in range(a.rounds):
            for label, v in arts.items():
                b = json.loads(kiln("bench", v["art"], *bargs, "--threads", "1",
                                    "--runs", a.runs, "--warmup", 5, "--json"))
                p50[label] = min(p50[label], b["p50_ms"])
        for label, v in arts.items():
            runs = ref_runs if label == "fp32" else [run_outputs(v["art"], t, work) for t in m.tests]
            value, shown = m.score(ref_runs, runs)
            rep = v["report"]
            worst = []
            out_err = None
            if rep:
                out_err = max(o["rel_l2"] for o in rep["outputs"])
                worst = [(l["node"], l["precision"], l["rel_l2"]) for l in rep["layers_worst_first"][:3]]
            results.append({
                "model": m.name, "build": label, "bytes": v["info"]["bytes"],
                "weights_bytes": v["info"]["weights_bytes"], "metric": m.metric,
                "quality": value, "quality_shown": shown, "p50_ms": p50[label],
                "p50_ratio_vs_fp32": p50[label] / p50["fp32"],
                "calibration_output_rel_l2": out_err, "worst_layers": worst,
            })
    (a.out / "precision.json").write_text(json.dumps(results, indent=1))
    print("| model | build | artifact | weights | quality vs fp32 | calib. output rel L2 | p50 1 thread (vs fp32) | worst three layers (rel L2) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        worst = "; ".join(f"{n} {p} {e:.3f}" for n, p, e in r["worst_layers"]) or "-"
        err = f"{r['calibration_output_rel_l2']:.3e}" if r["calibration_output_rel_l2"] is not None else "-"
        print(f"| {r['model']} | {r['build']} | {r['bytes'] / 1e6:.2f} MB | {r['weights_bytes'] / 1e6:.2f} MB "
              f"| {r['quality_shown']} | {err} | {r['p50_ms']:.3f} ms ({r['p50_ratio_vs_fp32']:.2f}x) | {worst} |")
    print(f"\n(metrics: {', '.join(sorted({r['model'] + ': ' + r['metric'] for r in results}))}; "
          f"JSON in {a.out / 'precision.json'})")


if __name__ == "__main__":
    main()
