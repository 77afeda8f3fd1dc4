//! The kernels' numbers, without a GPU: every op family is compiled, its
//! PTX executed by a small interpreter (`interp/`), and the outputs
//! compared with the IR reference evaluator (`kiln_ir::eval`).

use kiln_test_kit::ptx_interp as interp;

use kiln_ir::{
    BinaryOp, BitwiseOp, CompareOp, Conv2d, DType, Data, Graph, LogicalOp, NodeId, Op, Pool2d,
    ReduceOp, SliceAxis, Tensor, UnaryOp, ValueType,
};
use kiln_target_cuda::{compile, SmArch};
use smallvec::smallvec;

/// Deterministic pseudo-random values in [-2, 2).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = kiln_test_kit::Rng::new(seed);
    (0..n).map(|_| rng.f64(-2.0, 2.0) as f32).collect()
}

fn tensor(d: DType, shape: &[usize], seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let v = values(n, seed);
    let data = match d {
        DType::F32 => Data::F32(v),
        DType::F64 | DType::F16 | DType::BF16 => Data::from_f64s(d, v.iter().map(|&x| x as f64)),
        DType::Bool => Data::Bool(v.iter().map(|&x| x > 0.0).collect()),
        DType::I64 => Data::I64(v.iter().map(|&x| (x * 5.0) as i64).collect()),
        DType::I32 => Data::I32(v.iter().map(|&x| (x * 5.0) as i32).collect()),
        DType::U8 => Data::U8(v.iter().map(|&x| ((x + 2.0) * 60.0) as u8).collect()),
        DType::I8 => Data::I8(v.iter().map(|&x| (x * 60.0) as i8).collect()),
        DType::U16 => Data::U16(v.iter().map(|&x| (x * 20000.0) as i32 as u16).collect()),
        DType::U32 => Data::U32(v.iter().map(|&x| (x * 1e9) as i64 as u32).collect()),
        DType::U64 => Data::U64(v.iter().map(|&x| (x * 4e18) as i64 as u64).collect()),
        other => panic!("no generator for {other}"),
    };
    Tensor::new(shape, data).unwrap()
}

/// Compiles `g` for sm_80, interprets it and compares with the reference.
fn check(g: &Graph, inputs: &[Tensor]) {
    interp::check_against_reference(g, inputs);
}

fn graph1(d: DType, shape: &[usize], op: Op) -> (Graph, Vec<Tensor>) {
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(d, shape));
    let y = g.add_node(op, &[x], "y").unwrap();
    g.add_output("y", y);
    (g, vec![tensor(d, shape, 1)])
}

fn graph2(da: DType, a: &[usize], db: DType, b: &[usize], op: Op) -> (Graph, Vec<Tensor>) {
    let mut g = Graph::new();
    let x = g.add_input("a", ValueType::new(da, a));
    let y = g.add_input("b", ValueType::new(db, b));
    let z = g.add_node(op, &[x, y], "z").unwrap();
    g.add_output("z", z);
    (g, vec![tensor(da, a, 2), tensor(db, b, 3)])
}

fn run1(d: DType, shape: &[usize], op: Op) {
    let (g, i) = graph1(d, shape, op);
    check(&g, &i);
}

#[test]
fn unary_ops() {
    let ops = [
        UnaryOp::Relu,
        UnaryOp::LeakyRelu { alpha: 0.1 },
        UnaryOp::Sigmoid,
        UnaryOp::Tanh,
        UnaryOp::HardSigmoid {
            alpha: 0.2,
            beta: 0.5,
        },
        UnaryOp::HardSwish,
        UnaryOp::Clip {
            min: -0.5,
            max: 1.0,
        },
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Sqrt,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Reciprocal,
        UnaryOp::Floor,
        UnaryOp::Ceil,
    ];
    for op in ops {
        run1(DType::F32, &[3, 70], Op::Unary(op));
    }
    for op in [
        UnaryOp::Relu,
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Clip {
            min: -3.5,
            max: 4.2,
        },
    ] {
        run1(DType::I64, &[5, 7], Op::Unary(op));
        run1(DType::I8, &[9], Op::Unary(op));
        run1(DType::F64, &[9], Op::Unary(op));
    }
}

#[test]
fn binary_ops_broadcast() {
    let ops = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Max,
        BinaryOp::Min,
        BinaryOp::Pow,
    ];
    for op in ops {
        let (g, i) = graph2(DType::F32, &[2, 3, 5], DType::F32, &[3, 1], Op::Binary(op));
        check(&g, &i);
    }
    // Integer operands without zero divisors (the reference refuses a
    // division by zero) and with small exponents.
    let nonzero = |d: DType, shape: &[usize], seed: u64| {
        let t = tensor(d, shape, seed).cast(DType::I64);
        let v: Vec<i64> = t
            .to_i64_vec()
            .iter()
            .map(|&x| if x == 0 { 3 } else { x.rem_euclid(4) + 1 })
            .collect();
        Tensor::new(shape, Data::I64(v)).unwrap().cast(d)
    };
    for op in [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Max,
        BinaryOp::Min,
        BinaryOp::Pow,
    ] {
        let (g, _) = graph2(DType::I64, &[4, 1], DType::I64, &[1, 6], Op::Binary(op));
        check(
            &g,
            &[
                tensor(DType::I64, &[4, 1], 2),
                nonzero(DType::I64, &[1, 6], 3),
            ],
        );
        let (g, _) = graph2(DType::I32, &[7], DType::I32, &[7], Op::Binary(op));
        check(
            &g,
            &[tensor(DType::I32, &[7], 2), nonzero(DType::I32, &[7], 3)],
        );
    }
}

#[test]
fn casts_compares_logic_where() {
    for (from, to) in [
        (DType::F32, DType::I32),
        (DType::F32, DType::U8),
        (DType::F32, DType::Bool),
        (DType::F32, DType::F64),
        (DType::I64, DType::F32),
        (DType::I64, DType::I8),
        (DType::Bool, DType::F32),
        (DType::F64, DType::F32),
    ] {
        run1(from, &[4, 9], Op::Cast { to });
    }
    for op in CompareOp::ALL {
        let (g, i) = graph2(DType::F32, &[3, 4], DType::F32, &[4], Op::Compare(op));
        check(&g, &i);
        let (g, i) = graph2(DType::I64, &[3, 4], DType::I64, &[3, 1], Op::Compare(op));
        check(&g, &i);
    }
    for op in LogicalOp::ALL {
        let (g, i) = graph2(DType::Bool, &[2, 5], DType::Bool, &[5], Op::Logical(op));
        check(&g, &i);
    }
    run1(DType::Bool, &[11], Op::Not);
    let mut g = Graph::new();
    let c = g.add_input("c", ValueType::new(DType::Bool, [3, 1]));
    let x = g.add_input("x", ValueType::new(DType::F32, [3, 4]));
    let y = g.add_input("y", ValueType::new(DType::F32, [4]));
    let w = g.add_node(Op::Where, &[c, x, y], "w").unwrap();
    g.add_output("w", w);
    check(
        &g,
        &[
            tensor(DType::Bool, &[3, 1], 4),
            tensor(DType::F32, &[3, 4], 5),
            tensor(DType::F32, &[4], 6),
        ],
    );
}

/// The bits of `v` as a `d` tensor (small negatives become values near an
/// unsigned type's maximum).
fn ints(d: DType, shape: &[usize], v: &[i64]) -> Tensor {
    Tensor::new(shape, Data::from_i64s(d, v.iter().copied())).unwrap()
}

fn graph2_with(op: Op, a: Tensor, b: Tensor) -> (Graph, Vec<Tensor>) {
    let mut g = Graph::new();
    let x = g.add_input("a", ValueType::new(a.dtype(), a.shape().as_slice()));
    let y = g.add_input("b", ValueType::new(b.dtype(), b.shape().as_slice()));
    let z = g.add_node(op, &[x, y], "z").unwrap();
    g.add_output("z", z);
    (g, vec![a, b])
}

/// Compiles `g`, interprets it (`ex2.approx` and `lg2.approx` at their
/// error bounds) and compares every float output element by
/// element with the reference evaluator at the ONNX test runner's
/// tolerance (`|got - want| <= 1e-7 + 1e-3 |want|`, NaN where NaN,
/// infinities exactly): unlike [`check`]'s tolerance relative to the
/// output's scale, it holds small results to their own size, as the
/// conformance cases do on a GPU.
fn check_each_element(what: &str, g: &Graph, inputs: &[Tensor]) {
    check_each_element_within(what, g, inputs, 1e-3, 1e-7);
}

/// [`check_each_element`] at `|got - want| <= atol + rtol |want|`.
fn check_each_element_within(what: &str, g: &Graph, inputs: &[Tensor], rtol: f64, atol: f64) {
    let expected = kiln_ir::eval::eval_graph(g, inputs).expect("reference");
    let p = compile(g, SmArch::parse("sm80").unwrap()).expect("compile");
    let bytes: Vec<Vec<u8>> = inputs.iter().map(|t| t.data().to_le_bytes()).collect();
    let got = interp::run_program_at_error_bounds(&p, &bytes).expect("run");
    for (e, g) in expected.iter().zip(&got) {
        let got = Data::from_le_bytes(e.dtype(), g).expect("output bytes");
        for i in 0..e.len() {
            let (x, y) = (got.get_f64(i), e.data().get_f64(i));
            let ok = if y.is_nan() {
                x.is_nan()
            } else if y.is_infinite() {
                x == y
            } else {
                (x - y).abs() <= atol + rtol * y.abs()
            };
            let at: Vec<f64> = inputs.iter().map(|t| t.data().get_f64(i)).collect();
            assert!(ok, "{what} at {at:?}: got {x}, expected {y}");
        }
    }
}

/// Small results keep their relative accuracy: on an H200, Mish at x = -10
/// was 2.4e-3 off (`ln(1 + e^-10)` through `lg2.approx`, `tanh` of a small
/// value through `1 - e^{-2x}`), failing ONNX's `test_mish`; and C `fmod`
/// by an infinite divisor gave NaN (`test_mod_float_edge_cases_*`).
#[test]
fn small_results_and_edge_cases_match_element_by_element() {
    let xs = [
        -30.0, -20.0, -10.0, -5.0, -1.0, -0.3, -1e-2, -1e-4, -1e-6, 0.0, 1e-6, 1e-4, 1e-2, 0.3,
        0.7, 1.0, 5.0, 10.0, 20.0,
    ];
    let x = Tensor::new([xs.len()], Data::F32(xs.to_vec())).unwrap();
    for op in [
        UnaryOp::Mish,
        UnaryOp::Softplus,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::Exp,
        UnaryOp::Gelu { tanh: true },
    ] {
        let (g, _) = graph1(DType::F32, &[xs.len()], Op::Unary(op));
        check_each_element(op.name(), &g, std::slice::from_ref(&x));
    }
    let positive = [
        1e-30, 1e-6, 0.01, 0.5, 0.9, 0.999, 0.99999, 1.0, 1.00001, 1.001, 1.1, 2.0, 100.0, 1e30,
    ];
    let p = Tensor::new([positive.len()], Data::F32(positive.to_vec())).unwrap();
    let (g, _) = graph1(DType::F32, &[positive.len()], Op::Unary(UnaryOp::Log));
    check_each_element("log", &g, &[p]);

    // ONNX's test_mod_float_edge_cases_fmod_* inputs, and some ordinary ones.
    let inf = f32::INFINITY;
    let a = [
        0.0,
        -0.0,
        0.0,
        -0.0,
        -3.0,
        3.0,
        -1.0,
        1.0,
        inf,
        -inf,
        1.0,
        1.0,
        f32::NAN,
        1.0,
        5.5,
        -5.5,
        7.25,
        -7.25,
    ];
    let b = [
        -2.0,
        2.0,
        2.0,
        -2.0,
        inf,
        inf,
        -inf,
        -inf,
        2.0,
        2.0,
        0.0,
        -0.0,
        2.0,
        f32::NAN,
        2.0,
        2.0,
        -1.5,
        -1.5,
    ];
    for d in [DType::F32, DType::F64] {
        let t = |v: &[f32]| {
            Tensor::new([v.len()], Data::from_f64s(d, v.iter().map(|&x| x as f64))).unwrap()
        };
        for op in [BinaryOp::Mod, BinaryOp::Fmod] {
            let (g, inputs) = graph2_with(Op::Binary(op), t(&a), t(&b));
            check_each_element(&format!("{} {d}", op.name()), &g, &inputs);
        }
    }
}

#[test]
fn unsigned_types_and_bitwise_ops() {
    let vals = [0, 1, -1, -2, 7, 0x55, 1000, -1000];
    for d in [DType::U8, DType::U16, DType::U32] {
        let w = 8 * d.size_bytes() as i64;
        let a = ints(d, &[2, 4], &vals);
        let nz = ints(d, &[4], &[3, -1, 2, 1000]);
        for op in [
            BinaryOp::Add,
            BinaryOp::Sub,
            BinaryOp::Mul,
            BinaryOp::Div,
            BinaryOp::Mod,
            BinaryOp::Max,
            BinaryOp::Min,
        ] {
            let (g, i) = graph2_with(Op::Binary(op), a.clone(), nz.clone());
            check(&g, &i);
        }
        for op in [CompareOp::Less, CompareOp::GreaterOrEqual] {
            let (g, i) = graph2_with(Op::Compare(op), a.clone(), nz.clone());
            check(&g, &i);
        }
        for to in [DType::F32, DType::I64, DType::U8] {
            let mut g = Graph::new();
            let x = g.add_input("x", ValueType::new(d, [2, 4]));
            let y = g.add_node(Op::Cast { to }, &[x], "c").unwrap();
            g.add_output("y", y);
            check(&g, std::slice::from_ref(&a));
        }
        let f = Tensor::new([4], Data::F32(vec![-3.0, 1e10, 65535.9, 7.5])).unwrap();
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(DType::F32, [4]));
        let y = g.add_node(Op::Cast { to: d }, &[x], "c").unwrap();
        g.add_output("y", y);
        check(&g, &[f]);
        for op in [BitwiseOp::And, BitwiseOp::Or, BitwiseOp::Xor] {
            let (g, i) = graph2_with(Op::Bitwise(op), a.clone(), nz.clone());
            check(&g, &i);
        }
        // Every value shifted by 0, 1, width - 1, width and past it.
        let amounts = ints(d, &[8], &[0, 1, w - 1, w, w + 1, 100, -1, 3]);
        let col = ints(d, &[8, 1], &vals);
        for op in [BitwiseOp::ShiftLeft, BitwiseOp::ShiftRight] {
            let (g, i) = graph2_with(Op::Bitwise(op), col.clone(), amounts.clone());
            check(&g, &i);
        }
        run1(d, &[8], Op::BitwiseNot);
    }
    for d in [DType::I8, DType::I32, DType::I64] {
        let w = 8 * d.size_bytes() as i64;
        let amounts = ints(d, &[8], &[0, 1, w - 1, w, w + 1, 100, -1, -70]);
        for op in [BitwiseOp::ShiftLeft, BitwiseOp::ShiftRight] {
            let (g, i) = graph2_with(Op::Bitwise(op), ints(d, &[8, 1], &vals), amounts.clone());
            check(&g, &i);
        }
        let (g, i) = graph2_with(
            Op::Bitwise(BitwiseOp::Xor),
            ints(d, &[2, 4], &vals),
            ints(d, &[4], &[-1, 5, -8, 0]),
        );
        check(&g, &i);
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(d, [8]));
        let y = g.add_node(Op::BitwiseNot, &[x], "n").unwrap();
        g.add_output("y", y);
        check(&g, &[ints(d, &[8], &vals)]);
    }
}

/// u64 computes with the unsigned instructions: values past i64::MAX
/// compare, divide, shift right, reduce and convert as unsigned, checked
/// exactly against the reference evaluator.
#[test]
fn u64_has_unsigned_semantics() {
    let big = |v: u64| v as i64;
    let a = [
        big(u64::MAX),
        big(1 << 63),
        7,
        0,
        12345,
        big(u64::MAX - 6),
        3,
        64,
    ];
    let b = [2, 3, 5, 9, big(1 << 63), 7, 64, 1];
    let u = |v: &[i64]| ints(DType::U64, &[v.len()], v);
    let exponents = [0, 1, 2, 3, 5, 2, 7, 9];
    let shifts = [1, 63, 64, 0, 5, 2, 70, 3];
    let binary = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Mod,
        BinaryOp::Fmod,
        BinaryOp::Max,
        BinaryOp::Min,
    ]
    .map(|op| (Op::Binary(op), &b));
    let compare = CompareOp::ALL.map(|op| (Op::Compare(op), &b));
    let bitwise = [
        BitwiseOp::And,
        BitwiseOp::Or,
        BitwiseOp::Xor,
        BitwiseOp::ShiftLeft,
        BitwiseOp::ShiftRight,
    ]
    .map(|op| (Op::Bitwise(op), &shifts));
    let pow = [(Op::Binary(BinaryOp::Pow), &exponents)];
    for (op, rhs) in binary.into_iter().chain(compare).chain(bitwise).chain(pow) {
        let (g, i) = graph2_with(op, u(&a), u(rhs));
        check(&g, &i);
    }
    for op in [
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Relu,
        UnaryOp::Sign,
        UnaryOp::Clip {
            min: 5.0,
            max: 1e19,
        },
    ] {
        let (g, _) = graph1(DType::U64, &[a.len()], Op::Unary(op));
        check(&g, &[u(&a)]);
    }
    for to in [
        DType::F32,
        DType::F64,
        DType::I64,
        DType::I32,
        DType::U8,
        DType::Bool,
    ] {
        let (g, _) = graph1(DType::U64, &[a.len()], Op::Cast { to });
        check(&g, &[u(&a)]);
    }
    let floats = Tensor::new([6], Data::F32(vec![-3.0, 0.5, 7.9, 1e19, 3e19, f32::NAN])).unwrap();
    let (g, _) = graph1(DType::F32, &[6], Op::Cast { to: DType::U64 });
    check(&g, &[floats]);
    for op in [ReduceOp::Max, ReduceOp::Min, ReduceOp::Sum] {
        let (g, _) = graph1(
            DType::U64,
            &[2, 4],
            Op::Reduce {
                op,
                axes: smallvec![1],
                keep_dims: false,
            },
        );
        check(&g, &[ints(DType::U64, &[2, 4], &a)]);
    }
}

/// `y = 0.5 · op(A) @ op(B) − 1.5 · c` with A `[66, k]` and B `[k, 70]` of
/// type `d` (transposed as asked), c f32 `[70]`; returns the graph and
/// the stored shapes of A and B.
fn gemm_graph(d: DType, k: usize, (ta, tb): (bool, bool)) -> (Graph, [usize; 2], [usize; 2]) {
    let mut g = Graph::new();
    let a_shape = if ta { [k, 66] } else { [66, k] };
    let b_shape = if tb { [70, k] } else { [k, 70] };
    let a = g.add_input("a", ValueType::new(d, a_shape));
    let b = g.add_input("b", ValueType::new(d, b_shape));
    let c = g.add_input("c", ValueType::new(DType::F32, [70]));
    let y = g
        .add_node(
            Op::Gemm {
                alpha: 0.5,
                beta: -1.5,
                trans_a: ta,
                trans_b: tb,
            },
            &[a, b, c],
            "gemm",
        )
        .unwrap();
    g.add_output("y", y);
    (g, a_shape, b_shape)
}

#[test]
fn matmul_and_gemm() {
    // Not multiples of the 64x64 tile or the K slice; batch broadcast.
    let (g, i) = graph2(
        DType::F32,
        &[2, 1, 70, 37],
        DType::F32,
        &[3, 37, 65],
        Op::MatMul,
    );
    check(&g, &i);
    let (g, i) = graph2(DType::F32, &[37], DType::F32, &[37, 5], Op::MatMul);
    check(&g, &i);
    let (g, i) = graph2(DType::F32, &[4, 37], DType::F32, &[37], Op::MatMul);
    check(&g, &i);
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        let (g, a_shape, b_shape) = gemm_graph(DType::F32, 19, (ta, tb));
        check(
            &g,
            &[
                tensor(DType::F32, &a_shape, 7),
                tensor(DType::F32, &b_shape, 8),
                tensor(DType::F32, &[70], 9),
            ],
        );
    }
}

/// The PTX interpreter's output for `g` compiled for `sm` (`sm80` unless
/// said), compared with the reference evaluator as [`check`] does.
fn check_on(sm: &str, g: &Graph, inputs: &[Tensor]) {
    interp::check_against_reference_on(SmArch::parse(sm).unwrap(), g, inputs);
}

#[test]
fn half_precision_matmul_and_gemm_on_tensor_cores_and_simt() {
    // bf16 x bf16 and f16 x f16 run on `mma.sync` from sm_80, on the SIMT
    // kernel before; mixed operands (f16 weights, f32 activations: the
    // fp16 precision mode) on the SIMT kernel everywhere. Shapes leave
    // partial tiles in M, N and K, with batch broadcast.
    for (da, db) in [
        (DType::BF16, DType::BF16),
        (DType::F16, DType::F16),
        (DType::F32, DType::F16),
        (DType::BF16, DType::F32),
    ] {
        let (g, i) = graph2(da, &[2, 1, 70, 45], db, &[3, 45, 72], Op::MatMul);
        let text = compile(&g, SmArch::parse("sm80").unwrap()).unwrap().ptx;
        assert_eq!(text.contains("mma.sync"), da == db, "{da} x {db}");
        for sm in ["sm70", "sm80"] {
            check_on(sm, &g, &i);
        }
    }
    // K and N multiples of a 16-byte vector: the tiles are staged with
    // `ld.global.v4` (K = 48 leaves a partial 32-element stage).
    for d in [DType::F32, DType::BF16, DType::F16] {
        let (g, i) = graph2(d, &[3, 70, 48], d, &[48, 80], Op::MatMul);
        let text = compile(&g, SmArch::parse("sm80").unwrap()).unwrap().ptx;
        assert_eq!(
            text.matches("ld.global.v4.b32").count(),
            2,
            "{d}: A and B vectors"
        );
        for sm in ["sm75", "sm80"] {
            check_on(sm, &g, &i);
        }
    }
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        let (g, a_shape, b_shape) = gemm_graph(DType::BF16, 33, (ta, tb));
        check_on(
            "sm90",
            &g,
            &[
                tensor(DType::BF16, &a_shape, 7),
                tensor(DType::BF16, &b_shape, 8),
                tensor(DType::F32, &[70], 9),
            ],
        );
    }
}

#[test]
fn int8_matmul_with_constant_weights_runs_on_tensor_cores() {
    // Quantized weights (constant B, zero point 0): `mma.sync` m16n8k32
    // from sm_80 with the A zero point's correction by B's column sums;
    // u8 and s8 on either side, A batched, M, N and K not multiples of the
    // tile or the 64-byte K stage. Exact (wrapping i32) against the
    // reference evaluator; sm_75 runs the direct kernel.
    // (K, N) = (100, 72) stages element by element, (96, 80) with 16-byte
    // vectors.
    for (da, db, a_zero, (k, n)) in [
        (DType::U8, DType::I8, 131i64, (100, 72)),
        (DType::I8, DType::I8, -5, (100, 72)),
        (DType::U8, DType::U8, 0, (100, 72)),
        (DType::U8, DType::I8, 7, (96, 80)),
    ] {
        let mut g = Graph::new();
        let a = g.add_input("a", ValueType::new(da, [2, 70, k]));
        let b = g.add_const("w", tensor(db, &[k, n], 5));
        let za = g.add_const(
            "a_zero",
            Tensor::new([], Data::from_i64s(da, [a_zero].into_iter())).unwrap(),
        );
        let zb = g.add_const(
            "w_zero",
            Tensor::new([n], Data::from_i64s(db, std::iter::repeat_n(0, n))).unwrap(),
        );
        let y = g
            .add_node(Op::MatMulInteger, &[a, b, za, zb], "mm")
            .unwrap();
        g.add_output("y", y);
        let program = compile(&g, SmArch::parse("sm80").unwrap()).unwrap();
        assert!(
            program.ptx.contains("mma.sync.aligned.m16n8k32"),
            "{da} x {db}"
        );
        assert_eq!(
            program.ptx.contains("ld.global.v4"),
            k % 16 == 0,
            "{da} x {db}"
        );
        let inputs = [tensor(da, &[2, 70, k], 6)];
        for sm in ["sm75", "sm80"] {
            check_on(sm, &g, &inputs);
        }
    }
}

#[test]
fn int8_convolution_with_constant_weights_runs_on_tensor_cores() {
    // ConvInteger with quantized weights (constant, zero point 0) and 16+
    // output channels per group: implicit GEMM on `mma.sync` m16n8k32
    // from sm_80, the padding read as X's zero point and the correction by
    // the weights' row sums; groups, strides, dilations, asymmetric pads.
    // Exact against the reference evaluator; sm_75 runs the direct kernel.
    let c = Conv2d {
        strides: [2, 1],
        pads: [1, 2, 0, 1],
        dilations: [1, 2],
        group: 2,
    };
    for (dx, dw, x_zero) in [(DType::U8, DType::I8, 119i64), (DType::I8, DType::I8, -3)] {
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(dx, [2, 6, 9, 10]));
        let w = g.add_const("w", tensor(dw, &[36, 3, 3, 3], 11));
        let zx = g.add_const(
            "x_zero",
            Tensor::new([], Data::from_i64s(dx, [x_zero].into_iter())).unwrap(),
        );
        let zw = g.add_const(
            "w_zero",
            Tensor::new([], Data::from_i64s(dw, [0].into_iter())).unwrap(),
        );
        let y = g
            .add_node(Op::ConvInteger(c.clone()), &[x, w, zx, zw], "conv")
            .unwrap();
        g.add_output("y", y);
        let program = compile(&g, SmArch::parse("sm80").unwrap()).unwrap();
        assert!(
            program.ptx.contains("mma.sync.aligned.m16n8k32"),
            "{dx} x {dw}"
        );
        let inputs = [tensor(dx, &[2, 6, 9, 10], 10)];
        for sm in ["sm75", "sm80"] {
            check_on(sm, &g, &inputs);
        }
    }
}

#[test]
fn half_precision_storage_casts_and_convolution() {
    // Casts round to nearest even (ties, overflow to infinity, NaN kept),
    // and widen exactly; elementwise ops on f16 compute in f32 and round.
    let mut v = values(280, 4);
    v[..8].copy_from_slice(&[
        f32::NAN,
        -f32::INFINITY,
        1.0e6,
        -7.0e4,
        1.0 + 1.0 / 256.0,
        1.0 + 3.0 / 256.0,
        6.0e-8,
        -0.0,
    ]);
    let x = Tensor::new([4, 70], Data::F32(v)).unwrap();
    for to in [DType::F16, DType::BF16] {
        let mut g = Graph::new();
        let i = g.add_input("x", ValueType::new(DType::F32, [4, 70]));
        let h = g.add_node(Op::Cast { to }, &[i], "to_half").unwrap();
        let s = g
            .add_node(Op::Unary(UnaryOp::Sigmoid), &[h], "sigmoid")
            .unwrap();
        let back = g
            .add_node(Op::Cast { to: DType::F32 }, &[h], "to_f32")
            .unwrap();
        g.add_output("half", h);
        g.add_output("sigmoid", s);
        g.add_output("back", back);
        for sm in ["sm75", "sm80"] {
            check_on(sm, &g, std::slice::from_ref(&x));
        }
    }
    // The fp16/bf16 precision modes' convolutions: 16-bit weights, f32
    // activations (SIMT, implicit GEMM and direct), and all-f16 (mma).
    let c = Conv2d {
        strides: [2, 1],
        pads: [0, 2, 1, 0],
        dilations: [1, 2],
        group: 2,
    };
    for (dx, dw, cout) in [
        (DType::F32, DType::F16, 36),
        (DType::F32, DType::BF16, 4),
        (DType::F16, DType::F16, 36),
    ] {
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(dx, [2, 6, 9, 10]));
        let w = g.add_input("w", ValueType::new(dw, [cout, 3, 3, 3]));
        let b = g.add_input("b", ValueType::new(DType::F32, [cout]));
        let y = g.add_node(Op::Conv(c.clone()), &[x, w, b], "conv").unwrap();
        g.add_output("y", y);
        check(
            &g,
            &[
                tensor(dx, &[2, 6, 9, 10], 10),
                tensor(dw, &[cout, 3, 3, 3], 11),
                tensor(DType::F32, &[cout], 12),
            ],
        );
    }
}

#[test]
fn convolution() {
    for (c, group, cin, cout, k) in [
        (
            Conv2d {
                strides: [1, 1],
                pads: [1, 1, 1, 1],
                dilations: [1, 1],
                group: 1,
            },
            1,
            3,
            4,
            3,
        ),
        (
            Conv2d {
                strides: [2, 1],
                pads: [0, 2, 1, 0],
                dilations: [1, 2],
                group: 2,
            },
            2,
            4,
            6,
            3,
        ),
        (
            Conv2d {
                strides: [1, 1],
                pads: [0, 0, 0, 0],
                dilations: [1, 1],
                group: 1,
            },
            1,
            2,
            3,
            8,
        ),
        // Implicit GEMM (16+ output channels per group): M, N and K not
        // multiples of the tile, and grouped with strides, dilations, pads.
        (
            Conv2d {
                strides: [1, 1],
                pads: [1, 1, 1, 1],
                dilations: [1, 1],
                group: 1,
            },
            1,
            5,
            70,
            3,
        ),
        (
            Conv2d {
                strides: [2, 1],
                pads: [0, 2, 1, 0],
                dilations: [1, 2],
                group: 2,
            },
            2,
            6,
            36,
            3,
        ),
    ] {
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(DType::F32, [2, cin, 9, 10]));
        let w = g.add_input("w", ValueType::new(DType::F32, [cout, cin / group, k, k]));
        let b = g.add_input("b", ValueType::new(DType::F32, [cout]));
        let y = g.add_node(Op::Conv(c), &[x, w, b], "conv").unwrap();
        g.add_output("y", y);
        check(
            &g,
            &[
                tensor(DType::F32, &[2, cin, 9, 10], 10),
                tensor(DType::F32, &[cout, cin / group, k, k], 11),
                tensor(DType::F32, &[cout], 12),
            ],
        );
    }
}

#[test]
fn pools() {
    let p = Pool2d {
        kernel: [3, 2],
        strides: [2, 2],
        pads: [1, 0, 1, 1],
        dilations: [1, 1],
        ceil_mode: true,
    };
    run1(DType::F32, &[1, 3, 7, 8], Op::MaxPool(p.clone()));
    for count_include_pad in [false, true] {
        run1(
            DType::F32,
            &[1, 3, 7, 8],
            Op::AveragePool {
                pool: p.clone(),
                count_include_pad,
            },
        );
    }
    run1(DType::F32, &[2, 3, 5, 7], Op::GlobalAveragePool);
    run1(DType::F32, &[2, 3, 17, 19], Op::GlobalMaxPool);
}

#[test]
fn softmax_and_reductions() {
    for axis in 0..3 {
        run1(DType::F32, &[3, 40, 5], Op::Softmax { axis });
    }
    run1(DType::F32, &[2, 300], Op::Softmax { axis: 1 });
    for op in ReduceOp::ALL {
        for axes in [smallvec![1], smallvec![0, 2], smallvec![]] {
            let x = if matches!(op, ReduceOp::LogSum | ReduceOp::Prod) {
                // Positive sums for LogSum; few factors for Prod.
                Op::Reduce {
                    op,
                    axes,
                    keep_dims: true,
                }
            } else {
                Op::Reduce {
                    op,
                    axes,
                    keep_dims: false,
                }
            };
            if op == ReduceOp::LogSum {
                let mut g = Graph::new();
                let i = g.add_input("x", ValueType::new(DType::F32, [3, 70, 2]));
                let a = g.add_node(Op::Unary(UnaryOp::Abs), &[i], "abs").unwrap();
                let y = g.add_node(x, &[a], "y").unwrap();
                g.add_output("y", y);
                check(&g, &[tensor(DType::F32, &[3, 70, 2], 13)]);
            } else {
                run1(DType::F32, &[3, 70, 2], x);
            }
        }
    }
    for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod] {
        run1(
            DType::I64,
            &[4, 3],
            Op::Reduce {
                op,
                axes: smallvec![0],
                keep_dims: false,
            },
        );
    }
}

/// f64 Exp, Log, Sigmoid, Tanh, Pow, Softmax and ReduceLogSumExp run in
/// software (PTX has no f64 transcendental): within a few f64 ulp (Pow's
/// error grows with `|b ln a|`), subnormal results and the special values
/// included.
#[test]
fn f64_exp_log_softmax_in_software() {
    let f64s = |v: &[f64]| Tensor::new([v.len()], Data::F64(v.to_vec())).unwrap();
    let exps = [
        -800.0,
        -745.0,
        -708.5,
        -50.0,
        -1.0,
        -1e-10,
        0.0,
        1e-300,
        0.5,
        std::f64::consts::LN_2,
        1.0,
        3.0,
        88.7,
        700.0,
        709.7,
        710.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
    ];
    let (g, _) = graph1(DType::F64, &[exps.len()], Op::Unary(UnaryOp::Exp));
    check_each_element_within("exp f64", &g, &[f64s(&exps)], 1e-14, 1e-320);
    let logs = [
        1e-310,
        1e-300,
        1e-10,
        0.5,
        std::f64::consts::FRAC_1_SQRT_2,
        0.999_999_999_999,
        1.0,
        1.000_000_000_001,
        1.5,
        2.0,
        10.0,
        1e300,
        f64::MAX,
        0.0,
        -0.0,
        -1.0,
        f64::INFINITY,
        f64::NAN,
    ];
    let (g, _) = graph1(DType::F64, &[logs.len()], Op::Unary(UnaryOp::Log));
    check_each_element_within("log f64", &g, &[f64s(&logs)], 1e-14, 1e-300);
    for op in [UnaryOp::Sigmoid, UnaryOp::Tanh] {
        let (g, _) = graph1(DType::F64, &[exps.len()], Op::Unary(op));
        check_each_element_within(op.name(), &g, &[f64s(&exps)], 1e-14, 1e-300);
    }
    let bases = [2.0, 0.5, -3.0, -3.0, -2.0, 0.0, 0.0, 10.0, 1.0 + 1e-9, 7.0];
    let exponents = [10.0, -3.5, 3.0, 2.0, 0.5, 2.0, -1.0, 300.0, 1e9, 0.0];
    let (g, i) = graph2_with(Op::Binary(BinaryOp::Pow), f64s(&bases), f64s(&exponents));
    check_each_element_within("pow f64", &g, &i, 1e-12, 1e-300);
    for axis in 0..2 {
        let (g, i) = graph1(DType::F64, &[5, 37], Op::Softmax { axis });
        check_each_element_within("softmax f64", &g, &i, 1e-14, 1e-300);
    }
    for op in [ReduceOp::LogSumExp, ReduceOp::LogSum] {
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(DType::F64, [4, 30]));
        let a = g.add_node(Op::Unary(UnaryOp::Abs), &[x], "abs").unwrap();
        let r = Op::Reduce {
            op,
            axes: smallvec![1],
            keep_dims: false,
        };
        let y = g.add_node(r, &[a], "y").unwrap();
        g.add_output("y", y);
        check_each_element_within(
            op.name(),
            &g,
            &[tensor(DType::F64, &[4, 30], 7)],
            1e-14,
            0.0,
        );
    }
}

/// A long reduction to few values (a dynamic int8 scale's whole-tensor
/// max) runs in two stages, the first on rows × chunks blocks instead of
/// one block per output, with the reference's results for every op.
#[test]
fn long_reductions_to_few_values_split_across_blocks() {
    let shape = [2, 256, 300];
    for op in ReduceOp::ALL {
        if op == ReduceOp::Prod {
            // 76,800 factors over- or underflow; its split is Sum's shape.
            continue;
        }
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(DType::F32, shape));
        let x = if op == ReduceOp::LogSum {
            g.add_node(Op::Unary(UnaryOp::Abs), &[x], "abs").unwrap()
        } else {
            x
        };
        let r = Op::Reduce {
            op,
            axes: smallvec![1, 2],
            keep_dims: true,
        };
        let y = g.add_node(r, &[x], "y").unwrap();
        g.add_output("y", y);
        let p = compile(&g, SmArch::parse("sm80").unwrap()).unwrap();
        let partial = p
            .kernels
            .iter()
            .find(|k| k.node.ends_with("y/partial"))
            .unwrap_or_else(|| panic!("{}: no first stage among {:?}", op.name(), p.kernels));
        // 76,800 elements per row in 32 chunks of 2,400.
        assert_eq!(partial.launch.grid, [64, 1, 1], "{}", op.name());
        check(&g, &[tensor(DType::F32, &shape, 5)]);
    }
    // Many outputs, or a middle axis: one block per output, as before.
    for (shape, axes) in [
        ([128, 4, 8192], smallvec![1, 2]),
        ([2, 40000, 3], smallvec![1]),
    ] {
        let (g, _) = graph1(
            DType::F32,
            &shape,
            Op::Reduce {
                op: ReduceOp::Max,
                axes,
                keep_dims: false,
            },
        );
        let p = compile(&g, SmArch::parse("sm80").unwrap()).unwrap();
        assert_eq!(p.kernels.len(), 1, "{shape:?}");
    }
}

#[test]
fn layout_ops() {
    run1(
        DType::F32,
        &[2, 3, 4],
        Op::Transpose {
            perm: smallvec![2, 0, 1],
        },
    );
    run1(
        DType::I64,
        &[5, 6],
        Op::Slice {
            axes: smallvec![
                SliceAxis {
                    start: 4,
                    step: -2,
                    len: 3
                },
                SliceAxis {
                    start: 1,
                    step: 2,
                    len: 3
                }
            ],
        },
    );
    let mut g = Graph::new();
    let a = g.add_input("a", ValueType::new(DType::F32, [2, 3, 4]));
    let b = g.add_input("b", ValueType::new(DType::F32, [2, 1, 4]));
    let c = g
        .add_node(Op::Concat { axis: 1 }, &[a, b, a], "cat")
        .unwrap();
    let r = g
        .add_node(
            Op::Reshape {
                shape: smallvec![2, 28],
            },
            &[c],
            "reshape",
        )
        .unwrap();
    g.add_output("r", r);
    g.add_output("a_again", a);
    check(
        &g,
        &[
            tensor(DType::F32, &[2, 3, 4], 14),
            tensor(DType::F32, &[2, 1, 4], 15),
        ],
    );
    let mut g = Graph::new();
    let d = g.add_input("d", ValueType::new(DType::F32, [3, 5, 2]));
    let i = g.add_const(
        "i",
        Tensor::new([2, 2], Data::I64(vec![0, -1, 4, -5])).unwrap(),
    );
    let y = g
        .add_node(Op::Gather { axis: 1 }, &[d, i], "gather")
        .unwrap();
    g.add_output("y", y);
    check(&g, &[tensor(DType::F32, &[3, 5, 2], 16)]);
}

#[test]
fn an_out_of_range_gather_index_sets_the_status_word() {
    let mut g = Graph::new();
    let d = g.add_input("d", ValueType::new(DType::F32, [4, 2]));
    let i: NodeId = g.add_input("i", ValueType::new(DType::I32, [3]));
    let y = g
        .add_node(Op::Gather { axis: 0 }, &[d, i], "gather")
        .unwrap();
    g.add_output("y", y);
    let p = compile(&g, SmArch::parse("sm80").unwrap()).unwrap();
    let data = tensor(DType::F32, &[4, 2], 17).data().to_le_bytes();
    let ok = Data::I32(vec![0, -4, 3]).to_le_bytes();
    assert!(interp::run_program(&p, &[data.clone(), ok]).is_ok());
    let bad = Data::I32(vec![0, 4, 1]).to_le_bytes();
    assert!(interp::run_program(&p, &[data, bad]).is_err());
}

#[test]
fn fused_unary_chains() {
    // MatMul -> Relu -> Sigmoid fuse into the GEMM's epilogue, Softmax ->
    // Log into the softmax kernel, Concat -> Neg into the layout kernel;
    // the Tanh of a value with two users stays a kernel of its own.
    let mut g = Graph::new();
    let a = g.add_input("a", ValueType::new(DType::F32, [5, 7]));
    let b = g.add_input("b", ValueType::new(DType::F32, [7, 3]));
    let mm = g.add_node(Op::MatMul, &[a, b], "mm").unwrap();
    let r = g.add_node(Op::Unary(UnaryOp::Relu), &[mm], "relu").unwrap();
    let s = g
        .add_node(Op::Unary(UnaryOp::Sigmoid), &[r], "sig")
        .unwrap();
    let sm = g
        .add_node(Op::Softmax { axis: 1 }, &[s], "softmax")
        .unwrap();
    let l = g.add_node(Op::Unary(UnaryOp::Log), &[sm], "log").unwrap();
    let c = g.add_node(Op::Concat { axis: 0 }, &[l, s], "cat").unwrap();
    let n = g.add_node(Op::Unary(UnaryOp::Neg), &[c], "neg").unwrap();
    let t = g.add_node(Op::Unary(UnaryOp::Tanh), &[n], "tanh").unwrap();
    let e = g.add_node(Op::Unary(UnaryOp::Exp), &[t], "exp").unwrap();
    g.add_output("e", e);
    g.add_output("t", t);
    let p = compile(&g, SmArch::parse("sm80").unwrap()).unwrap();
    let nodes: Vec<&str> = p.kernels.iter().map(|k| k.node.as_str()).collect();
    assert_eq!(
        nodes,
        ["mm+relu+sig", "softmax+log", "cat+neg+tanh", "exp"],
        "{nodes:?}"
    );
    check(
        &g,
        &[
            tensor(DType::F32, &[5, 7], 20),
            tensor(DType::F32, &[7, 3], 21),
        ],
    );
}

#[test]
fn headless_fused_kernels() {
    use kiln_ir::{ElementwiseProgram, FusedKernel, Instr, Reg};
    // A fused program with broadcast operands (one kernel), then a unary
    // epilogue on it; a fused kernel with a dense head is refused.
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(DType::F32, [2, 3, 5]));
    let b = g.add_input("b", ValueType::new(DType::F32, [3, 1]));
    let c = g.add_input("c", ValueType::new(DType::F32, [5]));
    let body = ElementwiseProgram::new(
        3,
        vec![
            Instr::Binary(BinaryOp::Sub, Reg(0), Reg(1)),
            Instr::Binary(BinaryOp::Mul, Reg(3), Reg(3)),
            Instr::Unary(UnaryOp::Clip { min: 0.0, max: 2.0 }, Reg(4)),
            Instr::Binary(BinaryOp::Pow, Reg(5), Reg(2)),
            Instr::Unary(UnaryOp::Sigmoid, Reg(6)),
        ],
    )
    .unwrap();
    let k = FusedKernel::new(None, body).unwrap();
    let f = g
        .add_node(
            Op::Fused(Box::new(k)),
            &[x, b, c],
            "sub+mul+clip+pow+sigmoid",
        )
        .unwrap();
    let t = g.add_node(Op::Unary(UnaryOp::Tanh), &[f], "tanh").unwrap();
    g.add_output("t", t);
    let p = compile(&g, SmArch::parse("sm80").unwrap()).unwrap();
    let nodes: Vec<&str> = p.kernels.iter().map(|k| k.node.as_str()).collect();
    assert_eq!(nodes, ["sub+mul+clip+pow+sigmoid+tanh"], "{nodes:?}");
    // Pow with a positive base: |values| < 2 after the clip, exponent any.
    check(
        &g,
        &[
            tensor(DType::F32, &[2, 3, 5], 30),
            tensor(DType::F32, &[3, 1], 31),
            tensor(DType::F32, &[5], 32),
        ],
    );
    let mut g = Graph::new();
    let a = g.add_input("a", ValueType::new(DType::F32, [2, 3]));
    let w = g.add_input("w", ValueType::new(DType::F32, [3, 4]));
    let head = kiln_ir::DenseHead {
        op: kiln_ir::DenseOp::MatMul,
        inputs: 2,
    };
    let body = ElementwiseProgram::new(1, vec![Instr::Unary(UnaryOp::Relu, Reg(0))]).unwrap();
    let k = FusedKernel::new(Some(head), body).unwrap();
    let y = g
        .add_node(Op::Fused(Box::new(k)), &[a, w], "mm+relu")
        .unwrap();
    g.add_output("y", y);
    let e = compile(&g, SmArch::parse("sm80").unwrap()).unwrap_err();
    assert!(e.to_string().contains("no CUDA lowering"), "{e}");
}

/// Every code of every narrow type decoded (to f32, f16, i64 and bool),
/// f32 values on every rounding path encoded (ties, subnormals, overflow,
/// infinities, NaN, negative zero), integers wrapped into the 4- and 2-bit
/// types, and codes moved through a Transpose and a Where bit for bit.
#[test]
fn narrow_types_cast_every_code_and_move_as_bytes() {
    let narrow: Vec<DType> = DType::ALL.into_iter().filter(|d| d.is_narrow()).collect();
    assert_eq!(narrow.len(), 9);
    let mut floats: Vec<f32> = vec![
        0.0,
        -0.0,
        f32::NAN,
        -f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        1e30,
        -1e30,
        448.0,
        464.0,
        57344.0,
        61440.0,
        6.0,
        7.0,
        -2.5,
        0.25,
        0.75,
        1.0625,
        1.125,
        1.1875,
        2f32.powi(-9),
        3.0 * 2f32.powi(-10),
        2f32.powi(-17),
        3.0 * 2f32.powi(-17),
        2f32.powi(-20),
        7.9,
        -8.5,
        15.5,
        -1.7,
        3.0,
    ];
    floats.extend(values(34, 9).iter().map(|v| v * 40.0));
    for d in narrow {
        let bits = kiln_ir::narrow::code_bits(d).unwrap();
        let codes: Vec<u8> = (0..=255u8)
            .map(|c| c & ((1u16 << bits) - 1) as u8)
            .collect();
        let codes = Tensor::new([16, 16], Data::Narrow(d, codes)).unwrap();
        for to in [DType::F32, DType::F16, DType::I64, DType::Bool] {
            let (g, _) = graph1_typed(d, &[16, 16], Op::Cast { to });
            check(&g, std::slice::from_ref(&codes));
        }
        let moved = graph1_typed(
            d,
            &[16, 16],
            Op::Transpose {
                perm: smallvec![1, 0],
            },
        )
        .0;
        check(&moved, std::slice::from_ref(&codes));
        let mut g = Graph::new();
        let c = g.add_input("c", ValueType::new(DType::Bool, [16, 16]));
        let a = g.add_input("a", ValueType::new(d, [16, 16]));
        let b = g.add_input("b", ValueType::new(d, [16, 16]));
        let w = g.add_node(Op::Where, &[c, a, b], "w").unwrap();
        g.add_output("w", w);
        let b_codes = Tensor::new(
            [16, 16],
            Data::Narrow(d, codes.data().to_le_bytes().into_iter().rev().collect()),
        )
        .unwrap();
        check(
            &g,
            &[tensor(DType::Bool, &[16, 16], 4), codes.clone(), b_codes],
        );
        let x = Tensor::new([floats.len()], Data::F32(floats.clone())).unwrap();
        let (g, _) = graph1_typed(DType::F32, &[floats.len()], Op::Cast { to: d });
        check(&g, &[x]);
        let ints = ints(DType::I64, &[8], &[-9, -8, -2, -1, 0, 3, 7, 300]);
        let (g, _) = graph1_typed(DType::I64, &[8], Op::Cast { to: d });
        check(&g, &[ints]);
    }
}

/// One op on one input of type `d` (the caller gives the input).
fn graph1_typed(d: DType, shape: &[usize], op: Op) -> (Graph, ()) {
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(d, shape));
    let y = g.add_node(op, &[x], "y").unwrap();
    g.add_output("y", y);
    (g, ())
}

/// Lookups in 16-bit and 8-bit tables (reduced-precision embedding
/// tables): the rows move as stored and widen in the Cast after.
#[test]
fn narrow_tables_are_gathered_as_stored() {
    for dtype in [DType::F16, DType::BF16, DType::I8] {
        let mut g = Graph::new();
        let ids = g.add_input("ids", ValueType::new(DType::I64, [2, 3]));
        let table = g.add_const("table", tensor(dtype, &[40, 8], 7));
        let rows = g
            .add_node(Op::Gather { axis: 0 }, &[table, ids], "rows")
            .unwrap();
        let y = g
            .add_node(Op::Cast { to: DType::F32 }, &[rows], "y")
            .unwrap();
        g.add_output("y", y);
        let ids = Tensor::new([2, 3], Data::I64(vec![0, 5, 39, -1, 5, 20])).unwrap();
        check(&g, &[ids]);
    }
}
