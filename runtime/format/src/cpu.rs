//! Target architecture and CPU feature requirements recorded in the header.

use std::fmt;

/// Instruction-set architecture of the machine code in an artifact
/// (`u32` on disk).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arch {
    /// x86-64 (AMD64).
    X86_64 = 1,
    /// 64-bit Arm (AArch64).
    Aarch64 = 2,
    /// NVIDIA PTX for 64-bit addressing: a CUDA artifact. Its TEXT section
    /// is a [`CudaCode`](super::CudaCode), and the header's requirements
    /// field holds the SM (compute capability times ten), not CPU features.
    Nvptx64 = 3,
}

impl Arch {
    /// The architecture this runtime was built for, or `None` on an
    /// architecture Kiln has no code generator for.
    pub fn host() -> Option<Arch> {
        if cfg!(target_arch = "x86_64") {
            Some(Arch::X86_64)
        } else if cfg!(target_arch = "aarch64") {
            Some(Arch::Aarch64)
        } else {
            None
        }
    }

    /// The architecture with on-disk code `code`, if there is one.
    pub fn from_u32(code: u32) -> Option<Arch> {
        match code {
            1 => Some(Arch::X86_64),
            2 => Some(Arch::Aarch64),
            3 => Some(Arch::Nvptx64),
            _ => None,
        }
    }

    /// Name as in target triples (`"x86_64"`, `"aarch64"`).
    pub fn name(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "aarch64",
            Arch::Nvptx64 => "nvptx64",
        }
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of CPU features, one bit each (`u64` on disk).
///
/// Bits 0–31 are x86-64 features, bits 32–63 AArch64 features. Bits without
/// a constant here are reserved; an artifact that requires one is refused by
/// this runtime as requiring an unknown feature.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CpuFeatures(pub u64);

/// Table of known features: bit and name (the name `is_*_feature_detected!`
/// uses).
const KNOWN: [(u64, &str); 19] = [
    (CpuFeatures::SSE3.0, "sse3"),
    (CpuFeatures::SSSE3.0, "ssse3"),
    (CpuFeatures::SSE41.0, "sse4.1"),
    (CpuFeatures::SSE42.0, "sse4.2"),
    (CpuFeatures::POPCNT.0, "popcnt"),
    (CpuFeatures::AVX.0, "avx"),
    (CpuFeatures::AVX2.0, "avx2"),
    (CpuFeatures::FMA.0, "fma"),
    (CpuFeatures::BMI1.0, "bmi1"),
    (CpuFeatures::BMI2.0, "bmi2"),
    (CpuFeatures::LZCNT.0, "lzcnt"),
    (CpuFeatures::F16C.0, "f16c"),
    (CpuFeatures::AVX512F.0, "avx512f"),
    (CpuFeatures::AVX512VL.0, "avx512vl"),
    (CpuFeatures::AVX512DQ.0, "avx512dq"),
    (CpuFeatures::AVX512BW.0, "avx512bw"),
    (CpuFeatures::AVX512VNNI.0, "avx512vnni"),
    (CpuFeatures::AVX512BF16.0, "avx512bf16"),
    (CpuFeatures::NEON.0, "neon"),
];

impl CpuFeatures {
    /// No features.
    pub const NONE: CpuFeatures = CpuFeatures(0);
    /// x86 SSE3.
    pub const SSE3: CpuFeatures = CpuFeatures(1 << 0);
    /// x86 SSSE3.
    pub const SSSE3: CpuFeatures = CpuFeatures(1 << 1);
    /// x86 SSE4.1.
    pub const SSE41: CpuFeatures = CpuFeatures(1 << 2);
    /// x86 SSE4.2.
    pub const SSE42: CpuFeatures = CpuFeatures(1 << 3);
    /// x86 POPCNT.
    pub const POPCNT: CpuFeatures = CpuFeatures(1 << 4);
    /// x86 AVX.
    pub const AVX: CpuFeatures = CpuFeatures(1 << 5);
    /// x86 AVX2.
    pub const AVX2: CpuFeatures = CpuFeatures(1 << 6);
    /// x86 FMA3.
    pub const FMA: CpuFeatures = CpuFeatures(1 << 7);
    /// x86 BMI1.
    pub const BMI1: CpuFeatures = CpuFeatures(1 << 8);
    /// x86 BMI2.
    pub const BMI2: CpuFeatures = CpuFeatures(1 << 9);
    /// x86 LZCNT.
    pub const LZCNT: CpuFeatures = CpuFeatures(1 << 10);
    /// x86 F16C (half-precision conversions).
    pub const F16C: CpuFeatures = CpuFeatures(1 << 11);
    /// x86 AVX-512 Foundation.
    pub const AVX512F: CpuFeatures = CpuFeatures(1 << 12);
    /// x86 AVX-512 Vector Length extensions.
    pub const AVX512VL: CpuFeatures = CpuFeatures(1 << 13);
    /// x86 AVX-512 Doubleword and Quadword.
    pub const AVX512DQ: CpuFeatures = CpuFeatures(1 << 14);
    /// x86 AVX-512 Byte and Word.
    pub const AVX512BW: CpuFeatures = CpuFeatures(1 << 15);
    /// x86 AVX-512 Vector Neural Network Instructions.
    pub const AVX512VNNI: CpuFeatures = CpuFeatures(1 << 16);
    /// x86 AVX-512 BFloat16.
    pub const AVX512BF16: CpuFeatures = CpuFeatures(1 << 17);
    /// AArch64 Advanced SIMD.
    pub const NEON: CpuFeatures = CpuFeatures(1 << 32);

    /// Whether every feature in `other` is in `self`.
    pub fn contains(self, other: CpuFeatures) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The features in `self` that `available` lacks.
    pub fn missing_from(self, available: CpuFeatures) -> CpuFeatures {
        CpuFeatures(self.0 & !available.0)
    }

    /// Names of the known features in the set, in bit order; bits without a
    /// name are left out (see [`CpuFeatures::describe`]).
    pub fn names(self) -> Vec<&'static str> {
        KNOWN
            .iter()
            .filter(|(bit, _)| self.0 & bit != 0)
            .map(|(_, name)| *name)
            .collect()
    }

    /// Like [`CpuFeatures::names`], but reserved bits are included as
    /// `"unknown feature bit N"`.
    pub fn describe(self) -> Vec<String> {
        let known = KNOWN.iter().fold(0, |acc, (bit, _)| acc | bit);
        let mut out: Vec<String> = self.names().into_iter().map(String::from).collect();
        for bit in 0..64 {
            let mask = 1u64 << bit;
            if self.0 & mask != 0 && known & mask == 0 {
                out.push(format!("unknown feature bit {bit}"));
            }
        }
        out
    }

    /// The feature with the given name (as in [`CpuFeatures::names`]).
    pub fn from_name(name: &str) -> Option<CpuFeatures> {
        KNOWN
            .iter()
            .find(|(_, n)| *n == name)
            .map(|(bit, _)| CpuFeatures(*bit))
    }

    /// The features of the CPU this code runs on (only those this runtime
    /// knows; never a reserved bit).
    pub fn detect_host() -> CpuFeatures {
        detect::host()
    }
}

impl std::ops::BitOr for CpuFeatures {
    type Output = CpuFeatures;
    fn bitor(self, rhs: CpuFeatures) -> CpuFeatures {
        CpuFeatures(self.0 | rhs.0)
    }
}

impl std::ops::BitOrAssign for CpuFeatures {
    fn bitor_assign(&mut self, rhs: CpuFeatures) {
        self.0 |= rhs.0;
    }
}

impl fmt::Display for CpuFeatures {
    /// Comma-separated feature names, or `none`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            f.write_str("none")
        } else {
            f.write_str(&self.describe().join(", "))
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod detect {
    use super::CpuFeatures;

    pub(super) fn host() -> CpuFeatures {
        let mut f = CpuFeatures::NONE;
        let mut add = |present: bool, feature: CpuFeatures| {
            if present {
                f |= feature;
            }
        };
        add(is_x86_feature_detected!("sse3"), CpuFeatures::SSE3);
        add(is_x86_feature_detected!("ssse3"), CpuFeatures::SSSE3);
        add(is_x86_feature_detected!("sse4.1"), CpuFeatures::SSE41);
        add(is_x86_feature_detected!("sse4.2"), CpuFeatures::SSE42);
        add(is_x86_feature_detected!("popcnt"), CpuFeatures::POPCNT);
        add(is_x86_feature_detected!("avx"), CpuFeatures::AVX);
        add(is_x86_feature_detected!("avx2"), CpuFeatures::AVX2);
        add(is_x86_feature_detected!("fma"), CpuFeatures::FMA);
        add(is_x86_feature_detected!("bmi1"), CpuFeatures::BMI1);
        add(is_x86_feature_detected!("bmi2"), CpuFeatures::BMI2);
        add(is_x86_feature_detected!("lzcnt"), CpuFeatures::LZCNT);
        add(is_x86_feature_detected!("f16c"), CpuFeatures::F16C);
        add(is_x86_feature_detected!("avx512f"), CpuFeatures::AVX512F);
        add(is_x86_feature_detected!("avx512vl"), CpuFeatures::AVX512VL);
        add(is_x86_feature_detected!("avx512dq"), CpuFeatures::AVX512DQ);
        add(is_x86_feature_detected!("avx512bw"), CpuFeatures::AVX512BW);
        add(
            is_x86_feature_detected!("avx512vnni"),
            CpuFeatures::AVX512VNNI,
        );
        add(
            is_x86_feature_detected!("avx512bf16"),
            CpuFeatures::AVX512BF16,
        );
        f
    }
}

#[cfg(target_arch = "aarch64")]
mod detect {
    use super::CpuFeatures;

    pub(super) fn host() -> CpuFeatures {
        if std::arch::is_aarch64_feature_detected!("neon") {
            CpuFeatures::NEON
        } else {
            CpuFeatures::NONE
        }
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
mod detect {
    use super::CpuFeatures;

    pub(super) fn host() -> CpuFeatures {
        CpuFeatures::NONE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_bits() {
        let f = CpuFeatures::AVX2 | CpuFeatures::FMA | CpuFeatures(1 << 40);
        assert_eq!(f.names(), ["avx2", "fma"]);
        assert_eq!(f.describe(), ["avx2", "fma", "unknown feature bit 40"]);
        assert_eq!(
            CpuFeatures::from_name("avx512vnni"),
            Some(CpuFeatures::AVX512VNNI)
        );
        assert_eq!(CpuFeatures::NONE.to_string(), "none");
    }

    #[test]
    fn missing_features() {
        let need = CpuFeatures::AVX2 | CpuFeatures::NEON;
        assert_eq!(need.missing_from(CpuFeatures::AVX2), CpuFeatures::NEON);
        assert!(need.contains(CpuFeatures::AVX2));
    }

    #[test]
    fn host_has_no_reserved_bits() {
        let host = CpuFeatures::detect_host();
        assert_eq!(host.describe().len(), host.names().len());
        #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
        assert_eq!(Arch::host().map(Arch::name), Some(std::env::consts::ARCH));
    }
}
