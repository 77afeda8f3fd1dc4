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
    // The IR's element decoding.
    let data = kiln_ir::Data::from_le_bytes(t.dtype, &t.data)?;
    Some((0..data.len()).map(|i| data.get_f64(i)).collect())
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
