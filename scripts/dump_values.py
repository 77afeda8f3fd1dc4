#!/usr/bin/env python3
"""Every value of an ONNX model as onnxruntime computes it, for
`kiln debug MODEL --reference DIR`.

Marks every node output as a graph output, runs onnxruntime with its graph
optimizations off (so each value is the source model's, not a fused one's)
and writes DIR/NNNNN.npy per value and DIR/values.json, which maps each
value's ONNX tensor name to its file:

    python3 scripts/dump_values.py model.onnx --input x=x.npy -o DIR
    kiln debug model.onnx --input x=x.npy --reference DIR

Inputs are given as `kiln debug` takes them: --input NAME=FILE.npy
(repeatable) and/or --inputs-npz FILE.npz. Needs numpy, onnx and
onnxruntime (target/fixtures-venv has them).
"""

import argparse
import json
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort


def every_value_an_output(model):
    """The model with each node output (of the main graph) also a graph
    output, after its own outputs, in node order."""
    outputs = {o.name for o in model.graph.output}
    for node in model.graph.node:
        for name in node.output:
            if name and name not in outputs:
                # No type: onnxruntime infers it.
                model.graph.output.append(onnx.ValueInfoProto(name=name))
                outputs.add(name)
    return model


def read_inputs(args):
    feeds = {}
    if args.inputs_npz:
        with np.load(args.inputs_npz) as npz:
            feeds.update({name: npz[name] for name in npz.files})
    for item in args.input:
        name, sep, path = item.rpartition("=")
        if not sep or not name:
            sys.exit(f"--input takes NAME=FILE.npy, got '{item}'")
        feeds[name] = np.load(path)
    return feeds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy")
    parser.add_argument("--inputs-npz", metavar="FILE.npz")
    parser.add_argument("-o", "--output-dir", required=True, metavar="DIR")
    args = parser.parse_args()

    model = every_value_an_output(onnx.load(args.model))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    feeds = read_inputs(args)
    missing = [i.name for i in session.get_inputs() if i.name not in feeds]
    if missing:
        sys.exit(f"no value for input(s) {', '.join(missing)}")
    values = session.run(None, feeds)
    os.makedirs(args.output_dir, exist_ok=True)
    index = {}
    for i, (output, value) in enumerate(zip(session.get_outputs(), values)):
        file = f"{i:05d}.npy"
        np.save(os.path.join(args.output_dir, file), np.asarray(value))
        index[output.name] = file
    with open(os.path.join(args.output_dir, "values.json"), "w") as f:
        json.dump({"model": os.path.abspath(args.model), "values": index}, f, indent=1)
    print(f"{len(index)} values of {args.model} -> {args.output_dir}")


if __name__ == "__main__":
    main()
