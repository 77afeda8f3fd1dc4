//! Target selection: the Cranelift ISA and the CPU features it may use.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use cranelift_codegen::isa::{self, TargetIsa};
use cranelift_codegen::settings::{self, Configurable};
use kiln_format::{Arch, CpuFeatures};

use crate::{CpuError, CpuOptions};

/// The ISA level code is generated for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CpuTarget {
    /// The machine the compiler runs on (its detected features).
    Native,
    /// x86-64-v3: AVX2, FMA, BMI1/2, LZCNT, POPCNT and SSE3..4.2.
    X86_64V3,
    /// x86-64-v3 plus AVX-512 F/VL/DQ.
    X86_64Avx512,
    /// AArch64 with NEON (always present).
    Aarch64,
}

impl CpuTarget {
    /// Every target, in a fixed order.
    pub const ALL: [CpuTarget; 4] = [
        CpuTarget::Native,
        CpuTarget::X86_64V3,
        CpuTarget::X86_64Avx512,
        CpuTarget::Aarch64,
    ];

    /// The name used on the command line (`x86_64-v3`).
    pub fn name(self) -> &'static str {
        match self {
            CpuTarget::Native => "native",
            CpuTarget::X86_64V3 => "x86_64-v3",
            CpuTarget::X86_64Avx512 => "x86_64-avx512",
            CpuTarget::Aarch64 => "aarch64",
        }
    }

    /// The tasks a dense kernel is split into when the user does not say
    /// (`--threads`): for `native`, one per core of this machine (at most
    /// [`MAX_DEFAULT_THREADS`]), since the artifact is built for it; a
    /// named target does not know its machine's cores and keeps
    /// [`crate::DEFAULT_THREADS`]. Tasks beyond a session's threads cost
    /// time: a row task re-reads all of B, so a kernel split four ways
    /// and run by one thread reads it four times (ResNet-50 at 224², one
    /// thread: 77.0 ms compiled for four tasks, 70.8 ms for two, 68.4 ms
    /// for one; two threads: 43.2 ms for four, 37.7 ms for two).
    pub fn default_threads(self) -> usize {
        match self {
            CpuTarget::Native => std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .min(MAX_DEFAULT_THREADS),
            _ => crate::DEFAULT_THREADS,
        }
    }
}

/// The most tasks [`CpuTarget::default_threads`] gives `native`.
pub const MAX_DEFAULT_THREADS: usize = 8;

impl fmt::Display for CpuTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for CpuTarget {
    type Err = CpuError;
    fn from_str(s: &str) -> Result<CpuTarget, CpuError> {
        CpuTarget::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| CpuError::UnknownTarget(s.to_owned()))
    }
}

/// A built target: the ISA and what the artifact records about it.
pub(crate) struct Target {
    /// The Cranelift ISA.
    pub isa: Arc<dyn TargetIsa>,
    /// The architecture recorded in the artifact.
    pub arch: Arch,
    /// The features the code may use (recorded in the artifact).
    pub features: CpuFeatures,
    /// Whether a fused multiply-add instruction exists (so `fma` does not
    /// become a libcall).
    pub fma: bool,
    /// Whether the dense ops use the AVX-512 microkernels (x86-64 with
    /// AVX-512F).
    pub avx512: bool,
    /// Whether the dense ops without AVX-512 use the AVX2 + FMA GEMM
    /// microkernels (x86-64 with both; `x86_64-v3`).
    pub avx2: bool,
    /// The most tasks a dense kernel is split into.
    pub tasks: usize,
    /// Whether bf16 dot products (`vdpbf16ps`) may be used: AVX-512 plus
    /// AVX512-BF16, only for `native` on a host that has it (no named
    /// target level includes it). Recorded in the artifact when used.
    pub bf16: bool,
    /// Whether int8 dot products (`vpdpbusd`, with AVX512-BW byte masks)
    /// may be used: like [`Target::bf16`], only for `native` on a host
    /// with AVX512-VNNI and AVX512-BW. Recorded in the artifact whenever the
    /// graph has a `matmul_integer` (also one that kept its portable
    /// kernel: the record errs on the side of refusing a host).
    pub vnni: bool,
}

impl Target {
    /// The vector registers of the microkernels: zmm with AVX-512, ymm
    /// with AVX2 + FMA, none otherwise (aarch64: Cranelift only).
    pub(crate) fn vector(&self) -> Option<crate::microkernel::Vector> {
        use crate::microkernel::Vector;
        match (self.avx512, self.avx2) {
            (true, _) => Some(Vector::Zmm),
            (false, true) => Some(Vector::Ymm),
            (false, false) => None,
        }
    }
}

/// x86 features Kiln maps to Cranelift flags, with the flag name.
const X86_FLAGS: [(CpuFeatures, &str); 14] = [
    (CpuFeatures::SSE3, "has_sse3"),
    (CpuFeatures::SSSE3, "has_ssse3"),
    (CpuFeatures::SSE41, "has_sse41"),
    (CpuFeatures::SSE42, "has_sse42"),
    (CpuFeatures::POPCNT, "has_popcnt"),
    (CpuFeatures::AVX, "has_avx"),
    (CpuFeatures::AVX2, "has_avx2"),
    (CpuFeatures::FMA, "has_fma"),
    (CpuFeatures::BMI1, "has_bmi1"),
    (CpuFeatures::BMI2, "has_bmi2"),
    (CpuFeatures::LZCNT, "has_lzcnt"),
    (CpuFeatures::AVX512F, "has_avx512f"),
    (CpuFeatures::AVX512VL, "has_avx512vl"),
    (CpuFeatures::AVX512DQ, "has_avx512dq"),
];

fn x86_v3() -> CpuFeatures {
    X86_FLAGS[..11]
        .iter()
        .fold(CpuFeatures::NONE, |acc, (f, _)| acc | *f)
}

/// Builds the ISA for `opts`.
pub(crate) fn build(opts: &CpuOptions) -> Result<Target, CpuError> {
    let err = |message: String| CpuError::Isa {
        target: opts.target.to_string(),
        message,
    };
    let (arch, features) = match opts.target {
        CpuTarget::X86_64V3 => (Arch::X86_64, x86_v3()),
        CpuTarget::X86_64Avx512 => (
            Arch::X86_64,
            x86_v3() | CpuFeatures::AVX512F | CpuFeatures::AVX512VL | CpuFeatures::AVX512DQ,
        ),
        CpuTarget::Aarch64 => (Arch::Aarch64, CpuFeatures::NEON),
        CpuTarget::Native => match Arch::host() {
            Some(Arch::X86_64) => {
                let host = CpuFeatures::detect_host();
                let mut f = X86_FLAGS
                    .iter()
                    .filter(|(feat, _)| host.contains(*feat))
                    .fold(CpuFeatures::NONE, |acc, (feat, _)| acc | *feat);
                // AVX-512 code in Cranelift assumes VL for 128-bit forms.
                let avx512 = CpuFeatures::AVX512F | CpuFeatures::AVX512VL;
                if !f.contains(avx512) {
                    f = CpuFeatures(
                        f.0 & !(CpuFeatures::AVX512F.0
                            | CpuFeatures::AVX512VL.0
                            | CpuFeatures::AVX512DQ.0),
                    );
                }
                (Arch::X86_64, f)
            }
            Some(Arch::Aarch64) => (Arch::Aarch64, CpuFeatures::NEON),
            Some(Arch::Nvptx64) | None => {
                return Err(err("the host architecture has no code generator".into()))
            }
        },
    };

    let mut flags = settings::builder();
    let opt = if opts.opt_level == 0 { "none" } else { "speed" };
    for (name, value) in [
        ("opt_level", opt),
        ("is_pic", "false"),
        ("use_colocated_libcalls", "false"),
        ("preserve_frame_pointers", "true"),
        ("unwind_info", "false"),
        ("enable_probestack", "false"),
        (
            "enable_verifier",
            if cfg!(debug_assertions) {
                "true"
            } else {
                "false"
            },
        ),
    ] {
        flags
            .set(name, value)
            .map_err(|e| err(format!("setting {name}={value}: {e}")))?;
    }
    let triple = match arch {
        Arch::X86_64 => "x86_64-unknown-linux-gnu",
        Arch::Aarch64 => "aarch64-unknown-linux-gnu",
        Arch::Nvptx64 => return Err(err("nvptx64 is not a CPU architecture".into())),
    };
    let mut builder = isa::lookup_by_name(triple).map_err(|e| err(format!("{triple}: {e}")))?;
    if arch == Arch::X86_64 {
        for (feat, flag) in X86_FLAGS {
            let on = if features.contains(feat) {
                "true"
            } else {
                "false"
            };
            builder
                .set(flag, on)
                .map_err(|e| err(format!("setting {flag}: {e}")))?;
        }
    }
    let isa = builder
        .finish(settings::Flags::new(flags))
        .map_err(|e| err(e.to_string()))?;
    let fma = match arch {
        Arch::X86_64 => features.contains(CpuFeatures::FMA),
        Arch::Aarch64 => true,
        Arch::Nvptx64 => false,
    };
    let avx512 = arch == Arch::X86_64 && features.contains(CpuFeatures::AVX512F);
    let avx2 = arch == Arch::X86_64 && features.contains(CpuFeatures::AVX2 | CpuFeatures::FMA);
    let bf16 = avx512
        && opts.target == CpuTarget::Native
        && CpuFeatures::detect_host().contains(CpuFeatures::AVX512BF16);
    let vnni = avx512
        && opts.target == CpuTarget::Native
        && CpuFeatures::detect_host().contains(CpuFeatures::AVX512VNNI | CpuFeatures::AVX512BW);
    Ok(Target {
        isa,
        arch,
        features,
        fma,
        avx512,
        avx2,
        tasks: opts.threads.max(1),
        bf16,
        vnni,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for t in CpuTarget::ALL {
            assert_eq!(t.name().parse::<CpuTarget>().unwrap(), t);
        }
        assert!("x86_64-v9".parse::<CpuTarget>().is_err());
    }

    #[test]
    fn builds_every_target() {
        for t in CpuTarget::ALL {
            let target = build(&CpuOptions {
                target: t,
                opt_level: 2,
                threads: 1,
            })
            .unwrap();
            assert!(!target.features.is_empty() || t == CpuTarget::Native);
        }
    }
}
