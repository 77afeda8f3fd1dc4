"""Single-op ONNX models for the shape sweep (bench/sweep.sh, bench/sweep.py).

    python bench/sweep_models.py [--out target/sweep/models] [--filter REGEX]

Writes one opset-17 ONNX model per shape, NAME.onnx, and manifest.json
listing for each: name, family, layer (where in the architecture the shape
comes from), op, inputs (name and static shape), dense FLOPs (2 x MACs;
bias, activation and gate nonlinearities not counted), parameter count and
file. Every shape is a layer of a real architecture at its usual input size
and batch 1 (a few at batch 8, 32 or 256): ResNet-18/50, ResNeXt-50/101,
MobileNetV2/V3, EfficientNet-B0/B4 (B4 with TensorFlow "SAME" padding),
ShuffleNet V1 (groups 3/4/8) and V2, RegNetX/Y, ConvNeXt-T, DenseNet-121,
Inception v3, VGG-16, UNet and the pix2pix U-Net, YOLOv5s/v8n, CenterNet,
DeepLabV3, BERT-base/large, ViT-B/S, Whisper base/tiny encoders, 1-D
audio (wav2vec2, ECAPA-TDNN, Conformer, HiFi-GAN, WaveNet, Demucs) and
byte-sequence CNNs (char-CNN, MalConv, CANINE), LSTM/GRU gates and cells,
DLRM MLPs.

1-D convolutions appear in the three forms exporters write: Conv on rank-3
N,C,L tensors (`_ncl`), N,C,L,1 with a k x 1 kernel (`_ncl1`) and N,C,1,L
with a 1 x k kernel (`_nc1l`).

Weights are initializers, random normal scaled by 1/sqrt(fan-in), from a
generator seeded by the model's name (so a model is the same whichever
others are generated); a bias is present where the architecture has one
(BatchNorm folded into the conv at export counts as one; DenseNet's
pre-activation convs have none). Nothing is downloaded. Inputs are not
written here: bench/sweep.py makes each model's input .npy on first use.
"""
import argparse
import json
import os
import re
import zlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPSET = 17
IR_VERSION = 8


def pair(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v)


def conv_out(size, k, s, pb, pe, d):
    return (size + pb + pe - d * (k - 1) - 1) // s + 1


def convt_out(size, k, s, pb, pe, d, op=0):
    return (size - 1) * s - pb - pe + d * (k - 1) + op + 1


class Sweep:
    def __init__(self):
        self.entries = []  # (meta, builder) pairs; builder() -> ModelProto

    def _add(self, meta, builder):
        if any(m["name"] == meta["name"] for m, _ in self.entries):
            raise ValueError(f"duplicate model name {meta['name']}")
        self.entries.append((meta, builder))

    @staticmethod
    def _rng(name):
        return np.random.default_rng(zlib.crc32(name.encode()))

    @staticmethod
    def _weight(rng, shape, fan_in):
        return (rng.standard_normal(shape, dtype=np.float32) / np.float32(np.sqrt(max(fan_in, 1)))).astype(np.float32)

    @staticmethod
    def _model(name, nodes, inputs, outputs, inits):
        g_inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in inputs]
        g_outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in outputs]
        g_inits = [numpy_helper.from_array(a, n) for n, a in inits]
        graph = helper.make_graph(nodes, name, g_inputs, g_outputs, initializer=g_inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="kiln-sweep")
        model.ir_version = IR_VERSION
        return model

    # -- convolutions -----------------------------------------------------

    def conv(self, family, layer, n, cin, hw, cout, k, s=1, p=None, d=1, g=1, bias=True, tag=None):
        """2-D Conv: hw an int or (H, W); k, s, d ints or pairs; p None
        (same-size padding for stride 1: d*(k-1)/2 each side), an int, a pair
        (ph, pw) or ONNX pads (top, left, bottom, right)."""
        h, w = pair(hw)
        kh, kw = pair(k)
        sh, sw = pair(s)
        dh, dw = pair(d)
        if p is None:
            p = (dh * (kh - 1) // 2, dw * (kw - 1) // 2)
        if isinstance(p, int):
            p = (p, p)
        pads = tuple(p) * 2 if len(p) == 2 else tuple(p)
        oh = conv_out(h, kh, sh, pads[0], pads[2], dh)
        ow = conv_out(w, kw, sw, pads[1], pads[3], dw)
        assert cin % g == 0 and cout % g == 0, (layer, cin, cout, g)
        parts = [f"{family}_{tag}" if tag else family, f"c{cin}x{h}x{w}", f"k{kh}x{kw}"]
        parts += [f"s{sh}" if sh == sw else f"s{sh}x{sw}"] if (sh, sw) != (1, 1) else []
        parts += [f"d{dh}" if dh == dw else f"d{dh}x{dw}"] if (dh, dw) != (1, 1) else []
        parts += [f"g{g}"] if g > 1 else []
        parts += [f"o{cout}"] + ([f"b{n}"] if n > 1 else [])
        name = "_".join(parts)
        x_shape, y_shape = (n, cin, h, w), (n, cout, oh, ow)
        w_shape = (cout, cin // g, kh, kw)
        flops = 2 * n * cout * oh * ow * (cin // g) * kh * kw
        self._conv_entry(family, layer, name, "Conv", x_shape, y_shape, w_shape, cout if bias else 0, flops,
                         dict(kernel_shape=[kh, kw], strides=[sh, sw], pads=list(pads), dilations=[dh, dw], group=g),
                         cin // g * kh * kw)

    def conv1d(self, family, layer, n, cin, length, cout, k, s=1, p=None, d=1, g=1, bias=True, tag=None,
               forms=("ncl", "ncl1", "nc1l")):
        """1-D Conv in each of `forms`: rank 3 (N,C,L, kernel [k]), N,C,L,1
        (kernel [k,1]) and N,C,1,L (kernel [1,k]). p: None (same size for
        stride 1), an int, or (begin, end)."""
        if p is None:
            p = d * (k - 1) // 2
        pb, pe = (p, p) if isinstance(p, int) else p
        ol = conv_out(length, k, s, pb, pe, d)
        assert cin % g == 0 and cout % g == 0, (layer, cin, cout, g)
        flops = 2 * n * cout * ol * (cin // g) * k
        base = [f"{family}_{tag}" if tag else family, f"c{cin}x{length}", f"k{k}"]
        base += [f"s{s}"] if s != 1 else []
        base += [f"d{d}"] if d != 1 else []
        base += [f"g{g}"] if g > 1 else []
        base += [f"o{cout}"] + ([f"b{n}"] if n > 1 else [])
        for form in forms:
            name = "_".join(base + [form])
            if form == "ncl":
                xs, ys, ws = (n, cin, length), (n, cout, ol), (cout, cin // g, k)
                attrs = dict(kernel_shape=[k], strides=[s], pads=[pb, pe], dilations=[d], group=g)
            elif form == "ncl1":
                xs, ys, ws = (n, cin, length, 1), (n, cout, ol, 1), (cout, cin // g, k, 1)
                attrs = dict(kernel_shape=[k, 1], strides=[s, 1], pads=[pb, 0, pe, 0], dilations=[d, 1], group=g)
            elif form == "nc1l":
                xs, ys, ws = (n, cin, 1, length), (n, cout, 1, ol), (cout, cin // g, 1, k)
                attrs = dict(kernel_shape=[1, k], strides=[1, s], pads=[0, pb, 0, pe], dilations=[1, d], group=g)
            else:
                raise ValueError(form)
            self._conv_entry(family, f"{layer} ({form})", name, "Conv", xs, ys, ws, cout if bias else 0, flops,
                             attrs, cin // g * k)

    def conv_transpose(self, family, layer, n, cin, hw, cout, k, s, p=0, g=1, bias=True, tag=None, rank=2):
        """ConvTranspose, 2-D (hw an int or pair) or 1-D (rank=1, hw the length)."""
        if rank == 1:
            (length,) = (hw,)
            ol = convt_out(length, k, s, p, p, 1)
            xs, ys, ws = (n, cin, length), (n, cout, ol), (cin, cout // g, k)
            attrs = dict(kernel_shape=[k], strides=[s], pads=[p, p], group=g)
            dims = f"c{cin}x{length}"
            flops = 2 * n * cin * length * (cout // g) * k
        else:
            h, w = pair(hw)
            oh, ow = convt_out(h, k, s, p, p, 1), convt_out(w, k, s, p, p, 1)
            xs, ys, ws = (n, cin, h, w), (n, cout, oh, ow), (cin, cout // g, k, k)
            attrs = dict(kernel_shape=[k, k], strides=[s, s], pads=[p] * 4, group=g)
            dims = f"c{cin}x{h}x{w}"
            flops = 2 * n * cin * h * w * (cout // g) * k * k
        parts = [f"{family}_{tag}" if tag else family, "convT", dims, f"k{k}", f"s{s}"]
        parts += [f"p{p}"] if p else []
        parts += [f"g{g}"] if g > 1 else []
        parts += [f"o{cout}"] + ([f"b{n}"] if n > 1 else [])
        self._conv_entry(family, layer, "_".join(parts), "ConvTranspose", xs, ys, ws, cout if bias else 0, flops,
                         attrs, cin * k ** (2 if rank == 2 else 1) // g)

    def _conv_entry(self, family, layer, name, op, xs, ys, ws, bias_len, flops, attrs, fan_in):
        meta = dict(name=name, family=family, layer=layer, op=op, inputs=[dict(name="x", shape=list(xs))],
                    output_shape=list(ys), weight_shape=list(ws), bias=bool(bias_len), attrs=attrs,
                    flops=int(flops), params=int(np.prod(ws)) + bias_len)

        def build():
            rng = self._rng(name)
            inits = [("w", self._weight(rng, ws, fan_in))]
            if bias_len:
                inits.append(("bias", (0.1 * rng.standard_normal(bias_len)).astype(np.float32)))
            node = helper.make_node(op, ["x"] + [i[0] for i in inits], ["y"], name=name, **attrs)
            return self._model(name, [node], [("x", xs)], [("y", ys)], inits)

        self._add(meta, build)

    # -- matrix products ---------------------------------------------------

    def matmul(self, family, layer, a_shape, n_out, tag):
        """MatMul of an input [..., M, K] by a constant [K, N] (a Linear
        layer as exporters write it for rank > 2, without its bias Add)."""
        k = a_shape[-1]
        m = int(np.prod(a_shape[:-1]))
        ys = list(a_shape[:-1]) + [n_out]
        name = f"{family}_{tag}_mm_{'x'.join(map(str, a_shape))}_n{n_out}"
        meta = dict(name=name, family=family, layer=layer, op="MatMul", inputs=[dict(name="x", shape=list(a_shape))],
                    output_shape=ys, weight_shape=[k, n_out], bias=False, attrs={}, flops=2 * m * k * n_out,
                    params=k * n_out)

        def build():
            rng = self._rng(name)
            w = self._weight(rng, (k, n_out), k)
            node = helper.make_node("MatMul", ["x", "w"], ["y"], name=name)
            return self._model(name, [node], [("x", a_shape)], [("y", ys)], [("w", w)])

        self._add(meta, build)

    def gemm(self, family, layer, m, k, n_out, tag, trans_b=True, bias=True):
        """Gemm of an input [M, K] by a constant weight ([N, K] with transB,
        as PyTorch exports nn.Linear on 2-D inputs) plus a bias [N]."""
        name = f"{family}_{tag}_gemm_{m}x{k}_n{n_out}"
        ws = (n_out, k) if trans_b else (k, n_out)
        meta = dict(name=name, family=family, layer=layer, op="Gemm", inputs=[dict(name="x", shape=[m, k])],
                    output_shape=[m, n_out], weight_shape=list(ws), bias=bias, attrs=dict(transB=int(trans_b)),
                    flops=2 * m * k * n_out, params=k * n_out + (n_out if bias else 0))

        def build():
            rng = self._rng(name)
            inits = [("w", self._weight(rng, ws, k))]
            if bias:
                inits.append(("bias", (0.1 * rng.standard_normal(n_out)).astype(np.float32)))
            node = helper.make_node("Gemm", ["x"] + [i[0] for i in inits], ["y"], name=name, transB=int(trans_b))
            return self._model(name, [node], [("x", (m, k))], [("y", (m, n_out))], inits)

        self._add(meta, build)

    def bmm(self, family, layer, a_shape, b_shape, tag):
        """Batched MatMul of two inputs (attention QK^T or AV)."""
        assert a_shape[:-2] == b_shape[:-2] and a_shape[-1] == b_shape[-2]
        ys = list(a_shape[:-1]) + [b_shape[-1]]
        name = f"{family}_{tag}_bmm_{'x'.join(map(str, a_shape))}_{'x'.join(map(str, b_shape))}"
        flops = 2 * int(np.prod(a_shape)) * b_shape[-1]
        meta = dict(name=name, family=family, layer=layer, op="MatMul",
                    inputs=[dict(name="a", shape=list(a_shape)), dict(name="b", shape=list(b_shape))],
                    output_shape=ys, weight_shape=None, bias=False, attrs={}, flops=flops, params=0)

        def build():
            node = helper.make_node("MatMul", ["a", "b"], ["y"], name=name)
            return self._model(name, [node], [("a", a_shape), ("b", b_shape)], [("y", ys)], [])

        self._add(meta, build)

    def rnn(self, family, layer, op, seq, batch, inp, hidden, tag):
        """A whole LSTM or GRU op (forward, one layer, with biases) taking
        its initial state as inputs, as a streaming model does (a zero
        initial state would let a compiler drop the first step's recurrent
        matmul); the FLOPs are its gate matmuls, 2 x T x B x G*H x (I + H)."""
        gates = 4 if op == "LSTM" else 3
        name = f"{family}_{tag}_{op.lower()}_t{seq}_b{batch}_i{inp}_h{hidden}"
        xs, ys, hs = (seq, batch, inp), (seq, 1, batch, hidden), (1, batch, hidden)
        states = ["h0", "c0"] if op == "LSTM" else ["h0"]
        flops = 2 * seq * batch * gates * hidden * (inp + hidden)
        meta = dict(name=name, family=family, layer=layer, op=op,
                    inputs=[dict(name="x", shape=list(xs))] + [dict(name=n, shape=list(hs)) for n in states],
                    output_shape=list(ys), weight_shape=[1, gates * hidden, inp], bias=True,
                    attrs=dict(hidden_size=hidden), flops=flops,
                    params=gates * hidden * (inp + hidden) + 2 * gates * hidden)

        def build():
            rng = self._rng(name)
            w = self._weight(rng, (1, gates * hidden, inp), inp)
            r = self._weight(rng, (1, gates * hidden, hidden), hidden)
            b = (0.1 * rng.standard_normal((1, 2 * gates * hidden))).astype(np.float32)
            extra = dict(linear_before_reset=1) if op == "GRU" else {}
            node = helper.make_node(op, ["x", "W", "R", "B", ""] + states, ["y"], name=name, hidden_size=hidden,
                                    **extra)
            return self._model(name, [node], [("x", xs)] + [(n, hs) for n in states], [("y", ys)],
                               [("W", w), ("R", r), ("B", b)])

        self._add(meta, build)


def define(sw):
    c, c1, ct, mm, gm, bmm = sw.conv, sw.conv1d, sw.conv_transpose, sw.matmul, sw.gemm, sw.bmm

    # ResNet-18/50 (torchvision, 224x224; BatchNorm folded: biased convs).
    f = "resnet"
    c(f, "ResNet stem 7x7/2", 1, 3, 224, 64, 7, 2, 3, tag="stem")
    c(f, "ResNet stem 7x7/2, batch 8", 8, 3, 224, 64, 7, 2, 3, tag="stem")
    c(f, "ResNet-18 layer1 3x3", 1, 64, 56, 64, 3, tag="r18")
    c(f, "ResNet-18 layer2.0 3x3/2", 1, 64, 56, 128, 3, 2, 1, tag="r18")
    c(f, "ResNet-18 layer2.0 downsample 1x1/2", 1, 64, 56, 128, 1, 2, 0, tag="r18")
    c(f, "ResNet-18 layer3 3x3", 1, 256, 14, 256, 3, tag="r18")
    c(f, "ResNet-18 layer4.0 3x3/2", 1, 256, 14, 512, 3, 2, 1, tag="r18")
    c(f, "ResNet-18 layer4 3x3", 1, 512, 7, 512, 3, tag="r18")
    c(f, "ResNet-18 layer4.0 downsample 1x1/2", 1, 256, 14, 512, 1, 2, 0, tag="r18")
    c(f, "ResNet-50 layer1 conv3 1x1", 1, 64, 56, 256, 1, tag="r50")
    c(f, "ResNet-50 layer1 conv1 1x1 (from 256)", 1, 256, 56, 64, 1, tag="r50")
    c(f, "ResNet-50 layer2.0 conv2 3x3/2", 1, 128, 56, 128, 3, 2, 1, tag="r50")
    c(f, "ResNet-50 layer2.0 downsample 1x1/2", 1, 256, 56, 512, 1, 2, 0, tag="r50")
    c(f, "ResNet-50 layer2 conv3 1x1", 1, 128, 28, 512, 1, tag="r50")
    c(f, "ResNet-50 layer3 conv3 1x1", 1, 256, 14, 1024, 1, tag="r50")
    c(f, "ResNet-50 layer3 conv1 1x1", 1, 1024, 14, 256, 1, tag="r50")
    c(f, "ResNet-50 layer3.0 downsample 1x1/2", 1, 512, 28, 1024, 1, 2, 0, tag="r50")
    c(f, "ResNet-50 layer4.0 conv1 1x1", 1, 1024, 14, 512, 1, tag="r50")
    c(f, "ResNet-50 layer4.0 conv2 3x3/2", 1, 512, 14, 512, 3, 2, 1, tag="r50")
    c(f, "ResNet-50 layer4 conv3 1x1", 1, 512, 7, 2048, 1, tag="r50")
    c(f, "ResNet-50 layer4 conv1 1x1", 1, 2048, 7, 512, 1, tag="r50")
    c(f, "ResNet-50 layer4.0 downsample 1x1/2", 1, 1024, 14, 2048, 1, 2, 0, tag="r50")
    c(f, "ResNet-50 layer1 conv2 3x3, batch 8", 8, 64, 56, 64, 3, tag="r50")
    c(f, "ResNet-50 layer4 conv2 3x3, batch 32", 32, 512, 7, 512, 3, tag="r50")
    gm(f, "ResNet-50 fc", 1, 2048, 1000, tag="r50fc")
    gm(f, "ResNet-50 fc, batch 256", 256, 2048, 1000, tag="r50fc")

    # ResNeXt-50 32x4d and ResNeXt-101 32x8d: grouped 3x3, 32 groups.
    f = "resnext"
    c(f, "ResNeXt-50 layer1 conv2 3x3 g32", 1, 128, 56, 128, 3, g=32, tag="x50")
    c(f, "ResNeXt-50 layer2.0 conv2 3x3/2 g32", 1, 256, 56, 256, 3, 2, 1, g=32, tag="x50")
    c(f, "ResNeXt-50 layer2 conv2 3x3 g32", 1, 256, 28, 256, 3, g=32, tag="x50")
    c(f, "ResNeXt-50 layer3.0 conv2 3x3/2 g32", 1, 512, 28, 512, 3, 2, 1, g=32, tag="x50")
    c(f, "ResNeXt-50 layer3 conv2 3x3 g32", 1, 512, 14, 512, 3, g=32, tag="x50")
    c(f, "ResNeXt-50 layer4.0 conv2 3x3/2 g32", 1, 1024, 14, 1024, 3, 2, 1, g=32, tag="x50")
    c(f, "ResNeXt-50 layer4 conv2 3x3 g32", 1, 1024, 7, 1024, 3, g=32, tag="x50")
    c(f, "ResNeXt-50 layer3 conv2 3x3 g32, batch 8", 8, 512, 14, 512, 3, g=32, tag="x50")
    c(f, "ResNeXt-101 32x8d layer1 conv2 3x3 g32", 1, 256, 56, 256, 3, g=32, tag="x101")
    c(f, "ResNeXt-101 32x8d layer3 conv2 3x3 g32", 1, 1024, 14, 1024, 3, g=32, tag="x101")
    c(f, "ResNeXt-101 32x8d layer4 conv2 3x3 g32", 1, 2048, 7, 2048, 3, g=32, tag="x101")

    # MobileNetV2 (224): inverted residuals, depthwise 3x3.
    f = "mobilenetv2"
    c(f, "stem 3x3/2", 1, 3, 224, 32, 3, 2, 1, tag="stem")
    c(f, "block1 depthwise 3x3", 1, 32, 112, 32, 3, g=32, tag="dw")
    c(f, "block2 expand 1x1", 1, 16, 112, 96, 1, tag="pw")
    c(f, "block2 depthwise 3x3/2", 1, 96, 112, 96, 3, 2, 1, g=96, tag="dw")
    c(f, "block2 project 1x1", 1, 96, 56, 24, 1, tag="pw")
    c(f, "block3 depthwise 3x3", 1, 144, 56, 144, 3, g=144, tag="dw")
    c(f, "block4 depthwise 3x3/2", 1, 144, 56, 144, 3, 2, 1, g=144, tag="dw")
    c(f, "block7 depthwise 3x3/2", 1, 192, 28, 192, 3, 2, 1, g=192, tag="dw")
    c(f, "block8 depthwise 3x3", 1, 384, 14, 384, 3, g=384, tag="dw")
    c(f, "block14 depthwise 3x3/2", 1, 576, 14, 576, 3, 2, 1, g=576, tag="dw")
    c(f, "block15 expand 1x1", 1, 160, 7, 960, 1, tag="pw")
    c(f, "block15 depthwise 3x3", 1, 960, 7, 960, 3, g=960, tag="dw")
    c(f, "last conv 1x1", 1, 320, 7, 1280, 1, tag="pw")
    c(f, "block15 depthwise 3x3, batch 32", 32, 960, 7, 960, 3, g=960, tag="dw")
    gm(f, "classifier", 1, 1280, 1000, tag="fc")

    # MobileNetV3-Large/Small (224): depthwise 3x3/5x5, squeeze-excite 1x1s on 1x1 maps.
    f = "mobilenetv3"
    c(f, "large stem 3x3/2", 1, 3, 224, 16, 3, 2, 1, tag="l_stem")
    c(f, "large block4 depthwise 5x5/2", 1, 72, 56, 72, 5, 2, 2, g=72, tag="l_dw")
    c(f, "large block5 depthwise 5x5", 1, 120, 28, 120, 5, g=120, tag="l_dw")
    c(f, "large block5 SE reduce 1x1", 1, 120, 1, 32, 1, tag="l_se")
    c(f, "large block5 SE expand 1x1", 1, 32, 1, 120, 1, tag="l_se")
    c(f, "large block7 depthwise 3x3/2", 1, 240, 28, 240, 3, 2, 1, g=240, tag="l_dw")
    c(f, "large block11 project 1x1", 1, 480, 14, 112, 1, tag="l_pw")
    c(f, "large block13 depthwise 5x5/2", 1, 672, 14, 672, 5, 2, 2, g=672, tag="l_dw")
    c(f, "large block14 depthwise 5x5", 1, 960, 7, 960, 5, g=960, tag="l_dw")
    c(f, "large block14 SE reduce 1x1", 1, 960, 1, 240, 1, tag="l_se")
    c(f, "large block14 project 1x1", 1, 960, 7, 160, 1, tag="l_pw")
    gm(f, "large classifier hidden", 1, 960, 1280, tag="l_fc")
    c(f, "small block1 depthwise 3x3/2", 1, 16, 112, 16, 3, 2, 1, g=16, tag="s_dw")
    c(f, "small block4 depthwise 5x5/2", 1, 96, 28, 96, 5, 2, 2, g=96, tag="s_dw")
    c(f, "small block10 depthwise 5x5", 1, 576, 7, 576, 5, g=576, tag="s_dw")

    # EfficientNet-B0 (torchvision, 224) and B4 (TF "SAME" padding, 380).
    f = "efficientnet"
    c(f, "B0 stage1 SE reduce 1x1", 1, 32, 1, 8, 1, tag="b0_se")
    c(f, "B0 stage3 depthwise 5x5/2", 1, 144, 56, 144, 5, 2, 2, g=144, tag="b0_dw")
    c(f, "B0 stage3 depthwise 5x5", 1, 240, 28, 240, 5, g=240, tag="b0_dw")
    c(f, "B0 stage5 depthwise 5x5", 1, 672, 14, 672, 5, g=672, tag="b0_dw")
    c(f, "B0 stage6 depthwise 5x5", 1, 1152, 7, 1152, 5, g=1152, tag="b0_dw")
    c(f, "B0 stage6 project 1x1", 1, 1152, 7, 192, 1, tag="b0_pw")
    c(f, "B0 stage6 expand 1x1", 1, 192, 7, 1152, 1, tag="b0_pw")
    c(f, "B0 stage6 SE reduce 1x1", 1, 1152, 1, 48, 1, tag="b0_se")
    c(f, "B4 stem 3x3/2 SAME (pads 0,0,1,1)", 1, 3, 380, 48, 3, 2, (0, 0, 1, 1), tag="b4_stem")
    c(f, "B4 stage2 depthwise 3x3/2 SAME", 1, 144, 190, 144, 3, 2, (0, 0, 1, 1), g=144, tag="b4_dw")
    c(f, "B4 stage3 depthwise 5x5/2 SAME", 1, 192, 95, 192, 5, 2, (1, 1, 2, 2), g=192, tag="b4_dw")
    c(f, "B4 stage5 depthwise 5x5", 1, 960, 24, 960, 5, g=960, tag="b4_dw")
    c(f, "B4 stage6 project 1x1", 1, 1632, 12, 272, 1, tag="b4_pw")
    c(f, "B4 head 1x1", 1, 448, 12, 1792, 1, tag="b4_pw")

    # ShuffleNet V1 (groups 3, 4, 8; 224) and V2 1.0x.
    f = "shufflenet"
    for g, widths in ((3, (240, None, 960)), (4, (272, 544, 1088)), (8, (384, None, 1536))):
        for wdt, hw in zip(widths, (28, 14, 7)):
            if wdt is None:
                continue
            c(f, f"V1 g{g} {wdt}-wide stage, grouped 1x1 compress", 1, wdt, hw, wdt // 4, 1, g=g, tag=f"v1g{g}")
            c(f, f"V1 g{g} {wdt}-wide stage, grouped 1x1 expand", 1, wdt // 4, hw, wdt, 1, g=g, tag=f"v1g{g}")
    c(f, "V1 g4 grouped 1x1 136->544 on 7x7 (issue 26)", 1, 136, 7, 544, 1, g=4, tag="v1g4")
    c(f, "V1 g3 stage2 depthwise 3x3/2", 1, 60, 56, 60, 3, 2, 1, g=60, tag="v1g3")
    c(f, "V2 stem 3x3/2", 1, 3, 224, 24, 3, 2, 1, tag="v2")
    c(f, "V2 stage3.0 depthwise 3x3/2", 1, 116, 28, 116, 3, 2, 1, g=116, tag="v2")
    c(f, "V2 stage4 1x1", 1, 232, 7, 232, 1, tag="v2")
    c(f, "V2 conv5 1x1", 1, 464, 7, 1024, 1, tag="v2")

    # RegNet (224): grouped 3x3 with a fixed group width.
    f = "regnet"
    for tag, gw, widths in (("x400", 16, (32, 64, 160, 400)), ("y1.6", 24, (48, 120, 336, 888)),
                            ("x3.2", 48, (None, None, 432, 1008))):
        for wdt, hw in zip(widths, (56, 28, 14, 7)):
            if wdt is None:
                continue
            c(f, f"{tag} width {wdt} 3x3, group width {gw}", 1, wdt, hw, wdt, 3, g=wdt // gw, tag=tag)
    c(f, "x400 stage1.0 3x3/2 g2", 1, 32, 112, 32, 3, 2, 1, g=2, tag="x400")
    c(f, "x400 stage4.0 3x3/2 g25", 1, 400, 14, 400, 3, 2, 1, g=25, tag="x400")
    c(f, "y1.6 stage4.0 3x3/2 g37", 1, 888, 14, 888, 3, 2, 1, g=37, tag="y1.6")
    c(f, "y1.6 stage4 1x1", 1, 888, 7, 888, 1, tag="y1.6")

    # ConvNeXt-T (224): 4x4/4 patchify stem, depthwise 7x7, Linear layers as MatMul on NHWC.
    f = "convnext"
    c(f, "stem 4x4/4", 1, 3, 224, 96, 4, 4, 0, tag="t")
    for wdt, hw in ((96, 56), (192, 28), (384, 14), (768, 7)):
        c(f, f"stage depthwise 7x7 ({wdt})", 1, wdt, hw, wdt, 7, g=wdt, tag="t")
    c(f, "stage1 depthwise 7x7, batch 8", 8, 96, 56, 96, 7, g=96, tag="t")
    c(f, "downsample 2x2/2", 1, 96, 56, 192, 2, 2, 0, tag="t")
    c(f, "downsample 2x2/2", 1, 384, 14, 768, 2, 2, 0, tag="t")
    mm(f, "stage1 pwconv1 (Linear on NHWC)", (1, 56, 56, 96), 384, tag="t")
    mm(f, "stage1 pwconv2 (Linear on NHWC)", (1, 56, 56, 384), 96, tag="t")
    mm(f, "stage3 pwconv1 (Linear on NHWC)", (1, 14, 14, 384), 1536, tag="t")
    mm(f, "stage4 pwconv1 (Linear on NHWC)", (1, 7, 7, 768), 3072, tag="t")
    mm(f, "stage4 pwconv2 (Linear on NHWC)", (1, 7, 7, 3072), 768, tag="t")

    # DenseNet-121 (224): BN-ReLU-Conv, so no conv bias.
    f = "densenet"
    c(f, "stem 7x7/2", 1, 3, 224, 64, 7, 2, 3, bias=False, tag="121")
    for cin, hw in ((64, 56), (352, 28), (736, 14), (992, 7)):
        c(f, f"dense layer bottleneck 1x1 (in {cin})", 1, cin, hw, 128, 1, bias=False, tag="121")
    for hw in (56, 28, 14, 7):
        c(f, "dense layer 3x3 growth 32", 1, 128, hw, 32, 3, bias=False, tag="121")
    for cin, hw in ((256, 56), (512, 28), (1024, 14)):
        c(f, "transition 1x1", 1, cin, hw, cin // 2, 1, bias=False, tag="121")

    # Inception v3 (299): valid-padded stem, factorized 1x7/7x1 and 1x3/3x1.
    f = "inception"
    c(f, "Conv2d_1a 3x3/2 valid", 1, 3, 299, 32, 3, 2, 0, tag="v3")
    c(f, "Conv2d_2a 3x3 valid", 1, 32, 149, 32, 3, 1, 0, tag="v3")
    c(f, "Conv2d_2b 3x3", 1, 32, 147, 64, 3, tag="v3")
    c(f, "Conv2d_3b 1x1", 1, 64, 73, 80, 1, tag="v3")
    c(f, "Conv2d_4a 3x3 valid", 1, 80, 73, 192, 3, 1, 0, tag="v3")
    c(f, "Mixed_5b 1x1", 1, 192, 35, 64, 1, tag="v3")
    c(f, "Mixed_5b 5x5", 1, 48, 35, 64, 5, tag="v3")
    c(f, "Mixed_5b 3x3", 1, 64, 35, 96, 3, tag="v3")
    c(f, "Mixed_6a 3x3/2 valid", 1, 288, 35, 384, 3, 2, 0, tag="v3")
    c(f, "Mixed_6b 1x7", 1, 128, 17, 128, (1, 7), tag="v3")
    c(f, "Mixed_6b 7x1", 1, 128, 17, 192, (7, 1), tag="v3")
    c(f, "Mixed_6 1x1", 1, 768, 17, 192, 1, tag="v3")
    c(f, "Mixed_7a 3x3/2 valid", 1, 192, 17, 320, 3, 2, 0, tag="v3")
    c(f, "Mixed_7b 1x3", 1, 384, 8, 384, (1, 3), tag="v3")
    c(f, "Mixed_7b 3x1", 1, 384, 8, 384, (3, 1), tag="v3")
    c(f, "Mixed_7c 1x1", 1, 2048, 8, 320, 1, tag="v3")

    # VGG-16 (224).
    f = "vgg"
    for cin, cout, hw in ((3, 64, 224), (64, 64, 224), (128, 128, 112), (256, 256, 56), (512, 512, 28), (512, 512, 14)):
        c(f, f"conv 3x3 at {hw}", 1, cin, hw, cout, 3, tag="16")
    gm(f, "fc7", 1, 4096, 4096, tag="16fc7")
    gm(f, "fc8", 1, 4096, 1000, tag="16fc8")

    # UNet (256x256, 64..1024 channels) and the pix2pix U-Net generator.
    f = "unet"
    c(f, "enc1 3x3", 1, 3, 256, 64, 3, tag="u")
    c(f, "enc1 3x3", 1, 64, 256, 64, 3, tag="u")
    c(f, "enc2 3x3", 1, 128, 128, 128, 3, tag="u")
    c(f, "enc4 3x3", 1, 512, 32, 512, 3, tag="u")
    c(f, "bottleneck 3x3", 1, 1024, 16, 1024, 3, tag="u")
    for cin, hw in ((1024, 16), (512, 32), (256, 64), (128, 128)):
        ct(f, "up ConvTranspose 2x2/2", 1, cin, hw, cin // 2, 2, 2, tag="u")
    c(f, "dec4 3x3 after concat", 1, 1024, 32, 512, 3, tag="u")
    c(f, "pix2pix down 4x4/2", 1, 3, 256, 64, 4, 2, 1, tag="p2p")
    c(f, "pix2pix down 4x4/2", 1, 128, 64, 256, 4, 2, 1, bias=False, tag="p2p")
    c(f, "pix2pix down 4x4/2", 1, 512, 8, 512, 4, 2, 1, bias=False, tag="p2p")
    ct(f, "pix2pix up ConvTranspose 4x4/2", 1, 1024, 4, 512, 4, 2, 1, bias=False, tag="p2p")
    ct(f, "pix2pix up ConvTranspose 4x4/2", 1, 512, 32, 128, 4, 2, 1, bias=False, tag="p2p")
    ct(f, "pix2pix outermost ConvTranspose 4x4/2", 1, 128, 128, 3, 4, 2, 1, tag="p2p")

    # YOLOv5s / YOLOv8n (640x640).
    f = "yolo"
    c(f, "v5s stem 6x6/2", 1, 3, 640, 32, 6, 2, 2, tag="v5s")
    c(f, "v5s 3x3/2", 1, 32, 320, 64, 3, 2, 1, tag="v5s")
    c(f, "v5s C3 bottleneck 3x3", 1, 32, 160, 32, 3, tag="v5s")
    c(f, "v5s 3x3/2", 1, 64, 160, 128, 3, 2, 1, tag="v5s")
    c(f, "v5s 3x3/2", 1, 128, 80, 256, 3, 2, 1, tag="v5s")
    c(f, "v5s SPPF cv2 1x1", 1, 1024, 20, 512, 1, tag="v5s")
    c(f, "v5s Detect P3 1x1", 1, 128, 80, 255, 1, tag="v5s")
    c(f, "v5s Detect P5 1x1", 1, 512, 20, 255, 1, tag="v5s")
    c(f, "v5s 3x3/2, batch 8", 8, 128, 80, 256, 3, 2, 1, tag="v5s")
    c(f, "v8n stem 3x3/2", 1, 3, 640, 16, 3, 2, 1, tag="v8n")
    c(f, "v8n head box 3x3", 1, 64, 80, 64, 3, tag="v8n")
    c(f, "v8n head cls 1x1", 1, 80, 80, 80, 1, tag="v8n")
    ct(f, "v8n-seg Proto ConvTranspose 2x2/2", 1, 64, 80, 64, 2, 2, tag="v8nseg")
    ct(f, "v8s-seg Proto ConvTranspose 2x2/2", 1, 128, 80, 128, 2, 2, tag="v8sseg")

    # CenterNet (ResNet-50 backbone at 512): ConvTranspose 4x4/2 upsampling.
    f = "centernet"
    ct(f, "deconv1 4x4/2", 1, 2048, 16, 256, 4, 2, 1, bias=False, tag="r50")
    ct(f, "deconv2 4x4/2", 1, 256, 32, 256, 4, 2, 1, bias=False, tag="r50")
    ct(f, "deconv3 4x4/2", 1, 256, 64, 256, 4, 2, 1, bias=False, tag="r50")

    # DeepLabV3-ResNet50: dilated 3x3 (output stride 8 at 224) and ASPP (OS 16).
    f = "deeplab"
    c(f, "layer3 3x3 dilation 2", 1, 256, 28, 256, 3, 1, 2, 2, tag="v3")
    c(f, "layer4 3x3 dilation 4", 1, 512, 28, 512, 3, 1, 4, 4, tag="v3")
    c(f, "ASPP 3x3 dilation 6", 1, 2048, 14, 256, 3, 1, 6, 6, tag="v3")
    c(f, "ASPP 1x1", 1, 2048, 14, 256, 1, tag="v3")

    # BERT-base (seq 128 and 384, 12 heads of 64), BERT-large FFN.
    f = "bert"
    mm(f, "attention Q/K/V projection", (1, 128, 768), 768, tag="base")
    mm(f, "fused QKV projection", (1, 128, 768), 2304, tag="base")
    mm(f, "FFN up", (1, 128, 768), 3072, tag="base")
    mm(f, "FFN down", (1, 128, 3072), 768, tag="base")
    gm(f, "FFN up as Gemm (2-D export)", 128, 768, 3072, tag="base")
    bmm(f, "attention QK^T, 12 heads", (1, 12, 128, 64), (1, 12, 64, 128), tag="base")
    bmm(f, "attention AV, 12 heads", (1, 12, 128, 128), (1, 12, 128, 64), tag="base")
    bmm(f, "attention QK^T, seq 384", (1, 12, 384, 64), (1, 12, 64, 384), tag="base")
    bmm(f, "attention AV, seq 384", (1, 12, 384, 384), (1, 12, 384, 64), tag="base")
    mm(f, "FFN up, batch 8", (8, 128, 768), 3072, tag="base")
    bmm(f, "attention QK^T, batch 8", (8, 12, 128, 64), (8, 12, 64, 128), tag="base")
    gm(f, "pooler (M=1)", 1, 768, 768, tag="base")
    mm(f, "FFN up, one token (GEMV)", (1, 768), 3072, tag="base")
    gm(f, "FFN up, batch 256 tokens", 256, 768, 3072, tag="base")
    mm(f, "BERT-large FFN up", (1, 128, 1024), 4096, tag="large")

    # ViT-B/16 and ViT-S/16 (224: 196 patches + class token).
    f = "vit"
    c(f, "B/16 patch embedding 16x16/16", 1, 3, 224, 768, 16, 16, 0, tag="b16")
    mm(f, "B/16 fused QKV", (1, 197, 768), 2304, tag="b16")
    mm(f, "B/16 attention out projection", (1, 197, 768), 768, tag="b16")
    mm(f, "B/16 MLP up", (1, 197, 768), 3072, tag="b16")
    mm(f, "B/16 MLP down", (1, 197, 3072), 768, tag="b16")
    bmm(f, "B/16 attention QK^T, 12 heads", (1, 12, 197, 64), (1, 12, 64, 197), tag="b16")
    bmm(f, "B/16 attention AV, 12 heads", (1, 12, 197, 197), (1, 12, 197, 64), tag="b16")
    gm(f, "B/16 head", 1, 768, 1000, tag="b16")
    mm(f, "B/16 MLP up, batch 8", (8, 197, 768), 3072, tag="b16")
    mm(f, "S/16 fused QKV", (1, 197, 384), 1152, tag="s16")
    bmm(f, "S/16 attention QK^T, 6 heads", (1, 6, 197, 64), (1, 6, 64, 197), tag="s16")

    # Whisper encoders (30 s: 3000 mel frames -> 1500 positions).
    f = "whisper"
    c1(f, "base conv1 (80 mels -> 512)", 1, 80, 3000, 512, 3, forms=("ncl",), tag="base")
    c1(f, "base conv2 stride 2", 1, 512, 3000, 512, 3, 2, 1, forms=("ncl",), tag="base")
    mm(f, "base attention projection", (1, 1500, 512), 512, tag="base")
    mm(f, "base MLP up", (1, 1500, 512), 2048, tag="base")
    mm(f, "base MLP down", (1, 1500, 2048), 512, tag="base")
    bmm(f, "base attention QK^T, 8 heads", (1, 8, 1500, 64), (1, 8, 64, 1500), tag="base")
    bmm(f, "base attention AV, 8 heads", (1, 8, 1500, 1500), (1, 8, 1500, 64), tag="base")
    mm(f, "base decoder MLP up, one token (GEMV)", (1, 1, 512), 2048, tag="base")
    bmm(f, "base decoder cross-attention QK^T, one token", (1, 8, 1, 64), (1, 8, 64, 1500), tag="base")
    c1(f, "tiny conv1 (80 mels -> 384)", 1, 80, 3000, 384, 3, forms=("ncl",), tag="tiny")
    mm(f, "tiny attention projection", (1, 1500, 384), 384, tag="tiny")
    bmm(f, "tiny attention QK^T, 6 heads", (1, 6, 1500, 64), (1, 6, 64, 1500), tag="tiny")

    # 1-D audio convolutions.
    f = "audio1d"
    c1(f, "1-D conv over a long sequence (issue 26)", 1, 256, 512, 512, 5, tag="seq")
    c1(f, "wav2vec2 feature extractor conv0 (1 s at 16 kHz)", 1, 1, 16000, 512, 10, 5, 0, bias=False, tag="w2v")
    c1(f, "wav2vec2 feature extractor conv1", 1, 512, 3199, 512, 3, 2, 0, bias=False, tag="w2v")
    c1(f, "ECAPA-TDNN SE-Res2 3x1 dilation 2", 1, 512, 200, 512, 3, d=2, tag="ecapa")
    c1(f, "long-sequence 9-tap conv (1 s at 16 kHz)", 1, 64, 16000, 64, 9, tag="long")
    c1(f, "ECAPA-TDNN input conv k5", 1, 80, 200, 512, 5, forms=("ncl",), tag="ecapa")
    c1(f, "ECAPA-TDNN 3x1 dilation 4", 1, 512, 200, 512, 3, d=4, forms=("ncl",), tag="ecapa")
    c1(f, "wav2vec2 positional conv k128 g16", 1, 768, 49, 768, 128, p=64, g=16, forms=("ncl",), tag="w2v")
    c1(f, "Conformer depthwise conv k31", 1, 256, 512, 256, 31, g=256, forms=("ncl",), tag="conformer")
    c1(f, "Conformer pointwise conv", 1, 256, 512, 512, 1, forms=("ncl",), tag="conformer")
    c1(f, "HiFi-GAN resblock k11", 1, 128, 6400, 128, 11, forms=("ncl",), tag="hifigan")
    c1(f, "HiFi-GAN resblock k7 dilation 3", 1, 128, 6400, 128, 7, d=3, forms=("ncl",), tag="hifigan")
    ct(f, "HiFi-GAN upsample ConvTranspose1d k16/8", 1, 512, 100, 256, 16, 8, 4, tag="hifigan", rank=1)
    c1(f, "WaveNet causal dilated conv k2 d512", 1, 64, 4000, 128, 2, p=(512, 0), d=512, forms=("ncl",),
       tag="wavenet")
    c1(f, "Demucs encoder conv k8/4", 1, 2, 16000, 64, 8, 4, 0, forms=("ncl",), tag="demucs")
    c1(f, "TCN k7 at 1024 steps (N,C,1,L export)", 1, 128, 1024, 128, 7, forms=("nc1l",), tag="tcn")

    # 1-D byte-sequence CNNs.
    f = "bytes1d"
    c1(f, "char-CNN conv1 k7 (70-char one-hot)", 1, 70, 1014, 256, 7, p=0, tag="charcnn")
    c1(f, "char-CNN conv2 k7", 1, 256, 336, 256, 7, p=0, forms=("ncl",), tag="charcnn")
    c1(f, "char-CNN conv3 k3", 1, 256, 110, 256, 3, p=0, tag="charcnn")
    c1(f, "MalConv gated conv k500/500 (100 KiB)", 1, 8, 102400, 128, 500, 500, 0, forms=("ncl",), tag="malconv")
    c1(f, "CANINE downsampling conv k4/4", 1, 768, 2048, 768, 4, 4, 0, forms=("ncl",), tag="canine")
    c1(f, "ByteNet dilated conv k3 d4 (N,C,L,1 export)", 1, 512, 1024, 512, 3, d=4, forms=("ncl1",), tag="bytenet")
    c1(f, "byte CNN k11", 1, 128, 4096, 256, 11, tag="bytecnn")

    # LSTM/GRU: gate matmuls (W x or R h, 1 x H x G*H) and whole ops.
    f = "lstm"
    for h in (128, 256, 512, 1024):
        mm(f, f"recurrent gates R h, hidden {h}", (1, h), 4 * h, tag=f"h{h}")
    gm(f, "LSTMCell gates (input 512, hidden 512)", 1, 512, 2048, tag="cell")
    gm(f, "input gates over 100 frames (80 features, hidden 128)", 100, 80, 512, tag="seq")
    gm(f, "gates, batch 32, hidden 512", 32, 512, 2048, tag="b32")
    sw.rnn(f, "LSTM op, one step (Silero-like)", "LSTM", 1, 1, 64, 128, tag="op")
    sw.rnn(f, "LSTM op, 100 steps", "LSTM", 100, 1, 256, 256, tag="op")
    f = "gru"
    for h in (256, 512, 1024):
        mm(f, f"recurrent gates R h, hidden {h}", (1, h), 3 * h, tag=f"h{h}")
    gm(f, "input gates over 50 frames (hidden 256)", 50, 256, 768, tag="seq")
    sw.rnn(f, "GRU op, 50 steps", "GRU", 50, 1, 128, 256, tag="op")
    sw.rnn(f, "GRU op, one step", "GRU", 1, 1, 512, 512, tag="op")

    # DLRM MLPs at batch 256 and the square GEMM of the roofline.
    f = "mlp"
    gm(f, "DLRM top MLP 479 -> 1024 (odd K)", 256, 479, 1024, tag="dlrm")
    gm(f, "DLRM top MLP 1024 -> 1024", 256, 1024, 1024, tag="dlrm")
    gm(f, "DLRM top MLP 512 -> 256", 256, 512, 256, tag="dlrm")
    gm(f, "DLRM bottom MLP 13 -> 512", 256, 13, 512, tag="dlrm")
    mm(f, "square GEMM 1024^3", (1024, 1024), 1024, tag="sq")


def check_ort(out, manifest):
    """Loads and runs every model once in onnxruntime (1 thread); raises
    on the first that fails or gives an output of another shape."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    for m in manifest:
        sess = ort.InferenceSession(os.path.join(out, m["file"]), so, providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(0)
        feeds = {i["name"]: rng.standard_normal(i["shape"], dtype=np.float32) for i in m["inputs"]}
        (y,) = sess.run(None, feeds)
        if list(y.shape) != m["output_shape"] or not np.isfinite(y).all():
            raise SystemExit(f"{m['name']}: onnxruntime gave {y.shape} (finite: {np.isfinite(y).all()}), "
                             f"the manifest says {m['output_shape']}")
    print(f"checked: onnx.checker and onnxruntime accept all {len(manifest)} models")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "target", "sweep", "models"))
    ap.add_argument("--filter", help="only models whose name matches this regex (the manifest lists only them)")
    ap.add_argument("--check", action="store_true",
                    help="check every model: onnx.checker (full), then one onnxruntime run on random inputs "
                         "whose output must have the manifest's shape and be finite")
    args = ap.parse_args()

    sw = Sweep()
    define(sw)
    entries = [(m, b) for m, b in sw.entries if not args.filter or re.search(args.filter, m["name"])]
    os.makedirs(args.out, exist_ok=True)
    manifest = []
    total = 0
    for meta, build in entries:
        model = build()
        if args.check:
            onnx.checker.check_model(model, full_check=True)
        path = os.path.join(args.out, meta["name"] + ".onnx")
        data = model.SerializeToString()
        # Rewrite only what changed, so regenerating keeps the cached inputs' timestamps meaningful.
        if not (os.path.exists(path) and os.path.getsize(path) == len(data) and open(path, "rb").read() == data):
            with open(path, "wb") as fh:
                fh.write(data)
        total += len(data)
        manifest.append(dict(meta, file=meta["name"] + ".onnx", bytes=len(data)))
    if args.check:
        check_ort(args.out, manifest)
    with open(os.path.join(args.out, "manifest.json"), "w") as fh:
        json.dump({"opset": OPSET, "generator": "bench/sweep_models.py", "models": manifest}, fh, indent=1)
    families = {}
    for m in manifest:
        families[m["family"]] = families.get(m["family"], 0) + 1
    print(f"wrote {len(manifest)} models ({total / 2**20:.1f} MiB) and manifest.json to {args.out}")
    print(", ".join(f"{k} {v}" for k, v in families.items()))


if __name__ == "__main__":
    main()
