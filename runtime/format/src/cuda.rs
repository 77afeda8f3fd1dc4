//! The code of a CUDA artifact: PTX module, optional cubin, kernel table
//! with launch plans, and the schedule.
//!
//! A CUDA artifact has the architecture [`Arch::Nvptx64`](super::Arch) in
//! its header and the SM it was compiled for (e.g. 80) in the header's
//! requirements field; its TEXT section holds a [`CudaCode`] and its
//! RELOCS and KERNELS sections are empty and its one profile has no steps (kernels and schedule
//! live here, with the fields a GPU launch needs). Layout, little-endian:
//!
//! ```text
//! magic "KILNPTX\0" | sm u32 | ptx: u32 len + UTF-8 | cubin: u64 len + bytes
//! | kernel count u32 | per kernel: name str, node str, grid 3×u32,
//!   block 3×u32, dynamic shared u32, registers u32, spill bytes u32,
//!   static shared u32
//! | step count u32 | per step: kernel index u32
//! ```
//!
//! Registers, spills and static shared memory come from `ptxas -v` when the
//! compiler found ptxas (0 otherwise, with an empty cubin).

use super::cursor::{Reader, Writer};
use super::{Arch, Artifact, CpuFeatures, FormatError, Metadata, Profile, SectionKind};

/// The magic opening a [`CudaCode`].
pub const CUDA_MAGIC: [u8; 8] = *b"KILNPTX\0";

/// One kernel of a CUDA artifact.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaKernel {
    /// The `.entry` name in the PTX module.
    pub name: String,
    /// The source node (for `kiln inspect` and errors).
    pub node: String,
    /// Grid dimensions in blocks.
    pub grid: [u32; 3],
    /// Block dimensions in threads.
    pub block: [u32; 3],
    /// Dynamic shared memory per block in bytes.
    pub shared_bytes: u32,
    /// Registers per thread reported by ptxas (0: not assembled).
    pub registers: u32,
    /// Spill store bytes reported by ptxas.
    pub spill_bytes: u32,
    /// Static shared memory reported by ptxas.
    pub static_shared_bytes: u32,
}

/// The TEXT section of a CUDA artifact.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaCode {
    /// Compute capability times ten the code was compiled for.
    pub sm: u32,
    /// The PTX module (kept also when a cubin is present, so newer GPUs can
    /// JIT it).
    pub ptx: String,
    /// The module assembled by ptxas for exactly `sm`, or empty.
    pub cubin: Vec<u8>,
    /// Kernels of the module.
    pub kernels: Vec<CudaKernel>,
    /// Kernel launches of one inference, in order (indices into `kernels`).
    pub schedule: Vec<u32>,
}

/// Smallest encoded kernel record: two empty strings and ten u32 fields.
const MIN_KERNEL: usize = 8 + 10 * 4;

impl CudaCode {
    /// Encodes the code (deterministic).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.bytes(&CUDA_MAGIC);
        w.u32(self.sm);
        w.str(&self.ptx);
        w.u64(self.cubin.len() as u64);
        w.bytes(&self.cubin);
        w.len(self.kernels.len());
        for k in &self.kernels {
            w.str(&k.name);
            w.str(&k.node);
            for v in k.grid.iter().chain(&k.block) {
                w.u32(*v);
            }
            w.u32(k.shared_bytes);
            w.u32(k.registers);
            w.u32(k.spill_bytes);
            w.u32(k.static_shared_bytes);
        }
        w.len(self.schedule.len());
        for &s in &self.schedule {
            w.u32(s);
        }
        w.0
    }

    /// The artifact that carries this code: architecture
    /// [`Arch::Nvptx64`](super::Arch), the SM in the header's requirements
    /// field, the code as TEXT, empty RELOCS and KERNELS, and `profile`
    /// (without steps: the schedule is in TEXT) as the one profile.
    pub fn into_artifact(self, metadata: Metadata, profile: Profile, weights: Vec<u8>) -> Artifact {
        Artifact {
            arch: Arch::Nvptx64,
            features: CpuFeatures(u64::from(self.sm)),
            metadata,
            weights,
            text: self.to_bytes(),
            kernels: Vec::new(),
            relocs: Vec::new(),
            profiles: vec![Profile {
                schedule: Vec::new(),
                ..profile
            }],
            padding: Vec::new(),
            golden: crate::Golden::default(),
        }
    }

    /// Decodes and checks a TEXT section: magic, lengths, every kernel's
    /// launch dimensions non-zero, every scheduled index in range.
    pub fn parse(bytes: &[u8]) -> Result<CudaCode, FormatError> {
        let mut r = Reader::new(bytes, SectionKind::Text);
        if r.take(8, "CUDA magic")? != CUDA_MAGIC {
            return Err(
                r.error("the TEXT section of a CUDA artifact does not start with \"KILNPTX\\0\"")
            );
        }
        let sm = r.u32("sm")?;
        let ptx = r.str("PTX module")?;
        let cubin_len = r.u64("cubin length")?;
        let cubin = r.take(cubin_len, "cubin")?.to_vec();
        if !cubin.is_empty() {
            super::elf::check_cubin(&cubin).map_err(|e| r.error(e))?;
        }
        let n = r.count("kernel count", MIN_KERNEL)?;
        let mut kernels = Vec::with_capacity(n);
        for i in 0..n {
            let name = r.str("kernel name")?;
            let node = r.str("kernel node")?;
            let mut dims = [0u32; 6];
            for d in &mut dims {
                *d = r.u32("launch dimension")?;
            }
            if dims.contains(&0) {
                return Err(r.error(format!("kernel {i} ('{name}') has a zero launch dimension")));
            }
            kernels.push(CudaKernel {
                name,
                node,
                grid: [dims[0], dims[1], dims[2]],
                block: [dims[3], dims[4], dims[5]],
                shared_bytes: r.u32("shared bytes")?,
                registers: r.u32("registers")?,
                spill_bytes: r.u32("spill bytes")?,
                static_shared_bytes: r.u32("static shared bytes")?,
            });
        }
        let steps = r.count("step count", 4)?;
        let mut schedule = Vec::with_capacity(steps);
        for _ in 0..steps {
            let k = r.u32("scheduled kernel")?;
            if k as usize >= kernels.len() {
                return Err(r.error(format!(
                    "a step calls kernel {k}, but there are {} kernels",
                    kernels.len()
                )));
            }
            schedule.push(k);
        }
        r.finish()?;
        Ok(CudaCode {
            sm,
            ptx,
            cubin,
            kernels,
            schedule,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code() -> CudaCode {
        CudaCode {
            sm: 80,
            ptx: ".version 7.0\n".into(),
            cubin: crate::elf::tests::tiny_cubin(),
            kernels: vec![CudaKernel {
                name: "k0".into(),
                node: "relu".into(),
                grid: [4, 1, 1],
                block: [256, 1, 1],
                shared_bytes: 0,
                registers: 12,
                spill_bytes: 0,
                static_shared_bytes: 0,
            }],
            schedule: vec![0, 0],
        }
    }

    #[test]
    fn round_trips() {
        let c = code();
        assert_eq!(CudaCode::parse(&c.to_bytes()).unwrap(), c);
    }

    #[test]
    fn bad_indices_and_dimensions_are_errors() {
        let mut c = code();
        c.schedule.push(1);
        let e = CudaCode::parse(&c.to_bytes()).unwrap_err().to_string();
        assert!(e.contains("calls kernel 1"), "{e}");
        let mut c = code();
        c.kernels[0].block[1] = 0;
        let e = CudaCode::parse(&c.to_bytes()).unwrap_err().to_string();
        assert!(e.contains("zero launch dimension"), "{e}");
        let mut c = code();
        c.cubin.truncate(100);
        let e = CudaCode::parse(&c.to_bytes()).unwrap_err().to_string();
        assert!(e.contains("outside its 100 bytes"), "{e}");
        let bytes = code().to_bytes();
        for cut in [0, 7, 12, bytes.len() - 1] {
            assert!(CudaCode::parse(&bytes[..cut]).is_err());
        }
    }
}
