//! The GOLDEN section (format version 4): input sets stored with the
//! outputs the source model gives for them, and a tolerance per output, so
//! that an artifact can check itself on the machine it lands on (`kiln
//! verify`, `Model::verify`).
//!
//! Encoding, all little-endian: the set count, then per set its inputs and
//! its expected outputs as tensors (name, dtype code, rank, dims, byte
//! length, bytes), then the tolerance count and per output its name and the
//! tolerance as an f64. An artifact without a self-test has an empty
//! section (zero bytes); its sets are empty.

use std::borrow::Cow;
use std::collections::HashSet;

use super::cursor::{Reader, Writer};
use super::encode::tensor_head;
use super::{type_string, DType, FormatError, SectionKind};

/// One stored tensor: a golden input or an expected output, dense and
/// row-major in little-endian bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GoldenTensor<'a> {
    /// The graph input's or output's name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Dimensions.
    pub shape: Vec<u64>,
    /// `shape`'s elements of `dtype` (checked when decoded).
    pub data: Cow<'a, [u8]>,
}

impl GoldenTensor<'_> {
    /// The type as written in messages: `f32[1,3]`.
    pub fn type_string(&self) -> String {
        type_string(self.dtype, &self.shape)
    }

    fn into_owned(self) -> GoldenTensor<'static> {
        GoldenTensor {
            name: self.name,
            dtype: self.dtype,
            shape: self.shape,
            data: Cow::Owned(self.data.into_owned()),
        }
    }
}

/// One input set and the outputs expected for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GoldenSet<'a> {
    /// Every graph input.
    pub inputs: Vec<GoldenTensor<'a>>,
    /// Every graph output, as the source model computes it.
    pub outputs: Vec<GoldenTensor<'a>>,
}

/// How far an output may be from its expected value: the largest absolute
/// error divided by the expected output's scale (its largest finite
/// magnitude), as `kiln run --check` measures. Integer and boolean outputs
/// must match exactly.
#[derive(Clone, Debug, PartialEq)]
pub struct Tolerance {
    /// The output.
    pub output: String,
    /// The bound on max |got − expected| / scale.
    pub max_rel_error: f64,
}

/// The self-test of an artifact: empty when it was compiled without one.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Golden<'a> {
    /// The input sets, in the order given at compile time.
    pub sets: Vec<GoldenSet<'a>>,
    /// One per graph output (empty when `sets` is).
    pub tolerances: Vec<Tolerance>,
}

// Tolerances are finite by construction (checked when decoded), so
// equality is an equivalence.
impl Eq for Golden<'_> {}

impl Golden<'_> {
    /// Whether the artifact has a self-test.
    pub fn is_empty(&self) -> bool {
        self.sets.is_empty()
    }

    /// The tolerance of `output`.
    pub fn tolerance(&self, output: &str) -> Option<f64> {
        (self.tolerances.iter())
            .find(|t| t.output == output)
            .map(|t| t.max_rel_error)
    }

    /// A copy that owns its tensors.
    pub fn into_owned(self) -> Golden<'static> {
        let owned =
            |ts: Vec<GoldenTensor<'_>>| ts.into_iter().map(GoldenTensor::into_owned).collect();
        Golden {
            sets: (self.sets.into_iter())
                .map(|s| GoldenSet {
                    inputs: owned(s.inputs),
                    outputs: owned(s.outputs),
                })
                .collect(),
            tolerances: self.tolerances,
        }
    }
}

/// The section's bytes (none for an empty self-test).
pub(crate) fn encode(g: &Golden<'_>) -> Vec<u8> {
    let mut w = Writer::default();
    if g.is_empty() {
        return w.0;
    }
    w.len(g.sets.len());
    for set in &g.sets {
        tensors(&mut w, &set.inputs);
        tensors(&mut w, &set.outputs);
    }
    w.len(g.tolerances.len());
    for t in &g.tolerances {
        w.str(&t.output);
        w.u64(t.max_rel_error.to_bits());
    }
    w.0
}

fn tensors(w: &mut Writer, ts: &[GoldenTensor<'_>]) {
    w.len(ts.len());
    for t in ts {
        tensor_head(w, &t.name, t.dtype, &t.shape);
        w.u64(t.data.len() as u64);
        w.bytes(&t.data);
    }
}

/// Smallest encoded tensor: an empty name, the dtype, rank 0, the length.
const MIN_TENSOR: usize = 4 + 1 + 4 + 8;
/// Smallest encoded set: two empty tensor lists.
const MIN_SET: usize = 4 + 4;
/// Smallest encoded tolerance: an empty name and the f64.
const MIN_TOLERANCE: usize = 4 + 8;

/// Decodes and validates the section, borrowing the tensors' bytes: every
/// tensor's bytes match its type, names are unique within a list, and
/// tolerances are finite and not negative.
pub(crate) fn decode(bytes: &[u8]) -> Result<Golden<'_>, FormatError> {
    if bytes.is_empty() {
        return Ok(Golden::default());
    }
    let mut r = Reader::new(bytes, SectionKind::Golden);
    let count = r.count("golden set count", MIN_SET)?;
    let mut sets = Vec::with_capacity(count);
    for i in 0..count {
        let inputs = tensor_list(&mut r, &format!("golden set {i} input"))?;
        let outputs = tensor_list(&mut r, &format!("golden set {i} output"))?;
        sets.push(GoldenSet { inputs, outputs });
    }
    let count = r.count("tolerance count", MIN_TOLERANCE)?;
    let mut tolerances = Vec::with_capacity(count);
    for _ in 0..count {
        let output = r.str("tolerance output")?;
        let max_rel_error = f64::from_bits(r.u64("tolerance")?);
        if !(max_rel_error.is_finite() && max_rel_error >= 0.0) {
            return Err(r.error(format!(
                "the tolerance of '{output}' is {max_rel_error}; it must be finite and not negative"
            )));
        }
        tolerances.push(Tolerance {
            output,
            max_rel_error,
        });
    }
    r.finish()?;
    if sets.is_empty() {
        return Err(FormatError::Malformed {
            section: SectionKind::Golden,
            detail: "a non-empty section holds no golden set".into(),
        });
    }
    Ok(Golden { sets, tolerances })
}

fn tensor_list<'a>(r: &mut Reader<'a>, what: &str) -> Result<Vec<GoldenTensor<'a>>, FormatError> {
    let count = r.count(&format!("{what} count"), MIN_TENSOR)?;
    let mut out: Vec<GoldenTensor<'a>> = Vec::with_capacity(count);
    let mut names = HashSet::with_capacity(count);
    for _ in 0..count {
        let (name, dtype, shape) = super::decode::tensor_head(r, what)?;
        let len = r.u64(&format!("byte length of {what} '{name}'"))?;
        let expected =
            (shape.iter()).try_fold(dtype.size_bytes() as u64, |acc, &d| acc.checked_mul(d));
        if expected != Some(len) {
            return Err(r.error(format!(
                "{what} '{name}' is {} but holds {len} bytes",
                type_string(dtype, &shape)
            )));
        }
        let data = r.take(len, &format!("{what} '{name}'"))?;
        if !names.insert(name.clone()) {
            return Err(r.error(format!("{what} '{name}' appears twice")));
        }
        out.push(GoldenTensor {
            name,
            dtype,
            shape,
            data: Cow::Borrowed(data),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Golden<'static> {
        let t = |name: &str, v: &[f32]| GoldenTensor {
            name: name.into(),
            dtype: DType::F32,
            shape: vec![v.len() as u64],
            data: Cow::Owned(v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        };
        Golden {
            sets: vec![
                GoldenSet {
                    inputs: vec![t("x", &[1.0, 2.0])],
                    outputs: vec![t("y", &[3.0])],
                },
                GoldenSet {
                    inputs: vec![t("x", &[0.5, -1.0])],
                    outputs: vec![t("y", &[-0.5])],
                },
            ],
            tolerances: vec![Tolerance {
                output: "y".into(),
                max_rel_error: 1e-4,
            }],
        }
    }

    #[test]
    fn round_trips_and_borrows() {
        let g = sample();
        let bytes = encode(&g);
        let back = decode(&bytes).unwrap();
        assert!(matches!(back.sets[0].inputs[0].data, Cow::Borrowed(_)));
        assert_eq!(back.into_owned(), g);
        assert_eq!(decode(&[]).unwrap(), Golden::default());
        assert!(encode(&Golden::default()).is_empty());
    }

    #[test]
    fn a_tensor_whose_bytes_do_not_match_its_type_is_refused() {
        let mut g = sample();
        g.sets[1].outputs[0].shape = vec![2];
        let err = decode(&encode(&g)).unwrap_err().to_string();
        assert!(err.contains("'y' is f32[2] but holds 4 bytes"), "{err}");
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let bytes = encode(&sample());
        for len in 1..bytes.len() {
            assert!(decode(&bytes[..len]).is_err(), "{len}");
        }
    }

    #[test]
    fn a_negative_or_nan_tolerance_is_refused() {
        for bad in [-1.0, f64::NAN, f64::INFINITY] {
            let mut g = sample();
            g.tolerances[0].max_rel_error = bad;
            assert!(decode(&encode(&g)).is_err(), "{bad}");
        }
    }
}
