//! Frontend behaviour on hand-built ModelProtos: malformed models, error
//! messages, external data, size limits, folding.

use kiln_ir::{BinaryOp, DType, Data, Op};
use kiln_onnx::pb::attribute_proto::AttributeType;
use kiln_onnx::pb::tensor_shape_proto::{dimension, Dimension};
use kiln_onnx::pb::type_proto;
use kiln_onnx::pb::{
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, StringStringEntryProto,
    TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
};
use kiln_onnx::{
    import, import_model, load_model, summarize, DimSummary, ImportOptions, OnnxError,
};
use prost::Message;
use std::path::{Path, PathBuf};

// ---- builders ----

enum D {
    K(i64),
    S(&'static str),
}

fn value_info(name: &str, elem: i32, dims: &[D]) -> ValueInfoProto {
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            denotation: String::new(),
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: elem,
                shape: Some(TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|d| Dimension {
                            denotation: String::new(),
                            value: Some(match d {
                                D::K(v) => dimension::Value::DimValue(*v),
                                D::S(s) => dimension::Value::DimParam(s.to_string()),
                            }),
                        })
                        .collect(),
                }),
            })),
        }),
        doc_string: String::new(),
    }
}

fn f32_input(name: &str, dims: &[i64]) -> ValueInfoProto {
    value_info(name, 1, &dims.iter().map(|&d| D::K(d)).collect::<Vec<_>>())
}

fn node(op: &str, name: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
    NodeProto {
        op_type: op.into(),
        name: name.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn attr_i(name: &str, i: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: AttributeType::Int as i32,
        i,
        ..Default::default()
    }
}

fn attr_f(name: &str, f: f32) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: AttributeType::Float as i32,
        f,
        ..Default::default()
    }
}

fn f32_tensor(name: &str, dims: &[i64], v: &[f32]) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: 1,
        raw_data: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        ..Default::default()
    }
}

fn model(
    nodes: Vec<NodeProto>,
    inputs: Vec<ValueInfoProto>,
    outputs: &[&str],
    inits: Vec<TensorProto>,
) -> ModelProto {
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 13,
        }],
        producer_name: "kiln-tests".into(),
        graph: Some(GraphProto {
            name: "g".into(),
            node: nodes,
            input: inputs,
            output: outputs
                .iter()
                .map(|o| ValueInfoProto {
                    name: o.to_string(),
                    ..Default::default()
                })
                .collect(),
            initializer: inits,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn relu_model() -> ModelProto {
    model(
        vec![node("Relu", "r", &["x"], &["y"])],
        vec![f32_input("x", &[2, 3])],
        &["y"],
        vec![],
    )
}

fn err(m: &ModelProto) -> OnnxError {
    import_model(m, None, &ImportOptions::default()).expect_err("import should fail")
}

/// A fresh directory under the system temp dir.
fn temp_dir(tag: &str) -> PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let d = std::env::temp_dir().join(format!(
        "kiln-onnx-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn write_model(dir: &Path, m: &ModelProto) -> PathBuf {
    let p = dir.join("model.onnx");
    std::fs::write(&p, m.encode_to_vec()).unwrap();
    p
}

// ---- decoding ----

#[test]
fn truncated_file_is_not_a_valid_model() {
    let dir = temp_dir("trunc");
    let bytes = relu_model().encode_to_vec();
    let p = dir.join("model.onnx");
    std::fs::write(&p, &bytes[..bytes.len() - 7]).unwrap();
    let e = load_model(&p).unwrap_err();
    assert!(matches!(e, OnnxError::Decode(_)), "{e:?}");
    assert!(e.to_string().starts_with("not a valid ONNX model: "), "{e}");
}

#[test]
fn non_onnx_file_is_rejected() {
    let dir = temp_dir("garbage");
    let p = dir.join("model.onnx");
    std::fs::write(&p, b"this is certainly not a protobuf \xff\xff\xff\xff").unwrap();
    let e = import(&p, &ImportOptions::default()).unwrap_err();
    assert!(matches!(e, OnnxError::Decode(_)), "{e:?}");
    std::fs::write(&p, b"").unwrap();
    assert!(matches!(load_model(&p).unwrap_err(), OnnxError::Decode(_)));
    let missing = dir.join("nope.onnx");
    assert!(matches!(
        load_model(&missing).unwrap_err(),
        OnnxError::Io { .. }
    ));
}

#[test]
fn valid_model_round_trips_through_a_file() {
    let dir = temp_dir("ok");
    let p = write_model(&dir, &relu_model());
    let g = import(&p, &ImportOptions::default()).unwrap();
    kiln_ir::verify::verify(&g).unwrap();
    assert_eq!(g.outputs()[0].0, "y");
    assert_eq!(g.node(g.outputs()[0].1).ty.shape.as_slice(), &[2, 3]);
}

// ---- structure ----

#[test]
fn cycle_is_reported_with_a_node() {
    let m = model(
        vec![
            node("Add", "a", &["x", "c"], &["b"]),
            node("Relu", "r", &["b"], &["c"]),
            node("Relu", "out", &["b"], &["y"]),
        ],
        vec![f32_input("x", &[2])],
        &["y"],
        vec![],
    );
    let e = err(&m);
    match &e {
        OnnxError::Cycle(n) => assert!(n == "a" || n == "r", "{n}"),
        other => panic!("{other:?}"),
    }
    assert!(e.to_string().contains("cycle"), "{e}");
}

#[test]
fn nodes_out_of_order_still_import() {
    let m = model(
        vec![
            node("Relu", "second", &["h"], &["y"]),
            node("Neg", "first", &["x"], &["h"]),
        ],
        vec![f32_input("x", &[2])],
        &["y"],
        vec![],
    );
    let g = import_model(&m, None, &ImportOptions::default()).unwrap();
    kiln_ir::verify::verify(&g).unwrap();
}

#[test]
fn missing_initializer_is_reported() {
    let m = model(
        vec![node("MatMul", "mm", &["x", "W"], &["y"])],
        vec![f32_input("x", &[2, 3])],
        &["y"],
        vec![],
    );
    let e = err(&m);
    match &e {
        OnnxError::MissingInput { node, input } => {
            assert_eq!((node.as_str(), input.as_str()), ("mm", "W"))
        }
        other => panic!("{other:?}"),
    }
    assert!(
        e.to_string().contains("'mm'") && e.to_string().contains("'W'"),
        "{e}"
    );
}

#[test]
fn dangling_input_name_is_reported() {
    let m = model(
        vec![
            node("Relu", "", &["x"], &["h"]),
            node("Add", "", &["h", "typo_h"], &["y"]),
        ],
        vec![f32_input("x", &[2])],
        &["y"],
        vec![],
    );
    match err(&m) {
        OnnxError::MissingInput { node, input } => {
            assert_eq!(node, "Add_1");
            assert_eq!(input, "typo_h");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn graph_names_listed_twice_are_invalid() {
    // The artifact records inputs and outputs by name; the runtime refuses
    // duplicates, so the compiler must too.
    let mut m = relu_model();
    let graph = m.graph.as_mut().unwrap();
    graph.input.push(f32_input("x", &[2, 3]));
    let e = err(&m);
    assert!(matches!(e, OnnxError::InvalidModel(_)), "{e:?}");
    assert!(e.to_string().contains("graph input 'x'"), "{e}");
    let mut m = relu_model();
    let graph = m.graph.as_mut().unwrap();
    graph.output.push(graph.output[0].clone());
    let e = err(&m);
    assert!(e.to_string().contains("graph output 'y'"), "{e}");
}

// ---- unsupported ops ----

#[test]
fn unsupported_op_names_op_node_domain_and_opset() {
    let m = model(
        vec![node("Bernoulli", "coin1", &["x"], &["y"])],
        vec![f32_input("x", &[2])],
        &["y"],
        vec![],
    );
    let e = err(&m);
    let OnnxError::Unsupported(list) = &e else {
        panic!("{e:?}")
    };
    assert_eq!(list.len(), 1);
    let msg = e.to_string();
    assert!(
        msg.starts_with("unsupported op 'Bernoulli' (domain 'ai.onnx', opset 13) at node 'coin1'"),
        "{msg}"
    );
}

#[test]
fn uncovered_contrib_op_is_named_with_the_contrib_ops_kiln_has() {
    let mut gqa = node("GroupQueryAttention", "gqa0", &["x"], &["y"]);
    gqa.domain = "com.microsoft".into();
    let mut m = model(vec![gqa], vec![f32_input("x", &[2])], &["y"], vec![]);
    m.opset_import.push(OperatorSetIdProto {
        domain: "com.microsoft".into(),
        version: 1,
    });
    let msg = err(&m).to_string();
    assert!(
        msg.contains("'GroupQueryAttention' (domain 'com.microsoft', opset 1) at node 'gqa0'"),
        "{msg}"
    );
    for known in ["Attention", "QLinearAdd", "SkipLayerNormalization"] {
        assert!(msg.contains(known), "{msg}");
    }
}

#[test]
fn all_unsupported_ops_are_reported_together() {
    let mut custom = node("FancyOp", "f", &["h"], &["h2"]);
    custom.domain = "com.example".into();
    let mut m = model(
        vec![
            node("Bernoulli", "bernoulli0", &["x"], &["h"]),
            custom,
            node("Relu", "fine", &["h2"], &["h3"]),
            node("StringNormalizer", "", &["h3"], &["y"]),
        ],
        vec![f32_input("x", &[2])],
        &["y"],
        vec![],
    );
    m.opset_import.push(OperatorSetIdProto {
        domain: "com.example".into(),
        version: 3,
    });
    let e = err(&m);
    let OnnxError::Unsupported(list) = &e else {
        panic!("{e:?}")
    };
    let got: Vec<_> = list
        .iter()
        .map(|u| {
            (
                u.op_type.as_str(),
                u.node_name.as_str(),
                u.domain.as_str(),
                u.opset,
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("Bernoulli", "bernoulli0", "ai.onnx", 13),
            ("FancyOp", "f", "com.example", 3),
            ("StringNormalizer", "StringNormalizer_3", "ai.onnx", 13)
        ]
    );
    let msg = e.to_string();
    assert!(msg.starts_with("3 unsupported ops:"), "{msg}");
    assert!(msg.contains("domain 'com.example'"), "{msg}");
}

#[test]
fn maxpool_indices_import_in_2d_and_are_refused_elsewhere() {
    let pool = |k: Vec<i64>| {
        let mut n = node("MaxPool", "mp", &["x"], &["y", "idx"]);
        n.attribute.push(AttributeProto {
            name: "kernel_shape".into(),
            r#type: AttributeType::Ints as i32,
            ints: k,
            ..Default::default()
        });
        n
    };
    let m = model(
        vec![pool(vec![2, 2])],
        vec![f32_input("x", &[1, 1, 4, 4])],
        &["y", "idx"],
        vec![],
    );
    let g = import_model(&m, None, &ImportOptions::default()).unwrap();
    let idx = g.node(g.outputs()[1].1);
    assert_eq!(idx.ty.dtype, kiln_ir::DType::I64);
    assert_eq!(idx.ty.shape.as_slice(), &[1, 1, 3, 3]);
    // A 1-D pool's indices are refused with the reason.
    let m = model(
        vec![pool(vec![2])],
        vec![f32_input("x", &[1, 1, 4])],
        &["y", "idx"],
        vec![],
    );
    let e = err(&m);
    assert!(e.to_string().contains("'Indices'"), "{e}");
    // Unused Indices leave a plain pool.
    let m = model(
        vec![pool(vec![2, 2])],
        vec![f32_input("x", &[1, 1, 4, 4])],
        &["y"],
        vec![],
    );
    let g = import_model(&m, None, &ImportOptions::default()).unwrap();
    assert_eq!(g.node(g.outputs()[0].1).ty.shape.as_slice(), &[1, 1, 3, 3]);
}

#[test]
fn non_constant_reshape_target_is_unsupported() {
    let m = model(
        vec![node("Reshape", "rs", &["x", "s"], &["y"])],
        vec![f32_input("x", &[2, 3]), value_info("s", 7, &[D::K(2)])],
        &["y"],
        vec![],
    );
    let e = err(&m);
    assert!(
        e.to_string()
            .contains("input 1 must be a compile-time constant"),
        "{e}"
    );
    // The error names the graph input the target comes from (through a
    // computing node), so it can be bound.
    let OnnxError::Unsupported(ops) = &e else {
        panic!("{e:?}")
    };
    assert_eq!(ops[0].bindable_inputs, ["s"]);
    assert!(e.to_string().contains("--bind-input s=FILE.npy"), "{e}");
}

fn reshape_by_input_model() -> ModelProto {
    // y = Reshape(x, s + 0): the target is computed from graph input `s`.
    model(
        vec![
            node("Add", "plus", &["s", "zero"], &["t"]),
            node("Reshape", "rs", &["x", "t"], &["y"]),
        ],
        vec![f32_input("x", &[2, 3]), value_info("s", 7, &[D::S("n")])],
        &["y"],
        vec![i64_tensor("zero", &[0])],
    )
}

#[test]
fn computed_reshape_target_names_its_graph_input() {
    let m = reshape_by_input_model();
    let mut opts = ImportOptions::default();
    opts.dims.insert("n".into(), 2);
    let e = import_model(&m, None, &opts).unwrap_err();
    let OnnxError::Unsupported(ops) = &e else {
        panic!("{e:?}")
    };
    assert_eq!(ops[0].node_name, "rs");
    assert_eq!(ops[0].bindable_inputs, ["s"]);
}

#[test]
fn bound_input_folds_and_leaves_the_graph_inputs() {
    let m = reshape_by_input_model();
    let mut opts = ImportOptions::default();
    let target = kiln_ir::Tensor::new([3], Data::I64(vec![3, 1, 2])).unwrap();
    opts.input_values.insert("s".into(), target);
    let g = import_model(&m, None, &opts).unwrap();
    // Only `x` is left, and the output has the bound shape.
    assert_eq!(g.inputs().len(), 1);
    assert_eq!(g.node(g.inputs()[0]).name, "x");
    assert_eq!(g.node(g.outputs()[0].1).ty.shape.as_slice(), &[3, 1, 2]);
}

#[test]
fn bound_values_must_match_the_declaration() {
    let m = reshape_by_input_model();
    let bind = |name: &str, t: kiln_ir::Tensor| {
        let mut opts = ImportOptions::default();
        opts.input_values.insert(name.into(), t);
        import_model(&m, None, &opts).unwrap_err().to_string()
    };
    let wrong_type = bind(
        "s",
        kiln_ir::Tensor::new([2], Data::I32(vec![3, 2])).unwrap(),
    );
    assert!(
        wrong_type.contains("'s'") && wrong_type.contains("i64") && wrong_type.contains("i32"),
        "{wrong_type}"
    );
    let wrong_rank = bind(
        "s",
        kiln_ir::Tensor::new([1, 2], Data::I64(vec![3, 2])).unwrap(),
    );
    assert!(wrong_rank.contains("[n]"), "{wrong_rank}");
    let no_such = bind("q", kiln_ir::Tensor::new([1], Data::I64(vec![1])).unwrap());
    assert!(
        no_such.contains("'q'") && no_such.contains("inputs: x, s"),
        "{no_such}"
    );
}

// ---- dims ----

#[test]
fn unbound_symbolic_dim_names_input_and_dim() {
    let m = model(
        vec![node("Relu", "r", &["x"], &["y"])],
        vec![value_info(
            "x",
            1,
            &[D::S("batch"), D::K(3), D::K(224), D::K(224)],
        )],
        &["y"],
        vec![],
    );
    let e = err(&m);
    match &e {
        OnnxError::UnboundDim(dims) => {
            let d = &dims[0];
            assert_eq!(
                (
                    dims.len(),
                    d.input.as_str(),
                    d.dim_index,
                    d.dim_name.as_deref()
                ),
                (1, "x", 0, Some("batch"))
            )
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        e.to_string(),
        "graph inputs have dims no option binds: 'x' dim 0 ('batch'); bind them, e.g. --dim batch=1 (several values make one profile each: --dim NAME=1,8,32 or NAME=16..512:16); or the whole shapes: --input-shape x=1x3x224x224"
    );
}

#[test]
fn every_unbound_dim_of_every_input_is_listed_at_once() {
    let m = model(
        vec![node("Add", "a", &["ids", "mask"], &["y"])],
        vec![
            value_info("ids", 1, &[D::S("batch_size"), D::S("sequence_length")]),
            value_info("mask", 1, &[D::S("batch_size"), D::S("sequence_length")]),
        ],
        &["y"],
        vec![],
    );
    let text = err(&m).to_string();
    assert!(
        text.contains("'ids' dim 0 ('batch_size'), dim 1 ('sequence_length'); 'mask' dim 0 ('batch_size'), dim 1 ('sequence_length')"),
        "{text}"
    );
    assert!(
        text.contains("e.g. --dim batch_size=1 --dim sequence_length=128 "),
        "{text}"
    );
}

#[test]
fn summary_keeps_symbolic_dims() {
    let m = model(
        vec![
            node("Relu", "r", &["x"], &["y"]),
            node("Relu", "r2", &["y"], &["z"]),
        ],
        vec![value_info("x", 1, &[D::S("batch"), D::K(3)])],
        &["z"],
        vec![f32_tensor("unused", &[4], &[1.0; 4])],
    );
    let s = summarize(&m);
    assert_eq!(
        s.inputs[0].dims,
        vec![DimSummary::Symbolic("batch".into()), DimSummary::Known(3)]
    );
    assert_eq!(s.inputs[0].dtype, "f32");
    assert_eq!(s.op_histogram.get("Relu"), Some(&2));
    assert_eq!((s.initializer_count, s.initializer_bytes), (1, 16));
    assert_eq!(s.opsets, vec![("ai.onnx".to_string(), 13)]);
}

// ---- attributes ----

#[test]
fn wrong_attribute_type_is_reported() {
    let mut n = node("LeakyRelu", "lr", &["x"], &["y"]);
    n.attribute.push(attr_i("alpha", 2));
    let m = model(vec![n], vec![f32_input("x", &[2])], &["y"], vec![]);
    let e = err(&m);
    match &e {
        OnnxError::AttributeType {
            node,
            attribute,
            expected,
            found,
        } => {
            assert_eq!((node.as_str(), attribute.as_str()), ("lr", "alpha"));
            assert_eq!((expected.as_str(), found.as_str()), ("FLOAT", "INT"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn shape_errors_name_the_node() {
    let m = model(
        vec![node("MatMul", "mm", &["x", "w"], &["y"])],
        vec![f32_input("x", &[2, 3]), f32_input("w", &[4, 5])],
        &["y"],
        vec![],
    );
    let e = err(&m);
    assert!(matches!(e, OnnxError::Node { .. }), "{e:?}");
    assert!(e.to_string().starts_with("node 'mm' (MatMul): "), "{e}");
}

// ---- external data and sizes ----

fn external_model(location: &str, offset: Option<u64>, length: Option<u64>) -> ModelProto {
    let mut entries = vec![StringStringEntryProto {
        key: "location".into(),
        value: location.into(),
    }];
    if let Some(o) = offset {
        entries.push(StringStringEntryProto {
            key: "offset".into(),
            value: o.to_string(),
        });
    }
    if let Some(l) = length {
        entries.push(StringStringEntryProto {
            key: "length".into(),
            value: l.to_string(),
        });
    }
    let w = TensorProto {
        name: "W".into(),
        dims: vec![3],
        data_type: 1,
        data_location: Some(1),
        external_data: entries,
        ..Default::default()
    };
    model(
        vec![node("Add", "add", &["x", "W"], &["y"])],
        vec![f32_input("x", &[3])],
        &["y"],
        vec![w],
    )
}

#[test]
fn external_data_is_read_from_the_model_directory() {
    let dir = temp_dir("ext");
    let mut bytes = vec![0xAAu8; 8]; // padding before the tensor
    for x in [1.5f32, -2.0, 3.25] {
        bytes.extend(x.to_le_bytes());
    }
    std::fs::create_dir_all(dir.join("weights")).unwrap();
    std::fs::write(dir.join("weights/w.bin"), &bytes).unwrap();
    let p = write_model(&dir, &external_model("weights/w.bin", Some(8), Some(12)));
    let g = import(&p, &ImportOptions::default()).unwrap();
    let add = g.outputs()[0].1;
    let w = g.inputs_of(add)[1];
    assert_eq!(g.constant(w).unwrap().to_f32_vec(), vec![1.5, -2.0, 3.25]);

    // Out-of-range offset and missing files are errors, not panics.
    let p = write_model(&dir, &external_model("weights/w.bin", Some(16), None));
    assert!(matches!(
        import(&p, &ImportOptions::default()).unwrap_err(),
        OnnxError::ExternalData { .. }
    ));
    let p = write_model(&dir, &external_model("weights/missing.bin", None, None));
    assert!(matches!(
        import(&p, &ImportOptions::default()).unwrap_err(),
        OnnxError::ExternalData { .. }
    ));
}

#[test]
fn external_data_outside_the_model_directory_is_refused() {
    let root = temp_dir("escape");
    let inner = root.join("model");
    std::fs::create_dir_all(&inner).unwrap();
    let mut secret = Vec::new();
    for x in [1.0f32, 2.0, 3.0] {
        secret.extend(x.to_le_bytes());
    }
    std::fs::write(root.join("secret.bin"), &secret).unwrap();
    for loc in ["../secret.bin", "sub/../../secret.bin"] {
        let p = write_model(&inner, &external_model(loc, None, None));
        let e = import(&p, &ImportOptions::default()).unwrap_err();
        assert!(matches!(e, OnnxError::ExternalData { .. }), "{loc}: {e:?}");
        assert!(
            e.to_string()
                .contains("relative path inside the model directory"),
            "{e}"
        );
    }
    let abs = root.join("secret.bin").display().to_string();
    let p = write_model(&inner, &external_model(&abs, None, None));
    assert!(matches!(
        import(&p, &ImportOptions::default()).unwrap_err(),
        OnnxError::ExternalData { .. }
    ));
    // A symlink is never followed, wherever it points.
    std::os::unix::fs::symlink(root.join("secret.bin"), inner.join("link.bin")).unwrap();
    let p = write_model(&inner, &external_model("link.bin", None, None));
    let e = import(&p, &ImportOptions::default()).unwrap_err();
    assert!(e.to_string().contains("is a symbolic link"), "{e}");
}

/// What external data may be: a regular, visible file below the model
/// directory, reached without following links, and long enough. Each
/// refusal is typed, and none blocks.
#[test]
fn external_data_is_only_read_from_plain_files() {
    use kiln_onnx::ExternalDataError as X;
    let dir = temp_dir("ext-kinds");
    let floats: Vec<u8> = [1.0f32, 2.0, 3.0]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    std::fs::create_dir_all(dir.join(".hidden")).unwrap();
    std::fs::create_dir_all(dir.join("real")).unwrap();
    std::fs::write(dir.join(".hidden/w.bin"), &floats).unwrap();
    std::fs::write(dir.join(".w.bin"), &floats).unwrap();
    std::fs::write(dir.join("real/w.bin"), &floats).unwrap();
    std::fs::write(dir.join("short.bin"), &floats[..8]).unwrap();
    std::os::unix::fs::symlink("real", dir.join("linked")).unwrap();
    let fifo = dir.join("pipe.bin");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let refusal = |location: &str| {
        let p = write_model(&dir, &external_model(location, None, None));
        let start = std::time::Instant::now();
        let e = import(&p, &ImportOptions::default()).unwrap_err();
        assert!(
            start.elapsed() < std::time::Duration::from_secs(5),
            "{location}"
        );
        e
    };
    let reason = |location: &str| match refusal(location) {
        OnnxError::ExternalData { reason, .. } => reason,
        e => panic!("{location}: {e:?}"),
    };
    assert!(matches!(reason(".hidden/w.bin"), X::Hidden { .. }));
    assert!(matches!(reason("./.w.bin"), X::Hidden { .. }));
    assert!(matches!(reason("linked/w.bin"), X::Symlink(_)));
    assert!(matches!(reason("pipe.bin"), X::NotRegularFile { kind, .. } if kind.contains("FIFO")));
    assert!(matches!(
        reason("real"),
        X::NotRegularFile {
            kind: "a directory",
            ..
        }
    ));
    assert!(matches!(reason("short.bin"), X::PastEnd { .. }));
    assert!(matches!(reason("."), X::Escapes(_)));
    // The same file through its real path is fine.
    let p = write_model(&dir, &external_model("./real/w.bin", None, None));
    import(&p, &ImportOptions::default()).unwrap();
}

/// Initializers that alias the same bytes of one external file may read
/// no more, summed over the model, than the file holds: refused as too
/// large before the allocation.
#[test]
fn aliased_external_initializers_are_too_large() {
    let dir = temp_dir("ext-alias");
    std::fs::write(dir.join("w.bin"), vec![0u8; 4096]).unwrap();
    let alias = |name: &str| TensorProto {
        name: name.into(),
        dims: vec![1024],
        data_type: 1,
        data_location: Some(1),
        external_data: vec![StringStringEntryProto {
            key: "location".into(),
            value: "w.bin".into(),
        }],
        ..Default::default()
    };
    let graph = |count: usize| {
        let names: Vec<String> = (0..count).map(|i| format!("W{i}")).collect();
        let mut nodes = Vec::new();
        let mut prev = "x".to_string();
        for (i, w) in names.iter().enumerate() {
            let out = format!("y{i}");
            nodes.push(node("Add", &format!("add{i}"), &[&prev, w], &[&out]));
            prev = out;
        }
        let inits = names.iter().map(|n| alias(n)).collect();
        model(nodes, vec![f32_input("x", &[1024])], &[&prev], inits)
    };
    let p = write_model(&dir, &graph(1));
    import(&p, &ImportOptions::default()).unwrap();
    let p = write_model(&dir, &graph(3));
    let e = import(&p, &ImportOptions::default()).unwrap_err();
    assert!(
        matches!(e, OnnxError::TooLarge { ref tensor, .. } if tensor == "W1"),
        "{e:?}"
    );
    assert!(e.to_string().contains("alias"), "{e}");
}

/// A model path that is a FIFO is refused, not waited on.
#[test]
fn a_fifo_as_the_model_is_refused() {
    let dir = temp_dir("model-fifo");
    let fifo = dir.join("model.onnx");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let e = import(&fifo, &ImportOptions::default()).unwrap_err();
    assert!(e.to_string().contains("FIFO"), "{e}");
}

#[test]
fn huge_declared_initializer_in_a_tiny_file_is_too_large() {
    // 2^40 floats declared, 4 bytes present: refused before allocating.
    let w = f32_tensor("W", &[1 << 40], &[1.0]);
    let m = model(
        vec![node("Add", "add", &["x", "W"], &["y"])],
        vec![f32_input("x", &[1])],
        &["y"],
        vec![w],
    );
    let e = err(&m);
    assert!(matches!(e, OnnxError::TooLarge { .. }), "{e:?}");
    assert!(e.to_string().contains("'W'"), "{e}");

    // Under the limit but more than the data present: also refused.
    let w = f32_tensor("W", &[100_000_000], &[1.0]);
    let m = model(
        vec![node("Add", "add", &["x", "W"], &["y"])],
        vec![f32_input("x", &[1])],
        &["y"],
        vec![w],
    );
    let e = err(&m);
    assert!(matches!(e, OnnxError::TooLarge { .. }), "{e:?}");
    assert!(e.to_string().contains("only 4 bytes"), "{e}");

    // Overflowing dims.
    let w = f32_tensor("W", &[i64::MAX, i64::MAX], &[1.0]);
    let m = model(
        vec![node("Add", "add", &["x", "W"], &["y"])],
        vec![f32_input("x", &[1])],
        &["y"],
        vec![w],
    );
    assert!(matches!(err(&m), OnnxError::TooLarge { .. }));

    // A lower limit applies.
    let w = f32_tensor("W", &[4], &[1.0; 4]);
    let m = model(
        vec![node("Add", "add", &["x", "W"], &["y"])],
        vec![f32_input("x", &[4])],
        &["y"],
        vec![w],
    );
    let opts = ImportOptions {
        max_initializer_bytes: 8,
        ..Default::default()
    };
    assert!(matches!(
        import_model(&m, None, &opts).unwrap_err(),
        OnnxError::TooLarge { .. }
    ));
}

#[test]
fn unsupported_dtype_names_the_value() {
    let m = model(
        vec![node("Relu", "r", &["x"], &["y"])],
        vec![value_info("x", 8, &[D::K(2)])],
        &["y"],
        vec![],
    );
    match err(&m) {
        OnnxError::UnsupportedDType { value, dtype } => {
            assert_eq!((value.as_str(), dtype.as_str()), ("x", "STRING"))
        }
        other => panic!("{other:?}"),
    }
}

// ---- folding ----

#[test]
fn batch_norm_folds_into_mul_and_add() {
    let c = 2;
    let inits = vec![
        f32_tensor("scale", &[c], &[2.0, 0.5]),
        f32_tensor("bias", &[c], &[1.0, -1.0]),
        f32_tensor("mean", &[c], &[3.0, 0.0]),
        f32_tensor("var", &[c], &[4.0, 1.0]),
    ];
    let mut n = node(
        "BatchNormalization",
        "bn",
        &["x", "scale", "bias", "mean", "var"],
        &["y"],
    );
    n.attribute.push(attr_f("epsilon", 0.0));
    let m = model(vec![n], vec![f32_input("x", &[1, 2, 2, 2])], &["y"], inits);
    let g = import_model(&m, None, &ImportOptions::default()).unwrap();
    kiln_ir::verify::verify(&g).unwrap();
    let add = g.outputs()[0].1;
    assert_eq!(g.node(add).op, Op::Binary(BinaryOp::Add));
    let [mul, shift] = g.inputs_of(add)[..] else {
        panic!()
    };
    assert_eq!(g.node(mul).op, Op::Binary(BinaryOp::Mul));
    let [x, scale] = g.inputs_of(mul)[..] else {
        panic!()
    };
    assert_eq!(x, g.inputs()[0]);
    // a = scale / sqrt(var + eps) = [1, 0.5]; b = B - mean * a = [-2, -1].
    let a = g.constant(scale).unwrap();
    assert_eq!(a.shape().as_slice(), &[2, 1, 1]);
    assert_eq!(a.to_f32_vec(), vec![1.0, 0.5]);
    assert_eq!(g.constant(shift).unwrap().to_f32_vec(), vec![-2.0, -1.0]);
    // Only input, two constants, mul and add.
    assert_eq!(g.node_count(), 5);
}

#[test]
fn shape_subgraphs_fold_to_a_reshape() {
    // Shape -> Gather(0) -> Unsqueeze -> Concat([-1]) -> Reshape
    let i64_t = |name: &str, dims: &[i64], v: &[i64]| TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: 7,
        int64_data: v.to_vec(),
        ..Default::default()
    };
    let m = model(
        vec![
            node("Shape", "shape", &["x"], &["s"]),
            node("Gather", "g", &["s", "zero"], &["n"]),
            node("Unsqueeze", "u", &["n", "axes"], &["n1"]),
            node("Concat", "cat", &["n1", "minus1"], &["target"]),
            node("Reshape", "rs", &["x", "target"], &["y"]),
        ],
        vec![value_info("x", 1, &[D::S("N"), D::K(3), D::K(4)])],
        &["y"],
        vec![
            i64_t("zero", &[], &[0]),
            i64_t("axes", &[1], &[0]),
            i64_t("minus1", &[1], &[-1]),
        ],
    );
    let mut cat = m.clone();
    cat.graph.as_mut().unwrap().node[3]
        .attribute
        .push(attr_i("axis", 0));
    let mut opts = ImportOptions::default();
    opts.dims.insert("N".into(), 2);
    let g = import_model(&cat, None, &opts).unwrap();
    kiln_ir::verify::verify(&g).unwrap();
    let y = g.outputs()[0].1;
    assert!(matches!(&g.node(y).op, Op::Reshape { shape } if shape.as_slice() == [2, 12]));
    assert_eq!(g.node_count(), 2, "{}", kiln_ir::text::print(&g));
}

#[test]
fn constant_outputs_and_identity_aliases() {
    let mut c = node("Constant", "c", &[], &["k"]);
    c.attribute.push(AttributeProto {
        name: "value_ints".into(),
        r#type: AttributeType::Ints as i32,
        ints: vec![1, 2, 3],
        ..Default::default()
    });
    let m = model(
        vec![c, node("Identity", "id", &["x"], &["y"])],
        vec![f32_input("x", &[2])],
        &["y", "k"],
        vec![],
    );
    let g = import_model(&m, None, &ImportOptions::default()).unwrap();
    assert_eq!(g.outputs()[0].1, g.inputs()[0]);
    let k = g.constant(g.outputs()[1].1).unwrap();
    assert_eq!(k.dtype(), DType::I64);
    assert_eq!(k.data(), &Data::I64(vec![1, 2, 3]));
}

#[test]
fn invalid_and_future_opsets_are_refused() {
    for (version, newer) in [(0, false), (-1, false), (99, true)] {
        let mut m = relu_model();
        m.opset_import[0].version = version;
        let e = err(&m);
        if newer {
            assert!(
                matches!(e, OnnxError::UnsupportedOpset { version: 99, .. }),
                "{e:?}"
            );
            assert!(e.to_string().contains("opset 99"), "{e}");
        } else {
            assert!(matches!(e, OnnxError::InvalidModel(_)), "{e:?}");
            assert!(e.to_string().contains(&format!("opset {version}")), "{e}");
        }
    }
}

#[test]
fn a_graph_without_outputs_is_refused() {
    let mut m = relu_model();
    m.graph.as_mut().unwrap().output.clear();
    let e = err(&m);
    assert!(e.to_string().contains("no outputs"), "{e}");
}

// ---- memory bounds: what a small model can make the import allocate ----

fn i64_tensor(name: &str, v: &[i64]) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: vec![v.len() as i64],
        data_type: 7,
        raw_data: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        ..Default::default()
    }
}

/// `x[n] + ConstantOfShape([n]) + ...`, one ConstantOfShape per name.
fn constant_of_shape_chain(n: i64, names: &[&str]) -> ModelProto {
    let mut nodes = Vec::new();
    let mut prev = "x".to_string();
    for (k, c) in names.iter().enumerate() {
        nodes.push(node("ConstantOfShape", c, &["shape"], &[c]));
        let sum = format!("sum{k}");
        nodes.push(node("Add", &sum, &[&prev, c], &[&sum]));
        prev = sum;
    }
    let last = prev.clone();
    nodes.push(node("Identity", "out", &[&last], &["y"]));
    model(
        nodes,
        vec![f32_input("x", &[n])],
        &["y"],
        vec![i64_tensor("shape", &[n])],
    )
}

#[test]
fn constant_of_shape_claiming_2_to_40_elements_is_refused_before_allocating() {
    let m = constant_of_shape_chain(1 << 40, &["huge"]);
    // The input [2^40] alone is addressable; the constant is refused first.
    let e = err(&m);
    assert!(matches!(e, OnnxError::TooLarge { .. }), "{e:?}");
    assert!(e.to_string().contains("'huge'"), "{e}");
    assert!(
        prost::Message::encoded_len(&m) < 1024,
        "the attack model is small"
    );
}

#[test]
fn generated_constants_share_one_budget() {
    // Three ConstantOfShape of 100 f32 (400 bytes each) under a 1000-byte
    // budget: the third is refused, named.
    let m = constant_of_shape_chain(100, &["c1", "c2", "c3"]);
    let opts = ImportOptions {
        max_generated_bytes: 1000,
        ..Default::default()
    };
    let e = import_model(&m, None, &opts).unwrap_err();
    assert!(matches!(e, OnnxError::TooLarge { .. }), "{e:?}");
    let message = e.to_string();
    assert!(
        message.contains("'c3'") && message.contains("800 bytes"),
        "{message}"
    );
    // Two fit.
    let m = constant_of_shape_chain(100, &["c1", "c2"]);
    import_model(&m, None, &opts).expect("two constants fit the budget");
}

#[test]
fn folds_beyond_the_budget_stay_in_the_graph() {
    // W (in the file) → Neg → Neg → + x: the first fold (400 bytes) fits a
    // 500-byte budget, the second is left as a node that runs in the arena.
    let m = model(
        vec![
            node("Neg", "n1", &["W"], &["w1"]),
            node("Neg", "n2", &["w1"], &["w2"]),
            node("Add", "add", &["x", "w2"], &["y"]),
        ],
        vec![f32_input("x", &[100])],
        &["y"],
        vec![f32_tensor("W", &[100], &[0.5; 100])],
    );
    let count_negs = |opts: &ImportOptions| {
        let g = import_model(&m, None, opts).unwrap();
        (g.topo_order().unwrap().into_iter())
            .filter(|&id| matches!(g.node(id).op, Op::Unary(kiln_ir::UnaryOp::Neg)))
            .count()
    };
    let tight = ImportOptions {
        max_generated_bytes: 500,
        ..Default::default()
    };
    assert_eq!(count_negs(&tight), 1);
    assert_eq!(count_negs(&ImportOptions::default()), 0);
}

#[test]
fn expand_to_a_huge_shape_is_refused_naming_the_node() {
    let m = model(
        vec![
            node("Expand", "big", &["one", "shape"], &["e"]),
            node("Add", "add", &["x", "e"], &["y"]),
        ],
        vec![f32_input("x", &[1])],
        &["y"],
        vec![
            f32_tensor("one", &[1], &[1.0]),
            i64_tensor("shape", &[1 << 20, 1 << 20]),
        ],
    );
    let e = err(&m);
    assert!(e.to_string().contains("big"), "{e}");
}

#[test]
fn huge_dims_in_value_info_are_not_materialized() {
    // value_info is advisory: Kiln infers every type itself, so a claimed
    // [2^40, 2^40] intermediate changes nothing.
    let mut m = relu_model();
    let g = m.graph.as_mut().unwrap();
    g.value_info.push(f32_input("y", &[1 << 40, 1 << 40]));
    let graph = import_model(&m, None, &ImportOptions::default()).unwrap();
    let out = graph.outputs()[0].1;
    assert_eq!(graph.node(out).ty.shape.as_slice(), &[2, 3]);
}

#[test]
fn costly_constant_folds_are_left_to_run_in_the_compiled_code() {
    // A ~200-byte model: Conv of two ConstantOfShape results, 257 x 257
    // outputs of 65,536 multiply-adds each (4.3e9): folding it at import
    // would take hours in the reference evaluator.
    let m = model(
        vec![
            node("ConstantOfShape", "X", &["xs"], &["X"]),
            node("ConstantOfShape", "W", &["ws"], &["W"]),
            node("Conv", "conv", &["X", "W"], &["c"]),
            node("Add", "add", &["x", "c"], &["y"]),
        ],
        vec![f32_input("x", &[1, 1, 257, 257])],
        &["y"],
        vec![
            i64_tensor("xs", &[1, 1, 512, 512]),
            i64_tensor("ws", &[1, 1, 256, 256]),
        ],
    );
    let start = std::time::Instant::now();
    let g = import_model(&m, None, &ImportOptions::default()).unwrap();
    assert!(start.elapsed().as_secs() < 30, "{:?}", start.elapsed());
    let convs = (g.topo_order().unwrap().into_iter())
        .filter(|&id| matches!(g.node(id).op, Op::Conv(_)))
        .count();
    assert_eq!(convs, 1, "the Conv stays a node");
}

// ---- ops decomposed at import ----

/// A rank-0 i64 initializer.
fn i64_scalar(name: &str, v: i64) -> TensorProto {
    TensorProto {
        dims: vec![],
        ..i64_tensor(name, &[v])
    }
}

/// The single hint of an import that fails with one unsupported op.
fn unsupported_hint(m: &ModelProto, op: &str) -> String {
    let e = err(m);
    let OnnxError::Unsupported(list) = &e else {
        panic!("{e:?}")
    };
    assert_eq!(list.len(), 1, "{e}");
    assert_eq!(list[0].op_type, op, "{e}");
    list[0].hint.clone()
}

#[test]
fn data_dependent_shapes_are_unsupported_with_a_reason() {
    // Range over run-time bounds: its length would depend on the data.
    let m = model(
        vec![node("Range", "r", &["a", "b", "c"], &["y"])],
        vec![
            f32_input("a", &[]),
            f32_input("b", &[]),
            f32_input("c", &[]),
        ],
        &["y"],
        vec![],
    );
    assert!(unsupported_hint(&m, "Range").contains("constant start, limit and delta"));
    // (NonZero, Compress, TopK, NonMaxSuppression and Unique of run-time
    // data import at their bound: docs/bounded.md.)
    // Split sizes given as a run-time input.
    let mut split = node("Split", "s", &["x", "sizes"], &["a", "b"]);
    split.attribute.push(attr_i("axis", 0));
    let mut sizes = value_info("sizes", 7, &[D::K(2)]);
    sizes.name = "sizes".into();
    let m = model(
        vec![split],
        vec![f32_input("x", &[4]), sizes],
        &["a", "b"],
        vec![],
    );
    assert!(unsupported_hint(&m, "Split").contains("compile-time constant"));
}

#[test]
fn long_axes_are_refused_by_the_quadratic_decompositions() {
    // TopK and CumSum build n² tables; an axis of 8192 is refused, not
    // turned into a 256 MB intermediate.
    let m = model(
        vec![node("TopK", "t", &["x", "k"], &["v", "i"])],
        vec![f32_input("x", &[8192])],
        &["v", "i"],
        vec![i64_tensor("k", &[5])],
    );
    assert!(unsupported_hint(&m, "TopK").contains("too large"));
    let m = model(
        vec![node("CumSum", "c", &["x", "axis"], &["y"])],
        vec![f32_input("x", &[8192])],
        &["y"],
        vec![i64_scalar("axis", 0)],
    );
    assert!(unsupported_hint(&m, "CumSum").contains("too large"));
}

#[test]
fn constant_nonzero_and_range_fold_at_import() {
    let cast = |name: &str, i: &str, o: &str| {
        let mut n = node("Cast", name, &[i], &[o]);
        n.attribute.push(attr_i("to", 1));
        n
    };
    let m = model(
        vec![
            node("NonZero", "nz", &["c"], &["idx"]),
            node("Range", "r", &["s", "l", "d"], &["ramp"]),
            cast("cast", "idx", "idx_f"),
            cast("cast2", "ramp", "ramp_f"),
            node("Add", "add", &["x", "idx_f"], &["y"]),
            node("Add", "add2", &["x2", "ramp_f"], &["z"]),
        ],
        vec![f32_input("x", &[2, 2]), f32_input("x2", &[3])],
        &["y", "z"],
        vec![
            f32_tensor("c", &[2, 2], &[0.0, 1.5, -2.0, 0.0]),
            i64_scalar("s", 10),
            i64_scalar("l", 1),
            i64_scalar("d", -4),
        ],
    );
    let g = import_model(&m, None, &ImportOptions::default()).unwrap();
    // Both fold: the graph holds only the two additions.
    let computing = g
        .node_ids()
        .filter(|&id| !matches!(g.node(id).op, Op::Constant(_) | Op::Input { .. }))
        .count();
    assert_eq!(computing, 2);
    let x = kiln_ir::Tensor::new([2, 2], Data::F32(vec![0.0; 4])).unwrap();
    let x2 = kiln_ir::Tensor::new([3], Data::F32(vec![0.5; 3])).unwrap();
    let out = kiln_ir::eval::eval_graph(&g, &[x, x2]).unwrap();
    // NonZero of [[0, 1.5], [-2, 0]] is [[0, 1], [1, 0]]; Range(10, 1, -4)
    // is [10, 6, 2].
    assert_eq!(out[0].to_f64_vec(), vec![0.0, 1.0, 1.0, 0.0]);
    assert_eq!(out[1].to_f64_vec(), vec![10.5, 6.5, 2.5]);
}

/// An RNN over `steps` time steps of batch `batch` (hidden size 1), its
/// weights graph inputs so that only declared shapes matter.
fn rnn_model(steps: i64, batch: i64) -> ModelProto {
    let mut n = node("RNN", "rnn", &["x", "w", "r"], &["y"]);
    n.attribute.push(attr_i("hidden_size", 1));
    model(
        vec![n],
        vec![
            f32_input("x", &[steps, batch, 1]),
            f32_input("w", &[1, 1, 1]),
            f32_input("r", &[1, 1, 1]),
        ],
        &["y"],
        vec![],
    )
}

#[test]
fn recurrences_too_long_to_unroll_are_refused_before_allocating() {
    // Found by the fuzz smoke run: 2^32 steps allocated 34 GB.
    let e = err(&rnn_model(1 << 32, 1));
    assert!(matches!(e, OnnxError::Unsupported(_)), "{e:?}");
    assert!(e.to_string().contains("4294967296 time steps"), "{e}");
    let e = err(&rnn_model(2, 1 << 40));
    assert!(matches!(e, OnnxError::TooLarge { .. }), "{e:?}");
    import_model(&rnn_model(3, 2), None, &ImportOptions::default()).expect("a short RNN imports");
}

// ---- control flow ----

fn attr_g(name: &str, g: GraphProto) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: AttributeType::Graph as i32,
        g: Some(g),
        ..Default::default()
    }
}

/// A subgraph: `nodes` reading `inputs` (and outer names), giving `outputs`.
fn subgraph(
    name: &str,
    nodes: Vec<NodeProto>,
    inputs: Vec<ValueInfoProto>,
    outputs: &[&str],
) -> GraphProto {
    GraphProto {
        name: name.into(),
        node: nodes,
        input: inputs,
        output: outputs
            .iter()
            .map(|o| ValueInfoProto {
                name: o.to_string(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

fn bool_scalar(name: &str, v: bool) -> TensorProto {
    TensorProto {
        name: name.into(),
        data_type: 9,
        raw_data: vec![u8::from(v)],
        ..Default::default()
    }
}

fn ops_of(g: &kiln_ir::Graph) -> Vec<String> {
    g.node_ids()
        .filter(|&id| !matches!(g.node(id).op, Op::Constant(_) | Op::Input { .. }))
        .map(|id| format!("{:?}", g.node(id).op))
        .collect()
}

fn f32s(v: &[f32]) -> kiln_ir::Tensor {
    kiln_ir::Tensor::new([v.len()], Data::F32(v.to_vec())).unwrap()
}

/// `y = If(c) then Relu(x) else Neg(x)`; then `z = y + h` where `h` is an
/// outer value the then-branch shadows with a name of its own.
fn if_model(cond: Option<bool>) -> ModelProto {
    let then_g = subgraph(
        "then",
        vec![
            node("Relu", "r", &["x"], &["h"]),
            node("Identity", "i", &["h"], &["t"]),
        ],
        vec![],
        &["t"],
    );
    let else_g = subgraph(
        "else",
        vec![node("Neg", "n", &["x"], &["e"])],
        vec![],
        &["e"],
    );
    let mut iff = node("If", "if", &["c"], &["y"]);
    iff.attribute.push(attr_g("then_branch", then_g));
    iff.attribute.push(attr_g("else_branch", else_g));
    let mut inputs = vec![f32_input("x", &[3])];
    let mut inits = vec![];
    match cond {
        Some(c) => inits.push(bool_scalar("c", c)),
        None => inputs.push(value_info("c", 9, &[])),
    }
    model(
        vec![
            node("Sigmoid", "h", &["x"], &["h"]),
            iff,
            node("Add", "z", &["y", "h"], &["z"]),
        ],
        inputs,
        &["z"],
        inits,
    )
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

fn assert_close(a: &[f64], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    for (x, y) in a.iter().zip(b) {
        assert!((x - *y as f64).abs() < 1e-5, "{a:?} vs {b:?}");
    }
}

#[test]
fn constant_condition_if_imports_only_the_taken_branch() {
    let x = [-1.0f32, 0.5, 2.0];
    for (c, want_op, other_op) in [(true, "Relu", "Neg"), (false, "Neg", "Relu")] {
        let g = import_model(&if_model(Some(c)), None, &ImportOptions::default()).unwrap();
        let ops = ops_of(&g).join(" ");
        assert!(ops.contains(want_op), "{c}: {ops}");
        assert!(!ops.contains(other_op), "{c}: {ops}");
        assert!(!ops.contains("Where"), "{c}: {ops}");
        let out = kiln_ir::eval::eval_graph(&g, &[f32s(&x)]).unwrap();
        // The outer `h` (a Sigmoid) is read after the If, not the
        // branch's own `h`.
        let want: Vec<f32> = x
            .iter()
            .map(|&v| if c { v.max(0.0) } else { -v } + sigmoid(v))
            .collect();
        assert_close(&out[0].to_f64_vec(), &want);
    }
}

#[test]
fn runtime_condition_if_selects_with_where() {
    let g = import_model(&if_model(None), None, &ImportOptions::default()).unwrap();
    let ops = ops_of(&g).join(" ");
    assert!(ops.contains("Where"), "{ops}");
    let x = [-1.0f32, 0.5, 2.0];
    for c in [true, false] {
        let ct = kiln_ir::Tensor::new([], Data::Bool(vec![c])).unwrap();
        let out = kiln_ir::eval::eval_graph(&g, &[f32s(&x), ct]).unwrap();
        let want: Vec<f32> = x
            .iter()
            .map(|&v| if c { v.max(0.0) } else { -v } + sigmoid(v))
            .collect();
        assert_close(&out[0].to_f64_vec(), &want);
    }
}

/// An import that follows a path of run-time decisions
/// (`ImportOptions::branches`): it stops at a decision the path gives no
/// value for, takes only the branch a value names, and with
/// `condition_of` gives the condition alone as its one bool output.
#[test]
fn runtime_condition_if_on_a_path_imports_one_branch() {
    let on_path = |taken: &[(&str, bool)], condition_of: Option<&str>| ImportOptions {
        branches: Some(kiln_onnx::Branches {
            taken: taken.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            condition_of: condition_of.map(str::to_string),
            max_trip_count: 4,
        }),
        ..ImportOptions::default()
    };
    match import_model(&if_model(None), None, &on_path(&[], None)) {
        Err(OnnxError::Undecided { key, what }) => {
            assert_eq!(key, "if");
            assert!(what.contains("If 'if'"), "{what}");
        }
        other => panic!("{:?}", other.map(|g| ops_of(&g))),
    }
    let x = [-1.0f32, 0.5, 2.0];
    for (c, want_op, other_op) in [(true, "Relu", "Neg"), (false, "Neg", "Relu")] {
        let g = import_model(&if_model(None), None, &on_path(&[("if", c)], None)).unwrap();
        let ops = ops_of(&g).join(" ");
        assert!(
            ops.contains(want_op) && !ops.contains(other_op),
            "{c}: {ops}"
        );
        assert!(!ops.contains("Where"), "{c}: {ops}");
        let ct = kiln_ir::Tensor::new([], Data::Bool(vec![!c])).unwrap();
        // The path's branch runs whatever the condition says: the runtime
        // picks the path.
        let out = kiln_ir::eval::eval_graph(&g, &[f32s(&x), ct]).unwrap();
        let want: Vec<f32> = x
            .iter()
            .map(|&v| if c { v.max(0.0) } else { -v } + sigmoid(v))
            .collect();
        assert_close(&out[0].to_f64_vec(), &want);
    }
    let g = import_model(&if_model(None), None, &on_path(&[], Some("if"))).unwrap();
    assert_eq!(g.outputs().len(), 1);
    assert_eq!(g.outputs()[0].0, kiln_onnx::CONDITION_OUTPUT);
    for c in [true, false] {
        let ct = kiln_ir::Tensor::new([], Data::Bool(vec![c])).unwrap();
        let out = kiln_ir::eval::eval_graph(&g, &[f32s(&x), ct]).unwrap();
        assert_eq!(out[0].dtype(), DType::Bool);
        assert_eq!(out[0].to_f64_vec(), vec![f64::from(u8::from(c))]);
    }
}

#[test]
fn runtime_condition_if_with_differing_branch_shapes_is_unsupported() {
    let mut m = if_model(None);
    let g = m.graph.as_mut().unwrap();
    // The else branch now gives x concatenated with itself: [6], not [3].
    let else_g = subgraph(
        "else",
        vec![{
            let mut n = node("Concat", "cat", &["x", "x"], &["e"]);
            n.attribute.push(attr_i("axis", 0));
            n
        }],
        vec![],
        &["e"],
    );
    g.node[1].attribute[1] = attr_g("else_branch", else_g);
    g.node.truncate(2);
    g.output[0].name = "y".into();
    let hint = unsupported_hint(&m, "If");
    assert!(hint.contains("If 'if'"), "{hint}");
    assert!(hint.contains("[3]") && hint.contains("[6]"), "{hint}");
    // With a constant condition only the taken branch counts.
    g_set_cond(&mut m, false);
    import_model(&m, None, &ImportOptions::default()).expect("one branch imports");
}

/// Makes the If's condition the constant `c`.
fn g_set_cond(m: &mut ModelProto, c: bool) {
    let g = m.graph.as_mut().unwrap();
    g.input.retain(|i| i.name != "c");
    g.initializer.push(bool_scalar("c", c));
}

/// `Loop(M, cond, y)` whose body is `y_out = y_in * two + float(i)`, scan
/// output `y_out`, and `cond_out = i < stop`. The body's carried input is
/// named `y` like the outer graph input it shadows; the outer `y` is added
/// to the final value after the loop.
fn loop_model(m: Option<i64>, cond: Option<bool>, stop: i64) -> ModelProto {
    let mut cast = node("Cast", "cast", &["i"], &["i_f"]);
    cast.attribute.push(attr_i("to", 1));
    let body = subgraph(
        "body",
        vec![
            node("Less", "less", &["i", "stop"], &["cond_out"]),
            node("Mul", "mul", &["y", "two"], &["y2"]),
            cast,
            node("Add", "add", &["y2", "i_f"], &["y_out"]),
            node("Identity", "id", &["y_out"], &["scan"]),
        ],
        vec![
            value_info("i", 7, &[]),
            value_info("cond_in", 9, &[]),
            f32_input("y", &[2]),
        ],
        &["cond_out", "y_out", "scan"],
    );
    let mut lp = node(
        "Loop",
        "loop",
        &[
            if m.is_some() { "M" } else { "" },
            if cond.is_some() { "cond" } else { "" },
            "y",
        ],
        &["final", "stacked"],
    );
    lp.attribute.push(attr_g("body", body));
    let mut inits = vec![f32_tensor("two", &[], &[2.0]), i64_scalar("stop", stop)];
    if let Some(m) = m {
        inits.push(i64_scalar("M", m));
    }
    if let Some(c) = cond {
        inits.push(bool_scalar("cond", c));
    }
    model(
        vec![lp, node("Add", "after", &["final", "y"], &["z"])],
        vec![f32_input("y", &[2])],
        &["z", "stacked"],
        inits,
    )
}

/// The loop of [`loop_model`] run directly: (z, stacked values).
fn loop_reference(y0: [f32; 2], iterations: usize) -> (Vec<f32>, Vec<f32>) {
    let mut y = y0;
    let mut stacked = Vec::new();
    for i in 0..iterations {
        y = [y[0] * 2.0 + i as f32, y[1] * 2.0 + i as f32];
        stacked.extend(y);
    }
    (vec![y[0] + y0[0], y[1] + y0[1]], stacked)
}

#[test]
fn static_loop_unrolls_and_matches_a_reference() {
    let y0 = [0.5f32, -3.0];
    // A for loop (M = 4, no condition), a while loop (stops once i < 2 is
    // false, after 3 iterations, before M = 100), and a loop whose initial
    // condition is false (no iteration, no scan output: only `final`).
    for (m, cond, iterations) in [(Some(4), None, 4), (Some(100), Some(true), 3)] {
        let g = import_model(&loop_model(m, cond, 2), None, &ImportOptions::default())
            .unwrap_or_else(|e| panic!("{m:?} {cond:?}: {e}"));
        assert!(!ops_of(&g).join(" ").contains("Loop"));
        let out = kiln_ir::eval::eval_graph(&g, &[f32s(&y0)]).unwrap();
        let (z, stacked) = loop_reference(y0, iterations);
        assert_close(&out[0].to_f64_vec(), &z);
        assert_eq!(out[1].shape().as_slice(), &[iterations, 2]);
        assert_close(&out[1].to_f64_vec(), &stacked);
    }
}

#[test]
fn loops_too_long_to_unroll_are_refused_before_allocating() {
    // 2^40 iterations: refused before the body is imported once.
    let e = err(&loop_model(Some(1 << 40), None, 0));
    assert!(matches!(e, OnnxError::Unsupported(_)), "{e:?}");
    assert!(e.to_string().contains("1099511627776 iterations"), "{e}");
    // A while loop whose condition stays true stops at the limit.
    let e = err(&loop_model(None, Some(true), i64::MAX));
    assert!(e.to_string().contains("4097 iterations"), "{e}");
    // 4000 iterations of a 300-node body exceed the unrolled-node limit.
    let mut m = loop_model(Some(4000), None, 0);
    let body = m.graph.as_mut().unwrap().node[0].attribute[0]
        .g
        .as_mut()
        .unwrap();
    for k in 0..300 {
        let prev = if k == 0 {
            "scan".to_string()
        } else {
            format!("pad{}", k - 1)
        };
        body.node.push(node(
            "Identity",
            &format!("pad{k}"),
            &[&prev],
            &[&format!("pad{k}")],
        ));
    }
    let e = err(&m);
    assert!(e.to_string().contains("unrolled nodes"), "{e}");
    // Constants a body re-creates in every iteration are charged to the
    // generated-constant budget up front.
    let mut m = loop_model(Some(100), None, 0);
    let body = m.graph.as_mut().unwrap().node[0].attribute[0]
        .g
        .as_mut()
        .unwrap();
    let mut k = node("Constant", "k", &[], &["k"]);
    k.attribute.push(AttributeProto {
        name: "value".into(),
        r#type: AttributeType::Tensor as i32,
        t: Some(f32_tensor("k", &[1000], &[1.0; 1000])),
        ..Default::default()
    });
    body.node.push(k);
    let opts = ImportOptions {
        max_generated_bytes: 100_000,
        ..ImportOptions::default()
    };
    let e = import_model(&m, None, &opts).expect_err("over the budget");
    assert!(matches!(e, OnnxError::TooLarge { .. }), "{e:?}");
    let m = loop_model(Some(3), None, 0);
    import_model(&m, None, &opts).expect("a short loop fits");
}

#[test]
fn runtime_trip_counts_and_conditions_are_unsupported_naming_the_node() {
    let mut m = loop_model(Some(4), None, 0);
    let g = m.graph.as_mut().unwrap();
    g.initializer.retain(|t| t.name != "M");
    g.input.push(value_info("M", 7, &[]));
    let e = err(&m);
    let OnnxError::Unsupported(list) = &e else {
        panic!("{e:?}")
    };
    assert_eq!(list[0].node_name, "loop", "{e}");
    assert!(list[0].hint.contains("trip count"), "{e}");
    assert!(list[0].hint.contains("run time"), "{e}");
    // The trip count is the graph input M: binding it would let the loop
    // import.
    assert_eq!(list[0].bindable_inputs, vec!["M".to_string()], "{e}");
    // A condition the body computes from run-time data.
    let mut m = loop_model(Some(4), Some(true), 0);
    let body = m.graph.as_mut().unwrap().node[0].attribute[0]
        .g
        .as_mut()
        .unwrap();
    body.node[0] = node("Less", "less", &["y", "two"], &["lt"]);
    body.node.push({
        let mut n = node("Cast", "lt_f", &["lt"], &["lt_f"]);
        n.attribute.push(attr_i("to", 1));
        n
    });
    body.node.push({
        let mut n = node("ReduceMin", "all", &["lt_f"], &["all"]);
        n.attribute.push(attr_i("keepdims", 0));
        n
    });
    body.node.push({
        let mut n = node("Cast", "cond_out", &["all"], &["cond_out"]);
        n.attribute.push(attr_i("to", 9));
        n
    });
    let hint = unsupported_hint(&m, "Loop");
    assert!(hint.contains("computes its condition"), "{hint}");
}

#[test]
fn unsupported_ops_inside_subgraphs_are_reported_and_control_flow_is_not() {
    let mut m = if_model(None);
    let g = m.graph.as_mut().unwrap();
    g.node[1].attribute[1].g.as_mut().unwrap().node[0].op_type = "Frobnicate".into();
    let e = err(&m);
    let OnnxError::Unsupported(list) = &e else {
        panic!("{e:?}")
    };
    assert_eq!(list.len(), 1, "{e}");
    assert_eq!(list[0].op_type, "Frobnicate", "{e}");
    assert_eq!(list[0].node_name, "if/else_branch/n", "{e}");
    let report = kiln_onnx::preflight(&if_model(None), None, &ImportOptions::default()).unwrap();
    assert!(report.unsupported.is_empty(), "{report:?}");
}

/// A `Loop` named `name` over the carried value `y` with trip count `m`
/// (an outer name) and body `nodes` (reading `i` and `y_in`, giving
/// `y_out`).
fn simple_loop(name: &str, m: &str, nodes: Vec<NodeProto>, y: &str, out: &str) -> NodeProto {
    let body = subgraph(
        &format!("{name}_body"),
        nodes,
        vec![
            value_info("i", 7, &[]),
            value_info("c", 9, &[]),
            f32_input("y_in", &[2]),
        ],
        &["c", "y_out"],
    );
    let mut lp = node("Loop", name, &[m, "", y], &[out]);
    lp.attribute.push(attr_g("body", body));
    lp
}

#[test]
fn control_flow_nests() {
    // for i in 0..5: y = if i < 2 { y + 1 } else { y * 2 }, the If's
    // condition folding in each iteration.
    let then_g = subgraph(
        "then",
        vec![node("Add", "inc", &["y_in", "one"], &["t"])],
        vec![],
        &["t"],
    );
    let else_g = subgraph(
        "else",
        vec![node("Mul", "dbl", &["y_in", "two"], &["e"])],
        vec![],
        &["e"],
    );
    let mut iff = node("If", "pick", &["early"], &["y_out"]);
    iff.attribute.push(attr_g("then_branch", then_g));
    iff.attribute.push(attr_g("else_branch", else_g));
    let lp = simple_loop(
        "outer",
        "M",
        vec![node("Less", "less", &["i", "stop"], &["early"]), iff],
        "y",
        "z",
    );
    let m = model(
        vec![lp],
        vec![f32_input("y", &[2])],
        &["z"],
        vec![
            i64_scalar("M", 5),
            i64_scalar("stop", 2),
            f32_tensor("one", &[], &[1.0]),
            f32_tensor("two", &[], &[2.0]),
        ],
    );
    let g = import_model(&m, None, &ImportOptions::default()).unwrap();
    let ops = ops_of(&g).join(" ");
    assert!(!ops.contains("Where"), "every condition folds: {ops}");
    let y0 = [1.5f32, -2.0];
    let out = kiln_ir::eval::eval_graph(&g, &[f32s(&y0)]).unwrap();
    let mut want = y0;
    for i in 0..5 {
        for v in &mut want {
            *v = if i < 2 { *v + 1.0 } else { *v * 2.0 };
        }
    }
    assert_close(&out[0].to_f64_vec(), &want);
}

#[test]
fn nested_loops_of_empty_bodies_are_bounded() {
    // 4096 × 4096 copies of a body with no nodes: each copy counts, so
    // the import stops at the unrolled-node limit instead of creating 16M
    // iterations.
    let inner = simple_loop(
        "inner",
        "M",
        vec![node("Identity", "pass", &["y_in"], &["y_out"])],
        "y_in",
        "y_out",
    );
    let mut inner = inner;
    inner.attribute[0].g.as_mut().unwrap().node.clear();
    inner.attribute[0].g.as_mut().unwrap().output[1].name = "y_in".into();
    let outer = simple_loop("outer", "M", vec![inner], "y", "z");
    let m = model(
        vec![outer],
        vec![f32_input("y", &[2])],
        &["z"],
        vec![i64_scalar("M", 4096)],
    );
    let e = err(&m);
    assert!(e.to_string().contains("unrolled nodes"), "{e}");
}

#[test]
fn body_initializers_are_decoded_once_and_nested_constants_charged_per_copy() {
    // for i in 0..3: y = y + w, with w an initializer of the body.
    let mut lp = simple_loop(
        "lp",
        "M",
        vec![node("Add", "add", &["y_in", "w"], &["y_out"])],
        "y",
        "z",
    );
    let body = lp.attribute[0].g.as_mut().unwrap();
    body.initializer.push(f32_tensor("w", &[2], &[0.25, -1.0]));
    let m = model(
        vec![lp],
        vec![f32_input("y", &[2])],
        &["z"],
        vec![i64_scalar("M", 3)],
    );
    let g = import_model(&m, None, &ImportOptions::default()).unwrap();
    let copies = g
        .node_ids()
        .filter(|&id| g.node(id).name.ends_with("/w"))
        .count();
    assert_eq!(copies, 1, "one constant node for w");
    let out = kiln_ir::eval::eval_graph(&g, &[f32s(&[1.0, 2.0])]).unwrap();
    assert_close(&out[0].to_f64_vec(), &[1.75, -1.0]);

    // An inner loop of 2 iterations whose body holds a 4000-byte Constant,
    // in an outer loop of 10: 19 copies re-create it (76000 bytes), more
    // than a budget of 50000 bytes.
    let mut k = node("Constant", "k", &[], &["k"]);
    k.attribute.push(AttributeProto {
        name: "value".into(),
        r#type: AttributeType::Tensor as i32,
        t: Some(f32_tensor("k", &[1000], &[1.0; 1000])),
        ..Default::default()
    });
    let inner = simple_loop(
        "inner",
        "M2",
        vec![k, node("Identity", "id", &["y_in"], &["y_out"])],
        "y_in",
        "y_out",
    );
    let outer = simple_loop("outer", "M", vec![inner], "y", "z");
    let m = model(
        vec![outer],
        vec![f32_input("y", &[2])],
        &["z"],
        vec![i64_scalar("M", 10), i64_scalar("M2", 2)],
    );
    let opts = ImportOptions {
        max_generated_bytes: 50_000,
        ..ImportOptions::default()
    };
    let e = import_model(&m, None, &opts).expect_err("over the budget");
    assert!(matches!(e, OnnxError::TooLarge { .. }), "{e:?}");
    let opts = ImportOptions {
        max_generated_bytes: 100_000,
        ..ImportOptions::default()
    };
    import_model(&m, None, &opts).expect("within the budget");
}

// ---- integer convolutions ----

fn attr_ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: AttributeType::Ints as i32,
        ints: v.to_vec(),
        ..Default::default()
    }
}

/// An 8-bit tensor: `elem` 2 (u8) or 3 (i8), the bytes as given.
fn byte_tensor(name: &str, elem: i32, dims: &[i64], v: &[u8]) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: elem,
        raw_data: v.to_vec(),
        ..Default::default()
    }
}

fn int_input(name: &str, elem: i32, dims: &[i64]) -> ValueInfoProto {
    value_info(
        name,
        elem,
        &dims.iter().map(|&d| D::K(d)).collect::<Vec<_>>(),
    )
}

/// `n` deterministic pseudo-random bytes.
fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut rng = kiln_test_kit::Rng::new(seed);
    (0..n).map(|_| (rng.next_u64() >> 56) as u8).collect()
}

/// The direct integer convolution of centered values: X `[n, c, h, w]`,
/// W `[m, c/group, kh, kw]`, pads `[top, left, bottom, right]` of zeros
/// (the zero point, once centered).
fn int_conv_reference(
    x: &[i64],
    xs: [usize; 4],
    w: &[i64],
    ws: [usize; 4],
    pads: [usize; 4],
    strides: [usize; 2],
    group: usize,
) -> Vec<i64> {
    let [n, c, h, wd] = xs;
    let [m, cg, kh, kw] = ws;
    assert_eq!(cg * group, c);
    let oh = (h + pads[0] + pads[2] - kh) / strides[0] + 1;
    let ow = (wd + pads[1] + pads[3] - kw) / strides[1] + 1;
    let mut y = Vec::new();
    for b in 0..n {
        for oc in 0..m {
            let g = oc / (m / group);
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut acc = 0i64;
                    for ic in 0..cg {
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let iy = (oy * strides[0] + ky) as i64 - pads[0] as i64;
                                let ix = (ox * strides[1] + kx) as i64 - pads[1] as i64;
                                if iy < 0 || ix < 0 || iy >= h as i64 || ix >= wd as i64 {
                                    continue;
                                }
                                let (iy, ix) = (iy as usize, ix as usize);
                                let xv = x[((b * c + g * cg + ic) * h + iy) * wd + ix];
                                let wv = w[((oc * cg + ic) * kh + ky) * kw + kx];
                                acc += xv * wv;
                            }
                        }
                    }
                    y.push(acc);
                }
            }
        }
    }
    y
}

/// The value of an 8-bit byte as `elem` (2: u8, 3: i8).
fn byte_value(elem: i32, b: u8) -> i64 {
    if elem == 3 {
        b as i8 as i64
    } else {
        b as i64
    }
}

fn byte_data(elem: i32, v: &[u8]) -> Data {
    if elem == 3 {
        Data::I8(v.iter().map(|&b| b as i8).collect())
    } else {
        Data::U8(v.to_vec())
    }
}

fn conv_count(g: &kiln_ir::Graph) -> usize {
    g.node_ids()
        .filter(|&id| matches!(g.node(id).op, Op::Conv(_)))
        .count()
}

/// One `ConvInteger` node on a graph input X and initializer W (with an
/// X zero point `xzp` and W zero points `wzp`, scalar when one entry) of
/// type `elem`; checks the imported graph's output (and its number of f32
/// convolutions) against the direct integer computation, and returns it.
#[allow(clippy::too_many_arguments)]
fn run_conv_integer(
    elem: i32,
    xs: [usize; 4],
    ws: [usize; 4],
    x: &[u8],
    w: &[u8],
    xzp: u8,
    wzp: &[u8],
    pads: [usize; 4],
    strides: [usize; 2],
    group: usize,
    convs: usize,
) -> Vec<i64> {
    let dims = |s: [usize; 4]| s.iter().map(|&d| d as i64).collect::<Vec<_>>();
    let mut n = node("ConvInteger", "ci", &["x", "w", "xzp", "wzp"], &["y"]);
    // ONNX pads: [top, left, bottom, right] for 2 spatial axes.
    n.attribute.push(attr_ints("pads", &pads.map(|p| p as i64)));
    n.attribute
        .push(attr_ints("strides", &strides.map(|s| s as i64)));
    n.attribute.push(attr_i("group", group as i64));
    let wzp_dims: Vec<i64> = if wzp.len() == 1 {
        vec![]
    } else {
        vec![wzp.len() as i64]
    };
    let m = model(
        vec![n],
        vec![int_input("x", elem, &dims(xs))],
        &["y"],
        vec![
            byte_tensor("w", elem, &dims(ws), w),
            byte_tensor("xzp", elem, &[], &[xzp]),
            byte_tensor("wzp", elem, &wzp_dims, wzp),
        ],
    );
    let g = import_model(&m, None, &ImportOptions::default()).unwrap();
    assert_eq!(conv_count(&g), convs, "{}", kiln_ir::text::print(&g));
    let xt = kiln_ir::Tensor::new(xs, byte_data(elem, x)).unwrap();
    let out = kiln_ir::eval::eval_graph(&g, &[xt]).unwrap();
    assert_eq!(out[0].dtype(), DType::I32);
    let xc: Vec<i64> = x
        .iter()
        .map(|&v| byte_value(elem, v) - byte_value(elem, xzp))
        .collect();
    let per_oc = ws[1] * ws[2] * ws[3];
    let wc: Vec<i64> = w
        .iter()
        .enumerate()
        .map(|(i, &v)| byte_value(elem, v) - byte_value(elem, wzp[(i / per_oc) % wzp.len()]))
        .collect();
    let want = int_conv_reference(&xc, xs, &wc, ws, pads, strides, group);
    assert_eq!(out[0].to_i64_vec(), want);
    want
}

#[test]
fn conv_integer_pads_with_the_zero_point_and_takes_per_channel_w_zero_points() {
    let (xs, ws) = ([1, 2, 5, 6], [3, 2, 3, 3]);
    let x = bytes(60, 1);
    let w = bytes(54, 2);
    // Asymmetric pads (top 1, left 2, bottom 0, right 1), strides (1, 2),
    // a zero point per output channel.
    run_conv_integer(
        2,
        xs,
        ws,
        &x,
        &w,
        7,
        &[0, 128, 255],
        [1, 2, 0, 1],
        [1, 2],
        1,
        1,
    );
    // i8, grouped: 2 groups of 1 input channel and 2 output channels.
    run_conv_integer(
        3,
        [1, 2, 5, 6],
        [4, 1, 3, 3],
        &x,
        &bytes(36, 3),
        0x85, // -123
        &[0x7f, 0x80, 0, 0xff],
        [1, 1, 1, 1],
        [1, 1],
        2,
        1,
    );
}

#[test]
fn conv_integer_with_a_large_window_sums_exact_channel_chunks() {
    // C·kH·kW = 24·5·5 = 600 terms of up to 255·255 per output: more than
    // 2^24, so the f32 conv runs on chunks of 10 channels (250 terms):
    // 3 convolutions whose i32 results are added.
    let (xs, ws) = ([1, 24, 6, 7], [2, 24, 5, 5]);
    let mut x = bytes(24 * 42, 4);
    // The first half of the channels at the extreme, so that the sums
    // reach well past 2^24.
    x[..12 * 42].fill(255);
    let mut w = bytes(2 * 600, 5);
    w[..600].fill(0);
    let y = run_conv_integer(2, xs, ws, &x, &w, 0, &[255], [2, 2, 2, 2], [1, 1], 1, 3);
    assert!(y.iter().any(|v| v.abs() > 1 << 24), "{y:?}");
    // Grouped: 2 groups of 24 channels, chunked within each group (i8,
    // centered values up to 255 in magnitude).
    let (xs, ws) = ([1, 48, 5, 5], [4, 24, 5, 5]);
    let mut x = bytes(48 * 25, 6);
    x[..24 * 25].fill(0x7f);
    let mut w = bytes(4 * 600, 7);
    w[..600].fill(0x80);
    let y = run_conv_integer(3, xs, ws, &x, &w, 0x80, &[0x7f], [1, 0, 1, 0], [1, 1], 2, 3);
    assert!(y.iter().any(|v| v.abs() > 1 << 24), "{y:?}");
}

#[test]
fn conv_integer_windows_too_large_for_exact_f32_sums_use_the_integer_op() {
    // A depthwise 17x17 window: 289 taps of one channel, more than 258,
    // which no channel chunking keeps exact in f32: no float conv, the
    // IR's conv_integer instead (exact i32), with padding and zero points.
    let (xs, ws) = ([1, 2, 20, 20], [2, 1, 17, 17]);
    let x = bytes(800, 8);
    let w = bytes(578, 9);
    let y = run_conv_integer(2, xs, ws, &x, &w, 5, &[3, 250], [1, 2, 1, 0], [2, 1], 2, 0);
    assert!(!y.is_empty());
}

#[test]
fn qlinear_conv_adds_the_bias_and_rescales_per_channel() {
    // 1-D: X u8 [1, 3, 10], W u8 [2, 3, 3], pads 1, stride 2; bias and
    // w_scale per output channel; i8 output. The scales are powers of two,
    // so the rescaled values are exact and ties round half to even.
    let x = bytes(30, 8);
    let w = bytes(18, 9);
    let (xzp, wzp, yzp) = (3u8, [100u8, 140], -5i8);
    let bias = [1000i32, -7];
    let (x_scale, w_scale, y_scale) = (0.5f32, [0.25f32, 0.125], 2.0f32);
    let mut n = node(
        "QLinearConv",
        "qc",
        &["x", "xs", "xzp", "w", "ws", "wzp", "ys", "yzp", "b"],
        &["y"],
    );
    n.attribute.push(attr_ints("pads", &[1, 1]));
    n.attribute.push(attr_ints("strides", &[2]));
    let m = model(
        vec![n],
        vec![int_input("x", 2, &[1, 3, 10])],
        &["y"],
        vec![
            f32_tensor("xs", &[], &[x_scale]),
            byte_tensor("xzp", 2, &[], &[xzp]),
            byte_tensor("w", 2, &[2, 3, 3], &w),
            f32_tensor("ws", &[2], &w_scale),
            byte_tensor("wzp", 2, &[2], &wzp),
            f32_tensor("ys", &[], &[y_scale]),
            byte_tensor("yzp", 3, &[], &[yzp as u8]),
            TensorProto {
                name: "b".into(),
                dims: vec![2],
                data_type: 6,
                raw_data: bias.iter().flat_map(|b| b.to_le_bytes()).collect(),
                ..Default::default()
            },
        ],
    );
    let g = import_model(&m, None, &ImportOptions::default()).unwrap();
    let xt = kiln_ir::Tensor::new([1, 3, 10], Data::U8(x.clone())).unwrap();
    let out = kiln_ir::eval::eval_graph(&g, &[xt]).unwrap();
    assert_eq!(out[0].dtype(), DType::I8);
    assert_eq!(out[0].shape().as_slice(), &[1, 2, 5]);
    let xc: Vec<i64> = x.iter().map(|&v| v as i64 - xzp as i64).collect();
    let wc: Vec<i64> = w
        .iter()
        .enumerate()
        .map(|(i, &v)| v as i64 - wzp[i / 9] as i64)
        .collect();
    let acc = int_conv_reference(
        &xc,
        [1, 3, 1, 10],
        &wc,
        [2, 3, 1, 3],
        [0, 1, 0, 1],
        [1, 2],
        1,
    );
    let want: Vec<i64> = acc
        .iter()
        .enumerate()
        .map(|(i, &a)| {
            let oc = i / 5;
            let f = x_scale as f64 * w_scale[oc] as f64 / y_scale as f64;
            let v = ((a + bias[oc] as i64) as f64 * f + yzp as f64).round_ties_even();
            v.clamp(-128.0, 127.0) as i64
        })
        .collect();
    assert_eq!(out[0].to_i64_vec(), want, "accumulators {acc:?}");
}

/// Ops that build constants from model-declared sizes (a window's size, a
/// DFT length, a state or time ramp from a declared shape) charge them to
/// the generated-constant budget before allocating, so a few hundred bytes
/// of model cannot make the importer allocate terabytes.
#[test]
fn constants_sized_by_the_model_are_refused_before_allocating() {
    let huge = 1i64 << 40;
    let mut causal = node("CausalConvWithState", "causal", &["x", "w"], &["y", "s"]);
    causal.attribute.clear();
    let mut reverse = node("ReverseSequence", "reverse", &["x", "lens"], &["y"]);
    reverse.attribute = vec![attr_i("batch_axis", 1), attr_i("time_axis", 0)];
    let mut dft = node("DFT", "dft", &["x", "n"], &["y"]);
    dft.attribute = vec![attr_i("axis", 1)];
    let cases = [
        model(
            vec![causal],
            vec![
                f32_input("x", &[1 << 20, 1 << 20, 4]),
                f32_input("w", &[1 << 20, 1, 3]),
            ],
            &["y", "s"],
            vec![],
        ),
        model(
            vec![node("HannWindow", "window", &["size"], &["y"])],
            vec![],
            &["y"],
            vec![i64_tensor("size", &[huge])],
        ),
        model(
            vec![dft],
            vec![f32_input("x", &[1, 4, 1])],
            &["y"],
            vec![i64_tensor("n", &[1 << 31])],
        ),
        model(
            vec![reverse],
            vec![
                f32_input("x", &[huge, 2]),
                value_info("lens", 7, &[D::K(2)]),
            ],
            &["y"],
            vec![],
        ),
    ];
    for (i, m) in cases.iter().enumerate() {
        let e = import_model(m, None, &ImportOptions::default()).expect_err("refused");
        assert!(matches!(e, OnnxError::TooLarge { .. }), "case {i}: {e:?}");
        assert!(
            prost::Message::encoded_len(m) < 1024,
            "case {i}: a small model"
        );
    }
}

// ---- tree ensembles ----

fn attr_t(name: &str, t: TensorProto) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: AttributeType::Tensor as i32,
        t: Some(t),
        ..Default::default()
    }
}

/// One `TreeEnsemble` (ai.onnx.ml 5) tree over two features: node 0 asks
/// `x0 <= 0.5` (true: node 1, false: leaf 2); node 1 asks `x1 < 2`
/// (leaves 0 and 1, or back to node 0 when `cyclic`).
fn tree_model(cyclic: bool) -> ModelProto {
    tree_model_with_rows(cyclic, 4)
}

fn tree_model_with_rows(cyclic: bool, rows: i64) -> ModelProto {
    let mut n = node("TreeEnsemble", "forest", &["x"], &["y"]);
    n.domain = "ai.onnx.ml".into();
    let mut modes = f32_tensor("modes", &[2], &[]);
    modes.data_type = 2;
    modes.raw_data = vec![0, 1];
    n.attribute = vec![
        attr_t("nodes_modes", modes),
        attr_t("nodes_splits", f32_tensor("splits", &[2], &[0.5, 2.0])),
        attr_ints("nodes_featureids", &[0, 1]),
        attr_ints("nodes_truenodeids", &[1, 0]),
        attr_ints("nodes_trueleafs", &[0, 1]),
        attr_ints("nodes_falsenodeids", &[2, if cyclic { 0 } else { 1 }]),
        attr_ints("nodes_falseleafs", &[1, i64::from(!cyclic)]),
        attr_t("leaf_weights", f32_tensor("w", &[3], &[10.0, 20.0, 30.0])),
        attr_ints("leaf_targetids", &[0, 0, 0]),
        attr_ints("tree_roots", &[0]),
        attr_i("n_targets", 1),
    ];
    let mut m = model(vec![n], vec![f32_input("x", &[rows, 2])], &["y"], vec![]);
    m.opset_import.push(OperatorSetIdProto {
        domain: "ai.onnx.ml".into(),
        version: 5,
    });
    m
}

#[test]
fn tree_ensembles_walk_every_row_to_its_leaf() {
    let g = import_model(&tree_model(false), None, &ImportOptions::default()).unwrap();
    let rows = [0.0, 1.0, 0.0, 3.0, 0.5, 2.0, 0.7, 0.0];
    let x = kiln_ir::Tensor::new([4, 2], Data::F32(rows.to_vec())).unwrap();
    let y = kiln_ir::eval::eval_graph(&g, &[x]).unwrap();
    assert_eq!(y[0].to_f32_vec(), vec![10.0, 20.0, 20.0, 30.0]);
    let e = err(&tree_model(true));
    assert!(e.to_string().contains("its own descendant"), "{e}");
    // A huge batch (found by the fuzz smoke test: the start indices were
    // one constant per row and tree) is refused before anything that
    // large is allocated.
    let e = err(&tree_model_with_rows(false, 1 << 40));
    assert!(matches!(e, OnnxError::TooLarge { .. }), "{e:?}");
}

#[test]
fn folding_a_huge_non_max_suppression_is_refused() {
    let n = 40_000;
    let boxes = f32_tensor("boxes", &[1, n, 4], &vec![0.0; n as usize * 4]);
    let scores = f32_tensor("scores", &[1, 1, n], &vec![0.5; n as usize]);
    let limit = i64_tensor("limit", &[n]);
    let m = model(
        vec![node(
            "NonMaxSuppression",
            "nms",
            &["boxes", "scores", "limit"],
            &["selected"],
        )],
        vec![],
        &["selected"],
        vec![boxes, scores, limit],
    );
    let e = err(&m);
    assert!(e.to_string().contains("overlap tests"), "{e}");
}

/// Scan at opset 8 (batch axis first, `directions`): a running sum per
/// batch item, read backwards, with the partial sums as the scan output.
#[test]
fn scan_opset8_runs_each_batch_item() {
    let body = subgraph(
        "body",
        vec![
            node("Add", "sum", &["s", "x_t"], &["s_out"]),
            node("Identity", "copy", &["s_out"], &["y"]),
        ],
        vec![f32_input("s", &[2]), f32_input("x_t", &[2])],
        &["s_out", "y"],
    );
    let mut scan = node("Scan", "scan", &["", "init", "x"], &["final", "ys"]);
    scan.attribute = vec![
        attr_i("num_scan_inputs", 1),
        attr_ints("directions", &[1]),
        attr_g("body", body),
    ];
    let mut m = model(
        vec![scan],
        vec![f32_input("init", &[2, 2]), f32_input("x", &[2, 3, 2])],
        &["final", "ys"],
        vec![],
    );
    m.opset_import[0].version = 8;
    let g = import_model(&m, None, &ImportOptions::default()).unwrap();
    let init = kiln_ir::Tensor::new([2, 2], Data::F32(vec![0.0, 0.0, 10.0, 20.0])).unwrap();
    let x: Vec<f32> = (1..=12).map(|v| v as f32).collect();
    let x = kiln_ir::Tensor::new([2, 3, 2], Data::F32(x)).unwrap();
    let out = kiln_ir::eval::eval_graph(&g, &[init, x]).unwrap();
    // Item 0 reads rows [5, 6], [3, 4], [1, 2]; item 1 [11, 12], [9, 10], [7, 8].
    assert_eq!(out[0].to_f32_vec(), vec![9.0, 12.0, 37.0, 50.0]);
    assert_eq!(
        out[1].to_f32_vec(),
        vec![5.0, 6.0, 8.0, 10.0, 9.0, 12.0, 21.0, 32.0, 30.0, 42.0, 37.0, 50.0]
    );
}
