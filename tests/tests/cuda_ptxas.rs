//! Offline PTX validation: every fixture model, compiled for every
//! supported SM, assembles with NVIDIA's `ptxas` (from the PyPI wheel
//! `nvidia-cuda-nvcc-cu12`, installed by `scripts/ptxas.sh`; no GPU).
//!
//! A module ptxas rejects fails the test with the kernel and source node of
//! every error line. The register and spill figures of `ptxas -v` are
//! collected per kernel and written to `target/cuda-ptxas-report.tsv`.

use kiln_target_cuda::{CudaProgram, SmArch, SUPPORTED_SMS};
use kiln_tests::{repo_root, Fixture};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The ptxas binary: `KILN_PTXAS`, or the one `scripts/ptxas.sh` installs.
fn ptxas() -> PathBuf {
    let out = Command::new("bash")
        .arg(repo_root().join("scripts/ptxas.sh"))
        .output()
        .expect("run scripts/ptxas.sh");
    assert!(
        out.status.success(),
        "scripts/ptxas.sh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).expect("utf-8 path").trim())
}

/// What `ptxas -v` reported for one kernel.
#[derive(Debug, Default)]
struct KernelStats {
    name: String,
    registers: u32,
    spill_bytes: u32,
}

/// Assembles `program`'s module; on failure, the error lines with the
/// kernel and node each one falls in.
fn assemble(ptxas: &Path, dir: &Path, program: &CudaProgram) -> Result<Vec<KernelStats>, String> {
    let arch = program.sm.arch_name();
    let ptx = dir.join(format!("{arch}.ptx"));
    std::fs::write(&ptx, &program.ptx).expect("write ptx");
    let out = Command::new(ptxas)
        .arg(format!("-arch={arch}"))
        .arg("-v")
        .arg(&ptx)
        .arg("-o")
        .arg(dir.join(format!("{arch}.cubin")))
        .output()
        .expect("run ptxas");
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        let mut lines = Vec::new();
        for l in log.lines() {
            let kernel = l
                .split(", line ")
                .nth(1)
                .and_then(|rest| rest.split(';').next())
                .and_then(|n| n.trim().parse::<usize>().ok())
                .and_then(|n| program.kernel_at_line(n));
            match kernel {
                Some(k) => lines.push(format!(
                    "kernel {} (node '{}', {}): {l}",
                    k.name, k.node, k.op
                )),
                None => lines.push(l.to_string()),
            }
        }
        return Err(lines.join("\n"));
    }
    // "Compiling entry function 'k' for 'sm_80'" opens a kernel's lines;
    // "Used N registers" and "N bytes spill stores" follow.
    let mut stats: Vec<KernelStats> = Vec::new();
    for l in log.lines() {
        if let Some(rest) = l.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or_default().to_string();
            stats.push(KernelStats {
                name,
                ..KernelStats::default()
            });
        } else if let Some(k) = stats.last_mut() {
            if let Some(rest) = l.split("Used ").nth(1) {
                k.registers = rest
                    .split(' ')
                    .next()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
            }
            if let Some(pos) = l.find(" bytes spill stores") {
                let before = &l[..pos];
                let n = before.rsplit([' ', ',']).next().unwrap_or("0");
                k.spill_bytes += n.parse::<u32>().unwrap_or(0);
            }
        }
    }
    Ok(stats)
}

#[test]
fn every_fixture_kernel_assembles_for_every_sm() {
    let ptxas = ptxas();
    let work = tempfile::tempdir().expect("temp dir");
    let mut failures = Vec::new();
    let mut report = String::from("model\tsm\tkernels\tmax_registers\tspill_bytes\n");
    let mut assembled = 0usize;
    let names = Fixture::all_names();
    assert!(
        names.len() > 100,
        "expected the fixtures, found {}",
        names.len()
    );
    for name in &names {
        let fixture = Fixture::load(name);
        let graph = match kiln::driver::optimize(&fixture.model_path(), &fixture.compile_options())
        {
            Ok(o) => o.graph,
            Err(e) => {
                failures.push(format!("{name}: import: {e}"));
                continue;
            }
        };
        for sm in SUPPORTED_SMS {
            let program = match kiln_target_cuda::compile(&graph, sm) {
                Ok(p) => p,
                Err(e) => {
                    failures.push(format!("{name} sm_{}: compile: {e}", sm.sm));
                    continue;
                }
            };
            let dir = work.path().join(name);
            std::fs::create_dir_all(&dir).expect("mkdir");
            match assemble(&ptxas, &dir, &program) {
                Ok(stats) => {
                    assert_eq!(
                        stats.len(),
                        program.kernels.len(),
                        "{name} sm_{}: ptxas reported {} kernels, the module has {}",
                        sm.sm,
                        stats.len(),
                        program.kernels.len()
                    );
                    let mut reported: Vec<&str> = stats.iter().map(|s| s.name.as_str()).collect();
                    let mut emitted: Vec<&str> =
                        program.kernels.iter().map(|k| k.name.as_str()).collect();
                    reported.sort_unstable();
                    emitted.sort_unstable();
                    assert_eq!(reported, emitted, "{name}: kernels ptxas compiled");
                    assembled += stats.len();
                    report.push_str(&format!(
                        "{name}\tsm_{}\t{}\t{}\t{}\n",
                        sm.sm,
                        stats.len(),
                        stats.iter().map(|s| s.registers).max().unwrap_or(0),
                        stats.iter().map(|s| s.spill_bytes).sum::<u32>()
                    ));
                }
                Err(e) => failures.push(format!(
                    "{name} sm_{}: ptxas rejected the module:\n{e}",
                    sm.sm
                )),
            }
        }
    }
    let report_path = repo_root().join("target/cuda-ptxas-report.tsv");
    let _ = std::fs::write(&report_path, &report);
    println!(
        "{assembled} kernels assembled; report in {}",
        report_path.display()
    );
    assert!(
        failures.is_empty(),
        "{} failure(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn a_rejected_kernel_is_reported_with_its_node() {
    // A deliberately broken module (an undefined register in the first
    // kernel) must fail and name that kernel and its node: the check above
    // can fail.
    let ptxas = ptxas();
    let fixture = Fixture::load("op_relu");
    let graph = kiln::driver::optimize(&fixture.model_path(), &fixture.compile_options())
        .expect("import")
        .graph;
    let sm = SmArch::parse("sm80").expect("sm80");
    let mut program = kiln_target_cuda::compile(&graph, sm).expect("compile");
    let first = program.kernels[0].clone();
    let ret = program
        .ptx
        .find("\tret;")
        .expect("the first kernel returns");
    program
        .ptx
        .insert_str(ret, "\tadd.u32 %undefined_reg, 1, 2;\n");
    let work = tempfile::tempdir().expect("temp dir");
    let err = assemble(&ptxas, work.path(), &program).expect_err("ptxas must reject it");
    assert!(
        err.contains(&format!("kernel {} (node '{}'", first.name, first.node)),
        "{err}"
    );
}
