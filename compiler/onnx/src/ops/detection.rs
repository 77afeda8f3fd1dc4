//! Detection post-processing: `NonMaxSuppression`. How many boxes it
//! selects depends on the scores: it folds when boxes and scores are
//! constants, and otherwise selects at run time into rows at the bound,
//! which the run cuts to the count (`docs/bounded.md`).

use super::build::{cast_to, gen_const, reshape_to, scalar, slice_along};
use crate::ctx::{ImportCtx, Val};
use crate::OnnxError;
use kiln_ir::{DType, Data, Nms, Op, Tensor};
use tract_onnx::pb::NodeProto;

type R = Result<Vec<Val>, OnnxError>;

/// Most box-overlap tests a folded `NonMaxSuppression` may take (about a
/// second of import).
const MAX_IOU_TESTS: u128 = 1 << 30;

/// `NonMaxSuppression` (opset 10/11; `kiln_host::Nms` is the algorithm):
/// per batch and class, boxes whose score passes `score_threshold` are
/// taken best first (ties: lower box index first) unless one already taken
/// overlaps them by more than `iou_threshold`, at most
/// `max_output_boxes_per_class` of them (absent: none). Output
/// `[selected, 3]` int64 rows `(batch, class, box)`. Constant inputs fold
/// here; otherwise the selection runs at run time into rows at the bound,
/// marked with the count (`docs/bounded.md`): every box per batch and
/// class, or the cap where it is a constant.
pub fn non_max_suppression(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let boxes = ctx.input(node, 0)?;
    let scores = ctx.input(node, 1)?;
    let (bt, st) = (ctx.ty(boxes).clone(), ctx.ty(scores).clone());
    let (bs, ss) = (&bt.shape, &st.shape);
    if bs.len() != 3 || bs[2] != 4 || ss.len() != 3 || ss[0] != bs[0] || ss[2] != bs[1] {
        return Err(ctx.invalid(format!(
            "boxes must be [batches, boxes, 4] and scores [batches, classes, boxes], got {bs:?} and {ss:?}"
        )));
    }
    let center_point_box = match ctx.attr_i_or(node, "center_point_box", 0)? {
        0 => false,
        1 => true,
        other => {
            return Err(ctx.bad_attr("center_point_box", format!("must be 0 or 1, got {other}")))
        }
    };
    let (batches, count, classes) = (bs[0], bs[1], ss[1]);
    // The optional scalars: absent (or empty) ones take their defaults.
    let mut knobs = Vec::with_capacity(3);
    for (i, dtype, default, what) in [
        (2, DType::I64, 0.0, "max_output_boxes_per_class"),
        (3, DType::F32, 0.0, "iou_threshold"),
        (4, DType::F32, 0.0, "score_threshold"),
    ] {
        let given = ctx
            .opt_input(node, i)
            .filter(|&v| ctx.ty(v).num_elements() > 0);
        knobs.push(match given {
            Some(v) if ctx.ty(v).num_elements() != 1 => {
                return Err(ctx.invalid(format!("{what} must hold one value, got {}", ctx.ty(v))))
            }
            Some(v) => {
                let v = cast_to(ctx, v, dtype, &format!("{what}_{dtype}"))?;
                (reshape_to(ctx, v, &[], Some(what))?, true)
            }
            None => (scalar(ctx, dtype, default, what), false),
        });
    }
    let [(cap, _), (iou, _), (score, has_score_threshold)] = knobs[..] else {
        unreachable!("three knobs")
    };
    let konst = |v: Val| ctx.konst(v).cloned();
    let attrs = Nms {
        center_point_box,
        // A constant cap bounds the rows; a run-time one may take every box.
        cap: konst(cap).map_or(count, |t| t.to_i64_vec()[0].clamp(0, count as i64) as usize),
        has_score_threshold,
    };
    let values = (
        konst(boxes),
        konst(scores),
        konst(cap),
        konst(iou),
        konst(score),
    );
    let (Some(bd), Some(sd), Some(c), Some(i), Some(s)) = values else {
        return selected_at_run_time(ctx, [boxes, scores, cap, iou, score], attrs);
    };
    let nms = attrs.at(
        [batches, classes, count],
        c.to_i64_vec()[0],
        i.to_f32_vec()[0],
        s.to_f32_vec()[0],
    );
    // Each candidate is tested against the boxes kept so far: bound the
    // fold's work, which a constant of a million boxes would make hours.
    let tests = (batches as u128 * classes as u128) * (count as u128 * attrs.cap as u128);
    if tests > MAX_IOU_TESTS {
        return Err(ctx.unsupported(format!(
            "folding NonMaxSuppression over {batches}×{classes} classes of {count} boxes would take up to {tests} overlap tests at import (at most {MAX_IOU_TESTS})"
        )));
    }
    let mut rows = vec![0i64; nms.bound() * 3];
    let mut scratch = vec![0u32; nms.scratch_len()];
    let selected = nms.select(&bd.to_f32_vec(), &sd.to_f32_vec(), &mut scratch, &mut rows);
    rows.truncate(selected * 3);
    let t = Tensor::new([selected, 3], Data::I64(rows)).expect("rows of 3");
    Ok(vec![gen_const(ctx, t, "selected_indices")?])
}

/// The run-time selection of `inputs` (boxes, scores and the three
/// scalars): rows `0..bound` of the op's output, marked with the count its
/// last row holds.
fn selected_at_run_time(ctx: &mut ImportCtx, inputs: [Val; 5], attrs: Nms) -> R {
    let [boxes, scores, cap, iou, score] = inputs;
    let boxes = cast_to(ctx, boxes, DType::F32, "boxes_f32")?;
    let scores = cast_to(ctx, scores, DType::F32, "scores_f32")?;
    let all = ctx.op(
        Op::NonMaxSuppression(attrs),
        &[boxes, scores, cap, iou, score],
        Some("selection"),
    )?;
    let bound = ctx.ty(all).shape[0] - 1;
    let selected = slice_along(ctx, all, 0, 0, 1, bound, "rows")?;
    let count_row = slice_along(ctx, all, 0, bound, 1, 1, "count_row")?;
    let count = slice_along(ctx, count_row, 1, 0, 1, 1, "count_cell")?;
    let count = reshape_to(ctx, count, &[], Some("count"))?;
    Ok(vec![ctx.op(
        Op::WithLength { axis: 0 },
        &[selected, count],
        None,
    )?])
}
