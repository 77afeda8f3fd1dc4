//! Machine code tables: kernels, relocations, host functions, schedule.

/// One machine-code function in the TEXT section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelEntry {
    /// Name, for diagnostics and `kiln inspect`.
    pub name: String,
    /// Offset of the first instruction in TEXT.
    pub text_offset: u64,
    /// Length of the function's code (including its constant pool) in bytes.
    pub text_len: u64,
}

/// A function of the host C library that artifact code may call.
///
/// This is an allow-list: the loader resolves each to the real libm
/// function of the process, or to the runtime's own kernel
/// ([`HostFn::NonMaxSuppression`]), and nothing else can be imported.
/// The on-disk code is the `u32` discriminant.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HostFn {
    /// `expf` from libm.
    Expf = 1,
    /// `logf` from libm.
    Logf,
    /// `tanhf` from libm.
    Tanhf,
    /// `powf` from libm.
    Powf,
    /// `sinf` from libm.
    Sinf,
    /// `cosf` from libm.
    Cosf,
    /// `floorf` from libm.
    Floorf,
    /// `ceilf` from libm.
    Ceilf,
    /// `truncf` from libm.
    Truncf,
    /// `nearbyintf` from libm.
    Nearbyintf,
    /// `fmaf` from libm.
    Fmaf,
    /// `fmodf` from libm.
    Fmodf,
    /// `sqrtf` from libm.
    Sqrtf,
    /// `exp` from libm.
    Exp,
    /// `log` from libm.
    Log,
    /// `tanh` from libm.
    Tanh,
    /// `pow` from libm.
    Pow,
    /// `floor` from libm.
    Floor,
    /// `ceil` from libm.
    Ceil,
    /// `trunc` from libm.
    Trunc,
    /// `nearbyint` from libm.
    Nearbyint,
    /// `fma` from libm.
    Fma,
    /// `fmod` from libm.
    Fmod,
    /// `sqrt` from libm.
    Sqrt,
    /// `erff` from libm.
    Erff,
    /// `atanf` from libm.
    Atanf,
    /// `atan2f` from libm.
    Atan2f,
    /// `sinhf` from libm.
    Sinhf,
    /// `coshf` from libm.
    Coshf,
    /// `asinf` from libm.
    Asinf,
    /// `acosf` from libm.
    Acosf,
    /// `tanf` from libm.
    Tanf,
    /// The runtime's `NonMaxSuppression` (`kiln_host::Nms::select`), C ABI
    /// `(boxes: *const f32, scores: *const f32, out: *mut i64, scratch:
    /// *mut u32, batches, classes, boxes, cap, center_point_box,
    /// has_score_threshold: u64, max_per_class: i64, iou_threshold,
    /// score_threshold: f32)`:
    /// writes the selected rows, zero rows up to the bound and a last row
    /// holding the count.
    NonMaxSuppression,
    /// The runtime's `Unique` plan (`kiln_host::Unique::select`), C ABI
    /// `(keys: *const u64, float_keys, outer, n, inner, sorted: u64,
    /// scratch: *mut u32, out: *mut i64)`: keys are f64 when `float_keys`
    /// is 1, else i64.
    Unique,
}

impl HostFn {
    /// Every host function, in code order.
    pub const ALL: [HostFn; 34] = [
        HostFn::Expf,
        HostFn::Logf,
        HostFn::Tanhf,
        HostFn::Powf,
        HostFn::Sinf,
        HostFn::Cosf,
        HostFn::Floorf,
        HostFn::Ceilf,
        HostFn::Truncf,
        HostFn::Nearbyintf,
        HostFn::Fmaf,
        HostFn::Fmodf,
        HostFn::Sqrtf,
        HostFn::Exp,
        HostFn::Log,
        HostFn::Tanh,
        HostFn::Pow,
        HostFn::Floor,
        HostFn::Ceil,
        HostFn::Trunc,
        HostFn::Nearbyint,
        HostFn::Fma,
        HostFn::Fmod,
        HostFn::Sqrt,
        HostFn::Erff,
        HostFn::Atanf,
        HostFn::Atan2f,
        HostFn::Sinhf,
        HostFn::Coshf,
        HostFn::Asinf,
        HostFn::Acosf,
        HostFn::Tanf,
        HostFn::NonMaxSuppression,
        HostFn::Unique,
    ];

    /// The C symbol name (`"expf"`).
    pub fn name(self) -> &'static str {
        match self {
            HostFn::Expf => "expf",
            HostFn::Logf => "logf",
            HostFn::Tanhf => "tanhf",
            HostFn::Powf => "powf",
            HostFn::Sinf => "sinf",
            HostFn::Cosf => "cosf",
            HostFn::Floorf => "floorf",
            HostFn::Ceilf => "ceilf",
            HostFn::Truncf => "truncf",
            HostFn::Nearbyintf => "nearbyintf",
            HostFn::Fmaf => "fmaf",
            HostFn::Fmodf => "fmodf",
            HostFn::Sqrtf => "sqrtf",
            HostFn::Exp => "exp",
            HostFn::Log => "log",
            HostFn::Tanh => "tanh",
            HostFn::Pow => "pow",
            HostFn::Floor => "floor",
            HostFn::Ceil => "ceil",
            HostFn::Trunc => "trunc",
            HostFn::Nearbyint => "nearbyint",
            HostFn::Fma => "fma",
            HostFn::Fmod => "fmod",
            HostFn::Sqrt => "sqrt",
            HostFn::Erff => "erff",
            HostFn::Atanf => "atanf",
            HostFn::Atan2f => "atan2f",
            HostFn::Sinhf => "sinhf",
            HostFn::Coshf => "coshf",
            HostFn::Asinf => "asinf",
            HostFn::Acosf => "acosf",
            HostFn::Tanf => "tanf",
            HostFn::NonMaxSuppression => "kiln_non_max_suppression",
            HostFn::Unique => "kiln_unique",
        }
    }

    /// The host function with on-disk code `code`, if there is one.
    pub fn from_u32(code: u32) -> Option<HostFn> {
        HostFn::ALL.into_iter().find(|h| *h as u32 == code)
    }

    /// The host function with C symbol `name`, if it is on the allow-list.
    pub fn from_name(name: &str) -> Option<HostFn> {
        HostFn::ALL.into_iter().find(|h| h.name() == name)
    }
}

/// How a relocation patches TEXT (`u32` on disk).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RelocKind {
    /// Write `target + addend` as a little-endian `u64` at the patch site.
    Abs64 = 1,
    /// Write `target + addend - address_of_patch_site` as a little-endian
    /// `i32`; loading fails if the value does not fit.
    PcRel32 = 2,
}

impl RelocKind {
    /// The relocation kind with on-disk code `code`, if there is one.
    pub fn from_u32(code: u32) -> Option<RelocKind> {
        match code {
            1 => Some(RelocKind::Abs64),
            2 => Some(RelocKind::PcRel32),
            _ => None,
        }
    }

    /// What the code adds to the patched value to form the address it
    /// reaches: 0 for an absolute address; for a PC-relative one, the
    /// x86-64 displacement counts from the end of its 4 bytes, so code
    /// reaches `target + addend + 4` (the usual addend is -4).
    pub fn reach_bias(self) -> i64 {
        match self {
            RelocKind::Abs64 => 0,
            RelocKind::PcRel32 => 4,
        }
    }

    /// Number of bytes the relocation writes.
    pub fn patch_width(self) -> u64 {
        match self {
            RelocKind::Abs64 => 8,
            RelocKind::PcRel32 => 4,
        }
    }
}

/// The address a relocation refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RelocTarget {
    /// A host library function.
    Host(HostFn),
    /// The first instruction of a kernel (index into [`Artifact::kernels`](super::Artifact::kernels)).
    Kernel(u32),
    /// An offset in TEXT (at most the length of TEXT).
    Text(u64),
}

/// One patch of TEXT applied at load time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Reloc {
    /// Offset of the patch site in TEXT.
    pub offset: u64,
    /// What to write.
    pub kind: RelocKind,
    /// The address written (before the addend).
    pub target: RelocTarget,
    /// Added to the target address.
    pub addend: i64,
}

/// One step of the schedule: the kernels `kernel .. kernel + tasks`, which
/// the compiler made independent (each writes its own slice of the node's
/// output and reads nothing another writes), so a runtime may run them in
/// any order or concurrently. Most steps have one task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// Index into [`Artifact::kernels`](super::Artifact::kernels) of the
    /// first task.
    pub kernel: u32,
    /// Number of tasks (consecutive kernels), at least 1.
    pub tasks: u32,
    /// Name of the source node, for error messages.
    pub node: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_fn_codes_and_names() {
        for (i, h) in HostFn::ALL.into_iter().enumerate() {
            assert_eq!(h as u32, i as u32 + 1);
            assert_eq!(HostFn::from_u32(h as u32), Some(h));
            assert_eq!(HostFn::from_name(h.name()), Some(h));
        }
        assert_eq!(HostFn::Atan2f.name(), "atan2f");
        assert_eq!(HostFn::from_u32(0), None);
    }
}

/// What an artifact's TEXT section holds, decided by the header's
/// architecture: machine code with the KERNELS and RELOCS tables that
/// describe it (and the profiles' schedules), or CUDA modules that carry
/// their own kernel table and schedule (KERNELS and RELOCS are then empty,
/// and the one profile has no steps). Reading TEXT through
/// this type is the one way to tell them apart, so no reader can take PTX
/// for machine code or the reverse. (Why this is not a section kind of its
/// own: `docs/artifact-format.md`, "TEXT".)
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Code<'a> {
    /// x86-64 or aarch64 machine code.
    Machine {
        /// The TEXT section, before relocation.
        text: &'a [u8],
        /// Functions in TEXT.
        kernels: &'a [KernelEntry],
        /// Patches applied to TEXT at load time.
        relocs: &'a [Reloc],
    },
    /// PTX (and a cubin) for an NVIDIA GPU, decoded and checked.
    Cuda(crate::CudaCode),
}

impl Code<'_> {
    /// The kernels the code holds: CPU functions or CUDA kernels.
    pub fn kernel_count(&self) -> usize {
        match self {
            Code::Machine { kernels, .. } => kernels.len(),
            Code::Cuda(code) => code.kernels.len(),
        }
    }
}
