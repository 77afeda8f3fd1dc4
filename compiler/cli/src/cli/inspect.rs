//! `kiln inspect`: what an ONNX model holds and what Kiln makes of it
//! (its IR after the passes, or the graph for Graphviz), or what an
//! artifact holds (CPU or CUDA).

use super::compile::print_pass_times;
use super::options::{compile_options, ModelArgs};
use super::{exit, Failure};
use clap::Args;
use kiln_driver::report::{artifact_json, hex};
use kiln_driver::{self as driver, DriverError, Target};
use kiln_format::{self as format, ArtifactView, Code};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

#[derive(Args)]
pub(super) struct InspectArgs {
    /// An ONNX model or a .kiln artifact.
    path: PathBuf,
    #[command(flatten)]
    model_args: ModelArgs,
    /// Print a machine-readable description (same as --format json).
    #[arg(long)]
    json: bool,
    /// Output format: text, json, or (ONNX models) dot: the optimized
    /// graph for Graphviz, nodes filled by precision.
    #[arg(long, value_enum, default_value_t = InspectFormat::Text)]
    format: InspectFormat,
}

/// `kiln inspect --format`.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum InspectFormat {
    Text,
    Json,
    Dot,
}

fn is_artifact(path: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; kiln_format::PEEK_LEN];
    // Not a plain open: a FIFO would block it.
    kiln_runtime::open_regular(path)
        .and_then(|(mut f, _)| f.read_exact(&mut head))
        .is_ok_and(|_| kiln_format::peek(&head).is_some())
}

pub(super) fn cmd_inspect(mut a: InspectArgs) -> Result<(), Failure> {
    a.json |= a.format == InspectFormat::Json;
    if is_artifact(&a.path) {
        if a.format == InspectFormat::Dot {
            return Err(Failure::new(
                exit::USAGE,
                "--format dot renders an ONNX model's optimized graph, not an artifact",
            ));
        }
        inspect_artifact(&a)
    } else {
        inspect_model(&a)
    }
}

/// `kiln inspect`'s listing of the dense kernels chosen.
fn print_dense_kernels(kernels: &[format::DenseKernel]) {
    if kernels.is_empty() {
        return;
    }
    println!("  dense kernels (node, op, MFLOP, kernel; candidates that declined):");
    for k in kernels {
        println!(
            "    {:<32} {:<8} {:>10.2}  {}",
            k.node,
            k.op,
            k.flops as f64 / 1e6,
            k.kernel
        );
        for d in &k.declined {
            println!("      {} declined: {}", d.kernel, d.reason);
        }
    }
}

/// `kiln inspect` of an artifact: what every artifact has, then what its
/// code holds (machine code or CUDA modules, [`Code`]).
fn inspect_artifact(a: &InspectArgs) -> Result<(), Failure> {
    let bytes = kiln_runtime::read_regular(&a.path, u64::MAX)
        .map_err(|e| Failure::new(exit::IO, format!("{}: {e}", a.path.display())))?;
    let bad = |e: format::FormatError| Failure::new(exit::BAD_ARTIFACT, e.to_string());
    let view = ArtifactView::parse(&bytes).map_err(bad)?;
    let code = view.code().map_err(bad)?;
    if a.json {
        println!("{}", artifact_json(&view, &code));
        return Ok(());
    }
    let m = &view.metadata;
    println!("artifact {} ({} bytes)", a.path.display(), bytes.len());
    println!(
        "  format version {}, content sha256 {}",
        view.header.version,
        hex(&view.header.content_hash)
    );
    match &code {
        Code::Machine { .. } => println!(
            "  arch {:?}, requires CPU features: {}",
            view.header.arch,
            view.header.features.names().join(" ")
        ),
        Code::Cuda(c) => println!("  CUDA sm_{} (target {})", c.sm, m.target),
    }
    println!("  built by {} with: {}", m.compiler_version, m.options);
    println!("  source model sha256 {}", hex(&m.source_sha256));
    let first = &view.profiles[0];
    print_io(first);
    print_profiles(&view.profiles);
    for d in &view.padding {
        let axes = |what: &str, specs: &[kiln_format::TensorSpec], axes: &[Option<u32>]| {
            let list: Vec<String> = (specs.iter().zip(axes))
                .filter_map(|(s, a)| a.map(|a| format!("{what} {} axis {a}", s.name)))
                .collect();
            list.join(", ")
        };
        println!(
            "  paddable dim {}: {}; outputs cut along {}",
            d.name,
            axes("input", &first.inputs, &d.inputs),
            match axes("output", &first.outputs, &d.outputs) {
                s if s.is_empty() => "none".to_string(),
                s => s,
            }
        );
    }
    if let Some(line) = kiln_driver::report::golden_summary(&view.golden) {
        println!("  {line}");
    }
    match &code {
        Code::Machine {
            text,
            kernels,
            relocs,
        } => {
            println!(
                "  sections: weights {} B, code {} B ({} kernels, {} relocations), schedule {} steps, arena {} B",
                view.weights.len(),
                text.len(),
                kernels.len(),
                relocs.len(),
                first.schedule.len(),
                view.arena_size()
            );
            println!("  kernels:");
            for (i, k) in kernels.iter().enumerate() {
                println!("    #{i:<4} {:>7} B  {}", k.text_len, k.name);
            }
            print_dense_kernels(&first.dense_kernels);
        }
        Code::Cuda(code) => print_cuda_kernels(view.weights.len(), view.arena_size(), code),
    }
    Ok(())
}

/// A CUDA artifact's modules: every kernel with its launch plan and the
/// registers / spills / static shared memory ptxas reported (when the
/// compiler found ptxas).
fn print_cuda_kernels(weights: usize, arena: u64, code: &format::CudaCode) {
    let assembled = !code.cubin.is_empty();
    println!(
        "  sections: weights {weights} B, PTX {} B, cubin {} B, {} kernels, schedule {} steps, device arena {arena} B",
        code.ptx.len(),
        code.cubin.len(),
        code.kernels.len(),
        code.schedule.len(),
    );
    if !assembled {
        println!("  (no cubin: ptxas was not found at compile time, registers unknown)");
    }
    println!(
        "  {:<5} {:<32} {:>16} {:>12} {:>6} {:>5} {:>6}  node",
        "#", "kernel", "grid", "block", "smem", "regs", "spill"
    );
    let known = |n: u32| match assembled {
        true => n.to_string(),
        false => "?".into(),
    };
    for (i, k) in code.kernels.iter().enumerate() {
        let dims = |d: [u32; 3]| format!("{}x{}x{}", d[0], d[1], d[2]);
        println!(
            "  {i:<5} {:<32} {:>16} {:>12} {:>6} {:>5} {:>6}  {}",
            k.name,
            dims(k.grid),
            dims(k.block),
            u64::from(k.shared_bytes) + u64::from(k.static_shared_bytes),
            known(k.registers),
            known(k.spill_bytes),
            k.node
        );
    }
}

fn inspect_model(a: &InspectArgs) -> Result<(), Failure> {
    let proto = kiln_onnx::load_model(&a.path).map_err(|e| Failure::from(DriverError::from(e)))?;
    let summary = kiln_onnx::summarize(&proto);
    let opts = compile_options(&a.model_args, Target::default())?;
    let optimized = driver::optimize(&a.path, &opts);
    if let (Ok(o), true) = (&optimized, a.model_args.time_passes) {
        print_pass_times(&o.report, o.import_time, None);
    }
    if a.format == InspectFormat::Dot {
        let o = optimized.map_err(|e| {
            let f = Failure::from(e);
            Failure::new(f.code, format!("{}: {}", a.path.display(), f.message))
        })?;
        print!("{}", kiln_ir::text::dot(&o.graph));
        return Ok(());
    }
    let ir = optimized.map(|o| {
        (
            kiln_ir::text::print(&o.graph),
            kiln_ir::cost::dense_flops(&o.graph),
        )
    });
    let dims = |dims: &[kiln_onnx::DimSummary]| -> String {
        dims.iter()
            .map(|d| match d {
                kiln_onnx::DimSummary::Known(n) => n.to_string(),
                kiln_onnx::DimSummary::Symbolic(s) => s.clone(),
                kiln_onnx::DimSummary::Unknown => "?".to_string(),
            })
            .collect::<Vec<_>>()
            .join(",")
    };
    if a.json {
        let io = |list: &[kiln_onnx::IoSummary]| -> Value {
            Value::Array(
                list.iter()
                    .map(|i| json!({"name": i.name, "dtype": i.dtype, "dims": dims(&i.dims)}))
                    .collect(),
            )
        };
        let (ir_text, dense_flops, ir_error) = match &ir {
            Ok((t, flops)) => (Some(t.clone()), Some(*flops), None),
            Err(e) => (None, None, Some(e.to_string())),
        };
        println!(
            "{}",
            json!({
                "kind": "onnx",
                "ir_version": summary.ir_version,
                "opsets": summary.opsets.iter().map(|(d, v)| json!({"domain": d, "version": v})).collect::<Vec<_>>(),
                "producer": summary.producer,
                "inputs": io(&summary.inputs),
                "outputs": io(&summary.outputs),
                "op_histogram": summary.op_histogram,
                "initializers": summary.initializer_count,
                "initializer_bytes": summary.initializer_bytes,
                "ir": ir_text,
                "dense_flops": dense_flops,
                "ir_error": ir_error,
            })
        );
        return Ok(());
    }
    println!(
        "model {} (ir_version {}, producer '{}')",
        a.path.display(),
        summary.ir_version,
        summary.producer
    );
    let opsets: Vec<String> = summary
        .opsets
        .iter()
        .map(|(d, v)| format!("{}:{v}", if d.is_empty() { "ai.onnx" } else { d }))
        .collect();
    println!("  opsets: {}", opsets.join(" "));
    for i in &summary.inputs {
        println!("  input  {}: {}[{}]", i.name, i.dtype, dims(&i.dims));
    }
    for o in &summary.outputs {
        println!("  output {}: {}[{}]", o.name, o.dtype, dims(&o.dims));
    }
    println!(
        "  initializers: {} ({} bytes)",
        summary.initializer_count, summary.initializer_bytes
    );
    println!("  ops:");
    for (op, n) in &summary.op_histogram {
        println!("    {n:>5}  {op}");
    }
    match ir {
        Ok((text, flops)) => {
            println!(
                "  dense FLOPs (MatMul, Gemm, Conv; a multiply-add is 2): {flops} ({:.3} GFLOP)",
                flops as f64 / 1e9
            );
            println!("IR after -O{}:", opts.opt_level);
            print!("{text}");
        }
        Err(e) => println!("IR not shown: {e}"),
    }
    Ok(())
}

/// With more than one profile, a line per profile: its input and output
/// shapes, arena and steps. (The other lines describe the first profile.)
fn print_profiles(profiles: &[kiln_format::Profile]) {
    if profiles.len() < 2 {
        return;
    }
    println!(
        "  profiles: {} (a run's input shapes, and for variants the conditions, pick one; the lines above and below describe profile 0)",
        profiles.len()
    );
    for (i, p) in profiles.iter().enumerate() {
        let outputs: Vec<String> = (p.outputs.iter())
            .map(|s| format!("{}: {}", s.name, s.type_string()))
            .collect();
        let role = kiln_driver::report::describe_role(&p.role, profiles);
        let role = match role.is_empty() {
            true => role,
            false => format!(" ({role})"),
        };
        println!(
            "    #{i:<3} {} -> {}; arena {} B, {} steps{role}",
            p.describe_inputs(),
            outputs.join(", "),
            p.arena_size,
            p.schedule.len()
        );
    }
}

/// The `input`/`output` lines of an artifact description; an output whose
/// size depends on the data says along which axis, up to what bound.
fn print_io(m: &kiln_format::Profile) {
    for (what, specs) in [("input ", &m.inputs), ("output", &m.outputs)] {
        for (i, s) in specs.iter().enumerate() {
            let bounded = (m.bounded.iter())
                .find(|b| what == "output" && b.output as usize == i)
                .map_or(String::new(), |b| {
                    format!(
                        "; bounded: axis {} is the run's data-dependent length (at most {}; the length @ arena+{})",
                        b.axis,
                        s.shape.get(b.axis as usize).copied().unwrap_or(0),
                        b.length_offset
                    )
                });
            println!(
                "  {what} {}: {} @ arena+{}{bounded}",
                s.name,
                s.type_string(),
                s.arena_offset
            );
        }
    }
}
