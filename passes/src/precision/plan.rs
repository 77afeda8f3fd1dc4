//! Precision plan files: `kiln compile --emit-plan plan.json` writes the
//! final precision of every dense node with the reason and the measured
//! error; `--plan plan.json` applies one (a person may have edited it).
//!
//! A node is keyed by its ONNX name plus a structural key: a hash of its
//! op with attributes and the types of its operands (not the weight
//! values), so a plan survives re-exporting or retraining the same
//! architecture, and a plan for another model, or a stale entry, is an
//! error that names the node instead of a silently different build.
//!
//! The format is in `docs/precision.md`.

use super::report::AccuracyReport;
use super::types::{is_precision_layer, Decision, Precision};
use kiln_ir::{Graph, NodeId};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use thiserror::Error;

/// The format version written in `kiln_precision_plan`.
const FORMAT: u64 = 1;

/// A plan that does not fit the model, or does not parse.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum PlanError {
    /// Not a plan file of this format.
    #[error("not a Kiln precision plan: {0}")]
    Malformed(String),
    /// A dense node of the model has no entry.
    #[error(
        "the plan has no entry for dense node '{0}' (a plan for another model or an older export?)"
    )]
    Missing(String),
    /// An entry names no dense node of the model.
    #[error("stale plan entry '{0}': the model has no dense node of that name")]
    Stale(String),
    /// An entry's structural key differs from the node's.
    #[error("stale plan entry '{node}': its key {planned} does not match the node's {actual} (the op, its attributes or its operand types changed)")]
    KeyMismatch {
        /// The node.
        node: String,
        /// The key in the plan.
        planned: String,
        /// The node's key now.
        actual: String,
    },
}

/// One node's entry.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanEntry {
    /// ONNX node name.
    pub node: String,
    /// [`structural_key`] of the node.
    pub key: String,
    /// The precision it runs in.
    pub precision: Precision,
    /// Why (informative; not read back).
    pub reason: String,
    /// Measured relative L2 error of the node's output, if measured.
    pub rel_l2: Option<f64>,
    /// Measured cosine similarity, if measured.
    pub cosine: Option<f64>,
}

/// A whole plan: one entry per dense node, in graph order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PrecisionPlan {
    /// The entries.
    pub entries: Vec<PlanEntry>,
}

/// The structural key of node `id`: its IR op name, then an FNV-1a hash of
/// the op with its attributes and of its operands' element types and
/// shapes (not their values).
pub fn structural_key(graph: &Graph, id: NodeId) -> String {
    let node = graph.node(id);
    let mut text = format!("{:?}", node.op);
    for i in graph.inputs_of(id) {
        let ty = &graph.node(i).ty;
        let kind = if graph.constant(i).is_some() {
            "const"
        } else {
            "value"
        };
        text.push_str(&format!("|{kind} {ty}"));
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{}:{h:016x}", node.op.name())
}

/// The dense nodes a plan covers (those `assign-precision` decides), by
/// name.
pub(crate) fn dense_nodes(graph: &Graph) -> Result<BTreeMap<String, NodeId>, kiln_ir::IrError> {
    Ok(graph
        .topo_order()?
        .into_iter()
        .filter(|&id| is_precision_layer(&graph.node(id).op))
        .map(|id| (graph.node(id).name.clone(), id))
        .collect())
}

impl PrecisionPlan {
    /// The plan of a finished assignment: `graph` is the f32 graph it was
    /// decided on, `report` the measured errors (if any).
    pub fn from_decisions(
        graph: &Graph,
        decisions: &[Decision],
        report: Option<&AccuracyReport>,
    ) -> Result<PrecisionPlan, kiln_ir::IrError> {
        let dense = dense_nodes(graph)?;
        let entries = decisions
            .iter()
            .filter_map(|d| {
                let id = *dense.get(&d.node)?;
                let measured = report.and_then(|r| r.layers.iter().find(|l| l.node == d.node));
                Some(PlanEntry {
                    node: d.node.clone(),
                    key: structural_key(graph, id),
                    precision: d.precision,
                    reason: d.reason.to_string(),
                    rel_l2: measured.map(|l| l.rel_l2),
                    cosine: measured.map(|l| l.cosine),
                })
            })
            .collect();
        Ok(PrecisionPlan { entries })
    }

    /// The plan as pretty-printed JSON.
    pub fn to_json(&self) -> String {
        let nodes: Vec<Value> = self
            .entries
            .iter()
            .map(|e| {
                json!({"node": e.node, "key": e.key, "precision": e.precision.to_string(),
                       "reason": e.reason, "rel_l2": e.rel_l2, "cosine": e.cosine})
            })
            .collect();
        let v = json!({"kiln_precision_plan": FORMAT, "nodes": nodes});
        serde_json::to_string_pretty(&v).expect("a JSON value serializes")
    }

    /// Parses a plan written by [`PrecisionPlan::to_json`] (possibly
    /// edited: only `node`, `key` and `precision` are read).
    pub fn parse(text: &str) -> Result<PrecisionPlan, PlanError> {
        let bad = |m: String| PlanError::Malformed(m);
        let v: Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        match v.get("kiln_precision_plan").and_then(Value::as_u64) {
            Some(FORMAT) => {}
            Some(other) => {
                return Err(bad(format!(
                    "format version {other}, this Kiln reads {FORMAT}"
                )))
            }
            None => return Err(bad("no \"kiln_precision_plan\" version field".into())),
        }
        let nodes = v
            .get("nodes")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("no \"nodes\" array".into()))?;
        let mut seen = BTreeSet::new();
        let mut entries = Vec::with_capacity(nodes.len());
        for (i, n) in nodes.iter().enumerate() {
            let field = |name: &str| {
                n.get(name)
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(format!("nodes[{i}] has no string \"{name}\"")))
            };
            let node = field("node")?.to_string();
            if !seen.insert(node.clone()) {
                return Err(bad(format!("node '{node}' is listed twice")));
            }
            let precision: Precision = field("precision")?
                .parse()
                .map_err(|e| bad(format!("nodes[{i}] ('{node}'): {e}")))?;
            entries.push(PlanEntry {
                key: field("key")?.to_string(),
                reason: n.get("reason").and_then(Value::as_str).unwrap_or("").into(),
                rel_l2: n.get("rel_l2").and_then(Value::as_f64),
                cosine: n.get("cosine").and_then(Value::as_f64),
                node,
                precision,
            });
        }
        Ok(PrecisionPlan { entries })
    }

    /// The planned precision of every dense node of `graph`, checked:
    /// every dense node has an entry with its structural key, and every
    /// entry names a dense node.
    pub(crate) fn resolve(&self, graph: &Graph) -> Result<BTreeMap<NodeId, Precision>, PlanError> {
        let dense = dense_nodes(graph).map_err(|e| PlanError::Malformed(e.to_string()))?;
        let by_name: BTreeMap<&str, &PlanEntry> =
            self.entries.iter().map(|e| (e.node.as_str(), e)).collect();
        if let Some(e) = self.entries.iter().find(|e| !dense.contains_key(&e.node)) {
            return Err(PlanError::Stale(e.node.clone()));
        }
        let mut out = BTreeMap::new();
        for (name, &id) in &dense {
            let entry = by_name
                .get(name.as_str())
                .ok_or_else(|| PlanError::Missing(name.clone()))?;
            let actual = structural_key(graph, id);
            if entry.key != actual {
                return Err(PlanError::KeyMismatch {
                    node: name.clone(),
                    planned: entry.key.clone(),
                    actual,
                });
            }
            out.insert(id, entry.precision);
        }
        Ok(out)
    }
}
