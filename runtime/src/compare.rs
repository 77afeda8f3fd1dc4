//! Comparing an output with its expected value: the one metric of `kiln run
//! --check`, `kiln verify` and [`Model::verify`](crate::Model::verify).

use crate::format::DType;
use crate::Tensor;

/// How one output compares with its reference.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    /// Output name.
    pub name: String,
    /// Largest absolute difference (0 for exact integer matches).
    pub max_abs_error: f64,
    /// Largest finite absolute reference value (the output's scale).
    pub scale: f64,
    /// `max_abs_error / scale` (or the absolute error when the scale is 0).
    pub rel_error: f64,
    /// Why the comparison failed outright (type/shape mismatch), if it did.
    pub mismatch: Option<String>,
}

impl Comparison {
    /// Whether the output is within `tolerance` relative to the output
    /// scale. A NaN where the reference has a number (or the reverse) is
    /// an infinite error.
    pub fn passes(&self, tolerance: f64) -> bool {
        self.mismatch.is_none() && self.rel_error <= tolerance
    }
}

/// The elements of `data` (of type `dtype`) as f64, `None` for the packed
/// sub-byte and 8-bit float types.
pub(crate) fn as_f64s(dtype: DType, data: &[u8]) -> Option<Vec<f64>> {
    fn each<const N: usize>(data: &[u8], f: impl Fn([u8; N]) -> f64) -> Vec<f64> {
        (data.chunks_exact(N))
            .map(|c| f(c.try_into().expect("N bytes")))
            .collect()
    }
    let values = match dtype {
        DType::F32 => each(data, |b| f32::from_le_bytes(b).into()),
        DType::F64 => each(data, f64::from_le_bytes),
        DType::F16 => each(data, |b| half::f16::from_le_bytes(b).to_f64()),
        DType::BF16 => each(data, |b| half::bf16::from_le_bytes(b).to_f64()),
        DType::I8 => each(data, |b| i8::from_le_bytes(b).into()),
        DType::U8 => each(data, |b| u8::from_le_bytes(b).into()),
        DType::Bool => each(data, |[b]| f64::from(u8::from(b != 0))),
        DType::I16 => each(data, |b| i16::from_le_bytes(b).into()),
        DType::U16 => each(data, |b| u16::from_le_bytes(b).into()),
        DType::I32 => each(data, |b| i32::from_le_bytes(b).into()),
        DType::U32 => each(data, |b| u32::from_le_bytes(b).into()),
        DType::I64 => each(data, |b| i64::from_le_bytes(b) as f64),
        DType::U64 => each(data, |b| u64::from_le_bytes(b) as f64),
        _ => return None,
    };
    Some(values)
}

/// Compares `actual` with `reference` elementwise.
pub fn compare(actual: &Tensor, reference: &Tensor) -> Comparison {
    compare_data(
        &actual.name,
        (actual.dtype, &actual.shape, &actual.data),
        (reference.dtype, &reference.shape, &reference.data),
    )
}

/// [`compare`] on borrowed element bytes: `(dtype, shape, data)` each.
pub fn compare_data(
    name: &str,
    actual: (DType, &[u64], &[u8]),
    reference: (DType, &[u64], &[u8]),
) -> Comparison {
    let mut c = Comparison {
        name: name.to_owned(),
        max_abs_error: 0.0,
        scale: 0.0,
        rel_error: 0.0,
        mismatch: None,
    };
    let ty = |(dtype, shape, _): (DType, &[u64], &[u8])| crate::format::type_string(dtype, shape);
    if actual.0 != reference.0 || actual.1 != reference.1 {
        c.mismatch = Some(format!(
            "got {}, reference is {}",
            ty(actual),
            ty(reference)
        ));
        return c;
    }
    let (Some(a), Some(r)) = (
        as_f64s(actual.0, actual.2),
        as_f64s(reference.0, reference.2),
    ) else {
        c.mismatch = Some(format!("cannot compare {} values", actual.0));
        return c;
    };
    if a.len() != r.len() {
        c.mismatch = Some(format!(
            "{} values against {} in the reference",
            a.len(),
            r.len()
        ));
        return c;
    }
    for (x, y) in a.iter().zip(&r) {
        let err = if x.is_nan() && y.is_nan() || x == y {
            0.0
        } else {
            (x - y).abs()
        };
        c.max_abs_error = c
            .max_abs_error
            .max(if err.is_nan() { f64::INFINITY } else { err });
        if y.is_finite() {
            c.scale = c.scale.max(y.abs());
        }
    }
    c.rel_error = if c.scale > 0.0 {
        c.max_abs_error / c.scale
    } else {
        c.max_abs_error
    };
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_to_scale() {
        let r = Tensor::from_f32("y", &[3], &[10.0, -20.0, 5.0]);
        let a = Tensor::from_f32("y", &[3], &[10.0, -20.002, 5.0]);
        let c = compare(&a, &r);
        assert!((c.rel_error - 1e-4).abs() < 1e-6, "{c:?}");
        assert!(!c.passes(0.5e-4));
        assert!(c.passes(2e-4));
    }

    #[test]
    fn shape_mismatch_fails() {
        let r = Tensor::from_f32("y", &[2], &[1.0, 2.0]);
        let a = Tensor::from_f32("y", &[1, 2], &[1.0, 2.0]);
        assert!(!compare(&a, &r).passes(1.0));
    }

    #[test]
    fn nan_against_number_fails() {
        let r = Tensor::from_f32("y", &[1], &[1.0]);
        let a = Tensor::from_f32("y", &[1], &[f32::NAN]);
        assert!(!compare(&a, &r).passes(1e-3));
    }

    #[test]
    fn half_and_integer_values_decode() {
        let bits = half::f16::from_f32(1.5).to_le_bytes();
        assert_eq!(as_f64s(DType::F16, &bits), Some(vec![1.5]));
        let r = Tensor::from_i64("i", &[2], &[3, -4]);
        let a = Tensor::from_i64("i", &[2], &[3, -5]);
        assert_eq!(compare(&a, &r).max_abs_error, 1.0);
    }
}
