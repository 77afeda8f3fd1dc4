//! `attention` (scaled dot-product attention) as one kernel: the AVX-512
//! microkernel kernel (scores GEMM with the mask as C, softmax in scratch,
//! context GEMM) and the Cranelift kernel match the reference evaluator
//! over edge-tile shapes and every mask broadcast; split over tasks, the
//! result equals the unsplit kernel's bit for bit.

mod common;

use common::{check_for, f32_tensor, has_zmm_fma, Rng};
use kiln_ir::{DType, Data, Graph, Op, Tensor, ValueType};
use kiln_runtime::{Model, TensorRef};
use kiln_target_cpu::{compile, ArtifactInfo, CpuOptions, CpuTarget};

/// `attention(q, kt, v[, mask]) {scale}` over `batch` heads.
fn graph(
    batch: &[usize],
    (m, k, n, d): (usize, usize, usize, usize),
    mask: Option<&[usize]>,
) -> Graph {
    let shape = |a: usize, b: usize| {
        let mut s = batch.to_vec();
        s.extend([a, b]);
        s
    };
    let mut g = Graph::new();
    let q = g.add_input("q", ValueType::new(DType::F32, shape(m, k)));
    let kt = g.add_input("kt", ValueType::new(DType::F32, shape(k, n)));
    let v = g.add_input("v", ValueType::new(DType::F32, shape(n, d)));
    let mut inputs = vec![q, kt, v];
    if let Some(mask) = mask {
        inputs.push(g.add_input("mask", ValueType::new(DType::F32, mask)));
    }
    let scale = 1.0 / (k as f32).sqrt();
    let y = g
        .add_node(Op::Attention { scale }, &inputs, "attention")
        .unwrap();
    g.add_output("y", y);
    g
}

/// Inputs with scores of order one, and a mask with large negative entries
/// (a padding mask), so the softmax is neither flat nor one-hot.
fn inputs(g: &Graph, seed: u64) -> Vec<Tensor> {
    let mut rng = Rng::new(seed);
    g.inputs()
        .iter()
        .map(|&i| {
            let node = g.node(i);
            let t = f32_tensor(&mut rng, &node.ty.shape);
            if node.name != "mask" {
                return t;
            }
            let v: Vec<f32> = t
                .to_f64_vec()
                .iter()
                .map(|&x| if x > 0.6 { -10000.0 } else { x as f32 })
                .collect();
            Tensor::new(t.shape(), Data::F32(v)).unwrap()
        })
        .collect()
}

fn artifact(g: &Graph, target: CpuTarget, threads: usize) -> kiln_format::Artifact {
    let opts = CpuOptions {
        target,
        opt_level: 2,
        threads,
    };
    compile(g, &opts, ArtifactInfo::default()).expect("compile")
}

#[test]
fn attention_matches_the_reference_for_every_mask_broadcast() {
    let dims = (7, 5, 19, 20);
    for mask in [
        None,
        Some(&[1, 1, 1, 19][..]),
        Some(&[2, 1, 1, 19][..]),
        Some(&[7, 1][..]),
        Some(&[2, 3, 7, 19][..]),
        Some(&[1][..]),
    ] {
        let g = graph(&[2, 3], dims, mask);
        let inputs = inputs(&g, 3);
        let native = artifact(&g, CpuTarget::Native, 1);
        assert_eq!(native.kernels.len(), 1, "one kernel");
        if std::arch::is_x86_feature_detected!("avx512f") {
            assert!(has_zmm_fma(&native), "the AVX-512 kernel");
        }
        check_for(&g, &inputs, 1e-5, CpuTarget::Native);
        if std::arch::is_x86_feature_detected!("avx2") {
            check_for(&g, &inputs, 1e-5, CpuTarget::X86_64V3);
        }
    }
}

#[test]
fn attention_tiles_cover_full_and_partial_blocks() {
    // Full tiles, a single row, a single key, rank 2 (one head).
    for (batch, dims) in [
        (&[1, 4][..], (128, 32, 128, 32)),
        (&[3][..], (1, 8, 40, 16)),
        (&[2][..], (9, 4, 1, 33)),
        (&[][..], (33, 16, 48, 7)),
    ] {
        let g = graph(batch, dims, Some(&[1, dims.2]));
        check_for(&g, &inputs(&g, 9), 1e-5, CpuTarget::Native);
    }
}

fn run(g: &Graph, artifact: &kiln_format::Artifact, inputs: &[Tensor], threads: usize) -> Vec<u8> {
    let model = Model::from_bytes(&artifact.to_bytes()).unwrap();
    let names: Vec<String> = g.inputs().iter().map(|&i| g.node(i).name.clone()).collect();
    let shapes: Vec<Vec<u64>> = (inputs.iter())
        .map(|t| t.shape().iter().map(|&d| d as u64).collect())
        .collect();
    let datas: Vec<Vec<u8>> = inputs.iter().map(|t| t.data().to_le_bytes()).collect();
    let refs: Vec<TensorRef> = (0..inputs.len())
        .map(|i| TensorRef::new(&names[i], kiln_format::DType::F32, &shapes[i], &datas[i]))
        .collect();
    let mut session = model.session_with_threads(threads).unwrap();
    session.run(&refs).unwrap().swap_remove(0).data
}

#[test]
fn attention_heads_split_over_tasks_equal_the_whole_kernel() {
    let g = graph(&[1, 12], (128, 32, 128, 32), Some(&[1, 1, 1, 128]));
    let inputs = inputs(&g, 11);
    let (split, whole) = (
        artifact(&g, CpuTarget::Native, 4),
        artifact(&g, CpuTarget::Native, 1),
    );
    if !std::arch::is_x86_feature_detected!("avx512f") {
        eprintln!("no AVX-512 on this host: the Cranelift kernel is not split");
        return;
    }
    assert_eq!(
        split.profiles[0].schedule[0].tasks, 4,
        "{:?}",
        split.profiles[0].schedule
    );
    let reference = run(&g, &whole, &inputs, 1);
    assert_eq!(run(&g, &split, &inputs, 1), reference);
    assert_eq!(run(&g, &split, &inputs, 3), reference);
    check_for(&g, &inputs, 1e-5, CpuTarget::Native);
}
