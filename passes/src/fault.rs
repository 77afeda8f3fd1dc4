//! A seeded bug for testing the tools that find bugs (`kiln debug
//! --bisect-passes`, and its test in `compiler/cli/tests/debug.rs`): in
//! debug builds only, `KILN_BREAK_PASS=NAME` makes the pass NAME scale the
//! largest f32 constant of the graph (a layer's weights) by 1.5 after it
//! runs. Release builds have none of this.

use kiln_ir::{DType, Data, Graph, Tensor};

/// The environment variable that names the pass to break.
pub const BREAK_PASS: &str = "KILN_BREAK_PASS";

/// Breaks `graph` when `pass` is the one [`BREAK_PASS`] names.
pub(crate) fn after(pass: &str, graph: &mut Graph) {
    if std::env::var(BREAK_PASS).ok().as_deref() != Some(pass) {
        return;
    }
    let largest = (graph.node_ids())
        .filter_map(|id| graph.constant(id).map(|t| (id, t)))
        .filter(|(_, t)| t.dtype() == DType::F32)
        .max_by_key(|(id, t)| (t.len(), std::cmp::Reverse(*id)));
    let Some((id, t)) = largest else {
        return;
    };
    let scaled = Data::from_f64s(DType::F32, t.to_f64_vec().into_iter().map(|x| x * 1.5));
    let scaled = Tensor::new(t.shape(), scaled).expect("same element count");
    let name = format!("{}/broken", graph.node(id).name);
    let new = graph.add_const(name, scaled);
    graph
        .replace_all_uses(id, new)
        .expect("a constant of the same type");
}
