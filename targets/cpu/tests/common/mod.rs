//! Shared test helpers: deterministic random tensors, compile → serialize →
//! load → run, and comparison with the IR reference evaluator.
#![allow(dead_code)]

use kiln_format::Artifact;
use kiln_ir::{DType, Data, Graph, Tensor};
use kiln_runtime::{Model, TensorRef};
use kiln_target_cpu::{compile, ArtifactInfo, CpuOptions, CpuTarget};

pub use kiln_test_kit::Rng;

/// A random tensor: floats in [-3, 3), ints in [-20, 20] (u8 in [0, 40]),
/// bools 50/50.
pub fn rand_tensor(rng: &mut Rng, dtype: DType, shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let data = match dtype {
        DType::F32 => Data::F32((0..n).map(|_| rng.f64(-3.0, 3.0) as f32).collect()),
        DType::F64 => Data::F64((0..n).map(|_| rng.f64(-3.0, 3.0)).collect()),
        DType::Bool => Data::Bool((0..n).map(|_| rng.int(0, 1) == 1).collect()),
        DType::U8 => Data::U8((0..n).map(|_| rng.int(0, 40) as u8).collect()),
        d => Data::from_i64s(d, (0..n).map(|_| rng.int(-20, 20))),
    };
    Tensor::new(shape, data).unwrap()
}

pub fn f32_tensor(rng: &mut Rng, shape: &[usize]) -> Tensor {
    rand_tensor(rng, DType::F32, shape)
}

/// Compiles for the host, serializes, loads and runs.
pub fn compile_run(g: &Graph, inputs: &[Tensor]) -> Result<Vec<Tensor>, kiln_runtime::Error> {
    compile_run_for(g, inputs, CpuTarget::Native)
}

/// [`compile_run`] for `target` (which must run on this host).
pub fn compile_run_for(
    g: &Graph,
    inputs: &[Tensor],
    target: CpuTarget,
) -> Result<Vec<Tensor>, kiln_runtime::Error> {
    let opts = CpuOptions {
        target,
        opt_level: 2,
        threads: kiln_target_cpu::DEFAULT_THREADS,
    };
    let artifact = compile(g, &opts, ArtifactInfo::default()).expect("compile");
    // Every graph must also cross-compile for AArch64 into a valid artifact.
    let arm = CpuOptions {
        target: CpuTarget::Aarch64,
        opt_level: 2,
        threads: kiln_target_cpu::DEFAULT_THREADS,
    };
    let arm = compile(g, &arm, ArtifactInfo::default()).expect("compile for aarch64");
    Artifact::parse(&arm.to_bytes()).expect("aarch64 artifact parses");
    let bytes = artifact.to_bytes();
    Artifact::parse(&bytes).expect("artifact parses");
    let model = Model::from_bytes(&bytes)?;
    let names: Vec<String> = g.inputs().iter().map(|&i| g.node(i).name.clone()).collect();
    let shapes: Vec<Vec<u64>> = inputs
        .iter()
        .map(|t| t.shape().iter().map(|&d| d as u64).collect())
        .collect();
    let datas: Vec<Vec<u8>> = inputs.iter().map(|t| t.data().to_le_bytes()).collect();
    let refs: Vec<TensorRef> = (0..inputs.len())
        .map(|i| TensorRef::new(&names[i], inputs[i].dtype(), &shapes[i], &datas[i]))
        .collect();
    let outs = model.run(&refs)?;
    Ok(g.outputs()
        .iter()
        .zip(outs)
        .map(|((_, id), t)| {
            let ty = &g.node(*id).ty;
            Tensor::new(&ty.shape, Data::from_le_bytes(ty.dtype, &t.data).unwrap()).unwrap()
        })
        .collect())
}

/// Compares compiled results with the reference evaluator. Floats must
/// agree within `1e-5` relative, plus `abs_scale * max|expected|` absolute
/// (for long dot products whose result may cancel to near zero).
pub fn check_with(g: &Graph, inputs: &[Tensor], abs_scale: f64) {
    check_for(g, inputs, abs_scale, CpuTarget::Native)
}

/// [`check_with`] for `target` (which must run on this host).
pub fn check_for(g: &Graph, inputs: &[Tensor], abs_scale: f64, target: CpuTarget) {
    let expected = kiln_ir::eval::eval_graph(g, inputs).expect("reference evaluation");
    let got = compile_run_for(g, inputs, target).expect("run");
    assert_eq!(expected.len(), got.len());
    for (k, (e, a)) in expected.iter().zip(&got).enumerate() {
        assert_eq!(e.shape(), a.shape(), "output {k} shape");
        assert_eq!(e.dtype(), a.dtype(), "output {k} dtype");
        if e.dtype().is_float() {
            let ev = e.to_f64_vec();
            let av = a.to_f64_vec();
            let scale = ev.iter().fold(
                0.0f64,
                |m, v| if v.is_finite() { m.max(v.abs()) } else { m },
            );
            for (i, (x, y)) in ev.iter().zip(&av).enumerate() {
                let ok = (x.is_nan() && y.is_nan())
                    || x == y
                    || (x - y).abs() <= 1e-5 * x.abs() + abs_scale * scale + 1e-37;
                assert!(
                    ok,
                    "output {k} element {i}: expected {x}, got {y} (graph outputs {:?})",
                    g.outputs()
                );
            }
        } else {
            assert_eq!(e.data(), a.data(), "output {k}");
        }
    }
}

/// [`check_with`] for elementwise results (no absolute slack).
pub fn check(g: &Graph, inputs: &[Tensor]) {
    check_with(g, inputs, 0.0)
}

/// Random inputs for every graph input, then [`check_with`].
pub fn check_rand(g: &Graph, seed: u64, abs_scale: f64) {
    let mut rng = Rng::new(seed);
    let inputs: Vec<Tensor> = g
        .inputs()
        .iter()
        .map(|&i| {
            let ty = &g.node(i).ty;
            rand_tensor(&mut rng, ty.dtype, &ty.shape)
        })
        .collect();
    check_with(g, &inputs, abs_scale);
}

/// Whether any kernel holds a 512-bit EVEX `vfmadd231ps` (EVEX prefix 0x62,
/// opcode 0xB8 four bytes on, vector length bits L'L = 10 in the prefix's
/// last byte): Cranelift never emits 512-bit vectors.
pub fn has_zmm_fma(a: &Artifact) -> bool {
    a.text
        .windows(5)
        .any(|w| w[0] == 0x62 && w[4] == 0xb8 && (w[3] >> 5) & 3 == 2)
}

/// Whether the artifact holds AVX-512 microkernel code: a `vzeroupper`
/// (`C5 F8 77`, which the microkernels end with and Cranelift never
/// emits) and a 512-bit EVEX instruction (prefix 0x62 with L'L = 10).
pub fn has_zmm_code(a: &Artifact) -> bool {
    a.text.windows(3).any(|w| w == [0xc5, 0xf8, 0x77])
        && a.text
            .windows(4)
            .any(|w| w[0] == 0x62 && (w[3] >> 5) & 3 == 2)
}
