//! A model summary that needs no bound dims (for `kiln inspect`).

use crate::tensor::{declared_bytes, dtype_from_onnx, onnx_dtype_name};
use std::collections::{BTreeMap, HashSet};
use tract_onnx::pb::tensor_shape_proto::dimension::Value as DimValue;
use tract_onnx::pb::type_proto::Value as TypeValue;
use tract_onnx::pb::{ModelProto, ValueInfoProto};

/// What `kiln inspect` shows about an ONNX model before import.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelSummary {
    /// `ModelProto.ir_version`.
    pub ir_version: i64,
    /// Imported opsets as (domain, version); the default domain is `ai.onnx`.
    pub opsets: Vec<(String, i64)>,
    /// Producer name and version.
    pub producer: String,
    /// Graph inputs that are not initializers.
    pub inputs: Vec<IoSummary>,
    /// Graph outputs.
    pub outputs: Vec<IoSummary>,
    /// Node count per op type (`domain:op_type` outside the default domain).
    pub op_histogram: BTreeMap<String, usize>,
    /// Number of initializers.
    pub initializer_count: usize,
    /// Their total declared size in bytes (saturating).
    pub initializer_bytes: u64,
}

/// One graph input or output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IoSummary {
    /// Value name.
    pub name: String,
    /// Element type: Kiln's name (`f32`) when supported, else ONNX's (`STRING`);
    /// `?` when the model declares none.
    pub dtype: String,
    /// Declared dims (empty when no shape is declared).
    pub dims: Vec<DimSummary>,
}

/// One declared dim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DimSummary {
    /// A fixed size.
    Known(usize),
    /// A named symbolic size (`batch`).
    Symbolic(String),
    /// Neither (no value, or a value <= 0).
    Unknown,
}

impl std::fmt::Display for DimSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DimSummary::Known(d) => write!(f, "{d}"),
            DimSummary::Symbolic(s) => f.write_str(s),
            DimSummary::Unknown => f.write_str("?"),
        }
    }
}

fn io_summary(v: &ValueInfoProto) -> IoSummary {
    let (dtype, dims) = match v.r#type.as_ref().and_then(|t| t.value.as_ref()) {
        Some(TypeValue::TensorType(t)) => {
            let dtype = match dtype_from_onnx(t.elem_type) {
                Some(d) => d.name().to_string(),
                None => onnx_dtype_name(t.elem_type),
            };
            let dims = t
                .shape
                .as_ref()
                .map(|s| {
                    s.dim
                        .iter()
                        .map(|d| match &d.value {
                            Some(DimValue::DimValue(v)) if *v > 0 => DimSummary::Known(*v as usize),
                            Some(DimValue::DimParam(p)) if !p.is_empty() => {
                                DimSummary::Symbolic(p.clone())
                            }
                            _ => DimSummary::Unknown,
                        })
                        .collect()
                })
                .unwrap_or_default();
            (dtype, dims)
        }
        None => ("?".to_string(), Vec::new()),
    };
    IoSummary {
        name: v.name.clone(),
        dtype,
        dims,
    }
}

/// Summarizes a model without importing it.
pub fn summarize(model: &ModelProto) -> ModelSummary {
    let default_graph = Default::default();
    let graph = model.graph.as_ref().unwrap_or(&default_graph);
    let init: HashSet<&str> = graph.initializer.iter().map(|t| t.name.as_str()).collect();
    let mut op_histogram = BTreeMap::new();
    for n in &graph.node {
        let key = if n.domain.is_empty() || n.domain == "ai.onnx" {
            n.op_type.clone()
        } else {
            format!("{}:{}", n.domain, n.op_type)
        };
        *op_histogram.entry(key).or_insert(0) += 1;
    }
    let producer = match (
        model.producer_name.as_str(),
        model.producer_version.as_str(),
    ) {
        (n, "") => n.to_string(),
        (n, v) => format!("{n} {v}"),
    };
    ModelSummary {
        ir_version: model.ir_version,
        opsets: model
            .opset_import
            .iter()
            .map(|o| {
                let d = if o.domain.is_empty() {
                    "ai.onnx"
                } else {
                    &o.domain
                };
                (d.to_string(), o.version)
            })
            .collect(),
        producer,
        inputs: graph
            .input
            .iter()
            .filter(|i| !init.contains(i.name.as_str()))
            .map(io_summary)
            .collect(),
        outputs: graph.output.iter().map(io_summary).collect(),
        op_histogram,
        initializer_count: graph.initializer.len(),
        initializer_bytes: graph
            .initializer
            .iter()
            .map(|t| declared_bytes(t).unwrap_or(0))
            .fold(0u64, |a, b| a.saturating_add(b)),
    }
}
