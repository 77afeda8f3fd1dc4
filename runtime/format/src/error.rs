//! Errors found while reading an artifact.

use super::SectionKind;

/// Why bytes are not a valid Kiln artifact for this runtime.
///
/// Parsing never panics and never allocates more than the input justifies;
/// every malformed input maps to one of these.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// The magic bytes are wrong.
    #[error("not a Kiln artifact (the file does not start with \"KILNART\\0\")")]
    NotKiln,
    /// Written by a newer compiler for a newer runtime.
    #[error("artifact format version {found} is newer than this runtime supports ({supported})")]
    NewerVersion {
        /// Version in the file.
        found: u32,
        /// Newest version this runtime reads.
        supported: u32,
    },
    /// Written by an older compiler in a format this runtime no longer
    /// reads.
    #[error("artifact format version {found} was written by an older Kiln; this runtime reads version {supported} only: rebuild the artifact with this compiler (`kiln compile`)")]
    OlderVersion {
        /// Version in the file.
        found: u32,
        /// The version this runtime reads.
        supported: u32,
    },
    /// Version 0, which was never used.
    #[error("artifact format version {0} is invalid (versions start at 1)")]
    InvalidVersion(u32),
    /// The file ends before the header, section table or a section does.
    #[error("artifact is truncated: {0}")]
    Truncated(String),
    /// The header or section table does not match its SHA-256.
    #[error("checksum mismatch in the artifact header or section table")]
    HeaderChecksum,
    /// A section does not match its SHA-256.
    #[error("checksum mismatch in section {0}")]
    SectionChecksum(SectionKind),
    /// The section table is inconsistent (order, alignment, overlap,
    /// padding, trailing bytes).
    #[error("bad section table: {0}")]
    SectionTable(String),
    /// An enumeration field holds a code this runtime does not know.
    #[error("unknown {what} code {code}")]
    UnknownCode {
        /// Which enumeration (`dtype`, `architecture`, ...).
        what: &'static str,
        /// The code found.
        code: u64,
    },
    /// A section's content is inconsistent (a record runs past its end, a
    /// range lies outside TEXT or the arena, an index is out of range, ...).
    #[error("malformed section {section}: {detail}")]
    Malformed {
        /// The section.
        section: SectionKind,
        /// What is wrong, for people.
        detail: String,
    },
}
