//! Arithmetic cost of a graph, for throughput figures (`kiln inspect
//! --json`, the benchmark harness's GFLOP/s).

use crate::{Graph, Op};

/// Floating-point operations of the dense ops (a multiply-add counts 2):
/// MatMul and Gemm `2·M·N·K` per product, Attention `2·M·N·(K + D)` per
/// head, Conv `2·N·Cout·OH·OW·(Cin/group)·
/// KH·KW`. Elementwise, pooling and normalization work is left out: it is
/// bandwidth-bound and small beside the dense ops in the models this is
/// for, and counting it would make "GFLOP/s" mean something else.
pub fn dense_flops(graph: &Graph) -> u64 {
    graph.node_ids().map(|id| node_dense_flops(graph, id)).sum()
}

/// The [`dense_flops`] of node `id` alone; a fused kernel counts its dense
/// head.
pub fn node_dense_flops(graph: &Graph, id: crate::NodeId) -> u64 {
    let node = graph.node(id);
    let inputs = graph.inputs_of(id);
    let input = |i: usize| graph.node(inputs[i]).ty.shape.clone();
    let out: u64 = node.ty.shape.iter().map(|&d| d as u64).product();
    let op = match &node.op {
        Op::Fused(k) => match k.head() {
            Some(h) => h.op.op(),
            None => return 0,
        },
        op => op.clone(),
    };
    match &op {
        Op::MatMul | Op::MatMulInteger => {
            let a = input(0);
            2 * out * a.last().copied().unwrap_or(1) as u64
        }
        Op::Attention { .. } => {
            // Q @ Kt, then P @ V: 2·N·(K + D) per row of the result.
            let (kt, v) = (input(1), input(2));
            let (k, n) = (kt[kt.len() - 2], kt[kt.len() - 1]);
            let d = v.last().copied().unwrap_or(1).max(1);
            2 * out / d as u64 * (n * (k + d)) as u64
        }
        Op::Gemm { trans_a, .. } => {
            let a = input(0);
            let k = if *trans_a { a[0] } else { a[1] };
            2 * out * k as u64
        }
        Op::Conv(_) | Op::ConvInteger(_) => {
            // Weights [Cout, Cin/group, KH, KW]: every output element is
            // one dot product of that window.
            let w = input(1);
            let window: u64 = w[1..].iter().map(|&d| d as u64).product();
            2 * out * window
        }
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::dense_flops;
    use crate::{text, Graph};

    fn graph(src: &str) -> Graph {
        text::parse(src).unwrap()
    }

    #[test]
    fn counts_matmul_gemm_and_conv() {
        let g = graph(
            "graph(%x: f32[2,3,4], %y: f32[4,5], %a: f32[6,7], %b: f32[8,7], %i: f32[1,4,10,10], %w: f32[8,2,3,3]) {
  %m: f32[2,3,5] = matmul(%x, %y)
  %g: f32[6,8] = gemm(%a, %b) {trans_b=true}
  %c: f32[1,8,10,10] = conv(%i, %w) {pads=[1,1,1,1], group=2}
  return %m \"m\", %g \"g\", %c \"c\"
}",
        );
        let want = 2 * 30 * 4 + 2 * 48 * 7 + 2 * 800 * 18;
        assert_eq!(dense_flops(&g), want);
    }
}
