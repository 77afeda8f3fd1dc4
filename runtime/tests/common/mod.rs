//! Hand-assembled artifacts shared by the integration tests.
#![allow(dead_code)]

use kiln_runtime::format::{
    Arch, Artifact, CpuFeatures, DType, HostFn, KernelEntry, Metadata, Profile, Reloc, RelocKind,
    RelocTarget, Role, Step, TensorSpec,
};

/// x86-64: `mov rax, [rdi]; mov [rdi+8], rax; xor eax, eax; ret`, i.e.
/// copy 8 bytes from arena offset 0 to arena offset 8.
pub const COPY_8: &[u8] = &[
    0x48, 0x8B, 0x47, 0x00, 0x48, 0x89, 0x47, 0x08, 0x31, 0xC0, 0xC3,
];

/// x86-64: `mov rax, [rsi]; mov [rdi+8], rax; xor eax, eax; ret`, i.e.
/// copy 8 bytes from weights offset 0 to arena offset 8.
pub const WEIGHTS_TO_ARENA: &[u8] = &[0x48, 0x8B, 0x06, 0x48, 0x89, 0x47, 0x08, 0x31, 0xC0, 0xC3];

/// x86-64: `arena[4..8] = f(arena[0..4])` for a host `float f(float)` whose
/// address is patched into the `movabs` immediate at [`CALL_HOST_IMM`]:
/// `push rbx; mov rbx, rdi; movss xmm0, [rdi]; movabs rax, imm64; call rax;
/// movss [rbx+4], xmm0; xor eax, eax; pop rbx; ret`.
pub const CALL_HOST: &[u8] = &[
    0x53, 0x48, 0x89, 0xFB, 0xF3, 0x0F, 0x10, 0x07, 0x48, 0xB8, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xD0,
    0xF3, 0x0F, 0x11, 0x43, 0x04, 0x31, 0xC0, 0x5B, 0xC3,
];
/// Offset of the `movabs` immediate in [`CALL_HOST`].
pub const CALL_HOST_IMM: u64 = 10;

/// x86-64: `sub rsp, 8; call rel32; add rsp, 8; ret`, the rel32 at
/// [`CALL_REL_SITE`] (PC-relative to the end of the call, so addend -4).
pub const CALL_REL: &[u8] = &[
    0x48, 0x83, 0xEC, 0x08, 0xE8, 0, 0, 0, 0, 0x48, 0x83, 0xC4, 0x08, 0xC3,
];
/// Offset of the rel32 in [`CALL_REL`].
pub const CALL_REL_SITE: u64 = 5;

/// x86-64: `mov eax, code; ret`.
pub fn return_code(code: i32) -> Vec<u8> {
    let mut v = vec![0xB8];
    v.extend_from_slice(&code.to_le_bytes());
    v.push(0xC3);
    v
}

pub fn spec(name: &str, dtype: DType, shape: &[u64], arena_offset: u64) -> TensorSpec {
    TensorSpec {
        name: name.into(),
        dtype,
        shape: shape.to_vec(),
        arena_offset,
    }
}

pub fn kernel(name: &str, text_offset: u64, text_len: usize) -> KernelEntry {
    KernelEntry {
        name: name.into(),
        text_offset,
        text_len: text_len as u64,
    }
}

pub fn step(kernel: u32, node: &str) -> Step {
    Step {
        kernel,
        tasks: 1,
        node: node.into(),
    }
}

/// An artifact with `text` as its only kernel, called once by node `node`.
pub fn single_kernel(text: &[u8], inputs: Vec<TensorSpec>, outputs: Vec<TensorSpec>) -> Artifact {
    Artifact {
        arch: Arch::X86_64,
        features: CpuFeatures::NONE,
        metadata: Metadata {
            compiler_version: "kiln-test 0.0.0".into(),
            target: "x86_64".into(),
            options: "-O0".into(),
            source_sha256: [7; 32],
        },
        weights: Vec::new(),
        text: text.to_vec(),
        kernels: vec![kernel("k0", 0, text.len())],
        relocs: Vec::new(),
        profiles: vec![Profile {
            inputs,
            outputs,
            arena_size: 16,
            dense_kernels: Vec::new(),
            schedule: vec![step(0, "/node0")],
            role: Role::SHAPES,
            bounded: Vec::new(),
        }],
        padding: Vec::new(),
        golden: Default::default(),
    }
}

/// `y = x` for `x, y: f32[2]` (x at arena 0, y at arena 8).
pub fn copy_model() -> Artifact {
    single_kernel(
        COPY_8,
        vec![spec("x", DType::F32, &[2], 0)],
        vec![spec("y", DType::F32, &[2], 8)],
    )
}

/// `y = f(x)` for a host function `f`, `x, y: f32[]`, through an Abs64
/// relocation.
pub fn host_call_model(f: HostFn) -> Artifact {
    let mut a = single_kernel(
        CALL_HOST,
        vec![spec("x", DType::F32, &[], 0)],
        vec![spec("y", DType::F32, &[], 4)],
    );
    a.relocs.push(Reloc {
        offset: CALL_HOST_IMM,
        kind: RelocKind::Abs64,
        target: RelocTarget::Host(f),
        addend: 0,
    });
    a
}

/// A richer artifact for format tests: weights, two kernels, every
/// relocation target kind, two inputs and outputs.
pub fn rich_artifact() -> Artifact {
    let mut text = CALL_REL.to_vec();
    text.resize(32, 0xCC);
    text.extend_from_slice(COPY_8);
    let mut a = copy_model();
    a.features = CpuFeatures::SSE3 | CpuFeatures::AVX2;
    a.weights = (0..=255).collect();
    a.text = text;
    a.kernels = vec![
        kernel("caller", 0, CALL_REL.len()),
        kernel("copy", 32, COPY_8.len()),
    ];
    a.relocs = vec![
        Reloc {
            offset: CALL_REL_SITE,
            kind: RelocKind::PcRel32,
            target: RelocTarget::Kernel(1),
            addend: -4,
        },
        Reloc {
            offset: 16,
            kind: RelocKind::Abs64,
            target: RelocTarget::Host(HostFn::Tanhf),
            addend: 0,
        },
        Reloc {
            offset: 24,
            kind: RelocKind::Abs64,
            target: RelocTarget::Text(32),
            addend: -1,
        },
    ];
    a.profiles[0].schedule = vec![step(0, "/a"), step(1, "/b")];
    a.profiles[0]
        .inputs
        .push(spec("mask", DType::Bool, &[3, 1], 16));
    a.profiles[0].outputs.push(spec("idx", DType::I64, &[], 24));
    a.profiles[0].arena_size = 32;
    a
}
