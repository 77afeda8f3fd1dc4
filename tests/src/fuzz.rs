//! The bodies of Kiln's fuzz targets, shared by the cargo-fuzz targets in
//! `fuzz/` (coverage-guided, nightly-only instrumentation) and the stable
//! smoke run `tests/tests/fuzz_smoke.rs` (seed replay plus time-boxed
//! random and structure-aware mutations in the normal test build).
//!
//! Each body takes arbitrary bytes and returns whether they were accepted;
//! a panic, a hang or an unbounded allocation is a bug. See
//! `docs/robustness.md`.

use kiln_driver::{compile_bytes, CompileOptions};
use kiln_runtime::format::{Artifact, HEADER_LEN, SECTION_ENTRY_LEN};
use kiln_runtime::{Model, Tensor};
use sha2::{Digest, Sha256};

/// Limits the fuzz targets compile under: far below the defaults, so that
/// a run finds size checks that are missing rather than exhausting memory
/// on ones that are merely generous.
pub fn fuzz_compile_options() -> CompileOptions {
    let mut opts = CompileOptions::default();
    opts.import.max_initializer_bytes = 64 << 20;
    opts.import.max_generated_bytes = 64 << 20;
    opts.max_arena_bytes = 256 << 20;
    opts
}

/// Target (a): ONNX bytes → frontend → passes → CPU code generation. Must
/// return a typed error or an artifact within the limits that the runtime's
/// parser accepts.
pub fn onnx_compile(data: &[u8]) -> bool {
    let opts = fuzz_compile_options();
    match compile_bytes(data, None, &opts) {
        Ok(compiled) => {
            assert!(compiled.artifact.arena_size() <= opts.max_arena_bytes);
            if let Err(e) = Artifact::parse(&compiled.bytes) {
                panic!("the compiler wrote an artifact its runtime refuses: {e}");
            }
            true
        }
        Err(e) => {
            // Rendering the error exercises its Display (names, shapes).
            std::hint::black_box(e.to_string());
            false
        }
    }
}

/// Target (b): artifact bytes → `Model::from_bytes` → `run` with zero
/// inputs of the declared types.
///
/// The first byte selects the mode. Even: the rest is loaded as it is and,
/// if it loads, run; every mutation meets the checksums first, so what runs
/// is what the compiler wrote. Odd: the section and content checksums are
/// recomputed first, so mutations reach the structural checks behind them
/// (lengths, offsets, relocation sites and targets, kernel and schedule
/// indices, tensor ranges), which must hold on their own; such an artifact
/// is loaded but never run. An artifact is native code: one whose
/// checksums were recomputed over changed code (or a changed arena size)
/// may do anything its bytes say (`docs/security.md`); the runtime's
/// promise is that it is rejected or loaded without harm.
pub fn artifact_load(data: &[u8]) -> bool {
    let Some((&mode, rest)) = data.split_first() else {
        return false;
    };
    let recomputed = mode & 1 == 1;
    let mut bytes = rest.to_vec();
    if recomputed {
        recompute_checksums(&mut bytes);
    }
    let model = match Model::from_bytes(&bytes) {
        Ok(m) => m,
        Err(e) => {
            std::hint::black_box(e.to_string());
            return false;
        }
    };
    if recomputed {
        return true;
    }
    let inputs: Vec<Tensor> = (model.inputs().iter())
        .map(|spec| Tensor {
            name: spec.name.clone(),
            dtype: spec.dtype,
            shape: spec.shape.clone(),
            data: vec![0; spec.byte_len() as usize],
        })
        .collect();
    let views: Vec<_> = inputs.iter().map(Tensor::view).collect();
    // A kernel may refuse the inputs (e.g. an index out of range): a typed
    // error is fine.
    let _ = model.run(&views);
    true
}

/// Rewrites every section's SHA-256 in the table (for sections inside the
/// file) and the content hash, so that changed bytes pass the checksums.
/// Returns false when the file is too short to hold a header and table.
pub fn recompute_checksums(bytes: &mut [u8]) -> bool {
    let sections = 6;
    let table_end = HEADER_LEN + sections * SECTION_ENTRY_LEN;
    if bytes.len() < table_end {
        return false;
    }
    for i in 0..sections {
        let e = HEADER_LEN + i * SECTION_ENTRY_LEN;
        let offset = u64::from_le_bytes(bytes[e + 8..e + 16].try_into().expect("8 bytes"));
        let len = u64::from_le_bytes(bytes[e + 16..e + 24].try_into().expect("8 bytes"));
        let end = offset
            .checked_add(len)
            .filter(|&end| end <= bytes.len() as u64);
        if let Some(end) = end {
            let digest = Sha256::digest(&bytes[offset as usize..end as usize]);
            bytes[e + 24..e + 56].copy_from_slice(&digest);
        }
    }
    let mut h = Sha256::new();
    h.update(&bytes[..32]);
    h.update(&bytes[64..table_end]);
    let hash: [u8; 32] = h.finalize().into();
    bytes[32..64].copy_from_slice(&hash);
    true
}

/// Target (c): the IR text parser. Whatever parses must verify, print, and
/// parse back to the same text.
pub fn ir_text(data: &[u8]) -> bool {
    let text = String::from_utf8_lossy(data);
    let Ok(graph) = kiln_ir::text::parse(&text) else {
        return false;
    };
    if let Err(e) = kiln_ir::verify::verify(&graph) {
        panic!("a parsed graph fails verification: {e}");
    }
    let full = kiln_ir::text::PrintOptions {
        full_constants: true,
    };
    let printed = kiln_ir::text::print_with(&graph, &full);
    let again = match kiln_ir::text::parse(&printed) {
        Ok(g) => g,
        Err(e) => panic!("printed IR does not parse: {e}\n{printed}"),
    };
    assert_eq!(
        kiln_ir::text::print_with(&again, &full),
        printed,
        "print → parse → print changed the text"
    );
    true
}
