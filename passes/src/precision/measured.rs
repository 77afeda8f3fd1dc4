//! What the precision stage measured on calibration samples for a policy,
//! as opposed to what the user asked for ([`super::policy::Policy`]): the
//! pass reads both.

use super::bias_correction::BiasCorrections;
use super::smooth::Smoothing;
use std::collections::BTreeMap;

/// Measurements the `assign-precision` pass applies, by node name. The
/// default (nothing measured) gives dynamic int8 activations, no smoothing,
/// no bias correction and no fallback.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Measured {
    /// Nodes the error-driven fallback (`--max-rel-error`) raised to fp32,
    /// with the measurement that made it; wins over everything but an
    /// ineligible op.
    pub fallback: BTreeMap<String, String>,
    /// int8 activations (`--quantize static`): the calibrated range of each
    /// int8 node's activation input. `None`: ranges are computed at run
    /// time (`--quantize dynamic`); a node missing from the map is
    /// quantized dynamically too.
    pub activation_ranges: Option<BTreeMap<String, (f32, f32)>>,
    /// int8 layers' bias corrections (measured by
    /// [`super::bias_correction::measure_bias_corrections`]), added to their
    /// biases per output channel; empty: none.
    pub bias_corrections: BiasCorrections,
    /// int8 layers' activation smoothing (`--smooth`, measured by
    /// [`super::smooth::smoothing_factors`]): per input channel divisors of
    /// the activation, multiplied into the weights; the activation ranges
    /// are then those of the smoothed activations.
    pub smoothing: Smoothing,
}
