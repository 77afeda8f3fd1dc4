//! `RNN`, `GRU` and `LSTM`, unrolled over the static sequence length: the
//! input projections of all time steps are one MatMul per direction, then
//! each step is a MatMul with the recurrence weights plus elementwise gate
//! arithmetic. `sequence_lens` (constant or run-time) masks the steps past
//! each batch entry's length: its state is held and its output is 0, which
//! also makes the reverse direction start at the entry's last valid step.
//!
//! onnxruntime's `DynamicQuantizeLSTM` is the LSTM with 8-bit weights
//! ([`QuantizedWeights`]): its projections quantize the input sequence
//! (once) and the hidden state (every step) to u8 at run time and multiply
//! them exactly by the weights, as onnxruntime's kernel does.

use super::build::slice_along;
use super::build::{cast_to, reshape_to, scalar};
use crate::ctx::{ImportCtx, Val};
use crate::OnnxError;
use kiln_ir::{BinaryOp, CompareOp, DType, Op, UnaryOp};
use tract_onnx::pb::NodeProto;

/// Most time steps one recurrent node may unroll into (each step is a few
/// IR nodes; far longer sequences would build graphs of millions of nodes).
const MAX_STEPS: usize = 4096;

type R = Result<Vec<Val>, OnnxError>;

#[derive(Clone, Copy, PartialEq)]
enum Cell {
    Rnn,
    Gru,
    Lstm,
}

impl Cell {
    fn gates(self) -> usize {
        match self {
            Cell::Rnn => 1,
            Cell::Gru => 3,
            Cell::Lstm => 4,
        }
    }

    fn default_activations(self) -> &'static [&'static str] {
        match self {
            Cell::Rnn => &["Tanh"],
            Cell::Gru => &["Sigmoid", "Tanh"],
            Cell::Lstm => &["Sigmoid", "Tanh", "Tanh"],
        }
    }
}

/// One 8-bit weight matrix of `DynamicQuantizeLSTM`: `[D, K, G·H]` (K by
/// G·H per direction, the transpose of the ONNX layout) with its scale and
/// zero point, `[D]` (per direction) or `[D, G·H]` (per output column).
pub(crate) struct QuantizedMatrix {
    pub q: Val,
    pub scale: Val,
    pub zero: Option<Val>,
}

/// The input (W) and recurrence (R) weights of `DynamicQuantizeLSTM`.
pub(crate) struct QuantizedWeights {
    pub w: QuantizedMatrix,
    pub r: QuantizedMatrix,
}

/// One direction's weights as its projections read them.
enum DirectionWeights {
    /// `[input, G·H]` and `[H, G·H]` in the input's float type.
    Float { wt: Val, rt: Val },
    /// Direction `d` of the quantized matrices.
    Quantized {
        w: QuantizedMatrix,
        r: QuantizedMatrix,
    },
}

impl DirectionWeights {
    /// `a @ W` (`hidden`: `a @ R`), `tag` naming the helper nodes.
    fn project(
        &self,
        ctx: &mut ImportCtx,
        a: Val,
        hidden: bool,
        tag: &str,
    ) -> Result<Val, OnnxError> {
        match self {
            DirectionWeights::Float { wt, rt } => {
                let m = if hidden { *rt } else { *wt };
                ctx.dense_op(Op::MatMul, &[a, m], Some(tag))
            }
            DirectionWeights::Quantized { w, r } => {
                let m = if hidden { r } else { w };
                let tag = format!("{tag}_");
                super::quant::dynamic_quantized_matmul(ctx, a, m.q, m.scale, m.zero, &tag)
            }
        }
    }
}

/// Direction `d` of a quantized matrix: `[K, G·H]`, its scale and zero
/// point a scalar or `[G·H]`.
fn quantized_direction(
    ctx: &mut ImportCtx,
    m: &QuantizedMatrix,
    d: usize,
    tag: &str,
) -> Result<QuantizedMatrix, OnnxError> {
    let param = |ctx: &mut ImportCtx, p: Val, what: &str| -> Result<Val, OnnxError> {
        let t = ctx.ty(p).clone();
        match t.shape.len() {
            0 => Ok(p),
            1 | 2 => direction_of(ctx, p, d, &format!("{tag}_{what}")),
            _ => Err(ctx.invalid(format!(
                "{tag}_{what} must be [num_directions] or [num_directions, {}], got {t}",
                ctx.ty(m.q).shape.get(2).copied().unwrap_or(0)
            ))),
        }
    };
    Ok(QuantizedMatrix {
        q: direction_of(ctx, m.q, d, tag)?,
        scale: param(ctx, m.scale, "scale")?,
        zero: match m.zero {
            Some(z) => Some(param(ctx, z, "zero_point")?),
            None => None,
        },
    })
}

/// The activations of one direction, resolved to unary ops.
fn activations(
    ctx: &ImportCtx,
    node: &NodeProto,
    cell: Cell,
    dirs: usize,
) -> Result<Vec<Vec<UnaryOp>>, OnnxError> {
    let per = cell.default_activations().len();
    let names: Vec<String> = match ctx.raw_attr(node, "activations") {
        Some(a) if !a.strings.is_empty() => a
            .strings
            .iter()
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect(),
        _ => (0..dirs)
            .flat_map(|_| cell.default_activations().iter().map(|s| s.to_string()))
            .collect(),
    };
    if names.len() != per * dirs {
        return Err(ctx.bad_attr(
            "activations",
            format!("{} names for {dirs} direction(s) of {per}", names.len()),
        ));
    }
    let alphas = ctx
        .attr_floats(node, "activation_alpha")?
        .unwrap_or_default();
    let betas = ctx
        .attr_floats(node, "activation_beta")?
        .unwrap_or_default();
    let (mut ai, mut bi) = (0, 0);
    let next = |v: &[f32], i: &mut usize, default: f32| {
        let x = v.get(*i).copied().unwrap_or(default);
        *i += 1;
        x
    };
    let mut ops = Vec::with_capacity(names.len());
    for n in &names {
        let op = match n.to_ascii_lowercase().as_str() {
            "sigmoid" => UnaryOp::Sigmoid,
            "tanh" => UnaryOp::Tanh,
            "relu" => UnaryOp::Relu,
            "softsign" => UnaryOp::Softsign,
            "softplus" => UnaryOp::Softplus,
            "leakyrelu" => UnaryOp::LeakyRelu {
                alpha: next(&alphas, &mut ai, 0.01),
            },
            "thresholdedrelu" => UnaryOp::ThresholdedRelu {
                alpha: next(&alphas, &mut ai, 1.0),
            },
            "elu" => UnaryOp::Elu {
                alpha: next(&alphas, &mut ai, 1.0),
            },
            "hardsigmoid" => UnaryOp::HardSigmoid {
                alpha: next(&alphas, &mut ai, 0.2),
                beta: next(&betas, &mut bi, 0.5),
            },
            other => {
                return Err(
                    ctx.unsupported(format!("{} with the '{other}' activation", node.op_type))
                )
            }
        };
        ops.push(op);
    }
    Ok(ops.chunks(per).map(|c| c.to_vec()).collect())
}

fn add(ctx: &mut ImportCtx, a: Val, b: Val, tag: &str) -> Result<Val, OnnxError> {
    ctx.op(Op::Binary(BinaryOp::Add), &[a, b], Some(tag))
}

fn mul(ctx: &mut ImportCtx, a: Val, b: Val, tag: &str) -> Result<Val, OnnxError> {
    ctx.op(Op::Binary(BinaryOp::Mul), &[a, b], Some(tag))
}

/// A gate activation, after the optional pre-activation clip.
fn act(
    ctx: &mut ImportCtx,
    f: UnaryOp,
    x: Val,
    clip: Option<f32>,
    tag: &str,
) -> Result<Val, OnnxError> {
    let x = match clip {
        Some(c) => ctx.op(
            Op::Unary(UnaryOp::Clip { min: -c, max: c }),
            &[x],
            Some(&format!("{tag}_clipped")),
        )?,
        None => x,
    };
    ctx.op(Op::Unary(f), &[x], Some(tag))
}

/// Row `d` of a `[dirs, ..]` parameter, without its leading axis.
fn direction_of(ctx: &mut ImportCtx, p: Val, d: usize, tag: &str) -> Result<Val, OnnxError> {
    let s = ctx.ty(p).shape.clone();
    let one_dir = slice_along(ctx, p, 0, d, 1, 1, &format!("{tag}_dir{d}"))?;
    reshape_to(ctx, one_dir, &s[1..], Some(&format!("{tag}_dir{d}_rows")))
}

fn recurrent(
    ctx: &mut ImportCtx,
    node: &NodeProto,
    cell: Cell,
    quantized: Option<QuantizedWeights>,
) -> R {
    let x = ctx.input(node, 0)?;
    let w = ctx.input(node, 1)?;
    let r = ctx.input(node, 2)?;
    let bias = ctx.opt_input(node, 3);
    let seq_lens = ctx.opt_input(node, 4);
    let init_h = ctx.opt_input(node, 5);
    let init_c = if cell == Cell::Lstm {
        ctx.opt_input(node, 6)
    } else {
        None
    };
    let peep = if cell == Cell::Lstm {
        ctx.opt_input(node, 7)
    } else {
        None
    };
    let xt = ctx.ty(x).clone();
    let dt = xt.dtype;
    if xt.shape.len() != 3 || !dt.is_float() {
        return Err(ctx.invalid(format!("X must be a float 3-D tensor, got {xt}")));
    }
    let layout = ctx.attr_i_or(node, "layout", 0)?;
    let x = if layout == 1 {
        ctx.op(
            Op::Transpose {
                perm: [1, 0, 2].into_iter().collect(),
            },
            &[x],
            Some("time_major"),
        )?
    } else {
        x
    };
    let xs = ctx.ty(x).shape.clone();
    let (steps, batch, input) = (xs[0], xs[1], xs[2]);
    if steps > MAX_STEPS {
        return Err(ctx.unsupported(format!(
            "{} over {steps} time steps: Kiln unrolls recurrences and stops at {MAX_STEPS} steps",
            node.op_type
        )));
    }
    let hidden = ctx
        .attr_i(node, "hidden_size")?
        .ok_or_else(|| ctx.bad_attr("hidden_size", "is required"))?;
    if hidden < 1 {
        return Err(ctx.bad_attr("hidden_size", format!("must be positive, got {hidden}")));
    }
    let h = hidden as usize;
    let direction = ctx
        .attr_s(node, "direction")?
        .unwrap_or_else(|| "forward".into());
    let dirs: Vec<bool> = match direction.as_str() {
        "forward" => vec![false],
        "reverse" => vec![true],
        "bidirectional" => vec![false, true],
        d => return Err(ctx.bad_attr("direction", format!("unknown direction '{d}'"))),
    };
    let nd = dirs.len();
    let g = cell.gates();
    // hidden_size is a model's attribute: g·h must not overflow (W's shape,
    // checked next, then bounds every product of h below).
    if g.checked_mul(h)
        .and_then(|gh| gh.checked_mul(input.max(h)))
        .is_none()
    {
        return Err(ctx.bad_attr("hidden_size", format!("{hidden} is too large")));
    }
    // The quantized weights are stored transposed, one [K, G·H] matrix
    // per direction.
    let (w_want, r_want) = match &quantized {
        None => (vec![nd, g * h, input], vec![nd, g * h, h]),
        Some(_) => (vec![nd, input, g * h], vec![nd, h, g * h]),
    };
    for (p, name, want) in [(w, "W", w_want), (r, "R", r_want)] {
        if ctx.ty(p).shape.as_slice() != want.as_slice() {
            return Err(ctx.invalid(format!("{name} is {}, expected {want:?}", ctx.ty(p))));
        }
    }
    if quantized.is_some() && (cell != Cell::Lstm || dt != DType::F32) {
        return Err(ctx.unsupported("quantized weights on a cell other than an f32 LSTM"));
    }
    let clip = ctx.attr_f(node, "clip")?.filter(|&c| c > 0.0);
    let acts = activations(ctx, node, cell, nd)?;
    let lbr = cell == Cell::Gru && ctx.attr_i_or(node, "linear_before_reset", 0)? != 0;
    if cell == Cell::Lstm && ctx.attr_i_or(node, "input_forget", 0)? != 0 {
        return Err(ctx.unsupported("LSTM with input_forget=1"));
    }
    // The per-step validity mask [batch, 1] of each time step, when lengths
    // may be shorter than the sequence.
    let lens = match seq_lens {
        Some(l) => {
            let full = ctx
                .konst(l)
                .is_some_and(|t| t.to_i64_vec().iter().all(|&v| v == steps as i64));
            if full {
                None
            } else {
                let l = cast_to(ctx, l, DType::I64, "seq_lens_i64")?;
                Some(reshape_to(ctx, l, &[batch, 1], Some("seq_lens_view"))?)
            }
        }
        None => None,
    };
    let zero_state = super::build::build_const(ctx, &[batch, h], dt, "zero_state", |n| {
        kiln_ir::Data::zeros(dt, n)
    })?;

    let mut ys = Vec::with_capacity(nd);
    let mut yhs = Vec::with_capacity(nd);
    let mut ycs = Vec::with_capacity(nd);
    for (d, &reverse) in dirs.iter().enumerate() {
        let tag = |s: &str| format!("d{d}_{s}");
        let weights = match &quantized {
            Some(q) => DirectionWeights::Quantized {
                w: quantized_direction(ctx, &q.w, d, "W")?,
                r: quantized_direction(ctx, &q.r, d, "R")?,
            },
            None => {
                let wd = direction_of(ctx, w, d, "W")?;
                let rd = direction_of(ctx, r, d, "R")?;
                let wt = ctx.op(
                    Op::Transpose {
                        perm: [1, 0].into_iter().collect(),
                    },
                    &[wd],
                    Some(&tag("W_t")),
                )?;
                let rt = ctx.op(
                    Op::Transpose {
                        perm: [1, 0].into_iter().collect(),
                    },
                    &[rd],
                    Some(&tag("R_t")),
                )?;
                DirectionWeights::Float { wt, rt }
            }
        };
        // Input projections of every step at once: [steps, batch, g·h].
        let mut xw = weights.project(ctx, x, false, &tag("x_proj"))?;
        let mut rb_inner = None;
        if let Some(b) = bias {
            let bd = direction_of(ctx, b, d, "B")?;
            let bd = cast_to(ctx, bd, dt, &tag("B_cast"))?;
            let wb = slice_along(ctx, bd, 0, 0, 1, g * h, &tag("Wb"))?;
            let rb = slice_along(ctx, bd, 0, g * h, 1, g * h, &tag("Rb"))?;
            xw = add(ctx, xw, wb, &tag("x_proj_wb"))?;
            if lbr {
                // GRU's hidden-gate recurrence bias goes inside the reset.
                let rb_zr = slice_along(ctx, rb, 0, 0, 1, 2 * h, &tag("Rb_zr"))?;
                let zero_h = super::build::build_const(ctx, &[h], dt, &tag("Rb_h_zero"), |n| {
                    kiln_ir::Data::zeros(dt, n)
                })?;
                let rb_zr = ctx.op(
                    Op::Concat { axis: 0 },
                    &[rb_zr, zero_h],
                    Some(&tag("Rb_outer")),
                )?;
                xw = add(ctx, xw, rb_zr, &tag("x_proj_b"))?;
                // [0, 0, Rb_h]: added to the one recurrence product of all
                // three gates (below).
                let zero_zr =
                    super::build::build_const(ctx, &[2 * h], dt, &tag("Rb_zr_zero"), |n| {
                        kiln_ir::Data::zeros(dt, n)
                    })?;
                let rb_h = slice_along(ctx, rb, 0, 2 * h, 1, h, &tag("Rb_h"))?;
                rb_inner = Some(ctx.op(
                    Op::Concat { axis: 0 },
                    &[zero_zr, rb_h],
                    Some(&tag("Rb_inner")),
                )?);
            } else {
                xw = add(ctx, xw, rb, &tag("x_proj_b"))?;
            }
        }
        let mut hs = match init_h {
            Some(ih) => {
                let v = direction_of(ctx, ih, d, "initial_h")?;
                cast_to(ctx, v, dt, &tag("initial_h_cast"))?
            }
            None => zero_state,
        };
        let mut cs = match init_c {
            Some(ic) => {
                let v = direction_of(ctx, ic, d, "initial_c")?;
                cast_to(ctx, v, dt, &tag("initial_c_cast"))?
            }
            None => zero_state,
        };
        let peeps = match peep {
            Some(p) => {
                let pd = direction_of(ctx, p, d, "P")?;
                let pd = cast_to(ctx, pd, dt, &tag("P_cast"))?;
                let mut v = Vec::with_capacity(3);
                for (k, name) in ["Pi", "Po", "Pf"].iter().enumerate() {
                    v.push(slice_along(ctx, pd, 0, k * h, 1, h, &tag(name))?);
                }
                Some(v)
            }
            None => None,
        };
        let f = &acts[d];
        let mut outs = vec![None; steps];
        let order: Vec<usize> = if reverse {
            (0..steps).rev().collect()
        } else {
            (0..steps).collect()
        };
        for &t in &order {
            let st = |s: &str| format!("d{d}_t{t}_{s}");
            let xt = slice_along(ctx, xw, 0, t, 1, 1, &st("x"))?;
            let xt = reshape_to(ctx, xt, &[batch, g * h], Some(&st("x_rows")))?;
            let gate = |ctx: &mut ImportCtx, v: Val, k: usize, name: &str| {
                slice_along(ctx, v, 1, k * h, 1, h, &st(name))
            };
            let (h_new, c_new) = match cell {
                Cell::Rnn => {
                    let hr = weights.project(ctx, hs, true, &st("h_proj"))?;
                    let pre = add(ctx, xt, hr, &st("pre"))?;
                    (act(ctx, f[0], pre, clip, &st("h"))?, None)
                }
                Cell::Gru => {
                    let DirectionWeights::Float { rt, .. } = weights else {
                        return Err(ctx.unsupported("a GRU with quantized weights"));
                    };
                    let x_zr = slice_along(ctx, xt, 1, 0, 1, 2 * h, &st("x_zr"))?;
                    // With the reset after the product, h·R_h does not wait
                    // for r: one matrix-vector product for the three gates
                    // (one step, split over threads, instead of two).
                    let (hr_zr, hh) = if lbr {
                        let mut hr = ctx.dense_op(Op::MatMul, &[hs, rt], Some(&st("h_proj")))?;
                        if let Some(b) = rb_inner {
                            hr = add(ctx, hr, b, &st("h_proj_b"))?;
                        }
                        let hr_zr = slice_along(ctx, hr, 1, 0, 1, 2 * h, &st("h_proj_zr"))?;
                        (hr_zr, Some(gate(ctx, hr, 2, "h_proj_h")?))
                    } else {
                        let rt_zr = slice_along(ctx, rt, 1, 0, 1, 2 * h, &st("R_zr"))?;
                        let hr_zr =
                            ctx.dense_op(Op::MatMul, &[hs, rt_zr], Some(&st("h_proj_zr")))?;
                        (hr_zr, None)
                    };
                    let zr = add(ctx, x_zr, hr_zr, &st("pre_zr"))?;
                    let z = gate(ctx, zr, 0, "pre_z")?;
                    let rg = gate(ctx, zr, 1, "pre_r")?;
                    let z = act(ctx, f[0], z, clip, &st("z"))?;
                    let rg = act(ctx, f[0], rg, clip, &st("r"))?;
                    let x_h = gate(ctx, xt, 2, "x_h")?;
                    let inner = match hh {
                        Some(hh) => mul(ctx, rg, hh, &st("reset"))?,
                        None => {
                            let rt_h = slice_along(ctx, rt, 1, 2 * h, 1, h, &st("R_h"))?;
                            let rh = mul(ctx, rg, hs, &st("reset"))?;
                            ctx.dense_op(Op::MatMul, &[rh, rt_h], Some(&st("h_proj_h")))?
                        }
                    };
                    let pre = add(ctx, x_h, inner, &st("pre_h"))?;
                    let cand = act(ctx, f[1], pre, clip, &st("candidate"))?;
                    // (1 - z)·cand + z·h = cand + z·(h - cand)
                    let diff = ctx.op(Op::Binary(BinaryOp::Sub), &[hs, cand], Some(&st("diff")))?;
                    let zd = mul(ctx, z, diff, &st("z_diff"))?;
                    (add(ctx, cand, zd, &st("h"))?, None)
                }
                Cell::Lstm => {
                    let hr = weights.project(ctx, hs, true, &st("h_proj"))?;
                    let pre = add(ctx, xt, hr, &st("pre"))?;
                    let mut pi = gate(ctx, pre, 0, "pre_i")?;
                    let mut po = gate(ctx, pre, 1, "pre_o")?;
                    let mut pf = gate(ctx, pre, 2, "pre_f")?;
                    let pc = gate(ctx, pre, 3, "pre_c")?;
                    if let Some(p) = &peeps {
                        let a = mul(ctx, p[0], cs, &st("peep_i"))?;
                        pi = add(ctx, pi, a, &st("pre_i_peep"))?;
                        let b = mul(ctx, p[2], cs, &st("peep_f"))?;
                        pf = add(ctx, pf, b, &st("pre_f_peep"))?;
                    }
                    let i = act(ctx, f[0], pi, clip, &st("i"))?;
                    let fg = act(ctx, f[0], pf, clip, &st("f"))?;
                    let cc = act(ctx, f[1], pc, clip, &st("c_candidate"))?;
                    let keep = mul(ctx, fg, cs, &st("c_keep"))?;
                    let write = mul(ctx, i, cc, &st("c_write"))?;
                    let c = add(ctx, keep, write, &st("c"))?;
                    if let Some(p) = &peeps {
                        let a = mul(ctx, p[1], c, &st("peep_o"))?;
                        po = add(ctx, po, a, &st("pre_o_peep"))?;
                    }
                    let o = act(ctx, f[0], po, clip, &st("o"))?;
                    let hc = ctx.op(Op::Unary(f[2]), &[c], Some(&st("c_act")))?;
                    (mul(ctx, o, hc, &st("h"))?, Some(c))
                }
            };
            let (h_next, c_next, y_t) = match lens {
                Some(l) => {
                    let tc = scalar(ctx, DType::I64, t as f64, &st("step"));
                    let valid =
                        ctx.op(Op::Compare(CompareOp::Less), &[tc, l], Some(&st("valid")))?;
                    let hn = ctx.op(Op::Where, &[valid, h_new, hs], Some(&st("h_held")))?;
                    let cn = match c_new {
                        Some(c) => Some(ctx.op(Op::Where, &[valid, c, cs], Some(&st("c_held")))?),
                        None => None,
                    };
                    let y = ctx.op(Op::Where, &[valid, h_new, zero_state], Some(&st("y")))?;
                    (hn, cn, y)
                }
                None => (h_new, c_new, h_new),
            };
            hs = h_next;
            if let Some(c) = c_next {
                cs = c;
            }
            outs[t] = Some(reshape_to(
                ctx,
                y_t,
                &[1, 1, batch, h],
                Some(&st("y_view")),
            )?);
        }
        let outs: Vec<Val> = outs.into_iter().map(|o| o.expect("every step")).collect();
        let y = if outs.len() == 1 {
            outs[0]
        } else {
            ctx.op(Op::Concat { axis: 0 }, &outs, Some(&tag("y")))?
        };
        ys.push(y);
        yhs.push(reshape_to(ctx, hs, &[1, batch, h], Some(&tag("y_h")))?);
        ycs.push(reshape_to(ctx, cs, &[1, batch, h], Some(&tag("y_c")))?);
    }
    let cat = |ctx: &mut ImportCtx, v: Vec<Val>, axis: usize, tag: &str| {
        if v.len() == 1 {
            Ok(v[0])
        } else {
            ctx.op(Op::Concat { axis }, &v, Some(tag))
        }
    };
    let mut y = cat(ctx, ys, 1, "Y_dirs")?;
    let mut yh = cat(ctx, yhs, 0, "Y_h_dirs")?;
    let mut yc = cat(ctx, ycs, 0, "Y_c_dirs")?;
    if layout == 1 {
        let t = |ctx: &mut ImportCtx, v: Val, perm: &[usize], tag: &str| {
            ctx.op(
                Op::Transpose {
                    perm: perm.iter().copied().collect(),
                },
                &[v],
                Some(tag),
            )
        };
        y = t(ctx, y, &[2, 0, 1, 3], "Y_batch_major")?;
        yh = t(ctx, yh, &[1, 0, 2], "Y_h_batch_major")?;
        yc = t(ctx, yc, &[1, 0, 2], "Y_c_batch_major")?;
    }
    Ok(if cell == Cell::Lstm {
        vec![y, yh, yc]
    } else {
        vec![y, yh]
    })
}

/// `RNN`.
pub fn rnn(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    recurrent(ctx, node, Cell::Rnn, None)
}

/// `GRU` (`linear_before_reset` applies the reset after the recurrence
/// MatMul).
pub fn gru(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    recurrent(ctx, node, Cell::Gru, None)
}

/// `LSTM` (peepholes supported; `input_forget` is not).
pub fn lstm(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    recurrent(ctx, node, Cell::Lstm, None)
}

/// An LSTM node (the ONNX inputs and attributes) whose W and R are the
/// 8-bit `weights` (`DynamicQuantizeLSTM`).
pub(crate) fn lstm_with_quantized_weights(
    ctx: &mut ImportCtx,
    node: &NodeProto,
    weights: QuantizedWeights,
) -> R {
    recurrent(ctx, node, Cell::Lstm, Some(weights))
}
