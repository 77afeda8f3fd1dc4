//! MatMul (batched, broadcast, numpy 1-D promotion) and Gemm: one tiled
//! shared-memory GEMM kernel.
//!
//! A block of 16×16 threads computes a 64×64 tile of the output; each
//! thread owns a 4×4 register micro-tile at rows `ty + 16 i` and columns
//! `tx + 16 j` (so neighbouring threads read neighbouring shared-memory
//! words). The K dimension advances in slices of 16: the block stages a
//! 64×16 slice of A (stored k-major) and a 16×64 slice of B in shared
//! memory, synchronizes, and every thread does 16 rank-1 updates of its
//! micro-tile (256 FMAs per 128 shared loads). Out-of-range rows, columns
//! and K positions load as 0. The grid is (N/64, M/64, batch); batch
//! offsets of A and B use broadcasting strides. fp32 only, like the CPU
//! target; tensor-core `mma.sync` for fp16/bf16 comes with reduced
//! precision.
//!
//! MatMulInteger (u8/i8 operands, exact wrapping i32 result) is a direct
//! kernel: one thread per output element walks K with 8-bit loads
//! (`ld.global.u8`/`s8`, zero- or sign-extended to 32 bits), subtracts the
//! zero points (A's scalar, B's scalar or per-column one) and accumulates
//! with `mad.lo.s32`; batch offsets use the same broadcasting strides.

use super::{
    broadcast_strides, coords, global_index, inside, linear_launch, load, mem, offset, ptr, store,
    Cx, Kernel,
};
use crate::plan::{Base, Loc};
use crate::ptx::{fimm, Bin, KernelBuilder, MemTy, Opnd, Reg, Space, Special, Ty};
use crate::{CudaError, Launch};
use kiln_ir::DType;

/// Output tile rows and columns per block.
const TILE: u32 = 64;
/// Threads per block side.
const SIDE: u32 = 16;
/// Micro-tile size per thread side (`TILE / SIDE`).
const MICRO: u32 = TILE / SIDE;
/// K slice staged in shared memory per step.
const KS: u32 = 16;

/// Where B's elements come from.
#[derive(Clone, Copy)]
pub(crate) enum BSource {
    /// B[k, j] at `b_batch + k * ks + j * cs`.
    Strided { ks: i64, cs: i64 },
    /// Implicit GEMM: B is the im2col matrix of a convolution input plane
    /// group, never materialized. Row k = (c, ky, kx), column j = (oy, ox);
    /// B[k, j] = x[b_batch + c*h*w + iy*w + ix] with `iy = oy*sh + ky*dh -
    /// pt` (0 outside the input).
    Im2col(Im2col),
}

/// The convolution geometry of [`BSource::Im2col`].
#[derive(Clone, Copy)]
pub(crate) struct Im2col {
    pub h: usize,
    pub w: usize,
    pub kh: usize,
    pub kw: usize,
    pub ow: usize,
    pub strides: [usize; 2],
    pub dilations: [usize; 2],
    pub pads: [usize; 2],
    /// What the padding holds (0 when `None`): ConvInteger's padding is
    /// X's zero point, read raw from here.
    pub pad: Option<Loc>,
}

/// A (batched) product `out = alpha * A @ B + beta * C`, strides in
/// elements.
pub(crate) struct Gemm {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// A[i, k] at `a_batch + i * a_rs + k * a_ks`.
    pub a_rs: i64,
    pub a_ks: i64,
    /// How B is read.
    pub b: BSource,
    /// Batch shape and the batch strides of A and B (0 where broadcast).
    pub batch: Vec<usize>,
    pub a_batch: Vec<i64>,
    pub b_batch: Vec<i64>,
    /// C's row and column strides (0 where broadcast), for Gemm with C and
    /// for the convolution bias.
    pub c: Option<(i64, i64)>,
    /// Batch strides of C (empty: C is not batched).
    pub c_batch: Vec<i64>,
    pub alpha: f32,
    pub beta: f32,
}

/// Dense operands are f32, f16 or bf16, each independently
/// (`kiln_ir::infer::dense_result`): 16-bit ones are widened exactly and
/// every product accumulates in f32.
pub(crate) fn check_dense(cx: &Cx) -> Result<(), CudaError> {
    for &(_, ty) in &cx.inputs {
        if !matches!(ty.dtype, DType::F32 | DType::F16 | DType::BF16) {
            return Err(cx.dtype_err(ty.dtype));
        }
    }
    Ok(())
}

/// MatMul's operand geometry (numpy 1-D promotion: A `[k]` reads as
/// `[1, k]`, B `[k]` as `[k, 1]`): `m`, `k`, `n`, the broadcast batch
/// shape and A's and B's batch strides in elements (0 where broadcast).
struct Batched {
    m: usize,
    k: usize,
    n: usize,
    batch: Vec<usize>,
    a_batch: Vec<i64>,
    b_batch: Vec<i64>,
}

impl Batched {
    fn new(cx: &Cx) -> Result<Batched, CudaError> {
        let promote = |s: &[usize], row: bool| -> Vec<usize> {
            match (s.len(), row) {
                (1, true) => vec![1, s[0]],
                (1, false) => vec![s[0], 1],
                _ => s.to_vec(),
            }
        };
        let a = promote(&cx.inputs[0].1.shape, true);
        let b = promote(&cx.inputs[1].1.shape, false);
        let (ra, rb) = (a.len(), b.len());
        let (m, k, n) = (a[ra - 2], a[ra - 1], b[rb - 1]);
        let batch = kiln_ir::infer::broadcast_shapes(&a[..ra - 2], &b[..rb - 2])
            .ok_or_else(|| cx.unsupported("batch dims do not broadcast"))?
            .to_vec();
        // Batch strides in elements: each batch of A is m*k elements.
        let scale = |bs: Vec<i64>, per: usize| bs.into_iter().map(|s| s * per as i64).collect();
        Ok(Batched {
            a_batch: scale(broadcast_strides(&a[..ra - 2], &batch), m * k),
            b_batch: scale(broadcast_strides(&b[..rb - 2], &batch), k * n),
            m,
            k,
            n,
            batch,
        })
    }
}

pub(crate) fn matmul(cx: &Cx) -> Result<Kernel, CudaError> {
    if cx.inputs.iter().all(|(_, t)| t.dtype == DType::F64) {
        return matmul_f64(cx);
    }
    check_dense(cx)?;
    let Batched {
        m,
        k,
        n,
        batch,
        a_batch,
        b_batch,
    } = Batched::new(cx)?;
    let g = Gemm {
        m,
        n,
        k,
        a_rs: k as i64,
        a_ks: 1,
        b: BSource::Strided {
            ks: n as i64,
            cs: 1,
        },
        a_batch,
        b_batch,
        batch,
        c: None,
        c_batch: Vec::new(),
        alpha: 1.0,
        beta: 0.0,
    };
    gemm_kernel(cx, &g)
}

/// f64 `MatMul`: one thread per output element accumulates its row of A
/// times its column of B with `fma.rn.f64`, in K order. f64 products are
/// rare (scientific exports, conformance) and GPUs run f64 at a fraction
/// of the f32 rate, so this is the direct kernel, not a tiled one.
fn matmul_f64(cx: &Cx) -> Result<Kernel, CudaError> {
    let Batched {
        m,
        k,
        n,
        batch,
        a_batch,
        b_batch,
    } = Batched::new(cx)?;
    let full: Vec<usize> = batch.iter().copied().chain([m, n]).collect();
    let a_strides: Vec<i64> = a_batch.into_iter().chain([k as i64, 0]).collect();
    let b_strides: Vec<i64> = b_batch.into_iter().chain([0, 1]).collect();
    let total: usize = full.iter().product();
    let mut kb = cx.builder([super::BLOCK, 1, 1]);
    let i = global_index(&mut kb, total);
    let c = coords(&mut kb, i, &full);
    let a_off = offset(&mut kb, &c, &a_strides, 0);
    let b_off = offset(&mut kb, &c, &b_strides, 0);
    let a_base = ptr(&mut kb, cx.inputs[0].0);
    let b_base = ptr(&mut kb, cx.inputs[1].0);
    let a_addr = kb.addr(a_base, a_off, 8);
    let b_addr = kb.addr(b_base, b_off, 8);
    let acc = kb.mov(Ty::F64, fimm(Ty::F64, 0.0));
    kb.for_range(0u32, k as u32, 1u32, |kb, _| {
        let av = kb.ld(Space::Global, mem(DType::F64), Ty::F64, a_addr, 0);
        let bv = kb.ld(Space::Global, mem(DType::F64), Ty::F64, b_addr, 0);
        kb.mad_into(acc, av, bv, acc);
        kb.bin_into(a_addr, Bin::Add, a_addr, 8u32);
        kb.bin_into(b_addr, Bin::Add, b_addr, Opnd::I(8 * n as i64));
    });
    let acc = cx.epilogue(&mut kb, acc);
    let out = ptr(&mut kb, cx.out);
    store(&mut kb, out, i, DType::F64, acc);
    Ok(cx.finish(kb, linear_launch(total)))
}

/// `MatMulInteger`: `out = (A - a_zero) @ (B - b_zero)` in wrapping i32,
/// A and B u8 or i8 (independently), A's zero point a scalar, B's a scalar
/// or one per column. One thread per output element loops over K.
pub(crate) fn matmul_integer(cx: &Cx) -> Result<Kernel, CudaError> {
    for &(_, ty) in &cx.inputs {
        if !matches!(ty.dtype, DType::U8 | DType::I8) {
            return Err(cx.dtype_err(ty.dtype));
        }
    }
    let batched = Batched::new(cx)?;
    if let Some(kernel) = matmul_integer_mma(cx, &batched)? {
        return Ok(kernel);
    }
    let Batched {
        m,
        k,
        n,
        batch,
        a_batch,
        b_batch,
    } = batched;
    // Output coordinates (batch..., i, j), and per-axis element strides of
    // A[.., i, 0] and B[.., 0, j].
    let full: Vec<usize> = batch.iter().copied().chain([m, n]).collect();
    let a_strides: Vec<i64> = a_batch.into_iter().chain([k as i64, 0]).collect();
    let b_strides: Vec<i64> = b_batch.into_iter().chain([0, 1]).collect();
    let total: usize = full.iter().product();
    let (da, db) = (cx.inputs[0].1.dtype, cx.inputs[1].1.dtype);
    let per_column = cx.inputs[3].1.num_elements() > 1;
    let byte = |kb: &mut KernelBuilder, d: DType, addr: Reg| {
        kb.ld(Space::Global, mem(d), Ty::S32, addr, 0)
    };
    let mut kb = cx.builder([super::BLOCK, 1, 1]);
    let i = global_index(&mut kb, total);
    let c = coords(&mut kb, i, &full);
    let a_off = offset(&mut kb, &c, &a_strides, 0);
    let b_off = offset(&mut kb, &c, &b_strides, 0);
    let a_zero_ptr = ptr(&mut kb, cx.inputs[2].0);
    let a_zero = byte(&mut kb, da, a_zero_ptr);
    let b_zero_ptr = ptr(&mut kb, cx.inputs[3].0);
    let b_zero_addr = match c[full.len() - 1].filter(|_| per_column) {
        Some(j) => kb.addr(b_zero_ptr, j, 1),
        None => b_zero_ptr,
    };
    let b_zero = byte(&mut kb, db, b_zero_addr);
    // Byte addresses of A[.., i, 0] and B[.., 0, j], advanced along K.
    let a_base = ptr(&mut kb, cx.inputs[0].0);
    let b_base = ptr(&mut kb, cx.inputs[1].0);
    let a_addr = kb.addr(a_base, a_off, 1);
    let b_addr = kb.addr(b_base, b_off, 1);
    let acc = kb.mov(Ty::S32, 0u32);
    kb.for_range(0u32, k as u32, 1u32, |kb, _| {
        let av = byte(kb, da, a_addr);
        let bv = byte(kb, db, b_addr);
        let ac = kb.bin(Bin::Sub, av, a_zero);
        let bc = kb.bin(Bin::Sub, bv, b_zero);
        kb.mad_into(acc, ac, bc, acc);
        kb.bin_into(a_addr, Bin::Add, a_addr, 1u32);
        kb.bin_into(b_addr, Bin::Add, b_addr, Opnd::I(n as i64));
    });
    let out = ptr(&mut kb, cx.out);
    store(&mut kb, out, i, DType::I32, acc);
    Ok(cx.finish(kb, linear_launch(total)))
}

/// MatMulInteger on int8 tensor cores (sm_80+) when B is a constant
/// matrix (not batched) with zero point 0, the quantized-weights case
/// (`--precision int8`, `--quantize dynamic`, QOperator imports):
/// `(A − a_zero) · B = A · B − a_zero · colsum(B)`, the column sums
/// computed here and appended to the weights. `None`: the direct kernel.
fn matmul_integer_mma(cx: &Cx, b: &Batched) -> Result<Option<Kernel>, CudaError> {
    let (b_loc, b_ty) = cx.inputs[1];
    let (zb_loc, zb_ty) = cx.inputs[3];
    if cx.sm < 80
        || b_loc.base != Base::Weights
        || zb_loc.base != Base::Weights
        || b.b_batch.iter().any(|&s| s != 0)
    {
        return Ok(None);
    }
    let (colsums, zero_points_vanish) = {
        let w = cx.tables.borrow();
        let bytes = &w[b_loc.offset as usize..][..b.k * b.n];
        let zb = &w[zb_loc.offset as usize..][..zb_ty.num_elements()];
        let value = |byte: u8| match b_ty.dtype {
            DType::I8 => byte as i8 as i32,
            _ => byte as i32,
        };
        let sums: Vec<u8> = (0..b.n)
            .flat_map(|j| {
                (0..b.k)
                    .map(|k| value(bytes[k * b.n + j]))
                    .fold(0i32, i32::wrapping_add)
                    .to_le_bytes()
            })
            .collect();
        (sums, zb.iter().all(|&z| z == 0))
    };
    if !zero_points_vanish {
        return Ok(None);
    }
    let g = Gemm {
        m: b.m,
        n: b.n,
        k: b.k,
        a_rs: b.k as i64,
        a_ks: 1,
        b: BSource::Strided {
            ks: b.n as i64,
            cs: 1,
        },
        batch: b.batch.clone(),
        a_batch: b.a_batch.clone(),
        b_batch: b.b_batch.clone(),
        // The column sums, one per column (not batched: B is not).
        c: Some((0, 1)),
        c_batch: Vec::new(),
        alpha: 1.0,
        beta: 0.0,
    };
    let Some(grid) = gemm_grid(&g) else {
        return Ok(None);
    };
    let kind = MmaKind::Int8 {
        a: cx.inputs[0].1.dtype,
        b: b_ty.dtype,
        zero: cx.inputs[0].1.dtype,
        sums: cx.table(&colsums),
    };
    Ok(Some(mma_kernel(cx, &g, kind, grid)))
}

/// The launch grid of `g`: `(⌈N/64⌉, ⌈M/64⌉, batch)`, `None` past the
/// 65535 blocks of grid y and z.
pub(crate) fn gemm_grid(g: &Gemm) -> Option<[u32; 3]> {
    let batches: usize = g.batch.iter().product();
    let grid = [
        (g.n as u64).div_ceil(TILE as u64),
        (g.m as u64).div_ceil(TILE as u64),
        batches as u64,
    ];
    (grid[1] <= 65535 && grid[2] <= 65535).then(|| grid.map(|d| d as u32))
}

pub(crate) fn gemm(
    cx: &Cx,
    alpha: f32,
    beta: f32,
    trans_a: bool,
    trans_b: bool,
) -> Result<Kernel, CudaError> {
    check_dense(cx)?;
    let (m, n) = (cx.out_ty.shape[0], cx.out_ty.shape[1]);
    let a = &cx.inputs[0].1.shape;
    let k = if trans_a { a[0] } else { a[1] };
    let c = cx.inputs.get(2).map(|(_, ty)| {
        let s = broadcast_strides(&ty.shape, &[m, n]);
        (s[0], s[1])
    });
    let g = Gemm {
        m,
        n,
        k,
        a_rs: if trans_a { 1 } else { k as i64 },
        a_ks: if trans_a { m as i64 } else { 1 },
        b: BSource::Strided {
            ks: if trans_b { 1 } else { n as i64 },
            cs: if trans_b { k as i64 } else { 1 },
        },
        batch: Vec::new(),
        a_batch: Vec::new(),
        b_batch: Vec::new(),
        c,
        c_batch: Vec::new(),
        alpha,
        beta,
    };
    gemm_kernel(cx, &g)
}

/// How the GEMM tile loaders read an operand's elements.
#[derive(Clone, Copy)]
enum Staged {
    /// Widened to f32 (the SIMT kernel).
    Wide(DType),
    /// The raw bits of an element of this many bytes (1 or 2), in a `u32`
    /// (the tensor-core kernel).
    Raw(u32),
}

impl Staged {
    fn zero(self, kb: &mut KernelBuilder) -> Reg {
        match self {
            Staged::Wide(_) => kb.mov(Ty::F32, fimm(Ty::F32, 0.0)),
            Staged::Raw(_) => kb.mov(Ty::U32, 0u32),
        }
    }

    fn load(self, kb: &mut KernelBuilder, base: Reg, idx: Reg) -> Reg {
        match self {
            Staged::Wide(d) => load(kb, base, idx, d),
            Staged::Raw(bytes) => {
                let a = kb.addr(base, idx, bytes);
                kb.ld(Space::Global, raw_mem(bytes), Ty::U32, a, 0)
            }
        }
    }
}

/// The tiled GEMM kernel for `g`: inputs 0 and 1 of `cx` are A and B,
/// input 2 (if `g.c`) is C. On sm_80+, when A and B are both bf16 or both
/// f16, the tensor-core kernel ([`mma_kernel`]); otherwise the SIMT one.
pub(crate) fn gemm_kernel(cx: &Cx, g: &Gemm) -> Result<Kernel, CudaError> {
    let (da, db) = (cx.inputs[0].1.dtype, cx.inputs[1].1.dtype);
    let Some(grid) = gemm_grid(g) else {
        return Err(CudaError::TooLarge {
            node: cx.name.clone(),
            message: format!(
                "GEMM of {}x{} in {} batches exceeds the 65535 blocks of grid y/z",
                g.m,
                g.n,
                g.batch.iter().product::<usize>()
            ),
        });
    };
    match (da, db) {
        (DType::BF16, DType::BF16) if cx.sm >= 80 => Ok(mma_kernel(cx, g, MmaKind::Bf16, grid)),
        (DType::F16, DType::F16) if cx.sm >= 80 => Ok(mma_kernel(cx, g, MmaKind::F16, grid)),
        _ => Ok(simt_kernel(cx, g, grid)),
    }
}

/// The block's batch coordinates, A and B base pointers with their batch
/// offsets, and the tile origin `(m0, n0)`.
struct TileOrigin {
    /// The raw padding value of an im2col B ([`Im2col::pad`]).
    pad: Option<Reg>,
    batch: Vec<Option<Reg>>,
    bz: Reg,
    a_ptr: Reg,
    a_off: Reg,
    b_ptr: Reg,
    b_off: Reg,
    m0: Reg,
    n0: Reg,
}

fn tile_origin(kb: &mut KernelBuilder, cx: &Cx, g: &Gemm) -> TileOrigin {
    let bx = kb.special(Special::CtaidX);
    let by = kb.special(Special::CtaidY);
    let bz = kb.special(Special::CtaidZ);
    let m0 = kb.bin(Bin::Mul, by, TILE);
    let n0 = kb.bin(Bin::Mul, bx, TILE);
    let batch = coords(kb, bz, &g.batch);
    let a_off = offset(kb, &batch, &g.a_batch, 0);
    let b_off = offset(kb, &batch, &g.b_batch, 0);
    let a_ptr = ptr(kb, cx.inputs[0].0);
    let b_ptr = ptr(kb, cx.inputs[1].0);
    let pad = match g.b {
        BSource::Im2col(Im2col { pad: Some(loc), .. }) => {
            let p = ptr(kb, loc);
            let bytes = cx.inputs[1].1.dtype.size_bytes() as u32;
            Some(kb.ld(Space::Global, raw_mem(bytes), Ty::U32, p, 0))
        }
        _ => None,
    };
    TileOrigin {
        pad,
        batch,
        bz,
        a_ptr,
        a_off,
        b_ptr,
        b_off,
        m0,
        n0,
    }
}

/// Element `(k0 + r, n0 + c)` of B as `staged` (0 outside B).
fn load_b(
    kb: &mut KernelBuilder,
    g: &Gemm,
    o: &TileOrigin,
    (k0, r): (Reg, Reg),
    c: Reg,
    staged: Staged,
) -> Reg {
    let row = kb.bin(Bin::Add, k0, r);
    let col = kb.bin(Bin::Add, o.n0, c);
    match g.b {
        BSource::Strided { ks, cs } => {
            load_or_zero(kb, o.b_ptr, o.b_off, (row, g.k, ks), (col, g.n, cs), staged)
        }
        BSource::Im2col(geo) => {
            let at = (o.b_ptr, o.b_off, o.pad);
            load_im2col(kb, at, (row, g.k), (col, g.n), &geo, staged)
        }
    }
}

/// Element `e` of A's `rows × slice` slice at `k0` (row-major): its row
/// and column in the slice and its value (0 outside A).
fn a_slice_element(
    kb: &mut KernelBuilder,
    g: &Gemm,
    o: &TileOrigin,
    (e, k0, slice): (Reg, Reg, u32),
    staged: Staged,
) -> (Reg, Reg, Reg) {
    let c = kb.bin(Bin::Rem, e, slice);
    let r = kb.bin(Bin::Div, e, slice);
    let row = kb.bin(Bin::Add, o.m0, r);
    let col = kb.bin(Bin::Add, k0, c);
    let v = load_or_zero(
        kb,
        o.a_ptr,
        o.a_off,
        (row, g.m, g.a_rs),
        (col, g.k, g.a_ks),
        staged,
    );
    (r, c, v)
}

/// Element `e` of B's `slice × TILE` slice at `k0` (row-major): its row
/// and column in the slice and its value (0 outside B).
fn b_slice_element(
    kb: &mut KernelBuilder,
    g: &Gemm,
    o: &TileOrigin,
    (e, k0): (Reg, Reg),
    staged: Staged,
) -> (Reg, Reg, Reg) {
    let c = kb.bin(Bin::Rem, e, TILE);
    let r = kb.bin(Bin::Div, e, TILE);
    let v = load_b(kb, g, o, (k0, r), c, staged);
    (r, c, v)
}

/// Whether A's tile rows can be read as 16-byte vectors of `eb`-byte
/// elements: k contiguous, K, the row and batch strides multiples of a
/// vector (so no vector straddles a bound or an alignment) and A 16-byte
/// aligned.
fn vector_a(cx: &Cx, g: &Gemm, eb: usize) -> bool {
    let vec = (16 / eb) as i64;
    g.a_ks == 1
        && (g.k as i64) % vec == 0
        && g.a_rs % vec == 0
        && g.a_batch.iter().all(|s| s % vec == 0)
        && cx.inputs[0].0.offset.is_multiple_of(16)
}

/// [`vector_a`] for B's rows along n (a strided B with contiguous
/// columns).
fn vector_b(cx: &Cx, g: &Gemm, eb: usize) -> bool {
    let vec = (16 / eb) as i64;
    matches!(g.b, BSource::Strided { ks, cs: 1 } if ks % vec == 0)
        && (g.n as i64) % vec == 0
        && g.b_batch.iter().all(|s| s % vec == 0)
        && cx.inputs[1].0.offset.is_multiple_of(16)
}

/// The 16 bytes at element `(row, col)` of a row-contiguous operand
/// (`base + (batch + row·row_stride + col)·eb` bytes) as four `u32`s, or
/// zeros when the row or the vector's first column is out of range.
fn load_vector_or_zero(
    kb: &mut KernelBuilder,
    (base, batch): (Reg, Reg),
    (row, rows, row_stride): (Reg, usize, i64),
    (col, cols): (Reg, usize),
    eb: u32,
) -> [Reg; 4] {
    let v: [Reg; 4] = std::array::from_fn(|_| kb.mov(Ty::U32, 0u32));
    let ok = inside(kb, (row, rows), (col, cols));
    kb.when(ok, |kb| {
        let i = kb.mad(row, Opnd::I(row_stride), batch);
        let i = kb.bin(Bin::Add, i, col);
        let a = kb.addr(base, i, eb);
        let x = kb.ld_v4(Space::Global, MemTy("b32"), Ty::U32, a, 0);
        for (d, s) in v.iter().zip(x) {
            kb.assign(*d, s);
        }
    });
    v
}

/// The SIMT kernel: 16×16 threads, a 4×4 f32 micro-tile each.
fn simt_kernel(cx: &Cx, g: &Gemm, grid: [u32; 3]) -> Kernel {
    let (da, db) = (cx.inputs[0].1.dtype, cx.inputs[1].1.dtype);
    let f32m = MemTy("f32");
    let mut kb = cx.builder([SIDE, SIDE, 1]);
    let tx = kb.special(Special::TidX);
    let ty = kb.special(Special::TidY);
    let tid = kb.mad(ty, SIDE, tx);
    let o = tile_origin(&mut kb, cx, g);
    let smem = kb.smem_base();
    // As: KS x TILE floats (k-major), then Bs: KS x TILE floats.
    let b_smem = (KS * TILE * 4) as i64;
    let acc: Vec<Reg> = (0..MICRO * MICRO)
        .map(|_| kb.mov(Ty::F32, fimm(Ty::F32, 0.0)))
        .collect();
    let per_thread = KS * TILE / (SIDE * SIDE);
    // f32 operands with contiguous rows are staged with one 16-byte load
    // per thread per slice (the slices are 256 vectors of 4 floats).
    let (a_vec, b_vec) = (
        da == DType::F32 && vector_a(cx, g, 4),
        db == DType::F32 && vector_b(cx, g, 4),
    );
    kb.for_range(0u32, g.k as u32, KS, |kb, k0| {
        if a_vec {
            // Row r, k chunk q (4 floats): stored k-major, one float each.
            let r = kb.bin(Bin::Shr, tid, 2u32);
            let q = kb.bin(Bin::And, tid, 3u32);
            let row = kb.bin(Bin::Add, o.m0, r);
            let col = kb.mad(q, 4u32, k0);
            let v = load_vector_or_zero(kb, (o.a_ptr, o.a_off), (row, g.m, g.a_rs), (col, g.k), 4);
            let c = kb.bin(Bin::Shl, q, 2u32);
            let s_idx = kb.mad(c, TILE, r);
            let sa = kb.addr(smem, s_idx, 4);
            for (e, x) in v.into_iter().enumerate() {
                kb.st(
                    Space::Shared,
                    MemTy("b32"),
                    sa,
                    (e as u32 * TILE * 4) as i64,
                    x,
                );
            }
        }
        if b_vec {
            // k row r, n chunk q: one 16-byte shared store.
            let r = kb.bin(Bin::Shr, tid, 4u32);
            let q = kb.bin(Bin::And, tid, 15u32);
            let krow = kb.bin(Bin::Add, k0, r);
            let c = kb.bin(Bin::Shl, q, 2u32);
            let col = kb.bin(Bin::Add, o.n0, c);
            let BSource::Strided { ks, .. } = g.b else {
                unreachable!("vector_b")
            };
            let v = load_vector_or_zero(kb, (o.b_ptr, o.b_off), (krow, g.k, ks), (col, g.n), 4);
            let s_idx = kb.mad(r, TILE, c);
            let sb = kb.addr(smem, s_idx, 4);
            kb.st_v4(Space::Shared, MemTy("b32"), sb, b_smem, v);
        }
        let scalar_steps = if a_vec && b_vec { 0 } else { per_thread };
        for l in 0..scalar_steps {
            let e = kb.bin(Bin::Add, tid, l * SIDE * SIDE);
            if !a_vec {
                // A slice element (r, c), stored k-major.
                let (r, c, v) = a_slice_element(kb, g, &o, (e, k0, KS), Staged::Wide(da));
                let s_idx = kb.mad(c, TILE, r);
                let sa = kb.addr(smem, s_idx, 4);
                kb.st(Space::Shared, f32m, sa, 0, v);
            }
            if !b_vec {
                // B slice element (r, c), stored row-major.
                let (r, c, v) = b_slice_element(kb, g, &o, (e, k0), Staged::Wide(db));
                let s_idx = kb.mad(r, TILE, c);
                let sb = kb.addr(smem, s_idx, 4);
                kb.st(Space::Shared, f32m, sb, b_smem, v);
            }
        }
        kb.barrier();
        let a_row = kb.addr(smem, ty, 4);
        let b_col = kb.addr(smem, tx, 4);
        for kk in 0..KS {
            let a: Vec<Reg> = (0..MICRO)
                .map(|i| {
                    let off = ((kk * TILE + i * SIDE) * 4) as i64;
                    kb.ld(Space::Shared, f32m, Ty::F32, a_row, off)
                })
                .collect();
            let b: Vec<Reg> = (0..MICRO)
                .map(|j| {
                    let off = b_smem + ((kk * TILE + j * SIDE) * 4) as i64;
                    kb.ld(Space::Shared, f32m, Ty::F32, b_col, off)
                })
                .collect();
            for i in 0..MICRO as usize {
                for j in 0..MICRO as usize {
                    let r = acc[i * MICRO as usize + j];
                    kb.mad_into(r, a[i], b[j], r);
                }
            }
        }
        kb.barrier();
    });
    let mut out = Epilogue::new(&mut kb, cx, g, &o, None);
    for i in 0..MICRO {
        let row = kb.bin(Bin::Add, o.m0, ty);
        let row = kb.bin(Bin::Add, row, i * SIDE);
        for j in 0..MICRO {
            let col = kb.bin(Bin::Add, o.n0, tx);
            let col = kb.bin(Bin::Add, col, j * SIDE);
            out.store(&mut kb, row, col, acc[(i * MICRO + j) as usize]);
        }
    }
    cx.finish(
        kb,
        Launch {
            grid,
            block: [SIDE, SIDE, 1],
            shared_bytes: 2 * KS * TILE * 4,
        },
    )
}

/// The memory type of a raw element of `bytes` bytes.
fn raw_mem(bytes: u32) -> MemTy {
    MemTy(if bytes == 1 { "u8" } else { "u16" })
}

/// What the tensor-core kernel multiplies.
#[derive(Clone, Copy)]
pub(crate) enum MmaKind {
    /// bf16 × bf16, f32 accumulators (`m16n8k16`).
    Bf16,
    /// f16 × f16, f32 accumulators (`m16n8k16`).
    F16,
    /// u8/s8 × u8/s8, wrapping s32 accumulators (`m16n8k32`); the result
    /// is `acc − zero · sums[i, j]`: the constant operand's zero point is
    /// 0, the other one's (`zero`-typed, input 2) times the constant
    /// operand's sums along K (B's column sums for MatMulInteger, the
    /// weights' row sums for ConvInteger), computed at compile time into
    /// the weights at `sums` and read at the Gemm's C strides (`Gemm::c`,
    /// `Gemm::c_batch`).
    Int8 {
        a: DType,
        b: DType,
        zero: DType,
        sums: Loc,
    },
}

impl MmaKind {
    fn elem_bytes(self) -> u32 {
        match self {
            MmaKind::Bf16 | MmaKind::F16 => 2,
            MmaKind::Int8 { .. } => 1,
        }
    }

    /// The `mma.sync.aligned` shape and types.
    fn shape(self) -> String {
        let int = |d: DType| if d == DType::I8 { "s8" } else { "u8" };
        match self {
            MmaKind::Bf16 => "m16n8k16.row.col.f32.bf16.bf16.f32".into(),
            MmaKind::F16 => "m16n8k16.row.col.f32.f16.f16.f32".into(),
            MmaKind::Int8 { a, b, .. } => {
                format!("m16n8k32.row.col.s32.{}.{}.s32", int(a), int(b))
            }
        }
    }

    fn acc_ty(self) -> Ty {
        match self {
            MmaKind::Int8 { .. } => Ty::S32,
            _ => Ty::F32,
        }
    }
}

/// Bytes of K per shared-memory stage of the tensor-core kernel: two
/// `mma.sync` k steps of 32 bytes (16 halves or 32 bytes of int8).
const MMA_STAGE: u32 = 64;
/// Bytes per shared-memory row of a staged tile: `MMA_STAGE` plus 16 of
/// padding, so the eight rows a fragment load touches start in different
/// banks (a row is 20 words: rows `g` land on banks `20 g mod 32`, four
/// apart or more, and the four lanes of a row read four consecutive ones).
const MMA_ROW: u32 = MMA_STAGE + 16;
/// Bytes of one staged 64-row tile.
const MMA_TILE_BYTES: u32 = TILE * MMA_ROW;
/// Threads of the tensor-core kernel: eight warps, as a 4 × 2 grid of
/// 16 × 32 output tiles.
const MMA_THREADS: u32 = 256;

/// The tensor-core GEMM: a 64×64 output tile per block of eight warps; warp
/// `w` owns rows `16 (w / 2)` and columns `32 (w % 2)` of the tile, as four
/// `m16n8kK` accumulators (16 registers per thread). K advances in stages
/// of 64 bytes: the block copies A's 64-row slice row-major and B's slice
/// transposed (n-major) into shared memory as raw elements (0 outside the
/// matrices), so every fragment register is one aligned 32-bit shared load
/// of consecutive k (the `.row.col` operand layouts, the same in bytes for
/// 16- and 8-bit elements: thread `lane` holds rows `lane / 4` and
/// `lane / 4 + 8`, bytes `4 (lane % 4)` and `4 (lane % 4) + 16` of each
/// 32-byte k step). No thread leaves before the last `mma.sync`, which
/// needs the whole warp; out-of-range rows and columns compute on zeros
/// and are not stored.
pub(crate) fn mma_kernel(cx: &Cx, g: &Gemm, kind: MmaKind, grid: [u32; 3]) -> Kernel {
    let eb = kind.elem_bytes();
    let stage_k = MMA_STAGE / eb;
    let b32m = MemTy("b32");
    let mut kb = cx.builder([MMA_THREADS, 1, 1]);
    let tid = kb.special(Special::TidX);
    let warp = kb.bin(Bin::Shr, tid, 5u32);
    let lane = kb.bin(Bin::And, tid, 31u32);
    let group = kb.bin(Bin::Shr, lane, 2u32);
    let pair = kb.bin(Bin::And, lane, 3u32);
    let warp_m = kb.bin(Bin::Shr, warp, 1u32);
    let warp_n = kb.bin(Bin::And, warp, 1u32);
    let o = tile_origin(&mut kb, cx, g);
    let smem = kb.smem_base();
    let b_smem = MMA_TILE_BYTES as i64;
    let acc_ty = kind.acc_ty();
    let zero = match acc_ty {
        Ty::F32 => fimm(Ty::F32, 0.0),
        _ => Opnd::I(0),
    };
    let acc: Vec<[Reg; 4]> = (0..4)
        .map(|_| std::array::from_fn(|_| kb.mov(acc_ty, zero)))
        .collect();
    // Fragment addresses for k step 0: A at (16 warp_m + group, 4 pair
    // bytes), B at (32 warp_n + group, 4 pair bytes) of their staged tiles.
    let a_row = kb.mad(warp_m, 16u32, group);
    let a_idx = kb.mul_wide(a_row, MMA_ROW);
    let a_frag = kb.bin(Bin::Add, a_idx, smem);
    let pair_bytes = kb.mul_wide(pair, 4u32);
    let a_frag = kb.bin(Bin::Add, a_frag, pair_bytes);
    let b_row = kb.mad(warp_n, 32u32, group);
    let b_idx = kb.mul_wide(b_row, MMA_ROW);
    let b_frag = kb.bin(Bin::Add, b_idx, smem);
    let b_frag = kb.bin(Bin::Add, b_frag, pair_bytes);
    let per_thread = TILE * stage_k / MMA_THREADS;
    let row = MMA_ROW as i64;
    let shape = kind.shape();
    // Operands with contiguous rows are staged with one 16-byte load per
    // thread per stage (A: 64 rows of 4 vectors; B: stage_k rows of
    // 64·eb/16 vectors: 256 either way).
    let (a_vec, b_vec) = (vector_a(cx, g, eb as usize), vector_b(cx, g, eb as usize));
    let vec = 16 / eb;
    kb.for_range(0u32, g.k as u32, stage_k, |kb, k0| {
        if a_vec {
            // Row r, chunk q: one 16-byte shared store into the row.
            let r = kb.bin(Bin::Shr, tid, 2u32);
            let q = kb.bin(Bin::And, tid, 3u32);
            let a_row = kb.bin(Bin::Add, o.m0, r);
            let col = kb.mad(q, vec, k0);
            let v =
                load_vector_or_zero(kb, (o.a_ptr, o.a_off), (a_row, g.m, g.a_rs), (col, g.k), eb);
            let s_row = kb.mad(r, MMA_ROW / 16, q);
            let sa = kb.addr(smem, s_row, 16);
            kb.st_v4(Space::Shared, MemTy("b32"), sa, 0, v);
        }
        if b_vec {
            // k row r, n chunk q: each element into its n row of the
            // transposed tile.
            let per_row = TILE * eb / 16;
            let r = kb.bin(Bin::Div, tid, per_row);
            let q = kb.bin(Bin::Rem, tid, per_row);
            let krow = kb.bin(Bin::Add, k0, r);
            let c = kb.bin(Bin::Mul, q, vec);
            let col = kb.bin(Bin::Add, o.n0, c);
            let BSource::Strided { ks, .. } = g.b else {
                unreachable!("vector_b")
            };
            let v = load_vector_or_zero(kb, (o.b_ptr, o.b_off), (krow, g.k, ks), (col, g.n), eb);
            let s_idx = kb.mad(c, MMA_ROW / eb, r);
            let sb = kb.addr(smem, s_idx, eb);
            for e in 0..vec {
                let word = v[(e * eb / 4) as usize];
                let x = kb.bin(Bin::Shr, word, (e * eb % 4) * 8);
                let off = b_smem + (e * MMA_ROW) as i64;
                kb.st(Space::Shared, raw_mem(eb), sb, off, x);
            }
        }
        let scalar_steps = if a_vec && b_vec { 0 } else { per_thread };
        for l in 0..scalar_steps {
            let e = kb.bin(Bin::Add, tid, l * MMA_THREADS);
            if !a_vec {
                // A slice element (r, c), stored row-major.
                let (r, c, v) = a_slice_element(kb, g, &o, (e, k0, stage_k), Staged::Raw(eb));
                let s_idx = kb.mad(r, MMA_ROW / eb, c);
                let sa = kb.addr(smem, s_idx, eb);
                kb.st(Space::Shared, raw_mem(eb), sa, 0, v);
            }
            if !b_vec {
                // B slice element (r, c), stored transposed at (c, r).
                let (r, c, v) = b_slice_element(kb, g, &o, (e, k0), Staged::Raw(eb));
                let s_idx = kb.mad(c, MMA_ROW / eb, r);
                let sb = kb.addr(smem, s_idx, eb);
                kb.st(Space::Shared, raw_mem(eb), sb, b_smem, v);
            }
        }
        kb.barrier();
        for kk in (0..MMA_STAGE as i64).step_by(32) {
            let a: [Reg; 4] = std::array::from_fn(|r| {
                // a0: (g, k), a1: (g + 8, k), a2: (g, k + 16 B), a3: (g + 8, k + 16 B).
                let off = kk + (r as i64 & 1) * 8 * row + (r as i64 >> 1) * 16;
                kb.ld(Space::Shared, b32m, Ty::U32, a_frag, off)
            });
            for (j, acc) in acc.iter().enumerate() {
                let tile = b_smem + (j as i64) * 8 * row + kk;
                let b: [Reg; 2] = std::array::from_fn(|r| {
                    kb.ld(Space::Shared, b32m, Ty::U32, b_frag, tile + r as i64 * 16)
                });
                kb.mma_sync(&shape, *acc, a, b);
            }
        }
        kb.barrier();
    });
    // Accumulator i of tile j: row g + 8 (i / 2), column 8 j + 2 pair + i % 2.
    let row0 = kb.bin(Bin::Add, o.m0, a_row);
    let col0 = kb.mad(warp_n, 32u32, o.n0);
    let col0 = kb.mad(pair, 2u32, col0);
    let at = |kb: &mut KernelBuilder, i: usize, j: usize| {
        let row = kb.bin(Bin::Add, row0, 8 * (i as u32 / 2));
        let col = kb.bin(Bin::Add, col0, 8 * j as u32 + i as u32 % 2);
        (row, col)
    };
    let mut out = Epilogue::new(&mut kb, cx, g, &o, Some(kind));
    for (j, acc) in acc.iter().enumerate() {
        for (i, &v) in acc.iter().enumerate() {
            let (row, col) = at(&mut kb, i, j);
            out.store(&mut kb, row, col, v);
        }
    }
    cx.finish(
        kb,
        Launch {
            grid,
            block: [MMA_THREADS, 1, 1],
            shared_bytes: 2 * MMA_TILE_BYTES,
        },
    )
}

/// The term a GEMM store adds to `alpha · acc`, read at the Gemm's C
/// strides (`Gemm::c`, `Gemm::c_batch`) from this pointer and batch
/// offset.
enum Term {
    None,
    /// `beta · C[i, j]`, C of this element type.
    Scaled(Reg, Reg, DType),
    /// `−zero · sums[i, j]` ([`MmaKind::Int8`]), with the run-time zero
    /// point loaded.
    ZeroPointSums(Reg, Reg, Reg),
}

/// The GEMM store: `alpha · acc` plus its [`Term`], the fused unary
/// epilogue, the output's element type; rows and columns outside the
/// output are skipped.
struct Epilogue<'a, 'g> {
    cx: &'a Cx<'g>,
    g: &'a Gemm,
    out: Reg,
    out_batch: Reg,
    term: Term,
}

impl<'a, 'g> Epilogue<'a, 'g> {
    /// The store of `g`'s kernel; `kind` is the tensor-core kernel's, whose
    /// int8 form corrects by the zero point (input 2 of `cx`) instead of
    /// adding C.
    fn new(
        kb: &mut KernelBuilder,
        cx: &'a Cx<'g>,
        g: &'a Gemm,
        o: &TileOrigin,
        kind: Option<MmaKind>,
    ) -> Self {
        let out = ptr(kb, cx.out);
        let out_batch = kb.bin(Bin::Mul, o.bz, (g.m * g.n) as u32);
        let term = match (g.c, kind, cx.inputs.get(2)) {
            (None, ..) => Term::None,
            (Some(_), Some(MmaKind::Int8 { zero, sums, .. }), Some(&(zero_loc, _))) => {
                let zero_ptr = ptr(kb, zero_loc);
                let zero = kb.ld(Space::Global, mem(zero), Ty::S32, zero_ptr, 0);
                let sums = ptr(kb, sums);
                let off = offset(kb, &o.batch, &g.c_batch, 0);
                Term::ZeroPointSums(sums, off, zero)
            }
            (Some(_), _, Some(&(loc, ty))) => {
                let c_ptr = ptr(kb, loc);
                let off = offset(kb, &o.batch, &g.c_batch, 0);
                Term::Scaled(c_ptr, off, ty.dtype)
            }
            (Some(_), _, None) => Term::None,
        };
        Epilogue {
            cx,
            g,
            out,
            out_batch,
            term,
        }
    }

    fn store(&mut self, kb: &mut KernelBuilder, row: Reg, col: Reg, acc: Reg) {
        let g = self.g;
        let ok = inside(kb, (row, g.m), (col, g.n));
        kb.when(ok, |kb| {
            let mut y = acc;
            if g.alpha != 1.0 {
                y = kb.bin(Bin::Mul, y, Opnd::F32(g.alpha));
            }
            let at = |kb: &mut KernelBuilder, off: Reg| {
                let (rs, cs) = g.c.expect("a term has strides");
                let i = kb.mad(row, Opnd::I(rs), off);
                kb.mad(col, Opnd::I(cs), i)
            };
            match self.term {
                Term::None => {}
                Term::Scaled(c_ptr, off, cd) => {
                    let ci = at(kb, off);
                    let cv = load(kb, c_ptr, ci, cd);
                    y = kb.mad(cv, Opnd::F32(g.beta), y);
                }
                Term::ZeroPointSums(sums, off, zero) => {
                    let si = at(kb, off);
                    let sa = kb.addr(sums, si, 4);
                    let sum = kb.ld(Space::Global, MemTy("s32"), Ty::S32, sa, 0);
                    let shift = kb.bin(Bin::Mul, zero, sum);
                    y = kb.bin(Bin::Sub, y, shift);
                }
            }
            let oi = kb.mad(row, g.n as u32, self.out_batch);
            let oi = kb.bin(Bin::Add, oi, col);
            let y = self.cx.epilogue(kb, y);
            store(kb, self.out, oi, self.cx.out_ty.dtype, y);
        });
    }
}

/// `base[batch + row * row_stride + col * col_stride]` when `row < rows`
/// and `col < cols`, else 0.
fn load_or_zero(
    kb: &mut KernelBuilder,
    base: Reg,
    batch: Reg,
    (row, rows, row_stride): (Reg, usize, i64),
    (col, cols, col_stride): (Reg, usize, i64),
    staged: Staged,
) -> Reg {
    let v = staged.zero(kb);
    let ok = inside(kb, (row, rows), (col, cols));
    kb.when(ok, |kb| {
        let i = kb.mad(row, Opnd::I(row_stride), batch);
        let i = kb.mad(col, Opnd::I(col_stride), i);
        let x = staged.load(kb, base, i);
        kb.assign(v, x);
    });
    v
}

/// Element (k, j) of the im2col matrix of a convolution input (0 outside
/// the matrix; in the padding 0 or `pad`). The window position is
/// decomposed from k and the output position from j with immediates; a
/// padded tap wraps below 0 and fails the unsigned bound like one past the
/// end.
fn load_im2col(
    kb: &mut KernelBuilder,
    (base, batch, pad): (Reg, Reg, Option<Reg>),
    (k, rows): (Reg, usize),
    (j, cols): (Reg, usize),
    geo: &Im2col,
    staged: Staged,
) -> Reg {
    let v = staged.zero(kb);
    let ok = inside(kb, (k, rows), (j, cols));
    kb.when(ok, |kb| {
        if let Some(p) = pad {
            kb.assign(v, p);
        }
        let taps = (geo.kh * geo.kw) as u32;
        let c = kb.bin(Bin::Div, k, taps);
        let t = kb.bin(Bin::Rem, k, taps);
        let ky = kb.bin(Bin::Div, t, geo.kw as u32);
        let kx = kb.bin(Bin::Rem, t, geo.kw as u32);
        let oy = kb.bin(Bin::Div, j, geo.ow as u32);
        let ox = kb.bin(Bin::Rem, j, geo.ow as u32);
        let pos = |kb: &mut KernelBuilder, o: Reg, s: usize, kk: Reg, d: usize, p: usize| {
            let a = kb.bin(Bin::Mul, o, s as u32);
            let b = kb.mad(kk, d as u32, a);
            kb.bin(Bin::Sub, b, p as u32)
        };
        let iy = pos(kb, oy, geo.strides[0], ky, geo.dilations[0], geo.pads[0]);
        let ix = pos(kb, ox, geo.strides[1], kx, geo.dilations[1], geo.pads[1]);
        let within = inside(kb, (iy, geo.h), (ix, geo.w));
        kb.when(within, |kb| {
            let plane = kb.mad(c, (geo.h * geo.w) as u32, batch);
            let row = kb.mad(iy, geo.w as u32, plane);
            let i = kb.bin(Bin::Add, row, ix);
            let x = staged.load(kb, base, i);
            kb.assign(v, x);
        });
    });
    v
}
