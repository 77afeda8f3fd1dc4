//! What `--target` names, parsed once into a [`Target`], and the
//! [`Backend`] that compiles for it: the one place where the driver's
//! pipeline differs by target.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use kiln_format::{Artifact, ArtifactInfo};
use kiln_ir::Graph;
use kiln_passes::PassManager;
use kiln_target_cpu::{CpuOptions, CpuTarget};
use kiln_target_cuda::SmArch;

use crate::error::DriverError;

/// A code generation target: a CPU instruction set or a CUDA architecture.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Machine code for a CPU (`native`, `x86_64-v3`, `x86_64-avx512`,
    /// `aarch64`).
    Cpu(CpuTarget),
    /// PTX (and a cubin when `ptxas` is found) for an NVIDIA GPU
    /// (`cuda-sm80`, ...).
    Cuda(SmArch),
}

impl Default for Target {
    fn default() -> Self {
        Target::Cpu(CpuTarget::Native)
    }
}

impl FromStr for Target {
    type Err = String;

    /// `cuda-smNN` (or `cudasmNN`, `cuda-sm_NN`) names a GPU; anything else
    /// must be a CPU target name.
    fn from_str(s: &str) -> Result<Target, String> {
        match s.strip_prefix("cuda-").or(s.strip_prefix("cuda")) {
            Some(sm) => SmArch::parse(sm)
                .map(Target::Cuda)
                .map_err(|e| e.to_string()),
            None => s
                .parse()
                .map(Target::Cpu)
                .map_err(|e: kiln_target_cpu::CpuError| e.to_string()),
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Cpu(t) => write!(f, "{t}"),
            Target::Cuda(sm) => write!(f, "cuda-sm{}", sm.sm),
        }
    }
}

impl Target {
    /// The backend that compiles for this target.
    pub fn backend(self) -> Box<dyn Backend> {
        match self {
            Target::Cpu(target) => Box::new(CpuBackend(target)),
            Target::Cuda(sm) => Box::new(CudaBackend(sm)),
        }
    }

    /// How many tasks a dense kernel is split into when `--threads` is not
    /// given (1 where the target does not split kernels).
    pub fn default_threads(self) -> usize {
        match self {
            Target::Cpu(t) => t.default_threads(),
            Target::Cuda(_) => 1,
        }
    }

    /// The CUDA architecture, for a GPU target.
    pub fn cuda(self) -> Option<SmArch> {
        match self {
            Target::Cuda(sm) => Some(sm),
            Target::Cpu(_) => None,
        }
    }
}

/// What code generation produced besides the artifact.
#[derive(Debug, Default)]
pub struct Generated {
    /// CUDA targets: every kernel as a standalone PTX module (name, text),
    /// for `--dump-ptx`.
    pub ptx_kernels: Vec<(String, String)>,
    /// CUDA targets: the `ptxas` that assembled the cubin, if one was found.
    pub ptxas: Option<PathBuf>,
}

/// Compiles an optimized graph for one target. The driver runs the same
/// steps for every target and asks the backend where they differ.
pub trait Backend {
    /// The pass pipeline for this target, given the one the level or
    /// `--passes` chose.
    fn pipeline(&self, pm: PassManager) -> PassManager {
        pm
    }

    /// Whether the code splits kernels into tasks for a multi-threaded
    /// session, so that `--threads` decides the artifact.
    fn splits_kernels(&self) -> bool;

    /// The artifact of optimized graphs, one profile each (the same model
    /// specialized to different input shapes); `threads` is the most tasks
    /// a kernel is split into (see [`Backend::splits_kernels`]).
    fn generate(
        &self,
        graphs: &[&Graph],
        threads: usize,
        info: ArtifactInfo,
    ) -> Result<(Artifact, Generated), DriverError>;
}

/// The CPU target (`kiln-target-cpu`: Cranelift and the microkernels).
struct CpuBackend(CpuTarget);

impl Backend for CpuBackend {
    fn splits_kernels(&self) -> bool {
        true
    }

    fn generate(
        &self,
        graphs: &[&Graph],
        threads: usize,
        info: ArtifactInfo,
    ) -> Result<(Artifact, Generated), DriverError> {
        let cpu = CpuOptions {
            target: self.0,
            // Cranelift optimizes for speed at every `-O`: `-O0` keeps the
            // graph as imported, it does not ask for unoptimized machine
            // code (and every artifact so far was built this way).
            opt_level: 1,
            threads,
        };
        let artifact = kiln_target_cpu::compile_profiles(graphs, &cpu, info)?;
        Ok((artifact, Generated::default()))
    }
}

/// The CUDA target (`kiln-target-cuda`: PTX, assembled by `ptxas` when it
/// is installed).
struct CudaBackend(SmArch);

impl Backend for CudaBackend {
    /// The CUDA target lowers headless fused kernels only (it fuses unary
    /// epilogues into dense kernels in its own plan) and has no attention
    /// kernel.
    fn pipeline(&self, pm: PassManager) -> PassManager {
        pm.with_replaced(kiln_passes::Fuse::elementwise_only())
            .with_replaced(kiln_passes::Recognize::without_attention())
    }

    fn splits_kernels(&self) -> bool {
        false
    }

    fn generate(
        &self,
        graphs: &[&Graph],
        _threads: usize,
        info: ArtifactInfo,
    ) -> Result<(Artifact, Generated), DriverError> {
        let [graph] = graphs else {
            return Err(DriverError::Usage(format!(
                "the CUDA target builds one profile per artifact, and this build makes {} (the shapes of --dim/--input-shape, or the paths of an If or Loop that decides on run-time values): compile one artifact per shape, and bind the inputs such conditions read (--bind-input)",
                graphs.len()
            )));
        };
        let program = kiln_target_cuda::compile(graph, self.0)?;
        let ptxas = kiln_target_cuda::ptxas::find_ptxas();
        let assembled = match &ptxas {
            Some(p) => Some(kiln_target_cuda::ptxas::assemble(p, &program)?),
            None => None,
        };
        let artifact = kiln_target_cuda::artifact::to_artifact(&program, assembled.as_ref(), info);
        let generated = Generated {
            ptx_kernels: program.kernel_modules(),
            ptxas,
        };
        Ok((artifact, generated))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_bad_names_say_what_is_accepted() {
        for name in [
            "native",
            "x86_64-v3",
            "x86_64-avx512",
            "aarch64",
            "cuda-sm80",
            "cuda-sm90",
        ] {
            let t: Target = name.parse().unwrap();
            assert_eq!(t.to_string(), name);
        }
        assert_eq!(
            "cudasm_86".parse::<Target>().unwrap().to_string(),
            "cuda-sm86"
        );
        let cpu = "pentium".parse::<Target>().unwrap_err();
        assert!(cpu.contains("x86_64-v3"), "{cpu}");
        let gpu = "cuda-sm61".parse::<Target>().unwrap_err();
        assert!(gpu.contains("sm61"), "{gpu}");
    }
}
