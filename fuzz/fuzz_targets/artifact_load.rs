//! Fuzz target: artifact bytes → `Model::from_bytes` → `run` (first byte: 1 = recompute checksums first).
//! The body is `kiln_tests::fuzz::artifact_load`, shared with the stable smoke run.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    kiln_tests::fuzz::artifact_load(data);
});
