//! The C ABI declared in `include/kiln.h`.
//!
//! Every function catches panics (none are expected) so that no unwinding
//! crosses the FFI boundary, and reports failures through
//! [`kiln_last_error`], a thread-local message.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::format::TensorSpec;
use crate::{Error, Model};

/// `kiln_model_run` result: success.
pub const KILN_OK: c_int = 0;
/// `kiln_model_run` result: a null pointer or otherwise invalid argument.
pub const KILN_ERROR_ARGUMENT: c_int = 1;
/// `kiln_model_run` result: a kernel reported an error.
pub const KILN_ERROR_KERNEL: c_int = 2;
/// Result of any function that caught an internal panic.
pub const KILN_ERROR_INTERNAL: c_int = 3;

/// A loaded model, opaque to C.
pub struct KilnModel {
    model: Model,
    input_names: Vec<CString>,
    output_names: Vec<CString>,
}

thread_local! {
    static LAST_ERROR: RefCell<Option<CString>> = const { RefCell::new(None) };
}

fn set_error(message: String) {
    let message = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = Some(message));
}

/// Runs `f`, turning a panic into `on_panic` and an error message.
fn guard<T>(on_panic: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        set_error("internal error: the Kiln runtime panicked".into());
        on_panic
    })
}

fn c_names(path: &str, specs: &[TensorSpec]) -> Result<Vec<CString>, String> {
    (specs.iter())
        .map(|s| {
            CString::new(s.name.as_str()).map_err(|_| {
                format!(
                    "cannot load '{path}': tensor name '{}' contains a NUL byte",
                    s.name
                )
            })
        })
        .collect()
}

/// Loads the artifact at `path`; returns NULL on failure (see
/// [`kiln_last_error`]).
///
/// # Safety
/// `path` must be NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn kiln_model_load(path: *const c_char) -> *mut KilnModel {
    guard(std::ptr::null_mut(), || {
        if path.is_null() {
            set_error("kiln_model_load: path is NULL".into());
            return std::ptr::null_mut();
        }
        // SAFETY: non-null and NUL-terminated per the contract.
        let path = unsafe { CStr::from_ptr(path) };
        let Ok(path) = path.to_str() else {
            set_error("kiln_model_load: path is not valid UTF-8".into());
            return std::ptr::null_mut();
        };
        let loaded = Model::load(path)
            .map_err(|e| match e {
                // Already names the file.
                Error::Io { .. } => e.to_string(),
                _ => format!("cannot load '{path}': {e}"),
            })
            .and_then(|model| {
                Ok(KilnModel {
                    input_names: c_names(path, model.inputs())?,
                    output_names: c_names(path, model.outputs())?,
                    model,
                })
            });
        match loaded {
            Ok(m) => Box::into_raw(Box::new(m)),
            Err(message) => {
                set_error(message);
                std::ptr::null_mut()
            }
        }
    })
}

/// The message of the most recent failure on this thread, or NULL if none.
/// Valid until the next failing call on this thread.
#[no_mangle]
pub extern "C" fn kiln_last_error() -> *const c_char {
    guard(std::ptr::null(), || {
        LAST_ERROR.with(|e| e.borrow().as_ref().map_or(std::ptr::null(), |s| s.as_ptr()))
    })
}

/// Frees a model from [`kiln_model_load`]; NULL is ignored.
///
/// # Safety
/// `m` must be NULL or a pointer from `kiln_model_load` not yet freed.
#[no_mangle]
pub unsafe extern "C" fn kiln_model_free(m: *mut KilnModel) {
    guard((), || {
        if !m.is_null() {
            // SAFETY: from Box::into_raw in kiln_model_load, freed once.
            drop(unsafe { Box::from_raw(m) });
        }
    })
}

/// Inputs or outputs.
#[derive(Clone, Copy)]
enum Side {
    Input,
    Output,
}

/// The spec and C name of input/output `i`, or an error message.
///
/// # Safety
/// `m` must be NULL or a live model.
unsafe fn spec<'a>(
    m: *const KilnModel,
    side: Side,
    i: usize,
) -> Option<(&'a TensorSpec, &'a CString)> {
    // SAFETY: per the contract.
    let Some(m) = (unsafe { m.as_ref() }) else {
        set_error("model is NULL".into());
        return None;
    };
    let (specs, names, what) = match side {
        Side::Input => (m.model.inputs(), &m.input_names, "input"),
        Side::Output => (m.model.outputs(), &m.output_names, "output"),
    };
    let found = specs.get(i).zip(names.get(i));
    if found.is_none() {
        set_error(format!(
            "{what} index {i} out of range (the model has {})",
            specs.len()
        ));
    }
    found
}

/// # Safety
/// `m` must be NULL or a live model.
unsafe fn count(m: *const KilnModel, side: Side) -> usize {
    // SAFETY: per the contract.
    guard(0, || match (unsafe { m.as_ref() }, side) {
        (None, _) => 0,
        (Some(m), Side::Input) => m.model.inputs().len(),
        (Some(m), Side::Output) => m.model.outputs().len(),
    })
}

/// # Safety
/// `m` must be NULL or a live model.
unsafe fn name(m: *const KilnModel, side: Side, i: usize) -> *const c_char {
    // SAFETY: per the contract.
    guard(std::ptr::null(), || {
        unsafe { spec(m, side, i) }.map_or(std::ptr::null(), |(_, n)| n.as_ptr())
    })
}

/// # Safety
/// `m` must be NULL or a live model.
unsafe fn dtype(m: *const KilnModel, side: Side, i: usize) -> c_int {
    // SAFETY: per the contract.
    guard(0, || {
        unsafe { spec(m, side, i) }.map_or(0, |(s, _)| c_int::from(s.dtype as u8))
    })
}

/// # Safety
/// `m` must be NULL or a live model.
unsafe fn rank(m: *const KilnModel, side: Side, i: usize) -> i64 {
    // SAFETY: per the contract.
    guard(-1, || {
        unsafe { spec(m, side, i) }.map_or(-1, |(s, _)| s.shape.len() as i64)
    })
}

/// # Safety
/// `m` must be NULL or a live model; `out` NULL or room for `rank` values.
unsafe fn dims(m: *const KilnModel, side: Side, i: usize, out: *mut u64) -> c_int {
    guard(-1, || {
        // SAFETY: per the contract.
        let Some((s, _)) = (unsafe { spec(m, side, i) }) else {
            return -1;
        };
        if out.is_null() && !s.shape.is_empty() {
            set_error("dims output pointer is NULL".into());
            return -1;
        }
        for (k, &d) in s.shape.iter().enumerate() {
            // SAFETY: the caller provides room for `rank` values.
            unsafe { out.add(k).write(d) };
        }
        0
    })
}

/// # Safety
/// `m` must be NULL or a live model.
unsafe fn byte_size(m: *const KilnModel, side: Side, i: usize) -> i64 {
    // SAFETY: per the contract.
    guard(-1, || {
        unsafe { spec(m, side, i) }.map_or(-1, |(s, _)| s.byte_len() as i64)
    })
}

macro_rules! accessors {
    ($side:expr, $what:literal, $num:ident, $name:ident, $dtype:ident, $rank:ident, $dims:ident, $size:ident) => {
        #[doc = concat!("Number of ", $what, "s; 0 if `m` is NULL.")]
        ///
        /// # Safety
        /// `m` must be NULL or a live model.
        #[no_mangle]
        pub unsafe extern "C" fn $num(m: *const KilnModel) -> usize {
            // SAFETY: same contract.
            unsafe { count(m, $side) }
        }

        #[doc = concat!("Name of ", $what, " `i` (valid while the model lives), or NULL.")]
        ///
        /// # Safety
        /// `m` must be NULL or a live model.
        #[no_mangle]
        pub unsafe extern "C" fn $name(m: *const KilnModel, i: usize) -> *const c_char {
            // SAFETY: same contract.
            unsafe { name(m, $side, i) }
        }

        #[doc = concat!("Dtype code (`KILN_DTYPE_*`) of ", $what, " `i`, or 0 on error.")]
        ///
        /// # Safety
        /// `m` must be NULL or a live model.
        #[no_mangle]
        pub unsafe extern "C" fn $dtype(m: *const KilnModel, i: usize) -> c_int {
            // SAFETY: same contract.
            unsafe { dtype(m, $side, i) }
        }

        #[doc = concat!("Rank of ", $what, " `i`, or -1 on error.")]
        ///
        /// # Safety
        /// `m` must be NULL or a live model.
        #[no_mangle]
        pub unsafe extern "C" fn $rank(m: *const KilnModel, i: usize) -> i64 {
            // SAFETY: same contract.
            unsafe { rank(m, $side, i) }
        }

        #[doc = concat!("Writes the dims of ", $what, " `i` to `out`; 0 on success, -1 on error.")]
        ///
        /// # Safety
        /// `m` must be NULL or a live model; `out` must have room for the rank.
        #[no_mangle]
        pub unsafe extern "C" fn $dims(m: *const KilnModel, i: usize, out: *mut u64) -> c_int {
            // SAFETY: same contract.
            unsafe { dims(m, $side, i, out) }
        }

        #[doc = concat!("Size in bytes of ", $what, " `i`, or -1 on error.")]
        ///
        /// # Safety
        /// `m` must be NULL or a live model.
        #[no_mangle]
        pub unsafe extern "C" fn $size(m: *const KilnModel, i: usize) -> i64 {
            // SAFETY: same contract.
            unsafe { byte_size(m, $side, i) }
        }
    };
}

accessors!(
    Side::Input,
    "input",
    kiln_model_num_inputs,
    kiln_model_input_name,
    kiln_model_input_dtype,
    kiln_model_input_rank,
    kiln_model_input_dims,
    kiln_model_input_byte_size
);
accessors!(
    Side::Output,
    "output",
    kiln_model_num_outputs,
    kiln_model_output_name,
    kiln_model_output_dtype,
    kiln_model_output_rank,
    kiln_model_output_dims,
    kiln_model_output_byte_size
);

/// Runs one inference. `inputs[i]` points to the bytes of input `i` and
/// `outputs[i]` to a buffer for output `i`, in declared order, each of the
/// declared byte size. Returns `KILN_OK` or an error code (see
/// [`kiln_last_error`]).
///
/// # Safety
/// `m` must be NULL or a live model; `inputs` and `outputs` NULL or arrays
/// of `num_inputs` / `num_outputs` pointers to buffers of the declared
/// sizes, the output buffers not overlapping anything else.
#[no_mangle]
pub unsafe extern "C" fn kiln_model_run(
    m: *mut KilnModel,
    inputs: *const *const c_void,
    outputs: *const *mut c_void,
) -> c_int {
    guard(KILN_ERROR_INTERNAL, || {
        // SAFETY: per the contract.
        match unsafe { run(m, inputs, outputs) } {
            Ok(()) => KILN_OK,
            Err((code, message)) => {
                set_error(message);
                code
            }
        }
    })
}

/// # Safety
/// As [`kiln_model_run`].
unsafe fn run(
    m: *mut KilnModel,
    inputs: *const *const c_void,
    outputs: *const *mut c_void,
) -> Result<(), (c_int, String)> {
    let arg = |msg: &str| (KILN_ERROR_ARGUMENT, format!("kiln_model_run: {msg}"));
    // SAFETY: per the contract.
    let Some(m) = (unsafe { m.as_mut() }) else {
        return Err(arg("model is NULL"));
    };
    let model = &mut m.model;
    let (n_in, n_out) = (model.inputs().len(), model.outputs().len());
    if (inputs.is_null() && n_in > 0) || (outputs.is_null() && n_out > 0) {
        return Err(arg("inputs or outputs array is NULL"));
    }
    for i in 0..n_out {
        // SAFETY: `outputs` holds `n_out` pointers.
        if unsafe { *outputs.add(i) }.is_null() && model.outputs()[i].byte_len() > 0 {
            return Err(arg(&format!(
                "output {i} ('{}') is NULL",
                model.outputs()[i].name
            )));
        }
    }
    for i in 0..n_in {
        let len = model.inputs()[i].byte_len() as usize;
        // SAFETY: `inputs` holds `n_in` pointers.
        let ptr = unsafe { *inputs.add(i) }.cast::<u8>();
        if ptr.is_null() && len > 0 {
            return Err(arg(&format!(
                "input {i} ('{}') is NULL",
                model.inputs()[i].name
            )));
        }
        if len > 0 {
            // SAFETY: the caller provides `len` readable bytes.
            let data = unsafe { std::slice::from_raw_parts(ptr, len) };
            model.input_slot(i).copy_from_slice(data);
        }
    }
    model.execute().map_err(|e| match e {
        Error::Kernel { .. } => (KILN_ERROR_KERNEL, e.to_string()),
        _ => (KILN_ERROR_INTERNAL, e.to_string()),
    })?;
    for i in 0..n_out {
        let bytes = model.output_bytes(i);
        // SAFETY: `outputs` holds `n_out` pointers.
        let ptr = unsafe { *outputs.add(i) }.cast::<u8>();
        if !bytes.is_empty() {
            // SAFETY: non-null (checked above); the caller provides
            // `bytes.len()` writable bytes that do not overlap the arena.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr, bytes.len()) };
        }
    }
    Ok(())
}
