//! A 3×3 stride-1 convolution as Winograd F(4×4, 3×3): an input
//! transform, 36 GEMMs (one per position of the transformed 6×6 tile,
//! channels as rows and tiles along the vectors, the transformed weights
//! packed at compile time), an output transform that adds the bias and a
//! leading Relu or Clip, then the rest of a fused program. Over whole
//! images as three steps (a batch's tiles side by side in the GEMMs), or,
//! for large maps of few channels, per band of tile rows inside each
//! task's kernel ([`BANDED_RATIO`]). The GEMMs do 4× fewer multiplies than
//! the direct form; the transforms are passes over `V` and `M` (2.25× the
//! input and the output), so the tile cost model weighs both (see
//! [`winograd_conv`]). The kernels are in [`crate::microkernel::winograd`].

use super::*;
use crate::lower::partition::even_ranges;
use crate::microkernel::winograd::{transform_weights, Stage, Tiling, WinogradTask, POSITIONS};

/// Modeled cycles (the tile model's units: 64 FLOPs at the measured
/// peak) charged per lane of `V` and of `M` that the transforms write and
/// read (whole vectors of 16 tiles per tile row). Measured with `kiln
/// bench --profile` on the shape sweep's 3×3 convolutions at one thread:
/// 0.15–0.5 while `V` and `M` stay in the caches, 0.8 for VGG's 112×112
/// of 128 channels (14 MB each); see `docs/performance.md`.
const TRANSFORM_CYCLES: f64 = 0.5;

/// The Winograd GEMMs' modeled cycles are multiplied by this: their K is
/// the channels alone (64–512 where the direct GEMM's is 9×), and they
/// ran at 72–101 GFLOP/s on the same shapes where the direct ones ran at
/// 95–105.
const GEMM_CHARGE: f64 = 1.15;

/// Candidate `avx512/winograd` for convolution `cx` (see the module
/// docs). Declines before it packs or reserves anything.
pub(super) fn winograd_conv(
    cx: &NodeCx,
    c: &Conv2d,
    weights: &mut Weights,
    scratch: &mut Scratch,
    fused: Option<(&NodeCx, &FusedKernel)>,
    machine: Machine,
) -> Attempt<Served> {
    let Machine { vector, tasks } = machine;
    require(vector == Vector::Zmm, || {
        "built for AVX-512 only (the transforms split tile columns with two-table permutes \
         and masks); AVX2 runs the direct GEMMs"
            .into()
    })?;
    let ConvDims {
        x: [batch, cin, h, w],
        w: [oc, _, kh, kw],
        y: [oh, ow],
    } = ConvDims::of(cx);
    require((kh, kw) == (3, 3), || {
        format!("F(4x4, 3x3) takes 3x3 windows, not {kh}x{kw}")
    })?;
    require(c.strides == [1, 1] && c.dilations == [1, 1], || {
        "the convolution is strided or dilated".into()
    })?;
    require(c.group == 1, || format!("{} groups", c.group))?;
    // The weights are transformed in f64 and stored as f32 whatever
    // their type; the image must be f32.
    conv_gemm_elem(cx, c)?;
    program_after_head(cx, fused, "the output transform writes")?;
    let wv = float_constant(cx.graph, cx.input_ids[1])
        .or_decline(|| "the weights are not a constant".into())?;
    let tiling = Tiling {
        h,
        w,
        oh,
        ow,
        pad_tl: [c.pads[0], c.pads[1]],
    };
    let t = tiling.count();
    let (image_bytes, u_bytes) = (
        (POSITIONS * (cin + oc) * t * 4) as u64,
        (POSITIONS * cin * oc * 4) as u64,
    );
    let staged = image_bytes < BANDED_RATIO * u_bytes && batch as u64 * image_bytes <= MAX_SCRATCH;
    let (th, tw) = tiling.tiles();
    let tasks = tasks.max(1);
    let (band, bands) = match staged {
        true => (th, 1),
        false => band_rows(&tiling, [cin, oc], batch, tasks),
    };
    // Staged, the GEMMs' columns are every image's tiles; in bands, a
    // band's.
    let row = if staged { batch * t } else { band * tw };
    // A band at least as large as U: huge weights make huge bands.
    let held = (POSITIONS * (cin + oc) * row * 4) as u64;
    require(held <= MAX_SCRATCH, || too_much_scratch(held))?;
    require(u_bytes <= MAX_TRANSFORMED_WEIGHTS, || {
        format!("the transformed weights would take {u_bytes} bytes (4x the weights)")
    })?;
    let k = 9 * cin;
    let direct =
        batch as f64 * Blocking::modeled_cycles(vector, oc, oh * ow, packed_a_rows(k)) * k as f64;
    let gemms = GEMM_CHARGE * (POSITIONS * batch * t) as f64 / row as f64
        * Blocking::modeled_cycles(vector, oc, row, packed_a_rows(cin))
        * cin as f64;
    // The transforms run over whole vectors of 16 tiles per tile row.
    let lanes = batch * th * tw.div_ceil(16) * 16;
    let transforms = TRANSFORM_CYCLES * (POSITIONS * lanes * (cin + oc)) as f64;
    let winograd = gemms + transforms;
    require(winograd < direct, || {
        format!(
            "F(4x4, 3x3) is modeled at {winograd:.0} cycles ({batch} images of {t} tiles: \
             GEMMs {gemms:.0}, transforms {transforms:.0}), the direct GEMM at {direct:.0}"
        )
    })?;
    let how = format!("winograd {:?}", cx.inputs[1].1.shape);
    let packed = Some((1, PackedSide::Rows, how));
    let blocking = packed_blocking(cx, weights, packed, (vector, oc, row, packed_a_rows(cin)));
    let part = packed_w_len(Elem::F32, oc, cin, blocking.mr);
    let u_base = packed_loc(weights, part * POSITIONS, || {
        let u = transform_weights(&wv, oc, cin);
        let pack = |xi: usize| {
            pack_a(
                &u[xi * oc * cin..][..oc * cin],
                oc,
                cin,
                cin,
                1,
                blocking.mr,
            )
        };
        (0..POSITIONS).flat_map(pack).collect()
    });
    let (act, tail) = match fused {
        Some((_, kernel)) => pixel_rows::leading_activation(kernel.body()),
        None => (Activation::None, None),
    };
    let conv = Winograd {
        cx,
        task: WinogradTask {
            tiling,
            channels: [cin, oc],
            row,
            act,
            gemms: Vec::new(),
            stages: Vec::new(),
        },
        batch,
        band,
        u: (u_base, part as i64),
        blocking,
    };
    let served = |before, codes, after| Served {
        before,
        codes,
        tail: tail.map(|program| Tail {
            program,
            src: cx.out,
        }),
        after,
        kernel: WINOGRAD,
    };
    Ok(match staged {
        true => {
            let (input, gemm, output) = conv.staged(scratch, tasks)?;
            let input = Step {
                suffix: "winograd-in",
                tasks: input,
            };
            let output = Step {
                suffix: "winograd-out",
                tasks: output,
            };
            served(Some(input), gemm, Some(After::Step(output)))
        }
        false => served(None, conv.banded(scratch, tasks, bands)?, None),
    })
}

/// Where the transformed tiles go, by how `V` and `M` compare with the
/// transformed weights `U`: up to [`BANDED_RATIO`] times `U` (per image),
/// whole images in three steps (the input transform split by channels,
/// the GEMMs, the output transform split by channels), `U` read once; past
/// it, bands of tile rows small enough for the L2 cache, each task
/// running all three stages over its bands, `U` read once per band.
/// Measured at one thread (`kiln bench --profile`, both forms): bands won
/// 1.24–1.65× on maps of 32–64 channels from 128×128 (UNet, VGG-16's
/// first block, Inception-v3's stem; `V` and `M` 37–58 MB against a `U` of
/// 0.6 MB) and lost 0.55–0.92× where `U` is as large as an image's tiles
/// (VGG-16's 512 channels on 14×14 and 28×28, ResNet-18's 128 and 256).
const BANDED_RATIO: u64 = 8;

/// The machine code of a step's tasks.
type Tasks = Vec<Vec<u8>>;

/// A Winograd convolution being lowered.
struct Winograd<'a, 'g> {
    cx: &'a NodeCx<'g>,
    /// The kernels' common part (no stages or GEMMs yet).
    task: WinogradTask,
    batch: usize,
    /// Tile rows per band (banded).
    band: usize,
    /// The packed `U` and the bytes per position.
    u: (Loc, i64),
    blocking: Blocking,
}

impl Winograd<'_, '_> {
    /// The 36 GEMMs of `n` tiles of `V` at `v` into `M` at `m` (rows of
    /// the task's row length).
    fn gemm(&self, n: usize, (v, m): (Loc, Loc), panel: Option<Loc>) -> GemmSpec {
        let [cin, oc] = self.task.channels;
        let [v_xi, m_xi] = self.task.xi_strides();
        let row = self.task.channel_bytes();
        let (u, part) = self.u;
        GemmSpec {
            b: BLayout::Strided { row },
            out_row: row,
            calls: (0..POSITIONS as i64)
                .map(|xi| Call {
                    a: u.moved(xi * part),
                    b: v.moved(xi * v_xi),
                    out: m.moved(xi * m_xi),
                    c: None,
                    src: None,
                })
                .collect(),
            b_panel: panel,
            ..conv_gemm(oc, n, cin, Elem::F32, self.blocking, false)
        }
    }

    /// The bytes of `V` and `M`: every image's tiles (staged), or a
    /// band's.
    fn tile_bytes(&self) -> [u64; 2] {
        (self.task.xi_strides()).map(|xi| (POSITIONS as i64 * xi) as u64)
    }

    /// The images and the output at image `img`, channel `c`.
    fn image(&self, img: usize, c: usize) -> (Loc, Loc) {
        let [cin, oc] = self.task.channels;
        let t = self.task.tiling;
        let (plane, out_plane) = ((t.h * t.w * 4) as i64, (t.oh * t.ow * 4) as i64);
        let x = self.cx.inputs[0]
            .0
            .moved((img * cin) as i64 * plane + c as i64 * plane);
        let y = self
            .cx
            .out
            .moved((img * oc) as i64 * out_plane + c as i64 * out_plane);
        (x, y)
    }

    fn bias(&self, c: usize) -> Option<Loc> {
        self.cx
            .inputs
            .get(2)
            .map(|&(loc, _)| loc.moved(4 * c as i64))
    }

    /// Whole images in three steps: the input transforms' tasks, the
    /// GEMMs' tasks, the output transforms' tasks.
    fn staged(&self, scratch: &mut Scratch, tasks: usize) -> Attempt<(Tasks, Tasks, Tasks)> {
        let [cin, oc] = self.task.channels;
        let held = scratch.hold(&self.tile_bytes());
        let (v, m) = (held[0], held[1]);
        let t = self.task.tiling.count();
        let th = self.task.tiling.tiles().0;
        let channel = self.task.channel_bytes();
        // Image `img`'s tiles start `img · T` tiles into each row.
        let image = |img: usize| {
            let at = (img * t * 4) as i64;
            (v.moved(at), m.moved(at))
        };
        let spec = self.gemm(self.batch * t, (v, m), None);
        let Parts { gemm, .. } =
            assemble_parts(self.cx, spec, scratch, tasks, HeadOutput::InPlace)?;
        let kernel = |stages: Vec<Stage>| WinogradTask {
            stages,
            ..self.task.clone()
        };
        let input = (even_ranges(cin, tasks).into_iter())
            .map(|r| {
                let stages = (0..self.batch).map(|img| Stage::Input {
                    x: self.image(img, r.start).0,
                    v: image(img).0.moved(r.start as i64 * channel),
                    channels: r.len(),
                    rows: 0..th,
                });
                kernel(stages.collect()).assemble()
            })
            .collect::<Result<Vec<_>, _>>()?;
        let output = (even_ranges(oc, tasks).into_iter())
            .map(|r| {
                let stages = (0..self.batch).map(|img| Stage::Output {
                    m: image(img).1.moved(r.start as i64 * channel),
                    y: self.image(img, r.start).1,
                    bias: self.bias(r.start),
                    channels: r.len(),
                    rows: 0..th,
                });
                kernel(stages.collect()).assemble()
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok((input, gemm, output))
    }

    /// Bands of tile rows, each task running all three stages over its
    /// bands (of `bands` per image) with `V` and `M` of its own.
    fn banded(&self, scratch: &mut Scratch, tasks: usize, bands: usize) -> Attempt<Tasks> {
        let [cin, oc] = self.task.channels;
        let (th, tw) = self.task.tiling.tiles();
        let band = self.band;
        let items: Vec<(usize, usize)> = (0..self.batch)
            .flat_map(|img| (0..bands).map(move |b| (img, b)))
            .collect();
        let mut codes = Vec::new();
        for run in even_ranges(items.len(), tasks) {
            let held = scratch.hold(&self.tile_bytes());
            let vm = (held[0], held[1]);
            let panel_bytes = scratch_bytes(&self.gemm(band * tw, vm, None)).1;
            let panel = (panel_bytes > 0).then(|| scratch.hold(&[panel_bytes])[0]);
            let mut task = self.task.clone();
            let mut heights: Vec<usize> = Vec::new();
            for &(img, b) in &items[run] {
                let rows = b * band..((b + 1) * band).min(th);
                let n = rows.len() * tw;
                let g = super::super::intern(&mut heights, n, |&m| m == n);
                let (x, y) = self.image(img, 0);
                task.stages.extend([
                    Stage::Input {
                        x,
                        v: vm.0,
                        channels: cin,
                        rows: rows.clone(),
                    },
                    Stage::Gemm(g),
                    Stage::Output {
                        m: vm.1,
                        y,
                        bias: self.bias(0),
                        channels: oc,
                        rows,
                    },
                ]);
            }
            task.gemms = (heights.iter())
                .map(|&n| self.gemm(n, vm, panel).assemble())
                .collect::<Result<_, _>>()?;
            codes.push(task.assemble()?);
        }
        Ok(codes)
    }
}

/// Most bytes of transformed weights (`U`, 4× the weights) one
/// convolution stores: past it the weights section grows by more than the
/// direct GEMM saves, and its offsets approach 32-bit displacements.
const MAX_TRANSFORMED_WEIGHTS: u64 = 256 << 20;

/// Bytes of `V` and `M` a band aims at: they stay in the core's L2 cache
/// (1 MiB here) from the transform that writes them to the one that reads
/// them, beside a slice of the weights.
const BAND_BYTES: u64 = 512 << 10;

/// Tile rows per band, and bands per image: `V` and `M` of a band near
/// [`BAND_BYTES`], but at least as large as the transformed weights (each
/// band reads all of them), and enough bands for `tasks`.
fn band_rows(tiling: &Tiling, [cin, oc]: [usize; 2], batch: usize, tasks: usize) -> (usize, usize) {
    let (th, tw) = tiling.tiles();
    let row = (POSITIONS * (cin + oc) * tw * 4) as u64;
    let weights = (POSITIONS * cin * oc * 4) as u64;
    let mut band = (BAND_BYTES / row)
        .max(weights.div_ceil(row))
        .clamp(1, th as u64) as usize;
    let wanted = tasks.min(batch * th);
    if batch * th.div_ceil(band) < wanted {
        band = th.div_ceil(wanted.div_ceil(batch));
    }
    (band, th.div_ceil(band))
}
