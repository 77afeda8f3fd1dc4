//! Fuzz target: ONNX model bytes → frontend → passes → CPU code generation: `Ok` or a typed error.
//! The body is `kiln_tests::fuzz::onnx_compile`, shared with the stable smoke run.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    kiln_tests::fuzz::onnx_compile(data);
});
