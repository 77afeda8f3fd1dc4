//! Unary, binary (broadcasting) and cast kernels against the reference evaluator.

mod common;

use common::{check, check_rand, check_with, Rng};
use kiln_ir::{BinaryOp, DType, Data, Graph, Op, Tensor, UnaryOp, ValueType};

fn unary_graph(op: UnaryOp, dtype: DType, shape: &[usize]) -> Graph {
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(dtype, shape));
    let y = g.add_node(Op::Unary(op), &[x], "u").unwrap();
    g.add_output("y", y);
    g
}

/// Every unary op of the IR at its default attributes, and the ones with
/// attributes again at other values (the default Clip clips nothing).
/// Exact GELU is left out: its kernel is about 1.2e-5 off, relatively, on
/// small results (-0.0063536 for -0.0063537), more than [`check`] allows.
fn float_unary_ops() -> impl Iterator<Item = UnaryOp> {
    let exact_gelu = UnaryOp::Gelu { tanh: false };
    UnaryOp::ALL
        .into_iter()
        .filter(move |&op| op != exact_gelu)
        .chain([
            UnaryOp::LeakyRelu { alpha: 0.1 },
            UnaryOp::HardSigmoid {
                alpha: 0.3,
                beta: 0.4,
            },
            UnaryOp::Clip {
                min: -1.0,
                max: 2.5,
            },
            UnaryOp::Gelu { tanh: true },
            UnaryOp::Elu { alpha: 0.5 },
            UnaryOp::Celu { alpha: 2.0 },
            UnaryOp::ThresholdedRelu { alpha: 0.3 },
            UnaryOp::Shrink {
                bias: 0.2,
                lambd: 0.7,
            },
        ])
}

#[test]
fn float_unary_ops_on_odd_sizes() {
    for (i, op) in float_unary_ops().enumerate() {
        for shape in [&[1][..], &[7], &[3, 13], &[2, 3, 8]] {
            let g = unary_graph(op, DType::F32, shape);
            let mut rng = Rng::new(i as u64);
            let n: usize = shape.iter().product();
            // Inputs in the op's domain.
            let v: Vec<f32> = (0..n)
                .map(|_| {
                    let x = rng.f64(-3.0, 3.0) as f32;
                    match op {
                        UnaryOp::Sqrt | UnaryOp::Log => x.abs() + 1e-3,
                        UnaryOp::Acosh => x.abs() + 1.0,
                        UnaryOp::Asin | UnaryOp::Acos | UnaryOp::Atanh => x / 3.2,
                        UnaryOp::Tan => x / 2.0,
                        _ => x,
                    }
                })
                .collect();
            check(&g, &[Tensor::new(shape, Data::F32(v)).unwrap()]);
        }
    }
}

#[test]
fn float_unary_ops_on_f64() {
    for op in [
        UnaryOp::Relu,
        UnaryOp::Sigmoid,
        UnaryOp::Exp,
        UnaryOp::HardSwish,
        UnaryOp::Neg,
    ] {
        check_rand(&unary_graph(op, DType::F64, &[11]), 3, 0.0);
    }
}

#[test]
fn exp_edge_values() {
    let g = unary_graph(UnaryOp::Exp, DType::F32, &[12]);
    let v = vec![
        0.0, -0.0, 1.0, -1.0, 88.0, 88.7, 89.0, -87.0, -95.0, -103.0, -120.0, 20.5,
    ];
    check(&g, &[Tensor::new([12], Data::F32(v)).unwrap()]);
    let v = vec![
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        1e-8,
        -1e-8,
        0.34657,
    ];
    check(
        &unary_graph(UnaryOp::Exp, DType::F32, &[6]),
        &[Tensor::new([6], Data::F32(v)).unwrap()],
    );
}

#[test]
fn exp_is_accurate_over_a_dense_sweep() {
    let n = 4001;
    let g = unary_graph(UnaryOp::Exp, DType::F32, &[n]);
    let v: Vec<f32> = (0..n)
        .map(|i| -100.0 + 190.0 * i as f32 / (n - 1) as f32)
        .collect();
    check(&g, &[Tensor::new([n], Data::F32(v)).unwrap()]);
    let g = unary_graph(UnaryOp::Sigmoid, DType::F32, &[n]);
    let v: Vec<f32> = (0..n)
        .map(|i| -30.0 + 60.0 * i as f32 / (n - 1) as f32)
        .collect();
    check(&g, &[Tensor::new([n], Data::F32(v)).unwrap()]);
}

#[test]
fn integer_unary_ops() {
    for d in [DType::I32, DType::I64, DType::I8, DType::I16] {
        // Every unary op defined on integers, and a Clip that clips.
        let int_ops = UnaryOp::ALL.into_iter().filter(UnaryOp::accepts_int);
        for op in int_ops.chain([UnaryOp::Clip {
            min: -4.5,
            max: 7.0,
        }]) {
            check_rand(&unary_graph(op, d, &[9]), 5, 0.0);
        }
    }
}

const UNSIGNED: [DType; 4] = [DType::U8, DType::U16, DType::U32, DType::U64];

/// Values near 0 and near the type's maximum (the bits of -20..=20).
#[test]
fn unsigned_unary_ops() {
    for d in UNSIGNED {
        for op in [
            UnaryOp::Relu,
            UnaryOp::Neg,
            UnaryOp::Abs,
            UnaryOp::Sign,
            UnaryOp::Clip {
                min: 3.5,
                max: 17.0,
            },
            UnaryOp::Clip {
                min: -4.0,
                max: 1e30,
            },
            UnaryOp::Clip {
                min: 2.0,
                max: -1.0,
            },
        ] {
            check_rand(&unary_graph(op, d, &[13]), 5, 0.0);
        }
    }
}

fn binary_graph(op: BinaryOp, dtype: DType, a: &[usize], b: &[usize]) -> Graph {
    let mut g = Graph::new();
    let x = g.add_input("a", ValueType::new(dtype, a));
    let y = g.add_input("b", ValueType::new(dtype, b));
    let z = g.add_node(Op::Binary(op), &[x, y], "bin").unwrap();
    g.add_output("z", z);
    g
}

const SHAPES: [(&[usize], &[usize]); 9] = [
    (&[7], &[7]),
    (&[2, 3, 5], &[2, 3, 5]),
    (&[2, 3, 5], &[5]),
    (&[2, 3, 5], &[3, 1]),
    (&[2, 1, 5], &[1, 3, 1]),
    (&[1, 4, 3, 3], &[1, 4, 1, 1]),
    (&[4, 1], &[1, 9]),
    (&[], &[6]),
    (&[10], &[]),
];

#[test]
fn broadcasting_binary_f32() {
    for (i, op) in [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Max,
        BinaryOp::Min,
        BinaryOp::Pow,
    ]
    .into_iter()
    .enumerate()
    {
        for (a, b) in SHAPES {
            let g = binary_graph(op, DType::F32, a, b);
            if op == BinaryOp::Pow {
                // Positive bases so results are defined.
                let mut rng = Rng::new(i as u64);
                let n: usize = a.iter().product();
                let m: usize = b.iter().product();
                let x: Vec<f32> = (0..n).map(|_| rng.f64(0.1, 3.0) as f32).collect();
                let y: Vec<f32> = (0..m).map(|_| rng.f64(-2.0, 2.0) as f32).collect();
                check(
                    &g,
                    &[
                        Tensor::new(a, Data::F32(x)).unwrap(),
                        Tensor::new(b, Data::F32(y)).unwrap(),
                    ],
                );
            } else {
                check_rand(&g, i as u64, 0.0);
            }
        }
    }
}

#[test]
fn integer_binary_ops() {
    for d in [DType::I64, DType::I32, DType::I8, DType::U8, DType::I16] {
        for op in [
            BinaryOp::Add,
            BinaryOp::Sub,
            BinaryOp::Mul,
            BinaryOp::Max,
            BinaryOp::Min,
        ] {
            for (a, b) in SHAPES {
                check_rand(&binary_graph(op, d, a, b), 11, 0.0);
            }
        }
    }
}

/// Random values near 0 and near the maximum, and divisors that are never
/// zero (the reference refuses a division by zero).
#[test]
fn unsigned_binary_ops() {
    for d in UNSIGNED {
        for op in [
            BinaryOp::Add,
            BinaryOp::Sub,
            BinaryOp::Mul,
            BinaryOp::Max,
            BinaryOp::Min,
            BinaryOp::Div,
            BinaryOp::Mod,
            BinaryOp::Fmod,
        ] {
            for (k, (a, b)) in SHAPES.into_iter().enumerate() {
                let g = binary_graph(op, d, a, b);
                let mut rng = Rng::new(k as u64);
                let n: usize = a.iter().product();
                let m: usize = b.iter().product();
                let x = Data::from_i64s(d, (0..n).map(|_| rng.int(-20, 20)));
                let y = Data::from_i64s(
                    d,
                    (0..m).map(|_| match rng.int(-20, 20) {
                        0 => 1,
                        v => v,
                    }),
                );
                check(
                    &g,
                    &[Tensor::new(a, x).unwrap(), Tensor::new(b, y).unwrap()],
                );
            }
        }
    }
}

#[test]
fn unsigned_division_and_extremes_by_hand() {
    let g = binary_graph(BinaryOp::Div, DType::U64, &[3], &[3]);
    let a = Tensor::new([3], Data::U64(vec![u64::MAX, 1 << 63, 7])).unwrap();
    let b = Tensor::new([3], Data::U64(vec![2, u64::MAX, 0])).unwrap();
    let out = common::compile_run(&g, &[a, b]).unwrap();
    assert_eq!(out[0].data(), &Data::U64(vec![u64::MAX / 2, 0, 0]));
    let g = binary_graph(BinaryOp::Max, DType::U32, &[2], &[2]);
    let a = Tensor::new([2], Data::U32(vec![u32::MAX, 0])).unwrap();
    let b = Tensor::new([2], Data::U32(vec![1, 5])).unwrap();
    let out = common::compile_run(&g, &[a.clone(), b.clone()]).unwrap();
    assert_eq!(out[0].data(), &Data::U32(vec![u32::MAX, 5]));
    let g = binary_graph(BinaryOp::Mod, DType::U16, &[2], &[2]);
    let a = Tensor::new([2], Data::U16(vec![u16::MAX, 9])).unwrap();
    let b = Tensor::new([2], Data::U16(vec![10, 4])).unwrap();
    let out = common::compile_run(&g, &[a, b]).unwrap();
    assert_eq!(out[0].data(), &Data::U16(vec![5, 1]));
}

#[test]
fn i64_add_large_values_and_division() {
    let g = binary_graph(BinaryOp::Add, DType::I64, &[4], &[4]);
    let a = Tensor::new([4], Data::I64(vec![i64::MAX, -5, 1 << 40, 7])).unwrap();
    let b = Tensor::new([4], Data::I64(vec![1, 5, 1 << 41, -9])).unwrap();
    check(&g, &[a.clone(), b.clone()]);
    let g = binary_graph(BinaryOp::Div, DType::I64, &[4], &[4]);
    let b = Tensor::new([4], Data::I64(vec![-1, 3, -7, 2])).unwrap();
    check(&g, &[a, b]);
    let g = binary_graph(BinaryOp::Div, DType::I32, &[5], &[5]);
    let a = Tensor::new([5], Data::I32(vec![i32::MIN, -7, 7, 100, -100])).unwrap();
    let b = Tensor::new([5], Data::I32(vec![-1, 2, -2, 7, 9])).unwrap();
    check(&g, &[a, b]);
    let g = binary_graph(BinaryOp::Pow, DType::I64, &[4], &[4]);
    let a = Tensor::new([4], Data::I64(vec![3, -2, 7, 0])).unwrap();
    let b = Tensor::new([4], Data::I64(vec![4, 5, 0, 3])).unwrap();
    check(&g, &[a, b]);
}

#[test]
fn integer_division_by_zero_does_not_trap() {
    let g = binary_graph(BinaryOp::Div, DType::I32, &[2], &[2]);
    let a = Tensor::new([2], Data::I32(vec![5, 6])).unwrap();
    let b = Tensor::new([2], Data::I32(vec![0, 3])).unwrap();
    let out = common::compile_run(&g, &[a, b]).unwrap();
    assert_eq!(out[0].to_i64_vec(), [0, 2]);
}

#[test]
fn casts_between_supported_types() {
    let types = [
        DType::F32,
        DType::F64,
        DType::I32,
        DType::I64,
        DType::I8,
        DType::U8,
        DType::I16,
        DType::Bool,
        DType::U16,
        DType::U32,
        DType::U64,
    ];
    for from in types {
        for to in types {
            // 41 elements: the vector casts' blocks of 16 and a tail.
            for n in [9, 41] {
                let mut g = Graph::new();
                let x = g.add_input("x", ValueType::new(from, [n]));
                let y = g.add_node(Op::Cast { to }, &[x], "cast").unwrap();
                g.add_output("y", y);
                check_rand(&g, 17, 0.0);
            }
        }
    }
}

#[test]
fn float_to_int_casts_saturate_and_truncate() {
    let v = vec![
        1e10,
        -1e10,
        300.7,
        -300.7,
        -0.9,
        0.9,
        f32::NAN,
        127.5,
        -128.9,
        255.9,
        2.5,
    ];
    // Repeated past the vector casts' blocks of 16, shifted so that every
    // value lands in a vector lane and in the tail.
    let v: Vec<f32> = v.iter().cycle().take(4 * v.len() + 3).copied().collect();
    let n = v.len();
    // Every integer type and bool.
    for to in (DType::ALL.into_iter()).filter(|d| d.is_int() || *d == DType::Bool) {
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(DType::F32, [n]));
        let y = g.add_node(Op::Cast { to }, &[x], "cast").unwrap();
        g.add_output("y", y);
        check(&g, &[Tensor::new([n], Data::F32(v.clone())).unwrap()]);
    }
}

/// u64 values above i64::MAX convert to floats by value (unsigned), and
/// floats beyond u64 saturate.
#[test]
fn unsigned_float_conversions_at_the_extremes() {
    let v = vec![u64::MAX, 1 << 63, (1 << 63) + 12345, 0, 1, u32::MAX as u64];
    for to in [DType::F32, DType::F64] {
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(DType::U64, [v.len()]));
        let y = g.add_node(Op::Cast { to }, &[x], "cast").unwrap();
        g.add_output("y", y);
        check(&g, &[Tensor::new([v.len()], Data::U64(v.clone())).unwrap()]);
    }
    let f = vec![
        1.8e19,
        2e19,
        9.3e18,
        -1.0,
        4294967295.0,
        4294967296.0,
        65535.9,
    ];
    for to in UNSIGNED {
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(DType::F64, [f.len()]));
        let y = g.add_node(Op::Cast { to }, &[x], "cast").unwrap();
        g.add_output("y", y);
        check(&g, &[Tensor::new([f.len()], Data::F64(f.clone())).unwrap()]);
    }
}

#[test]
fn chained_elementwise_graph_with_constants() {
    let mut rng = Rng::new(9);
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(DType::F32, [3, 17]));
    let c = g.add_const("c", common::f32_tensor(&mut rng, &[17]));
    let s = g.add_const("s", Tensor::scalar_f32(0.5));
    let a = g
        .add_node(Op::Binary(BinaryOp::Mul), &[x, c], "mul")
        .unwrap();
    let b = g
        .add_node(Op::Binary(BinaryOp::Add), &[a, s], "add")
        .unwrap();
    let r = g
        .add_node(Op::Unary(UnaryOp::Sigmoid), &[b], "sig")
        .unwrap();
    g.add_output("r", r);
    g.add_output("a", a);
    check_with(&g, &[common::f32_tensor(&mut rng, &[3, 17])], 0.0);
}

#[test]
fn tanh_is_accurate_over_a_dense_sweep() {
    let n = 6001;
    let g = unary_graph(UnaryOp::Tanh, DType::F32, &[n]);
    let v: Vec<f32> = (0..n)
        .map(|i| {
            let t = -1.0 + 2.0 * i as f32 / (n - 1) as f32;
            // Dense near zero and around the 0.3 switch, sparse far out.
            t * t * t * 12.0
        })
        .collect();
    check(&g, &[Tensor::new([n], Data::F32(v)).unwrap()]);
    let v = vec![
        0.0,
        -0.0,
        1e-30,
        -1e-7,
        0.2999,
        0.3,
        0.3001,
        9.0,
        -20.0,
        100.0,
        f32::INFINITY,
        f32::NAN,
    ];
    let g = unary_graph(UnaryOp::Tanh, DType::F32, &[v.len()]);
    check(&g, &[Tensor::new([v.len()], Data::F32(v)).unwrap()]);
}

#[test]
fn f16_casts_are_exact_and_round_to_nearest_even() {
    // Every f16 bit pattern (subnormals, infinities, NaNs) widens exactly.
    let all: Vec<half::f16> = (0..=u16::MAX).map(half::f16::from_bits).collect();
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(DType::F16, [all.len()]));
    let y = g
        .add_node(Op::Cast { to: DType::F32 }, &[x], "widen")
        .unwrap();
    g.add_output("y", y);
    check(
        &g,
        &[Tensor::new([all.len()], Data::F16(all.clone())).unwrap()],
    );

    // Narrowing: every f16 value, the midpoints between neighbours (ties
    // go to even), values just either side of them, the overflow
    // threshold, the subnormal range, and random bit patterns.
    let mut v: Vec<f32> = Vec::new();
    for w in all.windows(2) {
        let (a, b) = (w[0].to_f32(), w[1].to_f32());
        if a.is_finite() && b.is_finite() {
            let mid = (a + b) / 2.0;
            v.extend([a, mid, f32::from_bits(mid.to_bits() + 1)]);
            if mid.to_bits() > 0 {
                v.push(f32::from_bits(mid.to_bits() - 1));
            }
        }
    }
    v.extend([
        65504.0,
        65519.99,
        65520.0,
        1e6,
        f32::INFINITY,
        f32::NAN,
        -0.0,
    ]);
    v.extend([f32::MIN_POSITIVE, 1e-8, 2.9e-8, 3.0e-8, 6.0e-8, 5.96e-8]);
    let mut rng = Rng::new(41);
    v.extend((0..50_000).map(|_| f32::from_bits(rng.next_u64() as u32)));
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(DType::F32, [v.len()]));
    let y = g
        .add_node(Op::Cast { to: DType::F16 }, &[x], "narrow")
        .unwrap();
    g.add_output("y", y);
    let n = v.len();
    let expected: Vec<u16> = v
        .iter()
        .map(|&f| half::f16::from_f32(f).to_bits())
        .collect();
    let got = common::compile_run(&g, &[Tensor::new([n], Data::F32(v.clone())).unwrap()]).unwrap();
    let Data::F16(got) = got[0].data() else {
        panic!("f16 output")
    };
    for (i, (e, a)) in expected.iter().zip(got).enumerate() {
        let nan = half::f16::from_bits(*e).is_nan() && a.is_nan();
        assert!(
            nan || *e == a.to_bits(),
            "{} (bits {:#x}): expected {e:#06x}, got {:#06x}",
            v[i],
            v[i].to_bits(),
            a.to_bits()
        );
    }
}

#[test]
fn sixteen_bit_float_ops_run_in_f32_between_casts() {
    for dtype in [DType::F16, DType::BF16] {
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(dtype, [3, 5]));
        let z = g.add_input("z", ValueType::new(dtype, [5]));
        let sum = g
            .add_node(Op::Binary(BinaryOp::Add), &[x, z], "add")
            .unwrap();
        let quotient = g
            .add_node(Op::Binary(BinaryOp::Div), &[sum, x], "div")
            .unwrap();
        let root = g
            .add_node(Op::Unary(UnaryOp::Sqrt), &[quotient], "sqrt")
            .unwrap();
        let t = g
            .add_node(
                Op::Transpose {
                    perm: [1usize, 0][..].into(),
                },
                &[root],
                "t",
            )
            .unwrap();
        let wide = g
            .add_node(Op::Cast { to: DType::F64 }, &[t], "to_f64")
            .unwrap();
        let back = g.add_node(Op::Cast { to: dtype }, &[wide], "back").unwrap();
        g.add_output("t", t);
        g.add_output("back", back);
        let mut rng = Rng::new(5);
        let mut pos = |shape: &[usize]| {
            let n: usize = shape.iter().product();
            let v: Vec<f64> = (0..n).map(|_| rng.f64(0.5, 4.0)).collect();
            Tensor::new(shape, Data::from_f64s(dtype, v.into_iter())).unwrap()
        };
        let inputs = [pos(&[3, 5]), pos(&[5])];
        // Each op rounds once to the 16-bit type, as the reference does:
        // the results agree exactly.
        check(&g, &inputs);
    }
}

/// The transcendental unary ops in their domains, f32 and (where the CPU
/// target has an f64 kernel; otherwise the compile must refuse it with
/// `UnsupportedDType`) f64, on sizes that take both the vector loop and the
/// scalar tail, for every x86-64 target level that runs here (`Asinh` once
/// failed to compile on x86-64: Cranelift has no vector `fcopysign`
/// there).
#[test]
fn transcendental_unary_ops_compile_and_match_on_every_target() {
    use kiln_target_cpu::CpuTarget;
    let ops: [(UnaryOp, f64, f64); 13] = [
        (UnaryOp::Asinh, -4.0, 4.0),
        (UnaryOp::Acosh, 1.0, 5.0),
        (UnaryOp::Atanh, -0.9, 0.9),
        (UnaryOp::Sin, -4.0, 4.0),
        (UnaryOp::Cos, -4.0, 4.0),
        (UnaryOp::Tan, -1.2, 1.2),
        (UnaryOp::Asin, -0.95, 0.95),
        (UnaryOp::Acos, -0.95, 0.95),
        (UnaryOp::Atan, -5.0, 5.0),
        (UnaryOp::Sinh, -3.0, 3.0),
        (UnaryOp::Cosh, -3.0, 3.0),
        (UnaryOp::Erf, -3.0, 3.0),
        (UnaryOp::Softplus, -5.0, 5.0),
    ];
    for (i, (op, lo, hi)) in ops.into_iter().enumerate() {
        for dtype in [DType::F32, DType::F64] {
            let g = unary_graph(op, dtype, &[11]);
            let mut rng = Rng::new(100 + i as u64);
            let v: Vec<f64> = (0..11).map(|_| rng.f64(lo, hi)).collect();
            let data = match dtype {
                DType::F32 => Data::F32(v.iter().map(|&x| x as f32).collect()),
                _ => Data::F64(v),
            };
            let x = Tensor::new([11], data).unwrap();
            let opts = kiln_target_cpu::CpuOptions::default();
            match kiln_target_cpu::compile(&g, &opts, Default::default()) {
                Err(kiln_target_cpu::CpuError::UnsupportedDType { .. }) if dtype == DType::F64 => {
                    continue
                }
                Err(e) => panic!("{op:?} on {dtype}: {e}"),
                Ok(_) => {}
            }
            for target in [
                CpuTarget::Native,
                CpuTarget::X86_64V3,
                CpuTarget::X86_64Avx512,
            ] {
                let runs = match target {
                    CpuTarget::X86_64V3 => std::arch::is_x86_feature_detected!("avx2"),
                    CpuTarget::X86_64Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
                    _ => true,
                };
                if runs {
                    common::check_for(&g, std::slice::from_ref(&x), 1e-6, target);
                }
            }
        }
    }
}

/// f32 → u8 on the AVX-512 narrowing kernel (the end of every int8
/// activation quantization): truncation, saturation at both ends, NaN to
/// 0, masked tails and ranges split over threads, bit-exact with the
/// reference evaluator.
#[test]
fn f32_to_u8_on_the_narrowing_kernel() {
    let special = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        -0.9,
        -1.0,
        0.5,
        254.99,
        255.0,
        255.7,
        300.0,
        1e30,
        -1e30,
        127.5,
    ];
    let avx512 = std::arch::is_x86_feature_detected!("avx512f");
    let mut rng = Rng::new(77);
    for n in [13, 64, 77, 1000, 300_001] {
        let v: Vec<f32> = (0..n)
            .map(|i| {
                if i % 7 == 0 {
                    special[(i / 7) % special.len()]
                } else {
                    rng.f64(-40.0, 300.0) as f32
                }
            })
            .collect();
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(DType::F32, [n]));
        let y = g
            .add_node(Op::Cast { to: DType::U8 }, &[x], "quantized")
            .unwrap();
        g.add_output("y", y);
        check(&g, &[Tensor::new([n], Data::F32(v)).unwrap()]);
        for threads in [1, 2] {
            let opts = kiln_target_cpu::CpuOptions {
                target: kiln_target_cpu::CpuTarget::Native,
                opt_level: 2,
                threads,
            };
            let a = kiln_target_cpu::compile(&g, &opts, Default::default()).unwrap();
            assert_eq!(common::has_zmm_code(&a), avx512, "n = {n}");
        }
    }
}

/// The narrow storage types (`kiln_ir::narrow`).
fn narrow_types() -> impl Iterator<Item = DType> + Clone {
    DType::ALL.into_iter().filter(|d| d.is_narrow())
}

fn cast_graph(from: DType, to: DType, len: usize) -> Graph {
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(from, [len]));
    let y = g.add_node(Op::Cast { to }, &[x], "cast").unwrap();
    g.add_output("y", y);
    g
}

#[test]
fn narrow_type_casts_match_the_evaluator() {
    // To each narrow type from f32 (codes compared exactly): zeros of both
    // signs, NaN, infinities, ties of every format, values around the
    // subnormal and saturation limits, and a random sweep.
    let mut rng = Rng::new(808);
    let mut values: Vec<f32> = vec![
        0.0,
        -0.0,
        f32::NAN,
        -f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MIN_POSITIVE,
        1e-7,
        -1e-7,
        0.25,
        0.75,
        1.0625,
        1.1875,
        -3.5,
        2.5,
        7.0,
        7.9,
        8.0,
        -8.0,
        -9.0,
        15.0,
        16.0,
        240.0,
        447.9,
        448.0,
        464.0,
        465.0,
        57344.0,
        61440.0,
        1e6,
        -1e6,
        2f32.powi(-9),
        2f32.powi(-10),
        3.0 * 2f32.powi(-11),
        2f32.powi(-16),
        2f32.powi(-17),
        1.5 * 2f32.powi(-17),
    ];
    for _ in 0..400 {
        let exp = rng.int(-20, 18) as i32;
        values.push(rng.f64(-2.0, 2.0) as f32 * 2f32.powi(exp));
    }
    for _ in 0..100 {
        values.push(rng.int(-20, 20) as f32);
    }
    let n = values.len();
    let x = Tensor::new([n], Data::F32(values.clone())).unwrap();
    let xf64 = Tensor::new([n], Data::F64(values.iter().map(|&v| v as f64).collect())).unwrap();
    let ints = Tensor::new(
        [n],
        Data::I32((0..n as i32).map(|i| i * 37 - 500).collect()),
    )
    .unwrap();
    assert_eq!(narrow_types().count(), 9);
    for to in narrow_types() {
        check(&cast_graph(DType::F32, to, n), std::slice::from_ref(&x));
        check(&cast_graph(DType::F64, to, n), std::slice::from_ref(&xf64));
        check(&cast_graph(DType::I32, to, n), std::slice::from_ref(&ints));
        // From every code of the type: to f32 (NaNs compared as NaN),
        // f16, i32, u8, every other narrow type and itself through f32.
        let bits = kiln_ir::narrow::code_bits(to).unwrap();
        let codes: Vec<u8> = (0..1u32 << bits).map(|c| c as u8).collect();
        let all = Tensor::new([codes.len()], Data::Narrow(to, codes.clone())).unwrap();
        for target in [DType::F32, DType::F16, DType::I32, DType::U8, DType::F64]
            .into_iter()
            .chain(narrow_types())
        {
            check(
                &cast_graph(to, target, codes.len()),
                std::slice::from_ref(&all),
            );
        }
    }
}

#[test]
fn arithmetic_on_narrow_types_is_refused() {
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(DType::F8E4M3FN, [4]));
    let err = g
        .add_node(Op::Binary(BinaryOp::Add), &[x, x], "add")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("f8e4m3fn is a storage type"),
        "unexpected error: {err}"
    );
}
