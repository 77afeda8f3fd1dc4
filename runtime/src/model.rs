//! A loaded model: validated artifact, relocated code, weights, arena.

use std::fmt;
use std::fs::File;
use std::path::Path;

use crate::code::{CodeMemory, KernelFn};
use crate::format::{
    read_header, Arch, ArtifactView, CpuFeatures, Header, Metadata, SectionKind, TensorSpec,
};
use crate::memory::{AlignedBuf, Weights};
use crate::{Error, Tensor, TensorRef};

/// A model ready to run.
///
/// `Model` is `Send` and `Sync`: it can move between threads, and shared
/// references only read metadata. [`Model::run`] takes `&mut self` because
/// every inference uses the one arena allocated at load time; run models
/// concurrently by loading one `Model` per thread (or behind a `Mutex`).
///
/// An artifact is machine code: load only artifacts you trust, as you would
/// a shared library. Loading checks integrity (checksums, bounds, CPU
/// features), not what the code does.
pub struct Model {
    metadata: Metadata,
    content_hash: [u8; 32],
    features: CpuFeatures,
    /// Source node name of each schedule step, for error messages.
    step_nodes: Vec<String>,
    /// Entry point of each schedule step; valid while `code` lives.
    step_entries: Vec<KernelFn>,
    /// Keeps the mapping that `step_entries` point into alive.
    _code: CodeMemory,
    weights: Weights,
    arena: AlignedBuf,
}

impl Model {
    /// Maps the artifact at `path`, validates it and prepares it to run.
    ///
    /// The weights stay in the file mapping; the file must not be modified
    /// while the model is loaded.
    pub fn load(path: impl AsRef<Path>) -> Result<Model, Error> {
        let path = path.as_ref();
        let io_err = |source| Error::Io {
            path: path.to_owned(),
            source,
        };
        let file = File::open(path).map_err(io_err)?;
        // SAFETY: the mapping is read-only; like every user of mmap, we rely
        // on the file not being truncated or modified while mapped (see the
        // doc comment above).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io_err)?;
        let (model, weights_range) = Model::prepare(&map)?;
        let weights = Weights::from_map(map, weights_range)?;
        Ok(model(weights))
    }

    /// Validates an artifact held in memory and prepares it to run
    /// (the weights are copied).
    pub fn from_bytes(bytes: &[u8]) -> Result<Model, Error> {
        let (model, weights_range) = Model::prepare(bytes)?;
        let weights = Weights::Owned(AlignedBuf::copy_of(&bytes[weights_range], "weights")?);
        Ok(model(weights))
    }

    /// Everything but the weights: checks the header, the architecture and
    /// the CPU features before mapping any code, then validates the
    /// sections, allocates the arena and maps the code. Returns a
    /// constructor taking the weights, and the weights' range in `bytes`.
    fn prepare(
        bytes: &[u8],
    ) -> Result<(impl FnOnce(Weights) -> Model, std::ops::Range<usize>), Error> {
        let header = read_header(bytes)?;
        check_host(&header)?;
        let view = ArtifactView::parse(bytes)?;
        let arena = AlignedBuf::zeroed(view.metadata.arena_size, "arena")?;
        let code = CodeMemory::new(view.text, &view.kernels, &view.relocs)?;
        let step_entries = (view.schedule.iter())
            .map(|s| code.entry(&view.kernels[s.kernel as usize]))
            .collect();
        let weights_section = view.header.section(SectionKind::Weights);
        // Inside `bytes`, as `read_header` checked.
        let start = weights_section.offset as usize;
        let range = start..start + weights_section.length as usize;
        let ArtifactView {
            header,
            metadata,
            schedule,
            ..
        } = view;
        let model = move |weights| Model {
            metadata,
            content_hash: header.content_hash,
            features: header.features,
            step_nodes: schedule.into_iter().map(|s| s.node).collect(),
            step_entries,
            _code: code,
            weights,
            arena,
        };
        Ok((model, range))
    }

    /// The model's inputs, in declared order.
    pub fn inputs(&self) -> &[TensorSpec] {
        &self.metadata.inputs
    }

    /// The model's outputs, in declared order.
    pub fn outputs(&self) -> &[TensorSpec] {
        &self.metadata.outputs
    }

    /// Provenance, inputs, outputs and arena size.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// The artifact's content hash (see
    /// [`Header::content_hash`](crate::format::Header::content_hash)).
    pub fn content_hash(&self) -> [u8; 32] {
        self.content_hash
    }

    /// The CPU features the artifact requires.
    pub fn required_features(&self) -> CpuFeatures {
        self.features
    }

    /// Runs one inference. Every declared input must be given exactly once
    /// (in any order); returns the outputs in declared order.
    pub fn run(&mut self, inputs: &[TensorRef<'_>]) -> Result<Vec<Tensor>, Error> {
        self.bind_inputs(inputs)?;
        self.execute()?;
        let outputs = (0..self.metadata.outputs.len()).map(|i| {
            let spec = &self.metadata.outputs[i];
            Tensor {
                name: spec.name.clone(),
                dtype: spec.dtype,
                shape: spec.shape.clone(),
                data: self.output_bytes(i).to_vec(),
            }
        });
        Ok(outputs.collect())
    }

    /// Runs one inference without allocating: inputs as in [`Model::run`],
    /// outputs written to `outputs` (one buffer per declared output, in
    /// declared order, each exactly the output's byte size).
    pub fn run_into(
        &mut self,
        inputs: &[TensorRef<'_>],
        outputs: &mut [&mut [u8]],
    ) -> Result<(), Error> {
        self.check_output_buffers(outputs.iter().map(|b| b.len()))?;
        self.bind_inputs(inputs)?;
        self.execute()?;
        for (i, out) in outputs.iter_mut().enumerate() {
            out.copy_from_slice(self.output_bytes(i));
        }
        Ok(())
    }

    /// Checks `inputs` against the declared inputs and copies them into
    /// the arena.
    fn bind_inputs(&mut self, inputs: &[TensorRef<'_>]) -> Result<(), Error> {
        validate_inputs(&self.metadata.inputs, inputs)?;
        let specs = &self.metadata.inputs;
        for i in 0..specs.len() {
            let name = &self.metadata.inputs[i].name;
            // Found: every spec was matched above.
            if let Some(given) = inputs.iter().find(|t| t.name == name.as_str()) {
                let data = given.data;
                self.input_slot(i).copy_from_slice(data);
            }
        }
        Ok(())
    }

    /// Errors unless `lens` are the byte sizes of the outputs.
    pub(crate) fn check_output_buffers(
        &self,
        lens: impl ExactSizeIterator<Item = usize>,
    ) -> Result<(), Error> {
        let specs = &self.metadata.outputs;
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

    /// The arena bytes of input `i`.
    pub(crate) fn input_slot(&mut self, i: usize) -> &mut [u8] {
        let range = arena_range(&self.metadata.inputs[i]);
        &mut self.arena.as_mut_slice()[range]
    }

    /// The arena bytes of output `i`.
    pub(crate) fn output_bytes(&self, i: usize) -> &[u8] {
        &self.arena.as_slice()[arena_range(&self.metadata.outputs[i])]
    }

    /// Calls the schedule's kernels in order.
    pub(crate) fn execute(&mut self) -> Result<(), Error> {
        let arena = self.arena.as_mut_ptr();
        let weights = self.weights.as_ptr();
        for (i, entry) in self.step_entries.iter().enumerate() {
            // SAFETY: `entry` points into `self.code`, which is alive; the
            // arena and weights are the buffers the artifact was compiled
            // against (sizes validated at load). What the code does is the
            // artifact's responsibility (see the type's documentation).
            let code = unsafe { entry(arena, weights) };
            if code != 0 {
                return Err(Error::Kernel {
                    node: self.step_nodes[i].clone(),
                    code,
                });
            }
        }
        Ok(())
    }
}

/// Errors unless every declared input is given exactly once, by name, with
/// its declared type and data length.
pub(crate) fn validate_inputs(specs: &[TensorSpec], inputs: &[TensorRef<'_>]) -> Result<(), Error> {
    for (i, given) in inputs.iter().enumerate() {
        if !specs.iter().any(|s| s.name == given.name) {
            let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
            return Err(Error::UnknownInput {
                name: given.name.to_owned(),
                expected: names.join(", "),
            });
        }
        if inputs[..i].iter().any(|o| o.name == given.name) {
            return Err(Error::DuplicateInput(given.name.to_owned()));
        }
    }
    for spec in specs {
        let Some(given) = inputs.iter().find(|t| t.name == spec.name) else {
            return Err(Error::MissingInput {
                name: spec.name.clone(),
                expected: spec.type_string(),
            });
        };
        check_input(spec, given)?;
    }
    Ok(())
}

/// The arena range of a validated tensor spec.
fn arena_range(spec: &TensorSpec) -> std::ops::Range<usize> {
    // Parsing checked offset + byte_len <= arena_size, and the arena of that
    // size was allocated, so both fit in usize.
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
        f.debug_struct("Model")
            .field("inputs", &self.metadata.inputs)
            .field("outputs", &self.metadata.outputs)
            .field("arena_size", &self.metadata.arena_size)
            .field("steps", &self.step_nodes.len())
            .finish_non_exhaustive()
    }
}
