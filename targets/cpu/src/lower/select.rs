//! Kernel selection for dense ops: an ordered list of candidate lowerings
//! per op, fastest first, each answering with code or with the reason it
//! does not apply. The first that serves is chosen; the Cranelift kernel is
//! the last candidate of every list and always serves. What was chosen and
//! why each candidate before it declined is recorded per node
//! ([`DenseKernel`]) in the artifact, so `kiln inspect` and `kiln compile
//! --json` show it and `kiln compile` warns when a large op lands on the
//! generic kernel.
//!
//! A candidate *declines* when the node is outside what it covers (an
//! operand type, a layout, an offset beyond a 32-bit displacement). A
//! candidate that applies but cannot assemble its code is a compiler bug:
//! that is an error ([`Miss::Failed`]), never a silent fallback.

use kiln_format::{Declined, DenseKernel};

use crate::microkernel::MicrokernelError;

/// Why a candidate did not give code.
#[derive(Debug)]
pub(crate) enum Miss {
    /// The node is outside what the candidate covers; the next one is tried.
    Declined(String),
    /// The candidate applies but its code could not be made: an error.
    Failed(MicrokernelError),
}

/// The answer of a candidate lowering.
pub(crate) type Attempt<T> = Result<T, Miss>;

impl From<MicrokernelError> for Miss {
    fn from(e: MicrokernelError) -> Miss {
        match e {
            // Addressing a tensor beyond ±2 GiB is a limit of the kernel's
            // encoding, not a bug: the generic kernel addresses it.
            MicrokernelError::Displacement(_) => Miss::Declined(e.to_string()),
            e => Miss::Failed(e),
        }
    }
}

/// A declined attempt with reason `why`.
pub(crate) fn decline<T>(why: impl Into<String>) -> Attempt<T> {
    Err(Miss::Declined(why.into()))
}

/// `Option` → [`Attempt`], declining with a reason when `None`.
pub(crate) trait OrDecline<T> {
    /// The value, or a decline saying `why`.
    fn or_decline(self, why: impl FnOnce() -> String) -> Attempt<T>;
}

impl<T> OrDecline<T> for Option<T> {
    fn or_decline(self, why: impl FnOnce() -> String) -> Attempt<T> {
        self.ok_or_else(|| Miss::Declined(why()))
    }
}

/// Declines with `why` unless `ok`.
pub(crate) fn require(ok: bool, why: impl FnOnce() -> String) -> Attempt<()> {
    if ok {
        Ok(())
    } else {
        Err(Miss::Declined(why()))
    }
}

/// The candidates tried for one node, in order, and what each answered.
#[derive(Default, Debug)]
pub(crate) struct Trail {
    declined: Vec<Declined>,
}

impl Trail {
    /// Records that `kernel` declined for `reason`.
    pub(crate) fn declined(&mut self, kernel: &str, reason: impl Into<String>) {
        self.declined.push(Declined {
            kernel: kernel.to_owned(),
            reason: reason.into(),
        });
    }

    /// Runs candidate `kernel`: its result, or `None` after recording its
    /// decline; a failure passes through.
    pub(crate) fn attempt<T>(
        &mut self,
        kernel: &str,
        result: Attempt<T>,
    ) -> Result<Option<T>, MicrokernelError> {
        match result {
            Ok(v) => Ok(Some(v)),
            Err(Miss::Declined(why)) => {
                self.declined(kernel, why);
                Ok(None)
            }
            Err(Miss::Failed(e)) => Err(e),
        }
    }

    /// The record of a node that got `kernel` after the candidates so far.
    pub(crate) fn chose(self, node: &str, op: &str, kernel: &str, flops: u64) -> DenseKernel {
        DenseKernel {
            node: node.to_owned(),
            op: op.to_owned(),
            kernel: kernel.to_owned(),
            flops,
            declined: self.declined,
        }
    }
}

/// An assembled microkernel, or `None` when its offsets exceed 32-bit
/// displacements (the Cranelift kernel then serves the node); any other
/// assembler error is a bug and passes through.
pub(crate) fn assembled(
    code: Result<Vec<u8>, MicrokernelError>,
) -> Result<Option<Vec<u8>>, MicrokernelError> {
    match code {
        Ok(code) => Ok(Some(code)),
        Err(MicrokernelError::Displacement(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// [`assembled`] over the tasks of one kernel: all of them, or `None`
/// when one does not fit its displacements.
pub(crate) fn assembled_tasks(
    tasks: impl IntoIterator<Item = Result<Vec<u8>, MicrokernelError>>,
) -> Result<Option<Vec<Vec<u8>>>, MicrokernelError> {
    let mut out = Vec::new();
    for task in tasks {
        match assembled(task)? {
            Some(code) => out.push(code),
            None => return Ok(None),
        }
    }
    Ok(Some(out))
}

/// Name of the generic kernel, the last candidate of every dense op.
pub(crate) const GENERIC: &str = "generic/cranelift";
