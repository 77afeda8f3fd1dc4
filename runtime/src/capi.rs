//! The C ABI declared in `include/kiln.h`.
//!
//! Every function catches panics (none are expected) so that no unwinding
//! crosses the FFI boundary, and reports failures through
//! [`kiln_last_error`], a thread-local message.
//!
//! A `KilnModel` is immutable once loaded and may be used from many threads
//! at once; a `KilnSession` holds one arena and is used by one thread at a
//! time (see `include/kiln.h`).

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::format::TensorSpec;
use crate::memory::AlignedBuf;
use crate::model::{Pick, Program};
use crate::pool::Pool;
use crate::{Error, Model, Session};

/// `kiln_model_run` result: success.
pub const KILN_OK: c_int = 0;
/// `kiln_model_run` result: a null pointer or otherwise invalid argument.
pub const KILN_ERROR_ARGUMENT: c_int = 1;
/// `kiln_model_run` result: a kernel reported an error.
pub const KILN_ERROR_KERNEL: c_int = 2;
/// Result of any function that caught an internal panic.
pub const KILN_ERROR_INTERNAL: c_int = 3;
/// `kiln_model_run` result: a temporary arena could not be allocated.
pub const KILN_ERROR_OUT_OF_MEMORY: c_int = 4;
/// `kiln_model_verify` result: an output of a golden set is beyond its
/// tolerance on this machine.
pub const KILN_VERIFY_FAILED: c_int = 5;

/// A loaded model, opaque to C.
pub struct KilnModel {
    model: Model,
    input_names: Vec<CString>,
    output_names: Vec<CString>,
}

/// A session (one arena) of a loaded model, opaque to C.
pub struct KilnSession {
    session: Session,
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
    // SAFETY: per the contract.
    unsafe { load_with("kiln_model_load", path, |p| Model::load(p)) }
}

/// Loads the artifact at `path` only if its detached signature (`path` +
/// `.sig`) is a valid signature by the Ed25519 public key in
/// `public_key_pem` (PEM text, `-----BEGIN PUBLIC KEY-----`); returns NULL
/// on failure, including an unsigned, modified or foreign artifact (see
/// [`kiln_last_error`]).
///
/// # Safety
/// `path` and `public_key_pem` must be NULL or NUL-terminated strings.
#[cfg(feature = "signing")]
#[no_mangle]
pub unsafe extern "C" fn kiln_model_load_verified(
    path: *const c_char,
    public_key_pem: *const c_char,
) -> *mut KilnModel {
    const NAME: &str = "kiln_model_load_verified";
    guard(std::ptr::null_mut(), || {
        // SAFETY: per the contract.
        let Some(pem) = (unsafe { c_str(NAME, "public key", public_key_pem) }) else {
            return std::ptr::null_mut();
        };
        let key = match crate::PublicKey::from_pem(pem) {
            Ok(k) => k,
            Err(e) => {
                set_error(format!("{NAME}: {e}"));
                return std::ptr::null_mut();
            }
        };
        // SAFETY: per the contract.
        unsafe { load_with(NAME, path, |p| Model::load_verified(p, &key)) }
    })
}

/// The UTF-8 string at `s`, or `None` after recording why not.
///
/// # Safety
/// `s` must be NULL or NUL-terminated.
unsafe fn c_str<'a>(function: &str, what: &str, s: *const c_char) -> Option<&'a str> {
    if s.is_null() {
        set_error(format!("{function}: {what} is NULL"));
        return None;
    }
    // SAFETY: non-null and NUL-terminated per the contract.
    let s = unsafe { CStr::from_ptr(s) };
    let s = s.to_str().ok();
    if s.is_none() {
        set_error(format!("{function}: {what} is not valid UTF-8"));
    }
    s
}

/// Loads with `load` and wraps the model for C.
///
/// # Safety
/// `path` must be NULL or NUL-terminated.
unsafe fn load_with(
    function: &str,
    path: *const c_char,
    load: impl FnOnce(&str) -> Result<Model, Error>,
) -> *mut KilnModel {
    guard(std::ptr::null_mut(), || {
        // SAFETY: per the contract.
        let Some(path) = (unsafe { c_str(function, "path", path) }) else {
            return std::ptr::null_mut();
        };
        let loaded = load(path)
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
    guard(std::ptr::null(), || {
        // SAFETY: `m` is NULL or a live model, per this function's contract.
        unsafe { spec(m, side, i) }.map_or(std::ptr::null(), |(_, n)| n.as_ptr())
    })
}

/// # Safety
/// `m` must be NULL or a live model.
unsafe fn dtype(m: *const KilnModel, side: Side, i: usize) -> c_int {
    guard(0, || {
        // SAFETY: `m` is NULL or a live model, per this function's contract.
        unsafe { spec(m, side, i) }.map_or(0, |(s, _)| c_int::from(s.dtype as u8))
    })
}

/// # Safety
/// `m` must be NULL or a live model.
unsafe fn rank(m: *const KilnModel, side: Side, i: usize) -> i64 {
    guard(-1, || {
        // SAFETY: `m` is NULL or a live model, per this function's contract.
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
    guard(-1, || {
        // SAFETY: `m` is NULL or a live model, per this function's contract.
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
/// [`kiln_last_error`]). Safe to call from several threads at once on one
/// model: a call that finds the model's arena in use allocates a temporary
/// one (use a [`KilnSession`] per thread to never allocate).
///
/// # Safety
/// `m` must be NULL or a live model; `inputs` and `outputs` NULL or arrays
/// of `num_inputs` / `num_outputs` pointers to buffers of the declared
/// sizes, the output buffers not overlapping anything else.
#[no_mangle]
pub unsafe extern "C" fn kiln_model_run(
    m: *const KilnModel,
    inputs: *const *const c_void,
    outputs: *const *mut c_void,
) -> c_int {
    guard(KILN_ERROR_INTERNAL, || {
        // SAFETY: per the contract.
        let Some(m) = (unsafe { m.as_ref() }) else {
            return report(Err(arg_error("kiln_model_run", "model is NULL")));
        };
        let result = m
            .model
            // SAFETY: per the contract.
            .with_arena(|program, arena| unsafe {
                run(
                    "kiln_model_run",
                    program,
                    arena,
                    None,
                    inputs,
                    outputs,
                    None,
                )
            })
            .map_err(|e| (KILN_ERROR_OUT_OF_MEMORY, format!("kiln_model_run: {e}")))
            .and_then(|r| r);
        report(result)
    })
}

/// Runs one inference on inputs of any profile's shapes: `input_dims[i]`
/// points to the dims of input `i` (its rank's worth, see
/// `kiln_model_input_rank`), which together pick the profile;
/// `outputs[i]` is a buffer of `output_capacity[i]` bytes, enough for
/// output `i` in that profile (`kiln_model_output_max_byte_size` fits
/// every profile); the output's dims are written to `output_dims[i]`
/// (room for its rank) unless `output_dims` or that pointer is NULL.
/// Inputs of shapes no profile has: `KILN_ERROR_ARGUMENT`, the message
/// listing the profiles.
///
/// # Safety
/// `m` must be NULL or a live model; each array NULL or holding
/// `num_inputs` / `num_outputs` entries as described, the output buffers
/// not overlapping anything else.
#[no_mangle]
pub unsafe extern "C" fn kiln_model_run_shaped(
    m: *const KilnModel,
    input_dims: *const *const u64,
    inputs: *const *const c_void,
    outputs: *const *mut c_void,
    output_capacity: *const usize,
    output_dims: *const *mut u64,
) -> c_int {
    const FUNCTION: &str = "kiln_model_run_shaped";
    guard(KILN_ERROR_INTERNAL, || {
        // SAFETY: per the contract.
        let Some(m) = (unsafe { m.as_ref() }) else {
            return report(Err(arg_error(FUNCTION, "model is NULL")));
        };
        let shaped = Shaped {
            input_dims,
            output_capacity,
            output_dims,
        };
        let result = m
            .model
            // SAFETY: per the contract.
            .with_arena(|program, arena| unsafe {
                run(
                    FUNCTION,
                    program,
                    arena,
                    None,
                    inputs,
                    outputs,
                    Some(shaped),
                )
            })
            .map_err(|e| (KILN_ERROR_OUT_OF_MEMORY, format!("{FUNCTION}: {e}")))
            .and_then(|r| r);
        report(result)
    })
}

/// Number of profiles (specializations to input shapes) the model holds,
/// at least 1; 0 if `m` is NULL.
///
/// # Safety
/// `m` must be NULL or a live model.
#[no_mangle]
pub unsafe extern "C" fn kiln_model_num_profiles(m: *const KilnModel) -> usize {
    guard(0, || {
        // SAFETY: per the contract.
        unsafe { m.as_ref() }.map_or(0, |m| m.model.profiles().len())
    })
}

/// Writes the dims of input `i` in profile `p` to `out` (room for the
/// input's rank); 0 on success, -1 on a NULL model or a bad index.
///
/// # Safety
/// `m` must be NULL or a live model; `out` must have room for the rank.
#[no_mangle]
pub unsafe extern "C" fn kiln_model_profile_input_dims(
    m: *const KilnModel,
    p: usize,
    i: usize,
    out: *mut u64,
) -> c_int {
    guard(-1, || {
        // SAFETY: per the contract.
        let spec = unsafe { m.as_ref() }
            .and_then(|m| m.model.profiles().get(p))
            .and_then(|p| p.inputs.get(i));
        match spec {
            Some(spec) if spec.shape.is_empty() => 0,
            Some(spec) if !out.is_null() => {
                // SAFETY: the caller provides room for the rank.
                unsafe {
                    std::ptr::copy_nonoverlapping(spec.shape.as_ptr(), out, spec.shape.len())
                };
                0
            }
            _ => -1,
        }
    })
}

/// The largest size in bytes output `i` has in any profile (a buffer of
/// this size fits every run), or -1 on error.
///
/// # Safety
/// `m` must be NULL or a live model.
#[no_mangle]
pub unsafe extern "C" fn kiln_model_output_max_byte_size(m: *const KilnModel, i: usize) -> i64 {
    guard(-1, || {
        // SAFETY: per the contract.
        let Some(m) = (unsafe { m.as_ref() }) else {
            return -1;
        };
        // Condition programs (one bool) and refused paths (no outputs)
        // return nothing to a caller.
        (m.model.profiles().iter())
            .filter(|p| matches!(p.role, crate::format::Role::Model { .. }))
            .map(|p| p.outputs.get(i).map(|s| s.byte_len() as i64))
            .max()
            .flatten()
            .unwrap_or(-1)
    })
}

/// Creates a session of `m`: an arena of the model's size, allocated now.
/// Returns NULL on failure (see [`kiln_last_error`]). The session keeps the
/// model's code and weights alive, so it may outlive `m`.
///
/// # Safety
/// `m` must be NULL or a live model.
#[no_mangle]
pub unsafe extern "C" fn kiln_session_new(m: *const KilnModel) -> *mut KilnSession {
    // SAFETY: per the contract.
    unsafe { new_session("kiln_session_new", m, 1) }
}

/// Like [`kiln_session_new`], with `threads` threads (the caller and
/// `threads - 1` workers created now) for the steps the compiler split into
/// tasks; 0 and 1 mean one thread.
///
/// # Safety
/// `m` must be NULL or a live model.
#[no_mangle]
pub unsafe extern "C" fn kiln_session_new_threads(
    m: *const KilnModel,
    threads: usize,
) -> *mut KilnSession {
    // SAFETY: per the contract.
    unsafe { new_session("kiln_session_new_threads", m, threads) }
}

/// # Safety
/// `m` must be NULL or a live model.
unsafe fn new_session(function: &str, m: *const KilnModel, threads: usize) -> *mut KilnSession {
    guard(std::ptr::null_mut(), || {
        // SAFETY: per the contract.
        let Some(m) = (unsafe { m.as_ref() }) else {
            set_error(format!("{function}: model is NULL"));
            return std::ptr::null_mut();
        };
        match m.model.session_with_threads(threads) {
            Ok(session) => Box::into_raw(Box::new(KilnSession { session })),
            Err(e) => {
                set_error(format!("{function}: {e}"));
                std::ptr::null_mut()
            }
        }
    })
}

/// Frees a session from [`kiln_session_new`]; NULL is ignored.
///
/// # Safety
/// `s` must be NULL or a pointer from `kiln_session_new` not yet freed.
#[no_mangle]
pub unsafe extern "C" fn kiln_session_free(s: *mut KilnSession) {
    guard((), || {
        if !s.is_null() {
            // SAFETY: from Box::into_raw in kiln_session_new, freed once.
            drop(unsafe { Box::from_raw(s) });
        }
    })
}

/// Runs one inference in the session's arena, as [`kiln_model_run`] does,
/// without allocating. One session must not be used by two threads at once.
///
/// # Safety
/// `s` must be NULL or a live session not in use by another thread;
/// `inputs` and `outputs` as for [`kiln_model_run`].
#[no_mangle]
pub unsafe extern "C" fn kiln_session_run(
    s: *mut KilnSession,
    inputs: *const *const c_void,
    outputs: *const *mut c_void,
) -> c_int {
    guard(KILN_ERROR_INTERNAL, || {
        // SAFETY: per the contract.
        let Some(s) = (unsafe { s.as_mut() }) else {
            return report(Err(arg_error("kiln_session_run", "session is NULL")));
        };
        let (program, arena, pool) = s.session.parts();
        // SAFETY: per the contract.
        report(unsafe {
            run(
                "kiln_session_run",
                program,
                arena,
                pool,
                inputs,
                outputs,
                None,
            )
        })
    })
}

/// Runs one inference in the session's arena, as
/// [`kiln_model_run_shaped`] does, without allocating.
///
/// # Safety
/// `s` must be NULL or a live session not in use by another thread; the
/// arrays as for [`kiln_model_run_shaped`].
#[no_mangle]
pub unsafe extern "C" fn kiln_session_run_shaped(
    s: *mut KilnSession,
    input_dims: *const *const u64,
    inputs: *const *const c_void,
    outputs: *const *mut c_void,
    output_capacity: *const usize,
    output_dims: *const *mut u64,
) -> c_int {
    const FUNCTION: &str = "kiln_session_run_shaped";
    guard(KILN_ERROR_INTERNAL, || {
        // SAFETY: per the contract.
        let Some(s) = (unsafe { s.as_mut() }) else {
            return report(Err(arg_error(FUNCTION, "session is NULL")));
        };
        let shaped = Shaped {
            input_dims,
            output_capacity,
            output_dims,
        };
        let (program, arena, pool) = s.session.parts();
        // SAFETY: per the contract.
        report(unsafe {
            run(
                FUNCTION,
                program,
                arena,
                pool,
                inputs,
                outputs,
                Some(shaped),
            )
        })
    })
}

/// Runs the artifact's golden self-test (`kiln compile --golden`) on this
/// machine. Returns `KILN_OK` when every output of every set is within its
/// tolerance, `KILN_VERIFY_FAILED` when one is not ([`kiln_last_error`]
/// names the outputs), `KILN_ERROR_ARGUMENT` for a NULL model or an
/// artifact without a self-test, or the code of a run's error.
///
/// # Safety
/// `m` must be NULL or a live model.
#[no_mangle]
pub unsafe extern "C" fn kiln_model_verify(m: *const KilnModel) -> c_int {
    guard(KILN_ERROR_INTERNAL, || {
        // SAFETY: per the contract.
        let Some(m) = (unsafe { m.as_ref() }) else {
            return report(Err(arg_error("kiln_model_verify", "model is NULL")));
        };
        let result = match m.model.verify() {
            Ok(r) if r.passed() => Ok(()),
            Ok(r) => {
                let failed: Vec<String> = (r.failures())
                    .map(|c| {
                        format!(
                            "'{}' (set {}: {:.3e} of its scale, tolerance {:.1e})",
                            c.comparison.name, c.set, c.comparison.rel_error, c.tolerance
                        )
                    })
                    .collect();
                let message = format!(
                    "kiln_model_verify: golden outputs beyond tolerance: {}",
                    failed.join(", ")
                );
                Err((KILN_VERIFY_FAILED, message))
            }
            Err(e @ Error::NoGolden) => Err(arg_error("kiln_model_verify", &e.to_string())),
            Err(e @ Error::Kernel { .. }) => {
                Err((KILN_ERROR_KERNEL, format!("kiln_model_verify: {e}")))
            }
            Err(e) => Err((KILN_ERROR_ARGUMENT, format!("kiln_model_verify: {e}"))),
        };
        report(result)
    })
}

fn arg_error(function: &str, message: &str) -> (c_int, String) {
    (KILN_ERROR_ARGUMENT, format!("{function}: {message}"))
}

/// The C error of a failed run: a kernel's or the run's input's own
/// (an input that takes a path the artifact has no code for), else
/// internal.
fn run_error(function: &str, e: Error) -> (c_int, String) {
    match e {
        Error::Kernel { .. } => (KILN_ERROR_KERNEL, e.to_string()),
        Error::VariantRefused { .. } | Error::NoVariant { .. } | Error::LengthOutOfBound { .. } => {
            arg_error(function, &e.to_string())
        }
        _ => (KILN_ERROR_INTERNAL, e.to_string()),
    }
}

/// `KILN_OK`, or the error's code after recording its message.
fn report(result: Result<(), (c_int, String)>) -> c_int {
    match result {
        Ok(()) => KILN_OK,
        Err((code, message)) => {
            set_error(message);
            code
        }
    }
}

/// The shapes of a run through `kiln_*_run_shaped`: per input, a pointer
/// to its dims (its rank's worth); per output, the byte capacity of its
/// buffer and where to write its dims (NULL: not wanted).
#[derive(Clone, Copy)]
struct Shaped {
    input_dims: *const *const u64,
    output_capacity: *const usize,
    output_dims: *const *mut u64,
}

/// The profile a shaped run's input dims pick (profile 0 for a plain run).
///
/// # Safety
/// `shaped` as documented for [`kiln_model_run_shaped`].
unsafe fn select_profile(
    function: &str,
    program: &Program,
    shaped: Option<Shaped>,
) -> Result<Pick, (c_int, String)> {
    let Some(shaped) = shaped else {
        return Ok(Pick::exact(0));
    };
    let specs = program.inputs();
    if shaped.input_dims.is_null() && !specs.is_empty() {
        return Err(arg_error(function, "input_dims is NULL"));
    }
    let mut given: Vec<&[u64]> = Vec::with_capacity(specs.len());
    for (i, spec) in specs.iter().enumerate() {
        let rank = spec.shape.len();
        // SAFETY: `input_dims` holds `num_inputs` pointers.
        let dims = unsafe { *shaped.input_dims.add(i) };
        if dims.is_null() && rank > 0 {
            return Err(arg_error(
                function,
                &format!("input_dims[{i}] ('{}') is NULL", spec.name),
            ));
        }
        given.push(match rank {
            0 => &[],
            // SAFETY: the caller provides `rank` dims for input `i`.
            _ => unsafe { std::slice::from_raw_parts(dims, rank) },
        });
    }
    let shapes = || (specs.iter().zip(&given).enumerate()).map(|(i, (s, d))| (i, s.dtype, *d));
    program.pick(shapes).ok_or_else(|| {
        let described: Vec<String> = (specs.iter().zip(&given))
            .map(|(s, d)| format!("{}: {}", s.name, crate::format::type_string(s.dtype, d)))
            .collect();
        arg_error(
            function,
            &program.no_profile(described.join(", ")).to_string(),
        )
    })
}

/// One inference of `program` over `arena`, with C buffers; `function`
/// names the C entry point in error messages. A plain run (`shaped` None)
/// runs the first profile with buffers of its exact sizes.
///
/// # Safety
/// `inputs` and `outputs` as for [`kiln_model_run`]; `shaped` as for
/// [`kiln_model_run_shaped`].
unsafe fn run(
    function: &str,
    program: &Program,
    arena: &mut AlignedBuf,
    pool: Option<&Pool>,
    inputs: *const *const c_void,
    outputs: *const *mut c_void,
    shaped: Option<Shaped>,
) -> Result<(), (c_int, String)> {
    let arg = |msg: &str| arg_error(function, msg);
    // SAFETY: per the contract.
    let pick = unsafe { select_profile(function, program, shaped) }?;
    let (n_in, n_out) = (program.inputs().len(), program.outputs().len());
    if (inputs.is_null() && n_in > 0) || (outputs.is_null() && n_out > 0) {
        return Err(arg("inputs or outputs array is NULL"));
    }
    let byte_len = |dtype: crate::DType, shape: &[u64]| {
        shape.iter().product::<u64>() as usize * dtype.size_bytes()
    };
    let mut data: Vec<&[u8]> = Vec::with_capacity(n_in);
    for (i, spec) in program.inputs_of(pick.profile).iter().enumerate() {
        let len = byte_len(spec.dtype, &program.input_shape(&pick, i));
        // SAFETY: `inputs` holds `n_in` pointers.
        let ptr = unsafe { *inputs.add(i) }.cast::<u8>();
        if ptr.is_null() && len > 0 {
            return Err(arg(&format!("input {i} ('{}') is NULL", spec.name)));
        }
        data.push(match len {
            0 => &[][..],
            // SAFETY: the caller provides `len` readable bytes.
            _ => unsafe { std::slice::from_raw_parts(ptr, len) },
        });
    }
    // A model whose control flow branches at run time picks its variant
    // by running condition programs on these inputs.
    let mut write_inputs = |pick: &Pick, arena: &mut AlignedBuf| {
        for (i, bytes) in data.iter().enumerate() {
            program.write_input(pick, arena, i, bytes);
        }
        Ok::<(), Error>(())
    };
    let pick = program
        .resolve(pick, arena, pool, &mut write_inputs)
        .map_err(|e| run_error(function, e))?;
    let mut pick = pick;
    if shaped.is_none() && program.has_bounded_outputs(pick.profile) {
        return Err(arg(
            "the model has outputs whose size depends on the data: use kiln_model_run_shaped, which reports each output's dims",
        ));
    }
    let out_specs = program.outputs_of(pick.profile);
    let out_lens: Vec<usize> = (out_specs.iter().enumerate())
        .map(|(i, s)| byte_len(s.dtype, &program.output_shape(&pick, i)))
        .collect();
    if shaped.is_none() && pick.profile != 0 {
        // A plain run's buffers have profile 0's sizes: a variant of other
        // output shapes needs the shaped entry point.
        for (i, spec) in out_specs.iter().enumerate() {
            if out_lens[i] as u64 != program.outputs()[i].byte_len() {
                return Err(arg(&format!(
                    "output {i} ('{}') is {} in this run, not its declared {}: use kiln_model_run_shaped",
                    spec.name,
                    crate::format::type_string(spec.dtype, &program.output_shape(&pick, i)),
                    program.outputs()[i].type_string()
                )));
            }
        }
    }
    if let Some(shaped) = shaped {
        if shaped.output_capacity.is_null() && n_out > 0 {
            return Err(arg("output_capacity is NULL"));
        }
        for (i, spec) in out_specs.iter().enumerate() {
            // SAFETY: `output_capacity` holds `n_out` sizes.
            let capacity = unsafe { *shaped.output_capacity.add(i) };
            if capacity < out_lens[i] {
                return Err(arg(&format!(
                    "output {i} ('{}') is {} in this run: {} bytes, but its buffer holds {capacity}",
                    spec.name,
                    crate::format::type_string(spec.dtype, &program.output_shape(&pick, i)),
                    out_lens[i]
                )));
            }
        }
    }
    for (i, spec) in out_specs.iter().enumerate() {
        // SAFETY: `outputs` holds `n_out` pointers.
        if unsafe { *outputs.add(i) }.is_null() && out_lens[i] > 0 {
            return Err(arg(&format!("output {i} ('{}') is NULL", spec.name)));
        }
    }
    write_inputs(&pick, arena).map_err(|e| run_error(function, e))?;
    program
        .execute(pick.profile, arena, pool)
        .map_err(|e| run_error(function, e))?;
    // Outputs of data-dependent size are read at this run's length (at
    // most their bound, which the capacities were checked against).
    program
        .measure(&mut pick, arena)
        .map_err(|e| run_error(function, e))?;
    let out_lens: Vec<usize> = (out_specs.iter().enumerate())
        .map(|(i, s)| byte_len(s.dtype, &program.output_shape(&pick, i)))
        .collect();
    for (i, len) in out_lens.iter().enumerate() {
        // SAFETY: `outputs` holds `n_out` pointers.
        let ptr = unsafe { *outputs.add(i) }.cast::<u8>();
        if *len > 0 {
            // SAFETY: non-null (checked above); the caller provides `len`
            // writable bytes (its capacity, checked above, or the declared
            // size) that do not overlap the arena.
            let out = unsafe { std::slice::from_raw_parts_mut(ptr, *len) };
            program.read_output(&pick, arena, i, out);
        }
        let dims_out = match shaped {
            // SAFETY: `output_dims` is NULL or holds `n_out` pointers.
            Some(s) if !s.output_dims.is_null() => unsafe { *s.output_dims.add(i) },
            _ => std::ptr::null_mut(),
        };
        let shape = program.output_shape(&pick, i);
        if !dims_out.is_null() && !shape.is_empty() {
            // SAFETY: the caller provides room for the output's rank.
            unsafe { std::ptr::copy_nonoverlapping(shape.as_ptr(), dims_out, shape.len()) };
        }
    }
    Ok(())
}
