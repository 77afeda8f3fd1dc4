//! `kiln-target-cuda`: the CUDA target of Kiln.
//!
//! This crate will emit PTX kernels and a launch plan from optimized
//! `kiln-ir` graphs (see `docs/targets-cuda.md` and the CUDA issue). It
//! holds only the SM table today; `kiln compile --target cuda-*` is not
//! accepted until the PTX emitter lands, so no flag pretends otherwise.
#![deny(missing_docs)]

/// A CUDA streaming-multiprocessor architecture Kiln plans to target, with
/// the PTX ISA version that first supports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmArch {
    /// Compute capability times ten (80 for sm_80).
    pub sm: u32,
    /// Minimum PTX ISA version (major, minor).
    pub ptx_isa: (u32, u32),
}

/// The architectures in the design: Volta through Hopper.
pub const SUPPORTED_SMS: [SmArch; 5] = [
    SmArch {
        sm: 70,
        ptx_isa: (6, 0),
    },
    SmArch {
        sm: 80,
        ptx_isa: (7, 0),
    },
    SmArch {
        sm: 86,
        ptx_isa: (7, 1),
    },
    SmArch {
        sm: 89,
        ptx_isa: (7, 8),
    },
    SmArch {
        sm: 90,
        ptx_isa: (7, 8),
    },
];

#[cfg(test)]
mod tests {
    #[test]
    fn sm_table_is_sorted_and_isa_monotonic() {
        let t = super::SUPPORTED_SMS;
        assert!(t
            .windows(2)
            .all(|w| w[0].sm < w[1].sm && w[0].ptx_isa <= w[1].ptx_isa));
    }
}
