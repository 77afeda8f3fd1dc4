//! The C ABI, called from Rust as C would call it.

mod common;

use std::ffi::{c_void, CStr, CString};
use std::ptr;

use kiln_runtime::capi::*;

fn last_error() -> String {
    let e = kiln_last_error();
    assert!(!e.is_null());
    // SAFETY: a NUL-terminated string owned by the runtime.
    unsafe { CStr::from_ptr(e) }.to_str().unwrap().to_owned()
}

fn write_temp(name: &str, bytes: &[u8]) -> CString {
    let path = std::env::temp_dir().join(format!("kiln-capi-{}-{name}.kiln", std::process::id()));
    std::fs::write(&path, bytes).unwrap();
    CString::new(path.to_str().unwrap()).unwrap()
}

#[test]
fn load_failure_sets_error() {
    let path = CString::new("/nonexistent/x.kiln").unwrap();
    // SAFETY: valid C string.
    let m = unsafe { kiln_model_load(path.as_ptr()) };
    assert!(m.is_null());
    assert!(
        last_error().starts_with("cannot read '/nonexistent/x.kiln': "),
        "{}",
        last_error()
    );
    // SAFETY: NULL is allowed everywhere.
    unsafe {
        assert!(kiln_model_load(ptr::null()).is_null());
        assert_eq!(kiln_model_num_inputs(ptr::null()), 0);
        assert_eq!(kiln_model_input_rank(ptr::null(), 0), -1);
        assert_eq!(
            kiln_model_run(ptr::null_mut(), ptr::null(), ptr::null()),
            KILN_ERROR_ARGUMENT
        );
        kiln_model_free(ptr::null_mut());
    }
}

#[test]
fn bad_artifact_message() {
    let mut bytes = common::copy_model().to_bytes();
    bytes[0] = 0;
    let path = write_temp("bad", &bytes);
    // SAFETY: valid C string.
    let m = unsafe { kiln_model_load(path.as_ptr()) };
    std::fs::remove_file(path.to_str().unwrap()).unwrap();
    assert!(m.is_null());
    assert!(last_error()
        .ends_with(": not a Kiln artifact (the file does not start with \"KILNART\\0\")"));
}

#[cfg(target_arch = "x86_64")]
#[test]
fn load_describe_run() {
    let path = write_temp("copy", &common::copy_model().to_bytes());
    // SAFETY: every pointer below is valid for the calls' contracts.
    unsafe {
        let m = kiln_model_load(path.as_ptr());
        std::fs::remove_file(path.to_str().unwrap()).unwrap();
        assert!(!m.is_null());
        assert_eq!(kiln_model_num_inputs(m), 1);
        assert_eq!(kiln_model_num_outputs(m), 1);
        assert_eq!(
            CStr::from_ptr(kiln_model_input_name(m, 0)).to_str(),
            Ok("x")
        );
        assert_eq!(
            CStr::from_ptr(kiln_model_output_name(m, 0)).to_str(),
            Ok("y")
        );
        assert_eq!(kiln_model_input_dtype(m, 0), 1);
        assert_eq!(kiln_model_output_rank(m, 0), 1);
        let mut dims = [0u64; 1];
        assert_eq!(kiln_model_output_dims(m, 0, dims.as_mut_ptr()), 0);
        assert_eq!(dims, [2]);
        assert_eq!(kiln_model_input_byte_size(m, 0), 8);
        assert!(kiln_model_input_name(m, 1).is_null());
        assert_eq!(last_error(), "input index 1 out of range (the model has 1)");

        let x = [1.25f32, -3.0];
        let mut y = [0f32; 2];
        let inputs = [x.as_ptr().cast::<c_void>()];
        let outputs = [y.as_mut_ptr().cast::<c_void>()];
        assert_eq!(
            kiln_model_run(m, inputs.as_ptr(), outputs.as_ptr()),
            KILN_OK
        );
        assert_eq!(y, x);

        let null_out = [ptr::null_mut::<c_void>()];
        let rc = kiln_model_run(m, inputs.as_ptr(), null_out.as_ptr());
        assert_eq!(rc, KILN_ERROR_ARGUMENT);
        assert_eq!(last_error(), "kiln_model_run: output 0 ('y') is NULL");
        kiln_model_free(m);
    }
}

/// The copy model with a second profile: `x, y: f32[1]` at the same arena
/// offsets (the copy kernel moves 8 bytes; the profile reads back 4).
fn two_profile_copy_model() -> kiln_runtime::format::Artifact {
    let mut a = common::copy_model();
    let mut p = a.profiles[0].clone();
    p.inputs[0].shape = vec![1];
    p.outputs[0].shape = vec![1];
    a.profiles.push(p);
    a
}

#[cfg(target_arch = "x86_64")]
#[test]
fn shaped_runs_pick_the_profile_and_return_the_dims() {
    let path = write_temp("profiles", &two_profile_copy_model().to_bytes());
    // SAFETY: every pointer below is valid for the calls' contracts.
    unsafe {
        let m = kiln_model_load(path.as_ptr());
        std::fs::remove_file(path.to_str().unwrap()).unwrap();
        assert!(!m.is_null(), "{}", last_error());
        assert_eq!(kiln_model_num_profiles(m), 2);
        let mut dims = [0u64; 1];
        assert_eq!(kiln_model_profile_input_dims(m, 1, 0, dims.as_mut_ptr()), 0);
        assert_eq!(dims, [1]);
        assert_eq!(
            kiln_model_profile_input_dims(m, 2, 0, dims.as_mut_ptr()),
            -1
        );
        assert_eq!(kiln_model_output_max_byte_size(m, 0), 8);

        let x = [1.25f32, -3.0];
        let mut y = [0f32; 2];
        let inputs = [x.as_ptr().cast::<c_void>()];
        let outputs = [y.as_mut_ptr().cast::<c_void>()];
        let capacity = [8usize];
        let mut out_dims = [0u64; 1];
        let out_dims_ptrs = [out_dims.as_mut_ptr()];
        for (shape, want) in [([1u64], [1.25f32, 0.0]), ([2], [1.25, -3.0])] {
            y = [0.0; 2];
            let in_dims = [shape.as_ptr()];
            let s = kiln_session_new(m);
            let rc = kiln_session_run_shaped(
                s,
                in_dims.as_ptr(),
                inputs.as_ptr(),
                outputs.as_ptr(),
                capacity.as_ptr(),
                out_dims_ptrs.as_ptr(),
            );
            kiln_session_free(s);
            assert_eq!(rc, KILN_OK, "{}", last_error());
            assert_eq!(out_dims, shape);
            assert_eq!(y, want);
        }
        // A shape no profile has; a buffer too small for the profile.
        let three = [3u64];
        let rc = kiln_model_run_shaped(
            m,
            [three.as_ptr()].as_ptr(),
            inputs.as_ptr(),
            outputs.as_ptr(),
            capacity.as_ptr(),
            ptr::null(),
        );
        assert_eq!(rc, KILN_ERROR_ARGUMENT);
        let e = last_error();
        assert!(
            e.contains("x: f32[3]") && e.contains("[x: f32[2]], [x: f32[1]]"),
            "{e}"
        );
        let two = [2u64];
        let small = [4usize];
        let rc = kiln_model_run_shaped(
            m,
            [two.as_ptr()].as_ptr(),
            inputs.as_ptr(),
            outputs.as_ptr(),
            small.as_ptr(),
            ptr::null(),
        );
        assert_eq!(rc, KILN_ERROR_ARGUMENT);
        assert!(
            last_error().contains("its buffer holds 4"),
            "{}",
            last_error()
        );
        kiln_model_free(m);
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn shaped_runs_pad_a_paddable_dim_and_cut_the_outputs() {
    let mut a = common::copy_model();
    a.padding = vec![kiln_runtime::format::PaddableDim {
        name: "n".into(),
        inputs: vec![Some(0)],
        outputs: vec![Some(0)],
    }];
    let path = write_temp("padded", &a.to_bytes());
    // SAFETY: every pointer below is valid for the calls' contracts.
    unsafe {
        let m = kiln_model_load(path.as_ptr());
        std::fs::remove_file(path.to_str().unwrap()).unwrap();
        assert!(!m.is_null(), "{}", last_error());
        let x = [7.5f32];
        let mut y = [0f32; 2];
        let one = [1u64];
        let (capacity, mut dims) = ([4usize], [0u64]);
        let rc = kiln_model_run_shaped(
            m,
            [one.as_ptr()].as_ptr(),
            [x.as_ptr().cast::<c_void>()].as_ptr(),
            [y.as_mut_ptr().cast::<c_void>()].as_ptr(),
            capacity.as_ptr(),
            [dims.as_mut_ptr()].as_ptr(),
        );
        assert_eq!(rc, KILN_OK, "{}", last_error());
        assert_eq!((y, dims), ([7.5, 0.0], [1]));
        kiln_model_free(m);
    }
}

/// An output of data-dependent size (`docs/bounded.md`): the copy model
/// with `y` bounded along axis 0 and its length read from the arena where
/// `x` lives, so the input's bits say the length. A shaped run cuts `y`
/// and reports its dims; a plain run is refused naming the shaped entry
/// point; a length past the bound is an error, not a read past `y`.
#[cfg(target_arch = "x86_64")]
#[test]
fn shaped_runs_cut_bounded_outputs_to_the_run_length() {
    let mut a = common::copy_model();
    a.profiles[0].bounded = vec![kiln_runtime::format::BoundedOutput {
        output: 0,
        axis: 0,
        length_offset: 0,
    }];
    let model = kiln_runtime::Model::from_bytes(&a.to_bytes()).unwrap();
    let x = |length: u32| [f32::from_bits(length), 0.0];
    let input = |x: &[f32; 2]| kiln_runtime::Tensor {
        name: "x".into(),
        dtype: kiln_runtime::DType::F32,
        shape: vec![2],
        data: x.iter().flat_map(|v| v.to_le_bytes()).collect(),
    };
    let out = model.run(&[input(&x(1)).view()]).unwrap();
    assert_eq!((out[0].shape.clone(), out[0].data.len()), (vec![1], 4));
    let err = model.run(&[input(&x(3)).view()]).unwrap_err();
    assert!(
        err.to_string()
            .contains("is 3, outside its compiled bound of 0..=2"),
        "{err}"
    );
    let path = write_temp("bounded", &a.to_bytes());
    // SAFETY: every pointer below is valid for the calls' contracts.
    unsafe {
        let m = kiln_model_load(path.as_ptr());
        std::fs::remove_file(path.to_str().unwrap()).unwrap();
        assert!(!m.is_null(), "{}", last_error());
        let two = [2u64];
        for (length, rc_expected, dims_expected) in [
            (1, KILN_OK, 1),
            (0, KILN_OK, 0),
            (3, KILN_ERROR_ARGUMENT, 9),
        ] {
            let x = x(length);
            let mut y = [-1f32; 2];
            let (capacity, mut dims) = ([8usize], [9u64]);
            let rc = kiln_model_run_shaped(
                m,
                [two.as_ptr()].as_ptr(),
                [x.as_ptr().cast::<c_void>()].as_ptr(),
                [y.as_mut_ptr().cast::<c_void>()].as_ptr(),
                capacity.as_ptr(),
                [dims.as_mut_ptr()].as_ptr(),
            );
            assert_eq!(rc, rc_expected, "{}", last_error());
            assert_eq!(dims, [dims_expected]);
            if length == 1 {
                assert_eq!((y[0].to_bits(), y[1]), (1, -1.0));
            }
        }
        assert!(
            last_error().contains("outside its compiled bound"),
            "{}",
            last_error()
        );
        let x = x(1);
        let mut y = [0f32; 2];
        let rc = kiln_model_run(
            m,
            [x.as_ptr().cast::<c_void>()].as_ptr(),
            [y.as_mut_ptr().cast::<c_void>()].as_ptr(),
        );
        assert_eq!(rc, KILN_ERROR_ARGUMENT);
        assert!(
            last_error().contains("use kiln_model_run_shaped"),
            "{}",
            last_error()
        );
        kiln_model_free(m);
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn sessions_run_from_threads_and_outlive_the_model() {
    let path = write_temp("sessions", &common::copy_model().to_bytes());
    // SAFETY: every pointer below is valid for the calls' contracts; each
    // session is used by one thread, the model by all.
    unsafe {
        let m = kiln_model_load(path.as_ptr());
        std::fs::remove_file(path.to_str().unwrap()).unwrap();
        assert!(!m.is_null());
        struct Shared(*mut KilnModel);
        // SAFETY: a KilnModel may be used from many threads at once.
        unsafe impl Sync for Shared {}
        let shared = Shared(m);
        std::thread::scope(|s| {
            for t in 0..4 {
                let shared = &shared;
                s.spawn(move || {
                    let s = kiln_session_new(shared.0);
                    assert!(!s.is_null());
                    for i in 0..200 {
                        let x = [t as f32, i as f32];
                        let mut y = [0f32; 2];
                        let inputs = [x.as_ptr().cast::<c_void>()];
                        let outputs = [y.as_mut_ptr().cast::<c_void>()];
                        let rc = if i % 2 == 0 {
                            kiln_session_run(s, inputs.as_ptr(), outputs.as_ptr())
                        } else {
                            kiln_model_run(shared.0, inputs.as_ptr(), outputs.as_ptr())
                        };
                        assert_eq!(rc, KILN_OK);
                        assert_eq!(y, x);
                    }
                    kiln_session_free(s);
                });
            }
        });
        // A session keeps the model's code alive after the model is freed.
        let s = kiln_session_new(m);
        kiln_model_free(m);
        let x = [5f32, 6.0];
        let mut y = [0f32; 2];
        let inputs = [x.as_ptr().cast::<c_void>()];
        let outputs = [y.as_mut_ptr().cast::<c_void>()];
        assert_eq!(
            kiln_session_run(s, inputs.as_ptr(), outputs.as_ptr()),
            KILN_OK
        );
        assert_eq!(y, x);
        kiln_session_free(s);

        assert!(kiln_session_new(ptr::null()).is_null());
        assert_eq!(last_error(), "kiln_session_new: model is NULL");
        assert_eq!(
            kiln_session_run(ptr::null_mut(), ptr::null(), ptr::null()),
            KILN_ERROR_ARGUMENT
        );
        assert_eq!(last_error(), "kiln_session_run: session is NULL");
        kiln_session_free(ptr::null_mut());
    }
}

#[cfg(feature = "signing")]
#[test]
fn load_verified_refuses_unsigned_and_bad_keys() {
    let path = write_temp("unsigned", &common::copy_model().to_bytes());
    // A valid Ed25519 public key (RFC 8410's example).
    let pem = CString::new(
        "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=\n-----END PUBLIC KEY-----\n",
    )
    .unwrap();
    let garbage = CString::new("not a key").unwrap();
    // SAFETY: valid C strings.
    unsafe {
        let m = kiln_model_load_verified(path.as_ptr(), pem.as_ptr());
        assert!(m.is_null());
        assert!(last_error().contains("is not signed"), "{}", last_error());
        let m = kiln_model_load_verified(path.as_ptr(), garbage.as_ptr());
        assert!(m.is_null());
        assert!(
            last_error().starts_with("kiln_model_load_verified: invalid public key"),
            "{}",
            last_error()
        );
        assert!(kiln_model_load_verified(path.as_ptr(), ptr::null()).is_null());
        assert_eq!(last_error(), "kiln_model_load_verified: public key is NULL");
    }
    std::fs::remove_file(path.to_str().unwrap()).unwrap();
}

/// `kiln.h` defines a `KILN_DTYPE_*` code for every dtype the format has,
/// with the format's number.
#[test]
fn the_header_names_every_dtype_code() {
    let header = include_str!("../include/kiln.h");
    for d in kiln_runtime::DType::ALL {
        let line = format!(
            "#define KILN_DTYPE_{} {}\n",
            d.name().to_uppercase(),
            d as u8
        );
        assert!(header.contains(&line), "kiln.h lacks {line:?}");
    }
}
