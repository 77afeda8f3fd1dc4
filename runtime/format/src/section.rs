//! The kinds of section an artifact holds, in file order.

use std::fmt;

/// Kind of a section (`u32` on disk). Every kind of a file's format version
/// ([`SectionKind::of_version`]) appears exactly once, in this order.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SectionKind {
    /// Compiler version, target, options, source hash.
    Meta = 1,
    /// Packed weights, read by kernels through their `weights` argument.
    Weights = 2,
    /// Machine code of all kernels.
    Text = 3,
    /// Relocations applied to TEXT at load time.
    Relocs = 4,
    /// Kernel table: name and range in TEXT.
    Kernels = 5,
    /// The profiles: per combination of input shapes, the inputs and
    /// outputs, arena size, dense kernels chosen, and the ordered kernel
    /// calls of one inference (format version 5; SCHEDULE before).
    Profiles = 6,
    /// The self-test: golden inputs, expected outputs, tolerances (empty
    /// when the artifact has none).
    Golden = 7,
}

impl SectionKind {
    /// All kinds, in file order.
    pub const ALL: [SectionKind; 7] = [
        SectionKind::Meta,
        SectionKind::Weights,
        SectionKind::Text,
        SectionKind::Relocs,
        SectionKind::Kernels,
        SectionKind::Profiles,
        SectionKind::Golden,
    ];

    /// Upper-case name, as in messages (`"TEXT"`).
    pub fn name(self) -> &'static str {
        match self {
            SectionKind::Meta => "META",
            SectionKind::Weights => "WEIGHTS",
            SectionKind::Text => "TEXT",
            SectionKind::Relocs => "RELOCS",
            SectionKind::Kernels => "KERNELS",
            SectionKind::Profiles => "PROFILES",
            SectionKind::Golden => "GOLDEN",
        }
    }
}

impl fmt::Display for SectionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
