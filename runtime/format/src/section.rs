//! The kinds of section an artifact holds, in file order.

use std::fmt;

/// Kind of a section (`u32` on disk). Every kind of a file's format version
/// ([`SectionKind::of_version`]) appears exactly once, in this order.
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
    /// The self-test: golden inputs, expected outputs, tolerances (format
    /// version 4; empty when the artifact has none).
    Golden = 7,
}

impl SectionKind {
    /// All kinds, in file order (format version 4).
    pub const ALL: [SectionKind; 7] = [
        SectionKind::Meta,
        SectionKind::Weights,
        SectionKind::Text,
        SectionKind::Relocs,
        SectionKind::Kernels,
        SectionKind::Schedule,
        SectionKind::Golden,
    ];

    /// The kinds a file of format `version` holds, in order: versions 1 to 3
    /// end with SCHEDULE, version 4 adds GOLDEN.
    pub fn of_version(version: u32) -> &'static [SectionKind] {
        if version >= 4 {
            &SectionKind::ALL
        } else {
            &SectionKind::ALL[..6]
        }
    }

    /// Upper-case name, as in messages (`"TEXT"`).
    pub fn name(self) -> &'static str {
        match self {
            SectionKind::Meta => "META",
            SectionKind::Weights => "WEIGHTS",
            SectionKind::Text => "TEXT",
            SectionKind::Relocs => "RELOCS",
            SectionKind::Kernels => "KERNELS",
            SectionKind::Schedule => "SCHEDULE",
            SectionKind::Golden => "GOLDEN",
        }
    }
}

impl fmt::Display for SectionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
