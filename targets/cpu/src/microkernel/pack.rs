//! Operand packing for the GEMM microkernels, done at compile time on
//! constant operands: f32 panels ([`pack_a`], [`pack_b`]), 16-bit panels
//! ([`pack_a_half`], [`pack_b_half`]), bf16 pairs ([`pack_b_pairs`]) and
//! int8 quads ([`pack_b_quads`], [`pack_a_quads`]) in the layouts the
//! kernels' dot-product instructions read (`super::gemm::Elem`).

/// A 16-bit float storage type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Half {
    /// bfloat16: widened by a 16-bit shift.
    Bf16,
    /// IEEE binary16: widened by `vcvtph2ps` (F16C / AVX-512F).
    F16,
}

/// The bits of `x` as a 16-bit float, rounded to nearest even.
pub(crate) fn half_bits(x: f32, h: Half) -> u16 {
    match h {
        Half::Bf16 => half::bf16::from_f32(x).to_bits(),
        Half::F16 => half::f16::from_f32(x).to_bits(),
    }
}

/// [`pack_a`] with 16-bit elements (`a` already holds the stored values,
/// so the conversion is exact).
pub(crate) fn pack_a_half(
    a: &[f32],
    m: usize,
    k: usize,
    a_row: usize,
    a_col: usize,
    mr: usize,
    h: Half,
) -> Vec<u8> {
    let panels = m.div_ceil(mr);
    let mut out = Vec::with_capacity(panels * mr * k * 2);
    for p in 0..panels {
        for kk in 0..k {
            for r in 0..mr {
                let i = p * mr + r;
                let v = if i < m {
                    a[i * a_row + kk * a_col]
                } else {
                    0.0
                };
                out.extend_from_slice(&half_bits(v, h).to_le_bytes());
            }
        }
    }
    out
}

/// [`pack_b`] with 16-bit elements: B's panels are A's panels of Bᵀ
/// (columns as rows), so [`pack_a_half`] with the strides swapped.
pub(crate) fn pack_b_half(
    b: &[f32],
    k: usize,
    n: usize,
    b_row: usize,
    b_col: usize,
    nr: usize,
    h: Half,
) -> Vec<u8> {
    pack_a_half(b, n, k, b_col, b_row, nr, h)
}

/// Packs `b` (`B[k, j]` at `b[k * b_row + j * b_col]`) in groups of
/// `group` consecutive k per column for the dot-product kernels: panel `q`
/// holds columns `q*nr..` as `ceil(K/group)` rows of `nr` groups, each
/// element written by `emit`, `zero` past `n` and past `K`.
fn pack_b_groups<T: Copy>(
    b: &[T],
    (k, n): (usize, usize),
    (b_row, b_col): (usize, usize),
    nr: usize,
    group: usize,
    zero: T,
    emit: impl Fn(&mut Vec<u8>, T),
) -> Vec<u8> {
    let panels = n.div_ceil(nr);
    let rows = k.div_ceil(group);
    let mut out = Vec::new();
    for q in 0..panels {
        for t in 0..rows {
            for c in 0..nr {
                let j = q * nr + c;
                for kk in group * t..group * (t + 1) {
                    let v = if j < n && kk < k {
                        b[kk * b_row + j * b_col]
                    } else {
                        zero
                    };
                    emit(&mut out, v);
                }
            }
        }
    }
    out
}

/// Packs `b` as bf16 pairs along k for [`Elem::Bf16Dot`](super::gemm::Elem::Bf16Dot): panel `q` holds
/// columns `q*nr..` as `ceil(K/2)` rows of `nr` dwords (B[2t, j],
/// B[2t+1, j]), zero past `n` and past `K`.
pub(crate) fn pack_b_pairs(
    b: &[f32],
    k: usize,
    n: usize,
    b_row: usize,
    b_col: usize,
    nr: usize,
) -> Vec<u8> {
    pack_b_groups(b, (k, n), (b_row, b_col), nr, 2, 0.0, |out, v| {
        out.extend_from_slice(&half_bits(v, Half::Bf16).to_le_bytes())
    })
}

/// Packs i8 `b` as quads along k for [`Elem::U8I8Dot`](super::gemm::Elem::U8I8Dot): panel `q` holds
/// columns `q*nr..` as `ceil(K/4)` rows of `nr` dwords (B[4t..4t+4, j]),
/// zero past `n` and past `K`.
pub(crate) fn pack_b_quads(
    b: &[i8],
    k: usize,
    n: usize,
    b_row: usize,
    b_col: usize,
    nr: usize,
) -> Vec<u8> {
    pack_b_groups(b, (k, n), (b_row, b_col), nr, 4, 0, |out, v| {
        out.push(v as u8)
    })
}

/// Packs i8 `a` (`m × k`, row-major, k a multiple of 4) for
/// [`Elem::I8U8Dot`](super::gemm::Elem::I8U8Dot): panel `p` holds rows `p*mr..` as `k/4` groups of `mr`
/// dwords (A[i, 4t..4t+4]), zero past `m`.
pub(crate) fn pack_a_quads(a: &[i8], m: usize, k: usize, mr: usize) -> Vec<u8> {
    pack_b_groups(a, (k, m), (1, k), mr, 4, 0, |out, v| out.push(v as u8))
}

/// Packs row-major `a` (`A[i, k]` at `a[i * a_row + k * a_col]`, in
/// elements) into panels of `mr` rows: panel `p` holds rows `p*mr..` as
/// `K` groups of `mr` values (zero past `m`).
pub(crate) fn pack_a(
    a: &[f32],
    m: usize,
    k: usize,
    a_row: usize,
    a_col: usize,
    mr: usize,
) -> Vec<u8> {
    let panels = m.div_ceil(mr);
    let mut out = Vec::with_capacity(panels * mr * k * 4);
    for p in 0..panels {
        for kk in 0..k {
            for r in 0..mr {
                let i = p * mr + r;
                let v = if i < m {
                    a[i * a_row + kk * a_col]
                } else {
                    0.0
                };
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
    }
    out
}

/// Packs `b` (`B[k, j]` at `b[k * b_row + j * b_col]`, in elements) into
/// panels of `nr` columns: panel `q` holds columns `q*nr..` as `K` rows of
/// `nr` values (zero past `n`). That is [`pack_a`] of `Bᵀ`.
pub(crate) fn pack_b(
    b: &[f32],
    k: usize,
    n: usize,
    b_row: usize,
    b_col: usize,
    nr: usize,
) -> Vec<u8> {
    pack_a(b, n, k, b_col, b_row, nr)
}
