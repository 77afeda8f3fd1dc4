//! A 3×3 stride-1 convolution as Winograd F(4×4, 3×3): an input transform
//! step, 36 GEMMs per image (one per position of the transformed 6×6
//! tile, channels as rows and tiles along the vectors, the transformed
//! weights packed at compile time), an output transform step that adds
//! the bias and a leading Relu or Clip, then the rest of a fused program.
//! The GEMMs do 4× fewer multiplies than the direct form; the transforms
//! are passes over `V` and `M` (2.25× the input and the output), so the
//! tile cost model weighs both (see [`winograd_conv`]).
//! The kernels are in [`crate::microkernel::winograd`].

use super::*;
use crate::microkernel::winograd::{
    transform_weights, Tiling, WinogradInput, WinogradOutput, POSITIONS,
};

/// Modeled cycles (the tile model's units: 64 FLOPs at the measured
/// peak) charged per lane of `V` and of `M` that the transforms write and
/// read (whole vectors of 16 tiles per tile row). Measured with `kiln
/// bench --profile` on the shape sweep's 3×3 convolutions at one thread:
/// 0.15–0.5 while `V` and `M` stay in the caches, 0.8 for VGG's 112×112
/// of 128 channels (14 MB each); see `docs/performance.md`.
const TRANSFORM_CYCLES: f64 = 0.5;

/// The Winograd GEMMs' modeled cycles are multiplied by this: their K is
/// the channels alone (64–512 where the direct GEMM's is 9×), and they
/// ran at 72–101 GFLOP/s on the same shapes where the direct ones ran at
/// 95–105.
const GEMM_CHARGE: f64 = 1.15;

/// Candidate `avx512/winograd` for convolution `cx` (see the module
/// docs). Declines before it packs or reserves anything.
pub(super) fn winograd_conv(
    cx: &NodeCx,
    c: &Conv2d,
    weights: &mut Weights,
    scratch: &mut Scratch,
    fused: Option<(&NodeCx, &FusedKernel)>,
    machine: Machine,
) -> Attempt<Served> {
    let Machine { vector, tasks } = machine;
    zmm_only(vector)?;
    let ConvDims {
        x: [batch, cin, h, w],
        w: [oc, _, kh, kw],
        y: [oh, ow],
    } = ConvDims::of(cx);
    require((kh, kw) == (3, 3), || {
        format!("F(4x4, 3x3) takes 3x3 windows, not {kh}x{kw}")
    })?;
    require(c.strides == [1, 1] && c.dilations == [1, 1], || {
        "the convolution is strided or dilated".into()
    })?;
    require(c.group == 1, || format!("{} groups", c.group))?;
    // The weights are transformed in f64 and stored as f32 whatever
    // their type; the image must be f32.
    conv_gemm_elem(cx, c)?;
    if let Some((fcx, k)) = fused {
        require(k.store() == FusedStore::F32, || {
            "the fused result is stored as u8; the output transform writes f32".into()
        })?;
        require(fcx.node.ty.shape == cx.node.ty.shape, || {
            "the fused program broadcasts the convolution's result".into()
        })?;
    }
    let wv = float_constant(cx.graph, cx.input_ids[1])
        .or_decline(|| "the weights are not a constant".into())?;
    let tiling = Tiling {
        h,
        w,
        oh,
        ow,
        pad_tl: [c.pads[0], c.pads[1]],
    };
    let t = tiling.count();
    let k = 9 * cin;
    let direct = Blocking::modeled_cycles(vector, oc, oh * ow, packed_a_rows(k)) * k as f64;
    let gemms = GEMM_CHARGE
        * POSITIONS as f64
        * Blocking::modeled_cycles(vector, oc, t, packed_a_rows(cin))
        * cin as f64;
    // The transforms run over whole vectors of 16 tiles per tile row.
    let (th, tw) = tiling.tiles();
    let lanes = th * tw.div_ceil(16) * 16;
    let transforms = TRANSFORM_CYCLES * (POSITIONS * lanes * (cin + oc)) as f64;
    let winograd = gemms + transforms;
    require(winograd < direct, || {
        format!(
            "F(4x4, 3x3) is modeled at {winograd:.0} cycles per image ({t} tiles: GEMMs \
             {gemms:.0}, transforms {transforms:.0}), the direct GEMM at {direct:.0}"
        )
    })?;
    let (v_bytes, m_bytes) = (
        (batch * POSITIONS * cin * t * 4) as u64,
        (batch * POSITIONS * oc * t * 4) as u64,
    );
    require(v_bytes + m_bytes <= MAX_SCRATCH, || {
        too_much_scratch(v_bytes + m_bytes)
    })?;

    let how = format!("winograd {:?}", cx.inputs[1].1.shape);
    let packed = Some((1, PackedSide::Rows, how));
    let blocking = packed_blocking(cx, weights, packed, (vector, oc, t, packed_a_rows(cin)));
    let part = packed_w_len(Elem::F32, oc, cin, blocking.mr);
    let u_base = packed_loc(weights, part * POSITIONS, || {
        let u = transform_weights(&wv, oc, cin);
        let pack = |xi: usize| {
            pack_a(
                &u[xi * oc * cin..][..oc * cin],
                oc,
                cin,
                cin,
                1,
                blocking.mr,
            )
        };
        (0..POSITIONS).flat_map(pack).collect()
    });
    // V and M pass from step to step: held for the whole job.
    let held = scratch.hold(&[v_bytes, m_bytes]);
    let (v, m) = (held[0], held[1]);
    let (v_image, m_image) = (
        (POSITIONS * cin * t * 4) as i64,
        (POSITIONS * oc * t * 4) as i64,
    );
    let (v_xi, m_xi) = ((cin * t * 4) as i64, (oc * t * 4) as i64);
    let mut calls = Vec::with_capacity(batch * POSITIONS);
    for img in 0..batch as i64 {
        for xi in 0..POSITIONS as i64 {
            calls.push(Call {
                a: u_base.moved(xi * part as i64),
                b: v.moved(img * v_image + xi * v_xi),
                out: m.moved(img * m_image + xi * m_xi),
                c: None,
                src: None,
            });
        }
    }
    let spec = GemmSpec {
        b: BLayout::Strided {
            row: (t * 4) as i64,
        },
        out_row: (t * 4) as i64,
        calls,
        ..conv_gemm(oc, t, cin, Elem::F32, blocking, false)
    };
    let Parts { gemm, .. } = assemble_parts(cx, spec, scratch, tasks, HeadOutput::InPlace)?;

    let xloc = cx.inputs[0].0;
    let (plane, out_plane) = ((h * w * 4) as i64, (oh * ow * 4) as i64);
    let input = (split_channels(cin, tasks).into_iter())
        .map(|range| {
            let jobs = (0..batch as i64)
                .map(|img| {
                    let c0 = range.start as i64;
                    let src = xloc.moved(img * cin as i64 * plane + c0 * plane);
                    (
                        src,
                        v.moved(img * v_image + c0 * (t * 4) as i64),
                        range.len(),
                    )
                })
                .collect();
            WinogradInput {
                tiling,
                xi_stride: v_xi,
                jobs,
            }
            .assemble()
        })
        .collect::<Result<Vec<_>, _>>()?;
    let (act, tail) = match fused {
        Some((_, kernel)) => pixel_rows::leading_activation(kernel.body()),
        None => (Activation::None, None),
    };
    let bias = cx.inputs.get(2).map(|&(loc, _)| loc);
    let output = (split_channels(oc, tasks).into_iter())
        .map(|range| {
            let c0 = range.start as i64;
            let jobs = (0..batch as i64)
                .map(|img| {
                    let src = m.moved(img * m_image + c0 * (t * 4) as i64);
                    let dst = cx.out.moved(img * oc as i64 * out_plane + c0 * out_plane);
                    (src, dst, bias.map(|b| b.moved(4 * c0)), range.len())
                })
                .collect();
            WinogradOutput {
                tiling,
                xi_stride: m_xi,
                act,
                jobs,
            }
            .assemble()
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Served {
        before: Some(Step {
            suffix: "winograd-in",
            tasks: input,
        }),
        codes: gemm,
        tail: tail.map(|program| Tail {
            program,
            src: cx.out,
        }),
        after: Some(After::Step(Step {
            suffix: "winograd-out",
            tasks: output,
        })),
        kernel: WINOGRAD,
    })
}

/// `0..n` in at most `parts` nearly equal, non-empty ranges.
fn split_channels(n: usize, parts: usize) -> Vec<std::ops::Range<usize>> {
    let parts = parts.clamp(1, n.max(1));
    (0..parts)
        .map(|i| n * i / parts..n * (i + 1) / parts)
        .collect()
}
