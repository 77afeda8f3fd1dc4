//! The `cuda` feature's loader on this machine: a CUDA artifact loads on a
//! GPU or gives a typed error (no driver, old GPU), never a panic; a CPU
//! artifact is refused; the CPU loader refuses CUDA artifacts.
#![cfg(feature = "cuda")]

mod common;

use common::{copy_model, spec};
use kiln_runtime::cuda::CudaModel;
use kiln_runtime::format::{Artifact, CudaCode, CudaKernel, Metadata};
use kiln_runtime::{DType, Error, Model, Tensor};

/// A hand-written CUDA artifact: `y = x` for `f32[4]`, one kernel copying
/// from arena+64 to arena+128 (what the compiler emits for an output copy).
fn copy_artifact(sm: u32) -> Artifact {
    let ptx = format!(
        ".version 7.0\n.target sm_{sm}\n.address_size 64\n\n\
.visible .entry copy(\n\t.param .u64 arena,\n\t.param .u64 weights\n)\n{{\n\
\t.reg .pred %p<2>;\n\t.reg .b32 %r<5>;\n\t.reg .b64 %rd<6>;\n\t.reg .f32 %f<2>;\n\
\tld.param.u64 %rd1, [arena];\n\tcvta.to.global.u64 %rd2, %rd1;\n\
\tmov.u32 %r1, %tid.x;\n\tsetp.ge.u32 %p1, %r1, 4;\n\t@%p1 ret;\n\
\tmul.wide.u32 %rd3, %r1, 4;\n\tadd.u64 %rd4, %rd2, %rd3;\n\
\tld.global.f32 %f1, [%rd4+64];\n\tst.global.f32 [%rd4+128], %f1;\n\tret;\n}}\n"
    );
    let code = CudaCode {
        sm,
        ptx,
        cubin: Vec::new(),
        kernels: vec![CudaKernel {
            name: "copy".into(),
            node: "output:y".into(),
            grid: [1, 1, 1],
            block: [32, 1, 1],
            shared_bytes: 0,
            registers: 0,
            spill_bytes: 0,
            static_shared_bytes: 0,
        }],
        schedule: vec![0],
    };
    let metadata = Metadata {
        compiler_version: "kiln-test".into(),
        target: format!("cuda-sm{sm}"),
        options: String::new(),
        source_sha256: [0; 32],
        inputs: vec![spec("x", DType::F32, &[4], 64)],
        outputs: vec![spec("y", DType::F32, &[4], 128)],
        arena_size: 192,
        dense_kernels: Vec::new(),
    };
    code.into_artifact(metadata, Vec::new())
}

#[test]
fn a_cuda_artifact_loads_or_says_why_not() {
    let bytes = copy_artifact(70).to_bytes();
    // SAFETY: only probes for the library.
    let driver = unsafe { cudarc::driver::sys::is_culib_present() };
    match CudaModel::from_bytes(&bytes) {
        Err(Error::NoCudaDriver) => {
            assert!(!driver, "a driver is present, yet NoCudaDriver");
            let msg = Error::NoCudaDriver.to_string();
            assert!(msg.contains("no CUDA driver"), "{msg}");
        }
        // With a driver: either a GPU ran it, or there was a typed reason
        // (no device, ...).
        Ok(mut m) => {
            let x = Tensor::from_f32("x", &[4], &[1.0, -2.0, 3.5, 0.25]);
            let y = m.run(&[x.view()]).expect("run");
            assert_eq!(y[0].to_f32_vec().unwrap(), vec![1.0, -2.0, 3.5, 0.25]);
        }
        Err(e) => assert!(
            driver,
            "without a driver the error must be NoCudaDriver: {e}"
        ),
    }
}

#[test]
fn the_cuda_loader_refuses_cpu_artifacts() {
    let e = CudaModel::from_bytes(&copy_model().to_bytes()).unwrap_err();
    assert!(matches!(e, Error::NotCudaArtifact { .. }), "{e:?}");
    assert!(e.to_string().contains("CPU artifact"), "{e}");
}

#[test]
fn the_cpu_loader_refuses_cuda_artifacts() {
    let e = Model::from_bytes(&copy_artifact(86).to_bytes()).unwrap_err();
    assert!(matches!(e, Error::CudaArtifact { sm: 86 }), "{e:?}");
}

#[test]
fn a_malformed_cuda_section_is_a_format_error() {
    let mut a = copy_artifact(80);
    a.text.truncate(a.text.len() - 3);
    let e = CudaModel::from_bytes(&a.to_bytes()).unwrap_err();
    assert!(matches!(e, Error::Format(_)), "{e:?}");
}
