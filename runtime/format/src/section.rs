//! The kinds of section an artifact holds, in file order.

use std::fmt;

/// Kind of a section (`u32` on disk). In format v1 every kind appears exactly
/// once, in this order.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SectionKind {
    /// Compiler version, target, options, inputs, outputs, arena size,
    /// the dense kernels chosen (version 3).
    Meta = 1,
    /// Packed weights, read by kernels through their `weights` argument.
    Weights = 2,
    /// Machine code of all kernels.
    Text = 3,
    /// Relocations applied to TEXT at load time.
    Relocs = 4,
    /// Kernel table: name and range in TEXT.
    Kernels = 5,
    /// The ordered kernel calls of one inference.
    Schedule = 6,
}

impl SectionKind {
    /// All kinds, in file order.
    pub const ALL: [SectionKind; 6] = [
        SectionKind::Meta,
        SectionKind::Weights,
        SectionKind::Text,
        SectionKind::Relocs,
        SectionKind::Kernels,
        SectionKind::Schedule,
    ];

    /// Upper-case name, as in messages (`"TEXT"`).
    pub fn name(self) -> &'static str {
        match self {
            SectionKind::Meta => "META",
            SectionKind::Weights => "WEIGHTS",
            SectionKind::Text => "TEXT",
            SectionKind::Relocs => "RELOCS",
            SectionKind::Kernels => "KERNELS",
            SectionKind::Schedule => "SCHEDULE",
        }
    }
}

impl fmt::Display for SectionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
