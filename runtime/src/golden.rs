//! The artifact's self-test ([`Model::verify`]): every golden input set of
//! the GOLDEN section runs on this machine, and every output is compared
//! with what the source model gave at compile time, against the output's
//! tolerance (the metric of [`crate::compare`]).

use crate::compare::{compare_data, Comparison};
use crate::format::Golden;
use crate::{Error, Tensor, TensorRef};

/// One output of one golden set, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct GoldenCheck {
    /// The set's index (in the order given to `kiln compile --golden`).
    pub set: usize,
    /// The comparison with the expected output.
    pub comparison: Comparison,
    /// The output's tolerance (largest error relative to its scale).
    pub tolerance: f64,
}

impl GoldenCheck {
    /// Whether the output is within its tolerance.
    pub fn passed(&self) -> bool {
        self.comparison.passes(self.tolerance)
    }
}

/// What [`Model::verify`] found: one check per golden set and output.
#[derive(Clone, Debug, PartialEq)]
pub struct VerifyReport {
    /// In set order, outputs in the model's order.
    pub checks: Vec<GoldenCheck>,
}

impl VerifyReport {
    /// Whether every output of every set is within its tolerance.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(GoldenCheck::passed)
    }

    /// The checks beyond tolerance.
    pub fn failures(&self) -> impl Iterator<Item = &GoldenCheck> {
        self.checks.iter().filter(|c| !c.passed())
    }
}

/// Runs every set of `golden` through `run` (one inference of the model).
pub(crate) fn verify(
    golden: &Golden<'_>,
    mut run: impl FnMut(&[TensorRef<'_>]) -> Result<Vec<Tensor>, Error>,
) -> Result<VerifyReport, Error> {
    if golden.is_empty() {
        return Err(Error::NoGolden);
    }
    let mut checks = Vec::new();
    for (set, g) in golden.sets.iter().enumerate() {
        let inputs: Vec<TensorRef<'_>> = (g.inputs.iter())
            .map(|t| TensorRef::new(&t.name, t.dtype, &t.shape, &t.data))
            .collect();
        let outputs = run(&inputs)?;
        for got in &outputs {
            let expected = (g.outputs.iter()).find(|e| e.name == got.name);
            let (Some(expected), Some(tolerance)) = (expected, golden.tolerance(&got.name)) else {
                return Err(Error::GoldenOutput {
                    set,
                    output: got.name.clone(),
                });
            };
            let comparison = compare_data(
                &got.name,
                (got.dtype, &got.shape, &got.data),
                (expected.dtype, &expected.shape, &expected.data),
            );
            checks.push(GoldenCheck {
                set,
                comparison,
                tolerance,
            });
        }
    }
    Ok(VerifyReport { checks })
}
