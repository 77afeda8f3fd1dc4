//! Text features: `TfIdfVectorizer` on integer tokens.

use super::build::build_const;
use super::build::slice_along;
use super::build::{accumulate, cast_to, reshape_to, scalar};
use super::one;
use crate::ctx::{ImportCtx, Val};
use crate::OnnxError;
use kiln_ir::{BinaryOp, CompareOp, DType, Data, LogicalOp, Op, ReduceOp};
use tract_onnx::pb::NodeProto;

type R = Result<Vec<Val>, OnnxError>;

/// Most token comparisons (n-gram positions × skip distances, summed over
/// the n-gram lengths) one TfIdfVectorizer is unrolled into.
const MAX_COMPARISONS: usize = 4096;

/// `TfIdfVectorizer` (opset 9) on int32/int64 tokens `[C]` or `[B, C]`,
/// counting as the ONNX reference does: an n-gram of the pool (lengths
/// `min_gram_length..=max_gram_length`) is counted at every start `s` and
/// skip distance `d` (1 to `max_skip_count + 1`; unigrams only at 1) where
/// the tokens `s, s + d, ..` spell it.
///
/// Per n-gram length and skip distance, the `n` shifted views of the rows
/// are compared with the pool's `n`-grams at once (`[B, starts, grams]`),
/// the comparisons and-ed and summed over the starts; a constant matrix
/// takes the pool's n-grams to their output columns (`ngram_indexes`), and
/// the mode weighs the counts: TF as they are, IDF the n-gram's weight
/// (or 1) where its count is positive, TFIDF the weight (or 1) times the
/// count. `weights[i]` is the weight of the pool's i-th n-gram, as the
/// operator's specification and onnxruntime have it (the ONNX Python
/// reference indexes it by output column instead; the two agree when
/// `ngram_indexes` is `0, 1, ..`).
pub fn tfidf_vectorizer(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let xt = ctx.ty(x).clone();
    if !matches!(xt.dtype, DType::I32 | DType::I64) || xt.shape.len() > 2 {
        return Err(ctx.unsupported(format!(
            "TfIdfVectorizer on {xt}: only int32/int64 tokens of shape [C] or [B, C] (strings are not supported)"
        )));
    }
    if ctx.attr_ints(node, "pool_int64s")?.is_none() {
        return Err(
            ctx.unsupported("TfIdfVectorizer with pool_strings (string tokens are not supported)")
        );
    }
    let int = |ctx: &ImportCtx, name: &str| -> Result<usize, OnnxError> {
        let v = ctx
            .attr_i(node, name)?
            .ok_or_else(|| ctx.bad_attr(name, "is required"))?;
        usize::try_from(v).map_err(|_| ctx.bad_attr(name, format!("must be ≥ 0, got {v}")))
    };
    let (min_n, max_n, max_skip) = (
        int(ctx, "min_gram_length")?,
        int(ctx, "max_gram_length")?,
        int(ctx, "max_skip_count")?,
    );
    let pool = ctx.attr_ints(node, "pool_int64s")?.unwrap_or_default();
    let counts: Vec<usize> = (ctx.attr_ints(node, "ngram_counts")?.unwrap_or_default())
        .into_iter()
        .map(|c| usize::try_from(c).unwrap_or(usize::MAX))
        .collect();
    let indexes: Vec<usize> = (ctx.attr_ints(node, "ngram_indexes")?.unwrap_or_default())
        .into_iter()
        .map(|c| usize::try_from(c).unwrap_or(usize::MAX))
        .collect();
    let weights = ctx.attr_floats(node, "weights")?;
    let mode = ctx.attr_s(node, "mode")?.unwrap_or_default();
    if !matches!(mode.as_str(), "TF" | "IDF" | "TFIDF") {
        return Err(ctx.bad_attr("mode", format!("must be TF, IDF or TFIDF, got '{mode}'")));
    }
    // The pool's n-grams by length: ngram_counts[i] is where the (i+1)-grams
    // start in the pool.
    let mut grams: Vec<Vec<Vec<i64>>> = vec![Vec::new(); counts.len()];
    for (i, &start) in counts.iter().enumerate() {
        let end = counts.get(i + 1).copied().unwrap_or(pool.len());
        let n = i + 1;
        if start > end || end > pool.len() || !(end - start).is_multiple_of(n) {
            return Err(ctx.bad_attr(
                "ngram_counts",
                format!(
                    "{counts:?} does not split the pool of {} tokens into n-grams",
                    pool.len()
                ),
            ));
        }
        grams[i] = pool[start..end].chunks(n).map(<[i64]>::to_vec).collect();
    }
    let total: usize = grams.iter().map(Vec::len).sum();
    if indexes.len() != total || indexes.iter().any(|&i| i >= 1 << 24) {
        return Err(ctx.bad_attr(
            "ngram_indexes",
            format!("must give one output column (< 2^24) to each of the {total} n-grams"),
        ));
    }
    let width = indexes.iter().max().map_or(0, |&m| m + 1);
    // Each n-gram's weight, moved to its output column.
    let column_weights = match &weights {
        Some(w) if w.len() != total => {
            return Err(ctx.bad_attr(
                "weights",
                format!("has {} values for the pool's {total} n-grams", w.len()),
            ))
        }
        Some(w) => {
            let mut by_column = vec![1f32; width];
            for (&col, &v) in indexes.iter().zip(w) {
                by_column[col] = v;
            }
            Some(by_column)
        }
        None => None,
    };
    let (rows, cols) = match xt.shape[..] {
        [c] => (1, c),
        [b, c] => (b, c),
        _ => (1, 1),
    };
    let tokens = cast_to(ctx, x, DType::I64, "tokens")?;
    let tokens = reshape_to(ctx, tokens, &[rows, cols], Some("rows"))?;
    // The skip distances that leave a start in the row: (n − 1)·d < C.
    let skips_of = |n: usize| -> usize {
        if n == 1 {
            1
        } else {
            max_skip
                .saturating_add(1)
                .min(cols.saturating_sub(1) / (n - 1))
        }
    };
    let comparisons = (1..=grams.len())
        .filter(|&n| n >= min_n && n <= max_n && !grams[n - 1].is_empty())
        .fold(0usize, |acc, n| {
            acc.saturating_add(n.saturating_mul(skips_of(n)))
        });
    if comparisons > MAX_COMPARISONS {
        return Err(ctx.unsupported(format!(
            "a TfIdfVectorizer of {comparisons} n-gram position × skip comparisons (Kiln unrolls at most {MAX_COMPARISONS})"
        )));
    }
    let mut out: Option<Val> = None;
    let mut first = 0;
    for (i, set) in grams.iter().enumerate() {
        let n = i + 1;
        let (base, p) = (first, set.len());
        first += p;
        if n < min_n || n > max_n || p == 0 {
            continue;
        }
        let mut count: Option<Val> = None;
        for d in 1..=skips_of(n) {
            let Some(starts) = cols.checked_sub((n - 1) * d).filter(|&s| s > 0) else {
                continue;
            };
            let tag = format!("n{n}_d{d}");
            let mut hit: Option<Val> = None;
            for j in 0..n {
                let view = slice_along(ctx, tokens, 1, j * d, 1, starts, &format!("{tag}_at{j}"))?;
                let view = reshape_to(
                    ctx,
                    view,
                    &[rows, starts, 1],
                    Some(&format!("{tag}_view{j}")),
                )?;
                let want = build_const(
                    ctx,
                    &[1, 1, p],
                    DType::I64,
                    &format!("{tag}_gram{j}"),
                    |_| Data::I64(set.iter().map(|g| g[j]).collect()),
                )?;
                let eq = ctx.op(
                    Op::Compare(CompareOp::Equal),
                    &[view, want],
                    Some(&format!("{tag}_eq{j}")),
                )?;
                hit = Some(accumulate(
                    ctx,
                    hit,
                    Op::Logical(LogicalOp::And),
                    eq,
                    &format!("{tag}_and{j}"),
                )?);
            }
            let hit = cast_to(ctx, hit.expect("n ≥ 1"), DType::F32, &format!("{tag}_hits"))?;
            let c = ctx.op(
                Op::Reduce {
                    op: ReduceOp::Sum,
                    axes: [1].into_iter().collect(),
                    keep_dims: false,
                },
                &[hit],
                Some(&format!("{tag}_count")),
            )?;
            count = Some(accumulate(
                ctx,
                count,
                Op::Binary(BinaryOp::Add),
                c,
                &format!("{tag}_sum"),
            )?);
        }
        let Some(count) = count else { continue };
        // [rows, p] @ [p, width]: each n-gram's count into its column.
        let place = build_const(
            ctx,
            &[p, width],
            DType::F32,
            &format!("n{n}_columns"),
            |len| {
                let mut m = vec![0f32; len];
                for (k, &col) in indexes[base..base + p].iter().enumerate() {
                    m[k * width + col] = 1.0;
                }
                Data::F32(m)
            },
        )?;
        let placed = ctx.dense_op(Op::MatMul, &[count, place], Some(&format!("n{n}_placed")))?;
        out = Some(accumulate(
            ctx,
            out,
            Op::Binary(BinaryOp::Add),
            placed,
            &format!("n{n}_total"),
        )?);
    }
    let freq = match out {
        Some(o) => o,
        None => build_const(ctx, &[rows, width], DType::F32, "no_counts", |len| {
            Data::F32(vec![0.0; len])
        })?,
    };
    let weight = match column_weights {
        Some(w) => build_const(ctx, &[1, width], DType::F32, "weights", |_| Data::F32(w))?,
        None => scalar(ctx, DType::F32, 1.0, "unit_weight"),
    };
    let y = match mode.as_str() {
        "TF" => freq,
        "TFIDF" => ctx.op(Op::Binary(BinaryOp::Mul), &[freq, weight], Some("tfidf"))?,
        _ => {
            let zero = scalar(ctx, DType::F32, 0.0, "zero");
            let seen = ctx.op(Op::Compare(CompareOp::Greater), &[freq, zero], Some("seen"))?;
            let w = ctx.op(
                Op::Expand {
                    shape: [rows, width].into_iter().collect(),
                },
                &[weight],
                Some("weight_rows"),
            )?;
            ctx.op(Op::Where, &[seen, w, zero], Some("idf"))?
        }
    };
    let shape: Vec<usize> = if xt.shape.len() == 2 {
        vec![rows, width]
    } else {
        vec![width]
    };
    one(reshape_to(ctx, y, &shape, None)?)
}
