"""Make a transport copy of a transformer real-model directory by cutting its
word-embedding table down to the rows the committed inputs use.

Why: the offline GPU machine is reached through a 64 MiB transfer limit, and
a BERT-style model such as paraphrase-MiniLM-L3-v2 is ~67 MB, ~47 MB of it
the 30522 x 384 word-embedding table, read only by one Gather on input_ids.
Keeping just the rows for the token ids in inputs/input_ids.npy (sorted, in
that order) and remapping input_ids to indices into the cut table gives a
model that computes exactly the same outputs on the remapped inputs: the
Gather yields the same rows bit for bit, and nothing else reads the ids but
their shape. The one exception is a graph output that is input_ids passed
through Identity (this model has one, "output"); its reference file is
written as the remapped ids, which is what that output now is.

    python tests/gpu/shrink_vocab.py [--verify] SRC_DIR DST_DIR

SRC_DIR holds model.onnx, meta.json, inputs/*.npy and outputs/*.npy
(fixtures/make_real.py); DST_DIR gets the same layout. --verify runs the
original and the cut model with onnxruntime (CPU, 1 thread) and checks both
against each other and against the references.
"""

import argparse
import json
import os
import shutil
import sys

import numpy as np
import onnx
from onnx import numpy_helper

IDS = "input_ids"


def fail(msg):
    sys.exit(f"shrink_vocab: {msg}")


def shrink(src, dst):
    meta = json.load(open(os.path.join(src, "meta.json")))
    model = onnx.load(os.path.join(src, "model.onnx"))
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    users = [n for n in g.node if IDS in n.input]
    gathers = [n for n in users if n.op_type == "Gather" and n.input[1] == IDS
               and n.input[0] in inits]
    if len(gathers) != 1:
        fail(f"want one Gather(initializer, {IDS}), found {len(gathers)}")
    gather = gathers[0]
    if any(a.name == "axis" and a.i != 0 for a in gather.attribute):
        fail("embedding Gather has axis != 0")
    outs = {o.name for o in g.output}
    passthrough = []  # graph outputs that are input_ids through Identity
    for n in users:
        if n is gather or n.op_type == "Shape":
            continue
        if n.op_type == "Identity" and n.output[0] in outs:
            passthrough.append(n.output[0])
            continue
        fail(f"{IDS} also feeds {n.op_type} {n.name!r}; values would change")
    if IDS in outs:
        passthrough.append(IDS)
    table = gather.input[0]
    readers = [n for n in g.node for i in list(n.input) if i == table]
    if len(readers) != 1 or table in outs:
        fail(f"{table} is used by {len(readers)} nodes, want only the Gather")

    ids_file = next(i["file"] for i in meta["inputs"] if i["name"] == IDS)
    ids = np.load(os.path.join(src, ids_file))
    keep = np.unique(ids)  # sorted
    remapped = np.searchsorted(keep, ids).astype(ids.dtype)
    weight = numpy_helper.to_array(inits[table])
    if keep.min() < 0 or keep.max() >= weight.shape[0]:
        fail("token ids out of the table's range")
    inits[table].CopyFrom(numpy_helper.from_array(weight[keep], table))

    for sub in ("inputs", "outputs"):
        os.makedirs(os.path.join(dst, sub), exist_ok=True)
    onnx.save(model, os.path.join(dst, "model.onnx"))
    for i in meta["inputs"]:
        if i["name"] == IDS:
            np.save(os.path.join(dst, i["file"]), remapped)
        else:
            shutil.copyfile(os.path.join(src, i["file"]), os.path.join(dst, i["file"]))
    for o in meta["outputs"]:
        s, d = os.path.join(src, o["file"]), os.path.join(dst, o["file"])
        if o["name"] in passthrough:
            if not np.array_equal(np.load(s), ids):
                fail(f"reference {o['name']} is not {IDS}")
            np.save(d, remapped)
        else:
            shutil.copyfile(s, d)
    note = (f"word-embedding table cut to the {len(keep)} rows the inputs use, "
            "ids remapped (tests/gpu/shrink_vocab.py); outputs unchanged")
    if passthrough:
        note += f" except {', '.join(passthrough)} (= {IDS}, now the remapped ids)"
    meta["transport"] = note
    with open(os.path.join(dst, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"{dst}: {weight.shape[0]} -> {len(keep)} rows")


def run(d):
    import onnxruntime as ort
    meta = json.load(open(os.path.join(d, "meta.json")))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(os.path.join(d, "model.onnx"), opts,
                                providers=["CPUExecutionProvider"])
    feeds = {i["name"]: np.load(os.path.join(d, i["file"])) for i in meta["inputs"]}
    names = [o["name"] for o in meta["outputs"]]
    got = dict(zip(names, sess.run(names, feeds)))
    refs = {o["name"]: np.load(os.path.join(d, o["file"])) for o in meta["outputs"]}
    return got, refs


def maxdiff(a, b):
    if a.shape != b.shape:
        return float("inf")
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)), initial=0))


def verify(src, dst):
    old, old_ref = run(src)
    new, new_ref = run(dst)
    meta = json.load(open(os.path.join(src, "meta.json")))
    ids_file = next(i["file"] for i in meta["inputs"] if i["name"] == IDS)
    keep = np.unique(np.load(os.path.join(src, ids_file)))
    worst = 0.0
    for name in old:
        same_ref = np.array_equal(old_ref[name], new_ref[name])
        # the input_ids pass-through holds remapped ids: map them back first
        d = maxdiff(old[name], new[name] if same_ref else keep[new[name]])
        r_old, r_new = maxdiff(old[name], old_ref[name]), maxdiff(new[name], new_ref[name])
        worst = max(worst, d, r_new)
        print(f"  {name:18s} {str(new[name].shape):14s} orig-vs-cut {d:.3g}  "
              f"orig-vs-ref {r_old:.3g}  cut-vs-ref {r_new:.3g}")
    print(f"verify {dst}: {'OK, identical' if worst == 0 else f'max abs diff {worst:.3g}'}")
    return worst == 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--verify", action="store_true")
    ap.add_argument("src")
    ap.add_argument("dst")
    a = ap.parse_args()
    shrink(a.src, a.dst)
    if a.verify and not verify(a.src, a.dst):
        sys.exit(1)


if __name__ == "__main__":
    main()
