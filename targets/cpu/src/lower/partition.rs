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
//! [`MIN_TASK_FLOPS`] and [`MIN_TASK_BYTES`] per task stay whole: below
//! that the hand-off to the workers costs more than it saves.

use crate::microkernel::epilogue::Operand;
use crate::microkernel::gemm::{ALayout, BLayout, Call, GemmSpec};
use crate::microkernel::im2col::{Im2col, Im2colKernel};
use crate::plan::{Base, Loc};

/// The least work (floating-point operations) worth a task of its own:
/// about 40 µs at this machine's single-core GEMM speed, well above the
/// microsecond or so a step costs while the workers spin (measured: the
/// attention products of MiniLM-L3 and PP-OCRv4 rec's smaller
/// convolutions gain from splitting at 4 M, not at 8 M). Not lower: a
/// convolution split by rows has each task build its own B, which a
/// one-thread run of the artifact pays twice (DenseNet-121, one thread,
/// `kiln bench --random --runs 20`, 2026-12-07: 57.1–58.2 ms at 4 M,
/// 58.3–59.9 ms at 1 M).
pub(crate) const MIN_TASK_FLOPS: usize = 4 << 20;

/// The least operand traffic (bytes read and written) worth a task of its
/// own: a kernel that streams more from memory than it computes (a
/// matrix-vector product's weights, a depthwise convolution's channels)
/// and whose split costs no extra work (each task reads its own part).
/// From DRAM a core streams about 1 MB in 40 µs; from its L2 (a recurrent
/// layer's weights, read again every time step) about 1 MB in 10 µs, so
/// 128 KB per task still takes several times the 0.2 µs a step's hand-over
/// costs (`pool::tests::hand_over_cost` in the runtime). Was 1 MB with a
/// hand-over of 1.1 µs; at 128 KB the GRU zoo model's 768 × 256 recurrence
/// products split, and at two threads (`kiln bench --random --runs 50
/// --threads 2`, artifacts of both thresholds alternated, 2026-12-07) it
/// ran 3.6 → 2.5 ms, MobileNetV2 4.2 → 3.9 ms, EfficientNet-B0 7.7 →
/// 7.2 ms (with [`SPLIT_MIN_ELEMENTS`](super::SPLIT_MIN_ELEMENTS) lowered
/// alike); ResNet-18, YOLO, ConvNeXt and BERT within noise.
pub(crate) const MIN_TASK_BYTES: usize = 128 << 10;

/// How many of `tasks` a kernel of `flops` operations over `bytes` of
/// operands is worth: one per [`MIN_TASK_FLOPS`] or per
/// [`MIN_TASK_BYTES`], whichever gives more, at least one.
pub(crate) fn tasks_worth(tasks: usize, flops: usize, bytes: usize) -> usize {
    tasks
        .min((flops / MIN_TASK_FLOPS).max(bytes / MIN_TASK_BYTES))
        .max(1)
}

/// `0..n` in at most `parts` nearly equal, non-empty ranges.
pub(crate) fn even_ranges(n: usize, parts: usize) -> Vec<std::ops::Range<usize>> {
    let parts = parts.clamp(1, n.max(1));
    (0..parts)
        .map(|i| n * i / parts..n * (i + 1) / parts)
        .collect()
}

/// `spec` as at most `tasks` independent kernels (see the module docs);
/// one when splitting does not pay or does not apply.
pub(crate) fn split(spec: GemmSpec, tasks: usize) -> Vec<GemmSpec> {
    let calls = spec.calls.len();
    let tasks = worth_splitting(&spec, tasks);
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
    // An A built by im2col (pixels as rows) is built whole by every
    // task, each multiplying it by its columns of B.
    if spec.im2col_into_a {
        return split_columns(spec, tasks);
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

/// How many of `tasks` the work of `spec` is worth ([`tasks_worth`] of
/// its products and of its operands and output).
fn worth_splitting(spec: &GemmSpec, tasks: usize) -> usize {
    let (m, n, k, calls) = (spec.m, spec.n, spec.k, spec.calls.len());
    let flops = 2 * m * n * k * calls;
    let a = m * k * spec.elem.a_size() as usize;
    let b = k * n * spec.elem.b_size() as usize;
    tasks_worth(tasks, flops, calls * (a + b + m * n * 4))
}

/// An im2col convolution as two steps (see [`stage_im2col`]).
pub(crate) struct Staged {
    /// The first step's tasks: each builds its share of the im2col
    /// matrices, addressed from offset 0 of the shared scratch.
    pub im2col: Vec<Im2colKernel>,
    /// The second step: the GEMM over the matrices (B addressed from
    /// offset 0 of the same scratch), to be [`split`] like any other.
    pub gemm: GemmSpec,
    /// Bytes of that scratch: every call's matrix, one after the other.
    pub col_bytes: u64,
}

/// An f32 im2col convolution of fewer GEMM calls than the tasks it is
/// worth, as two steps: its im2col matrices built once, split by input
/// channels into tasks, then the GEMM over them split by rows or columns.
/// [`split`] would give each row task a whole copy of B to build: at four
/// tasks four copies, which a session of one thread builds one after the
/// other (a 3×3 convolution of 256 channels on 14×14, `kiln bench
/// --threads 1`: 2.15 ms compiled for four tasks, 1.67 ms for one).
/// `None` for any other kernel.
pub(crate) fn stage_im2col(spec: &GemmSpec, tasks: usize) -> Option<Staged> {
    let tasks = worth_splitting(spec, tasks);
    let f32_copies = spec.im2col.iter().all(|r| r.quads.is_none());
    let every_call_builds = spec.calls.iter().all(|c| c.src.is_some());
    if tasks < 2
        || spec.calls.len() >= tasks
        || spec.im2col.is_empty()
        || !f32_copies
        || !every_call_builds
        || !matches!(spec.b, BLayout::Strided { .. })
        || spec.im2col_into_a
    {
        return None;
    }
    let at = |offset: u64| Loc {
        base: Base::Arena,
        offset,
    };
    // Each call's matrix gets scratch of its own.
    let mut cols = Vec::with_capacity(spec.calls.len());
    let mut col_bytes = 0;
    for call in &spec.calls {
        let (_, routine) = call.src?;
        cols.push(col_bytes);
        col_bytes += spec.im2col[routine].col_bytes().next_multiple_of(64);
    }
    // The (call, input channel) pairs, cut into `tasks` contiguous runs;
    // a channel's rows of `col` are contiguous (rows run over
    // `(channel, th, tw)`).
    let cin = spec.im2col[0].cin;
    let units = spec.calls.len() * cin;
    let mut im2col = Vec::with_capacity(tasks);
    for t in 0..tasks {
        let (start, end) = (units * t / tasks, units * (t + 1) / tasks);
        let mut kernel = Im2colKernel {
            routines: Vec::new(),
            jobs: Vec::new(),
        };
        let mut u = start;
        while u < end {
            let (i, c0) = (u / cin, u % cin);
            let c1 = cin.min(c0 + end - u);
            let (src, r) = spec.calls[i].src?;
            let full = spec.im2col[r];
            let part = Im2col {
                cin: c1 - c0,
                ..full
            };
            let routine = super::intern(&mut kernel.routines, part, |&q| q == part);
            let plane = (full.h * full.w * full.elem_bytes()) as i64;
            let rows = (full.kh * full.kw * full.row_bytes()) as i64;
            kernel.jobs.push((
                src.moved(c0 as i64 * plane),
                at(cols[i]).moved(c0 as i64 * rows),
                routine,
            ));
            u += c1 - c0;
        }
        if !kernel.jobs.is_empty() {
            im2col.push(kernel);
        }
    }
    let mut gemm = spec.clone();
    gemm.im2col.clear();
    for (call, &col) in gemm.calls.iter_mut().zip(&cols) {
        call.src = None;
        call.b = at(col);
    }
    Some(Staged {
        im2col,
        gemm,
        col_bytes,
    })
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

/// `spec` with its calls merged into one GEMM when they are one product
/// cut by batch entries: every call multiplies the same B, its A rows
/// follow the previous call's (a strided A) and so do its output rows, C
/// and the epilogue operands do not vary by row. One GEMM reads B once
/// where `calls` products of `m` rows read it `calls` times: an LSTM's
/// input projection over 100 steps, `[100, 1, 1024] @ [1024, 2048]`,
/// took 17.1 ms as 100 matrix-vector products and 2.4 ms as one GEMM
/// (`kiln bench --profile`, one thread). The tile stays as chosen: the
/// MatMul lowering picks it for the folded rows where they may fold.
pub(crate) fn batch_rows_folded(mut spec: GemmSpec) -> GemmSpec {
    let ALayout::Strided { row, .. } = spec.a else {
        return spec;
    };
    let row_free = |o: Operand| !matches!(o, Operand::PerRow(_));
    let movable = spec.im2col.is_empty()
        && spec.row_sums.is_none()
        && spec.c.is_none_or(|c| c.row == 0)
        && (spec.epilogue.iter()).all(|st| row_free(st.a) && row_free(st.b));
    let Some(&first) = spec.calls.first() else {
        return spec;
    };
    let m = spec.m as i64;
    let follows = |i: usize, c: &Call| {
        let i = i as i64;
        c.a == first.a.moved(i * m * row)
            && c.out == first.out.moved(i * m * spec.out_row)
            && (c.b, c.c, c.src) == (first.b, first.c, None)
    };
    if !movable
        || spec.calls.len() < 2
        || !spec.calls.iter().enumerate().all(|(i, c)| follows(i, c))
    {
        return spec;
    }
    spec.m *= spec.calls.len();
    spec.calls = vec![first];
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
