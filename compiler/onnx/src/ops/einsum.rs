//! `Einsum` decomposed into Transpose, Reshape, ReduceSum, Where and MatMul:
//! repeated letters within one operand take a diagonal (an identity mask
//! and a sum), letters no later operand or the output needs are summed
//! out, and operands are contracted pairwise from the left as a batched
//! MatMul over `[batch.., left, contracted] @ [batch.., contracted, right]`.
//! Ellipses become fresh letters, right-aligned across operands.

use super::build::gen_const;
use super::build::reshape_to;
use super::one;
use crate::ctx::{ImportCtx, Val};
use crate::OnnxError;
use kiln_ir::{Data, Ints, Op, ReduceOp, Tensor};
use std::collections::BTreeSet;
use tract_onnx::pb::NodeProto;

type R = Result<Vec<Val>, OnnxError>;

/// The letter standing for ellipsis dim `i` (from a private-use range, so it
/// never collides with the equation's own letters).
fn ellipsis_letter(i: usize) -> char {
    char::from_u32(0xE000 + i as u32).expect("private use range")
}

/// A parsed equation: the letters of each operand (ellipses expanded for the
/// given ranks) and of the output.
fn parse(eq: &str, ranks: &[usize]) -> Result<(Vec<Vec<char>>, Vec<char>), String> {
    let eq: String = eq.chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l.to_string(), Some(r.to_string())),
        None => (eq.clone(), None),
    };
    let terms: Vec<&str> = lhs.split(',').collect();
    if terms.len() != ranks.len() {
        return Err(format!(
            "the equation has {} operands, the node {}",
            terms.len(),
            ranks.len()
        ));
    }
    let explicit = |t: &str| -> Result<(Vec<char>, bool), String> {
        let has = t.contains("...");
        let letters: Vec<char> = t.replace("...", "").chars().collect();
        if let Some(c) = letters.iter().find(|c| !c.is_ascii_alphabetic()) {
            return Err(format!("'{c}' is not a subscript letter"));
        }
        Ok((letters, has))
    };
    let mut parsed = Vec::with_capacity(terms.len());
    let mut ell = 0usize;
    for (t, &r) in terms.iter().zip(ranks) {
        let (letters, has) = explicit(t)?;
        let extra = r
            .checked_sub(letters.len())
            .ok_or_else(|| format!("'{t}' names more axes than its rank {r}"))?;
        if extra > 0 && !has {
            return Err(format!(
                "'{t}' names {} axes of a rank-{r} operand",
                letters.len()
            ));
        }
        ell = ell.max(extra);
        parsed.push((t.to_string(), extra));
    }
    let expand = |t: &str, extra: usize| -> Vec<char> {
        let fresh: Vec<char> = (ell - extra..ell).map(ellipsis_letter).collect();
        match t.split_once("...") {
            Some((a, b)) => a.chars().chain(fresh).chain(b.chars()).collect(),
            None => t.chars().collect(),
        }
    };
    let ops: Vec<Vec<char>> = parsed.iter().map(|(t, e)| expand(t, *e)).collect();
    let out = match rhs {
        Some(r) => {
            let (letters, _) = explicit(&r)?;
            let mut seen = BTreeSet::new();
            if letters.iter().any(|c| !seen.insert(*c)) {
                return Err(format!("the output '{r}' repeats a letter"));
            }
            let all: BTreeSet<char> = ops.iter().flatten().copied().collect();
            if let Some(c) = letters.iter().find(|c| !all.contains(c)) {
                return Err(format!("output letter '{c}' is not in any operand"));
            }
            expand(&r, ell)
        }
        None => {
            // Implicit output: the ellipsis, then letters used once, sorted.
            let mut count = std::collections::BTreeMap::new();
            for c in ops.iter().flatten().filter(|c| c.is_ascii_alphabetic()) {
                *count.entry(*c).or_insert(0) += 1;
            }
            let mut out: Vec<char> = (0..ell).map(ellipsis_letter).collect();
            let mut once: Vec<char> = count
                .into_iter()
                .filter(|&(_, n)| n == 1)
                .map(|(c, _)| c)
                .collect();
            once.sort_by_key(|c| (c.is_ascii_lowercase(), *c));
            out.extend(once);
            out
        }
    };
    Ok((ops, out))
}

/// An operand in flight: its value and one distinct letter per axis.
struct Term {
    v: Val,
    letters: Vec<char>,
}

fn dims(ctx: &ImportCtx, t: &Term) -> Vec<usize> {
    ctx.ty(t.v).shape.to_vec()
}

fn transpose_to(
    ctx: &mut ImportCtx,
    t: Term,
    order: &[char],
    tag: &str,
) -> Result<Term, OnnxError> {
    if t.letters == order {
        return Ok(t);
    }
    let perm: Ints = order
        .iter()
        .map(|c| {
            t.letters
                .iter()
                .position(|x| x == c)
                .expect("letter present")
        })
        .collect();
    let v = ctx.op(Op::Transpose { perm }, &[t.v], Some(tag))?;
    Ok(Term {
        v,
        letters: order.to_vec(),
    })
}

fn sum_out(ctx: &mut ImportCtx, t: Term, drop: &[char], tag: &str) -> Result<Term, OnnxError> {
    if drop.is_empty() {
        return Ok(t);
    }
    let axes: Ints = (0..t.letters.len())
        .filter(|&i| drop.contains(&t.letters[i]))
        .collect();
    let v = ctx.op(
        Op::Reduce {
            op: ReduceOp::Sum,
            axes,
            keep_dims: false,
        },
        &[t.v],
        Some(tag),
    )?;
    let letters = t
        .letters
        .into_iter()
        .filter(|c| !drop.contains(c))
        .collect();
    Ok(Term { v, letters })
}

/// Collapses repeated letters of one operand to their diagonal.
fn diagonals(
    ctx: &mut ImportCtx,
    mut v: Val,
    mut letters: Vec<char>,
    tag: &str,
) -> Result<Term, OnnxError> {
    let mut step = 0;
    while let Some((a, b)) = (0..letters.len()).find_map(|a| {
        (a + 1..letters.len())
            .find(|&b| letters[b] == letters[a])
            .map(|b| (a, b))
    }) {
        let shape = ctx.ty(v).shape.clone();
        let n = shape[a];
        if shape[b] != n {
            return Err(ctx.invalid(format!(
                "letter '{}' has sizes {n} and {} in one operand",
                letters[a], shape[b]
            )));
        }
        let mut ms = vec![1; letters.len()];
        ms[a] = n;
        ms[b] = n;
        ctx.charge_generated((n * n) as u64)?;
        let eye: Vec<bool> = (0..n * n).map(|f| f / n == f % n).collect();
        let eye = gen_const(
            ctx,
            Tensor::new(&ms, Data::Bool(eye)).expect("n*n"),
            &format!("{tag}_eye{step}"),
        )?;
        let zero = gen_const(
            ctx,
            Tensor::new([], Data::zeros(ctx.ty(v).dtype, 1)).expect("scalar"),
            &format!("{tag}_zero{step}"),
        )?;
        let masked = ctx.op(
            Op::Where,
            &[eye, v, zero],
            Some(&format!("{tag}_offdiag{step}")),
        )?;
        v = ctx.op(
            Op::Reduce {
                op: ReduceOp::Sum,
                axes: [b].into_iter().collect(),
                keep_dims: false,
            },
            &[masked],
            Some(&format!("{tag}_diag{step}")),
        )?;
        letters.remove(b);
        step += 1;
    }
    Ok(Term { v, letters })
}

/// Contracts two operands, keeping the letters in `keep`.
fn contract(
    ctx: &mut ImportCtx,
    a: Term,
    b: Term,
    keep: &BTreeSet<char>,
    tag: &str,
) -> Result<Term, OnnxError> {
    let in_a = |c: &char| a.letters.contains(c);
    let in_b = |c: &char| b.letters.contains(c);
    let a_only: Vec<char> = a
        .letters
        .iter()
        .filter(|c| !in_b(c) && !keep.contains(c))
        .copied()
        .collect();
    let b_only: Vec<char> = b
        .letters
        .iter()
        .filter(|c| !in_a(c) && !keep.contains(c))
        .copied()
        .collect();
    let a = sum_out(ctx, a, &a_only, &format!("{tag}_a_sum"))?;
    let b = sum_out(ctx, b, &b_only, &format!("{tag}_b_sum"))?;
    let batch: Vec<char> = a
        .letters
        .iter()
        .filter(|c| b.letters.contains(c) && keep.contains(c))
        .copied()
        .collect();
    let con: Vec<char> = a
        .letters
        .iter()
        .filter(|c| b.letters.contains(c) && !keep.contains(c))
        .copied()
        .collect();
    let left: Vec<char> = a
        .letters
        .iter()
        .filter(|c| !b.letters.contains(c))
        .copied()
        .collect();
    let right: Vec<char> = b
        .letters
        .iter()
        .filter(|c| !a.letters.contains(c))
        .copied()
        .collect();
    let (da, db) = (dims(ctx, &a), dims(ctx, &b));
    let size = |t: &Term, d: &[usize], c: &char| {
        d[t.letters.iter().position(|x| x == c).expect("present")]
    };
    for c in &con {
        if size(&a, &da, c) != size(&b, &db, c) {
            return Err(ctx.invalid(format!("contracted letter '{c}' differs in size")));
        }
    }
    let prod =
        |t: &Term, d: &[usize], ls: &[char]| ls.iter().map(|c| size(t, d, c)).product::<usize>();
    let (l, k, r) = (
        prod(&a, &da, &left),
        prod(&a, &da, &con),
        prod(&b, &db, &right),
    );
    let ab: Vec<usize> = batch.iter().map(|c| size(&a, &da, c)).collect();
    let bb: Vec<usize> = batch.iter().map(|c| size(&b, &db, c)).collect();
    let mut out_batch = Vec::with_capacity(batch.len());
    for (i, c) in batch.iter().enumerate() {
        let (x, y) = (ab[i], bb[i]);
        if x != y && x != 1 && y != 1 {
            return Err(ctx.invalid(format!("letter '{c}' has sizes {x} and {y}")));
        }
        out_batch.push(x.max(y));
    }
    let left_dims: Vec<usize> = left.iter().map(|c| size(&a, &da, c)).collect();
    let right_dims: Vec<usize> = right.iter().map(|c| size(&b, &db, c)).collect();
    let order_a: Vec<char> = batch.iter().chain(&left).chain(&con).copied().collect();
    let order_b: Vec<char> = batch.iter().chain(&con).chain(&right).copied().collect();
    let a = transpose_to(ctx, a, &order_a, &format!("{tag}_a_order"))?;
    let b = transpose_to(ctx, b, &order_b, &format!("{tag}_b_order"))?;
    let mut sa = ab.clone();
    sa.extend([l, k]);
    let mut sb = bb.clone();
    sb.extend([k, r]);
    let av = reshape_to(ctx, a.v, &sa, Some(&format!("{tag}_a_matrix")))?;
    let bv = reshape_to(ctx, b.v, &sb, Some(&format!("{tag}_b_matrix")))?;
    let p = ctx.dense_op(Op::MatMul, &[av, bv], Some(&format!("{tag}_product")))?;
    let mut shape = out_batch;
    shape.extend(left_dims);
    shape.extend(right_dims);
    let v = reshape_to(ctx, p, &shape, Some(&format!("{tag}_result")))?;
    Ok(Term {
        v,
        letters: batch.into_iter().chain(left).chain(right).collect(),
    })
}

/// `Einsum`.
pub fn einsum(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let inputs = ctx.inputs(node);
    if inputs.is_empty() {
        return Err(ctx.invalid("Einsum needs at least one input"));
    }
    let eq = ctx
        .attr_s(node, "equation")?
        .ok_or_else(|| ctx.bad_attr("equation", "is required"))?;
    let ranks: Vec<usize> = inputs.iter().map(|&v| ctx.ty(v).shape.len()).collect();
    let (letters, out) = parse(&eq, &ranks).map_err(|m| ctx.bad_attr("equation", m))?;
    let mut terms = Vec::with_capacity(inputs.len());
    for (i, (&v, ls)) in inputs.iter().zip(letters).enumerate() {
        terms.push(diagonals(ctx, v, ls, &format!("in{i}"))?);
    }
    // Letters needed after step i: the output's and those of later operands.
    let needed_after = |i: usize, terms: &[Term]| -> BTreeSet<char> {
        let mut s: BTreeSet<char> = out.iter().copied().collect();
        for t in &terms[i + 1..] {
            s.extend(t.letters.iter().copied());
        }
        s
    };
    let mut acc = {
        let keep = needed_after(0, &terms);
        let first = Term {
            v: terms[0].v,
            letters: terms[0].letters.clone(),
        };
        let drop: Vec<char> = first
            .letters
            .iter()
            .filter(|c| !keep.contains(c))
            .copied()
            .collect();
        sum_out(ctx, first, &drop, "in0_sum")?
    };
    for i in 1..terms.len() {
        let keep = needed_after(i, &terms);
        let t = Term {
            v: terms[i].v,
            letters: terms[i].letters.clone(),
        };
        acc = contract(ctx, acc, t, &keep, &format!("step{i}"))?;
    }
    let drop: Vec<char> = acc
        .letters
        .iter()
        .filter(|c| !out.contains(c))
        .copied()
        .collect();
    let acc = sum_out(ctx, acc, &drop, "final_sum")?;
    one(transpose_to(ctx, acc, &out, "output_order")?.v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_implicit_and_ellipsis_equations() {
        let (ops, out) = parse("ij,jk", &[2, 2]).unwrap();
        assert_eq!(ops, vec![vec!['i', 'j'], vec!['j', 'k']]);
        assert_eq!(out, vec!['i', 'k']);
        let (ops, out) = parse("...ii ->...i", &[3]).unwrap();
        let e = ellipsis_letter(0);
        assert_eq!(ops, vec![vec![e, 'i', 'i']]);
        assert_eq!(out, vec![e, 'i']);
        let (ops, out) = parse("...ij,...jk->...ik", &[4, 3]).unwrap();
        let (e0, e1) = (ellipsis_letter(0), ellipsis_letter(1));
        assert_eq!(ops[0], vec![e0, e1, 'i', 'j']);
        assert_eq!(ops[1], vec![e1, 'j', 'k']);
        assert_eq!(out, vec![e0, e1, 'i', 'k']);
        assert!(parse("ij", &[3]).is_err());
        assert!(parse("ij->ik", &[2]).is_err());
        assert!(parse("i,i", &[1]).is_err());
    }
}
