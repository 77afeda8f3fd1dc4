//! Fuzz target: IR text → parser → verifier → printer → parser (round trip).
//! The body is `kiln_tests::fuzz::ir_text`, shared with the stable smoke run.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    kiln_tests::fuzz::ir_text(data);
});
