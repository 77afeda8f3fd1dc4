//! The printer.

use super::{PrintOptions, DENSE_LIMIT};
use crate::op::{Conv2d, Pool2d, ResizeMode};
use crate::{Attribute, Data, Graph, NodeId, Op, Tensor};
use half::{bf16, f16};
use std::collections::{HashMap, HashSet};
use std::fmt::Write;

pub(super) fn print_graph(g: &Graph, opts: &PrintOptions) -> String {
    // Inputs first, in input order, then everything else in topological
    // order. A cyclic graph (only buildable with `add_edge_unchecked`) still
    // prints, in index order, so that it can be looked at.
    let inputs: Vec<NodeId> = g
        .inputs()
        .iter()
        .copied()
        .filter(|&id| g.contains(id))
        .collect();
    let input_set: HashSet<NodeId> = inputs.iter().copied().collect();
    let order = g.topo_order().unwrap_or_else(|_| g.node_ids().collect());
    let body: Vec<NodeId> = order
        .into_iter()
        .filter(|id| !input_set.contains(id))
        .collect();
    let numbers: HashMap<NodeId, usize> = inputs
        .iter()
        .chain(&body)
        .enumerate()
        .map(|(i, &id)| (id, i))
        .collect();
    let value = |id: NodeId| match numbers.get(&id) {
        Some(n) => format!("%{n}"),
        None => "%<removed>".to_string(),
    };

    let mut out = String::from("graph(");
    for (i, &id) in inputs.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let node = g.node(id);
        let _ = write!(out, "{}: {} {}", value(id), node.ty, quote(&node.name));
    }
    out.push_str(") {\n");
    for &id in &body {
        let node = g.node(id);
        let _ = write!(out, "  {}: {} = ", value(id), node.ty);
        match &node.op {
            Op::Constant(t) => print_const(&mut out, t, opts),
            op => {
                out.push_str(op.name());
                out.push('(');
                let args: Vec<String> = g.inputs_of(id).into_iter().map(value).collect();
                out.push_str(&args.join(", "));
                out.push(')');
                let attrs = attributes(op);
                if !attrs.is_empty() {
                    let _ = write!(out, " {{{}}}", attrs.join(", "));
                }
            }
        }
        if !node.name.is_empty() {
            out.push_str("  # onnx: ");
            out.push_str(&comment_name(&node.name));
        }
        out.push('\n');
    }
    out.push_str("  return");
    for (i, (name, id)) in g.outputs().iter().enumerate() {
        out.push_str(if i == 0 { " " } else { ", " });
        let _ = write!(out, "{} {}", value(*id), quote(name));
    }
    out.push_str("\n}\n");
    out
}

/// The attributes of `op`, each as `name=value`, all of them, in a fixed order.
pub(super) fn attributes(op: &Op) -> Vec<String> {
    match op {
        Op::Input { index } => vec![format!("index={index}")],
        Op::Unary(op) => family_attributes(op.attributes()),
        Op::Binary(op) => family_attributes(op.attributes()),
        Op::Compare(op) => family_attributes(op.attributes()),
        Op::Logical(op) => family_attributes(op.attributes()),
        Op::Bitwise(op) => family_attributes(op.attributes()),
        Op::Constant(_)
        | Op::Not
        | Op::BitwiseNot
        | Op::Where
        | Op::MatMul
        | Op::MatMulInteger
        | Op::GlobalAveragePool
        | Op::GlobalMaxPool
        | Op::NonZero => vec![],
        Op::Gemm {
            alpha,
            beta,
            trans_a,
            trans_b,
        } => vec![
            format!("alpha={}", fmt_f32(*alpha)),
            format!("beta={}", fmt_f32(*beta)),
            format!("trans_a={trans_a}"),
            format!("trans_b={trans_b}"),
        ],
        Op::Conv(Conv2d {
            strides,
            pads,
            dilations,
            group,
        })
        | Op::ConvInteger(Conv2d {
            strides,
            pads,
            dilations,
            group,
        }) => vec![
            format!("strides={}", ints(strides)),
            format!("pads={}", ints(pads)),
            format!("dilations={}", ints(dilations)),
            format!("group={group}"),
        ],
        Op::MaxPool(p) => pool_attributes(p),
        Op::AveragePool {
            pool,
            count_include_pad,
        } => {
            let mut attrs = pool_attributes(pool);
            attrs.push(format!("count_include_pad={count_include_pad}"));
            attrs
        }
        Op::Softmax { axis }
        | Op::Concat { axis }
        | Op::Gather { axis }
        | Op::WithLength { axis } => {
            vec![format!("axis={axis}")]
        }
        Op::Reshape { shape } | Op::Expand { shape } => vec![format!("shape={}", ints(shape))],
        Op::Unique { sorted } => vec![format!("sorted={sorted}")],
        Op::NonMaxSuppression(n) => vec![
            format!("center_point_box={}", n.center_point_box),
            format!("cap={}", n.cap),
            format!("has_score_threshold={}", n.has_score_threshold),
        ],
        Op::Transpose { perm } => vec![format!("perm={}", ints(perm))],
        Op::Slice { axes } => {
            let axes: Vec<String> = axes
                .iter()
                .map(|a| format!("{}:{}:{}", a.start, a.step, a.len))
                .collect();
            vec![format!("axes=[{}]", axes.join(", "))]
        }
        Op::Cast { to } | Op::Bitcast { to } => vec![format!("to={to}")],
        Op::Reduce {
            op,
            axes,
            keep_dims,
        } => {
            let mut attrs = family_attributes(op.attributes());
            attrs.push(format!("axes={}", ints(axes)));
            attrs.push(format!("keep_dims={keep_dims}"));
            attrs
        }
        Op::Attention { scale } => vec![format!("scale={}", fmt_f32(*scale))],
        Op::LayerNorm { axis, epsilon } => {
            vec![
                format!("axis={axis}"),
                format!("epsilon={}", fmt_f32(*epsilon)),
            ]
        }
        Op::Resize(r) => {
            let scales: Vec<String> = r.scales.iter().map(|&s| fmt_f32(s)).collect();
            let mut attrs = vec![
                format!("shape={}", ints(&r.shape)),
                format!("scales=[{}]", scales.join(",")),
                format!("coord={}", r.coord.name()),
            ];
            if r.antialias {
                attrs.push("antialias=true".into());
            }
            if !r.roi.is_empty() {
                let roi: Vec<String> = r.roi.iter().flatten().map(|&v| fmt_f32(v)).collect();
                attrs.push(format!("roi=[{}]", roi.join(",")));
            }
            match r.mode {
                ResizeMode::Nearest(n) => {
                    attrs.push("mode=nearest".into());
                    attrs.push(format!("nearest={}", n.name()));
                }
                ResizeMode::Linear => attrs.push("mode=linear".into()),
                ResizeMode::Cubic { a, exclude_outside } => {
                    attrs.push("mode=cubic".into());
                    attrs.push(format!("cubic_a={}", fmt_f32(a)));
                    attrs.push(format!("exclude_outside={exclude_outside}"));
                }
            }
            attrs
        }
        Op::Fused(k) => {
            let mut attrs = Vec::new();
            if let Some(h) = k.head() {
                let op = h.op.op();
                attrs.push(format!("head={}", op.name()));
                attrs.push(format!("head_inputs={}", h.inputs));
                attrs.extend(attributes(&op));
            }
            if k.store() != crate::FusedStore::F32 {
                attrs.push(format!("store={}", k.store().dtype().name()));
            }
            attrs.push(format!("body={}", quote(&k.body().to_text())));
            attrs
        }
        Op::Col2Im(c) => vec![
            format!("grid={}", ints(&c.grid)),
            format!("image={}", ints(&c.image)),
            format!("block={}", ints(&c.block)),
            format!("strides={}", ints(&c.strides)),
            format!("dilations={}", ints(&c.dilations)),
            format!("pads={}", ints(&c.pads)),
        ],
    }
}

/// A family op's attributes as its table gives them.
fn family_attributes(attrs: Vec<(&str, Attribute)>) -> Vec<String> {
    attrs
        .into_iter()
        .map(|(name, value)| match value {
            Attribute::F32(x) => format!("{name}={}", fmt_f32(x)),
            Attribute::Bool(b) => format!("{name}={b}"),
        })
        .collect()
}

fn pool_attributes(p: &Pool2d) -> Vec<String> {
    vec![
        format!("kernel={}", ints(&p.kernel)),
        format!("strides={}", ints(&p.strides)),
        format!("pads={}", ints(&p.pads)),
        format!("dilations={}", ints(&p.dilations)),
        format!("ceil_mode={}", p.ceil_mode),
    ]
}

fn ints(v: &[usize]) -> String {
    let v: Vec<String> = v.iter().map(|x| x.to_string()).collect();
    format!("[{}]", v.join(","))
}

fn print_const(out: &mut String, t: &Tensor, opts: &PrintOptions) {
    if t.len() <= DENSE_LIMIT || opts.full_constants {
        out.push_str("const dense<[");
        let elements: Vec<String> = match t.data() {
            Data::F32(v) => v.iter().map(|&x| fmt_f32(x)).collect(),
            Data::F16(v) => v.iter().map(|&x| fmt_f16(x)).collect(),
            Data::BF16(v) => v.iter().map(|&x| fmt_bf16(x)).collect(),
            Data::F64(v) => v.iter().map(|&x| fmt_f64(x)).collect(),
            Data::I8(v) => v.iter().map(|x| x.to_string()).collect(),
            Data::U8(v) => v.iter().map(|x| x.to_string()).collect(),
            Data::I16(v) => v.iter().map(|x| x.to_string()).collect(),
            Data::I32(v) => v.iter().map(|x| x.to_string()).collect(),
            Data::I64(v) => v.iter().map(|x| x.to_string()).collect(),
            Data::Bool(v) => v.iter().map(|x| x.to_string()).collect(),
            Data::U16(v) => v.iter().map(|x| x.to_string()).collect(),
            Data::U32(v) => v.iter().map(|x| x.to_string()).collect(),
            Data::U64(v) => v.iter().map(|x| x.to_string()).collect(),
            // A narrow type's codes (`crate::narrow`), which parse back.
            Data::Narrow(_, v) => v.iter().map(|x| format!("{x:#04x}")).collect(),
        };
        out.push_str(&elements.join(", "));
        out.push_str("]>");
    } else {
        let _ = write!(
            out,
            "const elided<{} x {}, fnv1a=0x{:016x}>",
            t.len(),
            t.dtype(),
            fnv1a(t.data())
        );
    }
}

/// 64-bit FNV-1a of the little-endian bytes of the elements (bools as 0/1).
pub(super) fn fnv1a(data: &Data) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    match data {
        Data::F32(v) => v.iter().for_each(|x| eat(&x.to_le_bytes())),
        Data::F16(v) => v.iter().for_each(|x| eat(&x.to_le_bytes())),
        Data::BF16(v) => v.iter().for_each(|x| eat(&x.to_le_bytes())),
        Data::F64(v) => v.iter().for_each(|x| eat(&x.to_le_bytes())),
        Data::I8(v) => v.iter().for_each(|x| eat(&x.to_le_bytes())),
        Data::U8(v) => eat(v),
        Data::I16(v) => v.iter().for_each(|x| eat(&x.to_le_bytes())),
        Data::I32(v) => v.iter().for_each(|x| eat(&x.to_le_bytes())),
        Data::I64(v) => v.iter().for_each(|x| eat(&x.to_le_bytes())),
        Data::Bool(v) => v.iter().for_each(|&x| eat(&[x as u8])),
        Data::U16(v) => v.iter().for_each(|x| eat(&x.to_le_bytes())),
        Data::U32(v) => v.iter().for_each(|x| eat(&x.to_le_bytes())),
        Data::U64(v) => v.iter().for_each(|x| eat(&x.to_le_bytes())),
        Data::Narrow(_, v) => eat(v),
    }
    h
}

/// Shortest text that parses back to the same bits: Rust's `{:?}` for
/// finite values, `inf`/`-inf`, `nan` for the canonical quiet NaN and
/// `nan:0x<bits>` for any other NaN.
pub(super) fn fmt_f32(x: f32) -> String {
    if x.is_nan() {
        nan_text(x.to_bits() as u64, f32::NAN.to_bits() as u64, 8)
    } else if x.is_infinite() {
        if x > 0.0 { "inf" } else { "-inf" }.to_string()
    } else {
        format!("{x:?}")
    }
}

pub(super) fn fmt_f64(x: f64) -> String {
    if x.is_nan() {
        nan_text(x.to_bits(), f64::NAN.to_bits(), 16)
    } else if x.is_infinite() {
        if x > 0.0 { "inf" } else { "-inf" }.to_string()
    } else {
        format!("{x:?}")
    }
}

/// f16 values print as their (exact) f32 value, which converts back exactly.
fn fmt_f16(x: f16) -> String {
    if x.is_nan() {
        nan_text(x.to_bits() as u64, f16::NAN.to_bits() as u64, 4)
    } else {
        fmt_f32(x.to_f32())
    }
}

fn fmt_bf16(x: bf16) -> String {
    if x.is_nan() {
        nan_text(x.to_bits() as u64, bf16::NAN.to_bits() as u64, 4)
    } else {
        fmt_f32(x.to_f32())
    }
}

fn nan_text(bits: u64, canonical: u64, digits: usize) -> String {
    if bits == canonical {
        "nan".to_string()
    } else {
        format!("nan:0x{bits:0digits$x}")
    }
}

/// A double-quoted string literal: `\"`, `\\`, `\n`, `\r`, `\t`, and
/// `\u{..}` for other control characters.
pub(super) fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A node name after `# onnx: `: as is when it reads back unchanged (no
/// control characters, no surrounding whitespace, not starting with a
/// quote), else as a quoted string.
fn comment_name(name: &str) -> String {
    let plain =
        !name.starts_with('"') && name.trim() == name && !name.chars().any(|c| c.is_control());
    if plain {
        name.to_string()
    } else {
        quote(name)
    }
}
