//! Reduction kernels against the reference evaluator.

mod common;

use common::{check, check_rand, Rng};
use kiln_ir::{DType, Data, Graph, Op, ReduceOp, Tensor, ValueType};

fn reduce_graph(op: ReduceOp, dtype: DType, shape: &[usize], axes: &[usize], keep: bool) -> Graph {
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(dtype, shape));
    let y = g
        .add_node(
            Op::Reduce {
                op,
                axes: axes.iter().copied().collect(),
                keep_dims: keep,
            },
            &[x],
            "reduce",
        )
        .unwrap();
    g.add_output("y", y);
    g
}

const CASES: [(&[usize], &[usize]); 7] = [
    (&[7], &[0]),
    (&[3, 5], &[1]),
    (&[3, 5], &[0]),
    (&[2, 3, 4], &[0, 2]),
    (&[2, 3, 4], &[1, 2]),
    (&[2, 3, 4], &[0, 1, 2]),
    (&[2, 3, 4], &[]),
];

#[test]
fn float_reductions() {
    for (k, op) in ReduceOp::ALL.into_iter().enumerate() {
        for dtype in [DType::F32, DType::F64] {
            for (shape, axes) in CASES {
                for keep in [false, true] {
                    let g = reduce_graph(op, dtype, shape, axes, keep);
                    let mut rng = Rng::new(k as u64);
                    let n: usize = shape.iter().product();
                    // Positive inputs keep LogSum defined.
                    let v = (0..n).map(|_| rng.f64(0.1, 2.0));
                    let x = Tensor::new(shape, Data::from_f64s(dtype, v)).unwrap();
                    check(&g, &[x]);
                }
            }
        }
    }
}

/// f32 max/min over contiguous runs of at least 16 take the vector path:
/// whole blocks, tails, several runs per output, NaN and signed zeros.
#[test]
fn f32_max_min_vector_path_matches_the_evaluator() {
    let cases: [(&[usize], &[usize]); 5] = [
        (&[128, 384], &[0, 1]),
        (&[3, 37], &[1]),
        (&[2, 5, 33], &[0, 2]),
        (&[4, 16], &[1]),
        (&[3, 17, 2], &[1]),
    ];
    for op in [ReduceOp::Max, ReduceOp::Min] {
        for (shape, axes) in cases {
            let n: usize = shape.iter().product();
            let mut rng = Rng::new(n as u64);
            let v: Vec<f32> = (0..n).map(|_| rng.f64(-3.0, 3.0) as f32).collect();
            let g = reduce_graph(op, DType::F32, shape, axes, false);
            check(&g, &[Tensor::new(shape, Data::F32(v.clone())).unwrap()]);
            // A NaN in a block and one in a tail, and signed zeros.
            let mut w = v.clone();
            w[n / 2] = f32::NAN;
            w[n - 1] = f32::NAN;
            w[1] = -0.0;
            check(&g, &[Tensor::new(shape, Data::F32(w)).unwrap()]);
        }
    }
}

#[test]
fn integer_reductions() {
    for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod] {
        for dtype in [
            DType::I32,
            DType::I64,
            DType::U8,
            DType::I8,
            DType::U16,
            DType::U32,
            DType::U64,
        ] {
            for (shape, axes) in CASES {
                let g = reduce_graph(op, dtype, shape, axes, true);
                check_rand(&g, 5, 0.0);
            }
        }
    }
}

#[test]
fn empty_reductions_give_the_identity() {
    for op in [
        ReduceOp::Sum,
        ReduceOp::Max,
        ReduceOp::Prod,
        ReduceOp::LogSumExp,
    ] {
        let g = reduce_graph(op, DType::F32, &[0, 3], &[0], true);
        check(&g, &[Tensor::new([0, 3], Data::F32(vec![])).unwrap()]);
    }
}

/// Max and min of a whole f32 tensor (the range observers of dynamic
/// int8) on the AVX-512 kernel: lengths that take the 64-element blocks,
/// single vectors and the masked tail, all-negative and all-positive data
/// (so the tail's identity value matters), infinities, and a NaN anywhere
/// making the result NaN.
#[test]
fn whole_tensor_max_and_min_on_the_avx512_kernel() {
    use kiln_target_cpu::{compile, ArtifactInfo, CpuOptions};
    let avx512 = std::arch::is_x86_feature_detected!("avx512f");
    for op in [ReduceOp::Max, ReduceOp::Min] {
        for len in [64, 65, 79, 100, 1000, 4103] {
            let g = reduce_graph(op, DType::F32, &[1, len], &[0, 1], false);
            let native = compile(&g, &CpuOptions::default(), ArtifactInfo::default()).unwrap();
            assert_eq!(common::has_zmm_code(&native), avx512, "{op:?} over {len}");
            let mut rng = Rng::new(len as u64);
            let base: Vec<f32> = (0..len).map(|_| rng.f64(-3.0, 3.0) as f32).collect();
            let variants: Vec<Vec<f32>> = vec![
                base.clone(),
                base.iter().map(|v| -v.abs() - 1.0).collect(),
                base.iter().map(|v| v.abs() + 1.0).collect(),
                {
                    let mut v = base.clone();
                    v[len / 2] = f32::INFINITY;
                    v[len - 1] = f32::NEG_INFINITY;
                    v
                },
                {
                    let mut v = base.clone();
                    v[len - 1] = f32::NAN;
                    v
                },
                {
                    let mut v = base.clone();
                    v[3] = f32::NAN;
                    v
                },
            ];
            for v in variants {
                check(&g, &[Tensor::new([1, len], Data::F32(v)).unwrap()]);
            }
        }
    }
}

/// Sum-like f32 reductions over trailing axes on the AVX-512 row-fold
/// kernel (f64 accumulation, like the evaluator): runs that take whole
/// blocks of 32, vectors of 8 and the masked tail, unit dims among the
/// reduced and kept axes, infinities and NaN; a reduction over a middle
/// axis stays on the Cranelift kernel.
#[test]
fn f32_row_folds_on_the_avx512_kernel() {
    use kiln_target_cpu::{compile, ArtifactInfo, CpuOptions};
    let avx512 = std::arch::is_x86_feature_detected!("avx512f");
    let cases: [(&[usize], &[usize]); 9] = [
        (&[5, 16], &[1]),
        (&[4, 17], &[1]),
        (&[3, 31], &[1]),
        (&[2, 32], &[1]),
        (&[2, 1, 33], &[1, 2]),
        (&[3, 7, 1, 9], &[1, 3]),
        (&[1, 1000], &[0, 1]),
        (&[2, 4, 127], &[2]),
        (&[2, 3, 24, 24], &[2, 3]),
    ];
    let folds = [
        ReduceOp::Sum,
        ReduceOp::Mean,
        ReduceOp::SumSquare,
        ReduceOp::L1,
        ReduceOp::L2,
    ];
    for op in folds {
        for (shape, axes) in cases {
            for keep in [false, true] {
                let g = reduce_graph(op, DType::F32, shape, axes, keep);
                let native = compile(&g, &CpuOptions::default(), ArtifactInfo::default()).unwrap();
                assert_eq!(
                    common::has_zmm_code(&native),
                    avx512,
                    "{op:?} over {axes:?} of {shape:?}"
                );
                let n: usize = shape.iter().product();
                let mut rng = Rng::new(n as u64);
                let v: Vec<f32> = (0..n).map(|_| rng.f64(-2.0, 2.0) as f32).collect();
                check(&g, &[Tensor::new(shape, Data::F32(v.clone())).unwrap()]);
                let mut w = v;
                w[n - 1] = f32::NAN;
                w[0] = f32::INFINITY;
                check(&g, &[Tensor::new(shape, Data::F32(w)).unwrap()]);
            }
        }
        // Three columns per block, or a kept axis between the reduced
        // ones: the Cranelift kernel.
        for (shape, axes) in [(&[4, 40, 3][..], &[1][..]), (&[4, 5, 6, 16], &[1, 3])] {
            let g = reduce_graph(op, DType::F32, shape, axes, false);
            let native = compile(&g, &CpuOptions::default(), ArtifactInfo::default()).unwrap();
            assert!(
                !common::has_zmm_code(&native),
                "{op:?} over {axes:?} of {shape:?}"
            );
            check_rand(&g, 3, 0.0);
        }
    }
}

/// Sum-like f32 reductions over middle axes (`[outer, len, inner]`, a
/// sequence's mean over its tokens) on the AVX-512 column-fold kernel:
/// whole chunks of 32 columns, partial chunks of whole and masked
/// vectors, several reduced axes, one outer block.
#[test]
fn f32_column_folds_on_the_avx512_kernel() {
    use kiln_target_cpu::{compile, ArtifactInfo, CpuOptions};
    let avx512 = std::arch::is_x86_feature_detected!("avx512f");
    let cases: [(&[usize], &[usize]); 6] = [
        (&[8, 20, 40], &[1]),
        (&[3, 5, 37], &[1]),
        (&[2, 7, 1, 96], &[1]),
        (&[1, 300, 17], &[0, 1]),
        (&[2, 3, 4, 45], &[1, 2]),
        (&[40, 70], &[0]),
    ];
    for op in [
        ReduceOp::Sum,
        ReduceOp::Mean,
        ReduceOp::SumSquare,
        ReduceOp::L1,
        ReduceOp::L2,
    ] {
        for (shape, axes) in cases {
            let g = reduce_graph(op, DType::F32, shape, axes, true);
            let native = compile(&g, &CpuOptions::default(), ArtifactInfo::default()).unwrap();
            assert_eq!(
                common::has_zmm_code(&native),
                avx512,
                "{op:?} over {axes:?} of {shape:?}"
            );
            let n: usize = shape.iter().product();
            let mut rng = Rng::new(n as u64 + 1);
            let mut v: Vec<f32> = (0..n).map(|_| rng.f64(-2.0, 2.0) as f32).collect();
            check(&g, &[Tensor::new(shape, Data::F32(v.clone())).unwrap()]);
            v[n - 1] = f32::NAN;
            v[0] = f32::NEG_INFINITY;
            check(&g, &[Tensor::new(shape, Data::F32(v)).unwrap()]);
        }
    }
}

/// `GlobalAveragePool` of f32 planes of at least 16 pixels on the
/// row-fold kernel; smaller planes on the Cranelift loop.
#[test]
fn global_average_pool_on_the_avx512_kernel() {
    use kiln_target_cpu::{compile, ArtifactInfo, CpuOptions};
    let avx512 = std::arch::is_x86_feature_detected!("avx512f");
    for (shape, zmm) in [
        ([2, 37, 13, 11], avx512),
        ([1, 3, 4, 4], avx512),
        ([1, 5, 2, 3], false),
    ] {
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(DType::F32, shape));
        let y = g.add_node(Op::GlobalAveragePool, &[x], "gap").unwrap();
        g.add_output("y", y);
        let native = compile(&g, &CpuOptions::default(), ArtifactInfo::default()).unwrap();
        assert_eq!(common::has_zmm_code(&native), zmm, "{shape:?}");
        check_rand(&g, 7, 0.0);
    }
}

/// LayerNorm of f32 on the AVX-512 kernel: rows whose length takes the
/// 32-element blocks, vectors of 8, the masked tails of the f64 sums and
/// of the 16-lane normalization, with and without a bias, several rows
/// (and a NaN row, which stays NaN without touching its neighbours).
#[test]
fn layer_norm_on_the_avx512_kernel() {
    use common::check_with;
    use kiln_target_cpu::{compile, ArtifactInfo, CpuOptions};
    let avx512 = std::arch::is_x86_feature_detected!("avx512f");
    let cases: [(&[usize], usize); 7] = [
        (&[3, 16], 1),
        (&[2, 5, 17], 2),
        (&[4, 37], 1),
        (&[2, 3, 8, 8], 2),
        (&[1, 1000], 1),
        (&[3, 1, 7], 2),
        (&[2, 96, 40], 2),
    ];
    for (shape, axis) in cases {
        for bias in [false, true] {
            let size: usize = shape[axis..].iter().product();
            let mut g = Graph::new();
            let x = g.add_input("x", ValueType::new(DType::F32, shape));
            let scale = g.add_input("scale", ValueType::new(DType::F32, &shape[axis..]));
            let mut inputs = vec![x, scale];
            if bias {
                inputs.push(g.add_input("bias", ValueType::new(DType::F32, &shape[axis..])));
            }
            let ln = Op::LayerNorm {
                axis,
                epsilon: 1e-5,
            };
            let y = g.add_node(ln, &inputs, "ln").unwrap();
            g.add_output("y", y);
            let native = compile(&g, &CpuOptions::default(), ArtifactInfo::default()).unwrap();
            assert_eq!(
                common::has_zmm_code(&native),
                avx512,
                "{shape:?} from {axis}"
            );
            let n: usize = shape.iter().product();
            let mut rng = Rng::new(n as u64);
            let mut tensor = |len: usize, lo: f64, hi: f64| -> Vec<f32> {
                (0..len).map(|_| rng.f64(lo, hi) as f32).collect()
            };
            let mut values = vec![tensor(n, -3.0, 5.0), tensor(size, 0.5, 2.0)];
            if bias {
                values.push(tensor(size, -1.0, 1.0));
            }
            let tensors = |values: &[Vec<f32>]| -> Vec<Tensor> {
                (values.iter().zip(&inputs))
                    .map(|(v, &i)| Tensor::new(&g.node(i).ty.shape, Data::F32(v.clone())).unwrap())
                    .collect()
            };
            check_with(&g, &tensors(&values), 1e-6);
            if n > size {
                values[0][size + 1] = f32::NAN;
                check_with(&g, &tensors(&values), 1e-6);
            }
        }
    }
}
