//! Detection post-processing: `NonMaxSuppression`. How many boxes it
//! selects depends on the scores, so its output shape is known only once
//! the data is: it folds when boxes, scores and the thresholds are
//! constants (or bound with `--bind-input`), and otherwise fails with an
//! error naming the graph inputs to bind. Detector exports usually end
//! with it; compiling the network up to the scores and running the
//! suppression in the application is the usual way around.

use super::build::gen_const;
use crate::ctx::{ImportCtx, Val};
use crate::OnnxError;
use kiln_ir::{Data, Tensor};
use tract_onnx::pb::NodeProto;

type R = Result<Vec<Val>, OnnxError>;

/// Most box-overlap tests a folded `NonMaxSuppression` may take (about a
/// second of import).
const MAX_IOU_TESTS: u128 = 1 << 30;

/// A box as the x and y extents it covers.
#[derive(Clone, Copy)]
struct Extent {
    x: (f64, f64),
    y: (f64, f64),
}

impl Extent {
    /// `b` in the layout `center_point_box` names: 0 is two opposite
    /// corners `[y1, x1, y2, x2]` (either diagonal), 1 is `[x_center,
    /// y_center, width, height]`.
    fn of(b: [f64; 4], center_point_box: bool) -> Extent {
        let sorted = |a: f64, b: f64| if a <= b { (a, b) } else { (b, a) };
        if center_point_box {
            let (hw, hh) = (b[2] / 2.0, b[3] / 2.0);
            Extent {
                x: (b[0] - hw, b[0] + hw),
                y: (b[1] - hh, b[1] + hh),
            }
        } else {
            Extent {
                x: sorted(b[1], b[3]),
                y: sorted(b[0], b[2]),
            }
        }
    }

    fn area(&self) -> f64 {
        (self.x.1 - self.x.0) * (self.y.1 - self.y.0)
    }

    /// Whether `other` overlaps this box by more than `threshold`
    /// (intersection over union); boxes without area never suppress.
    fn suppresses(&self, other: &Extent, threshold: f64) -> bool {
        let ix = (self.x.0.max(other.x.0), self.x.1.min(other.x.1));
        let iy = (self.y.0.max(other.y.0), self.y.1.min(other.y.1));
        if ix.1 <= ix.0 || iy.1 <= iy.0 {
            return false;
        }
        let inter = (ix.1 - ix.0) * (iy.1 - iy.0);
        let (a, b) = (self.area(), other.area());
        let union = a + b - inter;
        if inter <= 0.0 || a <= 0.0 || b <= 0.0 || union <= 0.0 {
            return false;
        }
        inter / union > threshold
    }
}

/// `NonMaxSuppression` (opset 10/11): per batch and class, boxes whose
/// score passes `score_threshold` are taken best first (ties: lower box
/// index first) unless one already taken overlaps them by more than
/// `iou_threshold`, at most `max_output_boxes_per_class` of them (absent:
/// none). Output `[selected, 3]` int64 rows `(batch, class, box)`.
pub fn non_max_suppression(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let mut known = Vec::new();
    for i in 0..5 {
        let Some(v) = ctx.opt_input(node, i) else {
            known.push(None);
            continue;
        };
        match ctx.konst(v) {
            Some(t) => known.push(Some(t.clone())),
            None => {
                return Err(ctx.not_constant(
                    v,
                    "NonMaxSuppression of run-time data (how many boxes it selects depends on the scores); it folds when its inputs are constants",
                ))
            }
        }
    }
    let boxes = known[0]
        .take()
        .ok_or_else(|| ctx.invalid("boxes are required"))?;
    let scores = known[1]
        .take()
        .ok_or_else(|| ctx.invalid("scores are required"))?;
    let (bs, ss) = (boxes.shape().to_vec(), scores.shape().to_vec());
    if bs.len() != 3 || bs[2] != 4 || ss.len() != 3 || ss[0] != bs[0] || ss[2] != bs[1] {
        return Err(ctx.invalid(format!(
            "boxes must be [batches, boxes, 4] and scores [batches, classes, boxes], got {bs:?} and {ss:?}"
        )));
    }
    // An absent (or empty) optional input takes its default.
    fn first(t: &Option<Tensor>) -> Option<&Data> {
        t.as_ref().filter(|t| !t.is_empty()).map(Tensor::data)
    }
    let max_per_class = first(&known[2]).map_or(0, |d| d.get_i64(0).max(0)) as usize;
    let iou_threshold = first(&known[3]).map_or(0.0, |d| d.get_f64(0));
    let score_threshold = first(&known[4]).map(|d| d.get_f64(0));
    let center_point_box = match ctx.attr_i_or(node, "center_point_box", 0)? {
        0 => false,
        1 => true,
        other => {
            return Err(ctx.bad_attr("center_point_box", format!("must be 0 or 1, got {other}")))
        }
    };
    let (batches, count, classes) = (bs[0], bs[1], ss[1]);
    // Each candidate is tested against the boxes kept so far: bound the
    // fold's work, which a constant of a million boxes would make hours.
    let tests =
        (batches as u128 * classes as u128) * (count as u128 * count.min(max_per_class) as u128);
    if tests > MAX_IOU_TESTS {
        return Err(ctx.unsupported(format!(
            "folding NonMaxSuppression over {batches}×{classes} classes of {count} boxes would take up to {tests} overlap tests at import (at most {MAX_IOU_TESTS})"
        )));
    }
    let (bd, sd) = (boxes.data(), scores.data());
    let mut selected: Vec<i64> = Vec::new();
    for b in 0..batches {
        let extent = |i: usize| {
            let at = (b * count + i) * 4;
            Extent::of([0, 1, 2, 3].map(|k| bd.get_f64(at + k)), center_point_box)
        };
        for c in 0..classes {
            let score = |i: usize| sd.get_f64((b * classes + c) * count + i);
            let mut candidates: Vec<usize> = (0..count)
                .filter(|&i| score_threshold.is_none_or(|t| score(i) > t))
                .collect();
            candidates.sort_by(|&i, &j| score(j).total_cmp(&score(i)).then(i.cmp(&j)));
            let mut kept: Vec<Extent> = Vec::new();
            for i in candidates {
                if kept.len() >= max_per_class {
                    break;
                }
                let e = extent(i);
                if kept.iter().all(|k| !e.suppresses(k, iou_threshold)) {
                    kept.push(e);
                    selected.extend([b as i64, c as i64, i as i64]);
                }
            }
        }
    }
    let rows = selected.len() / 3;
    let t = Tensor::new([rows, 3], Data::I64(selected)).expect("rows of 3");
    Ok(vec![gen_const(ctx, t, "selected_indices")?])
}
