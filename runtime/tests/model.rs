//! Loading and running hand-assembled artifacts.

mod common;

use common::{copy_model, spec};
use kiln_runtime::format::{Arch, CpuFeatures, DType};
use kiln_runtime::{Error, Model, Tensor, TensorRef};

fn load_err(bytes: &[u8]) -> Error {
    Model::from_bytes(bytes).expect_err("loading should fail")
}

#[test]
fn missing_cpu_feature() {
    let mut a = copy_model();
    let lacking = if cfg!(target_arch = "x86_64") {
        CpuFeatures::NEON
    } else {
        CpuFeatures::AVX512F
    };
    a.arch = Arch::host().unwrap_or(Arch::X86_64);
    a.features = lacking | CpuFeatures(1 << 50);
    let err = load_err(&a.to_bytes());
    let Error::MissingCpuFeatures(missing) = &err else {
        panic!("expected MissingCpuFeatures, got {err:?}");
    };
    assert_eq!(missing, &[lacking.names()[0], "unknown feature bit 50"]);
    assert!(
        err.to_string().starts_with(&format!(
            "this CPU lacks features the artifact needs: {}, unknown feature bit 50",
            lacking.names()[0]
        )),
        "{err}"
    );
}

#[test]
fn wrong_arch() {
    let mut a = copy_model();
    a.arch = if Arch::host() == Some(Arch::Aarch64) {
        Arch::X86_64
    } else {
        Arch::Aarch64
    };
    let err = load_err(&a.to_bytes());
    assert!(matches!(err, Error::UnsupportedArch { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!(
            "the artifact is compiled for {}, but this machine is {}",
            a.arch,
            std::env::consts::ARCH
        )
    );
}

#[test]
fn format_errors_pass_through() {
    let mut bytes = copy_model().to_bytes();
    let schedule = kiln_format::read_header(&bytes).unwrap().sections[5].clone();
    bytes[(schedule.offset + schedule.length - 1) as usize] ^= 1;
    let err = load_err(&bytes);
    assert_eq!(err.to_string(), "checksum mismatch in section PROFILES");
}

#[test]
fn missing_file() {
    let err = Model::load("/nonexistent/model.kiln").unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
    assert!(
        err.to_string()
            .starts_with("cannot read '/nonexistent/model.kiln': "),
        "{err}"
    );
}

#[test]
fn empty_file() {
    let path = temp_path("empty");
    std::fs::write(&path, b"").unwrap();
    let err = Model::load(&path).unwrap_err();
    std::fs::remove_file(&path).unwrap();
    assert!(
        err.to_string().starts_with("artifact is truncated"),
        "{err}"
    );
}

fn temp_path(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("kiln-runtime-{}-{name}.kiln", std::process::id()))
}

#[cfg(target_arch = "x86_64")]
mod x86_64 {
    use super::*;
    use common::*;
    use kiln_runtime::format::HostFn;
    use kiln_runtime::TensorSpec;

    fn x(values: &[f32; 2]) -> Tensor {
        Tensor::from_f32("x", &[2], values)
    }

    #[test]
    fn copy_kernel_runs() {
        let m = Model::from_bytes(&copy_model().to_bytes()).unwrap();
        assert_eq!(m.inputs(), [spec("x", DType::F32, &[2], 0)]);
        assert_eq!(m.outputs()[0].name, "y");
        let out = m.run(&[x(&[1.5, -2.25]).view()]).unwrap();
        assert_eq!(out, [Tensor::from_f32("y", &[2], &[1.5, -2.25])]);
        // Again, with new data and the allocation-free entry point.
        let mut y = [0u8; 8];
        let values = [3.0f32, 4.0];
        m.run_into(&[TensorRef::from_slice("x", &[2], &values)], &mut [&mut y])
            .unwrap();
        assert_eq!(y, Tensor::from_f32("y", &[2], &values).data[..]);
    }

    #[test]
    fn load_from_file_maps_weights() {
        let mut a = single_kernel(
            WEIGHTS_TO_ARENA,
            vec![],
            vec![spec("w", DType::F32, &[2], 8)],
        );
        a.weights = Tensor::from_f32("", &[2], &[0.5, 8.0]).data;
        let path = temp_path("weights");
        std::fs::write(&path, a.to_bytes()).unwrap();
        let loaded = Model::load(&path);
        std::fs::remove_file(&path).unwrap();
        let m = loaded.unwrap();
        assert_eq!(m.content_hash(), a.content_hash());
        let out = m.run(&[]).unwrap();
        assert_eq!(out[0].to_f32_vec(), Some(vec![0.5, 8.0]));
        // The same through `from_bytes`, which copies the weights.
        let m = Model::from_bytes(&a.to_bytes()).unwrap();
        assert_eq!(m.run(&[]).unwrap()[0].to_f32_vec(), Some(vec![0.5, 8.0]));
    }

    /// The file is read once: rewriting or truncating it after the load
    /// changes neither the weights nor the code that runs, and kills
    /// nothing (a mapping of the file would show the new weights, and
    /// touching a truncated mapping raises SIGBUS).
    #[test]
    fn a_loaded_model_ignores_later_changes_to_its_file() {
        let weights_model = |w: [f32; 2]| {
            let mut a = single_kernel(
                WEIGHTS_TO_ARENA,
                vec![],
                vec![spec("w", DType::F32, &[2], 8)],
            );
            a.weights = Tensor::from_f32("", &[2], &w).data;
            a.to_bytes()
        };
        let path = temp_path("rewritten");
        std::fs::write(&path, weights_model([0.5, 8.0])).unwrap();
        let m = Model::load(&path).unwrap();
        // In place, same length: only the weights' bytes differ.
        let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        std::io::Write::write_all(&mut f, &weights_model([-1.0, -2.0])).unwrap();
        assert_eq!(m.run(&[]).unwrap()[0].to_f32_vec(), Some(vec![0.5, 8.0]));
        f.set_len(0).unwrap();
        assert_eq!(m.run(&[]).unwrap()[0].to_f32_vec(), Some(vec![0.5, 8.0]));
        drop(f);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn host_functions_through_abs64_relocations() {
        for (f, input, expected) in [
            (HostFn::Expf, 1.0f32, 1.0f32.exp()),
            (HostFn::Tanhf, 0.5, 0.5f32.tanh()),
            (HostFn::Sqrtf, 2.0, 2.0f32.sqrt()),
        ] {
            let m = Model::from_bytes(&host_call_model(f).to_bytes()).unwrap();
            let x = Tensor::from_f32("x", &[], &[input]);
            let y = m.run(&[x.view()]).unwrap().remove(0);
            assert_eq!(y.to_f32_vec(), Some(vec![expected]), "{}", f.name());
        }
    }

    #[test]
    fn kernel_calls_kernel_through_pcrel32_relocation() {
        let m = Model::from_bytes(&rich_artifact().to_bytes()).unwrap();
        let mask = Tensor::from_slice("mask", &[3, 1], &[true, false, true]);
        let out = m.run(&[mask.view(), x(&[7.0, 8.0]).view()]).unwrap();
        assert_eq!(out[0].to_f32_vec(), Some(vec![7.0, 8.0]));
        assert_eq!(out[1].to_i64_vec(), Some(vec![0]));
    }

    #[test]
    fn kernel_error_codes() {
        let mut a = copy_model();
        let fail_at = 32;
        a.text.resize(fail_at, 0xCC);
        a.text.extend(return_code(1));
        a.text.extend(return_code(42));
        a.kernels.push(kernel("oob", fail_at as u64, 6));
        a.kernels.push(kernel("fail", fail_at as u64 + 6, 6));
        a.profiles[0].schedule.push(step(1, "/gather"));
        let m = Model::from_bytes(&a.to_bytes()).unwrap();
        let err = m.run(&[x(&[1.0, 2.0]).view()]).unwrap_err();
        assert!(matches!(&err, Error::Kernel { code: 1, .. }), "{err:?}");
        assert_eq!(err.to_string(), "node '/gather': index out of range");
        a.profiles[0].schedule[1] = step(2, "/custom");
        let m = Model::from_bytes(&a.to_bytes()).unwrap();
        let err = m.run(&[x(&[1.0, 2.0]).view()]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "node '/custom': kernel failed with code 42"
        );
    }

    fn two_input_model() -> Model {
        let mut a = copy_model();
        a.profiles[0].inputs.push(spec("b", DType::I64, &[1], 16));
        a.profiles[0].arena_size = 24;
        Model::from_bytes(&a.to_bytes()).unwrap()
    }

    fn run_err(m: &Model, inputs: &[TensorRef<'_>]) -> Error {
        m.run(inputs).expect_err("run should fail")
    }

    #[test]
    fn unknown_input() {
        let m = two_input_model();
        let foo = Tensor::from_f32("foo", &[2], &[0.0; 2]);
        let err = run_err(&m, &[foo.view()]);
        assert!(matches!(err, Error::UnknownInput { .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            "unknown input 'foo'; the model's inputs are: x, b"
        );
    }

    #[test]
    fn missing_input() {
        let m = two_input_model();
        let err = run_err(&m, &[x(&[0.0; 2]).view()]);
        assert!(matches!(err, Error::MissingInput { .. }), "{err:?}");
        assert_eq!(err.to_string(), "missing input 'b' (i64[1])");
    }

    #[test]
    fn duplicate_input() {
        let m = two_input_model();
        let x = x(&[0.0; 2]);
        let err = run_err(&m, &[x.view(), x.view()]);
        assert_eq!(err.to_string(), "input 'x' is given more than once");
    }

    #[test]
    fn wrong_dtype_and_shape() {
        let m = two_input_model();
        let b = Tensor::from_i64("b", &[1], &[5]);
        let wrong_dtype = Tensor::from_slice("x", &[2], &[1i32, 2]);
        let err = run_err(&m, &[wrong_dtype.view(), b.view()]);
        assert!(matches!(err, Error::InputTypeMismatch { .. }), "{err:?}");
        assert_eq!(err.to_string(), "input 'x': expected f32[2], given i32[2]");
        let wrong_shape = Tensor::from_f32("x", &[1, 2], &[1.0, 2.0]);
        let err = run_err(&m, &[b.view(), wrong_shape.view()]);
        assert_eq!(
            err.to_string(),
            "input 'x': expected f32[2], given f32[1,2]"
        );
    }

    #[test]
    fn wrong_data_length() {
        let m = two_input_model();
        let b = Tensor::from_i64("b", &[1], &[5]);
        let short = Tensor::from_f32("x", &[2], &[1.0]);
        let err = run_err(&m, &[short.view(), b.view()]);
        assert!(matches!(err, Error::InputDataLength { .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            "input 'x': f32[2] needs 8 bytes of data, given 4"
        );
    }

    #[test]
    fn wrong_output_buffers() {
        let m = Model::from_bytes(&copy_model().to_bytes()).unwrap();
        let x = x(&[1.0, 2.0]);
        let err = m.run_into(&[x.view()], &mut []).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the model has 1 outputs, but 0 output buffers were given"
        );
        let err = m.run_into(&[x.view()], &mut [&mut [0u8; 4]]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "output 'y': f32[2] needs a buffer of 8 bytes, given 4"
        );
    }

    #[test]
    fn pcrel32_far_outside_text_is_refused() {
        let mut a = host_call_model(HostFn::Expf);
        // A PC-relative reference 2^40 bytes away reaches outside TEXT:
        // refused while decoding, before any code is mapped (the patch's
        // own range check is unit-tested in `reloc.rs`).
        a.relocs[0] = kiln_runtime::format::Reloc {
            offset: 0,
            kind: kiln_runtime::format::RelocKind::PcRel32,
            target: kiln_runtime::format::RelocTarget::Text(0),
            addend: 1 << 40,
        };
        let err = load_err(&a.to_bytes());
        assert!(matches!(err, Error::Format(_)), "{err:?}");
        assert!(err.to_string().contains("reaches outside"), "{err}");
    }

    /// Threads beyond the model's most tasks would idle: a huge request
    /// is clamped, not an abort.
    #[test]
    fn session_threads_are_clamped_to_the_work_there_is() {
        let m = Model::from_bytes(&copy_model().to_bytes()).unwrap();
        let mut s = m.session_with_threads(usize::MAX).unwrap();
        assert_eq!(s.threads(), 1);
        let mut y = [0u8; 8];
        s.run_into(&[x(&[1.0, 2.0]).view()], &mut [&mut y]).unwrap();
    }

    #[test]
    fn sessions_run_in_their_own_arena_and_outlive_the_model() {
        let m = Model::from_bytes(&copy_model().to_bytes()).unwrap();
        let mut a = m.session().unwrap();
        let mut b = m.session().unwrap();
        drop(m);
        let mut y = [0u8; 8];
        a.run_into(&[x(&[1.0, 2.0]).view()], &mut [&mut y]).unwrap();
        assert_eq!(y, Tensor::from_f32("y", &[2], &[1.0, 2.0]).data[..]);
        let out = b.run(&[x(&[3.0, 4.0]).view()]).unwrap();
        assert_eq!(out[0].to_f32_vec(), Some(vec![3.0, 4.0]));
        // Session errors are the model's errors.
        let err = a.run(&[]).unwrap_err();
        assert!(matches!(err, Error::MissingInput { .. }), "{err:?}");
    }

    #[test]
    fn one_model_runs_from_many_threads_at_once() {
        let m = Model::from_bytes(&copy_model().to_bytes()).unwrap();
        std::thread::scope(|s| {
            for t in 0..8u16 {
                let m = &m;
                s.spawn(move || {
                    let mut session = m.session().unwrap();
                    for i in 0..500u16 {
                        let v = [f32::from(t), f32::from(i)];
                        // Alternate the shared entry point and the session.
                        let y = if i % 2 == 0 {
                            m.run(&[x(&v).view()]).unwrap().remove(0)
                        } else {
                            session.run(&[x(&v).view()]).unwrap().remove(0)
                        };
                        assert_eq!(y.to_f32_vec(), Some(v.to_vec()), "thread {t} run {i}");
                    }
                });
            }
        });
    }

    #[test]
    fn model_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Model>();
        check::<kiln_runtime::Session>();
        let m = Model::from_bytes(&copy_model().to_bytes()).unwrap();
        let spec: TensorSpec = std::thread::spawn(move || m.outputs()[0].clone())
            .join()
            .unwrap();
        assert_eq!(spec.byte_len(), 8);
    }
}

/// [`copy_model`] (`y = x`) with golden sets whose expected `y` is
/// `expected(x)` and tolerance 1e-4.
#[cfg(target_arch = "x86_64")]
fn with_golden(expected: impl Fn(f32) -> f32) -> kiln_runtime::format::Artifact {
    use kiln_runtime::format::{Golden, GoldenSet, GoldenTensor, Tolerance};
    let t = |name: &str, v: &[f32]| GoldenTensor {
        name: name.into(),
        dtype: DType::F32,
        shape: vec![2],
        data: std::borrow::Cow::Owned(v.iter().flat_map(|x| x.to_le_bytes()).collect()),
    };
    let set = |x: [f32; 2]| GoldenSet {
        inputs: vec![t("x", &x)],
        outputs: vec![t("y", &x.map(&expected))],
    };
    kiln_runtime::format::Artifact {
        golden: Golden {
            sets: vec![set([1.0, -2.0]), set([0.5, 4.0])],
            tolerances: vec![Tolerance {
                output: "y".into(),
                max_rel_error: 1e-4,
            }],
        },
        ..copy_model()
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn verify_runs_every_golden_set_against_its_tolerance() {
    let model = Model::from_bytes(&with_golden(|x| x).to_bytes()).unwrap();
    let report = model.verify().unwrap();
    assert!(report.passed(), "{report:?}");
    assert_eq!(report.checks.len(), 2);
    assert_eq!(report.checks[1].set, 1);
    // Expected values the model does not give: both sets fail, by name.
    let model = Model::from_bytes(&with_golden(|x| x * 1.001).to_bytes()).unwrap();
    let report = model.verify().unwrap();
    assert!(!report.passed());
    let failed: Vec<(usize, &str)> = (report.failures())
        .map(|c| (c.set, c.comparison.name.as_str()))
        .collect();
    assert_eq!(failed, [(0, "y"), (1, "y")]);
    assert!((report.checks[0].comparison.rel_error - 1e-3).abs() < 1e-6);
    // Without a self-test.
    let model = Model::from_bytes(&copy_model().to_bytes()).unwrap();
    let err = model.verify().unwrap_err();
    assert!(matches!(err, Error::NoGolden), "{err}");
    // Capi: the same answers as codes.
    use kiln_runtime::capi::*;
    for (artifact, code) in [
        (with_golden(|x| x), KILN_OK),
        (with_golden(|x| x + 1.0), KILN_VERIFY_FAILED),
        (copy_model(), KILN_ERROR_ARGUMENT),
    ] {
        let path =
            std::env::temp_dir().join(format!("kiln-verify-{}-{code}.kiln", std::process::id()));
        std::fs::write(&path, artifact.to_bytes()).unwrap();
        let c_path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: a valid C string; the model is freed once.
        unsafe {
            let m = kiln_model_load(c_path.as_ptr());
            assert!(!m.is_null());
            assert_eq!(kiln_model_verify(m), code);
            kiln_model_free(m);
            assert_eq!(kiln_model_verify(std::ptr::null()), KILN_ERROR_ARGUMENT);
        }
        std::fs::remove_file(&path).unwrap();
    }
}
