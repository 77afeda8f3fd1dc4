//! Comparing outputs with reference tensors (`kiln run --check`, tests).

use kiln_runtime::Tensor;

/// How one output compares with its reference.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    /// Output name.
    pub name: String,
    /// Largest absolute difference (0 for exact integer matches).
    pub max_abs_error: f64,
    /// Largest absolute reference value (the output's scale).
    pub scale: f64,
    /// `max_abs_error / scale` (or the absolute error when the scale is 0).
    pub rel_error: f64,
    /// Why the comparison failed outright (type/shape mismatch), if it did.
    pub mismatch: Option<String>,
}

impl Comparison {
    /// Whether the output is within `tolerance` relative to the output scale.
    /// Integer and bool outputs must match exactly.
    pub fn passes(&self, tolerance: f64) -> bool {
        self.mismatch.is_none() && self.rel_error <= tolerance
    }
}

fn as_f64s(t: &Tensor) -> Option<Vec<f64>> {
    use kiln_runtime::DType::*;
    Some(match t.dtype {
        F32 => t.to_vec::<f32>()?.into_iter().map(f64::from).collect(),
        F64 => t.to_vec::<f64>()?,
        I8 => t.to_vec::<i8>()?.into_iter().map(f64::from).collect(),
        U8 => t.to_vec::<u8>()?.into_iter().map(f64::from).collect(),
        I16 => t.to_vec::<i16>()?.into_iter().map(f64::from).collect(),
        I32 => t.to_vec::<i32>()?.into_iter().map(f64::from).collect(),
        I64 => t.to_vec::<i64>()?.into_iter().map(|x| x as f64).collect(),
        U16 => t.to_vec::<u16>()?.into_iter().map(f64::from).collect(),
        U32 => t.to_vec::<u32>()?.into_iter().map(f64::from).collect(),
        U64 => t.to_vec::<u64>()?.into_iter().map(|x| x as f64).collect(),
        F16 | BF16 => t
            .data
            .chunks_exact(2)
            .map(|c| {
                let bits = u16::from_le_bytes([c[0], c[1]]);
                if t.dtype == F16 {
                    half::f16::from_bits(bits).to_f64()
                } else {
                    half::bf16::from_bits(bits).to_f64()
                }
            })
            .collect(),
        Bool => t
            .to_vec::<bool>()?
            .into_iter()
            .map(|b| b as u8 as f64)
            .collect(),
    })
}

/// Compares `actual` with `reference` elementwise.
pub fn compare(actual: &Tensor, reference: &Tensor) -> Comparison {
    let mut c = Comparison {
        name: actual.name.clone(),
        max_abs_error: 0.0,
        scale: 0.0,
        rel_error: 0.0,
        mismatch: None,
    };
    if actual.dtype != reference.dtype || actual.shape != reference.shape {
        c.mismatch = Some(format!(
            "got {}, reference is {}",
            actual.type_string(),
            reference.type_string()
        ));
        return c;
    }
    let (Some(a), Some(r)) = (as_f64s(actual), as_f64s(reference)) else {
        c.mismatch = Some(format!("cannot compare {} values", actual.dtype));
        return c;
    };
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
}
