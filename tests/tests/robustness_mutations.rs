//! Structure-aware mutations of real fixture models.
//!
//! Each fixture's `model.onnx` is decoded into a `ModelProto`, mutated in one
//! deterministic way (drop an initializer, change a dim to 0 / -1 / 2^40,
//! swap a dtype, add a cycle, duplicate output names, change the opset,
//! corrupt an attribute, truncate raw data, point external data outside the
//! model directory, remove a node, dangle an input, ...), re-encoded and
//! written into a fresh temporary directory, and compiled with
//! `kiln_driver::compile`. Every mutation must give `Ok` or a typed error,
//! never a panic. When it compiles, the artifact must load and run on random
//! inputs of the declared shapes, and its outputs must match the reference
//! evaluator (`kiln_ir::eval::eval_graph`) on the imported graph.
//!
//! Memory is bounded: mutations that claim 2^40-element tensors in a small
//! file must be refused (or compile without allocating them); an artifact
//! whose arena is larger than [`MAX_ARENA_BYTES`] is counted as a failure
//! instead of being loaded.
//!
//! `KILN_MUTATIONS_SEED=<n>` changes the seed of the randomized choices
//! (which initializer, which node, which dtype, ...);
//! `KILN_MUTATIONS_ROUNDS=<n>` repeats the randomized mutations n times per
//! fixture (default 1). See `docs/robustness.md`.

use kiln_driver::compare::compare;
use kiln_driver::{compile, CompileOptions, DriverError};
use kiln_onnx::pb::{
    self, tensor_shape_proto::dimension::Value as DimValue, type_proto::Value as TypeValue,
    ModelProto, StringStringEntryProto, TensorProto,
};
use kiln_onnx::ImportOptions;
use kiln_runtime::{DType, Model, Tensor, TensorSpec};
use kiln_test_kit::Rng;
use kiln_tests::Fixture;
use prost::Message;
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

/// Largest arena an accepted mutation may ask for before the test refuses
/// to load it (a small file must not make Kiln allocate gigabytes).
const MAX_ARENA_BYTES: u64 = 1 << 30;
/// Relative tolerance against the reference evaluator.
const TOLERANCE: f64 = 1e-4;
/// Elements above which the reference evaluator is not run (it is naive).
const MAX_EVAL_ELEMENTS: u64 = 1 << 22;

/// The fixtures mutated, with their compile-time input shapes (batch 1 for
/// the digits models to keep the reference evaluator fast).
const FIXTURES: &[&str] = &[
    "digits_cnn",
    "digits_mlp",
    "ppocr_cls",
    "op_conv_basic",
    "op_gemm_basic",
    "op_mixed_residual_opset9",
    "op_reshape_zero_neg1",
    "op_shape_reshape",
    "op_gather_indices_input",
    "op_slice_basic",
    "op_cast_float_int32",
    "op_symbolic_batch",
    "op_batchnorm_opset9",
    "op_clip_opset13",
];

/// What a mutation must give.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    /// Ok or a typed error, either is fine.
    Any,
    /// Must be a typed error (e.g. external data outside the directory).
    Error,
    /// Must compile (the mutation keeps the model valid).
    Ok,
}

/// One mutated model.
struct Mutation {
    fixture: String,
    kind: &'static str,
    what: String,
    model: ModelProto,
    opts: CompileOptions,
    /// Extra files written next to the model (external data).
    files: Vec<(String, Vec<u8>)>,
    expect: Expect,
}

impl Mutation {
    fn label(&self) -> String {
        format!("{} / {}: {}", self.fixture, self.kind, self.what)
    }
}

fn graph(m: &mut ModelProto) -> &mut pb::GraphProto {
    m.graph.as_mut().expect("fixture has a graph")
}

fn fixture_options(f: &Fixture) -> CompileOptions {
    let mut opts = f.compile_options();
    if f.name.starts_with("digits_") {
        for dims in opts.import.input_shapes.values_mut() {
            dims[0] = 1;
        }
    }
    opts
}

/// The graph inputs that are not initializers.
fn real_inputs(m: &ModelProto) -> Vec<usize> {
    let g = m.graph.as_ref().unwrap();
    g.input
        .iter()
        .enumerate()
        .filter(|(_, i)| !g.initializer.iter().any(|t| t.name == i.name))
        .map(|(k, _)| k)
        .collect()
}

fn tensor_type(vi: &mut pb::ValueInfoProto) -> Option<&mut pb::type_proto::Tensor> {
    match vi.r#type.as_mut()?.value.as_mut()? {
        TypeValue::TensorType(t) => Some(t),
        #[allow(unreachable_patterns)]
        _ => None,
    }
}

const HUGE: i64 = 1 << 40;
/// ONNX dtype codes used as replacements: FLOAT, UINT8, INT8, INT32, INT64,
/// STRING, BOOL, FLOAT16, DOUBLE, COMPLEX64, BFLOAT16, UNDEFINED, nonsense.
const DTYPES: &[i32] = &[1, 2, 3, 6, 7, 8, 9, 10, 11, 14, 16, 0, 999];

fn mutations_of(name: &str, rng: &mut Rng) -> Vec<Mutation> {
    let fixture = Fixture::load(name);
    let bytes = std::fs::read(fixture.model_path()).unwrap();
    let base = ModelProto::decode(bytes.as_slice()).expect("fixture decodes");
    let opts = fixture_options(&fixture);
    let mut out = Vec::new();
    let mut add = |kind: &'static str,
                   what: String,
                   expect: Expect,
                   f: &mut dyn FnMut(&mut ModelProto, &mut CompileOptions)| {
        let mut model = base.clone();
        let mut o = opts.clone();
        f(&mut model, &mut o);
        out.push(Mutation {
            fixture: name.to_string(),
            kind,
            what,
            model,
            opts: o,
            files: Vec::new(),
            expect,
        });
    };

    let g0 = base.graph.as_ref().unwrap().clone();
    let n_init = g0.initializer.len();
    let n_nodes = g0.node.len();
    let inputs = real_inputs(&base);

    // Unchanged model: must compile (and match the evaluator).
    add(
        "identity",
        "re-encoded unchanged".into(),
        Expect::Ok,
        &mut |_, _| {},
    );

    // Drop an initializer.
    if n_init > 0 {
        for _ in 0..2 {
            let i = rng.below(n_init);
            let init = g0.initializer[i].name.clone();
            add(
                "drop-initializer",
                init.clone(),
                Expect::Any,
                &mut |m, _| {
                    graph(m).initializer.remove(i);
                },
            );
        }
    }

    // Dims of an initializer: 0, -1, 2^40.
    if n_init > 0 {
        for v in [0, -1, HUGE, i64::MAX] {
            let i = rng.below(n_init);
            let init = g0.initializer[i].name.clone();
            add(
                "initializer-dim",
                format!("{init} dim 0 := {v}"),
                Expect::Any,
                &mut |m, _| {
                    let t = &mut graph(m).initializer[i];
                    if t.dims.is_empty() {
                        t.dims.push(v);
                    } else {
                        t.dims[0] = v;
                    }
                },
            );
        }
    }

    // Values of an int64 initializer (shape tensors): 0, -1, 2^40, -2^40.
    let int_inits: Vec<usize> = (0..n_init)
        .filter(|&i| g0.initializer[i].data_type == 7)
        .collect();
    for &i in int_inits.iter().take(2) {
        for v in [0, -1, HUGE, -HUGE] {
            let init = g0.initializer[i].name.clone();
            add(
                "initializer-value",
                format!("{init}[0] := {v}"),
                Expect::Any,
                &mut |m, _| {
                    let t = &mut graph(m).initializer[i];
                    if t.raw_data.len() >= 8 {
                        t.raw_data[..8].copy_from_slice(&v.to_le_bytes());
                    } else if let Some(x) = t.int64_data.first_mut() {
                        *x = v;
                    }
                },
            );
        }
    }

    // Dims of a graph input: 0, -1, 2^40, with and without the
    // --input-shape binding (without it the model's dims are used).
    for &k in &inputs {
        let in_name = g0.input[k].name.clone();
        for v in [0, -1, HUGE] {
            for keep_binding in [true, false] {
                add(
                    "input-dim",
                    format!(
                        "{in_name} dim 0 := {v} ({})",
                        if keep_binding {
                            "bound by --input-shape"
                        } else {
                            "no binding"
                        }
                    ),
                    Expect::Any,
                    &mut |m, o| {
                        let vi = &mut graph(m).input[k];
                        if let Some(t) = tensor_type(vi) {
                            if let Some(s) = t.shape.as_mut() {
                                if let Some(d) = s.dim.first_mut() {
                                    d.value = Some(DimValue::DimValue(v));
                                }
                            }
                        }
                        if !keep_binding {
                            o.import.input_shapes.remove(&in_name);
                            o.import.dims.clear();
                        }
                    },
                );
            }
        }
        // Every dim 2^40: the element count overflows 64 bits.
        add(
            "input-dim",
            format!("{in_name} every dim := 2^40 (no binding)"),
            Expect::Error,
            &mut |m, o| {
                if let Some(t) = tensor_type(&mut graph(m).input[k]) {
                    if let Some(s) = t.shape.as_mut() {
                        for d in &mut s.dim {
                            d.value = Some(DimValue::DimValue(HUGE));
                        }
                    }
                }
                o.import.input_shapes.remove(&in_name);
            },
        );
        // --input-shape itself claiming 2^40 elements (static model dims).
        add(
            "input-dim",
            format!("{in_name} bound to 2^40 on the command line"),
            Expect::Any,
            &mut |_, o| {
                if let Some(d) = o.import.input_shapes.get_mut(&in_name) {
                    d[0] = 1 << 40;
                }
            },
        );
        // Rank of an input changed.
        add(
            "input-rank",
            format!("{in_name} loses its last dim"),
            Expect::Any,
            &mut |m, _| {
                if let Some(t) = tensor_type(&mut graph(m).input[k]) {
                    if let Some(s) = t.shape.as_mut() {
                        s.dim.pop();
                    }
                }
            },
        );
    }

    // Output dims declared as 0 / 2^40 (outputs' declared types).
    for v in [0, HUGE] {
        add(
            "output-dim",
            format!("output 0 dim 0 := {v}"),
            Expect::Any,
            &mut |m, _| {
                if let Some(t) = tensor_type(&mut graph(m).output[0]) {
                    if let Some(s) = t.shape.as_mut() {
                        if let Some(d) = s.dim.first_mut() {
                            d.value = Some(DimValue::DimValue(v));
                        }
                    }
                }
            },
        );
    }

    // Swap the dtype of an initializer.
    if n_init > 0 {
        for _ in 0..3 {
            let i = rng.below(n_init);
            let dt = DTYPES[rng.below(DTYPES.len())];
            let init = g0.initializer[i].name.clone();
            add(
                "initializer-dtype",
                format!("{init} dtype := {dt}"),
                Expect::Any,
                &mut |m, _| graph(m).initializer[i].data_type = dt,
            );
        }
    }

    // Swap the dtype of a graph input.
    for &k in &inputs {
        for _ in 0..2 {
            let dt = DTYPES[rng.below(DTYPES.len())];
            let in_name = g0.input[k].name.clone();
            add(
                "input-dtype",
                format!("{in_name} dtype := {dt}"),
                Expect::Any,
                &mut |m, _| {
                    if let Some(t) = tensor_type(&mut graph(m).input[k]) {
                        t.elem_type = dt;
                    }
                },
            );
        }
    }

    // Add a cycle: an early node reads a later node's output (or its own).
    if n_nodes > 0 {
        let a = rng.below(n_nodes);
        let b = a + rng.below(n_nodes - a);
        add(
            "cycle",
            format!("node #{a} input 0 := output of node #{b}"),
            Expect::Error,
            &mut |m, _| {
                let g = graph(m);
                let out = g.node[b].output[0].clone();
                if g.node[a].input.is_empty() {
                    g.node[a].input.push(out);
                } else {
                    g.node[a].input[0] = out;
                }
            },
        );
    }

    // Duplicate output names: the graph lists an output twice; two nodes
    // write the same value.
    add(
        "duplicate-output",
        "graph output 0 listed twice".into(),
        Expect::Error,
        &mut |m, _| {
            let g = graph(m);
            let o = g.output[0].clone();
            g.output.push(o);
        },
    );
    if n_nodes > 1 {
        let a = rng.below(n_nodes - 1);
        add(
            "duplicate-output",
            format!("node #{} writes node #{a}'s output", a + 1),
            Expect::Error,
            &mut |m, _| {
                let g = graph(m);
                let out = g.node[a].output[0].clone();
                g.node[a + 1].output[0] = out;
            },
        );
    }
    add(
        "duplicate-output",
        "graph input renamed to an initializer's or node output's name".into(),
        Expect::Any,
        &mut |m, _| {
            let g = graph(m);
            let clash = g
                .node
                .last()
                .map(|n| n.output[0].clone())
                .unwrap_or_default();
            if let Some(&k) = real_inputs_of(g).first() {
                g.input[k].name = clash;
            }
        },
    );

    // Opset version: 1, 6, 99, 0, -1; another domain; no opset at all.
    for v in [1, 6, 99, 0, -1] {
        add(
            "opset",
            format!("default opset := {v}"),
            Expect::Any,
            &mut |m, _| {
                for o in &mut m.opset_import {
                    if o.domain.is_empty() || o.domain == "ai.onnx" {
                        o.version = v;
                    }
                }
            },
        );
    }
    add(
        "opset",
        "no opset_import".into(),
        Expect::Any,
        &mut |m, _| m.opset_import.clear(),
    );
    add(
        "opset",
        "nodes in domain 'com.example'".into(),
        Expect::Error,
        &mut |m, _| {
            for n in &mut graph(m).node {
                n.domain = "com.example".into();
            }
        },
    );

    // Corrupt an attribute: wrong type tag, value moved to another field,
    // absurd values.
    let with_attrs: Vec<usize> = (0..n_nodes)
        .filter(|&i| !g0.node[i].attribute.is_empty())
        .collect();
    for _ in 0..3 {
        if with_attrs.is_empty() {
            break;
        }
        let ni = with_attrs[rng.below(with_attrs.len())];
        let ai = rng.below(g0.node[ni].attribute.len());
        let attr = g0.node[ni].attribute[ai].name.clone();
        let op = g0.node[ni].op_type.clone();
        let ty = [1, 2, 3, 4, 5, 6, 7, 8, 0, 42][rng.below(10)];
        add(
            "attribute-type",
            format!("{op} node #{ni} attribute '{attr}' type := {ty}"),
            Expect::Any,
            &mut |m, _| graph(m).node[ni].attribute[ai].r#type = ty,
        );
        add(
            "attribute-value",
            format!("{op} node #{ni} attribute '{attr}' fields swapped"),
            Expect::Any,
            &mut |m, _| {
                let a = &mut graph(m).node[ni].attribute[ai];
                a.floats = a.ints.iter().map(|&x| x as f32).collect();
                a.floats.push(f32::NAN);
                a.ints.clear();
                a.i = a.i.wrapping_neg().wrapping_sub(1);
                a.s = b"\xff\xfe".to_vec();
            },
        );
        for v in [0, -1, HUGE, i64::MIN] {
            add(
                "attribute-value",
                format!("{op} node #{ni} attribute '{attr}' ints/i := {v}"),
                Expect::Any,
                &mut |m, _| {
                    let a = &mut graph(m).node[ni].attribute[ai];
                    a.i = v;
                    for x in &mut a.ints {
                        *x = v;
                    }
                },
            );
        }
    }

    // Truncate raw data.
    let raw_inits: Vec<usize> = (0..n_init)
        .filter(|&i| !g0.initializer[i].raw_data.is_empty())
        .collect();
    for _ in 0..2 {
        if raw_inits.is_empty() {
            break;
        }
        let i = raw_inits[rng.below(raw_inits.len())];
        let len = g0.initializer[i].raw_data.len();
        for keep in [0, len / 2, len - 1] {
            let init = g0.initializer[i].name.clone();
            add(
                "truncate-raw-data",
                format!("{init} raw_data {len} -> {keep} bytes"),
                Expect::Error,
                &mut |m, _| graph(m).initializer[i].raw_data.truncate(keep),
            );
        }
        let init = g0.initializer[i].name.clone();
        add(
            "truncate-raw-data",
            format!("{init} raw_data + 3 bytes"),
            Expect::Error,
            &mut |m, _| {
                graph(m).initializer[i]
                    .raw_data
                    .extend_from_slice(&[1, 2, 3])
            },
        );
    }

    // Remove a node; dangle a node input.
    if n_nodes > 0 {
        for _ in 0..2 {
            let i = rng.below(n_nodes);
            let op = g0.node[i].op_type.clone();
            add(
                "remove-node",
                format!("{op} node #{i}"),
                Expect::Any,
                &mut |m, _| {
                    graph(m).node.remove(i);
                },
            );
        }
        for _ in 0..2 {
            let i = rng.below(n_nodes);
            let op = g0.node[i].op_type.clone();
            let has_input = !g0.node[i].input.is_empty();
            add(
                "dangling-input",
                format!("{op} node #{i} input 0 := 'no_such_value'"),
                if has_input {
                    Expect::Error
                } else {
                    Expect::Any
                },
                &mut |m, _| {
                    if let Some(x) = graph(m).node[i].input.first_mut() {
                        *x = "no_such_value".into();
                    }
                },
            );
        }
        add(
            "dangling-output",
            "graph output names a value nobody produces".into(),
            Expect::Error,
            &mut |m, _| graph(m).output[0].name = "no_such_output".into(),
        );
        add(
            "unknown-op",
            "first node's op_type := 'NoSuchOp'".into(),
            Expect::Error,
            &mut |m, _| graph(m).node[0].op_type = "NoSuchOp".into(),
        );
        add(
            "node-arity",
            "last node loses all inputs".into(),
            Expect::Error,
            &mut |m, _| graph(m).node.last_mut().unwrap().input.clear(),
        );
        add(
            "node-arity",
            "first node gets 9 extra inputs".into(),
            Expect::Any,
            &mut |m, _| {
                let g = graph(m);
                let first_in = g.node[0].input.first().cloned().unwrap_or_default();
                for _ in 0..9 {
                    g.node[0].input.push(first_in.clone());
                }
            },
        );
    }
    add(
        "empty",
        "graph without nodes".into(),
        Expect::Any,
        &mut |m, _| graph(m).node.clear(),
    );
    add(
        "empty",
        "graph without outputs".into(),
        Expect::Any,
        &mut |m, _| graph(m).output.clear(),
    );
    add(
        "empty",
        "graph without inputs".into(),
        Expect::Any,
        &mut |m, _| graph(m).input.clear(),
    );

    // External data: valid (must compile and match), then escapes.
    if let Some(&i) = raw_inits.first() {
        let init = g0.initializer[i].name.clone();
        let data = g0.initializer[i].raw_data.clone();
        let to_external = |m: &mut ModelProto, entries: &[(&str, String)]| {
            let t: &mut TensorProto = &mut graph(m).initializer[i];
            t.raw_data.clear();
            t.data_location = Some(1);
            t.external_data = entries
                .iter()
                .map(|(k, v)| StringStringEntryProto {
                    key: k.to_string(),
                    value: v.clone(),
                })
                .collect();
        };
        let mut ext = |what: &str,
                       location: &str,
                       extra: &[(&str, String)],
                       files: Vec<(String, Vec<u8>)>,
                       expect: Expect| {
            let mut m = base.clone();
            let mut entries = vec![("location", location.to_string())];
            entries.extend_from_slice(extra);
            to_external(&mut m, &entries);
            out.push(Mutation {
                fixture: name.to_string(),
                kind: "external-data",
                what: format!("{init}: {what}"),
                model: m,
                opts: opts.clone(),
                files,
                expect,
            });
        };
        let len = data.len();
        ext(
            "valid 'weights.bin'",
            "weights.bin",
            &[],
            vec![("model/weights.bin".into(), data.clone())],
            Expect::Ok,
        );
        let mut padded = vec![7u8; 100];
        padded.extend_from_slice(&data);
        ext(
            "valid with offset 100 and length",
            "./sub/w.bin",
            &[("offset", "100".into()), ("length", len.to_string())],
            vec![("model/sub/w.bin".into(), padded)],
            Expect::Ok,
        );
        // The escapes: the file they name exists (outside the model
        // directory) with exactly the right bytes, so only the directory
        // check can refuse them.
        let outside = vec![("outside/secret.bin".into(), data.clone())];
        ext(
            "'../outside/secret.bin'",
            "../outside/secret.bin",
            &[],
            outside.clone(),
            Expect::Error,
        );
        ext(
            "'sub/../../outside/secret.bin'",
            "sub/../../outside/secret.bin",
            &[],
            outside.clone(),
            Expect::Error,
        );
        ext(
            "absolute path to the outside file",
            "@ROOT@/outside/secret.bin",
            &[],
            outside.clone(),
            Expect::Error,
        );
        ext(
            "symlink 'link.bin' -> ../outside/secret.bin",
            "link.bin",
            &[],
            vec![
                ("outside/secret.bin".into(), data.clone()),
                (
                    "@SYMLINK@model/link.bin".into(),
                    b"../outside/secret.bin".to_vec(),
                ),
            ],
            Expect::Error,
        );
        ext(
            "absolute '/etc/passwd'",
            "/etc/passwd",
            &[],
            vec![],
            Expect::Error,
        );
        ext("empty location", "", &[], vec![], Expect::Error);
        ext("missing file", "nope.bin", &[], vec![], Expect::Error);
        ext(
            "offset past the end",
            "weights.bin",
            &[("offset", (1u64 << 40).to_string())],
            vec![("model/weights.bin".into(), data.clone())],
            Expect::Error,
        );
        ext(
            "offset u64::MAX",
            "weights.bin",
            &[("offset", u64::MAX.to_string())],
            vec![("model/weights.bin".into(), data.clone())],
            Expect::Error,
        );
        ext(
            "negative offset",
            "weights.bin",
            &[("offset", "-8".into())],
            vec![("model/weights.bin".into(), data.clone())],
            Expect::Error,
        );
        ext(
            "length 2^40",
            "weights.bin",
            &[("length", (1u64 << 40).to_string())],
            vec![("model/weights.bin".into(), data.clone())],
            Expect::Error,
        );
        ext(
            "file one byte short",
            "weights.bin",
            &[],
            vec![("model/weights.bin".into(), data[..len - 1].to_vec())],
            Expect::Error,
        );
        ext(
            "location is the model directory",
            ".",
            &[],
            vec![],
            Expect::Error,
        );
        // A 2^40-element initializer whose data is "external": the size
        // must be refused before anything is read or allocated.
        let mut m = base.clone();
        to_external(&mut m, &[("location", "weights.bin".into())]);
        graph(&mut m).initializer[i].dims = vec![HUGE];
        out.push(Mutation {
            fixture: name.to_string(),
            kind: "external-data",
            what: format!("{init}: dims [2^40] in a small external file"),
            model: m,
            opts: opts.clone(),
            files: vec![("model/weights.bin".into(), data.clone())],
            expect: Expect::Error,
        });
    }
    out
}

fn real_inputs_of(g: &pb::GraphProto) -> Vec<usize> {
    g.input
        .iter()
        .enumerate()
        .filter(|(_, i)| !g.initializer.iter().any(|t| t.name == i.name))
        .map(|(k, _)| k)
        .collect()
}

/// What happened to one mutation (the messages are printed with
/// `KILN_MUTATIONS_VERBOSE=1`).
#[derive(Debug)]
#[allow(dead_code)]
enum Outcome {
    /// Compiled, ran, matched the evaluator (or the evaluator was skipped).
    Ok { compared: bool },
    /// A typed compile error.
    CompileError(String),
    /// Compiled but loading or running gave a typed error.
    RunError(String),
}

/// Random tensor for a spec; integer inputs get small non-negative values
/// (they are typically indices).
fn random_tensor(spec: &TensorSpec, rng: &mut Rng) -> Tensor {
    let n = spec.shape.iter().product::<u64>() as usize;
    match spec.dtype {
        DType::F32 => {
            let v: Vec<f32> = (0..n).map(|_| rng.unit() as f32).collect();
            Tensor::from_f32(&spec.name, &spec.shape, &v)
        }
        DType::F64 => {
            let v: Vec<f64> = (0..n).map(|_| rng.unit()).collect();
            Tensor::from_slice(&spec.name, &spec.shape, &v)
        }
        DType::I64 => {
            let v: Vec<i64> = (0..n).map(|_| (rng.next_u64() % 2) as i64).collect();
            Tensor::from_slice(&spec.name, &spec.shape, &v)
        }
        DType::I32 => {
            let v: Vec<i32> = (0..n).map(|_| (rng.next_u64() % 2) as i32).collect();
            Tensor::from_slice(&spec.name, &spec.shape, &v)
        }
        dtype => Tensor {
            name: spec.name.clone(),
            dtype,
            shape: spec.shape.clone(),
            data: (0..n * dtype.size_bytes())
                .map(|_| (rng.next_u64() % 2) as u8)
                .collect(),
        },
    }
}

/// Writes the mutation into `root/model/model.onnx` (plus its files) and
/// compiles, loads, runs and checks it. Errors are returned as outcomes;
/// failures of the contract (mismatch, oversized arena) as `Err`.
fn exercise(m: &Mutation, root: &Path, rng: &mut Rng) -> Result<Outcome, String> {
    let dir = root.join("model");
    std::fs::create_dir_all(&dir).unwrap();
    let mut model = m.model.clone();
    let root_str = root.display().to_string();
    for t in &mut graph(&mut model).initializer {
        for e in &mut t.external_data {
            e.value = e.value.replace("@ROOT@", &root_str);
        }
    }
    for (rel, bytes) in &m.files {
        if let Some(link) = rel.strip_prefix("@SYMLINK@") {
            let target = String::from_utf8(bytes.clone()).unwrap();
            std::os::unix::fs::symlink(target, root.join(link)).unwrap();
            continue;
        }
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }
    let path = dir.join("model.onnx");
    std::fs::write(&path, model.encode_to_vec()).unwrap();

    let compiled = match compile(&path, &m.opts) {
        Ok(c) => c,
        Err(e) => {
            // A typed error; make sure it renders.
            let text = e.to_string();
            if let DriverError::Onnx(kiln_onnx::OnnxError::Io { .. }) = e {
                return Ok(Outcome::CompileError(format!("io: {text}")));
            }
            return Ok(Outcome::CompileError(text));
        }
    };
    let meta = &compiled.artifact.profiles[0];
    if meta.arena_size > MAX_ARENA_BYTES {
        return Err(format!(
            "compiled with an arena of {} bytes (limit {MAX_ARENA_BYTES})",
            meta.arena_size
        ));
    }
    let rt = match Model::from_bytes(&compiled.bytes) {
        Ok(model) => model,
        Err(e) => return Ok(Outcome::RunError(format!("load: {e}"))),
    };
    let inputs: Vec<Tensor> = rt.inputs().iter().map(|s| random_tensor(s, rng)).collect();
    let views: Vec<_> = inputs.iter().map(Tensor::view).collect();
    let outputs = match rt.run(&views) {
        Ok(o) => o,
        Err(e) => return Ok(Outcome::RunError(format!("run: {e}"))),
    };

    // Reference: the evaluator on the imported (unoptimized) graph.
    let total: u64 = meta
        .inputs
        .iter()
        .chain(&meta.outputs)
        .map(|s| s.shape.iter().product::<u64>())
        .sum();
    if total > MAX_EVAL_ELEMENTS || m.fixture == "ppocr_cls" {
        return Ok(Outcome::Ok { compared: false });
    }
    let import_opts: ImportOptions = m.opts.import.clone();
    let graph_ir = kiln_onnx::import(&path, &import_opts)
        .map_err(|e| format!("compile succeeded but a second import failed: {e}"))?;
    let ir_inputs: Vec<kiln_ir::Tensor> = inputs
        .iter()
        .map(|t| {
            let data = kiln_ir::Data::from_le_bytes(t.dtype, &t.data).unwrap();
            let shape: Vec<usize> = t.shape.iter().map(|&d| d as usize).collect();
            kiln_ir::Tensor::new(&shape, data).unwrap()
        })
        .collect();
    let expected = match kiln_ir::eval::eval_graph(&graph_ir, &ir_inputs) {
        Ok(e) => e,
        Err(e) => return Err(format!("artifact ran but the evaluator failed: {e}")),
    };
    if expected.len() != outputs.len() {
        return Err(format!(
            "{} outputs, evaluator gives {}",
            outputs.len(),
            expected.len()
        ));
    }
    for (o, e) in outputs.iter().zip(&expected) {
        let reference = Tensor {
            name: o.name.clone(),
            dtype: e.dtype(),
            shape: e.shape().iter().map(|&d| d as u64).collect(),
            data: e.data().to_le_bytes(),
        };
        let c = compare(o, &reference);
        if !c.passes(TOLERANCE) {
            return Err(format!(
                "output '{}' differs from the evaluator: {c:?}",
                o.name
            ));
        }
    }
    Ok(Outcome::Ok { compared: true })
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn mutated_fixture_models_compile_or_fail_with_typed_errors() {
    let seed = env_u64("KILN_MUTATIONS_SEED", 0x6b69_6c6e);
    let rounds = env_u64("KILN_MUTATIONS_ROUNDS", 1);
    let mut rng = Rng::new(seed);
    let mut mutations = Vec::new();
    for round in 0..rounds {
        for name in FIXTURES {
            let mut ms = mutations_of(name, &mut rng);
            if round > 0 {
                // Later rounds repeat only the randomized kinds.
                ms.retain(|m| m.kind != "identity" && m.kind != "external-data");
            }
            mutations.extend(ms);
        }
    }

    // Panics are caught and reported with the mutation; silence the default
    // hook's backtrace noise but keep the message.
    let mut failures = Vec::new();
    let mut table: BTreeMap<&str, [usize; 4]> = BTreeMap::new();
    let mut compared = 0;
    let start = std::time::Instant::now();
    for (i, m) in mutations.iter().enumerate() {
        let root = tempfile::tempdir().unwrap();
        let mut case_rng = Rng::new(seed ^ (i as u64).wrapping_mul(0x1234_5678_9abc_def1));
        let result = catch_unwind(AssertUnwindSafe(|| exercise(m, root.path(), &mut case_rng)));
        let row = table.entry(m.kind).or_default();
        match result {
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                row[3] += 1;
                failures.push(format!("PANIC {}: {msg}", m.label()));
            }
            Ok(Err(e)) => {
                row[3] += 1;
                failures.push(format!("WRONG {}: {e}", m.label()));
            }
            Ok(Ok(outcome)) => {
                match &outcome {
                    Outcome::Ok { compared: c } => {
                        row[0] += 1;
                        compared += usize::from(*c);
                    }
                    Outcome::CompileError(_) => row[1] += 1,
                    Outcome::RunError(_) => row[2] += 1,
                }
                let ok = matches!(outcome, Outcome::Ok { .. });
                match m.expect {
                    Expect::Error if ok => failures.push(format!(
                        "ACCEPTED {}: expected a typed error, it compiled and ran",
                        m.label()
                    )),
                    Expect::Ok if !ok => {
                        failures.push(format!("REJECTED {}: {outcome:?}", m.label()))
                    }
                    _ => {}
                }
                if std::env::var_os("KILN_MUTATIONS_VERBOSE").is_some() {
                    println!("{}: {outcome:?}", m.label());
                }
            }
        }
    }
    println!(
        "{} mutations of {} fixtures (seed {seed:#x}, {rounds} round(s)) in {:.1} s; {compared} compared with the evaluator",
        mutations.len(),
        FIXTURES.len(),
        start.elapsed().as_secs_f64()
    );
    println!(
        "{:<20} {:>6} {:>13} {:>10} {:>9}",
        "kind", "ok", "compile error", "run error", "failures"
    );
    for (kind, [ok, ce, re, f]) in &table {
        println!("{kind:<20} {ok:>6} {ce:>13} {re:>10} {f:>9}");
    }
    assert!(mutations.len() >= 200, "only {} mutations", mutations.len());
    assert!(
        failures.is_empty(),
        "{} mutation(s) broke the contract:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
