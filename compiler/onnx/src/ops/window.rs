//! The sliding-window attributes (`strides`, `pads`, `auto_pad`,
//! `dilations`, `kernel_shape`, `group`) that Conv, pooling and their
//! quantized forms share, and the lift of 1-D windows to 2-D.

use super::build::reshape_to;
use crate::ctx::{ImportCtx, Val};
use crate::OnnxError;
use kiln_ir::Conv2d;
use tract_onnx::pb::NodeProto;

/// Resolved window attributes for `n` spatial axes.
#[derive(Clone, Debug)]
pub(crate) struct Window {
    pub strides: Vec<usize>,
    pub dilations: Vec<usize>,
    pub pads_begin: Vec<usize>,
    pub pads_end: Vec<usize>,
}

impl Window {
    /// The 2-D form (`[top, left, bottom, right]` pads); a 1-D window gets
    /// a neutral H axis, a 3-D one gives its (H, W) part (the depth is
    /// unrolled by the 3-D decompositions).
    pub fn to_2d(&self) -> ([usize; 2], [usize; 4], [usize; 2]) {
        if self.strides.len() == 1 {
            return (
                [1, self.strides[0]],
                [0, self.pads_begin[0], 0, self.pads_end[0]],
                [1, self.dilations[0]],
            );
        }
        let [h, w] = [self.strides.len() - 2, self.strides.len() - 1];
        (
            [self.strides[h], self.strides[w]],
            [
                self.pads_begin[h],
                self.pads_begin[w],
                self.pads_end[h],
                self.pads_end[w],
            ],
            [self.dilations[h], self.dilations[w]],
        )
    }
}

pub(crate) fn positive_list(
    ctx: &ImportCtx,
    node: &NodeProto,
    name: &str,
    n: usize,
) -> Result<Vec<usize>, OnnxError> {
    match ctx.attr_ints(node, name)? {
        None => Ok(vec![1; n]),
        Some(v) if v.len() == n && v.iter().all(|&x| x > 0) => {
            Ok(v.iter().map(|&x| x as usize).collect())
        }
        Some(v) => Err(ctx.bad_attr(name, format!("expected {n} positive values, got {v:?}"))),
    }
}

/// Resolves strides, dilations and padding (including `auto_pad`) for a
/// window of `kernel` over the spatial dims `input`.
pub(crate) fn window(
    ctx: &ImportCtx,
    node: &NodeProto,
    input: &[usize],
    kernel: &[usize],
) -> Result<Window, OnnxError> {
    let n = input.len();
    let strides = positive_list(ctx, node, "strides", n)?;
    let dilations = if ctx.has_attr(node, "dilations") {
        positive_list(ctx, node, "dilations", n)?
    } else {
        vec![1; n]
    };
    let auto_pad = ctx.attr_s(node, "auto_pad")?.unwrap_or_default();
    let (pads_begin, pads_end) = match auto_pad.as_str() {
        "" | "NOTSET" => match ctx.attr_ints(node, "pads")? {
            None => (vec![0; n], vec![0; n]),
            Some(p) if p.len() == 2 * n && p.iter().all(|&x| x >= 0) => (
                p[..n].iter().map(|&x| x as usize).collect(),
                p[n..].iter().map(|&x| x as usize).collect(),
            ),
            Some(p) => {
                return Err(ctx.bad_attr(
                    "pads",
                    format!("expected {} non-negative values, got {p:?}", 2 * n),
                ))
            }
        },
        "VALID" => (vec![0; n], vec![0; n]),
        "SAME_UPPER" | "SAME_LOWER" => {
            let mut b = Vec::with_capacity(n);
            let mut e = Vec::with_capacity(n);
            for i in 0..n {
                let out = input[i].div_ceil(strides[i]);
                let span = (kernel[i].max(1) - 1) * dilations[i] + 1;
                let total = ((out.max(1) - 1) * strides[i] + span).saturating_sub(input[i]);
                let small = total / 2;
                if auto_pad == "SAME_UPPER" {
                    b.push(small);
                    e.push(total - small);
                } else {
                    b.push(total - small);
                    e.push(small);
                }
            }
            (b, e)
        }
        other => return Err(ctx.bad_attr("auto_pad", format!("unknown value '{other}'"))),
    };
    Ok(Window {
        strides,
        dilations,
        pads_begin,
        pads_end,
    })
}

/// Checks that `x` is 3-D or 4-D (1-D or 2-D windows); anything else is
/// unsupported.
pub(crate) fn spatial_rank(ctx: &ImportCtx, x: Val, what: &str) -> Result<usize, OnnxError> {
    match ctx.ty(x).shape.len() {
        3 => Ok(1),
        4 => Ok(2),
        r => Err(ctx.unsupported(format!(
            "only 1-D and 2-D {what} are supported; the input has rank {r}"
        ))),
    }
}

/// Lifts a 3-D `[N, C, L]` value to `[N, C, 1, L]`.
pub(crate) fn lift(ctx: &mut ImportCtx, x: Val, suffix: &str) -> Result<Val, OnnxError> {
    let s = ctx.ty(x).shape.clone();
    reshape_to(ctx, x, &[s[0], s[1], 1, s[2]], Some(suffix))
}

/// The 2-D IR attributes of a `Conv`-like node (`Conv`, `ConvInteger`,
/// `QLinearConv`) with input X of shape `xs` (rank 3 or 4, checked by
/// [`spatial_rank`]) and weights of shape `ws`: `kernel_shape` is optional
/// and checked against W, `auto_pad` is resolved from the static shapes, a
/// 1-D window gets a neutral H axis.
pub(crate) fn conv_attrs(
    ctx: &ImportCtx,
    node: &NodeProto,
    xs: &[usize],
    ws: &[usize],
) -> Result<Conv2d, OnnxError> {
    let nsp = xs.len() - 2;
    if ws.len() != xs.len() {
        return Err(ctx.invalid(format!(
            "W has rank {} but X has rank {}",
            ws.len(),
            xs.len()
        )));
    }
    let kernel: Vec<usize> = ws[2..].to_vec();
    if let Some(k) = ctx.attr_ints(node, "kernel_shape")? {
        if k.len() != nsp || k.iter().zip(&kernel).any(|(&a, &b)| a != b as i64) {
            return Err(ctx.bad_attr("kernel_shape", format!("{k:?} does not match W {ws:?}")));
        }
    }
    let group = ctx.attr_i_or(node, "group", 1)?;
    if group < 1 {
        return Err(ctx.bad_attr("group", format!("must be positive, got {group}")));
    }
    // W's first dim (output channels) is a multiple of the group count, so
    // a larger one cannot fit (and products with it could overflow).
    if group as u64 > ws[0].max(1) as u64 {
        return Err(ctx.bad_attr(
            "group",
            format!(
                "{group} groups cannot divide W {ws:?}'s {} output channels",
                ws[0]
            ),
        ));
    }
    let win = window(ctx, node, &xs[2..], &kernel)?;
    let (strides, pads, dilations) = win.to_2d();
    Ok(Conv2d {
        strides,
        pads,
        dilations,
        group: group as usize,
    })
}
