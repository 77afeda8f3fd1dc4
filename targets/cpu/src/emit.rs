//! Compiling Cranelift functions and placing them in one TEXT blob with
//! relocations in the artifact's own kinds.

use cranelift_codegen::binemit::Reloc as CReloc;
use cranelift_codegen::control::ControlPlane;
use cranelift_codegen::ir::{ExternalName, Function, LibCall};
use cranelift_codegen::{print_errors, Context, FinalizedRelocTarget};
use kiln_format::{Arch, HostFn, KernelEntry, Reloc, RelocKind, RelocTarget, Step};

use crate::isa::Target;
use crate::CpuError;

/// Namespace of `UserExternalName`s that name host (libm) functions; the
/// index is the [`HostFn`] code.
pub(crate) const HOST_NAMESPACE: u32 = 1;

/// The second part of a chained kernel ([`Text::add_chain`]).
pub(crate) enum TailCode {
    /// A Cranelift function.
    Clif(Box<Function>),
    /// Finished machine code (position-independent, no relocations).
    Machine(Vec<u8>),
}

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
        let (start, len) = self.place(name, func, target)?;
        self.push_kernel(name, start, len);
        Ok(())
    }

    /// Appends microkernel `code` and `tail` as ONE kernel of node `name`:
    /// a trampoline calls `code` with the kernel arguments, then tail-jumps
    /// to `tail` with the same arguments, so `tail` returns to the kernel's
    /// caller. x86-64 only (microkernels are AVX-512).
    pub(crate) fn add_chain(
        &mut self,
        name: &str,
        code: &[u8],
        tail: TailCode,
        target: &Target,
    ) -> Result<(), CpuError> {
        // push rdi; push rsi; sub rsp, 8 (keeps the callee's stack 16-byte
        // aligned); call rel32; add rsp, 8; pop rsi; pop rdi; jmp rel32.
        const TRAMPOLINE: [u8; 22] = [
            0x57, 0x56, 0x48, 0x83, 0xEC, 0x08, 0xE8, 0, 0, 0, 0, 0x48, 0x83, 0xC4, 0x08, 0x5E,
            0x5F, 0xE9, 0, 0, 0, 0,
        ];
        const CALL_END: u64 = 11;
        const JMP_END: u64 = 22;
        let start = self.append(&TRAMPOLINE, 64);
        let mk = self.append(code, 64);
        let (tail, tail_len) = match tail {
            TailCode::Clif(func) => self.place(name, *func, target)?,
            TailCode::Machine(code) => (self.append(&code, 64), code.len() as u64),
        };
        let rel = |from: u64, to: u64| {
            i32::try_from(to as i64 - from as i64).map_err(|_| CpuError::TooLarge {
                node: name.to_owned(),
                message: "a fused kernel is larger than 2 GiB".into(),
            })
        };
        let call = rel(start + CALL_END, mk)?.to_le_bytes();
        let jmp = rel(start + JMP_END, tail)?.to_le_bytes();
        let s = start as usize;
        self.bytes[s + 7..s + 11].copy_from_slice(&call);
        self.bytes[s + 18..s + 22].copy_from_slice(&jmp);
        self.push_kernel(name, start, tail + tail_len - start);
        Ok(())
    }

    /// Appends `code` at the next multiple of `align`, the gap filled with
    /// the architecture's trap bytes (int3 on x86-64); returns its offset.
    fn append(&mut self, code: &[u8], align: u64) -> u64 {
        let start = (self.bytes.len() as u64).div_ceil(align) * align;
        let pad = match self.arch {
            Arch::X86_64 => 0xcc,
            Arch::Aarch64 | Arch::Nvptx64 => 0,
        };
        self.bytes.resize(start as usize, pad);
        self.bytes.extend_from_slice(code);
        start
    }

    /// Compiles `func` and appends it; returns its offset and length.
    fn place(
        &mut self,
        name: &str,
        func: Function,
        target: &Target,
    ) -> Result<(u64, u64), CpuError> {
        let mut ctx = Context::for_function(func);
        if let Err(e) = ctx.compile(&*target.isa, &mut ControlPlane::default()) {
            return Err(CpuError::Codegen {
                node: name.to_owned(),
                message: print_errors::pretty_error(e.func, e.inner),
            });
        }
        let code = ctx.compiled_code().expect("compiled above");
        let align = u64::from(code.buffer.alignment).max(32);
        let start = self.append(code.code_buffer(), align);
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
        Ok((start, len))
    }

    /// Appends finished machine code (position-independent, no
    /// relocations) as the kernels of node `name`, one per task, and
    /// schedules them as one step.
    pub(crate) fn add_machine(&mut self, name: &str, tasks: &[Vec<u8>]) {
        let first = self.kernels.len() as u32;
        for (t, code) in tasks.iter().enumerate() {
            let start = self.append(code, 64);
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

    /// Appends Cranelift functions as the kernels of node `name`, one per
    /// task, scheduled as one step.
    pub(crate) fn add_tasks(
        &mut self,
        name: &str,
        funcs: Vec<Function>,
        target: &Target,
    ) -> Result<(), CpuError> {
        let first = self.kernels.len() as u32;
        let tasks = funcs.len() as u32;
        for (t, func) in funcs.into_iter().enumerate() {
            let kernel = format!("{name}#{t}");
            let (start, len) = self.place(&kernel, func, target)?;
            self.kernels.push(KernelEntry {
                name: kernel,
                text_offset: start,
                text_len: len,
            });
        }
        self.schedule.push(Step {
            kernel: first,
            tasks,
            node: name.to_owned(),
        });
        Ok(())
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

    /// The steps scheduled since the last call: one profile's schedule
    /// (the kernels stay, for the next profile's steps to follow).
    pub(crate) fn take_schedule(&mut self) -> Vec<Step> {
        std::mem::take(&mut self.schedule)
    }

    /// TEXT bytes, kernel table and relocations.
    pub(crate) fn finish(self) -> (Vec<u8>, Vec<KernelEntry>, Vec<Reloc>) {
        debug_assert!(
            self.schedule.is_empty(),
            "a profile's schedule was not taken"
        );
        (self.bytes, self.kernels, self.relocs)
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
