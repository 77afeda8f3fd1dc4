//! The liveness-based memory plan: reuse happens, live values are never
//! overwritten, in-place kernels compute the right thing, and no two
//! simultaneously live values overlap (checked here independently of the
//! planner, on every test graph and every fixture model).

mod common;

use std::collections::HashMap;
use std::path::Path;

use common::{check, check_rand, f32_tensor, Rng};
use kiln_ir::{BinaryOp, DType, Graph, Ints, NodeId, Op, UnaryOp, ValueType};
use kiln_target_cpu::{
    compile, memory_plan, plan_stats, ArtifactInfo, CpuOptions, CpuTarget, MemoryPlan, Step,
    ValueKind,
};

/// One arena value as this checker sees it.
struct Rec {
    name: String,
    node: Option<NodeId>,
    offset: u64,
    bytes: u64,
    def: u32,
    last: u32,
    in_place_of: Option<NodeId>,
}

/// Recomputes liveness from the graph and the plan's schedule, and checks
/// that any two values whose bytes overlap are never live at the same step,
/// except a legal in-place write (an elementwise kernel over an input with
/// the same indexing that dies at that very step) or a Reshape alias.
/// Returns the number of distinct non-empty (offset, bytes) regions.
fn check_plan(g: &Graph, p: &MemoryPlan) -> usize {
    let end = p.steps.len() as u32 + 1;
    let alias: HashMap<NodeId, NodeId> = p
        .values
        .iter()
        .filter_map(|v| match v.kind {
            ValueKind::Alias { of } => Some((v.node.unwrap(), of)),
            _ => None,
        })
        .collect();
    let root = |mut n: NodeId| {
        while let Some(&m) = alias.get(&n) {
            n = m;
        }
        n
    };
    let mut recs: Vec<Rec> = Vec::new();
    let mut by_node: HashMap<NodeId, usize> = HashMap::new();
    let mut by_name: HashMap<String, usize> = HashMap::new();
    let mut kernel_step: HashMap<NodeId, u32> = HashMap::new();
    for (k, s) in p.steps.iter().enumerate() {
        if let Step::Node(id) = s {
            kernel_step.insert(*id, k as u32 + 1);
        }
    }
    for v in &p.values {
        assert_eq!(
            v.offset % 64,
            0,
            "{}: offset {} not aligned",
            v.name,
            v.offset
        );
        assert!(
            v.offset + v.bytes <= p.arena_size,
            "{}: [{}, {}) outside the arena ({})",
            v.name,
            v.offset,
            v.offset + v.bytes,
            p.arena_size
        );
        let (def, in_place_of) = match &v.kind {
            ValueKind::Alias { .. } => continue,
            ValueKind::Input => {
                assert!(matches!(g.node(v.node.unwrap()).op, Op::Input { .. }));
                (0, None)
            }
            ValueKind::Kernel { step, in_place_of } => {
                assert_eq!(kernel_step[&v.node.unwrap()], *step, "{}", v.name);
                (*step, *in_place_of)
            }
            ValueKind::OutputCopy { step } => {
                assert!(matches!(p.steps[*step as usize - 1], Step::Copy { .. }));
                (*step, None)
            }
            // Written by its parts' kernels, from the first of them.
            ValueKind::Concat { parts } => {
                assert!(matches!(g.node(v.node.unwrap()).op, Op::Concat { .. }));
                assert_eq!(*parts, g.inputs_of(v.node.unwrap()), "{}", v.name);
                let first = parts.iter().map(|n| kernel_step[n]).min().unwrap();
                (first, None)
            }
        };
        if let Some(n) = v.node {
            by_node.insert(n, recs.len());
        } else {
            by_name.insert(v.name.clone(), recs.len());
        }
        recs.push(Rec {
            name: v.name.clone(),
            node: v.node,
            offset: v.offset,
            bytes: v.bytes,
            def,
            last: def,
            in_place_of,
        });
    }
    // A kernel-less Concat's parts tile its bytes in order.
    let mut part_of: HashMap<NodeId, NodeId> = HashMap::new();
    for v in &p.values {
        if let ValueKind::Concat { parts } = &v.kind {
            let mut at = v.offset;
            for &n in parts {
                let r = &recs[by_node[&n]];
                assert_eq!(r.offset, at, "{}: slice {} misplaced", v.name, r.name);
                at += r.bytes;
                part_of.insert(n, v.node.unwrap());
            }
            assert_eq!(at, v.offset + v.bytes, "{}: slices do not fill it", v.name);
        }
    }
    // Aliases sit exactly on their root's bytes.
    for v in &p.values {
        if let ValueKind::Alias { .. } = v.kind {
            let r = &recs[by_node[&root(v.node.unwrap())]];
            assert_eq!((v.offset, v.bytes), (r.offset, r.bytes), "alias {}", v.name);
        }
    }
    // Every kernel that computes a non-constant node has a value.
    for id in g.node_ids() {
        let is_const_like = g.constant(id).is_some() || !by_node.contains_key(&root(id));
        if kernel_step.contains_key(&id) {
            assert!(
                by_node.contains_key(&id),
                "kernel {} has no value",
                g.node(id).name
            );
        } else if !is_const_like {
            assert!(by_node.contains_key(&root(id)));
        }
    }
    // Liveness, recomputed.
    for (k, s) in p.steps.iter().enumerate() {
        let reads = match s {
            Step::Node(id) => g.inputs_of(*id),
            Step::Copy { src, .. } => vec![*src],
        };
        for r in reads {
            if let Some(&i) = by_node.get(&root(r)) {
                recs[i].last = recs[i].last.max(k as u32 + 1);
            }
        }
    }
    for (name, id) in g.outputs() {
        let i = match by_name.get(&format!("output:{name}")) {
            Some(&i) => i,
            None => by_node[&root(*id)],
        };
        recs[i].last = end;
    }
    // In-place claims must be legal.
    for r in &recs {
        let Some(x) = r.in_place_of else { continue };
        let y = r.node.unwrap();
        let (yn, xn) = (g.node(y), g.node(x));
        assert!(
            matches!(yn.op, Op::Unary(_) | Op::Binary(_) | Op::Cast { .. }),
            "{}: in place on a {}",
            r.name,
            yn.op.name()
        );
        assert!(g.inputs_of(y).contains(&x), "{}: not an input", r.name);
        assert_eq!(xn.ty.num_elements(), yn.ty.num_elements(), "{}", r.name);
        assert_eq!(xn.ty.dtype.size_bytes(), yn.ty.dtype.size_bytes());
        let xr = &recs[by_node[&root(x)]];
        assert_eq!(
            xr.last, r.def,
            "{}: overwrites {} before its last use",
            r.name, xr.name
        );
        assert_eq!((xr.offset, xr.bytes), (r.offset, r.bytes));
        // Other operands on the same bytes must use the same indexing.
        for n in g.inputs_of(y) {
            if let Some(&i) = by_node.get(&root(n)) {
                if recs[i].offset == r.offset && recs[i].bytes > 0 {
                    assert_eq!(g.node(n).ty.num_elements(), yn.ty.num_elements());
                }
            }
        }
    }
    // No two live values overlap.
    for (i, a) in recs.iter().enumerate() {
        for b in &recs[..i] {
            if a.bytes == 0 || b.bytes == 0 {
                continue;
            }
            let bytes = a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
            let time = a.def <= b.last && b.def <= a.last;
            if !(bytes && time) {
                continue;
            }
            let in_place = |y: &Rec, x: &Rec| {
                y.in_place_of.is_some_and(|n| Some(root(n)) == x.node) && x.last == y.def
            };
            let slice = |part: &Rec, whole: &Rec| {
                part.node
                    .is_some_and(|n| part_of.get(&n).copied() == whole.node)
            };
            assert!(
                in_place(a, b) || in_place(b, a) || slice(a, b) || slice(b, a),
                "{} [{}, {}) live {}..={} overlaps {} [{}, {}) live {}..={}",
                a.name,
                a.offset,
                a.offset + a.bytes,
                a.def,
                a.last,
                b.name,
                b.offset,
                b.offset + b.bytes,
                b.def,
                b.last
            );
        }
    }
    let mut regions: Vec<(u64, u64)> = recs
        .iter()
        .filter(|r| r.bytes > 0)
        .map(|r| (r.offset, r.bytes))
        .collect();
    regions.sort_unstable();
    regions.dedup();
    regions.len()
}

/// Plans, checks the plan, compiles and compares with the reference
/// evaluator on random inputs. Returns the plan.
fn check_graph(g: &Graph, seed: u64) -> MemoryPlan {
    let p = memory_plan(g).expect("plan");
    check_plan(g, &p);
    let opts = CpuOptions {
        target: CpuTarget::Aarch64,
        opt_level: 2,
        threads: kiln_target_cpu::DEFAULT_THREADS,
    };
    let a = compile(g, &opts, ArtifactInfo::default()).unwrap();
    assert_eq!(a.profiles[0].arena_size, p.arena_size);
    check_rand(g, seed, 1e-6);
    p
}

fn relu_chain(n: usize, in_place_ok: bool) -> Graph {
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(DType::F32, [4, 100]));
    let mut v = x;
    for i in 0..n {
        // A transpose pair between relus blocks in-place reuse when asked.
        v = if in_place_ok || i % 2 == 0 {
            g.add_node(Op::Unary(UnaryOp::Relu), &[v], format!("relu{i}"))
                .unwrap()
        } else {
            let perm: Ints = Ints::from_slice(&[1, 0]);
            let t = g
                .add_node(Op::Transpose { perm: perm.clone() }, &[v], format!("t{i}a"))
                .unwrap();
            g.add_node(Op::Transpose { perm }, &[t], format!("t{i}b"))
                .unwrap()
        };
    }
    g.add_output("y", v);
    g
}

#[test]
fn relu_chain_reuses_buffers() {
    let g = relu_chain(10, true);
    let p = check_graph(&g, 1);
    let s = p.stats;
    assert!(s.buffers <= 3, "{s}");
    assert_eq!(s.total_bytes, 11 * 1600);
    assert!(s.arena_bytes <= 3 * 1600, "{s}");
    // Every relu writes over its dying input: one buffer.
    assert_eq!(s.in_place, 10, "{s}");
    assert_eq!(s.arena_bytes, 1600);
}

#[test]
fn chain_without_in_place_uses_two_buffers() {
    let g = relu_chain(10, false);
    let p = check_graph(&g, 2);
    let regions = check_plan(&g, &p);
    assert!(regions <= 3, "{}", p.stats);
    assert!(p.stats.arena_bytes <= 3 * 1600, "{}", p.stats);
    // Transposes never work in place.
    for v in &p.values {
        if v.name.starts_with('t') {
            assert!(matches!(
                v.kind,
                ValueKind::Kernel {
                    in_place_of: None,
                    ..
                }
            ));
        }
    }
}

/// `a` stays live across a branch of elementwise and dense ops and must
/// not be overwritten by any of them.
#[test]
fn residual_value_survives_a_branch() {
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(DType::F32, [8, 16]));
    let mut rng = Rng::new(7);
    let w = g.add_const("w", f32_tensor(&mut rng, &[16, 16]));
    let a = g.add_node(Op::Unary(UnaryOp::Relu), &[x], "a").unwrap();
    let b = g.add_node(Op::Unary(UnaryOp::Sigmoid), &[a], "b").unwrap();
    let c = g.add_node(Op::Unary(UnaryOp::Tanh), &[b], "c").unwrap();
    let m = g.add_node(Op::MatMul, &[c, w], "m").unwrap();
    let n = g.add_node(Op::Unary(UnaryOp::Neg), &[m], "n").unwrap();
    let d = g.add_node(Op::Binary(BinaryOp::Add), &[n, a], "d").unwrap();
    let e = g.add_node(Op::Binary(BinaryOp::Mul), &[d, a], "e").unwrap();
    g.add_output("y", e);
    g.add_output("skip", b);
    let p = check_graph(&g, 3);
    let off = |name: &str| p.values.iter().find(|v| v.name == name).unwrap().offset;
    // b is an output: never overwritten; c may not reuse a (still live).
    assert_ne!(off("c"), off("a"));
    assert_ne!(off("c"), off("b"));
    assert_ne!(off("n"), off("a"));
}

#[test]
fn in_place_binary_picks_the_dying_operand() {
    // d = a - b where a stays live (output) and b dies: d overwrites b,
    // operand slot 1 of a non-commutative op.
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(DType::F32, [3, 37]));
    let a = g.add_node(Op::Unary(UnaryOp::Exp), &[x], "a").unwrap();
    let b = g.add_node(Op::Unary(UnaryOp::Abs), &[x], "b").unwrap();
    let d = g.add_node(Op::Binary(BinaryOp::Sub), &[a, b], "d").unwrap();
    let e = g.add_node(Op::Binary(BinaryOp::Div), &[a, d], "e").unwrap();
    g.add_output("a", a);
    g.add_output("e", e);
    let p = check_graph(&g, 4);
    let get = |name: &str| p.values.iter().find(|v| v.name == name).unwrap().clone();
    assert!(matches!(get("d").kind, ValueKind::Kernel { in_place_of: Some(n), .. } if n == b));
    assert!(matches!(get("e").kind, ValueKind::Kernel { in_place_of: Some(n), .. } if n == d));
}

#[test]
fn in_place_with_broadcast_operand() {
    // The full-size operand dies and is overwritten; the broadcast one
    // (a row, and a scalar) is read from elsewhere.
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(DType::F32, [5, 3, 11]));
    let row = g.add_input("row", ValueType::new(DType::F32, [11]));
    let s = g.add_input("s", ValueType::new(DType::F32, []));
    let a = g.add_node(Op::Unary(UnaryOp::Relu), &[x], "a").unwrap();
    let b = g
        .add_node(Op::Binary(BinaryOp::Add), &[row, a], "b")
        .unwrap();
    let c = g.add_node(Op::Binary(BinaryOp::Mul), &[b, s], "c").unwrap();
    let d = g.add_node(Op::Binary(BinaryOp::Mul), &[c, c], "d").unwrap();
    g.add_output("d", d);
    let p = check_graph(&g, 5);
    assert_eq!(p.stats.in_place, 4, "{}", p.stats);
}

#[test]
fn no_in_place_when_the_output_is_larger() {
    // A broadcast that grows the operand cannot write over it.
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(DType::F32, [1, 16]));
    let y = g.add_input("y", ValueType::new(DType::F32, [16, 1]));
    let a = g.add_node(Op::Unary(UnaryOp::Relu), &[x], "a").unwrap();
    let b = g.add_node(Op::Unary(UnaryOp::Relu), &[y], "b").unwrap();
    let c = g.add_node(Op::Binary(BinaryOp::Add), &[a, b], "c").unwrap();
    g.add_output("c", c);
    let p = check_graph(&g, 6);
    assert!(matches!(
        p.values.iter().find(|v| v.name == "c").unwrap().kind,
        ValueKind::Kernel {
            in_place_of: None,
            ..
        }
    ));
}

#[test]
fn in_place_cast_only_at_equal_element_size() {
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(DType::F32, [2, 9]));
    let a = g.add_node(Op::Unary(UnaryOp::Neg), &[x], "a").unwrap();
    let i = g.add_node(Op::Cast { to: DType::I32 }, &[a], "i").unwrap();
    let w = g.add_node(Op::Cast { to: DType::I64 }, &[i], "w").unwrap();
    let r = g.add_node(Op::Unary(UnaryOp::Relu), &[w], "r").unwrap();
    g.add_output("r", r);
    let p = check_graph(&g, 8);
    let kind = |name: &str| {
        p.values
            .iter()
            .find(|v| v.name == name)
            .unwrap()
            .kind
            .clone()
    };
    assert!(matches!(
        kind("i"),
        ValueKind::Kernel {
            in_place_of: Some(_),
            ..
        }
    ));
    assert!(matches!(
        kind("w"),
        ValueKind::Kernel {
            in_place_of: None,
            ..
        }
    ));
    assert!(matches!(
        kind("r"),
        ValueKind::Kernel {
            in_place_of: Some(_),
            ..
        }
    ));
}

#[test]
fn reshape_alias_extends_liveness() {
    // `v` aliases `a`; `a` dies at `b` but `v` is read later, so `b` must
    // not write over `a`'s buffer.
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(DType::F32, [4, 6]));
    let a = g.add_node(Op::Unary(UnaryOp::Relu), &[x], "a").unwrap();
    let v = g
        .add_node(
            Op::Reshape {
                shape: Ints::from_slice(&[24]),
            },
            &[a],
            "v",
        )
        .unwrap();
    let b = g.add_node(Op::Unary(UnaryOp::Exp), &[a], "b").unwrap();
    let c = g
        .add_node(
            Op::Reshape {
                shape: Ints::from_slice(&[24]),
            },
            &[b],
            "c",
        )
        .unwrap();
    let d = g.add_node(Op::Binary(BinaryOp::Sub), &[c, v], "d").unwrap();
    g.add_output("d", d);
    let p = check_graph(&g, 9);
    let get = |name: &str| p.values.iter().find(|v| v.name == name).unwrap().clone();
    assert!(matches!(get("v").kind, ValueKind::Alias { .. }));
    assert_ne!(get("b").offset, get("a").offset);
    // d may write over either operand's buffer (both die at d).
    assert!(matches!(
        get("d").kind,
        ValueKind::Kernel {
            in_place_of: Some(_),
            ..
        }
    ));
}

/// A graph output that reshapes a computed value shares its buffer (no
/// copy kernel), and the value stays live to the end: a later op cannot
/// write over it in place. A reshape of a graph input stays a copy.
#[test]
fn output_reshapes_alias_the_value_they_reshape() {
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(DType::F32, [4, 6]));
    let a = g.add_node(Op::Unary(UnaryOp::Relu), &[x], "a").unwrap();
    let flat = Op::Reshape {
        shape: Ints::from_slice(&[24]),
    };
    let v = g.add_node(flat.clone(), &[a], "v").unwrap();
    let b = g.add_node(Op::Unary(UnaryOp::Exp), &[a], "b").unwrap();
    let x_flat = g.add_node(flat, &[x], "x_flat").unwrap();
    g.add_output("v", v);
    g.add_output("b", b);
    g.add_output("x_flat", x_flat);
    let p = check_graph(&g, 13);
    let get = |name: &str| p.values.iter().find(|v| v.name == name).unwrap().clone();
    assert!(matches!(get("v").kind, ValueKind::Alias { .. }));
    assert_eq!(get("v").offset, get("a").offset);
    assert_ne!(get("b").offset, get("a").offset);
    assert!(matches!(get("x_flat").kind, ValueKind::Kernel { .. }));
}

#[test]
fn outputs_inputs_and_copies() {
    // Inputs and constants as outputs, a repeated output, an unused input.
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(DType::F32, [3, 5]));
    let _unused = g.add_input("u", ValueType::new(DType::F32, [7]));
    let mut rng = Rng::new(11);
    let k = g.add_const("k", f32_tensor(&mut rng, &[3, 5]));
    let a = g.add_node(Op::Binary(BinaryOp::Add), &[x, k], "a").unwrap();
    let b = g.add_node(Op::Unary(UnaryOp::Relu), &[a], "b").unwrap();
    g.add_output("b", b);
    g.add_output("x", x);
    g.add_output("k", k);
    g.add_output("b2", b);
    let p = check_graph(&g, 12);
    // x is copied out after the kernels, so `a` cannot write over it.
    assert!(matches!(
        p.values.iter().find(|v| v.name == "a").unwrap().kind,
        ValueKind::Kernel {
            in_place_of: None,
            ..
        }
    ));
}

#[test]
fn plan_is_deterministic() {
    let g = relu_chain(7, false);
    let opts = CpuOptions {
        target: CpuTarget::Aarch64,
        opt_level: 2,
        threads: kiln_target_cpu::DEFAULT_THREADS,
    };
    let a = compile(&g, &opts, ArtifactInfo::default())
        .unwrap()
        .to_bytes();
    let b = compile(&g, &opts, ArtifactInfo::default())
        .unwrap()
        .to_bytes();
    assert_eq!(a, b);
    assert_eq!(memory_plan(&g).unwrap(), memory_plan(&g).unwrap());
}

#[test]
fn random_elementwise_dags() {
    // Random DAGs of unary/binary ops over a few shapes (with broadcasts)
    // and transposes: the plan checks out and results match the evaluator.
    // Sigmoid, not tanh: the DAGs subtract nearby values, and tanh's
    // rational function (`math::TANH`, 6 ulp near ±1, as onnxruntime's)
    // loses the evaluator's tolerance to that cancellation; its accuracy
    // has tests of its own (`elementwise.rs`, `fused.rs`).
    let unary = [UnaryOp::Relu, UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Sigmoid];
    let binary = [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Max];
    for seed in 0..12u64 {
        let mut rng = Rng::new(100 + seed);
        let mut g = Graph::new();
        let mut vals = vec![
            g.add_input("x", ValueType::new(DType::F32, [6, 10])),
            g.add_input("r", ValueType::new(DType::F32, [10])),
        ];
        for i in 0..20 {
            let pick = |rng: &mut Rng, vals: &Vec<NodeId>| {
                // Prefer recent values so chains and long-lived ones mix.
                let n = vals.len() as i64;
                vals[rng.int((n - 4).max(0), n - 1) as usize]
            };
            let a = pick(&mut rng, &vals);
            let v = match rng.int(0, 4) {
                0 | 1 => {
                    let op = unary[rng.int(0, 3) as usize];
                    g.add_node(Op::Unary(op), &[a], format!("n{i}")).unwrap()
                }
                2 | 3 => {
                    let b = vals[rng.int(0, vals.len() as i64 - 1) as usize];
                    let op = binary[rng.int(0, 3) as usize];
                    g.add_node(Op::Binary(op), &[a, b], format!("n{i}"))
                        .unwrap()
                }
                _ if g.node(a).ty.shape.len() == 2 => {
                    let t = g
                        .add_node(
                            Op::Transpose {
                                perm: Ints::from_slice(&[1, 0]),
                            },
                            &[a],
                            format!("n{i}a"),
                        )
                        .unwrap();
                    g.add_node(
                        Op::Transpose {
                            perm: Ints::from_slice(&[1, 0]),
                        },
                        &[t],
                        format!("n{i}"),
                    )
                    .unwrap()
                }
                _ => continue,
            };
            vals.push(v);
        }
        let n = vals.len();
        g.add_output("y", vals[n - 1]);
        g.add_output("z", vals[n / 2]);
        check_graph(&g, seed);
    }
}

#[test]
fn fixture_models_plan_checks_out() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models");
    let mut dirs: Vec<_> = std::fs::read_dir(&root)
        .expect("fixtures/models")
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("model.onnx").exists())
        // Run-time control flow: one graph per path (covered end to end by
        // `tests/tests/fixtures.rs`).
        .filter(|p| !p.to_string_lossy().contains("/control_"))
        .collect();
    dirs.sort();
    assert!(dirs.len() > 10);
    for dir in dirs {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let meta: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("meta.json")).unwrap()).unwrap();
        let mut opts = kiln_onnx::ImportOptions::default();
        if let Some(shapes) = meta["input_shapes"].as_object() {
            for (k, v) in shapes {
                let dims = v
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d.as_u64().unwrap() as usize)
                    .collect();
                opts.input_shapes.insert(k.clone(), dims);
            }
        }
        let g = kiln_onnx::import(&dir.join("model.onnx"), &opts)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let p = memory_plan(&g).unwrap_or_else(|e| panic!("{name}: {e}"));
        check_plan(&g, &p);
        assert_eq!(plan_stats(&g).unwrap(), p.stats);
        assert!(p.stats.arena_bytes <= p.stats.total_bytes.max(64), "{name}");
        assert!(p.stats.arena_bytes >= p.stats.peak_live_bytes, "{name}");
        if matches!(name.as_str(), "ppocr_cls" | "digits_cnn" | "digits_mlp") {
            eprintln!("{name}: {}", p.stats);
        }
    }
}

#[test]
fn fixture_relu_runs() {
    // A plain elementwise graph through the real runtime with in-place.
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(DType::F32, [2, 3]));
    let y = g.add_node(Op::Unary(UnaryOp::Relu), &[x], "y").unwrap();
    g.add_output("y", y);
    let mut rng = Rng::new(1);
    let p = memory_plan(&g).unwrap();
    check_plan(&g, &p);
    assert_eq!(p.stats.in_place, 1);
    check(&g, &[f32_tensor(&mut rng, &[2, 3])]);
}

#[test]
#[should_panic(expected = "overlaps")]
fn checker_catches_an_overwritten_live_value() {
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(DType::F32, [8, 16]));
    let a = g.add_node(Op::Unary(UnaryOp::Relu), &[x], "a").unwrap();
    let perm = Ints::from_slice(&[1, 0]);
    let b = g
        .add_node(Op::Transpose { perm: perm.clone() }, &[a], "b")
        .unwrap();
    let c = g.add_node(Op::Transpose { perm }, &[b], "c").unwrap();
    g.add_output("c", c);
    g.add_output("a", a);
    let mut p = memory_plan(&g).unwrap();
    check_plan(&g, &p);
    // Put b on a's bytes: a is an output, still live.
    let at = p.values.iter().find(|v| v.name == "a").unwrap().offset;
    p.values.iter_mut().find(|v| v.name == "b").unwrap().offset = at;
    check_plan(&g, &p);
}

#[test]
fn concat_of_consecutive_slices_costs_no_kernel() {
    // Three kernels write their channels straight into the concat's
    // buffer (one of them read again afterwards, one read before by a
    // kernel that is itself a slice); the concat has no step and the
    // result is the evaluator's.
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(DType::F32, [1, 4, 8, 8]));
    let a = g.add_node(Op::Unary(UnaryOp::Relu), &[x], "a").unwrap();
    let b = g.add_node(Op::Unary(UnaryOp::Neg), &[a], "b").unwrap();
    let c = g.add_node(Op::Binary(BinaryOp::Mul), &[x, x], "c").unwrap();
    let cat = g
        .add_node(Op::Concat { axis: 1 }, &[a, b, c], "cat")
        .unwrap();
    let after = g.add_node(Op::Unary(UnaryOp::Exp), &[b], "after").unwrap();
    let y = g.add_node(Op::Unary(UnaryOp::Abs), &[cat], "y").unwrap();
    g.add_output("y", y);
    g.add_output("after", after);
    let p = check_graph(&g, 30);
    assert!(!p.steps.contains(&Step::Node(cat)), "{:?}", p.steps);
    let value = |n: NodeId| p.values.iter().find(|v| v.node == Some(n)).unwrap();
    assert!(matches!(&value(cat).kind, ValueKind::Concat { parts } if *parts == [a, b, c]));
    assert_eq!(value(b).offset, value(cat).offset + 4 * 64 * 4);

    // Along an axis after a non-unit dim, the inputs interleave in the
    // output: a kernel copies them.
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(DType::F32, [2, 4, 8]));
    let a = g.add_node(Op::Unary(UnaryOp::Relu), &[x], "a").unwrap();
    let b = g.add_node(Op::Unary(UnaryOp::Neg), &[x], "b").unwrap();
    let cat = g.add_node(Op::Concat { axis: 1 }, &[a, b], "cat").unwrap();
    g.add_output("y", cat);
    let p = check_graph(&g, 31);
    assert!(p.steps.contains(&Step::Node(cat)));
}

#[test]
fn kernel_scratch_takes_the_place_of_dead_values() {
    // x (1 MiB) dies at the max pool; the 3×3 conv's scratch (its padded
    // input rows) is live at the conv's step only and fits where x was, so
    // the artifact needs no more arena than the values' plan. (4 channels:
    // with 16, Winograd's transformed tiles, 1.2 MB, would be the scratch.)
    use kiln_ir::{Conv2d, Pool2d};
    let mut rng = Rng::new(5);
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(DType::F32, [1, 4, 256, 256]));
    let pool = Op::MaxPool(Pool2d {
        kernel: [2, 2],
        strides: [2, 2],
        pads: [0; 4],
        dilations: [1, 1],
        ceil_mode: false,
    });
    let p = g.add_node(pool, &[x], "pool").unwrap();
    let w = g.add_const("w", f32_tensor(&mut rng, &[4, 4, 3, 3]));
    let conv = Op::Conv(Conv2d {
        strides: [1, 1],
        pads: [1, 1, 1, 1],
        dilations: [1, 1],
        group: 1,
    });
    let y = g.add_node(conv, &[p, w], "conv").unwrap();
    g.add_output("y", y);
    let plan = memory_plan(&g).unwrap();
    check_plan(&g, &plan);
    let opts = CpuOptions {
        target: CpuTarget::X86_64Avx512,
        opt_level: 2,
        threads: 1,
    };
    let a = compile(&g, &opts, ArtifactInfo::default()).unwrap();
    assert_eq!(a.profiles[0].arena_size, plan.arena_size);
    check_rand(&g, 11, 1e-4);
}
