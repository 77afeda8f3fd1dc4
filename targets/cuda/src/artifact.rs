//! A [`CudaProgram`] as a Kiln artifact (`docs/artifact-format.md`):
//! header architecture `nvptx64` with the SM in the requirements field,
//! TEXT holding a [`CudaCode`] (PTX, cubin when ptxas ran, kernels with
//! launch plans and ptxas resources, schedule), WEIGHTS the constants, META
//! the inputs, outputs and arena size. RELOCS, KERNELS and SCHEDULE stay
//! empty: they describe CPU code.

use kiln_format::{Artifact, CudaCode, CudaKernel, Metadata, Profile, TensorSpec};

use crate::ptxas::Assembled;
use crate::{CudaProgram, IoSpec};

pub use kiln_format::ArtifactInfo;

fn spec(io: &IoSpec) -> TensorSpec {
    TensorSpec {
        name: io.name.clone(),
        dtype: io.dtype,
        shape: io.shape.iter().map(|&d| d as u64).collect(),
        arena_offset: io.arena_offset,
    }
}

/// The artifact of `program`; `assembled` (from [`crate::ptxas::assemble`])
/// adds the cubin and the kernels' resources.
pub fn to_artifact(
    program: &CudaProgram,
    assembled: Option<&Assembled>,
    info: ArtifactInfo,
) -> Artifact {
    let kernels = program
        .kernels
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let res = assembled.map(|a| &a.kernels[i]);
            CudaKernel {
                name: k.name.clone(),
                node: k.node.clone(),
                grid: k.launch.grid,
                block: k.launch.block,
                shared_bytes: k.launch.shared_bytes,
                registers: res.map_or(0, |r| r.registers),
                spill_bytes: res.map_or(0, |r| r.spill_bytes),
                static_shared_bytes: res.map_or(0, |r| r.static_shared_bytes),
            }
        })
        .collect::<Vec<_>>();
    let code = CudaCode {
        sm: program.sm.sm,
        ptx: program.ptx.clone(),
        cubin: assembled.map(|a| a.cubin.clone()).unwrap_or_default(),
        schedule: (0..kernels.len() as u32).collect(),
        kernels,
    };
    let metadata = Metadata {
        compiler_version: info.compiler_version,
        target: format!("cuda-sm{}", program.sm.sm),
        options: info.options,
        source_sha256: info.source_sha256,
    };
    let profile = Profile {
        inputs: program.inputs.iter().map(spec).collect(),
        outputs: program.outputs.iter().map(spec).collect(),
        arena_size: program.arena_size,
        dense_kernels: Vec::new(),
        schedule: Vec::new(),
        role: kiln_format::Role::SHAPES,
        bounded: Vec::new(),
    };
    code.into_artifact(metadata, profile, program.weights.clone())
}
