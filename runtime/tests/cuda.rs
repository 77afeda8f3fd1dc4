//! The `cuda` feature's loader on this machine: a CUDA artifact loads on a
//! GPU or gives a typed error (no driver, old GPU), never a panic; a CPU
//! artifact is refused; the CPU loader refuses CUDA artifacts.
#![cfg(feature = "cuda")]

mod common;

use common::{copy_model, spec};
use kiln_runtime::cuda::CudaModel;
use kiln_runtime::format::{Artifact, CudaCode, CudaKernel, Metadata, Profile};
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
    };
    let profile = Profile {
        inputs: vec![spec("x", DType::F32, &[4], 64)],
        outputs: vec![spec("y", DType::F32, &[4], 128)],
        arena_size: 192,
        dense_kernels: Vec::new(),
        schedule: Vec::new(),
        role: kiln_runtime::format::Role::SHAPES,
        bounded: Vec::new(),
    };
    code.into_artifact(metadata, profile, Vec::new())
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

/// `CudaModel::load_verified` checks the signature on the bytes it read
/// before anything reaches the driver: an unsigned artifact and one whose
/// signature is for other content are refused even without a GPU.
#[cfg(feature = "signing")]
#[test]
fn cuda_artifacts_have_a_signed_load_path() {
    use kiln_runtime::format::{read_header, signature_path, DetachedSignature};
    use kiln_runtime::PublicKey;
    let key = ed25519_dalek::SigningKey::from_bytes(&[7; 32]);
    let key = PublicKey::from_bytes(&key.verifying_key().to_bytes()).unwrap();
    let dir = std::env::temp_dir().join(format!("kiln-cuda-signed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("model.kiln");
    let bytes = copy_artifact(70).to_bytes();
    std::fs::write(&path, &bytes).unwrap();
    let err = CudaModel::load_verified(&path, &key).err().unwrap();
    assert!(matches!(err, Error::Unsigned { .. }), "{err:?}");
    let mut other = read_header(&bytes).unwrap().content_hash;
    other[0] ^= 1;
    let sig = DetachedSignature {
        content_hash: other,
        signature: [0; 64],
    };
    std::fs::write(signature_path(&path), sig.to_bytes()).unwrap();
    let err = CudaModel::load_verified(&path, &key).err().unwrap();
    assert!(matches!(err, Error::ModifiedAfterSigning { .. }), "{err:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
