//! Reshape, transpose, concat, gather, slice and output copies.

mod common;

use common::{check, check_rand, compile_run, rand_tensor, Rng};
use kiln_ir::{BinaryOp, DType, Data, Graph, Ints, Op, SliceAxis, Tensor, UnaryOp, ValueType};
use smallvec::SmallVec;

const TYPES: [DType; 9] = [
    DType::F32,
    DType::I64,
    DType::U8,
    DType::I16,
    DType::Bool,
    DType::F64,
    DType::U16,
    DType::U32,
    DType::U64,
];

#[test]
fn transpose_any_dtype() {
    for d in TYPES {
        for (shape, perm) in [
            (&[3, 5][..], &[1, 0][..]),
            (&[2, 3, 4], &[2, 0, 1]),
            (&[2, 3, 4], &[0, 2, 1]),
            (&[2, 3, 4, 5], &[0, 1, 3, 2]),
            (&[2, 3, 4, 5], &[3, 1, 2, 0]),
            (&[2, 3, 40], &[1, 0, 2]),
            // The innermost axis moves: 4 × 4 blocks of 4-byte elements,
            // eight and four source positions at a time, scalar tails on
            // both axes, and an outer dim between them.
            (&[3, 85, 20], &[0, 2, 1]),
            (&[1, 3, 13, 6, 7], &[0, 1, 3, 4, 2]),
            (&[37, 9], &[1, 0]),
            (&[2, 64, 16], &[2, 0, 1]),
        ] {
            let mut g = Graph::new();
            let x = g.add_input("x", ValueType::new(d, shape));
            let y = g
                .add_node(
                    Op::Transpose {
                        perm: Ints::from_slice(perm),
                    },
                    &[x],
                    "t",
                )
                .unwrap();
            g.add_output("y", y);
            check_rand(&g, 1, 0.0);
        }
    }
}

#[test]
fn concat_on_each_axis() {
    for d in TYPES {
        for axis in 0..3 {
            let mut g = Graph::new();
            let mut ins = Vec::new();
            for (i, n) in [2, 1, 3].into_iter().enumerate() {
                let mut s = [2, 3, 5];
                s[axis] = n;
                ins.push(g.add_input(format!("x{i}"), ValueType::new(d, s)));
            }
            let y = g.add_node(Op::Concat { axis }, &ins, "cat").unwrap();
            g.add_output("y", y);
            check_rand(&g, axis as u64, 0.0);
        }
    }
}

fn slice_graph(d: DType, shape: &[usize], axes: &[SliceAxis]) -> Graph {
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(d, shape));
    let y = g
        .add_node(
            Op::Slice {
                axes: SmallVec::from_slice(axes),
            },
            &[x],
            "slice",
        )
        .unwrap();
    g.add_output("y", y);
    g
}

fn ax(start: usize, step: i64, len: usize) -> SliceAxis {
    SliceAxis { start, step, len }
}

#[test]
fn slices_with_negative_steps() {
    for d in TYPES {
        let cases: [(&[usize], Vec<SliceAxis>); 5] = [
            (&[10], vec![ax(9, -1, 10)]),
            (&[10], vec![ax(8, -3, 3)]),
            (&[4, 6], vec![ax(1, 1, 2), ax(5, -2, 3)]),
            (&[3, 4, 5], vec![ax(2, -1, 3), ax(0, 2, 2), ax(1, 1, 4)]),
            (&[3, 4, 37], vec![ax(0, 1, 3), ax(1, 1, 2), ax(0, 1, 37)]),
        ];
        for (shape, axes) in cases {
            check_rand(&slice_graph(d, shape, &axes), 3, 0.0);
        }
    }
}

fn gather_graph(d: DType, shape: &[usize], idx: Tensor, axis: usize) -> Graph {
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(d, shape));
    let i = g.add_const("idx", idx);
    let y = g.add_node(Op::Gather { axis }, &[x, i], "gather").unwrap();
    g.add_output("y", y);
    g
}

#[test]
fn gather_with_negative_indices() {
    for d in TYPES {
        for axis in 0..3 {
            let idx = Tensor::new([2, 2], Data::I64(vec![0, -1, 1, -2])).unwrap();
            check_rand(&gather_graph(d, &[3, 4, 5], idx, axis), 4, 0.0);
            let idx = Tensor::new([3], Data::I32(vec![2, 0, -3])).unwrap();
            check_rand(&gather_graph(d, &[3, 4, 5], idx, axis), 5, 0.0);
        }
    }
}

#[test]
fn gather_out_of_range_index_is_a_kernel_error() {
    // Indices come from a graph input so the kernel checks them at run time.
    for bad in [3i64, -4, 100, i64::MIN] {
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(DType::F32, [3, 2]));
        let i = g.add_input("i", ValueType::new(DType::I64, [2]));
        let y = g.add_node(Op::Gather { axis: 0 }, &[x, i], "emb").unwrap();
        g.add_output("y", y);
        let xs = Tensor::new([3, 2], Data::F32(vec![1., 2., 3., 4., 5., 6.])).unwrap();
        let good = Tensor::new([2], Data::I64(vec![2, -3])).unwrap();
        let out = compile_run(&g, &[xs.clone(), good]).unwrap();
        assert_eq!(out[0].to_f64_vec(), [5., 6., 1., 2.]);
        let idx = Tensor::new([2], Data::I64(vec![0, bad])).unwrap();
        let err = compile_run(&g, &[xs, idx]).unwrap_err();
        assert!(
            matches!(err, kiln_runtime::Error::Kernel { ref node, code: 1 } if node == "emb"),
            "{err}"
        );
        assert!(err.to_string().contains("index out of range"), "{err}");
    }
}

/// Embedding lookups in reduced precision (what `assign-precision` makes
/// of a large table): rows of an f16 / bf16 table gathered as 16-bit and
/// widened, rows of an i8 table widened and scaled by their gathered
/// scales. The tables stay narrow in the artifact (nothing widens them at
/// compile time) and the results are the evaluator's.
#[test]
fn narrow_embedding_tables_are_gathered_as_stored() {
    let (rows, cols) = (1024, 64);
    let values: Vec<f32> = (0..rows * cols).map(|i| (i as f32 * 0.013).sin()).collect();
    let ids = Tensor::new([2, 3], Data::I64(vec![0, 5, 1023, -1, 5, 600])).unwrap();
    for dtype in [DType::F16, DType::BF16, DType::I8] {
        let mut g = Graph::new();
        let i = g.add_input("ids", ValueType::new(DType::I64, [2, 3]));
        let table = Tensor::new([rows, cols], Data::F32(values.clone())).unwrap();
        let table = g.add_const("table", table.cast(dtype));
        let gathered = g
            .add_node(Op::Gather { axis: 0 }, &[table, i], "rows")
            .unwrap();
        let wide = g
            .add_node(Op::Cast { to: DType::F32 }, &[gathered], "wide")
            .unwrap();
        let y = if dtype == DType::I8 {
            let scales: Vec<f32> = (0..rows).map(|r| 1.0 / (r as f32 + 3.0)).collect();
            let scales = Tensor::new([rows, 1], Data::F32(scales)).unwrap();
            let scales = g.add_const("scales", scales);
            let s = g
                .add_node(Op::Gather { axis: 0 }, &[scales, i], "scales_of_rows")
                .unwrap();
            g.add_node(Op::Binary(BinaryOp::Mul), &[wide, s], "y")
                .unwrap()
        } else {
            wide
        };
        g.add_output("y", y);
        check(&g, std::slice::from_ref(&ids));
        let opts = kiln_target_cpu::CpuOptions {
            target: kiln_target_cpu::CpuTarget::Native,
            opt_level: 2,
            threads: 1,
        };
        let artifact =
            kiln_target_cpu::compile(&g, &opts, kiln_target_cpu::ArtifactInfo::default()).unwrap();
        let table_bytes = rows * cols * dtype.size_bytes();
        assert!(
            artifact.weights.len() < table_bytes + rows * 4 + 4096,
            "{dtype}: {} bytes of weights for a {table_bytes}-byte table",
            artifact.weights.len()
        );
    }
}

#[test]
fn reshape_alias_copy_and_output_copies() {
    let mut rng = Rng::new(8);
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(DType::F32, [2, 6]));
    let c = g.add_const("c", rand_tensor(&mut rng, DType::F32, &[3, 4]));
    let r1 = g
        .add_node(
            Op::Reshape {
                shape: Ints::from_slice(&[3, 4]),
            },
            &[x],
            "r1",
        )
        .unwrap();
    // r1 aliases x (not an output); add reads through the alias.
    let s = g
        .add_node(Op::Binary(BinaryOp::Add), &[r1, c], "add")
        .unwrap();
    // r2 is an output: it gets its own region and a copy.
    let r2 = g
        .add_node(
            Op::Reshape {
                shape: Ints::from_slice(&[12]),
            },
            &[s],
            "r2",
        )
        .unwrap();
    let rc = g
        .add_node(
            Op::Reshape {
                shape: Ints::from_slice(&[12]),
            },
            &[c],
            "rc",
        )
        .unwrap();
    let n = g.add_node(Op::Unary(UnaryOp::Neg), &[rc], "neg").unwrap();
    g.add_output("r2", r2);
    g.add_output("sum", s);
    g.add_output("x_again", x);
    g.add_output("const", c);
    g.add_output("neg", n);
    g.add_output("r2_twice", r2);
    check(&g, &[rand_tensor(&mut rng, DType::F32, &[2, 6])]);
}

/// NonZero lists the coordinates of the non-zero elements in row-major
/// order and zeros after them (`docs/bounded.md`), for every element
/// type: -0.0 counts as zero and NaN as non-zero; all-zero and all-set
/// inputs give no and every column.
#[test]
fn non_zero_lists_coordinates_then_zero_columns() {
    for d in TYPES {
        for shape in [&[7][..], &[3, 5], &[2, 3, 4], &[1, 1]] {
            let n: usize = shape.iter().product();
            let patterns: [Box<dyn Fn(usize) -> f64>; 3] = [
                Box::new(|i| if i % 3 == 1 { 0.0 } else { (i % 5) as f64 }),
                Box::new(|_| 0.0),
                Box::new(|i| 1.0 + i as f64 % 2.0),
            ];
            for pattern in &patterns {
                let mut values: Vec<f64> = (0..n).map(pattern).collect();
                if d.is_float() && n > 2 {
                    values[0] = -0.0;
                    values[n - 1] = f64::NAN;
                }
                let x = Tensor::new(shape, Data::from_f64s(d, values.into_iter())).unwrap();
                let mut g = Graph::new();
                let xi = g.add_input("x", ValueType::new(d, shape));
                let y = g.add_node(Op::NonZero, &[xi], "nz").unwrap();
                g.add_output("y", y);
                check(&g, &[x]);
            }
        }
    }
}
