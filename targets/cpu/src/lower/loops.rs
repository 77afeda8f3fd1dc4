//! Loop construction. Every trip count is known at compile time, so loops
//! are bottom-tested (`do { body } while (i += step) < end`), a loop of one
//! iteration is straight-line code, and a loop of none emits nothing.
//! Loop-carried values (accumulators) are block parameters.

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::types::I64;
use cranelift_codegen::ir::{BlockArg, InstBuilder, Value};

use super::Kb;

/// A loop body with carried values: `(builder, induction var, carried) -> next carried`.
pub(crate) type CarryBody<'a> = dyn FnMut(&mut Kb, Value, &[Value]) -> Vec<Value> + 'a;

/// Runs `body(i, carried)` for `i = start, start + step, ... < end`
/// (`step > 0`), threading the carried values; returns their final values.
pub(crate) fn for_range_carry(
    kb: &mut Kb,
    start: i64,
    end: i64,
    step: i64,
    carry: &[Value],
    body: &mut CarryBody,
) -> Vec<Value> {
    debug_assert!(step > 0);
    let trips = if end > start {
        (end - start + step - 1) / step
    } else {
        0
    };
    if trips == 0 {
        return carry.to_vec();
    }
    if trips == 1 {
        let i = kb.iconst(start);
        return body(kb, i, carry);
    }
    let limit = start + trips * step;
    let types: Vec<_> = carry.iter().map(|&v| kb.b.func.dfg.value_type(v)).collect();
    let header = kb.b.create_block();
    kb.b.append_block_param(header, I64);
    for &t in &types {
        kb.b.append_block_param(header, t);
    }
    let exit = kb.b.create_block();
    for &t in &types {
        kb.b.append_block_param(exit, t);
    }
    let start_v = kb.iconst(start);
    let mut args: Vec<BlockArg> = vec![BlockArg::Value(start_v)];
    args.extend(carry.iter().map(|&v| BlockArg::Value(v)));
    kb.b.ins().jump(header, &args);

    kb.b.switch_to_block(header);
    let params = kb.b.block_params(header).to_vec();
    let i = params[0];
    let out = body(kb, i, &params[1..]);
    let next = kb.b.ins().iadd_imm_s(i, step);
    let cond = kb.b.ins().icmp_imm_s(IntCC::SignedLessThan, next, limit);
    let mut back: Vec<BlockArg> = vec![BlockArg::Value(next)];
    back.extend(out.iter().map(|&v| BlockArg::Value(v)));
    let fwd: Vec<BlockArg> = out.iter().map(|&v| BlockArg::Value(v)).collect();
    kb.b.ins().brif(cond, header, &back, exit, &fwd);
    kb.b.switch_to_block(exit);
    kb.b.block_params(exit).to_vec()
}

/// Runs `body(i)` for `i = start, start + step, ... < end` (`step > 0`).
pub(crate) fn for_range(
    kb: &mut Kb,
    start: i64,
    end: i64,
    step: i64,
    body: &mut dyn FnMut(&mut Kb, Value),
) {
    for_range_carry(kb, start, end, step, &[], &mut |kb, i, _| {
        body(kb, i);
        Vec::new()
    });
}

/// Loops over the index space `dims` (outermost first) and calls `body` with
/// one pointer per operand: `bases[j] + sum_d(i_d * strides[j][d])` (bytes).
pub(crate) fn nest(
    kb: &mut Kb,
    dims: &[usize],
    bases: &[Value],
    strides: &[Vec<i64>],
    body: &mut dyn FnMut(&mut Kb, &[Value]),
) {
    nest_at(kb, dims, 0, bases, strides, body);
}

fn nest_at(
    kb: &mut Kb,
    dims: &[usize],
    d: usize,
    bases: &[Value],
    strides: &[Vec<i64>],
    body: &mut dyn FnMut(&mut Kb, &[Value]),
) {
    if d == dims.len() {
        body(kb, bases);
        return;
    }
    for_range(kb, 0, dims[d] as i64, 1, &mut |kb, i| {
        let ptrs: Vec<Value> = bases
            .iter()
            .zip(strides)
            .map(|(&p, s)| kb.add_scaled(p, i, s[d]))
            .collect();
        nest_at(kb, dims, d + 1, &ptrs, strides, body);
    });
}

/// Simplifies an index space for [`nest`]: drops unit dims and merges
/// adjacent dims that every operand walks contiguously. `strides[j]` are
/// operand `j`'s strides over `shape`. Returns the new dims and strides.
pub(crate) fn collapse(shape: &[usize], strides: &[Vec<i64>]) -> (Vec<usize>, Vec<Vec<i64>>) {
    let mut dims: Vec<usize> = Vec::new();
    let mut out: Vec<Vec<i64>> = vec![Vec::new(); strides.len()];
    for (d, &n) in shape.iter().enumerate() {
        if n == 1 {
            continue;
        }
        if !dims.is_empty() {
            let merge = strides
                .iter()
                .zip(&out)
                .all(|(s, o)| *o.last().expect("same length") == s[d] * n as i64);
            if merge {
                *dims.last_mut().expect("non-empty") *= n;
                for (s, o) in strides.iter().zip(out.iter_mut()) {
                    *o.last_mut().expect("non-empty") = s[d];
                }
                continue;
            }
        }
        dims.push(n);
        for (s, o) in strides.iter().zip(out.iter_mut()) {
            o.push(s[d]);
        }
    }
    (dims, out)
}

#[cfg(test)]
mod tests {
    use super::collapse;

    #[test]
    fn collapses_contiguous_and_broadcast_dims() {
        // [2,3,4] contiguous + a bias broadcast along the last two dims.
        let (dims, s) = collapse(&[2, 3, 4], &[vec![48, 16, 4], vec![4, 0, 0]]);
        assert_eq!(dims, [2, 12]);
        assert_eq!(s, [vec![48, 4], vec![4, 0]]);
        let (dims, s) = collapse(&[1, 5, 1], &[vec![20, 4, 4]]);
        assert_eq!(dims, [5]);
        assert_eq!(s, [vec![4]]);
    }
}
