//! `kiln._kiln`: the native half of the `kiln` Python package.
//!
//! Thin on purpose: compiling goes through the command line's own code
//! ([`kiln::cli::compile_report`], so options, checks, messages and the
//! report are the CLI's), loading and running through `kiln-runtime`. The
//! Python half (`python/kiln/__init__.py`) maps numpy dtypes, allocates the
//! output arrays and hands both sides over as flat byte arrays, which this
//! module borrows in place: a run copies no tensor data, and it releases
//! the GIL while it executes.

use std::path::PathBuf;
use std::sync::Mutex;

use kiln::cli::{exit, Failure};
use kiln_runtime::{DType, PublicKey, TensorRef, TensorSpec};
use numpy::{PyReadonlyArray1, PyReadwriteArray1};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyType;

create_exception!(
    kiln,
    KilnError,
    PyException,
    "A Kiln failure; `exit_code` is the code the `kiln` command exits with."
);
create_exception!(kiln, InternalError, KilnError, "A Kiln bug (exit code 1).");
create_exception!(
    kiln,
    UsageError,
    KilnError,
    "An option or argument is wrong (exit code 2)."
);
create_exception!(
    kiln,
    InvalidModel,
    KilnError,
    "The model file is unreadable or malformed (exit code 3)."
);
create_exception!(
    kiln,
    UnsupportedModel,
    KilnError,
    "The model uses something Kiln does not support, or a dim is unbound (exit code 4)."
);
create_exception!(
    kiln,
    InvalidArtifact,
    KilnError,
    "The artifact is invalid or cannot run on this machine (exit code 5)."
);
create_exception!(
    kiln,
    InputError,
    KilnError,
    "The inputs given to a run are wrong (exit code 6)."
);
create_exception!(
    kiln,
    CheckFailed,
    KilnError,
    "Outputs are outside their tolerance (exit code 7)."
);
create_exception!(
    kiln,
    FileError,
    KilnError,
    "A file could not be read or written (exit code 8)."
);

/// The exception class of each exit code of the `kiln` command.
fn exception_for(py: Python<'_>, code: i32) -> Bound<'_, PyType> {
    match code {
        exit::USAGE => py.get_type::<UsageError>(),
        exit::BAD_MODEL => py.get_type::<InvalidModel>(),
        exit::UNSUPPORTED => py.get_type::<UnsupportedModel>(),
        exit::BAD_ARTIFACT => py.get_type::<InvalidArtifact>(),
        exit::BAD_INPUT => py.get_type::<InputError>(),
        exit::CHECK_FAILED => py.get_type::<CheckFailed>(),
        exit::IO => py.get_type::<FileError>(),
        _ => py.get_type::<InternalError>(),
    }
}

/// Every failing exit code, each with its own exception class.
const FAILING_CODES: [i32; 8] = [
    exit::INTERNAL,
    exit::USAGE,
    exit::BAD_MODEL,
    exit::UNSUPPORTED,
    exit::BAD_ARTIFACT,
    exit::BAD_INPUT,
    exit::CHECK_FAILED,
    exit::IO,
];

fn to_py_err(f: Failure) -> PyErr {
    Python::attach(|py| PyErr::from_type(exception_for(py, f.code), f.message))
}

fn runtime_err(e: kiln_runtime::Error) -> PyErr {
    to_py_err(Failure::from(e))
}

/// `kiln compile ARGS --json`, in process: returns the report as JSON text.
#[pyfunction]
fn compile_report(py: Python<'_>, args: Vec<String>) -> PyResult<String> {
    py.detach(|| kiln::cli::compile_report(args))
        .map(|report| report.to_string())
        .map_err(to_py_err)
}

/// `kiln debug ARGS --json`, in process: returns the report as JSON text
/// (whether or not a value departs).
#[pyfunction]
fn debug_report(py: Python<'_>, args: Vec<String>) -> PyResult<String> {
    py.detach(|| kiln::cli::debug_report(args))
        .map(|report| report.to_string())
        .map_err(to_py_err)
}

/// One input or output: (name, dtype name, shape).
type SpecTuple = (String, &'static str, Vec<u64>);

/// One golden check of `Model.verify`.
type VerifyTuple = (usize, String, f64, f64, f64, f64, bool, Option<String>);

fn spec_tuples(specs: &[TensorSpec]) -> Vec<SpecTuple> {
    specs
        .iter()
        .map(|s| (s.name.clone(), s.dtype.name(), s.shape.clone()))
        .collect()
}

/// A run's inputs as Python hands them over: (name, dtype name, shape, the
/// element bytes as a flat `uint8` array).
type InputTuple<'py> = (String, String, Vec<u64>, PyReadonlyArray1<'py, u8>);

/// Borrows the inputs' bytes in place; fails on a dtype name Kiln lacks.
fn borrow_inputs<'a>(inputs: &'a [InputTuple<'_>]) -> PyResult<Vec<TensorRef<'a>>> {
    inputs
        .iter()
        .map(|(name, dtype, shape, data)| {
            let dtype = DType::from_name(dtype).ok_or_else(|| {
                InputError::new_err(format!("input '{name}': Kiln has no dtype '{dtype}'"))
            })?;
            let data = data.as_slice().map_err(|e| {
                InputError::new_err(format!("input '{name}': not a contiguous array ({e})"))
            })?;
            Ok(TensorRef::new(name, dtype, shape, data))
        })
        .collect()
}

/// Borrows the output arrays' bytes in place for writing.
fn borrow_outputs<'a>(outputs: &'a mut [PyReadwriteArray1<'_, u8>]) -> PyResult<Vec<&'a mut [u8]>> {
    outputs
        .iter_mut()
        .map(|o| {
            o.as_slice_mut()
                .map_err(|e| InputError::new_err(format!("output array is not contiguous ({e})")))
        })
        .collect()
}

/// Borrows a run's arrays in place and calls `run` on them with the GIL
/// released.
fn run_detached(
    py: Python<'_>,
    inputs: &[InputTuple<'_>],
    outputs: &mut [PyReadwriteArray1<'_, u8>],
    run: impl FnOnce(&[TensorRef<'_>], &mut [&mut [u8]]) -> Result<Vec<Vec<u64>>, kiln_runtime::Error>
        + Send,
) -> PyResult<Vec<Vec<u64>>> {
    let views = borrow_inputs(inputs)?;
    let mut outs = borrow_outputs(outputs)?;
    py.detach(|| run(&views, &mut outs)).map_err(runtime_err)
}

/// A loaded artifact (`kiln_runtime::Model`): immutable, shared by every
/// Python thread.
#[pyclass(frozen, module = "kiln._kiln")]
struct Model {
    inner: kiln_runtime::Model,
}

#[pymethods]
impl Model {
    /// Loads an artifact; with a public key (PEM file or text), only one
    /// signed with the matching secret key (`kiln compile --sign`).
    #[staticmethod]
    #[pyo3(signature = (path, public_key_file=None, public_key_pem=None))]
    fn load(
        py: Python<'_>,
        path: PathBuf,
        public_key_file: Option<PathBuf>,
        public_key_pem: Option<String>,
    ) -> PyResult<Model> {
        py.detach(|| {
            let key = match (public_key_file, public_key_pem) {
                (Some(file), _) => Some(PublicKey::from_pem_file(file)?),
                (None, Some(pem)) => Some(PublicKey::from_pem(&pem)?),
                (None, None) => None,
            };
            let inner = match key {
                Some(key) => kiln_runtime::Model::load_verified(&path, &key)?,
                None => kiln_runtime::Model::load(&path)?,
            };
            Ok(Model { inner })
        })
        .map_err(runtime_err)
    }

    /// Loads an artifact held in memory (the weights are copied).
    #[staticmethod]
    fn from_bytes(py: Python<'_>, data: &[u8]) -> PyResult<Model> {
        py.detach(|| kiln_runtime::Model::from_bytes(data))
            .map(|inner| Model { inner })
            .map_err(runtime_err)
    }

    /// The inputs: (name, dtype, shape) in declared order.
    #[getter]
    fn inputs(&self) -> Vec<SpecTuple> {
        spec_tuples(self.inner.inputs())
    }

    /// The outputs: (name, dtype, shape) in declared order.
    #[getter]
    fn outputs(&self) -> Vec<SpecTuple> {
        spec_tuples(self.inner.outputs())
    }

    /// The profiles (one per combination of input shapes the artifact was
    /// compiled for, `--dim batch=1,8`; with run-time control flow also
    /// one per path and the condition programs, whose one output is
    /// `condition`, `docs/profiles.md`): (inputs, outputs) of each.
    #[getter]
    fn profiles(&self) -> Vec<(Vec<SpecTuple>, Vec<SpecTuple>)> {
        (self.inner.profiles().iter())
            .map(|p| (spec_tuples(&p.inputs), spec_tuples(&p.outputs)))
            .collect()
    }

    /// Whether runs may pad a dim up to a larger profile (`--pad-dim`).
    #[getter]
    fn paddable(&self) -> bool {
        !self.inner.paddable_dims().is_empty()
    }

    /// The output shapes of a run of these inputs (the profile they pick,
    /// cut back where the run pads).
    fn output_shapes(&self, inputs: Vec<InputTuple<'_>>) -> PyResult<Vec<Vec<u64>>> {
        let views = borrow_inputs(&inputs)?;
        self.inner.output_shapes(&views).map_err(runtime_err)
    }

    /// The most threads a session can use (the most tasks of any step).
    #[getter]
    fn max_tasks(&self) -> usize {
        self.inner.max_tasks()
    }

    /// The artifact's target (`x86_64-avx512`, ...).
    #[getter]
    fn target(&self) -> String {
        self.inner.metadata().target.clone()
    }

    /// The SHA-256 of the artifact's content, as hex.
    #[getter]
    fn content_sha256(&self) -> String {
        self.inner
            .content_hash()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// Runs once on the calling thread, outputs written into `outputs`;
    /// returns their shapes in this run.
    fn run_into(
        &self,
        py: Python<'_>,
        inputs: Vec<InputTuple<'_>>,
        mut outputs: Vec<PyReadwriteArray1<'_, u8>>,
    ) -> PyResult<Vec<Vec<u64>>> {
        run_detached(py, &inputs, &mut outputs, |views, outs| {
            self.inner.run_into_shaped(views, outs)
        })
    }

    /// The golden self-test (`Model::verify`): per set and output (set,
    /// output, max abs error, scale, error relative to the scale,
    /// tolerance, passed, mismatch or None).
    fn verify(&self, py: Python<'_>) -> PyResult<Vec<VerifyTuple>> {
        let report = py.detach(|| self.inner.verify()).map_err(runtime_err)?;
        Ok((report.checks.iter())
            .map(|c| {
                let m = &c.comparison;
                (
                    c.set,
                    m.name.clone(),
                    m.max_abs_error,
                    m.scale,
                    m.rel_error,
                    c.tolerance,
                    c.passed(),
                    m.mismatch.clone(),
                )
            })
            .collect())
    }

    /// A session of `threads` threads (clamped to `max_tasks`).
    fn session(&self, py: Python<'_>, threads: usize) -> PyResult<Session> {
        let threads = threads.clamp(1, self.inner.max_tasks());
        let inner = py
            .detach(|| self.inner.session_with_threads(threads))
            .map_err(runtime_err)?;
        Ok(Session {
            inner: Mutex::new(inner),
        })
    }
}

/// A session: its own arena and worker threads, runs that never allocate.
/// One run at a time; another Python thread's run waits (without the GIL).
#[pyclass(frozen, module = "kiln._kiln")]
struct Session {
    inner: Mutex<kiln_runtime::Session>,
}

#[pymethods]
impl Session {
    /// Threads this session's runs use.
    #[getter]
    fn threads(&self) -> usize {
        self.lock().threads()
    }

    /// Runs once, outputs written into `outputs`; returns their shapes in
    /// this run.
    fn run_into(
        &self,
        py: Python<'_>,
        inputs: Vec<InputTuple<'_>>,
        mut outputs: Vec<PyReadwriteArray1<'_, u8>>,
    ) -> PyResult<Vec<Vec<u64>>> {
        run_detached(py, &inputs, &mut outputs, |views, outs| {
            self.lock().run_into_shaped(views, outs)
        })
    }
}

impl Session {
    fn lock(&self) -> std::sync::MutexGuard<'_, kiln_runtime::Session> {
        // A run that panicked leaves nothing half-written that the next
        // run reads (the arena is rewritten by every run).
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[pymodule]
fn _kiln(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_function(wrap_pyfunction!(compile_report, m)?)?;
    m.add_function(wrap_pyfunction!(debug_report, m)?)?;
    m.add_class::<Model>()?;
    m.add_class::<Session>()?;
    m.add("KilnError", py.get_type::<KilnError>())?;
    for code in FAILING_CODES {
        let class = exception_for(py, code);
        class.setattr("exit_code", code)?;
        m.add(class.name()?, class)?;
    }
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
