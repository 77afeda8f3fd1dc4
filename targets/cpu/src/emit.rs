//! Compiling Cranelift functions and placing them in one TEXT blob with
//! relocations in the artifact's own kinds.

use cranelift_codegen::binemit::Reloc as CReloc;
use cranelift_codegen::control::ControlPlane;
use cranelift_codegen::ir::{ExternalName, Function, LibCall};
use cranelift_codegen::{print_errors, Context, FinalizedRelocTarget};
use kiln_runtime::format::{Arch, HostFn, KernelEntry, Reloc, RelocKind, RelocTarget, Step};

use crate::isa::Target;
use crate::CpuError;

/// Namespace of `UserExternalName`s that name host (libm) functions; the
/// index is the [`HostFn`] code.
pub(crate) const HOST_NAMESPACE: u32 = 1;

/// The TEXT section under construction.
pub(crate) struct Text {
    arch: Arch,
    bytes: Vec<u8>,
    kernels: Vec<KernelEntry>,
    relocs: Vec<Reloc>,
    schedule: Vec<Step>,
}

impl Text {
    pub(crate) fn new(arch: Arch) -> Text {
        Text {
            arch,
            bytes: Vec::new(),
            kernels: Vec::new(),
            relocs: Vec::new(),
            schedule: Vec::new(),
        }
    }

    /// Compiles `func` (the kernel of node `name`), appends it and schedules it.
    pub(crate) fn add(
        &mut self,
        name: &str,
        func: Function,
        target: &Target,
    ) -> Result<(), CpuError> {
        let mut ctx = Context::for_function(func);
        if let Err(e) = ctx.compile(&*target.isa, &mut ControlPlane::default()) {
            return Err(CpuError::Codegen {
                node: name.to_owned(),
                message: print_errors::pretty_error(e.func, e.inner),
            });
        }
        let code = ctx.compiled_code().expect("compiled above");
        let align = u64::from(code.buffer.alignment).max(32);
        let start = (self.bytes.len() as u64).div_ceil(align) * align;
        let pad = match self.arch {
            Arch::X86_64 => 0xcc,
            Arch::Aarch64 | Arch::Nvptx64 => 0,
        };
        self.bytes.resize(start as usize, pad);
        self.bytes.extend_from_slice(code.code_buffer());
        let len = code.code_buffer().len() as u64;
        for r in code.buffer.relocs() {
            let kind = match r.kind {
                CReloc::Abs8 => RelocKind::Abs64,
                CReloc::X86CallPCRel4 | CReloc::X86PCRel4 => RelocKind::PcRel32,
                other => {
                    return Err(CpuError::UnsupportedReloc {
                        node: name.to_owned(),
                        kind: format!("{other:?}"),
                        target: format!("{:?}", r.target),
                    })
                }
            };
            let unsupported = || CpuError::UnsupportedReloc {
                node: name.to_owned(),
                kind: format!("{:?}", r.kind),
                target: format!("{:?}", r.target),
            };
            let reloc_target = match &r.target {
                FinalizedRelocTarget::Func(off) => RelocTarget::Text(start + u64::from(*off)),
                FinalizedRelocTarget::ExternalName(ExternalName::User(user)) => {
                    let n = &ctx.func.params.user_named_funcs()[*user];
                    if n.namespace != HOST_NAMESPACE {
                        return Err(unsupported());
                    }
                    RelocTarget::Host(HostFn::from_u32(n.index).ok_or_else(unsupported)?)
                }
                FinalizedRelocTarget::ExternalName(ExternalName::LibCall(lc)) => {
                    RelocTarget::Host(libcall_host(*lc).ok_or_else(unsupported)?)
                }
                FinalizedRelocTarget::ExternalName(_) => return Err(unsupported()),
            };
            self.relocs.push(Reloc {
                offset: start + u64::from(r.offset),
                kind,
                target: reloc_target,
                addend: r.addend,
            });
        }
        self.push_kernel(name, start, len);
        Ok(())
    }

    /// Appends finished machine code (position-independent, no
    /// relocations) as the kernels of node `name`, one per task, and
    /// schedules them as one step.
    pub(crate) fn add_machine(&mut self, name: &str, tasks: &[Vec<u8>]) {
        let first = self.kernels.len() as u32;
        for (t, code) in tasks.iter().enumerate() {
            let start = (self.bytes.len() as u64).div_ceil(64) * 64;
            let pad = match self.arch {
                Arch::X86_64 => 0xcc,
                Arch::Aarch64 | Arch::Nvptx64 => 0,
            };
            self.bytes.resize(start as usize, pad);
            self.bytes.extend_from_slice(code);
            let kernel = if tasks.len() == 1 {
                name.to_owned()
            } else {
                format!("{name}#{t}")
            };
            self.kernels.push(KernelEntry {
                name: kernel,
                text_offset: start,
                text_len: code.len() as u64,
            });
        }
        self.schedule.push(Step {
            kernel: first,
            tasks: tasks.len() as u32,
            node: name.to_owned(),
        });
    }

    fn push_kernel(&mut self, name: &str, start: u64, len: u64) {
        let index = self.kernels.len() as u32;
        self.kernels.push(KernelEntry {
            name: name.to_owned(),
            text_offset: start,
            text_len: len,
        });
        self.schedule.push(Step {
            kernel: index,
            tasks: 1,
            node: name.to_owned(),
        });
    }

    /// TEXT bytes, kernel table, relocations and schedule.
    pub(crate) fn finish(self) -> (Vec<u8>, Vec<KernelEntry>, Vec<Reloc>, Vec<Step>) {
        (self.bytes, self.kernels, self.relocs, self.schedule)
    }
}

/// The host function implementing a Cranelift libcall, where there is one.
fn libcall_host(lc: LibCall) -> Option<HostFn> {
    Some(match lc {
        LibCall::CeilF32 => HostFn::Ceilf,
        LibCall::CeilF64 => HostFn::Ceil,
        LibCall::FloorF32 => HostFn::Floorf,
        LibCall::FloorF64 => HostFn::Floor,
        LibCall::TruncF32 => HostFn::Truncf,
        LibCall::TruncF64 => HostFn::Trunc,
        LibCall::NearestF32 => HostFn::Nearbyintf,
        LibCall::NearestF64 => HostFn::Nearbyint,
        LibCall::FmaF32 => HostFn::Fmaf,
        LibCall::FmaF64 => HostFn::Fma,
        _ => return None,
    })
}
