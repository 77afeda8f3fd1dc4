//! Type and shape inference: the output type of an op from its input types.

use crate::op::{Conv2d, Op, Pool2d};
use crate::{DType, IrError, Shape, ValueType};

/// numpy-style broadcast of two shapes.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Shape> {
    let rank = a.len().max(b.len());
    let mut out = Shape::with_capacity(rank);
    for i in 0..rank {
        let da = if i + a.len() >= rank {
            a[i + a.len() - rank]
        } else {
            1
        };
        let db = if i + b.len() >= rank {
            b[i + b.len() - rank]
        } else {
            1
        };
        out.push(match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        });
    }
    Some(out)
}

/// Output extent of a sliding window along one axis.
pub fn window_output_len(
    input: usize,
    kernel: usize,
    stride: usize,
    pad_begin: usize,
    pad_end: usize,
    dilation: usize,
    ceil_mode: bool,
) -> Option<usize> {
    let span = dilation
        .checked_mul(kernel.checked_sub(1)?)?
        .checked_add(1)?;
    let padded = input.checked_add(pad_begin)?.checked_add(pad_end)?;
    if padded < span || stride == 0 {
        return None;
    }
    let steps = padded - span;
    let mut out = if ceil_mode {
        steps.div_ceil(stride) + 1
    } else {
        steps / stride + 1
    };
    // With ceil_mode the last window must start inside the input or left padding.
    if ceil_mode && (out - 1).checked_mul(stride)? >= input + pad_begin {
        out -= 1;
    }
    Some(out)
}

/// Row-major strides of a shape, in elements.
pub fn strides_of(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    strides
}

/// Infers the output type of `op` applied to inputs of types `inputs`.
pub fn infer(op: &Op, inputs: &[&ValueType]) -> Result<ValueType, IrError> {
    let name = op.name();
    let (lo, hi) = op.arity();
    if inputs.len() < lo || inputs.len() > hi {
        return Err(IrError::ty(
            name,
            format!("takes {lo}..={hi} inputs, got {}", inputs.len()),
        ));
    }
    let moves_data = matches!(
        op,
        Op::Reshape { .. }
            | Op::Transpose { .. }
            | Op::Concat { .. }
            | Op::Gather { .. }
            | Op::Slice { .. }
            | Op::Expand { .. }
            | Op::Where
            | Op::Cast { .. }
            | Op::Bitcast { .. }
            | Op::WithLength { .. }
    );
    if let Some(t) = inputs.iter().find(|t| t.dtype.is_narrow()) {
        if !moves_data {
            return Err(IrError::ty(
                name,
                format!(
                    "{} is a storage type: only casts and data movement take it (cast it to f32 first)",
                    t.dtype
                ),
            ));
        }
    }
    match op {
        Op::Input { .. } | Op::Constant(_) => Err(IrError::ty(
            name,
            "inputs and constants are added with add_input/add_const",
        )),
        Op::Unary(u) => {
            let x = inputs[0];
            if !(x.dtype.is_float() || u.accepts_int() && x.dtype.is_int()) {
                return Err(IrError::ty(
                    name,
                    format!("unsupported element type {}", x.dtype),
                ));
            }
            Ok(x.clone())
        }
        Op::Binary(_) => {
            let (a, b) = (inputs[0], inputs[1]);
            same_dtype(name, a, b)?;
            if a.dtype == DType::Bool {
                return Err(IrError::ty(name, "arithmetic on bool"));
            }
            let shape = broadcast_shapes(&a.shape, &b.shape)
                .ok_or_else(|| IrError::ty(name, format!("shapes {a} and {b} do not broadcast")))?;
            Ok(ValueType::new(a.dtype, shape))
        }
        Op::MatMul => infer_matmul(inputs[0], inputs[1]),
        Op::MatMulInteger => infer_matmul_integer(inputs),
        Op::Gemm {
            trans_a, trans_b, ..
        } => {
            let (a, b) = (inputs[0], inputs[1]);
            let out = dense_result(name, inputs)?;
            float_only(name, a)?;
            if a.shape.len() != 2 || b.shape.len() != 2 {
                return Err(IrError::ty(
                    name,
                    format!("A and B must be 2-D, got {a} and {b}"),
                ));
            }
            let (m, k) = if *trans_a {
                (a.shape[1], a.shape[0])
            } else {
                (a.shape[0], a.shape[1])
            };
            let (k2, n) = if *trans_b {
                (b.shape[1], b.shape[0])
            } else {
                (b.shape[0], b.shape[1])
            };
            if k != k2 {
                return Err(IrError::ty(
                    name,
                    format!("inner dimensions differ: {k} vs {k2}"),
                ));
            }
            if let Some(c) = inputs.get(2) {
                match broadcast_shapes(&c.shape, &[m, n]) {
                    Some(s) if s.as_slice() == [m, n] => {}
                    _ => {
                        return Err(IrError::ty(
                            name,
                            format!("C {c} does not broadcast to [{m},{n}]"),
                        ))
                    }
                }
            }
            Ok(ValueType::new(out, [m, n]))
        }
        Op::Conv(c) => infer_conv(c, inputs),
        Op::ConvInteger(c) => infer_conv_integer(c, inputs),
        Op::MaxPool(p) | Op::AveragePool { pool: p, .. } => {
            let x = inputs[0];
            float_only(name, x)?;
            if x.shape.len() != 4 {
                return Err(IrError::ty(
                    name,
                    format!("input must be 4-D NCHW, got {x}"),
                ));
            }
            let (oh, ow) = pool_output(name, p, x.shape[2], x.shape[3])?;
            Ok(ValueType::new(x.dtype, [x.shape[0], x.shape[1], oh, ow]))
        }
        Op::GlobalAveragePool | Op::GlobalMaxPool => {
            let x = inputs[0];
            float_only(name, x)?;
            if x.shape.len() < 3 {
                return Err(IrError::ty(
                    name,
                    format!("input must be at least 3-D, got {x}"),
                ));
            }
            let mut shape = x.shape.clone();
            for d in shape.iter_mut().skip(2) {
                *d = 1;
            }
            Ok(ValueType::new(x.dtype, shape))
        }
        Op::Softmax { axis } => {
            let x = inputs[0];
            float_only(name, x)?;
            if *axis >= x.shape.len() {
                return Err(IrError::ty(
                    name,
                    format!("axis {axis} out of range for {x}"),
                ));
            }
            Ok(x.clone())
        }
        Op::Reshape { shape } => {
            let x = inputs[0];
            // An overflowing product is not the (addressable) input size.
            let n = (shape.iter()).try_fold(1usize, |acc, &d| acc.checked_mul(d));
            if n != Some(x.num_elements()) {
                return Err(IrError::ty(
                    name,
                    format!(
                        "cannot reshape {x} ({} elements) to {:?}",
                        x.num_elements(),
                        shape.as_slice()
                    ),
                ));
            }
            Ok(ValueType::new(x.dtype, shape.as_slice()))
        }
        Op::Transpose { perm } => {
            let x = inputs[0];
            let mut seen = vec![false; x.shape.len()];
            if perm.len() != x.shape.len()
                || perm
                    .iter()
                    .any(|&p| p >= seen.len() || std::mem::replace(&mut seen[p], true))
            {
                return Err(IrError::ty(
                    name,
                    format!(
                        "{:?} is not a permutation of the axes of {x}",
                        perm.as_slice()
                    ),
                ));
            }
            Ok(ValueType::new(
                x.dtype,
                perm.iter().map(|&p| x.shape[p]).collect::<Shape>(),
            ))
        }
        Op::Concat { axis } => {
            let first = inputs[0];
            if *axis >= first.shape.len() {
                return Err(IrError::ty(
                    name,
                    format!("axis {axis} out of range for {first}"),
                ));
            }
            let mut shape = first.shape.clone();
            shape[*axis] = 0;
            for x in inputs {
                same_dtype(name, first, x)?;
                let compatible = x.shape.len() == first.shape.len()
                    && x.shape
                        .iter()
                        .zip(&first.shape)
                        .enumerate()
                        .all(|(i, (a, b))| i == *axis || a == b);
                if !compatible {
                    return Err(IrError::ty(
                        name,
                        format!("{x} does not match {first} outside axis {axis}"),
                    ));
                }
                shape[*axis] = shape[*axis]
                    .checked_add(x.shape[*axis])
                    .ok_or_else(|| IrError::ty(name, format!("axis {axis} overflows")))?;
            }
            Ok(ValueType::new(first.dtype, shape))
        }
        Op::Gather { axis } => {
            let (x, idx) = (inputs[0], inputs[1]);
            if !matches!(idx.dtype, DType::I32 | DType::I64) {
                return Err(IrError::ty(
                    name,
                    format!("indices must be i32 or i64, got {}", idx.dtype),
                ));
            }
            if *axis >= x.shape.len() {
                return Err(IrError::ty(
                    name,
                    format!("axis {axis} out of range for {x}"),
                ));
            }
            let mut shape: Shape = x.shape[..*axis].iter().copied().collect();
            shape.extend(idx.shape.iter().copied());
            shape.extend(x.shape[*axis + 1..].iter().copied());
            Ok(ValueType::new(x.dtype, shape))
        }
        Op::Slice { axes } => {
            let x = inputs[0];
            if axes.len() != x.shape.len() {
                return Err(IrError::ty(
                    name,
                    format!("{} axis specs for {x}", axes.len()),
                ));
            }
            for (i, a) in axes.iter().enumerate() {
                if a.step == 0 {
                    return Err(IrError::ty(name, "step 0"));
                }
                if a.len > 0 {
                    let last = a.start as i64 + (a.len as i64 - 1) * a.step;
                    if a.start >= x.shape[i] || last < 0 || last >= x.shape[i] as i64 {
                        return Err(IrError::ty(
                            name,
                            format!("axis {i} reads outside [0,{})", x.shape[i]),
                        ));
                    }
                }
            }
            Ok(ValueType::new(
                x.dtype,
                axes.iter().map(|a| a.len).collect::<Shape>(),
            ))
        }
        Op::Cast { to } => Ok(ValueType::new(*to, inputs[0].shape.clone())),
        Op::Bitcast { to } => {
            let x = inputs[0];
            let same_size = x.dtype.size_bytes() == to.size_bytes();
            if !same_size || (*to == DType::Bool && x.dtype != DType::Bool) {
                return Err(IrError::ty(
                    name,
                    format!(
                        "cannot reinterpret {x} as {to}: the element sizes differ or the target is bool"
                    ),
                ));
            }
            Ok(ValueType::new(*to, x.shape.clone()))
        }
        Op::Compare(_) => {
            let (a, b) = (inputs[0], inputs[1]);
            same_dtype(name, a, b)?;
            Ok(ValueType::new(DType::Bool, broadcast2(name, a, b)?))
        }
        Op::Logical(_) => {
            let (a, b) = (inputs[0], inputs[1]);
            bool_only(name, a)?;
            bool_only(name, b)?;
            Ok(ValueType::new(DType::Bool, broadcast2(name, a, b)?))
        }
        Op::Bitwise(_) => {
            let (a, b) = (inputs[0], inputs[1]);
            same_dtype(name, a, b)?;
            if !a.dtype.is_int() {
                return Err(IrError::ty(
                    name,
                    format!("needs integer inputs, got {}", a.dtype),
                ));
            }
            Ok(ValueType::new(a.dtype, broadcast2(name, a, b)?))
        }
        Op::BitwiseNot => {
            let x = inputs[0];
            if !x.dtype.is_int() {
                return Err(IrError::ty(
                    name,
                    format!("needs an integer input, got {}", x.dtype),
                ));
            }
            Ok(x.clone())
        }
        Op::Not => {
            bool_only(name, inputs[0])?;
            Ok(inputs[0].clone())
        }
        Op::Where => {
            let (c, x, y) = (inputs[0], inputs[1], inputs[2]);
            bool_only(name, c)?;
            same_dtype(name, x, y)?;
            let xy = broadcast2(name, x, y)?;
            let shape = broadcast_shapes(&c.shape, &xy).ok_or_else(|| {
                IrError::ty(
                    name,
                    format!("condition {c} does not broadcast with {x} and {y}"),
                )
            })?;
            Ok(ValueType::new(x.dtype, shape))
        }
        Op::Reduce {
            op,
            axes,
            keep_dims,
        } => {
            let x = inputs[0];
            if !(x.dtype.is_float() || op.accepts_int() && x.dtype.is_int()) {
                return Err(IrError::ty(
                    name,
                    format!("unsupported element type {}", x.dtype),
                ));
            }
            let rank = x.shape.len();
            if axes.windows(2).any(|w| w[0] >= w[1]) || axes.iter().any(|&a| a >= rank) {
                return Err(IrError::ty(
                    name,
                    format!(
                        "axes {:?} must be strictly increasing and below the rank of {x}",
                        axes.as_slice()
                    ),
                ));
            }
            let mut shape = Shape::new();
            for (d, &n) in x.shape.iter().enumerate() {
                if !axes.contains(&d) {
                    shape.push(n);
                } else if *keep_dims {
                    shape.push(1);
                }
            }
            Ok(ValueType::new(x.dtype, shape))
        }
        Op::Expand { shape } => {
            let x = inputs[0];
            match broadcast_shapes(&x.shape, shape) {
                Some(s) if s.as_slice() == shape.as_slice() => {
                    Ok(ValueType::new(x.dtype, shape.as_slice()))
                }
                _ => Err(IrError::ty(
                    name,
                    format!("{x} does not broadcast to {:?}", shape.as_slice()),
                )),
            }
        }
        Op::Attention { .. } => infer_attention(inputs),
        Op::LayerNorm { axis, .. } => {
            let x = inputs[0];
            float_only(name, x)?;
            if *axis >= x.shape.len() {
                return Err(IrError::ty(
                    name,
                    format!("axis {axis} out of range for {x}"),
                ));
            }
            let normalized = &x.shape[*axis..];
            for p in &inputs[1..] {
                same_dtype(name, x, p)?;
                match broadcast_shapes(&p.shape, normalized) {
                    Some(s) if s.as_slice() == normalized => {}
                    _ => {
                        return Err(IrError::ty(
                            name,
                            format!(
                                "{p} does not broadcast to the normalized shape {normalized:?}"
                            ),
                        ))
                    }
                }
            }
            Ok(x.clone())
        }
        Op::Resize(r) => {
            let x = inputs[0];
            float_only(name, x)?;
            let rank = x.shape.len();
            if r.shape.len() != rank || r.scales.len() != rank {
                return Err(IrError::ty(
                    name,
                    format!(
                        "{} output dims and {} scales for {x}",
                        r.shape.len(),
                        r.scales.len()
                    ),
                ));
            }
            let crop = r.coord == crate::CoordinateTransform::TfCropAndResize;
            if r.roi.len() != if crop { rank } else { 0 } {
                return Err(IrError::ty(
                    name,
                    format!(
                        "{} roi axes with coord={} for {x}",
                        r.roi.len(),
                        r.coord.name()
                    ),
                ));
            }
            for (axis, (&n, &s)) in r.shape.iter().zip(&r.scales).enumerate() {
                if n == 0 || x.shape[axis] == 0 || !(s.is_finite() && s > 0.0) {
                    return Err(IrError::ty(
                        name,
                        format!("axis {axis}: size {n}, scale {s} for {x}"),
                    ));
                }
            }
            Ok(ValueType::new(x.dtype, r.shape.as_slice()))
        }
        Op::Fused(k) => k.infer(inputs),
        Op::NonZero => {
            let x = inputs[0];
            if x.shape.is_empty() {
                return Err(IrError::ty(
                    name,
                    "takes a tensor of rank 1 or more, got a scalar",
                ));
            }
            Ok(ValueType::new(
                DType::I64,
                [x.shape.len(), x.num_elements()].as_slice(),
            ))
        }
        Op::Unique { .. } => {
            let keys = inputs[0];
            if !matches!(keys.dtype, DType::F64 | DType::I64) || keys.shape.len() != 3 {
                return Err(IrError::ty(
                    name,
                    format!("takes keys f64 or i64 [outer, n, inner], got {keys}"),
                ));
            }
            Ok(ValueType::new(
                DType::I64,
                [3 * keys.shape[1] + 1].as_slice(),
            ))
        }
        Op::NonMaxSuppression(n) => {
            let (boxes, scores) = (inputs[0], inputs[1]);
            let (b, s) = (&boxes.shape, &scores.shape);
            let scalar = |t: &ValueType, d: DType| t.dtype == d && t.shape.is_empty();
            let fits = boxes.dtype == DType::F32
                && scores.dtype == DType::F32
                && scalar(inputs[2], DType::I64)
                && scalar(inputs[3], DType::F32)
                && scalar(inputs[4], DType::F32)
                && b.len() == 3
                && b[2] == 4
                && s.len() == 3
                && s[0] == b[0]
                && s[2] == b[1];
            if !fits {
                return Err(IrError::ty(
                    name,
                    format!(
                        "takes boxes f32[B,N,4], scores f32[B,C,N], an i64 cap and f32 thresholds as scalars, got {}",
                        inputs.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ")
                    ),
                ));
            }
            let bound = n.at([b[0], s[1], b[1]], 0, 0.0, 0.0).bound();
            Ok(ValueType::new(DType::I64, [bound + 1, 3].as_slice()))
        }
        Op::WithLength { axis } => {
            let (x, length) = (inputs[0], inputs[1]);
            if *axis >= x.shape.len() {
                return Err(IrError::ty(
                    name,
                    format!("axis {axis} out of range for {x}"),
                ));
            }
            if length.dtype != DType::I64 || !length.shape.is_empty() {
                return Err(IrError::ty(
                    name,
                    format!("the length must be an i64 scalar, got {length}"),
                ));
            }
            Ok(x.clone())
        }
        Op::Col2Im(c) => {
            let x = inputs[0];
            float_only(name, x)?;
            let block = c.block[0] * c.block[1];
            let grid = c.grid[0] * c.grid[1];
            if x.shape.len() != 3
                || block == 0
                || !x.shape[1].is_multiple_of(block)
                || x.shape[2] != grid
            {
                return Err(IrError::ty(
                    name,
                    format!(
                        "input must be [N, C*{block}, {grid}] for block {:?} and grid {:?}, got {x}",
                        c.block, c.grid
                    ),
                ));
            }
            if c.strides.contains(&0) || c.dilations.contains(&0) || c.image.contains(&0) {
                return Err(IrError::ty(name, "zero stride, dilation or image size"));
            }
            Ok(ValueType::new(
                x.dtype,
                [x.shape[0], x.shape[1] / block, c.image[0], c.image[1]],
            ))
        }
    }
}

fn broadcast2(op: &'static str, a: &ValueType, b: &ValueType) -> Result<Shape, IrError> {
    broadcast_shapes(&a.shape, &b.shape)
        .ok_or_else(|| IrError::ty(op, format!("shapes {a} and {b} do not broadcast")))
}

fn bool_only(op: &'static str, x: &ValueType) -> Result<(), IrError> {
    if x.dtype != DType::Bool {
        return Err(IrError::ty(
            op,
            format!("needs a bool input, got {}", x.dtype),
        ));
    }
    Ok(())
}

fn same_dtype(op: &'static str, a: &ValueType, b: &ValueType) -> Result<(), IrError> {
    if a.dtype != b.dtype {
        return Err(IrError::ty(
            op,
            format!("element types differ: {} and {}", a.dtype, b.dtype),
        ));
    }
    Ok(())
}

fn float_only(op: &'static str, x: &ValueType) -> Result<(), IrError> {
    if !x.dtype.is_float() {
        return Err(IrError::ty(
            op,
            format!("needs a float input, got {}", x.dtype),
        ));
    }
    Ok(())
}

/// The result type of MatMul, Gemm and Conv. Operands of one type give
/// that type (ONNX semantics); a bf16 or f16 operand makes the op a
/// reduced-precision dense op: its operands may mix f32, bf16 and f16 (each
/// widened exactly to f32), it accumulates in f32 and returns f32, so the
/// precision of the storage is in the value types and the math is fixed.
pub fn dense_result(op: &'static str, inputs: &[&ValueType]) -> Result<DType, IrError> {
    let first = inputs[0].dtype;
    if inputs.iter().all(|t| t.dtype == first) && !is_half(first) {
        return Ok(first);
    }
    if !inputs.iter().any(|t| is_half(t.dtype)) {
        same_dtype(op, inputs[0], inputs[1])?;
        same_dtype(op, inputs[0], inputs[inputs.len() - 1])?;
    }
    match inputs
        .iter()
        .find(|t| !matches!(t.dtype, DType::F32 | DType::BF16 | DType::F16))
    {
        Some(t) => Err(IrError::ty(
            op,
            format!(
                "a reduced-precision {op} takes f32, bf16 or f16 operands, got {}",
                t.dtype
            ),
        )),
        None => Ok(DType::F32),
    }
}

/// Whether `d` is a 16-bit float type (stored reduced precision).
pub fn is_half(d: DType) -> bool {
    matches!(d, DType::BF16 | DType::F16)
}

fn infer_matmul(a: &ValueType, b: &ValueType) -> Result<ValueType, IrError> {
    let out = dense_result("matmul", &[a, b])?;
    if a.dtype == DType::Bool {
        return Err(IrError::ty(
            "matmul",
            format!("unsupported operands {a} and {b}"),
        ));
    }
    Ok(ValueType::new(out, matmul_shape("matmul", a, b)?))
}

/// Attention: f32 Q `[..., M, K]`, Kt `[..., K, N]`, V `[..., N, D]`
/// with equal batch dims, an optional mask broadcasting to `[..., M, N]`;
/// the result `[..., M, D]`.
fn infer_attention(inputs: &[&ValueType]) -> Result<ValueType, IrError> {
    let name = "attention";
    let (q, kt, v) = (inputs[0], inputs[1], inputs[2]);
    for t in inputs {
        if t.dtype != DType::F32 {
            return Err(IrError::ty(name, format!("operands must be f32, got {t}")));
        }
    }
    let rank = q.shape.len();
    let same_rank = rank >= 2 && kt.shape.len() == rank && v.shape.len() == rank;
    let batch = &q.shape[..rank.saturating_sub(2)];
    if !same_rank || kt.shape[..rank - 2] != *batch || v.shape[..rank - 2] != *batch {
        return Err(IrError::ty(
            name,
            format!("Q {q}, Kt {kt} and V {v} need the same rank (at least 2) and batch dims"),
        ));
    }
    let (m, k) = (q.shape[rank - 2], q.shape[rank - 1]);
    let (k2, n) = (kt.shape[rank - 2], kt.shape[rank - 1]);
    let (n2, d) = (v.shape[rank - 2], v.shape[rank - 1]);
    if k != k2 || n != n2 {
        return Err(IrError::ty(
            name,
            format!("inner dimensions differ: Q {q}, Kt {kt}, V {v}"),
        ));
    }
    let mut scores: Vec<usize> = batch.to_vec();
    scores.extend([m, n]);
    if let Some(mask) = inputs.get(3) {
        if broadcast_shapes(&mask.shape, &scores).as_deref() != Some(scores.as_slice()) {
            return Err(IrError::ty(
                name,
                format!("mask {mask} does not broadcast to the scores {scores:?}"),
            ));
        }
    }
    let mut out = batch.to_vec();
    out.extend([m, d]);
    Ok(ValueType::new(DType::F32, out))
}

/// MatMulInteger: u8/i8 operands, zero points of their types (A's a
/// scalar, B's a scalar or one per column), i32 out.
fn infer_matmul_integer(inputs: &[&ValueType]) -> Result<ValueType, IrError> {
    let name = "matmul_integer";
    let (a, b, az, bz) = (inputs[0], inputs[1], inputs[2], inputs[3]);
    for t in [a, b] {
        if !matches!(t.dtype, DType::U8 | DType::I8) {
            return Err(IrError::ty(
                name,
                format!("operands must be u8 or i8, got {t}"),
            ));
        }
    }
    let shape = matmul_shape(name, a, b)?;
    same_dtype(name, a, az)?;
    same_dtype(name, b, bz)?;
    if az.num_elements() != 1 || az.shape.len() > 1 {
        return Err(IrError::ty(
            name,
            format!("A's zero point must be a scalar, got {az}"),
        ));
    }
    let n = if b.shape.len() > 1 {
        b.shape[b.shape.len() - 1]
    } else {
        1
    };
    let per_column = bz.shape.len() == 1 && bz.shape[0] == n;
    let scalar = bz.num_elements() == 1 && bz.shape.len() <= 1;
    if !(scalar || per_column) {
        return Err(IrError::ty(
            name,
            format!("B's zero point must be a scalar or one per column ({n}), got {bz}"),
        ));
    }
    Ok(ValueType::new(DType::I32, shape))
}

/// The numpy MatMul result shape of `a @ b`.
fn matmul_shape(name: &'static str, a: &ValueType, b: &ValueType) -> Result<Shape, IrError> {
    if a.shape.is_empty() || b.shape.is_empty() {
        return Err(IrError::ty(
            name,
            format!("unsupported operands {a} and {b}"),
        ));
    }
    // 1-D operands are promoted to matrices and the added dim removed after.
    let a2: Shape = if a.shape.len() == 1 {
        Shape::from_slice(&[1, a.shape[0]])
    } else {
        a.shape.clone()
    };
    let b2: Shape = if b.shape.len() == 1 {
        Shape::from_slice(&[b.shape[0], 1])
    } else {
        b.shape.clone()
    };
    let (m, k) = (a2[a2.len() - 2], a2[a2.len() - 1]);
    let (k2, n) = (b2[b2.len() - 2], b2[b2.len() - 1]);
    if k != k2 {
        return Err(IrError::ty(
            name,
            format!("inner dimensions differ: {a} @ {b}"),
        ));
    }
    let batch = broadcast_shapes(&a2[..a2.len() - 2], &b2[..b2.len() - 2])
        .ok_or_else(|| IrError::ty(name, format!("batch dims of {a} and {b} do not broadcast")))?;
    let mut shape = batch;
    if a.shape.len() > 1 {
        shape.push(m);
    }
    if b.shape.len() > 1 {
        shape.push(n);
    }
    Ok(shape)
}

fn infer_conv(c: &Conv2d, inputs: &[&ValueType]) -> Result<ValueType, IrError> {
    let name = "conv";
    let out = dense_result(name, inputs)?;
    float_only(name, inputs[0])?;
    let shape = conv_shape(name, c, inputs)?;
    Ok(ValueType::new(out, shape))
}

/// ConvInteger: u8/i8 X and W, X's zero point a scalar, W's a scalar or
/// one per output channel, i32 out.
fn infer_conv_integer(c: &Conv2d, inputs: &[&ValueType]) -> Result<ValueType, IrError> {
    let name = "conv_integer";
    let (x, w, xz, wz) = (inputs[0], inputs[1], inputs[2], inputs[3]);
    for t in [x, w] {
        if !matches!(t.dtype, DType::U8 | DType::I8) {
            return Err(IrError::ty(
                name,
                format!("operands must be u8 or i8, got {t}"),
            ));
        }
    }
    same_dtype(name, x, xz)?;
    same_dtype(name, w, wz)?;
    let shape = conv_shape(name, c, &inputs[..2])?;
    if xz.num_elements() != 1 || xz.shape.len() > 1 {
        return Err(IrError::ty(
            name,
            format!("X's zero point must be a scalar, got {xz}"),
        ));
    }
    let m = w.shape[0];
    let scalar = wz.num_elements() == 1 && wz.shape.len() <= 1;
    let per_channel = wz.shape.len() == 1 && wz.shape[0] == m;
    if !(scalar || per_channel) {
        return Err(IrError::ty(
            name,
            format!("W's zero point must be a scalar or one per output channel ({m}), got {wz}"),
        ));
    }
    Ok(ValueType::new(DType::I32, shape))
}

/// The output shape of a convolution of X by W (and, when given, the bias
/// check).
fn conv_shape(name: &'static str, c: &Conv2d, inputs: &[&ValueType]) -> Result<Shape, IrError> {
    let (x, w) = (inputs[0], inputs[1]);
    if x.shape.len() != 4 || w.shape.len() != 4 {
        return Err(IrError::ty(
            name,
            format!("X and W must be 4-D, got {x} and {w}"),
        ));
    }
    let (cin, cout) = (x.shape[1], w.shape[0]);
    if c.group == 0 || cin % c.group != 0 || cout % c.group != 0 || w.shape[1] * c.group != cin {
        return Err(IrError::ty(
            name,
            format!(
                "W {w} does not fit {cin} input channels in {} groups",
                c.group
            ),
        ));
    }
    if let Some(b) = inputs.get(2) {
        if b.shape.as_slice() != [cout] {
            return Err(IrError::ty(name, format!("bias must be [{cout}], got {b}")));
        }
    }
    let pool = Pool2d {
        kernel: [w.shape[2], w.shape[3]],
        strides: c.strides,
        pads: c.pads,
        dilations: c.dilations,
        ceil_mode: false,
    };
    let (oh, ow) = pool_output(name, &pool, x.shape[2], x.shape[3])?;
    Ok(Shape::from_slice(&[x.shape[0], cout, oh, ow]))
}

fn pool_output(
    op: &'static str,
    p: &Pool2d,
    h: usize,
    w: usize,
) -> Result<(usize, usize), IrError> {
    let oh = window_output_len(
        h,
        p.kernel[0],
        p.strides[0],
        p.pads[0],
        p.pads[2],
        p.dilations[0],
        p.ceil_mode,
    );
    let ow = window_output_len(
        w,
        p.kernel[1],
        p.strides[1],
        p.pads[1],
        p.pads[3],
        p.dilations[1],
        p.ceil_mode,
    );
    match (oh, ow) {
        (Some(oh), Some(ow)) if oh > 0 && ow > 0 => Ok((oh, ow)),
        _ => Err(IrError::ty(
            op,
            format!(
                "window {:?} does not fit input {h}x{w} with pads {:?}",
                p.kernel, p.pads
            ),
        )),
    }
}
