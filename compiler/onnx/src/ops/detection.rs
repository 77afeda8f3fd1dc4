//! Detection post-processing: `NonMaxSuppression`. How many boxes it
//! selects depends on the scores: it folds when boxes and scores are
//! constants, and otherwise selects at run time into rows at the bound,
//! which the run cuts to the count (`docs/bounded.md`).

use super::build::{cast_to, gen_const, reshape_to};
use crate::ctx::{ImportCtx, Val};
use crate::OnnxError;
use kiln_ir::{DType, Data, Nms, Op, SliceAxis, Tensor};
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
/// `[selected, 3]` int64 rows `(batch, class, box)`. Constant boxes and
/// scores fold here; run-time ones select at run time into rows at the
/// bound, marked with the count (`docs/bounded.md`). The cap and the
/// thresholds must be constants.
pub fn non_max_suppression(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let boxes = ctx.input(node, 0)?;
    let scores = ctx.input(node, 1)?;
    let mut knobs = Vec::new();
    for i in 2..5 {
        let Some(v) = ctx.opt_input(node, i) else {
            knobs.push(None);
            continue;
        };
        match ctx.konst(v) {
            Some(t) => knobs.push(Some(t.clone())),
            None => {
                return Err(ctx.not_constant(
                    v,
                    "NonMaxSuppression's max_output_boxes_per_class, iou_threshold and score_threshold must be constants (the cap sets the output's bound)",
                ))
            }
        }
    }
    let (bt, st) = (ctx.ty(boxes).clone(), ctx.ty(scores).clone());
    let (bs, ss) = (&bt.shape, &st.shape);
    if bs.len() != 3 || bs[2] != 4 || ss.len() != 3 || ss[0] != bs[0] || ss[2] != bs[1] {
        return Err(ctx.invalid(format!(
            "boxes must be [batches, boxes, 4] and scores [batches, classes, boxes], got {bs:?} and {ss:?}"
        )));
    }
    // An absent (or empty) optional input takes its default.
    fn first(t: &Option<Tensor>) -> Option<&Data> {
        t.as_ref().filter(|t| !t.is_empty()).map(Tensor::data)
    }
    let center_point_box = match ctx.attr_i_or(node, "center_point_box", 0)? {
        0 => false,
        1 => true,
        other => {
            return Err(ctx.bad_attr("center_point_box", format!("must be 0 or 1, got {other}")))
        }
    };
    let attrs = Nms {
        center_point_box,
        max_per_class: first(&knobs[0]).map_or(0, |d| d.get_i64(0).max(0)) as usize,
        iou_threshold: first(&knobs[1]).map_or(0.0, |d| d.get_f64(0) as f32),
        score_threshold: first(&knobs[2]).map(|d| d.get_f64(0) as f32),
    };
    let (batches, count, classes) = (bs[0], bs[1], ss[1]);
    let nms = attrs.at(batches, classes, count);
    let (Some(bd), Some(sd)) = (ctx.konst(boxes).cloned(), ctx.konst(scores).cloned()) else {
        return selected_at_run_time(ctx, boxes, scores, attrs, nms.bound());
    };
    // Each candidate is tested against the boxes kept so far: bound the
    // fold's work, which a constant of a million boxes would make hours.
    let tests = (batches as u128 * classes as u128)
        * (count as u128 * count.min(nms.max_per_class) as u128);
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

/// The run-time selection: rows `0..bound` of the op's output, marked with
/// the count its last row holds.
fn selected_at_run_time(
    ctx: &mut ImportCtx,
    boxes: Val,
    scores: Val,
    attrs: Nms,
    bound: usize,
) -> R {
    let boxes = cast_to(ctx, boxes, DType::F32, "boxes_f32")?;
    let scores = cast_to(ctx, scores, DType::F32, "scores_f32")?;
    let all = ctx.op(
        Op::NonMaxSuppression(attrs),
        &[boxes, scores],
        Some("selection"),
    )?;
    let rows = |start: usize, len: usize, cols: usize| Op::Slice {
        axes: [
            SliceAxis {
                start,
                step: 1,
                len,
            },
            SliceAxis {
                start: 0,
                step: 1,
                len: cols,
            },
        ]
        .into_iter()
        .collect(),
    };
    let selected = ctx.op(rows(0, bound, 3), &[all], Some("rows"))?;
    let count = ctx.op(rows(bound, 1, 1), &[all], Some("count_row"))?;
    let count = reshape_to(ctx, count, &[], Some("count"))?;
    Ok(vec![ctx.op(
        Op::WithLength { axis: 0 },
        &[selected, count],
        None,
    )?])
}
