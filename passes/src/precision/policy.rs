//! The precision [`Policy`]: what the user asked for (the `--precision`
//! mode, `--keep-fp32`, `--force`, `--plan`, `--activation-type`). What is
//! measured for it on calibration samples is [`super::measured::Measured`].

use super::plan::PrecisionPlan;
use super::quantize::ActivationType;
use super::types::{PolicyError, Precision};
use kiln_ir::{NamePattern, Op};
use std::fmt;
use std::str::FromStr;

/// The `--precision` mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Mode {
    /// Nothing changes (the default).
    #[default]
    Fp32,
    /// Every eligible dense op in bf16.
    Bf16,
    /// Every eligible dense op with f16 weights.
    Fp16,
    /// bf16, except the first and the last dense op of the graph (the
    /// layer reading the raw input and the one producing the logits).
    Mixed,
    /// Every eligible MatMul/Gemm in int8 (`--quantize`).
    Int8,
}

impl Mode {
    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Fp32 => "fp32",
            Mode::Bf16 => "bf16",
            Mode::Fp16 => "fp16",
            Mode::Mixed => "mixed",
            Mode::Int8 => "int8",
        }
    }
}

impl FromStr for Mode {
    type Err = PolicyError;
    fn from_str(s: &str) -> Result<Self, PolicyError> {
        match s {
            "fp32" => Ok(Mode::Fp32),
            "bf16" => Ok(Mode::Bf16),
            "fp16" => Ok(Mode::Fp16),
            "mixed" => Ok(Mode::Mixed),
            "int8" => Ok(Mode::Int8),
            other => Err(PolicyError::UnknownPrecision(other.to_string())),
        }
    }
}

/// Which nodes a pattern names: an op type (`MatMul`, `Conv`, compared
/// without case, ONNX or IR spelling) or a node-name glob
/// ([`NamePattern`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pattern(NamePattern);

impl Pattern {
    /// Parses a comma-separated list.
    pub fn list(s: &str) -> Result<Vec<Pattern>, PolicyError> {
        s.split(',')
            .map(|p| {
                p.parse()
                    .map_err(|_| PolicyError::EmptyPattern(s.to_string()))
            })
            .collect()
    }

    /// Whether the pattern names a node with this op and name.
    pub fn matches(&self, op: &Op, name: &str) -> bool {
        self.0.as_str().eq_ignore_ascii_case(op.name()) || self.0.matches(name)
    }
}

impl FromStr for Pattern {
    type Err = PolicyError;
    /// One pattern, without the spaces around it; an empty one is an error.
    fn from_str(s: &str) -> Result<Pattern, PolicyError> {
        match s.trim() {
            "" => Err(PolicyError::EmptyPattern(s.to_string())),
            p => Ok(Pattern(p.parse().unwrap_or_else(|e| match e {}))),
        }
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The precision policy: a mode and per-node overrides.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Policy {
    /// `--precision`.
    pub mode: Mode,
    /// `--keep-fp32`: nodes that stay f32 whatever else says.
    pub keep_fp32: Vec<Pattern>,
    /// `--force PRECISION=PATTERN`, in command-line order (a later one wins).
    pub force: Vec<(Precision, Vec<Pattern>)>,
    /// `--plan FILE`: every dense node's precision, checked against the
    /// graph (wins over the mode and the patterns; the error fallback,
    /// [`super::measured::Measured::fallback`], still applies).
    pub plan: Option<PrecisionPlan>,
    /// int8 activations: asymmetric u8 or symmetric int8
    /// (`--activation-type`).
    pub activation_type: ActivationType,
}

impl Policy {
    /// Parses one `--force PRECISION=PATTERN[,PATTERN...]` argument.
    pub fn parse_force(s: &str) -> Result<(Precision, Vec<Pattern>), PolicyError> {
        let (p, pats) = s
            .split_once('=')
            .ok_or_else(|| PolicyError::BadForce(s.to_string()))?;
        Ok((p.parse()?, Pattern::list(pats)?))
    }

    /// Whether the policy can change a graph (`fp32` with no `--force`
    /// cannot).
    pub fn is_identity(&self) -> bool {
        self.mode == Mode::Fp32
            && self.force.iter().all(|(p, _)| *p == Precision::Fp32)
            && self
                .plan
                .as_ref()
                .is_none_or(|plan| plan.entries.iter().all(|e| e.precision == Precision::Fp32))
    }

    /// Whether the policy can put a layer in int8 (the mode, a `--force`
    /// or a plan entry).
    pub fn may_quantize(&self) -> bool {
        self.mode == Mode::Int8
            || self.force.iter().any(|(p, _)| *p == Precision::Int8)
            || (self.plan.as_ref())
                .is_some_and(|plan| plan.entries.iter().any(|e| e.precision == Precision::Int8))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::Op;

    #[test]
    fn patterns_match_op_types_and_globs() {
        let p = Pattern::list("Softmax, /encoder/layer.0/*").unwrap();
        assert!(p[0].matches(&Op::Softmax { axis: 1 }, "x"));
        assert!(p[1].matches(&Op::MatMul, "/encoder/layer.0/attention/MatMul"));
        assert!(!p[1].matches(&Op::MatMul, "/encoder/layer.1/attention/MatMul"));
        assert_eq!(
            Policy::parse_force("int4=x"),
            Err(PolicyError::UnknownPrecision("int4".into()))
        );
        assert!(Pattern::list("a,,b").is_err());
    }
}
