//! Kernels that artifact code calls in the runtime rather than carrying
//! as generated code: selections whose work is a sort (`NonMaxSuppression`).
//! Each is written once, here, on slices: the runtime wraps it in a C-ABI
//! host function (`kiln_runtime`'s `host.rs`), the reference evaluator
//! (`kiln_ir::eval`) and the importer's constant folding call it directly,
//! so the three agree bit for bit. No kernel here allocates: a run's
//! scratch comes from the arena.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

/// `NonMaxSuppression` with its attributes and sizes (ONNX opset 10/11,
/// as onnxruntime computes it, in f32): per batch and class, the boxes
/// whose score passes `score_threshold` are taken best first (ties: the
/// lower box index first) unless one already taken overlaps them by more
/// than `iou_threshold`, at most `max_per_class` of them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Nms {
    /// Batches (`boxes` is `[batches, boxes, 4]`).
    pub batches: usize,
    /// Classes (`scores` is `[batches, classes, boxes]`).
    pub classes: usize,
    /// Boxes per batch.
    pub boxes: usize,
    /// The most boxes any run selects per batch and class: the planned
    /// bound (the model's cap where it is a constant, else every box).
    pub cap: usize,
    /// The most boxes this run selects per batch and class (ONNX
    /// `max_output_boxes_per_class`; at most `cap` are taken, none when
    /// negative).
    pub max_per_class: i64,
    /// Boxes as `[x_center, y_center, width, height]` (else two opposite
    /// corners `[y1, x1, y2, x2]`, either diagonal).
    pub center_point_box: bool,
    /// Overlap (intersection over union) above which a box is suppressed.
    pub iou_threshold: f32,
    /// Scores at or below it are never selected (none: every box is a
    /// candidate).
    pub score_threshold: Option<f32>,
}

/// A box as the x and y extents it covers.
#[derive(Clone, Copy)]
struct Extent {
    x: (f32, f32),
    y: (f32, f32),
}

impl Extent {
    fn of(b: &[f32], center_point_box: bool) -> Extent {
        let sorted = |a: f32, b: f32| if a <= b { (a, b) } else { (b, a) };
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

    fn area(&self) -> f32 {
        (self.x.1 - self.x.0) * (self.y.1 - self.y.0)
    }

    /// Whether `other` overlaps this box by more than `threshold`; boxes
    /// without area never suppress.
    fn suppresses(&self, other: &Extent, threshold: f32) -> bool {
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

impl Nms {
    /// The most rows a run selects: every batch and class at its cap.
    pub fn bound(&self) -> usize {
        self.batches * self.classes * self.per_class_bound()
    }

    /// The `u32` scratch a run needs: the candidates of one class in
    /// order, and the boxes kept so far.
    pub fn scratch_len(&self) -> usize {
        self.boxes + self.per_class_bound()
    }

    fn per_class_bound(&self) -> usize {
        self.boxes.min(self.cap)
    }

    /// Selects from `boxes` (`[batches, boxes, 4]`) by `scores`
    /// (`[batches, classes, boxes]`) into `out`, rows `(batch, class, box)`
    /// in batch, class and selection order, the rows past the selection
    /// zero; returns how many rows it selected. `out` holds
    /// [`Nms::bound`] rows of 3, `scratch` [`Nms::scratch_len`] values.
    ///
    /// # Panics
    /// When a slice is shorter than the sizes say (callers size them from
    /// the same `Nms`).
    pub fn select(
        &self,
        boxes: &[f32],
        scores: &[f32],
        scratch: &mut [u32],
        out: &mut [i64],
    ) -> usize {
        out.fill(0);
        let (order, kept) = scratch.split_at_mut(self.boxes);
        let most = usize::try_from(self.max_per_class.max(0)).unwrap_or(usize::MAX);
        let kept = &mut kept[..self.per_class_bound().min(most)];
        let mut rows = 0;
        for b in 0..self.batches {
            let extent = |i: u32| {
                let at = (b * self.boxes + i as usize) * 4;
                Extent::of(&boxes[at..at + 4], self.center_point_box)
            };
            for c in 0..self.classes {
                let class_scores = &scores[(b * self.classes + c) * self.boxes..][..self.boxes];
                let mut candidates = 0;
                for (i, &s) in class_scores.iter().enumerate() {
                    if self.score_threshold.is_none_or(|t| s > t) {
                        order[candidates] = i as u32;
                        candidates += 1;
                    }
                }
                let order = &mut order[..candidates];
                // Best score first, then the lower index: a total order,
                // so the in-place (allocation-free) sort is deterministic.
                order.sort_unstable_by(|&i, &j| {
                    (class_scores[j as usize].total_cmp(&class_scores[i as usize])).then(i.cmp(&j))
                });
                let mut taken = 0;
                for &i in order.iter() {
                    if taken == kept.len() {
                        break;
                    }
                    let e = extent(i);
                    if kept[..taken]
                        .iter()
                        .all(|&k| !e.suppresses(&extent(k), self.iou_threshold))
                    {
                        kept[taken] = i;
                        taken += 1;
                        out[rows * 3..rows * 3 + 3].copy_from_slice(&[
                            b as i64,
                            c as i64,
                            i64::from(i),
                        ]);
                        rows += 1;
                    }
                }
            }
        }
        rows
    }
}

/// The elements `Unique` compares, as exact keys: floats widened to f64
/// (NaNs equal to one another and after every number), integers to i64.
#[derive(Clone, Copy, Debug)]
pub enum Keys<'a> {
    /// Float elements.
    Float(&'a [f64]),
    /// Integer elements.
    Int(&'a [i64]),
}

impl Keys<'_> {
    fn cmp(&self, a: usize, b: usize) -> std::cmp::Ordering {
        match self {
            Keys::Float(v) => match (v[a].is_nan(), v[b].is_nan()) {
                (false, false) => v[a].partial_cmp(&v[b]).unwrap_or(std::cmp::Ordering::Equal),
                (a_nan, b_nan) => a_nan.cmp(&b_nan),
            },
            Keys::Int(v) => v[a].cmp(&v[b]),
        }
    }
}

/// ONNX `Unique` of `n` slices (the flattened elements, or the slices
/// along an axis of a tensor viewed as `[outer, n, inner]`), as
/// onnxruntime orders them: ascending when `sorted` (slices compared
/// element by element), else by first occurrence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unique {
    /// Elements before the axis.
    pub outer: usize,
    /// Slices along the axis (the elements, flattened).
    pub n: usize,
    /// Elements after the axis.
    pub inner: usize,
    /// Ascending order (else first occurrence).
    pub sorted: bool,
}

impl Unique {
    /// The `i64` output: per unique slice its first index (`n` slots,
    /// zeros past the unique count), each slice's unique slot (`n`), each
    /// unique slice's count (`n` slots, zeros past), then the count.
    pub fn out_len(&self) -> usize {
        3 * self.n + 1
    }

    /// The `u32` scratch a run needs: the slices in order, and each
    /// group's output slot.
    pub fn scratch_len(&self) -> usize {
        2 * self.n
    }

    /// Writes [`Unique::out_len`] values to `out` from `keys`
    /// (`outer · n · inner` elements) with [`Unique::scratch_len`] of
    /// `scratch`; returns the count of unique slices.
    ///
    /// # Panics
    /// When a slice is shorter than the sizes say.
    pub fn select(&self, keys: Keys<'_>, scratch: &mut [u32], out: &mut [i64]) -> usize {
        let (n, inner) = (self.n, self.inner);
        out.fill(0);
        let (firsts, rest) = out.split_at_mut(n);
        let (inverse, rest) = rest.split_at_mut(n);
        let (counts, last) = rest.split_at_mut(n);
        let element = |slice: usize, k: usize| (k / inner) * n * inner + slice * inner + k % inner;
        let cmp_slices = |a: usize, b: usize| {
            (0..self.outer * inner)
                .map(|k| keys.cmp(element(a, k), element(b, k)))
                .find(|o| o.is_ne())
                .unwrap_or(std::cmp::Ordering::Equal)
        };
        let (order, slot) = scratch.split_at_mut(n);
        for (i, o) in order.iter_mut().enumerate() {
            *o = i as u32;
        }
        // Equal slices end up adjacent, the first occurrence first: a
        // total order, so the in-place sort is deterministic.
        order.sort_unstable_by(|&a, &b| cmp_slices(a as usize, b as usize).then(a.cmp(&b)));
        // Groups in sorted order: `firsts[g]` its first occurrence, and
        // each slice's group in `inverse` for now.
        let mut groups = 0;
        for k in 0..n {
            let s = order[k] as usize;
            if k == 0 || cmp_slices(order[k - 1] as usize, s).is_ne() {
                firsts[groups] = s as i64;
                groups += 1;
            }
            inverse[s] = groups as i64 - 1;
        }
        // The output slot of each group: its sorted rank, or its rank by
        // first occurrence.
        let slot = &mut slot[..groups];
        for (g, s) in slot.iter_mut().enumerate() {
            *s = g as u32;
        }
        if !self.sorted {
            slot.sort_unstable_by_key(|&g| firsts[g as usize]);
            // `slot` lists groups by occurrence; invert it into `order`
            // (free again) as group -> slot.
            for (p, &g) in slot.iter().enumerate() {
                order[g as usize] = p as u32;
            }
            slot.copy_from_slice(&order[..groups]);
            // `firsts` by slot, through `counts` (zero again below).
            for g in 0..groups {
                counts[slot[g] as usize] = firsts[g];
            }
            firsts[..groups].copy_from_slice(&counts[..groups]);
            counts[..groups].fill(0);
        }
        for i in inverse.iter_mut() {
            *i = i64::from(slot[*i as usize]);
        }
        for &i in inverse.iter() {
            counts[i as usize] += 1;
        }
        last[0] = groups as i64;
        groups
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nms(boxes: usize, max_per_class: usize, score_threshold: Option<f32>) -> Nms {
        Nms {
            batches: 1,
            classes: 1,
            boxes,
            cap: max_per_class,
            max_per_class: max_per_class as i64,
            center_point_box: false,
            iou_threshold: 0.5,
            score_threshold,
        }
    }

    #[test]
    fn overlapping_boxes_are_suppressed_best_first() {
        // Boxes 0 and 1 overlap by 81/119 > 0.5; box 2 is apart.
        let boxes = [0., 0., 10., 10., 1., 1., 10., 10., 20., 20., 30., 30.];
        let scores = [0.6, 0.9, 0.7];
        let n = nms(3, 10, None);
        let mut scratch = vec![0; n.scratch_len()];
        let mut out = vec![-1; n.bound() * 3];
        assert_eq!(n.select(&boxes, &scores, &mut scratch, &mut out), 2);
        assert_eq!(out, [0, 0, 1, 0, 0, 2, 0, 0, 0]);
        // A threshold drops box 0's candidates; a cap of one keeps the best.
        let n = nms(3, 1, Some(0.8));
        let mut out = vec![-1; n.bound() * 3];
        assert_eq!(n.select(&boxes, &scores, &mut scratch, &mut out), 1);
        assert_eq!(out, [0, 0, 1]);
    }

    fn unique(keys: Keys, outer: usize, n: usize, inner: usize, sorted: bool) -> Vec<i64> {
        let u = Unique {
            outer,
            n,
            inner,
            sorted,
        };
        let mut scratch = vec![0; u.scratch_len()];
        let mut out = vec![-1; u.out_len()];
        u.select(keys, &mut scratch, &mut out);
        out
    }

    #[test]
    fn unique_elements_sorted_and_by_first_occurrence() {
        // x = [2, 1, 1, 3, 4, 3] (the ONNX example).
        let x = [2.0, 1.0, 1.0, 3.0, 4.0, 3.0];
        let out = unique(Keys::Float(&x), 1, 6, 1, false);
        // firsts [0, 1, 3, 4], inverse [0, 1, 1, 2, 3, 2], counts [1, 2, 2, 1], count 4.
        assert_eq!(
            out,
            [0, 1, 3, 4, 0, 0, 0, 1, 1, 2, 3, 2, 1, 2, 2, 1, 0, 0, 4]
        );
        let out = unique(Keys::Float(&x), 1, 6, 1, true);
        // Sorted: [1, 2, 3, 4] at firsts [1, 0, 3, 4].
        assert_eq!(
            out,
            [1, 0, 3, 4, 0, 0, 1, 0, 0, 2, 3, 2, 2, 1, 2, 1, 0, 0, 4]
        );
    }

    #[test]
    fn unique_slices_along_an_axis() {
        // Rows of [[1, 0, 0], [1, 0, 0], [2, 3, 4]] along axis 0.
        let x = [1, 0, 0, 1, 0, 0, 2, 3, 4];
        let out = unique(Keys::Int(&x), 1, 3, 3, true);
        assert_eq!(out, [0, 2, 0, 0, 0, 1, 2, 1, 0, 2]);
    }

    #[test]
    fn equal_scores_take_the_lower_index_first() {
        let boxes = [0., 0., 10., 10., 0., 0., 10., 10.];
        let n = nms(2, 2, None);
        let mut scratch = vec![0; n.scratch_len()];
        let mut out = vec![0; n.bound() * 3];
        assert_eq!(n.select(&boxes, &[0.5, 0.5], &mut scratch, &mut out), 1);
        assert_eq!(out[..3], [0, 0, 0]);
    }
}
