//! A loaded model (validated artifact, relocated code, weights) and the
//! sessions that run it, each with its own arena.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::code::{CodeMemory, KernelFn};
use crate::file::read_private;
use crate::format::{
    describe_conditions, largest_arena, read_header, Arch, ArtifactView, CpuFeatures, Golden,
    Header, Metadata, PaddableDim, Profile, Role, SectionKind, TensorSpec,
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
    /// The dims a run may pad to a larger profile.
    padding: Vec<PaddableDim>,
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
            padding,
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
                padding,
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
    ///
    /// For a model whose control flow branches at run time this runs the
    /// condition programs that pick the variant (see
    /// [`format::Role`](crate::format::Role)).
    pub fn profile_for(&self, inputs: &[TensorRef<'_>]) -> Result<usize, Error> {
        let pick = self.with_arena(|program, arena| program.choose(inputs, arena, None))??;
        Ok(pick.profile)
    }

    /// The shapes of the outputs a run of `inputs` returns: those of the
    /// profile they pick, cut back along padded dims (for sizing output
    /// buffers before [`Model::run_into`]); an output whose size depends
    /// on the data has its bound (`docs/bounded.md`).
    pub fn output_shapes(&self, inputs: &[TensorRef<'_>]) -> Result<Vec<Vec<u64>>, Error> {
        let pick = self.with_arena(|program, arena| program.choose(inputs, arena, None))??;
        let count = self.program.outputs().len();
        Ok((0..count)
            .map(|i| self.program.output_shape(&pick, i))
            .collect())
    }

    /// The dims a run may pad to a larger profile (`kiln compile
    /// --pad-dim`): inputs smaller along one than every profile run the
    /// smallest profile that fits, padded with zeros, and the outputs come
    /// back at the run's size.
    pub fn paddable_dims(&self) -> &[PaddableDim] {
        &self.program.padding
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
    /// size in the profile the inputs select; for an output whose size
    /// depends on the data, at least this run's size, as
    /// [`Model::output_shapes`] gives its bound, the data at the start;
    /// [`Model::run`] returns its shape). Does not allocate unless another thread is running the model
    /// through [`Model::run`] or `run_into` at the same time (see
    /// [`Model::run`]); use a [`Session`] per thread to never allocate.
    pub fn run_into(
        &self,
        inputs: &[TensorRef<'_>],
        outputs: &mut [&mut [u8]],
    ) -> Result<(), Error> {
        self.with_arena(|program, arena| {
            program.run_into(arena, None, inputs, outputs, None, None)
        })?
    }

    /// [`Model::run_into`], returning the outputs' shapes in this run (for
    /// outputs whose size depends on the data; allocates the list).
    pub fn run_into_shaped(
        &self,
        inputs: &[TensorRef<'_>],
        outputs: &mut [&mut [u8]],
    ) -> Result<Vec<Vec<u64>>, Error> {
        let mut shapes = Vec::new();
        self.with_arena(|program, arena| {
            program.run_into(arena, None, inputs, outputs, None, Some(&mut shapes))
        })??;
        Ok(shapes)
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
        let pool = self.pool.as_ref();
        let profile = self.program.choose(inputs, &mut self.arena, pool)?.profile;
        step_times.resize(self.program.steps[profile].len(), std::time::Duration::ZERO);
        self.program.run_into(
            &mut self.arena,
            self.pool.as_ref(),
            inputs,
            outputs,
            Some(step_times),
            None,
        )
    }

    /// Threads this session's runs use.
    pub fn threads(&self) -> usize {
        self.pool.as_ref().map_or(1, Pool::threads)
    }

    /// Runs one inference without allocating: inputs as in [`Model::run`],
    /// outputs written to `outputs` as in [`Model::run_into`].
    pub fn run_into(
        &mut self,
        inputs: &[TensorRef<'_>],
        outputs: &mut [&mut [u8]],
    ) -> Result<(), Error> {
        self.program.run_into(
            &mut self.arena,
            self.pool.as_ref(),
            inputs,
            outputs,
            None,
            None,
        )
    }

    /// [`Session::run_into`], returning the outputs' shapes in this run
    /// (as [`Model::run_into_shaped`]).
    pub fn run_into_shaped(
        &mut self,
        inputs: &[TensorRef<'_>],
        outputs: &mut [&mut [u8]],
    ) -> Result<Vec<Vec<u64>>, Error> {
        let mut shapes = Vec::new();
        self.program.run_into(
            &mut self.arena,
            self.pool.as_ref(),
            inputs,
            outputs,
            None,
            Some(&mut shapes),
        )?;
        Ok(shapes)
    }

    /// The shared program, this session's arena and its threads (for the
    /// C ABI).
    pub(crate) fn parts(&mut self) -> (&Program, &mut AlignedBuf, Option<&Pool>) {
        (&self.program, &mut self.arena, self.pool.as_ref())
    }
}

/// The condition values one run has computed, without allocating: a run
/// meets a few conditions (one per `If` on its path); past the capacity,
/// a condition is computed again where a guard asks for it.
#[derive(Default)]
struct Known {
    values: [(u32, bool); 16],
    len: usize,
}

impl Known {
    fn get(&self, condition: u32) -> Option<bool> {
        (self.values[..self.len].iter())
            .find(|(c, _)| *c == condition)
            .map(|&(_, v)| v)
    }

    fn put(&mut self, condition: u32, value: bool) {
        if self.len < self.values.len() {
            self.values[self.len] = (condition, value);
            self.len += 1;
        }
    }

    fn entries(&self) -> impl Iterator<Item = (u32, bool)> + '_ {
        self.values[..self.len].iter().copied()
    }
}

/// The profile a run uses, and the real size of each padded dim (empty
/// for a run of the profile's exact shapes, which then allocates nothing).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Pick {
    /// Index into the profiles.
    pub profile: usize,
    /// Per paddable dim (in the artifact's order): the run's size along it.
    pub real: Vec<Option<u64>>,
    /// Per bounded output of the profile (in its order): the length the
    /// run computed (empty until [`Program::measure`]).
    pub lengths: Vec<u64>,
}

impl Pick {
    /// Profile `profile` at its exact shapes.
    pub(crate) fn exact(profile: usize) -> Pick {
        Pick {
            profile,
            real: Vec::new(),
            lengths: Vec::new(),
        }
    }
}

impl Program {
    fn run(
        &self,
        arena: &mut AlignedBuf,
        pool: Option<&Pool>,
        inputs: &[TensorRef<'_>],
    ) -> Result<Vec<Tensor>, Error> {
        let mut pick = self.choose(inputs, arena, pool)?;
        self.bind_inputs(&pick, arena, inputs)?;
        self.execute(pick.profile, arena, pool)?;
        self.measure(&mut pick, arena)?;
        let specs = &self.profiles[pick.profile].outputs;
        let outputs = specs.iter().enumerate().map(|(i, spec)| {
            let shape = self.output_shape(&pick, i);
            let len = shape.iter().product::<u64>() as usize * spec.dtype.size_bytes();
            let mut data = vec![0; len];
            self.read_output(&pick, arena, i, &mut data);
            Tensor {
                name: spec.name.clone(),
                dtype: spec.dtype,
                shape,
                data,
            }
        });
        Ok(outputs.collect())
    }

    /// Runs `inputs` with outputs written to `outputs`; with `shapes`,
    /// lists the outputs' shapes in this run there.
    fn run_into(
        &self,
        arena: &mut AlignedBuf,
        pool: Option<&Pool>,
        inputs: &[TensorRef<'_>],
        outputs: &mut [&mut [u8]],
        step_times: Option<&mut [std::time::Duration]>,
        shapes: Option<&mut Vec<Vec<u64>>>,
    ) -> Result<(), Error> {
        let mut pick = self.choose(inputs, arena, pool)?;
        self.check_output_buffers(&pick, outputs.iter().map(|b| b.len()))?;
        self.bind_inputs(&pick, arena, inputs)?;
        self.execute_timed(pick.profile, arena, pool, step_times)?;
        self.measure(&mut pick, arena)?;
        let specs = &self.profiles[pick.profile].outputs;
        for (i, out) in outputs.iter_mut().enumerate() {
            if pick.lengths.is_empty() {
                self.read_output(&pick, arena, i, out);
                continue;
            }
            // A bounded output's buffer holds at least this run's data.
            let shape = self.output_shape(&pick, i);
            let len = shape.iter().product::<u64>() * specs[i].dtype.size_bytes() as u64;
            let Some(out) = out.get_mut(..len as usize) else {
                return Err(Error::OutputBufferSize {
                    name: specs[i].name.clone(),
                    ty: crate::format::type_string(specs[i].dtype, &shape),
                    expected: len,
                    given: out.len(),
                });
            };
            self.read_output(&pick, arena, i, out);
        }
        if let Some(shapes) = shapes {
            *shapes = (0..outputs.len())
                .map(|i| self.output_shape(&pick, i))
                .collect();
        }
        Ok(())
    }

    /// Reads the length of each bounded output of `pick`'s profile that
    /// the run wrote into the arena, into `pick`: a length outside the
    /// output's bound is an error (never a read past its buffer).
    pub(crate) fn measure(&self, pick: &mut Pick, arena: &AlignedBuf) -> Result<(), Error> {
        let profile = &self.profiles[pick.profile];
        pick.lengths.clear();
        for b in &profile.bounded {
            let at = b.length_offset as usize;
            // The decoder checked that the slot lies inside the arena.
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(&arena.as_slice()[at..at + 8]);
            let length = i64::from_le_bytes(bytes);
            let bound = self.output_shape(pick, b.output as usize)[b.axis as usize];
            if !(0..=bound as i64).contains(&length) {
                return Err(Error::LengthOutOfBound {
                    output: profile.outputs[b.output as usize].name.clone(),
                    axis: b.axis,
                    length,
                    bound,
                });
            }
            pick.lengths.push(length as u64);
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
    pub(crate) fn select(&self, inputs: &[TensorRef<'_>]) -> Result<Pick, Error> {
        if self.profiles.len() == 1 && self.padding.is_empty() {
            // Binding checks the inputs against the one profile.
            return Ok(Pick::exact(0));
        }
        // Names, duplicates and missing inputs first: their errors say
        // more than "no profile".
        self.input_names
            .each(self.inputs(), inputs, |_, _| Ok(()))?;
        let index = |given: &TensorRef<'_>| self.input_names.index(given.name).unwrap_or(0);
        let given = || inputs.iter().map(|g| (index(g), g.dtype, g.shape));
        self.pick(given).ok_or_else(|| {
            let mut given: Vec<(usize, String)> = (inputs.iter())
                .map(|g| (index(g), format!("{}: {}", g.name, g.type_string())))
                .collect();
            given.sort();
            let given: Vec<String> = given.into_iter().map(|(_, s)| s).collect();
            self.no_profile(given.join(", "))
        })
    }

    /// [`Program::select`], then, where the profile of these shapes is
    /// one of several variants of run-time control flow,
    /// [`Program::resolve`] with `inputs`.
    pub(crate) fn choose(
        &self,
        inputs: &[TensorRef<'_>],
        arena: &mut AlignedBuf,
        pool: Option<&Pool>,
    ) -> Result<Pick, Error> {
        let pick = self.select(inputs)?;
        self.resolve(pick, arena, pool, &mut |pick, arena| {
            self.bind_inputs(pick, arena, inputs)
        })
    }

    /// The variant among the selectable profiles of `pick`'s input shapes
    /// whose guards all hold on this run's inputs, in profile order;
    /// `pick` itself when it has no guards. Condition programs run as
    /// needed, each at most once per run (up to [`Known`]'s capacity),
    /// `write_inputs` writing the run's inputs into a profile's slots.
    /// A refused variant is [`Error::VariantRefused`]; no variant,
    /// [`Error::NoVariant`].
    pub(crate) fn resolve(
        &self,
        pick: Pick,
        arena: &mut AlignedBuf,
        pool: Option<&Pool>,
        write_inputs: &mut dyn FnMut(&Pick, &mut AlignedBuf) -> Result<(), Error>,
    ) -> Result<Pick, Error> {
        let chosen = &self.profiles[pick.profile];
        if chosen.role.guards().is_empty() {
            return Ok(pick);
        }
        let same_shapes =
            |p: &Profile| (p.inputs.iter().zip(&chosen.inputs)).all(|(a, b)| a.shape == b.shape);
        let mut known = Known::default();
        for (p, profile) in self.profiles.iter().enumerate() {
            if !profile.role.is_selectable() || !same_shapes(profile) {
                continue;
            }
            let mut holds = true;
            for g in profile.role.guards() {
                let value = match known.get(g.condition) {
                    Some(v) => v,
                    None => {
                        let c = g.condition as usize;
                        let v = self.condition(c, arena, pool, write_inputs)?;
                        known.put(g.condition, v);
                        v
                    }
                };
                if value != g.holds {
                    holds = false;
                    break;
                }
            }
            if !holds {
                continue;
            }
            return match &profile.role {
                Role::Refused { guards, reason } => Err(Error::VariantRefused {
                    path: describe_conditions(
                        &self.profiles,
                        guards.iter().map(|g| (g.condition, g.holds)),
                    ),
                    reason: reason.clone(),
                }),
                _ => Ok(Pick::exact(p)),
            };
        }
        Err(Error::NoVariant {
            conditions: describe_conditions(&self.profiles, known.entries()),
        })
    }

    /// Runs the condition program `c` on the run's inputs: its one bool.
    fn condition(
        &self,
        c: usize,
        arena: &mut AlignedBuf,
        pool: Option<&Pool>,
        write_inputs: &mut dyn FnMut(&Pick, &mut AlignedBuf) -> Result<(), Error>,
    ) -> Result<bool, Error> {
        write_inputs(&Pick::exact(c), arena)?;
        self.execute(c, arena, pool)?;
        // The decoder checked that a condition program has one
        // one-element bool output inside the arena.
        let out = &self.profiles[c].outputs[0];
        Ok(arena.as_slice()[out.arena_offset as usize] != 0)
    }

    /// [`Error::NoProfile`] for inputs described as `given`.
    pub(crate) fn no_profile(&self, given: String) -> Error {
        let mut available: Vec<String> = Vec::new();
        for p in self.profiles.iter().filter(|p| p.role.is_selectable()) {
            let described = p.describe_inputs();
            if !available.contains(&described) {
                available.push(described);
            }
        }
        Error::NoProfile { given, available }
    }

    /// The profile for inputs of these (declared index, dtype, shape): the
    /// first of exactly these shapes, else the smallest (by arena) that
    /// the paddable dims make fit; `None` when no profile fits.
    pub(crate) fn pick<'s, I>(&self, given: impl Fn() -> I) -> Option<Pick>
    where
        I: Iterator<Item = (usize, crate::DType, &'s [u64])>,
    {
        let exact = (self.profiles.iter()).position(|p| {
            p.role.is_selectable()
                && given().all(|(i, dtype, shape)| {
                    p.inputs[i].dtype == dtype && p.inputs[i].shape.as_slice() == shape
                })
        });
        if let Some(p) = exact {
            return Some(Pick::exact(p));
        }
        let mut best: Option<(u64, Pick)> = None;
        for (p, profile) in self.profiles.iter().enumerate() {
            if self.padding.is_empty() {
                break;
            }
            if !matches!(profile.role, Role::Model { .. }) {
                continue;
            }
            let Some(real) = self.padded_fit(profile, given()) else {
                continue;
            };
            if best
                .as_ref()
                .is_none_or(|(cost, _)| profile.arena_size < *cost)
            {
                best = Some((
                    profile.arena_size,
                    Pick {
                        profile: p,
                        real,
                        lengths: Vec::new(),
                    },
                ));
            }
        }
        best.map(|(_, pick)| pick)
    }

    /// The run's size along each paddable dim when `profile` can take the
    /// inputs padded: other dims equal, padded ones between 1 and the
    /// profile's, one size per dim across inputs.
    fn padded_fit<'s>(
        &self,
        profile: &Profile,
        given: impl Iterator<Item = (usize, crate::DType, &'s [u64])>,
    ) -> Option<Vec<Option<u64>>> {
        let mut real = vec![None; self.padding.len()];
        for (i, dtype, shape) in given {
            let spec = &profile.inputs[i];
            if spec.dtype != dtype || spec.shape.len() != shape.len() {
                return None;
            }
            for (axis, (&n, &full)) in shape.iter().zip(&spec.shape).enumerate() {
                let dim = (self.padding.iter()).position(|d| d.inputs[i] == Some(axis as u32));
                match dim {
                    None if n != full => return None,
                    None => {}
                    Some(_) if n == 0 || n > full => return None,
                    Some(d) => match real[d] {
                        Some(m) if m != n => return None,
                        _ => real[d] = Some(n),
                    },
                }
            }
        }
        Some(real)
    }

    /// The shape of input `i` in a run picked as `pick`.
    pub(crate) fn input_shape(&self, pick: &Pick, i: usize) -> Vec<u64> {
        let spec = &self.profiles[pick.profile].inputs[i];
        self.real_shape(pick, &spec.shape, |d| d.inputs[i])
    }

    /// The shape of output `i` in a run picked as `pick`: cut back where
    /// it pads, and to the lengths the run measured (before the run, a
    /// bounded output has its bound).
    pub(crate) fn output_shape(&self, pick: &Pick, i: usize) -> Vec<u64> {
        let profile = &self.profiles[pick.profile];
        let mut shape = self.real_shape(pick, &profile.outputs[i].shape, |d| d.outputs[i]);
        for (b, &length) in profile.bounded.iter().zip(&pick.lengths) {
            if b.output as usize == i {
                shape[b.axis as usize] = length;
            }
        }
        shape
    }

    /// Whether `profile` has outputs whose size depends on the data.
    pub(crate) fn has_bounded_outputs(&self, profile: usize) -> bool {
        !self.profiles[profile].bounded.is_empty()
    }

    /// `full` with the axis `axis_of` each padded dim gives replaced by the
    /// run's size.
    fn real_shape(
        &self,
        pick: &Pick,
        full: &[u64],
        axis_of: impl Fn(&PaddableDim) -> Option<u32>,
    ) -> Vec<u64> {
        let mut shape = full.to_vec();
        for (d, real) in self.padding.iter().zip(&pick.real) {
            if let (Some(axis), Some(n)) = (axis_of(d), real) {
                shape[axis as usize] = *n;
            }
        }
        shape
    }

    /// Checks `inputs` against the inputs of `pick` and copies them into
    /// the arena (padded with zeros where `pick` pads).
    pub(crate) fn bind_inputs(
        &self,
        pick: &Pick,
        arena: &mut AlignedBuf,
        inputs: &[TensorRef<'_>],
    ) -> Result<(), Error> {
        let specs = &self.profiles[pick.profile].inputs;
        if pick.real.is_empty() {
            return self.input_names.bind(specs, inputs, |i, given| {
                arena.as_mut_slice()[arena_range(&specs[i])].copy_from_slice(given.data);
                Ok(())
            });
        }
        self.input_names.each(specs, inputs, |i, given| {
            let spec = TensorSpec {
                shape: self.input_shape(pick, i),
                ..specs[i].clone()
            };
            check_input(&spec, given)?;
            self.write_input(pick, arena, i, given.data);
            Ok(())
        })
    }

    /// Writes the bytes of input `i` (of the run's shape) into its slot of
    /// `pick`'s profile, zeros in the padding.
    pub(crate) fn write_input(&self, pick: &Pick, arena: &mut AlignedBuf, i: usize, data: &[u8]) {
        let spec = &self.profiles[pick.profile].inputs[i];
        let slot = &mut arena.as_mut_slice()[arena_range(spec)];
        if pick.real.is_empty() {
            slot.copy_from_slice(data);
            return;
        }
        slot.fill(0);
        let real = self.input_shape(pick, i);
        copy_box(
            data,
            &real,
            slot,
            &spec.shape,
            spec.dtype.size_bytes(),
            true,
        );
    }

    /// Reads output `i` of `pick` from the arena into `out` (its run's
    /// shape: cut back where `pick` pads).
    pub(crate) fn read_output(&self, pick: &Pick, arena: &AlignedBuf, i: usize, out: &mut [u8]) {
        let spec = &self.profiles[pick.profile].outputs[i];
        let slot = &arena.as_slice()[arena_range(spec)];
        if pick.real.is_empty() && pick.lengths.is_empty() {
            out.copy_from_slice(slot);
            return;
        }
        let real = self.output_shape(pick, i);
        copy_box(
            slot,
            &spec.shape,
            out,
            &real,
            spec.dtype.size_bytes(),
            false,
        );
    }

    /// Errors unless `lens` are the byte sizes of the outputs of `pick`.
    fn check_output_buffers(
        &self,
        pick: &Pick,
        lens: impl ExactSizeIterator<Item = usize>,
    ) -> Result<(), Error> {
        let specs = &self.profiles[pick.profile].outputs;
        if lens.len() != specs.len() {
            return Err(Error::OutputCount {
                expected: specs.len(),
                given: lens.len(),
            });
        }
        let profile = &self.profiles[pick.profile];
        for (i, (spec, len)) in specs.iter().zip(lens).enumerate() {
            // Checked once the run has measured its length.
            if profile.bounded.iter().any(|b| b.output as usize == i) {
                continue;
            }
            let spec = match pick.real.is_empty() {
                true => spec.clone(),
                false => TensorSpec {
                    shape: self.output_shape(pick, i),
                    ..spec.clone()
                },
            };
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

    /// The input specs of `profile`.
    pub(crate) fn inputs_of(&self, profile: usize) -> &[TensorSpec] {
        &self.profiles[profile].inputs
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

/// Copies the row-major box of shape `inner` between a tensor of shape
/// `inner` and one of shape `outer` (`inner[k] <= outer[k]`), elements of
/// `elem` bytes: from the small tensor into the large one when `grow`,
/// else back. Whole innermost rows at a time.
fn copy_box(
    src: &[u8],
    src_shape: &[u64],
    dst: &mut [u8],
    dst_shape: &[u64],
    elem: usize,
    grow: bool,
) {
    let (inner, outer) = if grow {
        (src_shape, dst_shape)
    } else {
        (dst_shape, src_shape)
    };
    let rank = inner.len();
    if rank == 0 {
        dst[..elem].copy_from_slice(&src[..elem]);
        return;
    }
    let row = inner[rank - 1] as usize * elem;
    let rows: u64 = inner[..rank - 1].iter().product();
    let mut index = vec![0u64; rank - 1];
    for _ in 0..rows {
        // Element offsets of the row's start in each tensor.
        let (mut at_inner, mut at_outer) = (0u64, 0u64);
        for k in 0..rank - 1 {
            at_inner = at_inner * inner[k] + index[k];
            at_outer = at_outer * outer[k] + index[k];
        }
        let at_inner = (at_inner * inner[rank - 1]) as usize * elem;
        let at_outer = (at_outer * outer[rank - 1]) as usize * elem;
        let (from, to) = if grow {
            (at_inner, at_outer)
        } else {
            (at_outer, at_inner)
        };
        dst[to..to + row].copy_from_slice(&src[from..from + row]);
        for k in (0..rank - 1).rev() {
            index[k] += 1;
            if index[k] < inner[k] {
                break;
            }
            index[k] = 0;
        }
    }
}
