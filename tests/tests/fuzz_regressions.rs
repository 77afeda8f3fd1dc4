//! Inputs found by fuzzing (`tests/tests/fuzz_smoke.rs`, `fuzz/`) that
//! crashed or hung Kiln, kept as regression tests: each must now give a
//! typed error or a correct result, quickly.

use kiln_driver::{compile_bytes, DriverError};
use kiln_onnx::pb::attribute_proto::AttributeType;
use kiln_onnx::pb::tensor_shape_proto::{dimension, Dimension};
use kiln_onnx::pb::{
    type_proto, AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto,
    TensorShapeProto, TypeProto, ValueInfoProto,
};
use kiln_tests::{fuzz, repo_root};
use prost::Message;
use std::time::{Duration, Instant};

fn f32_value(name: &str, dims: &[i64]) -> ValueInfoProto {
    let dim = (dims.iter())
        .map(|&d| Dimension {
            denotation: String::new(),
            value: Some(dimension::Value::DimValue(d)),
        })
        .collect();
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            denotation: String::new(),
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: 1,
                shape: Some(TensorShapeProto { dim }),
            })),
        }),
        doc_string: String::new(),
    }
}

/// `y = Conv(x, w)` with both operands graph inputs of the given shapes.
fn conv_model(x: &[i64], w: &[i64]) -> Vec<u8> {
    conv_model_with(x, w, vec![])
}

fn conv_model_with(x: &[i64], w: &[i64], attribute: Vec<AttributeProto>) -> Vec<u8> {
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 13,
        }],
        graph: Some(GraphProto {
            name: "g".into(),
            node: vec![NodeProto {
                op_type: "Conv".into(),
                name: "conv".into(),
                input: vec!["x".into(), "w".into()],
                output: vec!["y".into()],
                attribute,
                ..Default::default()
            }],
            input: vec![f32_value("x", x), f32_value("w", w)],
            output: vec![ValueInfoProto {
                name: "y".into(),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

fn compile_err(bytes: &[u8]) -> (DriverError, Duration) {
    let start = Instant::now();
    let err = compile_bytes(bytes, None, &fuzz::fuzz_compile_options())
        .err()
        .expect("must be refused");
    (err, start.elapsed())
}

/// Found by the smoke run (onnx_compile, a conformance Conv with a mutated
/// weight shape): the CPU target split windows into segments in
/// O(outputs × taps) and unrolled every tap, so a large run-time kernel
/// hung code generation.
#[test]
fn conv_with_a_huge_kernel_is_refused_quickly() {
    let (err, took) = compile_err(&conv_model(&[1, 1, 256, 256], &[1, 1, 128, 128]));
    assert!(matches!(err, DriverError::Cpu(_)), "{err:?}");
    assert!(err.to_string().contains("16384 taps"), "{err}");
    assert!(took < Duration::from_secs(10), "{took:?}");

    let (err, took) = compile_err(&conv_model(&[1, 1, 1, 1 << 22], &[1, 1, 1, 8]));
    assert!(err.to_string().contains("output positions"), "{err}");
    assert!(took < Duration::from_secs(10), "{took:?}");
}

/// The same hang with shapes past the arena limit: refused before code
/// generation, which specializes on the shapes.
#[test]
fn values_past_the_arena_limit_are_refused_before_code_generation() {
    let (err, took) = compile_err(&conv_model(&[1, 1, 1 << 20, 1 << 20], &[1, 1, 3, 3]));
    assert!(matches!(err, DriverError::ArenaTooLarge { .. }), "{err:?}");
    assert!(took < Duration::from_secs(10), "{took:?}");
}

/// Found while bounding folds: fold-constants removed an input read twice
/// (MatMul(a, a)) once per read and indexed the removed node.
#[test]
fn folding_a_node_that_reads_one_constant_twice() {
    let text = "graph(%0: f32[2,2] \"x\") {
  %1: f32[2,2] = const dense<[1.0, 2.0, 3.0, 4.0]>
  %2: f32[2,2] = matmul(%1, %1)
  %3: f32[2,2] = add(%0, %2)
  return %3 \"y\"
}
";
    let mut g = kiln_ir::text::parse(text).unwrap();
    let pm = kiln_passes::PassManager::for_level(2).unwrap();
    pm.run(&mut g, &Default::default()).unwrap();
    let printed = kiln_ir::text::print(&g);
    // [[1,2],[3,4]]² = [[7,10],[15,22]], folded into one constant.
    assert!(
        printed.contains("dense<[7.0, 10.0, 15.0, 22.0]>"),
        "{printed}"
    );
    assert!(!printed.contains("matmul"), "{printed}");
}

/// Found by the smoke run (onnx_compile, Conv and MaxPool with a mutated
/// `strides` attribute of 2^40 and more): the lowering multiplied the
/// stride by the row size in `i64` and overflowed.
#[test]
fn huge_strides_are_refused_not_overflowed() {
    let strides = AttributeProto {
        name: "strides".into(),
        r#type: AttributeType::Ints as i32,
        ints: vec![1 << 62, 1],
        ..Default::default()
    };
    let (err, _) = compile_err(&conv_model_with(
        &[1, 1, 8, 8],
        &[1, 1, 3, 3],
        vec![strides],
    ));
    assert!(matches!(err, DriverError::Cpu(_)), "{err:?}");
    assert!(
        err.to_string().contains("exceeds the CPU target's limit"),
        "{err}"
    );
}

/// Found by the smoke run (onnx_compile, a ConvInteger with a mutated
/// `group` of 2^62): the channel check multiplied the group by C/group and
/// overflowed. A group that cannot divide W's output channels is now an
/// attribute error, before any product.
#[test]
fn a_group_larger_than_the_output_channels_is_an_attribute_error() {
    let group = AttributeProto {
        name: "group".into(),
        r#type: AttributeType::Int as i32,
        i: 1 << 62,
        ..Default::default()
    };
    let (err, _) = compile_err(&conv_model_with(&[1, 4, 8, 8], &[4, 1, 3, 3], vec![group]));
    assert!(matches!(err, DriverError::Onnx(_)), "{err:?}");
    assert!(err.to_string().contains("cannot divide"), "{err}");
}

/// Every input the fuzzers saved (`tests/fuzz-regressions/<target>-<hash>`,
/// copied from `target/fuzz-smoke-crashes/` or `fuzz/artifacts/`) runs
/// through its target again without a panic, quickly.
#[test]
fn saved_fuzz_inputs_replay_without_panics() {
    let dir = repo_root().join("tests/fuzz-regressions");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(!files.is_empty());
    for path in files {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let body: fn(&[u8]) -> bool = match name.split('-').next() {
            Some("onnx_compile") => fuzz::onnx_compile,
            Some("artifact_load") => fuzz::artifact_load,
            Some("ir_text") => fuzz::ir_text,
            _ => panic!("{name}: not named <target>-<hash>"),
        };
        let start = Instant::now();
        body(&std::fs::read(&path).unwrap());
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{name}: {:?}",
            start.elapsed()
        );
    }
}
