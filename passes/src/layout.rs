//! `layout`: one activation layout between the layout-sensitive ops, with
//! the conversions at the graph's boundaries.
//!
//! Kiln's kernels compute convolutions, pools and resizes on NCHW (the
//! ONNX layout; the CPU target packs the weights into the panels its
//! microkernels read at lowering, `docs/targets-cpu.md`). Models exported
//! from NHWC frameworks (TensorFlow through tf2onnx, Keras, channels-last
//! PyTorch) wrap every such op in a pair of Transposes and run the ops
//! between them (bias adds, activations, residual adds, scalings) in NHWC:
//!
//! ```text
//! conv → transpose(0,2,3,1) → add(b) → relu → transpose(0,3,1,2) → conv
//! ```
//!
//! Every Transpose is a full copy of its tensor, and one between a conv and
//! its bias add also keeps `fold-batchnorm` from folding the add into the
//! conv. This pass moves a Transpose below the elementwise op it feeds when
//! that op's other operands are constants (permuted at compile time to
//! match), single-element tensors, or Transposes with the same permutation:
//! `op(transpose(x, p), c) = transpose(op(x, c'), p)`. Pushed down a chain,
//! a Transpose meets the inverse one of the next conv and both vanish
//! (`simplify`, which this pass runs on what it changed); one that meets no
//! inverse stops at the first op that is not elementwise, or at a graph
//! output: the boundary.
//!
//! A Transpose with several users stays where it is (moving it would copy
//! it into every branch). Elementwise ops are Unary, Binary, Compare,
//! Logical, Not, Bitwise, BitwiseNot, Where and Cast.
//!
//! A Col2Im that tiles its image exactly (a ConvTranspose whose kernel
//! equals its stride, as in segmentation and detection heads) is a
//! permutation too and moves the same way, past ops whose constants are
//! per channel (repeated for each channel's block elements):
//!
//! ```text
//! matmul(Wᵀ, x) → col2im → add(bias) → mul(bn) → add(bn) → relu
//!   ⇒ matmul(Wᵀ, x) → add(bias') → mul(bn') → add(bn') → relu → col2im
//! ```
//!
//! so the epilogue joins the MatMul's store loop (`fuse`) instead of being
//! a pass of its own over the upsampled image.
//!
//! A Reshape moves too, past ops whose other operands are single values,
//! full-size constants (reshaped back) or the same Reshape of a value of the
//! same shape, so an activation after a view joins the producer's store
//! loop (YOLO's heads: `conv → reshape [1, 3, 85, h, w] → transpose →
//! sigmoid` runs the sigmoid in the conv's store loop).

use crate::pass::{Pass, PassError, PassStats};
use crate::simplify::{remove_dead, Simplify};
use kiln_ir::{Col2Im, Graph, Ints, IrError, NodeId, Op, Tensor};

/// The pass (see the module documentation).
#[derive(Clone, Copy, Debug, Default)]
pub struct Layout;

fn fail(source: IrError) -> PassError {
    PassError::Failed {
        pass: "layout",
        source,
    }
}

/// Sweeps of push-then-collapse before giving up (each sweep moves every
/// movable Transpose at least one op down).
const MAX_SWEEPS: usize = 32;

fn is_elementwise(op: &Op) -> bool {
    matches!(
        op,
        Op::Unary(_)
            | Op::Binary(_)
            | Op::Compare(_)
            | Op::Logical(_)
            | Op::Not
            | Op::Bitwise(_)
            | Op::BitwiseNot
            | Op::Where
            | Op::Cast { .. }
    )
}

/// Whether node `id` has exactly one use, by one op (a graph output is a
/// use too).
fn single_use(graph: &Graph, id: NodeId) -> bool {
    graph.users_of(id).len() == 1 && graph.outputs().iter().all(|&(_, o)| o != id)
}

/// The permutation undoing `perm`.
fn inverse(perm: &[usize]) -> Ints {
    let mut inv: Ints = perm.iter().map(|_| 0).collect();
    for (i, &p) in perm.iter().enumerate() {
        inv[p] = i;
    }
    inv
}

/// A data movement that elementwise ops commute with: a Transpose, or a
/// Col2Im that tiles its image exactly (a ConvTranspose whose kernel
/// equals its stride), which puts every input element at one output
/// pixel and writes every pixel once.
#[derive(Clone, PartialEq)]
enum Movement {
    Transpose(Ints),
    Col2Im(Col2Im),
    Reshape(Ints),
}

impl Movement {
    fn of(op: &Op) -> Option<Movement> {
        match op {
            Op::Transpose { perm } => Some(Movement::Transpose(perm.clone())),
            Op::Col2Im(c) if c.tiles_exactly() => Some(Movement::Col2Im(c.clone())),
            Op::Reshape { shape } => Some(Movement::Reshape(shape.clone())),
            _ => None,
        }
    }

    fn op(&self) -> Op {
        match self {
            Movement::Transpose(perm) => Op::Transpose { perm: perm.clone() },
            Movement::Col2Im(c) => Op::Col2Im(c.clone()),
            Movement::Reshape(shape) => Op::Reshape {
                shape: shape.clone(),
            },
        }
    }

    /// Constant `t`, an operand of an elementwise op of output shape `out`
    /// on the moved values, as the operand of the op on the unmoved ones:
    /// a Transpose's constants are permuted back; a Col2Im's must be one
    /// value or one per channel (`[1, C, 1, 1]` after broadcasting), and
    /// repeat each value for the channel's block elements (`[1, C·kh·kw,
    /// 1]`); a Reshape's must be full-size, reshaped to `unmoved`.
    fn unmoved_constant(&self, t: &Tensor, out: &[usize], unmoved: &[usize]) -> Option<Tensor> {
        let rank = out.len();
        if t.shape().len() > rank {
            return None;
        }
        let mut full = vec![1; rank - t.shape().len()];
        full.extend_from_slice(t.shape());
        let padded = t.reshaped(&full)?;
        match self {
            Movement::Transpose(perm) => {
                let back = Op::Transpose {
                    perm: inverse(perm),
                };
                kiln_ir::eval::eval(&back, &[&padded]).ok()
            }
            Movement::Reshape(_) => (t.shape().as_slice() == out)
                .then(|| t.reshaped(unmoved))
                .flatten(),
            Movement::Col2Im(c) => {
                let channels = out[1];
                if full == [1, 1, 1, 1] {
                    return padded.reshaped([1, 1, 1]);
                }
                if full != [1, channels, 1, 1] {
                    return None;
                }
                let block = c.block[0] * c.block[1];
                let column = padded.reshaped([1, channels, 1])?;
                let expand = Op::Expand {
                    shape: [1, channels, block].into_iter().collect(),
                };
                let repeated = kiln_ir::eval::eval(&expand, &[&column]).ok()?;
                repeated.reshaped([1, channels * block, 1])
            }
        }
    }
}

/// How one operand of an elementwise op is rewritten when the movements
/// feeding it move below it.
enum Operand {
    /// A movement like the one that moves: its input.
    Unmoved(NodeId),
    /// A constant in the unmoved layout.
    Rearranged(Tensor),
    /// A single-element tensor: broadcasts the same way in any layout.
    AsIs(NodeId),
}

impl Layout {
    /// The movement and rewritten operands when the movements feeding `id`
    /// can move below it.
    fn plan(graph: &Graph, id: NodeId) -> Option<(Movement, Vec<Operand>)> {
        let node = graph.node(id);
        if !is_elementwise(&node.op) {
            return None;
        }
        let out = &node.ty.shape;
        let inputs = graph.inputs_of(id);
        // A Transpose of the op's rank (numpy broadcasting commutes with
        // the permutation), a Col2Im or Reshape of the op's own shape (its
        // input may have another rank, so it must not be broadcast).
        let moving = |i: NodeId| {
            let input = graph.node(i);
            let fits = |m: &Movement| match m {
                Movement::Transpose(perm) => perm.len() == out.len(),
                Movement::Col2Im(_) | Movement::Reshape(_) => input.ty.shape == *out,
            };
            Movement::of(&input.op).filter(|m| fits(m) && single_use(graph, i))
        };
        let (movement, source) = inputs
            .iter()
            .find_map(|&i| Some((moving(i)?, graph.inputs_of(i)[0])))?;
        let unmoved_shape = graph.node(source).ty.shape.clone();
        // Two Reshapes to one shape may come from different shapes.
        let same_source = |i: NodeId| graph.node(graph.inputs_of(i)[0]).ty.shape == unmoved_shape;
        // A single-element operand must not widen the op on the unmoved
        // values (a Col2Im's input has rank 3, its output 4).
        let unmoved_rank = graph.node(source).ty.shape.len();
        let mut operands = Vec::with_capacity(inputs.len());
        for &i in &inputs {
            let input = graph.node(i);
            let operand = match &input.op {
                _ if moving(i).as_ref() == Some(&movement) && same_source(i) => {
                    Operand::Unmoved(graph.inputs_of(i)[0])
                }
                _ if input.ty.num_elements() == 1 && input.ty.shape.len() <= unmoved_rank => {
                    Operand::AsIs(i)
                }
                Op::Constant(t) => {
                    Operand::Rearranged(movement.unmoved_constant(t, out, &unmoved_shape)?)
                }
                _ => return None,
            };
            operands.push(operand);
        }
        Some((movement, operands))
    }

    /// One sweep in topological order; returns how many ops the Transposes
    /// moved below.
    fn sweep(graph: &mut Graph, stats: &mut PassStats) -> Result<usize, PassError> {
        let mut moved = 0;
        for id in graph.topo_order().map_err(fail)? {
            if !graph.contains(id) {
                continue;
            }
            let Some((movement, operands)) = Layout::plan(graph, id) else {
                continue;
            };
            let name = graph.node(id).name.clone();
            let old_inputs = graph.inputs_of(id);
            let mut inputs = Vec::with_capacity(operands.len());
            for (k, operand) in operands.into_iter().enumerate() {
                inputs.push(match operand {
                    Operand::Unmoved(x) | Operand::AsIs(x) => x,
                    Operand::Rearranged(t) => {
                        stats.added += 1;
                        graph.add_const(format!("{name}/layout_operand{k}"), t)
                    }
                });
            }
            let op = graph.node(id).op.clone();
            let inner = graph.add_node(op, &inputs, name.clone()).map_err(fail)?;
            let outer = (graph.add_node(movement.op(), &[inner], format!("{name}/layout")))
                .map_err(fail)?;
            stats.added += 2;
            graph.replace_all_uses(id, outer).map_err(fail)?;
            let mut dead = vec![id];
            dead.extend(old_inputs);
            stats.removed += remove_dead(graph, dead);
            stats.rewritten += 1;
            moved += 1;
        }
        Ok(moved)
    }
}

impl Pass for Layout {
    fn name(&self) -> &'static str {
        "layout"
    }

    fn run(&self, graph: &mut Graph) -> Result<PassStats, PassError> {
        let mut stats = PassStats::default();
        for _ in 0..MAX_SWEEPS {
            if Layout::sweep(graph, &mut stats)? == 0 {
                break;
            }
            // Collapse the Transposes that met (inverse pairs vanish).
            stats += Simplify::default().run(graph)?;
        }
        Ok(stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::eval::eval_graph;

    fn transposes(g: &Graph) -> usize {
        g.node_ids()
            .filter(|&id| matches!(g.node(id).op, Op::Transpose { .. }))
            .count()
    }

    /// Runs the pass and checks the graph computes what it did before on
    /// `inputs`.
    fn run_and_compare(text: &str, inputs: &[Tensor]) -> Graph {
        let before = kiln_ir::text::parse(text).unwrap();
        let mut after = before.clone();
        Layout.run(&mut after).unwrap();
        kiln_ir::verify::verify(&after).unwrap();
        let (x, y) = (
            eval_graph(&before, inputs).unwrap(),
            eval_graph(&after, inputs).unwrap(),
        );
        assert_eq!(x, y, "{}", kiln_ir::text::print(&after));
        after
    }

    fn ramp(shape: &[usize]) -> Tensor {
        let n: usize = shape.iter().product();
        let v = (0..n)
            .map(|i| ((i * 7919) % 23) as f32 / 4.0 - 2.5)
            .collect();
        Tensor::new(shape, kiln_ir::Data::F32(v)).unwrap()
    }

    #[test]
    fn an_nhwc_chain_between_convs_loses_its_transposes() {
        // conv → to NHWC → bias add (per channel, NHWC's last axis) →
        // relu → to NCHW → conv: the two Transposes cancel.
        let g = run_and_compare(
            "graph(%x: f32[1,2,4,5]) {
              %w: f32[3,2,1,1] = const dense<[1.0, -1.0, 0.5, 2.0, -0.25, 1.5]>
              %c: f32[1,3,4,5] = conv(%x, %w) {strides=[1,1], pads=[0,0,0,0], dilations=[1,1], group=1}
              %t: f32[1,4,5,3] = transpose(%c) {perm=[0,2,3,1]}
              %b: f32[3] = const dense<[0.5, -1.0, 2.0]>
              %a: f32[1,4,5,3] = add(%t, %b)
              %r: f32[1,4,5,3] = relu(%a)
              %u: f32[1,3,4,5] = transpose(%r) {perm=[0,3,1,2]}
              %w2: f32[2,3,1,1] = const dense<[1.0, 2.0, 3.0, -1.0, 0.5, 0.25]>
              %y: f32[1,2,4,5] = conv(%u, %w2) {strides=[1,1], pads=[0,0,0,0], dilations=[1,1], group=1}
              return %y
            }",
            &[ramp(&[1, 2, 4, 5])],
        );
        assert_eq!(transposes(&g), 0, "{}", kiln_ir::text::print(&g));
    }

    #[test]
    fn an_activation_after_a_reshaped_conv_moves_next_to_the_conv() {
        // YOLO's head: conv → reshape → transpose → sigmoid. The sigmoid
        // moves above both, onto the conv's output, where `fuse` puts it
        // in the store loop.
        let g = run_and_compare(
            "graph(%x: f32[1,2,2,3]) {
              %w: f32[6,2,1,1] = const dense<[1.0, -1.0, 0.5, 2.0, -0.25, 1.5, 1.0, 2.0, 3.0, -1.0, 0.5, 0.25]>
              %c: f32[1,6,2,3] = conv(%x, %w) {strides=[1,1], pads=[0,0,0,0], dilations=[1,1], group=1}
              %r: f32[1,2,3,2,3] = reshape(%c) {shape=[1,2,3,2,3]}
              %t: f32[1,2,2,3,3] = transpose(%r) {perm=[0,1,3,4,2]}
              %s: f32[1,2,2,3,3] = sigmoid(%t)
              %k: f32[1] = const dense<[0.5]>
              %y: f32[1,2,2,3,3] = mul(%s, %k)
              return %y
            }",
            &[ramp(&[1, 2, 2, 3])],
        );
        let text = kiln_ir::text::print(&g);
        let conv = g
            .node_ids()
            .find(|&id| matches!(g.node(id).op, Op::Conv(_)))
            .unwrap();
        let (user, _) = g.users_of(conv)[0];
        assert!(matches!(g.node(user).op, Op::Unary(_)), "{text}");
    }

    #[test]
    fn reshapes_of_different_shapes_stay_before_their_add() {
        // [2,3] and [3,2] both reshaped to [6]: adding them unmoved would
        // broadcast two other shapes.
        let g = run_and_compare(
            "graph(%a: f32[2,3], %b: f32[3,2]) {
              %p: f32[6] = reshape(%a) {shape=[6]}
              %q: f32[6] = reshape(%b) {shape=[6]}
              %y: f32[6] = add(%p, %q)
              return %y
            }",
            &[ramp(&[2, 3]), ramp(&[3, 2])],
        );
        let add = g
            .node_ids()
            .find(|&id| matches!(g.node(id).op, Op::Binary(_)))
            .unwrap();
        assert!(g
            .inputs_of(add)
            .iter()
            .all(|&i| matches!(g.node(i).op, Op::Reshape { .. })));
    }

    #[test]
    fn a_residual_add_of_two_nhwc_branches_moves_to_the_output() {
        // Two transposed branches meet in an add; the Transpose ends at the
        // graph output (the boundary), one instead of two.
        let g = run_and_compare(
            "graph(%x: f32[1,3,2,4], %y: f32[1,3,2,4]) {
              %tx: f32[1,2,4,3] = transpose(%x) {perm=[0,2,3,1]}
              %ty: f32[1,2,4,3] = transpose(%y) {perm=[0,2,3,1]}
              %s: f32[1,1,1,1] = const dense<[3.0]>
              %m: f32[1,2,4,3] = mul(%tx, %s)
              %a: f32[1,2,4,3] = add(%m, %ty)
              %z: f32[1,2,4,3] = sigmoid(%a)
              return %z
            }",
            &[ramp(&[1, 3, 2, 4]), ramp(&[1, 3, 2, 4])],
        );
        assert_eq!(transposes(&g), 1, "{}", kiln_ir::text::print(&g));
        let out = g.outputs()[0].1;
        assert!(matches!(g.node(out).op, Op::Transpose { .. }));
    }

    #[test]
    fn a_transpose_with_two_users_and_a_runtime_operand_stay() {
        let text = "graph(%x: f32[2,3], %v: f32[3,2]) {
              %t: f32[3,2] = transpose(%x) {perm=[1,0]}
              %a: f32[3,2] = add(%t, %v)
              %n: f32[3,2] = neg(%t)
              return %a, %n
            }";
        let g = run_and_compare(text, &[ramp(&[2, 3]), ramp(&[3, 2])]);
        assert_eq!(
            kiln_ir::text::print(&g),
            kiln_ir::text::print(&kiln_ir::text::parse(text).unwrap())
        );
    }
    fn col2ims(g: &Graph) -> Vec<NodeId> {
        (g.node_ids())
            .filter(|&id| matches!(g.node(id).op, Op::Col2Im(_)))
            .collect()
    }

    #[test]
    fn a_per_channel_epilogue_moves_above_an_exactly_tiling_col2im() {
        // A ConvTranspose with kernel = stride 2 (Cout 2) as imported, then
        // bias, batch-norm scale and shift, relu and a scalar bias: all
        // move onto the MatMul's [1, 2·4, 9] columns (each channel's
        // constant repeated for its 4 block elements); the Col2Im ends at
        // the output.
        let g = run_and_compare(
            "graph(%x: f32[1,3,9]) {
              %w: f32[8,3] = const dense<[1.0, -1.0, 0.5, 2.0, -0.25, 1.5, 0.75, -2.0, 1.25, 0.5, 0.5, -1.0, 3.0, 1.0, -0.5, 0.25, 2.0, -1.5, 1.0, 1.0, -0.75, 0.5, -0.25, 2.5]>
              %cols: f32[1,8,9] = matmul(%w, %x)
              %y: f32[1,2,6,6] = col2im(%cols) {grid=[3,3], image=[6,6], block=[2,2], strides=[2,2], dilations=[1,1], pads=[0,0]}
              %b: f32[1,2,1,1] = const dense<[0.5, -1.0]>
              %a: f32[1,2,6,6] = add(%y, %b)
              %s: f32[2,1,1] = const dense<[2.0, -0.5]>
              %m: f32[1,2,6,6] = mul(%a, %s)
              %r: f32[1,2,6,6] = relu(%m)
              %k: f32[1,1,1,1] = const dense<[0.25]>
              %z: f32[1,2,6,6] = add(%r, %k)
              return %z
            }",
            &[ramp(&[1, 3, 9])],
        );
        let c = col2ims(&g);
        assert_eq!(c.len(), 1, "{}", kiln_ir::text::print(&g));
        assert_eq!(g.outputs()[0].1, c[0], "{}", kiln_ir::text::print(&g));
    }

    #[test]
    fn a_col2im_that_adds_overlapping_blocks_or_a_spatial_constant_stays() {
        // Blocks of 2 at stride 3 leave pixels no block writes (an
        // epilogue must still reach them); and a constant that varies over
        // the image.
        for text in [
            "graph(%c: f32[1,4,4]) {
              %y: f32[1,1,5,5] = col2im(%c) {grid=[2,2], image=[5,5], block=[2,2], strides=[3,3], dilations=[1,1], pads=[0,0]}
              %r: f32[1,1,5,5] = relu(%y)
              return %r
            }",
            "graph(%c: f32[1,4,4]) {
              %y: f32[1,1,4,4] = col2im(%c) {grid=[2,2], image=[4,4], block=[2,2], strides=[2,2], dilations=[1,1], pads=[0,0]}
              %k: f32[1,1,1,4] = const dense<[1.0, 2.0, 3.0, 4.0]>
              %a: f32[1,1,4,4] = add(%y, %k)
              return %a
            }",
        ] {
            let g = run_and_compare(text, &[ramp(&[1, 4, 4])]);
            assert_eq!(
                kiln_ir::text::print(&g),
                kiln_ir::text::print(&kiln_ir::text::parse(text).unwrap())
            );
        }
    }
}
