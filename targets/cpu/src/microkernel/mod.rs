//! Machine-code microkernels generated at compile time with `iced-x86`.
//!
//! Cranelift's x86-64 backend stops at 128-bit vectors, so the dense kernels
//! of the `x86_64-avx512` target (and of `native` on an AVX-512 host) are
//! assembled here instead: shape-specialized AVX-512 code whose sizes,
//! strides and offsets are immediates. The generated functions are
//! position-independent and need no relocations; each is a whole kernel with
//! the kernel ABI `extern "C" fn(arena: *mut u8, weights: *const u8) -> i32`
//! and is placed in the artifact's TEXT beside the Cranelift kernels.
//!
//! - [`gemm`]: fp32 GEMM with a register-blocked zmm tile, operands read
//!   strided or from panels packed at compile time, edge tiles masked, and
//!   an epilogue (alpha, bias or `C`, activation) in the store loop.
//! - [`pack`]: the operand panels the GEMMs read, packed at compile time.
//! - [`epilogue`]: the elementwise program every store loop can run (GEMM,
//!   depthwise, elementwise kernels) and its register allocation.
//! - [`depthwise`]: depthwise convolution with pixels along W in zmm
//!   vectors and padding handled by load masks.
//! - [`im2col`]: the column matrix of a k×k convolution, written to arena
//!   scratch before the GEMM runs over it.
//! - [`softmax`]: softmax over contiguous rows with an inline `exp`.
//! - [`reduce`]: the max or min of a whole tensor (dynamic int8's range
//!   observers).
//! - [`narrow`]: the f32 → u8 cast that ends every int8 activation
//!   quantization.
//! - [`elementwise`]: fused elementwise chains without a dense head, the
//!   GEMM store loop's epilogue program run over whole tensors.
//! - [`attention`]: the two GEMMs and the softmax of scaled dot-product
//!   attention, per head through a scratch block of scores.
//! - [`peak`]: the FMA throughput loop used to measure the machine's peak
//!   (the denominator of the GEMM efficiency figure).
//!
//! The runtime never depends on this module or on `iced-x86`: it only sees
//! bytes.

pub(crate) mod attention;
pub(crate) mod depthwise;
pub(crate) mod elementwise;
pub(crate) mod epilogue;
pub(crate) mod gemm;
pub(crate) mod im2col;
pub(crate) mod narrow;
pub(crate) mod pack;
pub mod peak;
pub(crate) mod reduce;
pub(crate) mod softmax;
pub(crate) mod winograd;
pub(crate) mod ymm;

/// The vector registers a GEMM kernel is built from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Vector {
    /// AVX-512: 32 zmm registers of 16 f32, edge lanes under `k1`.
    Zmm,
    /// AVX2 + FMA (VEX encoding, `x86_64-v3`): 16 ymm registers of 8 f32,
    /// edge lanes under a mask register for `vmaskmovps` (see [`ymm`]).
    Ymm,
}

impl Vector {
    /// f32 lanes per register.
    pub(crate) fn lanes(self) -> usize {
        match self {
            Vector::Zmm => 16,
            Vector::Ymm => 8,
        }
    }
}

/// Why a microkernel could not be generated for a shape. The caller falls
/// back to the Cranelift kernel.
#[derive(Debug, thiserror::Error)]
pub enum MicrokernelError {
    /// An offset, stride or displacement does not fit a 32-bit immediate.
    #[error("{0} does not fit a 32-bit displacement")]
    Displacement(&'static str),
    /// The operand layouts do not fit the element types (a caller bug,
    /// reported rather than assembled wrong).
    #[error("operand layout: {0}")]
    Layout(String),
    /// The assembler rejected the generated code.
    #[error("assembler: {0}")]
    Assembler(String),
}

impl From<iced_x86::IcedError> for MicrokernelError {
    fn from(e: iced_x86::IcedError) -> Self {
        MicrokernelError::Assembler(e.to_string())
    }
}

/// The zmm registers by number.
pub(crate) const ZMM: [iced_x86::code_asm::AsmRegisterZmm; 32] = {
    use iced_x86::code_asm::*;
    [
        zmm0, zmm1, zmm2, zmm3, zmm4, zmm5, zmm6, zmm7, zmm8, zmm9, zmm10, zmm11, zmm12, zmm13,
        zmm14, zmm15, zmm16, zmm17, zmm18, zmm19, zmm20, zmm21, zmm22, zmm23, zmm24, zmm25, zmm26,
        zmm27, zmm28, zmm29, zmm30, zmm31,
    ]
};

/// Callee-saved registers (System V) that the microkernel bodies use and
/// save around their calls.
pub(crate) const SAVED: [iced_x86::code_asm::AsmRegister64; 6] = {
    use iced_x86::code_asm::{r12, r13, r14, r15, rbp, rbx};
    [rbx, rbp, r12, r13, r14, r15]
};

/// `v` as a 32-bit displacement or immediate.
pub(crate) fn imm32(v: i64, what: &'static str) -> Result<i32, MicrokernelError> {
    i32::try_from(v).map_err(|_| MicrokernelError::Displacement(what))
}

/// The register holding the base of `loc`: the kernel ABI passes the
/// arena base in rdi and the weights base in rsi.
pub(crate) fn base_register(loc: crate::plan::Loc) -> iced_x86::code_asm::AsmRegister64 {
    use iced_x86::code_asm::{rdi, rsi};
    crate::plan::note_address(loc);
    match loc.base {
        crate::plan::Base::Arena => rdi,
        crate::plan::Base::Weights => rsi,
    }
}

/// `reg` = the address of `loc` (see [`base_register`]).
pub(crate) fn load_address(
    a: &mut iced_x86::code_asm::CodeAssembler,
    reg: iced_x86::code_asm::AsmRegister64,
    loc: crate::plan::Loc,
) -> Result<(), MicrokernelError> {
    use iced_x86::code_asm::qword_ptr;
    let base = base_register(loc);
    match i32::try_from(loc.offset) {
        Ok(off) => a.lea(reg, qword_ptr(base + off))?,
        Err(_) => {
            a.mov(reg, loc.offset)?;
            a.add(reg, base)?;
        }
    }
    Ok(())
}

/// How a kernel stores its f32 results.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) enum Store {
    /// As f32.
    #[default]
    F32,
    /// Cast to u8 ([`store_u8`]): a fused kernel that ends an int8
    /// activation quantization (`kiln_ir::FusedStore::U8`). `zero` locates
    /// an f32 0 (in the weights) that the cast's clamp reads by broadcast.
    U8 {
        /// An f32 zero.
        zero: crate::plan::Loc,
    },
}

impl Store {
    /// Bytes per stored element.
    pub(crate) fn bytes(self) -> usize {
        match self {
            Store::F32 => 4,
            Store::U8 { .. } => 1,
        }
    }

    /// Where element `loc` of an output laid out in f32 elements from
    /// `base` lands when elements take [`Store::bytes`]: kernels are built
    /// with f32 offsets (and split into tasks by them), then narrowed.
    pub(crate) fn narrow(self, base: crate::plan::Loc, loc: crate::plan::Loc) -> crate::plan::Loc {
        debug_assert_eq!(loc.base, base.base);
        let elements = (loc.offset - base.offset) / 4;
        base.moved((elements * self.bytes() as u64) as i64)
    }

    /// Stores the 16 lanes of `x` at `at` (the lanes under k1 when
    /// `masked`); clobbers `x`.
    pub(crate) fn vector(
        self,
        a: &mut iced_x86::code_asm::CodeAssembler,
        at: iced_x86::code_asm::AsmMemoryOperand,
        x: iced_x86::code_asm::AsmRegisterZmm,
        masked: bool,
    ) -> Result<(), MicrokernelError> {
        use iced_x86::code_asm::{dword_bcst, zmmword_ptr};
        match self {
            Store::F32 if masked => a.vmovups(zmmword_ptr(at).k1(), x)?,
            Store::F32 => a.vmovups(zmmword_ptr(at), x)?,
            Store::U8 { zero } => {
                let disp = imm32(zero.offset as i64, "zero constant")?;
                store_u8(a, at, x, dword_bcst(base_register(zero) + disp), masked)?;
            }
        }
        Ok(())
    }
}

/// Stores the 16 f32 lanes of `x` at `at` as u8 the way the reference
/// evaluator casts (truncation toward zero, saturating, NaN to 0): `vmaxps`
/// with `zero` (0.0; it returns that second operand for a NaN), then
/// `vcvttps2udq` (whose out-of-range result, `u32::MAX`, saturates like
/// any value above 255) and `vpmovusdb`. Clobbers `x`.
pub(crate) fn store_u8<Z>(
    a: &mut iced_x86::code_asm::CodeAssembler,
    at: iced_x86::code_asm::AsmMemoryOperand,
    x: iced_x86::code_asm::AsmRegisterZmm,
    zero: Z,
    masked: bool,
) -> Result<(), MicrokernelError>
where
    iced_x86::code_asm::CodeAssembler: iced_x86::code_asm::asm_traits::CodeAsmVmaxps<
        iced_x86::code_asm::AsmRegisterZmm,
        iced_x86::code_asm::AsmRegisterZmm,
        Z,
    >,
{
    use iced_x86::code_asm::xmmword_ptr;
    a.vmaxps(x, x, zero)?;
    a.vcvttps2udq(x, x)?;
    if masked {
        a.vpmovusdb(xmmword_ptr(at).k1(), x)?;
    } else {
        a.vpmovusdb(xmmword_ptr(at), x)?;
    }
    Ok(())
}

/// Runs generated kernels in unit tests: copies code to an anonymous
/// mapping, makes it executable and calls it with the kernel ABI.
#[cfg(all(test, target_arch = "x86_64", target_os = "linux"))]
#[allow(unsafe_code)]
pub(crate) mod exec {
    /// Calls `code` as `fn(arena, weights) -> i32`.
    pub(crate) fn call_kernel(code: &[u8], arena: &mut [u8], weights: &[u8]) -> i32 {
        let len = code.len().div_ceil(4096) * 4096;
        // SAFETY: a fresh private mapping of `len` bytes, written then made
        // read+execute before the call; the kernel only touches the arena
        // and weights slices it was generated for.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            std::ptr::copy_nonoverlapping(code.as_ptr(), p as *mut u8, code.len());
            assert_eq!(libc::mprotect(p, len, libc::PROT_READ | libc::PROT_EXEC), 0);
            let f = std::mem::transmute::<
                *mut libc::c_void,
                extern "C" fn(*mut u8, *const u8) -> i32,
            >(p);
            let r = f(arena.as_mut_ptr(), weights.as_ptr());
            libc::munmap(p, len);
            r
        }
    }
}
