//! A loaded model (validated artifact, relocated code, weights) and the
//! sessions that run it, each with its own arena.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::code::{CodeMemory, KernelFn};
use crate::file::read_private;
use crate::format::{
    largest_arena, read_header, Arch, ArtifactView, CpuFeatures, Golden, Header, Metadata, Profile,
    SectionKind, TensorSpec,
};
use crate::memory::{AlignedBuf, Weights};
use crate::pool::Pool;
use crate::{Error, Tensor, TensorRef};

/// The most threads a session starts, whatever is asked.
pub const MAX_SESSION_THREADS: usize = 1024;

/// A model ready to run: relocated code, weights and metadata, all
/// immutable after loading.
///
/// `Model` is `Send + Sync`, and every method takes `&self`: share one
/// loaded model between threads with `Arc<Model>` (or `&Model` in scoped
/// threads). The memory an inference works in (the arena) belongs to a
/// [`Session`]: give each thread its own ([`Model::session`]) for runs that
/// never allocate. [`Model::run`] is the simple entry point: it borrows the
/// model's cached arena, or allocates a temporary one while another thread
/// holds the cached one.
///
/// An artifact is machine code: load only artifacts you trust, as you would
/// a shared library. Loading checks integrity (checksums, bounds, CPU
/// features), not what the code does (see `docs/security.md`).
pub struct Model {
    program: Arc<Program>,
    /// The arena [`Model::run`] uses; `None` while a run holds it.
    cached_arena: Mutex<Option<AlignedBuf>>,
}

/// One inference context: an arena of the model's size (its largest
/// profile's), allocated once.
///
/// A session keeps its model's code and weights alive (it holds a shared
/// reference), so it may outlive the `Model` it came from. Runs through a
/// session never allocate in [`Session::run_into`]; a session is `Send`,
/// so it can move to the thread that uses it.
pub struct Session {
    program: Arc<Program>,
    arena: AlignedBuf,
    /// Worker threads for steps with several tasks (`None`: one thread).
    pool: Option<Pool>,
}

/// The immutable part of a loaded model, shared by the model and its
/// sessions.
pub(crate) struct Program {
    metadata: Metadata,
    content_hash: [u8; 32],
    features: CpuFeatures,
    /// The specializations to input shapes; a run's input shapes pick one.
    profiles: Vec<Profile>,
    /// Per profile, each step's tasks as a range of `kernel_entries`.
    steps: Vec<Vec<std::ops::Range<usize>>>,
    /// The arena every session allocates: the largest profile's.
    arena_size: u64,
    /// Entry point of every kernel; valid while `_code` lives.
    kernel_entries: Vec<KernelFn>,
    /// The inputs by name, for matching a run's inputs.
    input_names: InputNames,
    /// Keeps the mapping that `task_entries` point into alive.
    _code: CodeMemory,
    /// The self-test (a copy of the GOLDEN section; empty when none).
    golden: Golden<'static>,
    /// Read-only: kernels receive it as `*const u8`.
    weights: Weights,
}

impl Model {
    /// Reads the artifact at `path` once into private memory, validates
    /// it and prepares it to run.
    ///
    /// Nothing of the file stays mapped: changing, replacing or truncating
    /// it afterwards does not affect the loaded model. The weights are
    /// served from the private copy (memory: the file's size, plus the
    /// code; see `docs/security.md`).
    pub fn load(path: impl AsRef<Path>) -> Result<Model, Error> {
        Model::from_private(read_private(path.as_ref())?)
    }

    /// Like [`Model::load`], but first requires the artifact's detached
    /// signature (`PATH.sig`, written by `kiln compile --sign`) to be a
    /// valid Ed25519 signature by `key` of this artifact's content hash.
    /// Refuses, before any code is mapped, an unsigned artifact
    /// ([`Error::Unsigned`]), one modified after signing
    /// ([`Error::ModifiedAfterSigning`], or a format error when the change
    /// broke a checksum) and one signed with another key
    /// ([`Error::BadSignature`]). The signature is checked on the very
    /// bytes that are then decoded and run: the file is read once. See
    /// `docs/security.md`.
    #[cfg(feature = "signing")]
    pub fn load_verified(path: impl AsRef<Path>, key: &crate::PublicKey) -> Result<Model, Error> {
        let path = path.as_ref();
        let file = read_private(path)?;
        let header = read_header(file.as_slice())?;
        crate::signing::verify_detached(path, &header.content_hash, key)?;
        Model::from_private(file)
    }

    /// A model from an artifact file read into private memory; the
    /// weights are used in place.
    fn from_private(file: AlignedBuf) -> Result<Model, Error> {
        let (model, weights_range) = Model::prepare(file.as_slice())?;
        Ok(model(Weights::new(file, weights_range)?))
    }

    /// Validates an artifact held in memory and prepares it to run
    /// (the weights are copied).
    pub fn from_bytes(bytes: &[u8]) -> Result<Model, Error> {
        let (model, weights_range) = Model::prepare(bytes)?;
        let weights = AlignedBuf::copy_of(&bytes[weights_range], "weights")?;
        let len = weights.as_slice().len();
        Ok(model(Weights::new(weights, 0..len)?))
    }

    /// Everything but the weights: checks the header, the architecture and
    /// the CPU features before mapping any code, then validates the
    /// sections, allocates the first arena and maps the code. Returns a
    /// constructor taking the weights, and the weights' range in `bytes`.
    fn prepare(
        bytes: &[u8],
    ) -> Result<(impl FnOnce(Weights) -> Model, std::ops::Range<usize>), Error> {
        let header = read_header(bytes)?;
        check_host(&header)?;
        let view = ArtifactView::parse(bytes)?;
        let arena_size = largest_arena(&view.profiles);
        let arena = AlignedBuf::zeroed(arena_size, "arena")?;
        let code = CodeMemory::new(view.text, &view.kernels, &view.relocs)?;
        // One entry per kernel, and each step a range of them (the decoder
        // checked kernel + tasks <= kernels): linear in the file's size
        // however many steps share the same kernels.
        let kernel_entries = view.kernels.iter().map(|k| code.entry(k)).collect();
        let steps = (view.profiles.iter())
            .map(|p| {
                (p.schedule.iter())
                    .map(|s| s.kernel as usize..(s.kernel + s.tasks) as usize)
                    .collect()
            })
            .collect();
        let input_names = InputNames::new(&view.profiles[0].inputs);
        let weights_section = view.header.section(SectionKind::Weights);
        // Inside `bytes`, as `read_header` checked.
        let start = weights_section.offset as usize;
        let range = start..start + weights_section.length as usize;
        let ArtifactView {
            header,
            metadata,
            profiles,
            golden,
            ..
        } = view;
        let golden = golden.into_owned();
        let model = move |weights| Model {
            program: Arc::new(Program {
                metadata,
                content_hash: header.content_hash,
                features: header.features,
                profiles,
                steps,
                arena_size,
                kernel_entries,
                input_names,
                _code: code,
                golden,
                weights,
            }),
            cached_arena: Mutex::new(Some(arena)),
        };
        Ok((model, range))
    }

    /// Runs the artifact's golden self-test on this machine: every input
    /// set stored by `kiln compile --golden`, every output compared with
    /// the source model's value against the output's tolerance. `Ok` with
    /// the per-output checks (see [`VerifyReport::passed`](crate::VerifyReport::passed)),
    /// or [`Error::NoGolden`] for an artifact compiled without one.
    pub fn verify(&self) -> Result<crate::VerifyReport, Error> {
        crate::golden::verify(&self.program.golden, |inputs| self.run(inputs))
    }

    /// The artifact's golden self-test (empty when it has none).
    pub fn golden(&self) -> &Golden<'static> {
        &self.program.golden
    }

    /// The model's inputs, in declared order, with the first profile's
    /// shapes (see [`Model::profiles`] for the others).
    pub fn inputs(&self) -> &[TensorSpec] {
        self.program.inputs()
    }

    /// The model's outputs, in declared order, with the first profile's
    /// shapes.
    pub fn outputs(&self) -> &[TensorSpec] {
        self.program.outputs()
    }

    /// The specializations to input shapes the artifact holds (at least
    /// one): each with its inputs' and outputs' shapes, arena size and
    /// schedule. A run uses the profile whose input shapes are those of
    /// its inputs.
    pub fn profiles(&self) -> &[Profile] {
        &self.program.profiles
    }

    /// The profile inputs of these shapes run: the index into
    /// [`Model::profiles`], or [`Error::NoProfile`] naming the shapes
    /// given and those available. Inputs are matched by name, as in
    /// [`Model::run`].
    pub fn profile_for(&self, inputs: &[TensorRef<'_>]) -> Result<usize, Error> {
        self.program.select(inputs)
    }

    /// Provenance: compiler, target, options, source model.
    pub fn metadata(&self) -> &Metadata {
        &self.program.metadata
    }

    /// The arena a session allocates: the largest profile's, in bytes.
    pub fn arena_size(&self) -> u64 {
        self.program.arena_size
    }

    /// The artifact's content hash (see
    /// [`Header::content_hash`](crate::format::Header::content_hash)).
    pub fn content_hash(&self) -> [u8; 32] {
        self.program.content_hash
    }

    /// The CPU features the artifact requires.
    pub fn required_features(&self) -> CpuFeatures {
        self.program.features
    }

    /// A new session with its own arena ([`Model::arena_size`] bytes,
    /// allocated now, enough for every profile). Sessions of one model run
    /// concurrently.
    pub fn session(&self) -> Result<Session, Error> {
        self.session_with_threads(1)
    }

    /// A new session whose runs use `threads` threads (the caller and
    /// `threads - 1` workers, created now and kept until the session is
    /// dropped) for the steps the compiler split into several tasks. A run
    /// neither creates threads nor allocates.
    ///
    /// Threads beyond [`Model::max_tasks`] would never get work, so the
    /// count is clamped to it, and to [`MAX_SESSION_THREADS`]
    /// ([`Session::threads`] tells the count used).
    pub fn session_with_threads(&self, threads: usize) -> Result<Session, Error> {
        let threads = threads.min(self.max_tasks()).min(MAX_SESSION_THREADS);
        let pool = if threads > 1 {
            Some(Pool::new(threads).map_err(Error::SpawnThreads)?)
        } else {
            None
        };
        Ok(Session {
            program: Arc::clone(&self.program),
            arena: AlignedBuf::zeroed(self.program.arena_size, "arena")?,
            pool,
        })
    }

    /// The most tasks any step of any profile's schedule has: the threads
    /// beyond that which a session could use.
    pub fn max_tasks(&self) -> usize {
        (self.program.steps.iter().flatten())
            .map(|r| r.len())
            .max()
            .unwrap_or(1)
    }

    /// Runs one inference. Every declared input must be given exactly once
    /// (in any order); returns the outputs in declared order.
    ///
    /// Uses the model's cached arena; a call made while another thread's
    /// call holds it allocates a temporary arena for itself.
    pub fn run(&self, inputs: &[TensorRef<'_>]) -> Result<Vec<Tensor>, Error> {
        self.with_arena(|program, arena| program.run(arena, None, inputs))?
    }

    /// Runs one inference, outputs written to `outputs` (one buffer per
    /// declared output, in declared order, each exactly the output's byte
    /// size in the profile the inputs select). Does not allocate unless another thread is running the model
    /// through [`Model::run`] or `run_into` at the same time (see
    /// [`Model::run`]); use a [`Session`] per thread to never allocate.
    pub fn run_into(
        &self,
        inputs: &[TensorRef<'_>],
        outputs: &mut [&mut [u8]],
    ) -> Result<(), Error> {
        self.with_arena(|program, arena| program.run_into(arena, None, inputs, outputs, None))?
    }

    /// Calls `f` with the cached arena, or with a fresh one while the
    /// cached one is in use, and caches the arena again afterwards.
    pub(crate) fn with_arena<R>(
        &self,
        f: impl FnOnce(&Program, &mut AlignedBuf) -> R,
    ) -> Result<R, Error> {
        // A panic cannot leave the slot inconsistent (it only holds an
        // `Option`), so a poisoned lock is still usable.
        let lock = || self.cached_arena.lock().unwrap_or_else(|e| e.into_inner());
        let taken = lock().take();
        let mut arena = match taken {
            Some(arena) => arena,
            None => AlignedBuf::zeroed(self.program.arena_size, "arena")?,
        };
        let result = f(&self.program, &mut arena);
        let mut slot = lock();
        if slot.is_none() {
            *slot = Some(arena);
        }
        Ok(result)
    }
}

impl Session {
    /// The model's inputs, in declared order (the first profile's shapes).
    pub fn inputs(&self) -> &[TensorSpec] {
        self.program.inputs()
    }

    /// The model's outputs, in declared order (the first profile's shapes).
    pub fn outputs(&self) -> &[TensorSpec] {
        self.program.outputs()
    }

    /// Runs one inference (as [`Model::run`]) in this session's arena.
    pub fn run(&mut self, inputs: &[TensorRef<'_>]) -> Result<Vec<Tensor>, Error> {
        self.program
            .run(&mut self.arena, self.pool.as_ref(), inputs)
    }

    /// Runs one inference (as [`Session::run_into`]) and adds the wall
    /// time of each schedule step to `step_times`, which holds one entry
    /// per step of the profile the inputs select, in schedule order (see
    /// [`Model::profile_for`] and [`Profile::schedule`]; it is resized to
    /// that when it is not). For profiling; a plain run does not read the
    /// clock.
    pub fn run_profiled(
        &mut self,
        inputs: &[TensorRef<'_>],
        outputs: &mut [&mut [u8]],
        step_times: &mut Vec<std::time::Duration>,
    ) -> Result<(), Error> {
        let profile = self.program.select(inputs)?;
        step_times.resize(self.program.steps[profile].len(), std::time::Duration::ZERO);
        self.program.run_into(
            &mut self.arena,
            self.pool.as_ref(),
            inputs,
            outputs,
            Some(step_times),
        )
    }

    /// Threads this session's runs use.
    pub fn threads(&self) -> usize {
        self.pool.as_ref().map_or(1, Pool::threads)
    }

    /// Runs one inference without allocating: inputs as in [`Model::run`],
    /// outputs written to `outputs` (one buffer per declared output, in
    /// declared order, each exactly the output's byte size).
    pub fn run_into(
        &mut self,
        inputs: &[TensorRef<'_>],
        outputs: &mut [&mut [u8]],
    ) -> Result<(), Error> {
        self.program
            .run_into(&mut self.arena, self.pool.as_ref(), inputs, outputs, None)
    }

    /// The shared program, this session's arena and its threads (for the
    /// C ABI).
    pub(crate) fn parts(&mut self) -> (&Program, &mut AlignedBuf, Option<&Pool>) {
        (&self.program, &mut self.arena, self.pool.as_ref())
    }
}

impl Program {
    fn run(
        &self,
        arena: &mut AlignedBuf,
        pool: Option<&Pool>,
        inputs: &[TensorRef<'_>],
    ) -> Result<Vec<Tensor>, Error> {
        let profile = self.select(inputs)?;
        self.bind_inputs(profile, arena, inputs)?;
        self.execute(profile, arena, pool)?;
        let outputs = (self.profiles[profile].outputs.iter()).map(|spec| Tensor {
            name: spec.name.clone(),
            dtype: spec.dtype,
            shape: spec.shape.clone(),
            data: arena.as_slice()[arena_range(spec)].to_vec(),
        });
        Ok(outputs.collect())
    }

    fn run_into(
        &self,
        arena: &mut AlignedBuf,
        pool: Option<&Pool>,
        inputs: &[TensorRef<'_>],
        outputs: &mut [&mut [u8]],
        step_times: Option<&mut [std::time::Duration]>,
    ) -> Result<(), Error> {
        let profile = self.select(inputs)?;
        self.check_output_buffers(profile, outputs.iter().map(|b| b.len()))?;
        self.bind_inputs(profile, arena, inputs)?;
        self.execute_timed(profile, arena, pool, step_times)?;
        for (i, out) in outputs.iter_mut().enumerate() {
            out.copy_from_slice(self.output_bytes(profile, arena, i));
        }
        Ok(())
    }

    /// The model's inputs, in declared order (the first profile's shapes).
    pub(crate) fn inputs(&self) -> &[TensorSpec] {
        &self.profiles[0].inputs
    }

    /// The model's outputs, in declared order (the first profile's shapes).
    pub(crate) fn outputs(&self) -> &[TensorSpec] {
        &self.profiles[0].outputs
    }

    /// The profile `inputs` run (see [`Model::profile_for`]), after
    /// checking that every declared input is given once and by name.
    pub(crate) fn select(&self, inputs: &[TensorRef<'_>]) -> Result<usize, Error> {
        if self.profiles.len() == 1 {
            // Binding checks the inputs against the one profile.
            return Ok(0);
        }
        // Names, duplicates and missing inputs first: their errors say
        // more than "no profile".
        self.input_names
            .each(self.inputs(), inputs, |_, _| Ok(()))?;
        let index = |given: &TensorRef<'_>| self.input_names.index(given.name).unwrap_or(0);
        (self.profiles.iter())
            .position(|p| {
                inputs
                    .iter()
                    .all(|given| p.inputs[index(given)].shape.as_slice() == given.shape)
            })
            .ok_or_else(|| {
                let mut given: Vec<(usize, String)> = (inputs.iter())
                    .map(|g| (index(g), format!("{}: {}", g.name, g.type_string())))
                    .collect();
                given.sort();
                let given: Vec<String> = given.into_iter().map(|(_, s)| s).collect();
                Error::NoProfile {
                    given: given.join(", "),
                    available: (self.profiles.iter())
                        .map(|p| p.describe_inputs())
                        .collect(),
                }
            })
    }

    /// Checks `inputs` against `profile`'s inputs and copies them into
    /// the arena.
    pub(crate) fn bind_inputs(
        &self,
        profile: usize,
        arena: &mut AlignedBuf,
        inputs: &[TensorRef<'_>],
    ) -> Result<(), Error> {
        let specs = &self.profiles[profile].inputs;
        self.input_names.bind(specs, inputs, |i, given| {
            arena.as_mut_slice()[arena_range(&specs[i])].copy_from_slice(given.data);
            Ok(())
        })
    }

    /// The arena bytes of input `i` of `profile`.
    pub(crate) fn input_slot<'a>(
        &self,
        profile: usize,
        arena: &'a mut AlignedBuf,
        i: usize,
    ) -> &'a mut [u8] {
        &mut arena.as_mut_slice()[arena_range(&self.profiles[profile].inputs[i])]
    }

    /// The specializations to input shapes.
    pub(crate) fn profiles(&self) -> &[Profile] {
        &self.profiles
    }

    /// The input specs of `profile`.
    pub(crate) fn inputs_of(&self, profile: usize) -> &[TensorSpec] {
        &self.profiles[profile].inputs
    }

    /// Errors unless `lens` are the byte sizes of `profile`'s outputs.
    fn check_output_buffers(
        &self,
        profile: usize,
        lens: impl ExactSizeIterator<Item = usize>,
    ) -> Result<(), Error> {
        let specs = &self.profiles[profile].outputs;
        if lens.len() != specs.len() {
            return Err(Error::OutputCount {
                expected: specs.len(),
                given: lens.len(),
            });
        }
        for (spec, len) in specs.iter().zip(lens) {
            if len as u64 != spec.byte_len() {
                return Err(Error::OutputBufferSize {
                    name: spec.name.clone(),
                    ty: spec.type_string(),
                    expected: spec.byte_len(),
                    given: len,
                });
            }
        }
        Ok(())
    }

    /// The arena bytes of output `i` of `profile`.
    pub(crate) fn output_bytes<'a>(
        &self,
        profile: usize,
        arena: &'a AlignedBuf,
        i: usize,
    ) -> &'a [u8] {
        &arena.as_slice()[arena_range(&self.profiles[profile].outputs[i])]
    }

    /// The output specs of `profile`.
    pub(crate) fn outputs_of(&self, profile: usize) -> &[TensorSpec] {
        &self.profiles[profile].outputs
    }

    /// Calls `profile`'s kernels in order over `arena`, which must be
    /// [`Program::arena_size`] bytes (every arena is allocated with that
    /// size).
    pub(crate) fn execute(
        &self,
        profile: usize,
        arena: &mut AlignedBuf,
        pool: Option<&Pool>,
    ) -> Result<(), Error> {
        self.execute_timed(profile, arena, pool, None)
    }

    /// [`Program::execute`], adding each step's wall time to `step_times`
    /// when given (one entry per step).
    fn execute_timed(
        &self,
        profile: usize,
        arena: &mut AlignedBuf,
        pool: Option<&Pool>,
        mut step_times: Option<&mut [std::time::Duration]>,
    ) -> Result<(), Error> {
        debug_assert_eq!(arena.as_slice().len() as u64, self.arena_size);
        let arena = arena.as_mut_ptr();
        let weights = self.weights.as_ptr();
        for (i, step) in self.steps[profile].iter().enumerate() {
            let tasks = &self.kernel_entries[step.clone()];
            // Why the calls below are sound: the entries point into
            // `self._code`, which is alive; the arena and weights are the
            // buffers the artifact was compiled against (sizes validated at
            // load; the arena is the largest profile's, so at least this
            // profile's). Kernels only read the weights, so concurrent runs
            // over separate arenas share them safely, and the tasks of one
            // step are independent by the format's definition (see
            // `format::Step`). What the code does is the artifact's
            // responsibility (see the type's docs).
            let start = step_times.is_some().then(std::time::Instant::now);
            let code = match pool {
                // SAFETY: see above; the pool runs each task once.
                Some(pool) if tasks.len() > 1 => unsafe { pool.run(tasks, arena, weights) },
                _ => tasks
                    .iter()
                    // SAFETY: see above.
                    .map(|entry| unsafe { entry(arena, weights) })
                    .find(|&c| c != 0)
                    .unwrap_or(0),
            };
            if let (Some(times), Some(start)) = (step_times.as_deref_mut(), start) {
                times[i] += start.elapsed();
            }
            if code != 0 {
                return Err(Error::Kernel {
                    node: self.profiles[profile].schedule[i].node.clone(),
                    code,
                });
            }
        }
        Ok(())
    }
}

/// The arena range of a validated tensor spec.
fn arena_range(spec: &TensorSpec) -> std::ops::Range<usize> {
    // Parsing checked offset + byte_len <= arena_size, and every arena is
    // allocated with that size, so both fit in usize.
    let start = spec.arena_offset as usize;
    start..start + spec.byte_len() as usize
}

fn check_input(spec: &TensorSpec, given: &TensorRef<'_>) -> Result<(), Error> {
    if given.dtype != spec.dtype || given.shape != spec.shape.as_slice() {
        return Err(Error::InputTypeMismatch {
            name: spec.name.clone(),
            expected: spec.type_string(),
            given: given.type_string(),
        });
    }
    if given.data.len() as u64 != spec.byte_len() {
        return Err(Error::InputDataLength {
            name: spec.name.clone(),
            ty: spec.type_string(),
            expected: spec.byte_len(),
            given: given.data.len(),
        });
    }
    Ok(())
}

/// Refuses artifacts for another architecture or for CPU features this
/// machine lacks.
fn check_host(header: &Header) -> Result<(), Error> {
    if header.arch == Arch::Nvptx64 {
        return Err(Error::CudaArtifact {
            sm: header.features.0,
        });
    }
    if Arch::host() != Some(header.arch) {
        return Err(Error::UnsupportedArch {
            artifact: header.arch,
            host: std::env::consts::ARCH,
        });
    }
    let missing = header.features.missing_from(CpuFeatures::detect_host());
    if !missing.is_empty() {
        return Err(Error::MissingCpuFeatures(missing.describe()));
    }
    Ok(())
}

impl fmt::Debug for Model {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.program.fmt(f)
    }
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Session").field(&self.program).finish()
    }
}

impl fmt::Debug for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Model")
            .field("inputs", &self.inputs())
            .field("outputs", &self.outputs())
            .field("profiles", &self.profiles.len())
            .field("arena_size", &self.arena_size)
            .finish_non_exhaustive()
    }
}

/// A model's declared inputs by name (unique: the decoder checked), built
/// once at load so that matching a run's inputs costs time linear in their
/// number, whatever the artifact declares.
pub(crate) struct InputNames(HashMap<String, usize>);

/// Declared inputs up to this many are tracked on the stack while a run's
/// inputs are matched; more allocate a bit set per run.
const STACK_INPUTS: usize = 64 * 64;

impl InputNames {
    pub(crate) fn new(specs: &[TensorSpec]) -> InputNames {
        InputNames(
            (specs.iter().enumerate())
                .map(|(i, s)| (s.name.clone(), i))
                .collect(),
        )
    }

    /// The index of the declared input called `name`.
    pub(crate) fn index(&self, name: &str) -> Option<usize> {
        self.0.get(name).copied()
    }

    /// Matches each of `inputs` to its declared input in `specs` by name
    /// (one lookup) and, once its type and data length are checked, hands
    /// it to `bind` with the declared input's index; errors unless every
    /// declared input is given exactly once. On an error `bind` may have
    /// taken some of the inputs.
    pub(crate) fn bind<'t>(
        &self,
        specs: &[TensorSpec],
        inputs: &[TensorRef<'t>],
        mut bind: impl FnMut(usize, &TensorRef<'t>) -> Result<(), Error>,
    ) -> Result<(), Error> {
        self.each(specs, inputs, |i, given| {
            check_input(&specs[i], given)?;
            bind(i, given)
        })
    }

    /// [`InputNames::bind`] without the type check: names only.
    pub(crate) fn each<'t>(
        &self,
        specs: &[TensorSpec],
        inputs: &[TensorRef<'t>],
        mut each: impl FnMut(usize, &TensorRef<'t>) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let words = specs.len().div_ceil(64);
        let mut on_stack = [0u64; STACK_INPUTS / 64];
        let mut on_heap = Vec::new();
        let seen: &mut [u64] = if words <= on_stack.len() {
            &mut on_stack[..words]
        } else {
            on_heap.resize(words, 0);
            &mut on_heap
        };
        for given in inputs {
            let Some(i) = self.index(given.name) else {
                let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
                return Err(Error::UnknownInput {
                    name: given.name.to_owned(),
                    expected: names.join(", "),
                });
            };
            let (word, bit) = (i / 64, 1u64 << (i % 64));
            if seen[word] & bit != 0 {
                return Err(Error::DuplicateInput(given.name.to_owned()));
            }
            seen[word] |= bit;
            each(i, given)?;
        }
        if let Some(missing) =
            (specs.iter().enumerate()).find(|(i, _)| seen[i / 64] & (1 << (i % 64)) == 0)
        {
            return Err(Error::MissingInput {
                name: missing.1.name.clone(),
                expected: missing.1.type_string(),
            });
        }
        Ok(())
    }
}
