//! Ops whose results are known at import: `Constant`, `Shape` (from the
//! static shapes) and `ConstantOfShape`.

use super::one;
use crate::ctx::{ImportCtx, Val};
use crate::tensor::dtype_or_err;
use crate::OnnxError;
use kiln_ir::{DType, Data, Tensor};
use tract_onnx::pb::NodeProto;

type R = Result<Vec<Val>, OnnxError>;

/// `Constant` (`value`, `value_float(s)`, `value_int(s)`; sparse and string
/// values are rejected up front).
pub fn constant(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let name = ctx.node_name().to_string();
    let t = if let Some(tp) = ctx.attr_t(node, "value")? {
        ctx.tensor(tp, &name)?
    } else if let Some(f) = ctx.attr_f(node, "value_float")? {
        Tensor::scalar_f32(f)
    } else if let Some(v) = ctx.attr_floats(node, "value_floats")? {
        let n = v.len();
        Tensor::new([n], Data::F32(v)).expect("vector")
    } else if let Some(i) = ctx.attr_i(node, "value_int")? {
        Tensor::new([], Data::I64(vec![i])).expect("scalar")
    } else if let Some(v) = ctx.attr_ints(node, "value_ints")? {
        Tensor::vec_i64(v)
    } else {
        return Err(ctx.bad_attr("value", "Constant has no supported value attribute"));
    };
    one(ctx.constant(t, name))
}

/// `Shape`: the input's static shape as an i64 constant (`start`/`end`
/// from opset 15, clamped like Python slicing).
pub fn shape(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    ctx.static_shape_of(x, "Shape")?;
    let dims: Vec<i64> = ctx.ty(x).shape.iter().map(|&d| d as i64).collect();
    let r = dims.len() as i64;
    let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    let (start, end) = if ctx.opset >= 15 {
        (
            clamp(ctx.attr_i_or(node, "start", 0)?),
            clamp(ctx.attr_i_or(node, "end", r)?),
        )
    } else {
        (0, dims.len())
    };
    let v = if start < end {
        dims[start..end].to_vec()
    } else {
        vec![]
    };
    let name = ctx.node_name().to_string();
    one(ctx.constant(Tensor::vec_i64(v), name))
}

/// `ConstantOfShape`: needs a constant shape; the result counts against the
/// initializer size limit, since it stands in for one.
pub fn constant_of_shape(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let shape_t = ctx.const_input(node, 0)?;
    let dims = shape_t.to_i64_vec();
    if dims.iter().any(|&d| d < 0) {
        return Err(ctx.bad_attr("input", format!("negative dim in shape {dims:?}")));
    }
    let name = ctx.node_name().to_string();
    let (dtype, value) = match ctx.attr_t(node, "value")? {
        Some(tp) => {
            let dtype = dtype_or_err(tp.data_type, &format!("{name}.value"))?;
            let t = ctx.tensor(tp, &format!("{name}.value"))?;
            if t.len() != 1 {
                return Err(
                    ctx.bad_attr("value", format!("must hold one element, has {}", t.len()))
                );
            }
            (dtype, t)
        }
        None => (DType::F32, Tensor::scalar_f32(0.0)),
    };
    let limit = ctx.opts.max_initializer_bytes;
    let count = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
        .and_then(|n| n.checked_mul(dtype.size_bytes() as u64).map(|b| (n, b)));
    let n = match count {
        Some((n, b)) if b <= limit => {
            // Charged before the data is allocated.
            ctx.charge_generated(b)?;
            n as usize
        }
        _ => {
            return Err(OnnxError::TooLarge {
                tensor: name,
                declared_bytes: count.map_or(u64::MAX, |(_, b)| b),
                reason: format!(
                    "ConstantOfShape would create a {dims:?} {dtype} tensor, more than the limit of {limit} bytes for one tensor"
                ),
            })
        }
    };
    let data = if dtype.is_float() {
        let x = value.to_f64_vec()[0];
        Data::from_f64s(dtype, std::iter::repeat_n(x, n))
    } else {
        let x = value.to_i64_vec()[0];
        Data::from_i64s(dtype, std::iter::repeat_n(x, n))
    };
    let shape: Vec<usize> = dims.iter().map(|&d| d as usize).collect();
    one(ctx.constant(Tensor::new(&shape, data).expect("count matches"), name))
}

/// `EyeLike`: ones on diagonal `k` of a 2-D shape (the input's), as a
/// constant of `dtype` (default: the input's type).
pub fn eye_like(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let xt = ctx.ty(x).clone();
    if xt.shape.len() != 2 {
        return Err(ctx.invalid(format!("EyeLike needs a 2-D input, got {xt}")));
    }
    let name = ctx.node_name().to_string();
    let dtype = match ctx.attr_i(node, "dtype")? {
        Some(code) => dtype_or_err(code as i32, &format!("{name}.dtype"))?,
        None => xt.dtype,
    };
    let k = ctx.attr_i_or(node, "k", 0)?;
    let (rows, cols) = (xt.shape[0], xt.shape[1]);
    let ones = (0..rows * cols).map(|f| i64::from((f % cols) as i64 - (f / cols) as i64 == k));
    let data = if dtype.is_float() {
        Data::from_f64s(dtype, ones.map(|v| v as f64))
    } else {
        Data::from_i64s(dtype, ones)
    };
    let t = Tensor::new([rows, cols], data).expect("rows*cols");
    one(ctx.generated_constant(t, name)?)
}
