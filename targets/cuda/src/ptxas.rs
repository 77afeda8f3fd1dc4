//! Running NVIDIA's `ptxas` on a compiled module: the cubin for the target
//! SM and the per-kernel resource figures of `ptxas -v`.
//!
//! `ptxas` is optional at compile time: [`find_ptxas`] looks at `KILN_PTXAS`
//! and then `PATH`. `scripts/ptxas.sh` installs it from the PyPI wheel
//! `nvidia-cuda-nvcc-cu12` (no GPU needed).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::{CudaError, CudaProgram};

/// What `ptxas -v` reported for one kernel.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelResources {
    /// The `.entry` name.
    pub name: String,
    /// Registers per thread.
    pub registers: u32,
    /// Spill store bytes.
    pub spill_bytes: u32,
    /// Static shared memory bytes.
    pub static_shared_bytes: u32,
}

/// A module assembled by ptxas.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assembled {
    /// The cubin for the program's SM.
    pub cubin: Vec<u8>,
    /// Resources of every kernel, in the program's kernel order.
    pub kernels: Vec<KernelResources>,
}

/// The ptxas to use: `KILN_PTXAS` if set, else `ptxas` on `PATH`.
pub fn find_ptxas() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("KILN_PTXAS").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("ptxas"))
        .find(|p| p.is_file())
}

/// Assembles `program` with `ptxas -arch=sm_XX -v`. A rejected module is
/// [`CudaError::PtxasRejected`] naming the kernel and node of the first
/// error line.
pub fn assemble(ptxas: &Path, program: &CudaProgram) -> Result<Assembled, CudaError> {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "kiln-ptxas-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let io = |e: std::io::Error| CudaError::Ptxas(format!("{}: {e}", dir.display()));
    std::fs::create_dir_all(&dir).map_err(io)?;
    let result = assemble_in(ptxas, program, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn assemble_in(ptxas: &Path, program: &CudaProgram, dir: &Path) -> Result<Assembled, CudaError> {
    let arch = program.sm.arch_name();
    let ptx = dir.join("module.ptx");
    let cubin = dir.join("module.cubin");
    std::fs::write(&ptx, &program.ptx)
        .map_err(|e| CudaError::Ptxas(format!("{}: {e}", ptx.display())))?;
    let out = Command::new(ptxas)
        .arg(format!("-arch={arch}"))
        .arg("-v")
        .arg(&ptx)
        .arg("-o")
        .arg(&cubin)
        .output()
        .map_err(|e| CudaError::Ptxas(format!("cannot run {}: {e}", ptxas.display())))?;
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        return Err(rejected(program, &log));
    }
    let resources = parse_resources(&log);
    let kernels = program
        .kernels
        .iter()
        .map(|k| {
            resources
                .iter()
                .find(|r| r.name == k.name)
                .cloned()
                .ok_or_else(|| CudaError::Ptxas(format!("ptxas did not report kernel {}", k.name)))
        })
        .collect::<Result<_, _>>()?;
    let cubin =
        std::fs::read(&cubin).map_err(|e| CudaError::Ptxas(format!("{}: {e}", cubin.display())))?;
    Ok(Assembled { cubin, kernels })
}

/// The error for a module ptxas rejected: every log line, each error line
/// prefixed with the kernel and node its line number falls in.
fn rejected(program: &CudaProgram, log: &str) -> CudaError {
    let mut first = None;
    let mut lines = Vec::new();
    for l in log.lines() {
        let kernel = l
            .split(", line ")
            .nth(1)
            .and_then(|rest| rest.split(';').next())
            .and_then(|n| n.trim().parse::<usize>().ok())
            .and_then(|n| program.kernel_at_line(n));
        match kernel {
            Some(k) => {
                first.get_or_insert((k.name.clone(), k.node.clone()));
                lines.push(format!(
                    "kernel {} (node '{}', {}): {l}",
                    k.name, k.node, k.op
                ));
            }
            None => lines.push(l.to_string()),
        }
    }
    let (kernel, node) = first.unwrap_or_default();
    CudaError::PtxasRejected {
        kernel,
        node,
        log: lines.join("\n"),
    }
}

/// Per-kernel figures from a `ptxas -v` log: "Compiling entry function
/// 'k' for 'sm_80'" opens a kernel; "N bytes spill stores" and "Used N
/// registers, ... N bytes smem" follow.
pub fn parse_resources(log: &str) -> Vec<KernelResources> {
    let mut out: Vec<KernelResources> = Vec::new();
    let number_before = |l: &str, pat: &str| -> Option<u32> {
        let pos = l.find(pat)?;
        l[..pos].rsplit([' ', ',']).next()?.parse().ok()
    };
    for l in log.lines() {
        if let Some(rest) = l.split("Compiling entry function '").nth(1) {
            out.push(KernelResources {
                name: rest.split('\'').next().unwrap_or_default().to_string(),
                ..KernelResources::default()
            });
        } else if let Some(k) = out.last_mut() {
            if let Some(rest) = l.split("Used ").nth(1) {
                k.registers = rest
                    .split(' ')
                    .next()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
                k.static_shared_bytes = number_before(l, " bytes smem").unwrap_or(0);
            }
            if let Some(n) = number_before(l, " bytes spill stores") {
                k.spill_bytes += n;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_are_read_from_a_ptxas_log() {
        let log = "ptxas info    : 0 bytes gmem\n\
ptxas info    : Compiling entry function 'kiln_0_conv' for 'sm_80'\n\
ptxas info    : Function properties for kiln_0_conv\n\
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n\
ptxas info    : Used 40 registers, used 1 barriers, 128 bytes smem, 368 bytes cmem[0]\n\
ptxas info    : Compiling entry function 'kiln_1_relu' for 'sm_80'\n\
ptxas info    : Used 8 registers, 368 bytes cmem[0]\n";
        let r = parse_resources(log);
        assert_eq!(
            r,
            vec![
                KernelResources {
                    name: "kiln_0_conv".into(),
                    registers: 40,
                    spill_bytes: 4,
                    static_shared_bytes: 128
                },
                KernelResources {
                    name: "kiln_1_relu".into(),
                    registers: 8,
                    spill_bytes: 0,
                    static_shared_bytes: 0
                },
            ]
        );
    }
}
