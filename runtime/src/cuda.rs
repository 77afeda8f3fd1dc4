//! Running CUDA artifacts (feature `cuda`).
//!
//! The CUDA driver is loaded at run time through `cudarc`'s dynamic
//! loading, so this module builds everywhere; [`CudaModel::load`] first
//! checks that `libcuda` can be loaded at all (cudarc panics on its first
//! driver call otherwise) and answers [`Error::NoCudaDriver`] when it
//! cannot. On a GPU older than the artifact's SM it answers
//! [`Error::CudaSmTooOld`].
//!
//! Loading uses GPU 0's context (made by the first load and kept for the
//! process, so models loaded one after another do not each create and
//! destroy it), loads the module (the cubin when it
//! was assembled for exactly this GPU's SM, else the PTX, which the driver
//! compiles), looks up every kernel, uploads the weights once and
//! allocates the device arena once. [`CudaModel::run`] copies the inputs to
//! their arena offsets, launches the schedule on one stream with each
//! kernel's compile-time launch plan and the `(arena, weights)` pointers,
//! and copies the outputs back. The arena's status word (set by a Gather
//! that meets an out-of-range index) is cleared before and read after.
//!
//! [`CudaModel::capture_graph`] records the schedule's launches once into a
//! CUDA graph; runs then replay it with one `cuGraphLaunch` instead of one
//! `cuLaunchKernel` per kernel, which removes the per-kernel CPU launch
//! cost (about 2–5 µs each) that dominates small models. The capture is
//! valid for the model's lifetime because the arena and the weights are
//! allocated once and never move.

use std::ffi::{c_void, CString};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::{
    result, sys, CudaContext, CudaGraph, CudaSlice, CudaStream, DevicePtr, DevicePtrMut,
};

use crate::file::read_private;
use crate::format::{ArtifactView, Code, Profile, TensorSpec};
use crate::model::InputNames;
use crate::{Error, Tensor, TensorRef, KERNEL_INDEX_OUT_OF_RANGE};

/// Bytes of the arena's status word.
const STATUS_BYTES: usize = 4;

/// A loaded module, unloaded on drop.
struct Module {
    handle: sys::CUmodule,
    ctx: Arc<CudaContext>,
}

impl Drop for Module {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: the handle came from `load_data` and is unloaded once.
        let _ = unsafe { result::module::unload(self.handle) };
    }
}

/// One kernel launch of the schedule.
struct Launch {
    function: sys::CUfunction,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    shared_bytes: u32,
}

/// A CUDA artifact loaded on GPU 0.
pub struct CudaModel {
    /// The one profile (a CUDA artifact has one).
    profile: Profile,
    /// The inputs by name, for matching a run's inputs.
    input_names: InputNames,
    launches: Vec<Launch>,
    /// Source nodes of the Gather kernels, for the out-of-range error.
    gather_nodes: Vec<String>,
    device_sm: u32,
    device_name: String,
    // Field order is drop order: the graph (which refers to the module's
    // kernels), the buffers and the module before the stream and the
    // context.
    graph: Option<CudaGraph>,
    arena: CudaSlice<u8>,
    weights: CudaSlice<u8>,
    _module: Module,
    stream: Arc<CudaStream>,
    _ctx: Arc<CudaContext>,
}

fn driver(what: &'static str) -> impl Fn(result::DriverError) -> Error {
    move |e| Error::CudaDriver {
        what,
        message: e.to_string(),
    }
}

/// The SM (compute capability times ten) and name of GPU 0, for picking
/// the compile target on this machine.
pub fn gpu() -> Result<(u32, String), Error> {
    let (_, sm, name) = open_gpu0()?;
    Ok((sm, name))
}

/// GPU 0's (primary) context with its SM and name. The context is made
/// once and kept for the process: every model loaded afterwards shares
/// it, where a context per model would be created and destroyed with
/// each one (on the H200, twelve processes loading conformance cases
/// that way took 3 s a case; with a context kept, 0.08 s). As with any
/// context that live models share, a kernel fault spoils it for the rest
/// of the process.
fn open_gpu0() -> Result<(Arc<CudaContext>, u32, String), Error> {
    static CONTEXT: Mutex<Option<Arc<CudaContext>>> = Mutex::new(None);
    // SAFETY: only tries to open the driver library by its names.
    if !unsafe { sys::is_culib_present() } {
        return Err(Error::NoCudaDriver);
    }
    let ctx = {
        let mut kept = CONTEXT.lock().unwrap_or_else(PoisonError::into_inner);
        match &*kept {
            Some(ctx) => Arc::clone(ctx),
            None => {
                let ctx = CudaContext::new(0).map_err(driver("open GPU 0"))?;
                *kept = Some(Arc::clone(&ctx));
                ctx
            }
        }
    };
    let (major, minor) = ctx.compute_capability().map_err(driver("query the GPU"))?;
    let name = ctx.name().unwrap_or_else(|_| "GPU 0".into());
    Ok((ctx, (major * 10 + minor) as u32, name))
}

impl CudaModel {
    /// Reads and loads the CUDA artifact at `path`.
    pub fn load(path: impl AsRef<Path>) -> Result<CudaModel, Error> {
        CudaModel::from_bytes(read_private(path.as_ref())?.as_slice())
    }

    /// Like [`CudaModel::load`], but first requires the artifact's detached
    /// signature to verify with `key`, on the same bytes that are then
    /// loaded (as [`Model::load_verified`](crate::Model::load_verified)).
    #[cfg(feature = "signing")]
    pub fn load_verified(
        path: impl AsRef<Path>,
        key: &crate::PublicKey,
    ) -> Result<CudaModel, Error> {
        let path = path.as_ref();
        let file = read_private(path)?;
        let header = crate::format::read_header(file.as_slice())?;
        crate::signing::verify_detached(path, &header.content_hash, key)?;
        CudaModel::from_bytes(file.as_slice())
    }

    /// Validates a CUDA artifact held in memory and loads it on GPU 0.
    pub fn from_bytes(bytes: &[u8]) -> Result<CudaModel, Error> {
        let view = ArtifactView::parse(bytes)?;
        let code = match view.code()? {
            Code::Cuda(code) => code,
            Code::Machine { .. } => {
                return Err(Error::NotCudaArtifact {
                    arch: view.header.arch,
                })
            }
        };
        let (ctx, device_sm, device_name) = open_gpu0()?;
        if device_sm < code.sm {
            return Err(Error::CudaSmTooOld {
                device: device_sm,
                device_name,
                artifact: code.sm,
            });
        }
        ctx.bind_to_thread().map_err(driver("use GPU 0"))?;
        // The cubin runs only on the SM it was assembled for, and only on a
        // driver that accepts its toolkit's ELF; otherwise (or when loading
        // it fails) the driver compiles the PTX for this GPU.
        let ptx = CString::new(code.ptx.clone()).map_err(|_| Error::CudaDriver {
            what: "load the module",
            message: "the PTX text contains a NUL byte".into(),
        })?;
        let load = |image: &[u8]| {
            // SAFETY: `image` is a cubin or a NUL-terminated PTX text, alive
            // for the call.
            unsafe { result::module::load_data(image.as_ptr() as *const c_void) }
        };
        let from_cubin = (!code.cubin.is_empty() && device_sm == code.sm)
            .then(|| load(&code.cubin).ok())
            .flatten();
        let handle = match from_cubin {
            Some(h) => h,
            None => load(ptx.as_bytes_with_nul()).map_err(driver("load the module"))?,
        };
        let module = Module {
            handle,
            ctx: ctx.clone(),
        };
        let mut launches = Vec::with_capacity(code.schedule.len());
        for &k in &code.schedule {
            let k = &code.kernels[k as usize];
            let name = CString::new(k.name.clone()).map_err(|_| Error::CudaDriver {
                what: "find a kernel",
                message: format!("kernel name {:?} contains a NUL byte", k.name),
            })?;
            // SAFETY: the module is loaded.
            let function = unsafe { result::module::get_function(module.handle, name) }
                .map_err(driver("find a kernel"))?;
            launches.push(Launch {
                function,
                grid: (k.grid[0], k.grid[1], k.grid[2]),
                block: (k.block[0], k.block[1], k.block[2]),
                shared_bytes: k.shared_bytes,
            });
        }
        let gather_nodes = code
            .kernels
            .iter()
            .filter(|k| k.name.contains("gather") || k.node.to_lowercase().contains("gather"))
            .map(|k| k.node.clone())
            .collect();
        // A stream of its own: the legacy default stream cannot be captured
        // into a graph.
        let stream = ctx.new_stream().map_err(driver("create a stream"))?;
        // SAFETY: every buffer of this model is allocated, used and freed on
        // this one stream, so cudarc's cross-stream event tracking (events
        // recorded and waited on around each use, which a graph capture
        // must not see) has nothing to order.
        unsafe { ctx.disable_event_tracking() };
        // Zero-sized allocations are refused by the driver: keep one byte.
        let weights = if view.weights.is_empty() {
            stream.alloc_zeros::<u8>(1)
        } else {
            stream.clone_htod(view.weights)
        }
        .map_err(driver("upload the weights"))?;
        let profile = view.profiles[0].clone();
        let arena_bytes = usize::try_from(profile.arena_size)
            .ok()
            .filter(|&n| n >= STATUS_BYTES)
            .ok_or(Error::OutOfMemory {
                what: "arena",
                bytes: profile.arena_size,
            })?;
        let arena = stream
            .alloc_zeros::<u8>(arena_bytes)
            .map_err(driver("allocate the device arena"))?;
        Ok(CudaModel {
            input_names: InputNames::new(&profile.inputs),
            profile,
            launches,
            gather_nodes,
            device_sm,
            device_name,
            graph: None,
            arena,
            weights,
            _module: module,
            stream,
            _ctx: ctx,
        })
    }

    /// The model's inputs, in declared order.
    pub fn inputs(&self) -> &[TensorSpec] {
        &self.profile.inputs
    }

    /// The model's outputs, in declared order.
    pub fn outputs(&self) -> &[TensorSpec] {
        &self.profile.outputs
    }

    /// The GPU's SM (compute capability times ten) and name.
    pub fn device(&self) -> (u32, &str) {
        (self.device_sm, &self.device_name)
    }

    /// Runs one inference: every declared input exactly once (any order);
    /// the outputs in declared order.
    pub fn run(&mut self, inputs: &[TensorRef<'_>]) -> Result<Vec<Tensor>, Error> {
        let stream = self.stream.clone();
        let copy_in = driver("copy inputs to the GPU");
        stream
            .memcpy_htod(
                &[0u8; STATUS_BYTES],
                &mut self.arena.slice_mut(0..STATUS_BYTES),
            )
            .map_err(&copy_in)?;
        let (names, specs, arena) = (&self.input_names, &self.profile.inputs, &mut self.arena);
        names.bind(specs, inputs, |i, given| {
            let start = specs[i].arena_offset as usize;
            let mut dst = arena.slice_mut(start..start + given.data.len());
            stream.memcpy_htod(given.data, &mut dst).map_err(&copy_in)
        })?;
        match &self.graph {
            Some(graph) => graph.launch().map_err(driver("launch the CUDA graph"))?,
            None => self.launch_schedule()?,
        }
        let copy_out = driver("copy outputs from the GPU");
        let mut status = [0u8; STATUS_BYTES];
        stream
            .memcpy_dtoh(&self.arena.slice(0..STATUS_BYTES), &mut status)
            .map_err(&copy_out)?;
        let mut outputs = Vec::with_capacity(self.profile.outputs.len());
        for spec in &self.profile.outputs {
            let start = spec.arena_offset as usize;
            let mut data = vec![0u8; spec.byte_len() as usize];
            stream
                .memcpy_dtoh(&self.arena.slice(start..start + data.len()), &mut data)
                .map_err(&copy_out)?;
            outputs.push(Tensor {
                name: spec.name.clone(),
                dtype: spec.dtype,
                shape: spec.shape.clone(),
                data,
            });
        }
        stream.synchronize().map_err(driver("run the schedule"))?;
        if status != [0; STATUS_BYTES] {
            return Err(Error::Kernel {
                node: self.gather_nodes.join(" or "),
                code: KERNEL_INDEX_OUT_OF_RANGE,
            });
        }
        Ok(outputs)
    }
}

impl CudaModel {
    /// Launches every kernel of the schedule on the model's stream.
    fn launch_schedule(&mut self) -> Result<(), Error> {
        let stream = self.stream.clone();
        let (arena, _arena_sync) = self.arena.device_ptr_mut(&stream);
        let (weights, _weights_sync) = self.weights.device_ptr(&stream);
        for l in &self.launches {
            let (mut a, mut w) = (arena, weights);
            let mut params = [
                &mut a as *mut sys::CUdeviceptr as *mut c_void,
                &mut w as *mut sys::CUdeviceptr as *mut c_void,
            ];
            // SAFETY: every kernel takes exactly (u64 arena, u64 weights);
            // the launch plan was computed by the compiler for these
            // buffers, whose sizes the artifact records.
            unsafe {
                result::launch_kernel(
                    l.function,
                    l.grid,
                    l.block,
                    l.shared_bytes,
                    stream.cu_stream(),
                    &mut params,
                )
            }
            .map_err(driver("launch a kernel"))?;
        }
        Ok(())
    }

    /// Captures the schedule into a CUDA graph that later runs replay (see
    /// the module documentation). Idempotent.
    pub fn capture_graph(&mut self) -> Result<(), Error> {
        if self.graph.is_some() {
            return Ok(());
        }
        let stream = self.stream.clone();
        // Pending work (the weight upload) must not end up in the graph.
        stream
            .synchronize()
            .map_err(driver("prepare the graph capture"))?;
        stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(driver("begin the graph capture"))?;
        let launched = self.launch_schedule();
        // End the capture even when a launch failed, so the stream is usable.
        let ended = stream.end_capture(sys::CUgraphInstantiate_flags(0));
        launched?;
        let graph = ended.map_err(driver("instantiate the CUDA graph"))?;
        if let Some(g) = &graph {
            g.upload().map_err(driver("upload the CUDA graph"))?;
        }
        self.graph = graph;
        Ok(())
    }

    /// Whether runs replay a captured CUDA graph.
    pub fn uses_graph(&self) -> bool {
        self.graph.is_some()
    }
}

impl std::fmt::Debug for CudaModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaModel")
            .field("device", &self.device_name)
            .field("sm", &self.device_sm)
            .field("inputs", &self.profile.inputs)
            .field("outputs", &self.profile.outputs)
            .field("launches", &self.launches.len())
            .finish_non_exhaustive()
    }
}
