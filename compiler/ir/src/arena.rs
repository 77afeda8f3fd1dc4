//! Arena offset assignment shared by every target: greedy best-fit packing
//! of live intervals into one arena (the "greedy by size" heap simulator of
//! TFLite and XLA). The CPU target packs host memory with it, the CUDA
//! target device memory.
//!
//! Buffers are placed largest first (ties: earlier start, then lower index,
//! so the result is deterministic). Each buffer goes into the smallest
//! 64-byte aligned gap between the already placed buffers whose live
//! intervals intersect its own (ties: the lowest offset); when no gap is big
//! enough it goes above the highest of them.

/// Alignment of every arena region (a cache line; also enough for any
/// vector load on CPU or GPU).
pub const ALIGN: u64 = 64;

/// `x` rounded up to [`ALIGN`].
pub fn align(x: u64) -> u64 {
    x.div_ceil(ALIGN) * ALIGN
}

/// One buffer to place: byte size and inclusive live interval in steps.
#[derive(Clone, Copy, Debug)]
pub struct Interval {
    /// Size in bytes.
    pub bytes: u64,
    /// First step at which the buffer holds a live value.
    pub start: u32,
    /// Last step at which it is read (or the end of the schedule).
    pub end: u32,
}

impl Interval {
    fn overlaps(&self, o: &Interval) -> bool {
        self.start <= o.end && o.start <= self.end
    }
}

/// Returns every buffer's offset (64-byte aligned) and the arena size (the
/// highest end, rounded up to 64, at least 64). Zero-sized buffers get
/// offset 0 and take no space.
pub fn pack(bufs: &[Interval]) -> (Vec<u64>, u64) {
    let mut idx: Vec<usize> = (0..bufs.len()).filter(|&i| bufs[i].bytes > 0).collect();
    idx.sort_by(|&a, &b| {
        bufs[b]
            .bytes
            .cmp(&bufs[a].bytes)
            .then(bufs[a].start.cmp(&bufs[b].start))
            .then(a.cmp(&b))
    });
    let mut offsets = vec![0u64; bufs.len()];
    // Placed buffers as (offset, end offset, index).
    let mut placed: Vec<(u64, u64, usize)> = Vec::new();
    let mut top = 0u64;
    for i in idx {
        let b = bufs[i];
        let mut live: Vec<(u64, u64)> = placed
            .iter()
            .filter(|&&(_, _, j)| bufs[j].overlaps(&b))
            .map(|&(o, e, _)| (o, e))
            .collect();
        live.sort_unstable();
        let mut best: Option<(u64, u64)> = None; // (gap size, offset)
        let mut cursor = 0u64;
        for &(o, e) in &live {
            let at = align(cursor);
            if o >= at && o - at >= b.bytes {
                let gap = o - at;
                if best.is_none_or(|(g, _)| gap < g) {
                    best = Some((gap, at));
                }
            }
            cursor = cursor.max(e);
        }
        let off = match best {
            Some((_, at)) => at,
            None => align(cursor),
        };
        offsets[i] = off;
        placed.push((off, off + b.bytes, i));
        top = top.max(off + b.bytes);
    }
    (offsets, align(top).max(ALIGN))
}

/// The most bytes (each buffer rounded up to 64) live at any one step: a
/// lower bound for any arena holding these intervals.
pub fn peak_live(bufs: &[Interval]) -> u64 {
    let mut events: Vec<(u32, i8, u64)> = Vec::new();
    for b in bufs.iter().filter(|b| b.bytes > 0) {
        events.push((b.start, 0, align(b.bytes)));
        events.push((b.end, 1, align(b.bytes)));
    }
    // At equal steps, starts before ends (intervals are inclusive).
    events.sort_unstable();
    let (mut cur, mut peak) = (0u64, 0u64);
    for (_, kind, bytes) in events {
        if kind == 0 {
            cur += bytes;
            peak = peak.max(cur);
        } else {
            cur -= bytes;
        }
    }
    peak
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iv(bytes: u64, start: u32, end: u32) -> Interval {
        Interval { bytes, start, end }
    }

    #[test]
    fn disjoint_intervals_share_space() {
        let (off, size) = pack(&[iv(100, 0, 1), iv(100, 2, 3), iv(100, 4, 5)]);
        assert_eq!(off, vec![0, 0, 0]);
        assert_eq!(size, 128);
    }

    #[test]
    fn overlapping_intervals_do_not_share() {
        let bufs = [iv(100, 0, 2), iv(64, 1, 3), iv(10, 2, 2)];
        let (off, size) = pack(&bufs);
        for i in 0..3 {
            assert_eq!(off[i] % 64, 0);
            for j in 0..i {
                let (a, b) = (bufs[i], bufs[j]);
                if a.overlaps(&b) {
                    assert!(off[i] + a.bytes <= off[j] || off[j] + b.bytes <= off[i]);
                }
            }
        }
        assert_eq!(size, peak_live(&bufs));
    }

    #[test]
    fn best_fit_prefers_the_smallest_gap() {
        // Long-lived 0, 2, 4 leave two holes when 1 and 3 die: [512, 768)
        // and [896, 960). The last buffer takes the smaller one.
        let bufs = [
            iv(512, 0, 10),
            iv(256, 0, 1),
            iv(128, 0, 10),
            iv(64, 0, 1),
            iv(64, 0, 10),
            iv(64, 5, 6),
        ];
        let (off, size) = pack(&bufs);
        assert_eq!(&off[..5], &[0, 512, 768, 896, 960]);
        assert_eq!(off[5], 896);
        assert_eq!(size, 1024);
    }

    #[test]
    fn zero_sized_buffers_take_no_space() {
        let (off, size) = pack(&[iv(0, 0, 5), iv(8, 0, 5)]);
        assert_eq!(off, vec![0, 0]);
        assert_eq!(size, 64);
    }
}
