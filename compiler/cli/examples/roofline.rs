//! Single-thread fp32 roofline of this machine next to Kiln's GEMM.
//!
//! ```sh
//! cargo run --release -p kiln --example roofline [-- M N K [runs]]
//! ```
//!
//! 1. **Peak**: the AVX-512 FMA loop of `kiln_target_cpu::microkernel::peak`
//!    (24 independent zmm FMA chains, no memory traffic), best of 40 short
//!    runs (about 30 ms each, so one run without interference from other
//!    processes is likely even on a busy machine).
//! 2. **GEMM**: `A[M,K] @ B[K,N]` with one operand a constant (packed at
//!    compile time) and the other a graph input, both ways round: constant
//!    A is the layout of convolutions and `W @ x`, constant B that of
//!    `x @ W`. Compiled for the native target, loaded by the runtime and run
//!    in a session with `Session::run_profiled`: best and median GFLOP/s
//!    end to end (the time of the whole call, which includes copying the
//!    input into the arena and the output out of it: 8 MB at 1024³) and of
//!    the GEMM kernel alone (the schedule steps' own times, as `kiln bench
//!    --profile` reports them; what a BLAS benchmark times), and the
//!    kernel's best as a fraction of the peak.
//! 3. **Reduced precision** (constant B, `docs/precision.md`): the same
//!    GEMM with bf16 operands (`vdpbf16ps`; the input given in bf16, so
//!    the kernel alone), after `assign-precision` bf16 (an f32 input cast
//!    to bf16 first, as in a model) and fp16 (f16 weights widened in the
//!    kernel). GFLOP/s count the same 2·M·N·K operations.
//! 4. **int8** (constant B): `MatMulInteger` of a u8 input (zero point
//!    128) and i8 weights on AVX512-VNNI (`vpdpbusd`), i32 out; GOP/s of
//!    the same 2·M·N·K operations, and the ratio to the fp32 kernel.

use std::time::Instant;

use kiln_ir::{DType, Data, Graph, Op, Tensor, ValueType};
use kiln_passes::{AssignPrecision, Mode, Policy};
use kiln_runtime::{Model, TensorRef};
use kiln_target_cpu::microkernel::peak;
use kiln_target_cpu::{compile, ArtifactInfo, CpuOptions, CpuTarget};

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("arguments are M N K [runs]"))
        .collect();
    let (m, n, k) = match args[..] {
        [m, n, k, ..] => (m, n, k),
        _ => (1024, 1024, 1024),
    };
    let runs = args.get(3).copied().unwrap_or(50);

    let peak_gflops = peak_gflops();
    match peak_gflops {
        Some(p) => println!("peak (AVX-512 FMA loop, 1 thread): {p:.1} GFLOP/s"),
        None => println!("peak: this host has no AVX-512F; skipped"),
    }

    let mut f32_best = None;
    for (const_a, variant) in [
        (true, Variant::F32),
        (false, Variant::F32),
        (false, Variant::Int8),
        (false, Variant::Bf16Input),
        (false, Variant::Pass(Mode::Bf16)),
        (false, Variant::Pass(Mode::Fp16)),
    ] {
        if variant == Variant::Int8 && !host_has("avx512vnni") {
            println!("no AVX512-VNNI on this host: the int8 GEMM is skipped");
            continue;
        }
        if !matches!(variant, Variant::F32 | Variant::Int8) && !host_has("avx512bf16") {
            println!("no AVX512-BF16 on this host: reduced-precision GEMMs skipped");
            break;
        }
        let t = gemm_gflops(m, n, k, runs, const_a, variant);
        let (best, median) = t.kernel;
        let whole = format!(
            "end to end best {:.1}, median {:.1}; kernel alone best {best:.1}, median {median:.1}",
            t.whole.0, t.whole.1
        );
        if (const_a, variant) == (false, Variant::F32) {
            f32_best = Some(best);
        }
        if variant == Variant::Int8 {
            print!("GEMM {m}x{n}x{k} constant B, int8 (u8 x i8 -> i32, VNNI) (native target, 1 thread, {runs} runs): GOP/s {whole}");
            match f32_best {
                Some(f) => println!(" = {:.2}x the fp32 kernel", best / f),
                None => println!(),
            }
            continue;
        }
        let which = match (const_a, variant) {
            (true, _) => "constant A",
            (false, Variant::F32) => "constant B",
            (false, Variant::Bf16Input) => "constant B, bf16 operands",
            (false, Variant::Int8) => unreachable!("printed above"),
            (false, Variant::Pass(Mode::Bf16)) => "constant B, --precision bf16 (incl. cast)",
            (false, Variant::Pass(_)) => "constant B, --precision fp16",
        };
        print!("GEMM {m}x{n}x{k} {which} (native target, 1 thread, {runs} runs): GFLOP/s {whole}");
        match peak_gflops {
            Some(p) => println!(" = {:.1}% of peak", 100.0 * best / p),
            None => println!(),
        }
    }
}

/// How the GEMM's operands are stored.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// f32.
    F32,
    /// A bf16 graph input and bf16 weights.
    Bf16Input,
    /// An f32 graph, then `assign-precision` in this mode.
    Pass(Mode),
    /// `MatMulInteger`: a u8 input and i8 weights.
    Int8,
}

/// Whether the host has the x86 feature `name` (`avx512bf16`,
/// `avx512vnni`).
fn host_has(name: &str) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        match name {
            "avx512bf16" => std::arch::is_x86_feature_detected!("avx512bf16"),
            "avx512vnni" => {
                std::arch::is_x86_feature_detected!("avx512vnni")
                    && std::arch::is_x86_feature_detected!("avx512bw")
            }
            _ => false,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = name;
        false
    }
}

/// Best of 40 runs of the FMA loop, in GFLOP/s; `None` without AVX-512F.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn peak_gflops() -> Option<f64> {
    if !std::arch::is_x86_feature_detected!("avx512f") {
        return None;
    }
    let code = peak::fma_loop().expect("assemble the FMA loop");
    let len = code.len().div_ceil(4096) * 4096;
    // SAFETY: a fresh private mapping, written, then made read+execute; the
    // loop touches no memory and follows the System V ABI.
    let f: extern "C" fn(u64) = unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED, "mmap");
        std::ptr::copy_nonoverlapping(code.as_ptr(), p as *mut u8, code.len());
        assert_eq!(libc::mprotect(p, len, libc::PROT_READ | libc::PROT_EXEC), 0);
        std::mem::transmute::<*mut libc::c_void, extern "C" fn(u64)>(p)
    };
    let iterations = 10_000_000u64;
    f(iterations);
    let best = (0..40)
        .map(|_| {
            let t = Instant::now();
            f(iterations);
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min);
    Some((iterations * peak::FLOPS_PER_ITERATION) as f64 / best / 1e9)
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn peak_gflops() -> Option<f64> {
    None
}

/// (best, median) GFLOP/s of the compiled GEMM, end to end and of the
/// kernel alone.
struct Timed {
    whole: (f64, f64),
    kernel: (f64, f64),
}

/// The compiled GEMM's throughput.
fn gemm_gflops(
    m: usize,
    n: usize,
    k: usize,
    runs: usize,
    const_a: bool,
    variant: Variant,
) -> Timed {
    let val = |i: usize| ((i * 7919 % 1000) as f32 - 500.0) / 1000.0;
    let mut g = Graph::new();
    let (const_shape, input_shape) = if const_a {
        ([m, k], [k, n])
    } else {
        ([k, n], [m, k])
    };
    let values: Vec<f32> = (0..const_shape[0] * const_shape[1]).map(val).collect();
    let (in_dtype, c) = match variant {
        Variant::Bf16Input => (
            DType::BF16,
            Data::BF16(values.iter().map(|&v| half::bf16::from_f32(v)).collect()),
        ),
        Variant::Int8 => (
            DType::U8,
            Data::I8(values.iter().map(|&v| (v * 250.0) as i8).collect()),
        ),
        _ => (DType::F32, Data::F32(values)),
    };
    let c = g.add_const("w", Tensor::new(const_shape, c).unwrap());
    let x = g.add_input("x", ValueType::new(in_dtype, input_shape));
    let operands = if const_a { [c, x] } else { [x, c] };
    let y = if variant == Variant::Int8 {
        let scalar = |d: Data| Tensor::new([], d).unwrap();
        let a_zero = g.add_const("a_zero", scalar(Data::U8(vec![128])));
        let b_zero = g.add_const("b_zero", scalar(Data::I8(vec![0])));
        (g.add_node(Op::MatMulInteger, &[x, c, a_zero, b_zero], "gemm")).unwrap()
    } else {
        g.add_node(Op::MatMul, &operands, "gemm").unwrap()
    };
    g.add_output("y", y);
    if let Variant::Pass(mode) = variant {
        let pass = AssignPrecision {
            policy: Policy {
                mode,
                ..Policy::default()
            },
            ..AssignPrecision::default()
        };
        pass.assign(&mut g).expect("assign-precision");
    }
    let opts = CpuOptions {
        target: CpuTarget::Native,
        opt_level: 2,
        threads: 1,
    };
    let artifact = compile(&g, &opts, ArtifactInfo::default()).expect("compile");
    let model = Model::from_bytes(&artifact.to_bytes()).expect("load");
    let x_bytes: Vec<u8> = (0..input_shape[0] * input_shape[1])
        .flat_map(|i| match in_dtype {
            DType::BF16 => half::bf16::from_f32(val(i + 1)).to_le_bytes().to_vec(),
            DType::U8 => vec![(i * 7919 % 256) as u8],
            _ => val(i + 1).to_le_bytes().to_vec(),
        })
        .collect();
    let shape = input_shape.map(|d| d as u64);
    let inputs = [TensorRef::new("x", in_dtype, &shape, &x_bytes)];
    let mut out = vec![0u8; m * n * 4];
    let mut session = model.session().expect("session");
    let (mut whole, mut kernel) = (Vec::with_capacity(runs), Vec::with_capacity(runs));
    let mut steps = Vec::new();
    for i in 0..runs + 3 {
        steps.clear();
        let t = Instant::now();
        (session.run_profiled(&inputs, &mut [&mut out[..]], &mut steps)).expect("run");
        if i >= 3 {
            whole.push(t.elapsed().as_secs_f64());
            kernel.push(steps.iter().map(|d| d.as_secs_f64()).sum());
        }
    }
    let flops = 2.0 * (m * n * k) as f64;
    let rate = |mut times: Vec<f64>| {
        times.sort_by(f64::total_cmp);
        (flops / times[0] / 1e9, flops / times[times.len() / 2] / 1e9)
    };
    Timed {
        whole: rate(whole),
        kernel: rate(kernel),
    }
}
