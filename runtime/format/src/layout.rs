//! The fixed header and the section table.

use sha2::{Digest, Sha256};

use super::cursor::Writer;
use super::section::SectionKind;
use super::{Arch, CpuFeatures, FormatError, FORMAT_VERSION, MAGIC};

/// Length of the fixed header in bytes.
pub const HEADER_LEN: usize = 64;
/// Length of one section table entry in bytes.
pub const SECTION_ENTRY_LEN: usize = 56;
/// Every section starts at a multiple of this many bytes from the start of
/// the file.
pub const SECTION_ALIGN: u64 = 64;
/// Byte range of the content hash inside the header.
const HASH_RANGE: std::ops::Range<usize> = 32..64;

/// One entry of the section table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SectionEntry {
    /// What the section holds.
    pub kind: SectionKind,
    /// Offset from the start of the file (a multiple of [`SECTION_ALIGN`]).
    pub offset: u64,
    /// Length in bytes.
    pub length: u64,
    /// SHA-256 of the section's bytes.
    pub sha256: [u8; 32],
}

impl SectionEntry {
    /// The section's bytes in `file` (the header must have been validated
    /// against `file`).
    pub fn bytes<'a>(&self, file: &'a [u8]) -> &'a [u8] {
        // In range: `read_header` checked offset + length <= file.len().
        &file[self.offset as usize..(self.offset + self.length) as usize]
    }
}

/// The validated header and section table of an artifact.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// Format version of the file.
    pub version: u32,
    /// Architecture of the code.
    pub arch: Arch,
    /// CPU features the code needs.
    pub features: CpuFeatures,
    /// SHA-256 of the header (without this field) and the section table;
    /// as the table holds every section's SHA-256, it identifies the whole
    /// content of the file.
    pub content_hash: [u8; 32],
    /// The section table, in file order.
    pub sections: Vec<SectionEntry>,
}

impl Header {
    /// The table entry for `kind`.
    pub fn section(&self, kind: SectionKind) -> &SectionEntry {
        // `read_header` guarantees one entry per kind, in `ALL` order.
        &self.sections[kind as usize - 1]
    }
}

/// Rounds `n` up to a multiple of [`SECTION_ALIGN`], or `None` on overflow.
pub(crate) fn align_up(n: u64) -> Option<u64> {
    Some(n.checked_add(SECTION_ALIGN - 1)? / SECTION_ALIGN * SECTION_ALIGN)
}

/// Offset of the first section of a file of `sections` sections.
pub(crate) fn first_section_offset(sections: usize) -> u64 {
    let table_end = HEADER_LEN + sections * SECTION_ENTRY_LEN;
    table_end.next_multiple_of(SECTION_ALIGN as usize) as u64
}

/// Encodes header and section table; `payloads` are the sections in
/// [`SectionKind::ALL`] order. Returns the bytes up to the first section
/// and the content hash.
pub(crate) fn write_header(
    arch: Arch,
    features: CpuFeatures,
    payloads: &[&[u8]; SectionKind::ALL.len()],
) -> (Vec<u8>, [u8; 32]) {
    let mut w = Writer::default();
    w.bytes(&MAGIC);
    w.u32(FORMAT_VERSION);
    w.u32(arch as u32);
    w.u64(features.0);
    w.u32(payloads.len() as u32);
    w.u32(0); // reserved
    w.bytes(&[0; 32]); // content hash, filled in below
    let mut offset = first_section_offset(payloads.len());
    for (kind, payload) in SectionKind::ALL.into_iter().zip(payloads) {
        w.u32(kind as u32);
        w.u32(0); // reserved
        w.u64(offset);
        w.u64(payload.len() as u64);
        w.bytes(&Sha256::digest(payload));
        offset = align_up(offset + payload.len() as u64).expect("artifact larger than u64");
    }
    let hash = content_hash_of(&w.0);
    w.0[HASH_RANGE].copy_from_slice(&hash);
    w.0.resize(first_section_offset(payloads.len()) as usize, 0);
    (w.0, hash)
}

/// SHA-256 over the header without its hash field, then the section table.
fn content_hash_of(header_and_table: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(&header_and_table[..HASH_RANGE.start]);
    h.update(&header_and_table[HASH_RANGE.end..]);
    h.finalize().into()
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Reads and validates the header and section table of `file`: magic,
/// version, header checksum, architecture code, and a canonical section
/// layout (every kind once, in order, 64-byte aligned, zero padding, inside
/// the file, nothing after the last section). Section contents are not
/// checked here.
pub fn read_header(file: &[u8]) -> Result<Header, FormatError> {
    if !file.starts_with(&MAGIC[..file.len().min(MAGIC.len())]) {
        return Err(FormatError::NotKiln);
    }
    if file.len() < HEADER_LEN {
        return Err(FormatError::Truncated(format!(
            "the header needs {HEADER_LEN} bytes, the file has {}",
            file.len()
        )));
    }
    let version = le_u32(file, 8);
    if version == 0 {
        return Err(FormatError::InvalidVersion(version));
    }
    if version > FORMAT_VERSION {
        return Err(FormatError::NewerVersion {
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    if version < FORMAT_VERSION {
        return Err(FormatError::OlderVersion {
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    let count = le_u32(file, 24) as usize;
    let kinds = &SectionKind::ALL;
    if count != kinds.len() {
        return Err(FormatError::SectionTable(format!(
            "{count} sections, format version {version} has {}",
            kinds.len()
        )));
    }
    let table_end = HEADER_LEN + count * SECTION_ENTRY_LEN;
    if file.len() < table_end {
        return Err(FormatError::Truncated(format!(
            "the section table ends at byte {table_end}, the file has {}",
            file.len()
        )));
    }
    let content_hash = content_hash_of(&file[..table_end]);
    if file[HASH_RANGE] != content_hash {
        return Err(FormatError::HeaderChecksum);
    }
    let arch_code = le_u32(file, 12);
    let arch = Arch::from_u32(arch_code).ok_or(FormatError::UnknownCode {
        what: "architecture",
        code: arch_code.into(),
    })?;
    if le_u32(file, 28) != 0 {
        return Err(FormatError::SectionTable(
            "reserved header field is not zero".into(),
        ));
    }
    let sections = read_table(file, table_end, kinds)?;
    Ok(Header {
        version,
        arch,
        features: CpuFeatures(le_u64(file, 16)),
        content_hash,
        sections,
    })
}

fn read_table(
    file: &[u8],
    table_end: usize,
    kinds: &[SectionKind],
) -> Result<Vec<SectionEntry>, FormatError> {
    let file_len = file.len() as u64;
    let mut sections = Vec::with_capacity(kinds.len());
    let mut prev_end = table_end as u64;
    for (i, &expected) in kinds.iter().enumerate() {
        let at = HEADER_LEN + i * SECTION_ENTRY_LEN;
        let kind_code = le_u32(file, at);
        if kind_code != expected as u32 {
            return Err(FormatError::SectionTable(format!(
                "entry {i} has kind {kind_code}, expected {} ({expected})",
                expected as u32
            )));
        }
        if le_u32(file, at + 4) != 0 {
            return Err(FormatError::SectionTable(format!(
                "reserved field of section {expected} is not zero"
            )));
        }
        let offset = le_u64(file, at + 8);
        let length = le_u64(file, at + 16);
        let sha256 = file[at + 24..at + 56].try_into().expect("32 bytes");
        // Canonical layout: each section starts at the next aligned offset.
        if align_up(prev_end) != Some(offset) {
            return Err(FormatError::SectionTable(format!(
                "section {expected} starts at byte {offset}, expected {}",
                align_up(prev_end).unwrap_or(u64::MAX)
            )));
        }
        let end = offset.checked_add(length).filter(|&e| e <= file_len);
        let Some(end) = end else {
            return Err(FormatError::Truncated(format!(
                "section {expected} (bytes {offset}..{}) extends past the end of the file ({file_len} bytes)",
                offset.saturating_add(length)
            )));
        };
        // `offset` and `end` are within the file, so they fit in usize.
        if file[prev_end as usize..offset as usize]
            .iter()
            .any(|&b| b != 0)
        {
            return Err(FormatError::SectionTable(format!(
                "padding before section {expected} is not zero"
            )));
        }
        sections.push(SectionEntry {
            kind: expected,
            offset,
            length,
            sha256,
        });
        prev_end = end;
    }
    if prev_end != file_len {
        return Err(FormatError::SectionTable(format!(
            "{} unexpected bytes after the last section",
            file_len - prev_end
        )));
    }
    Ok(sections)
}

/// The header's fields: byte range and name, in file order.
const HEADER_FIELDS: [(std::ops::Range<usize>, &str); 7] = [
    (0..8, "magic"),
    (8..12, "version"),
    (12..16, "arch"),
    (16..24, "features"),
    (24..28, "section count"),
    (28..32, "reserved"),
    (HASH_RANGE, "content hash"),
];

/// How many leading bytes [`peek`] reads.
pub const PEEK_LEN: usize = 16;

/// What the first [`PEEK_LEN`] bytes of a file say, before anything is
/// validated: enough to pick a loader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peek {
    /// The format version field.
    pub version: u32,
    /// The architecture field, `None` for a code this crate does not know.
    pub arch: Option<Arch>,
}

/// Reads the magic, version and architecture fields from the start of a
/// file; `None` when `prefix` is shorter than [`PEEK_LEN`] or does not start
/// with [`MAGIC`]. Nothing else is checked: [`read_header`] and
/// [`crate::ArtifactView::parse`] validate the file.
pub fn peek(prefix: &[u8]) -> Option<Peek> {
    if prefix.len() < PEEK_LEN || prefix[..MAGIC.len()] != MAGIC {
        return None;
    }
    Some(Peek {
        version: le_u32(prefix, 8),
        arch: Arch::from_u32(le_u32(prefix, 12)),
    })
}

/// Names the part of the artifact `file` that holds byte `offset`: a header
/// field, a section-table entry, a section (with the offset inside it), the
/// padding between sections, or the end of the file. For messages such as
/// "two builds first differ at ...".
pub fn region_at(file: &[u8], offset: u64) -> String {
    let kinds = &SectionKind::ALL;
    let table_end = (HEADER_LEN + kinds.len() * SECTION_ENTRY_LEN) as u64;
    if offset >= file.len() as u64 {
        return format!("end of file ({} bytes)", file.len());
    }
    if let Some((_, field)) = HEADER_FIELDS
        .iter()
        .find(|(range, _)| range.contains(&(offset as usize)))
    {
        return format!("header ({field})");
    }
    if offset < table_end {
        let i = (offset as usize - HEADER_LEN) / SECTION_ENTRY_LEN;
        return format!("section table (entry {i}: {})", kinds[i].name());
    }
    match read_header(file) {
        Ok(h) => h
            .sections
            .iter()
            .find(|s| (s.offset..s.offset + s.length).contains(&offset))
            .map_or_else(
                || "padding between sections".to_string(),
                |s| {
                    format!(
                        "section {} (+{} of {} bytes)",
                        s.kind.name(),
                        offset - s.offset,
                        s.length
                    )
                },
            ),
        Err(e) => format!("unparsable artifact ({e})"),
    }
}
