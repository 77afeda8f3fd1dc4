//! `kiln-format`: the Kiln artifact format (`.kiln`, version
//! [`FORMAT_VERSION`]), the one definition shared by the compiler's writer
//! ([`Artifact::to_bytes`]) and the runtime's reader ([`Artifact::parse`],
//! [`ArtifactView::parse`]). It depends on nothing
//! heavier than `sha2` and `thiserror`: the compiler's targets build
//! artifacts with it without linking the runtime.
//!
//! The byte layout is specified in `docs/artifact-format.md`. In short: a
//! 64-byte header (magic, version, architecture, CPU features, section
//! count, content hash), a table of seven sections with a SHA-256 each, then
//! the sections META, WEIGHTS, TEXT, RELOCS, KERNELS, PROFILES (one schedule
//! per combination of input shapes) and GOLDEN (the self-test), each
//! starting at a multiple of 64 bytes. All integers are little-endian. The encoding is
//! canonical: equal artifacts give identical bytes, and every byte of a file
//! is covered by a checksum or a must-be-zero rule.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod code;
mod cpu;
mod cuda;
mod cursor;
mod decode;
mod dtype;
mod elf;
mod encode;
mod error;
mod golden;
mod layout;
mod meta;
mod section;
mod signature;

pub use code::{Code, HostFn, KernelEntry, Reloc, RelocKind, RelocTarget, Step};
pub use cpu::{Arch, CpuFeatures};
pub use cuda::{CudaCode, CudaKernel, CUDA_MAGIC};
pub use dtype::DType;
pub use error::FormatError;
pub use golden::{Golden, GoldenSet, GoldenTensor, Tolerance};
pub use layout::{
    peek, read_header, region_at, Header, Peek, SectionEntry, HEADER_LEN, PEEK_LEN, SECTION_ALIGN,
    SECTION_ENTRY_LEN,
};
pub use meta::{
    describe_conditions, largest_arena, type_string, ArtifactInfo, BoundedOutput, Declined,
    DenseKernel, Guard, Metadata, PaddableDim, Profile, Role, TensorSpec,
};
pub use section::SectionKind;
pub use signature::{
    signature_path, signed_message, DetachedSignature, SignatureFileError, SIGNATURE_FILE_LEN,
    SIGNATURE_MAGIC,
};

use sha2::{Digest, Sha256};

/// The first eight bytes of every artifact.
pub const MAGIC: [u8; 8] = *b"KILNART\0";

/// The format version this crate writes, and the newest it reads.
pub const FORMAT_VERSION: u32 = 7;

/// A complete artifact, owned. Built by a compiler target and written with
/// [`Artifact::to_bytes`]; read back with [`Artifact::parse`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Artifact {
    /// Architecture of the code in TEXT.
    pub arch: Arch,
    /// CPU features the code needs; the runtime refuses CPUs that lack one.
    pub features: CpuFeatures,
    /// Provenance.
    pub metadata: Metadata,
    /// Packed weights (the loader places them at a 64-byte aligned address).
    pub weights: Vec<u8>,
    /// Machine code of all kernels, before relocation.
    pub text: Vec<u8>,
    /// Functions in TEXT.
    pub kernels: Vec<KernelEntry>,
    /// Patches applied to TEXT at load time.
    pub relocs: Vec<Reloc>,
    /// One or more specializations to input shapes, each with its
    /// schedule (see [`Profile`]).
    pub profiles: Vec<Profile>,
    /// The dims a run may pad to a larger profile (see [`PaddableDim`]).
    pub padding: Vec<PaddableDim>,
    /// The self-test (empty when the artifact has none).
    pub golden: Golden<'static>,
}

impl Artifact {
    /// What TEXT holds (machine code or CUDA modules, by
    /// [`Artifact::arch`]), CUDA modules decoded and checked.
    pub fn code(&self) -> Result<Code<'_>, FormatError> {
        code_of(self.arch, &self.text, &self.kernels, &self.relocs)
    }

    /// The arena one session needs: the largest profile's.
    pub fn arena_size(&self) -> u64 {
        largest_arena(&self.profiles)
    }

    /// Encodes the artifact. The same artifact always gives the same bytes.
    ///
    /// The result is valid for [`Artifact::parse`] when the tables are
    /// consistent (kernel and relocation ranges inside TEXT, indices in
    /// range, tensors inside the arena); the writer does not check this.
    ///
    /// # Panics
    /// If a string or table has more than `u32::MAX` entries or bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let sections = self.encode_sections();
        let payloads = sections.payloads(self);
        let (mut out, _) = layout::write_header(self.arch, self.features, &payloads);
        for payload in payloads {
            let start = layout::align_up(out.len() as u64).expect("artifact larger than u64");
            out.resize(start as usize, 0);
            out.extend_from_slice(payload);
        }
        out
    }

    /// The content hash [`Artifact::to_bytes`] records in the header (see
    /// [`Header::content_hash`]).
    pub fn content_hash(&self) -> [u8; 32] {
        let sections = self.encode_sections();
        layout::write_header(self.arch, self.features, &sections.payloads(self)).1
    }

    /// Decodes and validates an artifact (see [`ArtifactView::parse`]),
    /// copying weights and code.
    pub fn parse(bytes: &[u8]) -> Result<Artifact, FormatError> {
        ArtifactView::parse(bytes).map(ArtifactView::into_artifact)
    }

    fn encode_sections(&self) -> EncodedSections {
        EncodedSections {
            meta: encode::meta(&self.metadata),
            relocs: encode::relocs(&self.relocs),
            kernels: encode::kernels(&self.kernels),
            profiles: encode::profiles(&self.profiles, &self.padding),
            golden: golden::encode(&self.golden),
        }
    }
}

/// The encoded structured sections of an [`Artifact`].
struct EncodedSections {
    meta: Vec<u8>,
    relocs: Vec<u8>,
    kernels: Vec<u8>,
    profiles: Vec<u8>,
    golden: Vec<u8>,
}

impl EncodedSections {
    /// All section payloads in file order.
    fn payloads<'a>(&'a self, a: &'a Artifact) -> [&'a [u8]; SectionKind::ALL.len()] {
        [
            &self.meta,
            &a.weights,
            &a.text,
            &self.relocs,
            &self.kernels,
            &self.profiles,
            &self.golden,
        ]
    }
}

/// A validated artifact that borrows its weights and code from the file
/// bytes, so a large model is never copied just to be inspected or loaded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArtifactView<'a> {
    /// The validated header and section table.
    pub header: Header,
    /// Provenance.
    pub metadata: Metadata,
    /// The WEIGHTS section (64-byte aligned relative to the file start).
    pub weights: &'a [u8],
    /// The TEXT section, before relocation.
    pub text: &'a [u8],
    /// Functions in TEXT.
    pub kernels: Vec<KernelEntry>,
    /// Patches applied to TEXT at load time.
    pub relocs: Vec<Reloc>,
    /// One or more specializations to input shapes, each with its
    /// schedule (see [`Profile`]).
    pub profiles: Vec<Profile>,
    /// The dims a run may pad to a larger profile (see [`PaddableDim`]).
    pub padding: Vec<PaddableDim>,
    /// The self-test, its tensors borrowed from the file (empty when the
    /// artifact has none).
    pub golden: Golden<'a>,
}

impl<'a> ArtifactView<'a> {
    /// Decodes and validates `bytes`: header and section layout (see
    /// [`read_header`]), every section's SHA-256, enumeration codes, kernel
    /// and relocation ranges inside TEXT, kernel indices, input/output
    /// tensors inside their profile's arena, and profiles that agree on the
    /// inputs' and outputs' names, dtypes and ranks.
    pub fn parse(bytes: &'a [u8]) -> Result<ArtifactView<'a>, FormatError> {
        let header = read_header(bytes)?;
        for s in &header.sections {
            if Sha256::digest(s.bytes(bytes)).as_slice() != s.sha256 {
                return Err(FormatError::SectionChecksum(s.kind));
            }
        }
        let section = |kind| header.section(kind).bytes(bytes);
        let text = section(SectionKind::Text);
        let text_len = text.len() as u64;
        let metadata = decode::meta(section(SectionKind::Meta))?;
        let kernels = decode::kernels(section(SectionKind::Kernels), text_len)?;
        let relocs = decode::relocs(section(SectionKind::Relocs), text_len, &kernels)?;
        let (profiles, padding) = decode::profiles(section(SectionKind::Profiles), kernels.len())?;
        if header.arch == Arch::Nvptx64 && (profiles.len() != 1 || !profiles[0].schedule.is_empty())
        {
            return Err(FormatError::Malformed {
                section: SectionKind::Profiles,
                detail: "a CUDA artifact has one profile, whose schedule is in TEXT".into(),
            });
        }
        let weights = section(SectionKind::Weights);
        let golden = golden::decode(section(SectionKind::Golden))?;
        Ok(ArtifactView {
            header,
            metadata,
            weights,
            text,
            kernels,
            relocs,
            profiles,
            padding,
            golden,
        })
    }

    /// What TEXT holds (machine code or CUDA modules, by the header's
    /// architecture), CUDA modules decoded and checked.
    pub fn code(&self) -> Result<Code<'_>, FormatError> {
        code_of(self.header.arch, self.text, &self.kernels, &self.relocs)
    }

    /// The arena one session needs: the largest profile's.
    pub fn arena_size(&self) -> u64 {
        largest_arena(&self.profiles)
    }

    /// An owned copy.
    pub fn into_artifact(self) -> Artifact {
        Artifact {
            arch: self.header.arch,
            features: self.header.features,
            metadata: self.metadata,
            weights: self.weights.to_vec(),
            text: self.text.to_vec(),
            kernels: self.kernels,
            relocs: self.relocs,
            profiles: self.profiles,
            padding: self.padding,
            golden: self.golden.into_owned(),
        }
    }
}

/// The one place that decides what TEXT holds.
fn code_of<'a>(
    arch: Arch,
    text: &'a [u8],
    kernels: &'a [KernelEntry],
    relocs: &'a [Reloc],
) -> Result<Code<'a>, FormatError> {
    match arch {
        Arch::Nvptx64 => CudaCode::parse(text).map(Code::Cuda),
        Arch::X86_64 | Arch::Aarch64 => Ok(Code::Machine {
            text,
            kernels,
            relocs,
        }),
    }
}
