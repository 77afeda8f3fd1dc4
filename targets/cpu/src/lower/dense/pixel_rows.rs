//! A convolution as the transposed GEMM: output pixels as rows, output
//! channels along the vectors.
//!
//! The other GEMM convolutions put channels in rows and pixels along the
//! vectors, which NCHW asks for. On a small map that wastes lanes: the 49
//! pixels of a 7×7 map fill 77% of four vectors, the last stage of every
//! ResNet (a 3×3 conv of 512 channels there ran at 80 GFLOP/s where the
//! same product as a MatMul ran at 100). Its 512 channels fill every lane
//! of theirs. So the GEMM here multiplies A = the image read as `[P, K]`
//! (`A[p, k]` at `k · P + p`: a 1×1 stride-1 conv's input as it is, else
//! its im2col matrix, which each task builds in scratch of its own just
//! before the GEMM of each image: as a step of its own, split over two
//! threads, the copy for a 7×7 map of 512 channels took 0.13–0.15 ms
//! where one thread took 0.05, `kiln bench --profile`) by B = the weights
//! transposed and packed at compile time, into scratch as `[N, P, C]`; the
//! next step transposes that into the output, and the fused program, if
//! any, runs over the output after it (a leading Relu or Clip stays in the
//! store loop, with the bias).
//!
//! The tile cost model ([`Blocking::modeled_cycles`]) weighs both
//! layouts; this one is taken when its GEMM plus the transpose is
//! modeled to be cheaper.

use super::*;

/// Modeled cycles (the tile model's units) charged per output element
/// for the transpose, and for the pass of a fused program after it that
/// the channel-rows GEMM would have run in its store loop. Fitted on the
/// shape sweep's convolutions at one thread, both layouts timed (see
/// `docs/performance.md`): with the lanes equally filled, pixels as rows
/// ran 10–20% slower at K = 64–128 and 5–10% faster from K = 1,024 (its
/// B, the packed weights, streams better than a strided im2col B), which
/// this charge with the model's costs reproduces.
const TRANSPOSE_CYCLES: f64 = 0.5;

/// Candidate `avx512/transposed-gemm` for convolution `cx` (see the
/// module docs). Declines before it packs or reserves anything.
pub(super) fn transposed_conv(
    cx: &NodeCx,
    c: &Conv2d,
    weights: &mut Weights,
    scratch: &mut Scratch,
    fused: Option<(&NodeCx, &FusedKernel)>,
    machine: Machine,
) -> Attempt<Served> {
    let Machine { vector, tasks } = machine;
    let ConvDims {
        x: [batch, cin, h, w],
        w: [oc, cin_g, kh, kw],
        y: [oh, ow],
    } = ConvDims::of(cx);
    // The weights are B here: a 16-bit B is widened as it is loaded.
    let elem = match conv_gemm_elem(cx, c)? {
        Elem::WidenA(half) => Elem::WidenB(half),
        elem => elem,
    };
    f32_on(vector, elem)?;
    program_after_head(cx, fused, "the transpose moves")?;
    let wv = float_constant(cx.graph, cx.input_ids[1])
        .or_decline(|| "the weights are not a constant".into())?;
    let (p, oc_g, k) = (oh * ow, oc / c.group, cin_g * kh * kw);
    require(p > 1, || {
        "one output pixel per image: no pixels to lay along rows".into()
    })?;
    let channel_rows = Blocking::modeled_cycles(vector, oc_g, p, packed_a_rows(k)) * k as f64;
    let pixel_rows = Blocking::modeled_cycles(vector, p, oc_g, MAX_MR) * k as f64
        + TRANSPOSE_CYCLES * (p * oc_g) as f64;
    require(pixel_rows < channel_rows, || {
        format!(
            "pixels as rows (channels along the vectors, then a transpose) are modeled at \
             {pixel_rows:.0} cycles per group, channels as rows ({p} pixels along the vectors) \
             at {channel_rows:.0}"
        )
    })?;
    // A 1×1 stride-1 unpadded input is `[Cin, P]` already; others get an
    // im2col matrix per (image, group), built before its GEMM.
    let direct = (kh, kw) == (1, 1) && c.strides == [1, 1] && c.pads == [0; 4];
    let routine = (!direct).then(|| Im2col {
        cin: cin_g,
        ..whole_image_im2col(cx, c, None, vector)
    });
    let calls_n = batch * c.group;
    let col_bytes = routine.map_or(0, |r| r.col_bytes());
    require(col_bytes <= MAX_SCRATCH / 2, || too_much_scratch(col_bytes))?;

    let how = format!(
        "transposed {:?} g{} {elem:?}",
        cx.inputs[1].1.shape, c.group
    );
    let packed = Some((1, PackedSide::Columns, how));
    let blocking = packed_blocking(cx, weights, packed, (vector, p, oc_g, MAX_MR));
    let part = packed_b_len(elem, k, oc_g, blocking.nr());
    let b_base = packed_loc(weights, part * c.group, || {
        let pack = |g: usize| {
            let wg = &wv[g * oc_g * k..(g + 1) * oc_g * k];
            // Bᵀ = W: B[k, j] at `j * K + k`.
            pack_b_for(elem, wg, k, oc_g, 1, k, blocking.nr())
        };
        (0..c.group).flat_map(pack).collect()
    });
    let (act, tail) = match fused {
        Some((_, kernel)) => leading_activation(kernel.body()),
        None => (Activation::None, None),
    };
    let xloc = cx.inputs[0].0;
    let bias = cx.inputs.get(2).map(|&(loc, _)| loc);
    let (plane, image) = ((h * w * 4) as i64, (cin * h * w * 4) as i64);
    // Each task builds the im2col matrix of a call just before its GEMM,
    // in scratch of its own, addressed from 0 here (`assemble_parts`
    // moves it); the output rows are addressed as if they were the
    // output, which `HeadOutput::Scratch` moves into scratch.
    let own_scratch = Loc {
        base: Base::Arena,
        offset: 0,
    };
    let mut calls = Vec::with_capacity(calls_n);
    for img in 0..batch as i64 {
        for g in 0..c.group {
            let x = xloc.moved(img * image + (g * cin_g) as i64 * plane);
            let (a, src) = match routine {
                Some(_) => (own_scratch, Some((x, 0))),
                None => (x, None),
            };
            calls.push(Call {
                a,
                b: b_base.moved((g * part) as i64),
                out: (cx.out).moved(img * (p * oc * 4) as i64 + (g * oc_g * 4) as i64),
                c: bias.map(|b| b.moved((g * oc_g * 4) as i64)),
                src,
            });
        }
    }
    let spec = GemmSpec {
        a: ALayout::Strided {
            row: 4,
            col: (p * 4) as i64,
        },
        b: BLayout::Packed,
        out_row: (oc * 4) as i64,
        c: bias.map(|_| CLayout {
            row: 0,
            per_column: true,
            beta: 1.0,
        }),
        act,
        calls,
        im2col: routine.into_iter().collect(),
        im2col_into_a: true,
        ..conv_gemm(p, oc_g, k, elem, blocking, false)
    };
    let Parts {
        gemm, src: rows, ..
    } = assemble_parts(cx, spec, scratch, tasks, HeadOutput::Scratch)?;
    Ok(Served {
        before: None,
        codes: gemm,
        // The rest of the program runs in place over the output (a fused
        // head's context writes the fused node's output).
        tail: tail.map(|program| Tail {
            program,
            src: cx.out,
        }),
        after: Some(After::Transpose(rows)),
        kernel: on(vector, TRANSPOSED),
    })
}

/// A program's leading Relu or Clip of the product (which the store loop
/// applies after the bias) and the program left after it.
pub(super) fn leading_activation(
    program: &ElementwiseProgram,
) -> (Activation, Option<ElementwiseProgram>) {
    let first = match program.instrs().first() {
        Some(&Instr::Unary(u, Reg(0))) => activation(u),
        _ => None,
    };
    match first {
        Some(act) if program.instrs().len() == 1 => (act, None),
        Some(act) => match program.rest_after(1) {
            Some(rest) => (act, Some(rest)),
            None => (Activation::None, Some(program.clone())),
        },
        None => (Activation::None, Some(program.clone())),
    }
}
