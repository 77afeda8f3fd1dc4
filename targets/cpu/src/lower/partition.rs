//! Splitting a GEMM kernel into tasks that threads run concurrently.
//!
//! A schedule step may hold several kernels that write disjoint parts of
//! the output (`format::Step::tasks`); a session with a thread pool runs
//! them at once. [`split`] cuts one [`GemmSpec`] into such tasks at compile
//! time, from the shapes:
//!
//! - a kernel of several GEMM calls (a batched MatMul, the images of a
//!   batch) is split by calls, in contiguous groups;
//! - a kernel of fewer calls than tasks is split by output rows, in groups
//!   of whole row tiles: each task reads its rows of A (a strided operand
//!   from a row offset, packed panels from a panel offset), all of B, its
//!   rows of C, and writes its rows of the output;
//! - a kernel of fewer row tiles than tasks (a wide output of few rows: a
//!   pointwise convolution to few channels) is split by output columns, in
//!   groups of whole column tiles: each task reads all of A and its
//!   columns of B and C.
//!
//! (Depthwise convolutions split by channel groups, softmax by rows: see
//! `DepthwiseSpec::split` and `SoftmaxSpec::split`.)
//!
//! A kernel that builds its B with im2col is split by calls only (every
//! row task would rebuild the same B), at calls that build their B (the
//! output rows of an implicit-GEMM band share the band's copy); an int8
//! convolution with fewer calls than tasks is split by rows, each task
//! rebuilding B. Each task
//! gets scratch of its own (the caller reserves it per task), so
//! concurrent tasks never share a scratch panel. Kernels smaller than
//! [`MIN_TASK_FLOPS`] per task stay whole: below that the hand-off to the
//! workers costs more than it saves.

use crate::microkernel::gemm::{ALayout, Call, GemmSpec, Operand};

/// The least work (floating-point operations) worth a task of its own:
/// about 40 µs at this machine's single-core GEMM speed, well above the
/// microsecond or so a step costs while the workers spin (measured: the
/// attention products of MiniLM-L3 and PP-OCRv4 rec's smaller
/// convolutions gain from splitting at 4 M, not at 8 M).
pub(crate) const MIN_TASK_FLOPS: usize = 4 << 20;

/// `spec` as at most `tasks` independent kernels (see the module docs);
/// one when splitting does not pay or does not apply.
pub(crate) fn split(spec: GemmSpec, tasks: usize) -> Vec<GemmSpec> {
    let calls = spec.calls.len();
    let flops = 2 * spec.m * spec.n * spec.k * calls;
    let tasks = tasks.min(flops / MIN_TASK_FLOPS).max(1);
    if tasks < 2 {
        return vec![spec];
    }
    if calls >= tasks {
        // A call whose B another call built (the rows of an implicit-GEMM
        // band) stays in the task of the call that built it.
        let starts_group = |i: usize| spec.im2col.is_empty() || spec.calls[i].src.is_some();
        let mut bounds: Vec<usize> = (0..tasks)
            .map(|t| {
                (calls * t / tasks..calls)
                    .find(|&i| starts_group(i))
                    .unwrap_or(calls)
            })
            .collect();
        bounds.push(calls);
        bounds.dedup();
        // Calls that share a B built by one of them (the rows and groups
        // of an implicit-GEMM band) may leave fewer groups than tasks:
        // then rows split instead, below.
        if bounds.len() > tasks || spec.im2col.is_empty() {
            return bounds
                .windows(2)
                .map(|r| {
                    let mut part = spec.clone();
                    part.calls = spec.calls[r[0]..r[1]].to_vec();
                    part
                })
                .collect();
        }
    }
    let mr = spec.blocking.mr;
    let row_tiles = spec.m.div_ceil(mr);
    // A convolution short of calls would run on one thread: its row tasks
    // each build the whole B (in scratch of their own) and multiply their
    // output channels. The product costs `m / mr` times more than
    // building B (for an int8 quad im2col no less), so with a few tiles
    // per task the copy is paid back.
    let rebuild_b = row_tiles >= tasks;
    if !spec.im2col.is_empty() && !rebuild_b {
        return vec![spec];
    }
    // Each task reads all of the operand it does not split: split the
    // larger one (B is usually the weights), unless it has too few tiles.
    let col_tiles = spec.n.div_ceil(spec.blocking.nr());
    let b_larger = spec.n * spec.elem.b_size() as usize > spec.m * spec.elem.a_size() as usize;
    if spec.im2col.is_empty() && (row_tiles < tasks || (b_larger && col_tiles >= tasks)) {
        return split_columns(spec, tasks);
    }
    (0..tasks)
        .map(|t| {
            let first_tile = row_tiles * t / tasks;
            let end_tile = row_tiles * (t + 1) / tasks;
            let start = first_tile * mr;
            let rows = (end_tile * mr).min(spec.m) - start;
            let mut part = spec.clone();
            part.m = rows;
            for call in &mut part.calls {
                *call = rows_from(&spec, call, first_tile);
            }
            for step in &mut part.epilogue {
                for o in [&mut step.a, &mut step.b] {
                    if let Operand::PerRow(loc) = o {
                        *loc = loc.moved(start as i64 * 4);
                    }
                }
            }
            part.row_sums = spec.row_sums.map(|loc| loc.moved(start as i64 * 4));
            part
        })
        .collect()
}

/// `call` of `spec` moved down to the rows from row tile `first_tile` on:
/// its A (rows of a strided A, panels of a packed one), its output and
/// its C. Per-row epilogue operands and row sums are the spec's, moved by
/// the caller.
fn rows_from(spec: &GemmSpec, call: &Call, first_tile: usize) -> Call {
    let mr = spec.blocking.mr;
    let start = (first_tile * mr) as i64;
    let a = match spec.a {
        ALayout::Strided { row, .. } => call.a.moved(start * row),
        ALayout::Packed => {
            let panel = mr as i64 * spec.k as i64 * spec.elem.a_size();
            call.a.moved(first_tile as i64 * panel)
        }
    };
    let c = match (call.c, spec.c) {
        (Some(c), Some(layout)) => Some(c.moved(start * layout.row)),
        (c, _) => c,
    };
    Call {
        a,
        out: call.out.moved(start * spec.out_row),
        c,
        ..*call
    }
}

/// Bytes of output one GEMM call writes, above which its rows are cut into
/// bands of calls (see [`in_row_bands`]).
const OUTPUT_BAND_BYTES: usize = 1 << 20;

/// `spec` with each call whose output exceeds [`OUTPUT_BAND_BYTES`] cut
/// into bands of whole row tiles, one call each: the kernel sweeps every
/// row of a call per column tile, and a band keeps those rows in cache
/// (the 1024³ GEMM kernel went from 82.5% to 89.7% of peak with a
/// constant A, 69.9% to 76.9% with a constant B; Whisper's 8-head
/// 1500×64×1500 scores only from 37.9 to 34.8 ms: their 72 MB output
/// does not fit L3 either way). Only where the bands can be addressed
/// by moving the calls' pointers: no im2col, no per-row epilogue operand
/// or row sums, C broadcast over rows; M must have a divisor that is a
/// multiple of the tile's rows.
pub(crate) fn in_row_bands(mut spec: GemmSpec) -> GemmSpec {
    let mr = spec.blocking.mr;
    let row_free = |o: Operand| !matches!(o, Operand::PerRow(_));
    let movable = spec.im2col.is_empty()
        && spec.row_sums.is_none()
        && spec.c.is_none_or(|c| c.row == 0)
        && (spec.epilogue.iter()).all(|st| row_free(st.a) && row_free(st.b));
    if !movable || spec.m * spec.n * 4 <= OUTPUT_BAND_BYTES {
        return spec;
    }
    // The most rows, a multiple of the tile and dividing M, whose output
    // fits the band size.
    let Some(band) = (1..spec.m).rev().find(|&b| {
        b.is_multiple_of(mr) && spec.m.is_multiple_of(b) && b * spec.n * 4 <= OUTPUT_BAND_BYTES
    }) else {
        return spec;
    };
    let tiles = band / mr;
    let calls: Vec<Call> = (spec.calls.iter())
        .flat_map(|call| (0..spec.m / band).map(move |b| (call, b * tiles)))
        .map(|(call, first_tile)| rows_from(&spec, call, first_tile))
        .collect();
    spec.calls = calls;
    spec.m = band;
    spec
}

/// `spec` split by output columns into at most `tasks` groups of whole
/// column tiles (one when there are too few tiles).
fn split_columns(spec: GemmSpec, tasks: usize) -> Vec<GemmSpec> {
    let nr = spec.blocking.nr();
    let col_tiles = spec.n.div_ceil(nr);
    let tasks = tasks.min(col_tiles);
    if tasks < 2 {
        return vec![spec];
    }
    let b_tile = spec.b_tile_bytes();
    (0..tasks)
        .map(|t| {
            let first_tile = col_tiles * t / tasks;
            let end_tile = col_tiles * (t + 1) / tasks;
            let start = first_tile * nr;
            let mut part = spec.clone();
            part.n = (end_tile * nr).min(spec.n) - start;
            for call in &mut part.calls {
                call.b = call.b.moved(first_tile as i64 * b_tile);
                call.out = call.out.moved(start as i64 * 4);
                if let (Some(c), Some(layout)) = (call.c, spec.c) {
                    if layout.per_column {
                        call.c = Some(c.moved(start as i64 * 4));
                    }
                }
            }
            for step in &mut part.epilogue {
                for o in [&mut step.a, &mut step.b] {
                    if let Operand::PerColumn(loc) = o {
                        *loc = loc.moved(start as i64 * 4);
                    }
                }
            }
            part
        })
        .collect()
}
