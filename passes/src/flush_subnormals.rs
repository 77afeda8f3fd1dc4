//! `flush-subnormals`: float constants lose their subnormal values (to a
//! zero of the same sign).
//!
//! A subnormal weight changes a product by less than 1.2·10⁻³⁸ of the
//! activation it multiplies, far under what an f32 sum of normal terms can
//! hold, but every x86 multiply or FMA that reads or produces one takes a
//! microcode assist of about a hundred cycles. Trained models carry them:
//! PP-OCRv4 rec has 31,350 subnormal weights, most in its
//! squeeze-excitation 1×1 convs (12,970 of the 57,600 weights of
//! `conv2d_117`), which made those tiny kernels cost as much as the large
//! ones. TensorRT flushes them the same way. The pass runs after
//! `fold-batchnorm`, whose folded weights can be subnormal too. f16
//! constants are left alone: an f16 subnormal widens to a normal f32.

use crate::pass::{Pass, PassError, PassStats};
use half::bf16;
use kiln_ir::{Data, Graph, Op, Tensor};

/// See the module docs.
#[derive(Clone, Copy, Debug, Default)]
pub struct FlushSubnormals;

impl Pass for FlushSubnormals {
    fn name(&self) -> &'static str {
        "flush-subnormals"
    }

    fn run(&self, graph: &mut Graph) -> Result<PassStats, PassError> {
        let mut stats = PassStats::default();
        let constants: Vec<_> = graph
            .node_ids()
            .filter(|&id| matches!(graph.node(id).op, Op::Constant(_)))
            .collect();
        for id in constants {
            let Some(flushed) = graph.constant(id).and_then(flushed) else {
                continue;
            };
            let name = graph.node(id).name.clone();
            let new = graph.add_const(name, flushed);
            graph
                .replace_all_uses(id, new)
                .map_err(|source| PassError::Failed {
                    pass: "flush-subnormals",
                    source,
                })?;
            graph.remove_unused(id);
            stats.rewritten += 1;
        }
        Ok(stats)
    }
}

/// `t` with its subnormal values flushed, or `None` when it has none.
fn flushed(t: &Tensor) -> Option<Tensor> {
    fn flush<T: Copy>(v: &[T], subnormal: impl Fn(T) -> Option<T>) -> Option<Vec<T>> {
        let first = v.iter().position(|&x| subnormal(x).is_some())?;
        let mut out = v.to_vec();
        for x in &mut out[first..] {
            if let Some(zero) = subnormal(*x) {
                *x = zero;
            }
        }
        Some(out)
    }
    let data = match t.data() {
        Data::F32(v) => Data::F32(flush(v, |x: f32| {
            x.is_subnormal().then(|| 0f32.copysign(x))
        })?),
        Data::F64(v) => Data::F64(flush(v, |x: f64| {
            x.is_subnormal().then(|| 0f64.copysign(x))
        })?),
        Data::BF16(v) => Data::BF16(flush(v, |x: bf16| {
            let x = x.to_f32();
            x.is_subnormal().then(|| bf16::from_f32(0f32.copysign(x)))
        })?),
        _ => return None,
    };
    Tensor::new(t.shape(), data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::{BinaryOp, DType, ValueType};

    #[test]
    fn flushes_subnormal_constants_and_keeps_the_rest() {
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(DType::F32, [4]));
        let tiny = f32::MIN_POSITIVE / 4.0;
        let w = g.add_const(
            "w",
            Tensor::new([4], Data::F32(vec![tiny, -tiny, 1.5, f32::MIN_POSITIVE])).unwrap(),
        );
        let normal = g.add_const(
            "b",
            Tensor::new([4], Data::F32(vec![1.0, -2.0, 0.0, 3.0])).unwrap(),
        );
        let y = g
            .add_node(Op::Binary(BinaryOp::Mul), &[x, w], "mul")
            .unwrap();
        let y = g
            .add_node(Op::Binary(BinaryOp::Add), &[y, normal], "add")
            .unwrap();
        g.add_output("y", y);
        let stats = FlushSubnormals.run(&mut g).unwrap();
        assert_eq!(stats.rewritten, 1);
        let mul = g.inputs_of(g.outputs()[0].1)[0];
        let w = g.constant(g.inputs_of(mul)[1]).unwrap();
        assert_eq!(g.node(g.inputs_of(mul)[1]).name, "w");
        let got: Vec<u32> = w.to_f32_vec().iter().map(|v| v.to_bits()).collect();
        let want: Vec<u32> = [0.0, -0.0, 1.5, f32::MIN_POSITIVE]
            .iter()
            .map(|v: &f32| v.to_bits())
            .collect();
        assert_eq!(got, want);
        assert!(g.contains(normal), "a constant without subnormals stays");
        assert_eq!(FlushSubnormals.run(&mut g).unwrap().rewritten, 0);
    }
}
