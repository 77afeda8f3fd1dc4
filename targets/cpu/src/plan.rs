//! Memory plan: where every value lives (weights blob or arena) and which
//! kernels run, in order.
//!
//! Constants go to the weights blob. Every other value lives in one arena,
//! placed by liveness (the `plan-memory` step):
//!
//! 1. **Schedule.** Kernels run in the order [`kiln_ir::schedule`] chose for
//!    the smallest peak of live bytes, then the output copies. Graph inputs
//!    are written at step 0, kernel `k` runs at step `k + 1`.
//! 2. **Liveness.** A value is live from the step that writes it to the last
//!    step that reads it; graph outputs stay live to the end. A Reshape that
//!    aliases its input joins the input's buffer, so the buffer lives until
//!    the alias's last use too.
//! 3. **In place.** An elementwise kernel (unary, binary, same-size cast)
//!    writes over an input whose buffer dies at that step when the input has
//!    the output's element count and element size: the lowering then reads
//!    each element before it writes the same element (see
//!    `lower/elementwise.rs`, `map`). The output joins the input's buffer.
//! 4. **Offsets.** Buffers are packed by [`pack::pack`]: greedy best fit,
//!    largest first, 64-byte aligned, reusing the space of dead buffers.
//!    Each job's kernel scratch (im2col matrices, B panels, staged f32
//!    results), measured by a first lowering, is packed with them as a
//!    buffer live at its step only.
//!
//! [`memory_plan`] exposes the plan of the values (and [`PlanStats`])
//! without compiling; the artifact's arena adds the scratch.

use kiln_ir::arena as pack;

use std::cell::RefCell;
use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};

use kiln_format::TensorSpec;
use kiln_ir::{Graph, NodeId, Op};

use crate::CpuError;

/// Which pointer an address is relative to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Base {
    /// The arena (first kernel argument).
    Arena,
    /// The weights (second kernel argument).
    Weights,
}

/// The place of a tensor: a byte offset from a base pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Loc {
    /// Base pointer.
    pub base: Base,
    /// Byte offset.
    pub offset: u64,
}

impl Loc {
    /// The place `bytes` further on (back, when negative).
    pub(crate) fn moved(self, bytes: i64) -> Loc {
        Loc {
            base: self.base,
            offset: (self.offset as i64 + bytes) as u64,
        }
    }
}

/// One kernel to generate.
#[derive(Clone, Debug)]
pub(crate) enum Job {
    /// The kernel computing a node's value.
    Node(NodeId),
    /// A plain copy of `bytes` bytes (an output that is an input, a constant
    /// or shared with another output).
    Copy {
        /// Name for diagnostics (`output:<name>`).
        name: String,
        /// Source.
        src: Loc,
        /// Destination (arena).
        dst: Loc,
        /// Length in bytes.
        bytes: u64,
    },
}

impl Job {
    /// The kernel's name (node name, or `output:<name>` for copies).
    pub(crate) fn name(&self, graph: &Graph) -> String {
        match self {
            Job::Node(id) => graph.node(*id).name.clone(),
            Job::Copy { name, .. } => name.clone(),
        }
    }
}

/// The weights blob under construction: 64-byte aligned entries, identical
/// entries stored once.
#[derive(Default)]
pub(crate) struct Weights {
    bytes: Vec<u8>,
    index: HashMap<u64, Vec<(u64, usize)>>,
    /// Offsets only, nothing stored (the length so far): the weights of a
    /// plan whose code is thrown away, so that measuring does not copy and
    /// hash every constant.
    measuring: Option<u64>,
    /// The tile side (see [`Weights::shared_side`]) with which an
    /// earlier profile packed each constant, by packing key.
    earlier_sides: HashMap<String, usize>,
    /// The same, for the profile being compiled.
    current_sides: HashMap<String, usize>,
}

impl Weights {
    /// A blob that only hands out offsets.
    pub(crate) fn measuring() -> Weights {
        Weights {
            measuring: Some(0),
            ..Weights::default()
        }
    }

    /// A measuring blob that packs constants as this one would (the same
    /// earlier profiles' tile sides), for measuring a profile's scratch.
    pub(crate) fn measuring_twin(&self) -> Weights {
        Weights {
            measuring: Some(0),
            earlier_sides: self.earlier_sides.clone(),
            ..Weights::default()
        }
    }

    /// The tile side (rows of a packed A, vectors of a packed B) with which
    /// to pack a constant (`key` names it and how it is packed): `choose`
    /// returns a tile and its side, given `None` to choose freely or the
    /// side an earlier profile packed the same constant with, so that every
    /// profile reads the same packed bytes, stored once. In an artifact of
    /// one profile nothing is fixed.
    pub(crate) fn shared_side<T>(
        &mut self,
        key: String,
        choose: impl FnOnce(Option<usize>) -> (T, usize),
    ) -> T {
        let (tile, side) = choose(self.earlier_sides.get(&key).copied());
        self.current_sides.entry(key).or_insert(side);
        tile
    }

    /// Ends a profile: the tile sides it chose bind later profiles (the
    /// first profile to pack a constant decides).
    pub(crate) fn end_profile(&mut self) {
        for (key, side) in std::mem::take(&mut self.current_sides) {
            self.earlier_sides.entry(key).or_insert(side);
        }
    }

    /// Appends `data` (or finds an identical earlier entry) and returns its
    /// offset.
    pub(crate) fn add(&mut self, data: &[u8]) -> u64 {
        self.measure(data.len() as u64)
            .unwrap_or_else(|| self.store(data))
    }

    /// [`Weights::add`] of the `len` bytes that `data` makes, made only
    /// when the blob stores them (a measuring blob needs the length only).
    pub(crate) fn add_with(&mut self, len: u64, data: impl FnOnce() -> Vec<u8>) -> u64 {
        self.measure(len).unwrap_or_else(|| self.store(&data()))
    }

    /// A measuring blob's offset for `len` more bytes; `None` for a blob
    /// that stores.
    fn measure(&mut self, len: u64) -> Option<u64> {
        let end = self.measuring.as_mut()?;
        let off = align(*end);
        *end = off + len;
        Some(off)
    }

    fn store(&mut self, data: &[u8]) -> u64 {
        let mut h = DefaultHasher::new();
        data.hash(&mut h);
        let key = h.finish();
        if let Some(entries) = self.index.get(&key) {
            for &(off, len) in entries {
                if len == data.len() && &self.bytes[off as usize..off as usize + len] == data {
                    return off;
                }
            }
        }
        let off = align(self.bytes.len() as u64);
        self.bytes.resize(off as usize, 0);
        self.bytes.extend_from_slice(data);
        self.index.entry(key).or_default().push((off, data.len()));
        off
    }

    /// The finished blob.
    pub(crate) fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }
}

/// Which constants a plan places in the weights blob.
#[derive(Clone, Copy)]
pub(crate) enum Constants<'a> {
    /// Every constant (plans that measure).
    All,
    /// Only these, the constants some kernel addresses: a kernel that packs
    /// its weights reads only its packed copy, so the original would be
    /// stored for nothing. The others get the offset [`UNPLACED`].
    Read(&'a HashSet<NodeId>),
}

/// The weights offset of a constant the blob leaves out: far beyond any
/// blob, so that a kernel addressing it anyway is caught
/// ([`weight_reads`]) instead of reading other weights.
pub(crate) const UNPLACED: u64 = 1 << 60;

thread_local! {
    /// The weights offsets addressed by the kernel being lowered, while
    /// [`weight_reads`] records them.
    static WEIGHT_READS: RefCell<Option<Vec<u64>>> = const { RefCell::new(None) };
}

/// Notes that the kernel being lowered addresses `loc`. Every address a
/// kernel forms goes through `Kb::ptr` (Cranelift) or
/// `microkernel::base_register` (machine code), which call this.
pub(crate) fn note_address(loc: Loc) {
    if loc.base == Base::Weights {
        WEIGHT_READS.with(|reads| {
            if let Some(reads) = reads.borrow_mut().as_mut() {
                reads.push(loc.offset);
            }
        });
    }
}

/// Runs `lower` and returns, with its result, the weights offsets it
/// addressed.
pub(crate) fn weight_reads<T>(lower: impl FnOnce() -> T) -> (T, Vec<u64>) {
    let outer = WEIGHT_READS.with(|r| r.replace(Some(Vec::new())));
    let result = lower();
    let reads = WEIGHT_READS.with(|r| r.replace(outer)).unwrap_or_default();
    (result, reads)
}

/// The memory plan of a graph.
pub(crate) struct Plan {
    /// Location of every node's value.
    pub locs: HashMap<NodeId, Loc>,
    /// The weights blob.
    pub weights: Weights,
    /// Arena size in bytes.
    pub arena_size: u64,
    /// Graph inputs, in order.
    pub inputs: Vec<TensorSpec>,
    /// Graph outputs, in order.
    pub outputs: Vec<TensorSpec>,
    /// Kernels, in execution order.
    pub jobs: Vec<Job>,
    /// The arena plan, for inspection and tests.
    pub memory: MemoryPlan,
    /// The scratch of the job being lowered (see [`Plan::scratch_for`]).
    pub scratch: Scratch,
    /// Where each job's scratch starts in the arena and how many bytes it
    /// was given (from the `scratch` sizes [`plan`] packed).
    pub scratch_regions: Vec<(u64, u64)>,
    /// How each dense node lowered so far was lowered (kernel selection,
    /// `lower::select`), in job order.
    pub dense_kernels: Vec<kiln_format::DenseKernel>,
}

/// Scratch memory of one job's kernels (e.g. an im2col matrix): a region
/// of the arena live during that job's step only, packed with the values
/// (none keeps scratch across steps). Lowering a job reserves what it needs
/// from the region [`Plan::scratch_for`] set up.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Scratch {
    /// Arena offset of the region (64-byte aligned).
    pub offset: u64,
    /// The bytes reserved so far.
    pub bytes: u64,
    /// Bytes at the start of the region that [`Scratch::hold`] kept for
    /// all of the job's steps (`offset` starts after them).
    pub held: u64,
}

impl Scratch {
    /// Reserves regions of the given sizes (64-byte aligned, one after the
    /// other) for one schedule step (all its tasks) and returns where each
    /// starts.
    pub(crate) fn reserve(&mut self, sizes: &[u64]) -> Vec<Loc> {
        let mut at = self.offset;
        let locs = sizes
            .iter()
            .map(|&bytes| {
                let loc = Loc {
                    base: Base::Arena,
                    offset: at,
                };
                at += align(bytes);
                loc
            })
            .collect();
        self.bytes = self.bytes.max(self.held + at - self.offset);
        locs
    }

    /// Reserves regions that stay apart from every region reserved after
    /// them ([`Scratch::reserve`] starts each step's regions at the same
    /// place): a Winograd task's transformed tiles, one set per task.
    pub(crate) fn hold(&mut self, sizes: &[u64]) -> Vec<Loc> {
        let locs = self.reserve(sizes);
        let held: u64 = sizes.iter().map(|&b| align(b)).sum();
        self.offset += held;
        self.held += held;
        locs
    }
}

impl Plan {
    /// The constants of `graph` whose bytes hold one of the weights
    /// offsets `reads` (of a plan placing every constant).
    pub(crate) fn constants_at(&self, graph: &Graph, reads: &[u64]) -> HashSet<NodeId> {
        let mut ranges: Vec<(u64, u64, NodeId)> = (self.locs.iter())
            .filter(|(&id, loc)| {
                loc.base == Base::Weights && matches!(graph.node(id).op, Op::Constant(_))
            })
            .map(|(&id, loc)| {
                let end = loc.offset + graph.node(id).ty.size_bytes() as u64;
                (loc.offset, end, id)
            })
            // Empty constants share their offset with the next one; they
            // are always placed (they cost nothing).
            .filter(|&(start, end, _)| end > start)
            .collect();
        ranges.sort_unstable_by_key(|r| r.0);
        let mut read = HashSet::new();
        for &offset in reads {
            let after = ranges.partition_point(|r| r.0 <= offset);
            if let Some(&(_, end, id)) = after.checked_sub(1).map(|i| &ranges[i]) {
                if offset < end {
                    read.insert(id);
                }
            }
        }
        read
    }

    /// Starts lowering job `k`: its scratch region, nothing reserved yet.
    pub(crate) fn scratch_for(&mut self, k: usize) {
        let (offset, _) = self.scratch_regions.get(k).copied().unwrap_or_default();
        self.scratch = Scratch {
            offset,
            bytes: 0,
            held: 0,
        };
    }

    /// Whether job `k`'s kernels stayed within the scratch the plan gave it.
    pub(crate) fn scratch_fits(&self, k: usize) -> bool {
        let given = self.scratch_regions.get(k).map_or(0, |&(_, bytes)| bytes);
        self.scratch.bytes <= given
    }
}

/// Arena statistics of a memory plan.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlanStats {
    /// The planned arena size in bytes (what the artifact records).
    pub arena_bytes: u64,
    /// The sum of all arena values, each rounded up to 64 bytes: the arena
    /// a plan without reuse (one region per value) would need.
    pub total_bytes: u64,
    /// The most bytes live at any one step (a lower bound for the arena).
    pub peak_live_bytes: u64,
    /// Arena values (graph inputs, kernel outputs, output copies).
    pub values: usize,
    /// Distinct buffers after aliasing and in-place reuse.
    pub buffers: usize,
    /// Kernels that write over one of their inputs.
    pub in_place: usize,
    /// Reshapes that alias their input (no kernel, no buffer).
    pub aliases: usize,
}

impl std::fmt::Display for PlanStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "arena {} bytes (peak live {}, sum of values {}): {} values in {} buffers, {} in place, {} aliases",
            self.arena_bytes,
            self.peak_live_bytes,
            self.total_bytes,
            self.values,
            self.buffers,
            self.in_place,
            self.aliases
        )
    }
}

/// How an arena value comes to be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ValueKind {
    /// A graph input, copied into the arena before step 1.
    Input,
    /// The output of the kernel at `step`; `in_place_of` is the input whose
    /// buffer it overwrites, if any.
    Kernel {
        /// The step (1-based position in [`MemoryPlan::steps`]).
        step: u32,
        /// The input node whose buffer this kernel writes over.
        in_place_of: Option<NodeId>,
    },
    /// A Reshape without a kernel: it shares the buffer of `of`.
    Alias {
        /// The reshaped node.
        of: NodeId,
    },
    /// The copy of a graph output made at `step` (an output that is a graph
    /// input, a constant or a repeat of an earlier output).
    OutputCopy {
        /// The step (1-based position in [`MemoryPlan::steps`]).
        step: u32,
    },
    /// A Concat without a kernel: the kernels of `parts` (its inputs, in
    /// order) wrote their values into consecutive slices of its buffer.
    Concat {
        /// The inputs, whose values are the slices.
        parts: Vec<NodeId>,
    },
}

/// One value's place in the arena.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedValue {
    /// Node name, or `output:<name>` for an output copy.
    pub name: String,
    /// The node (`None` for an output copy).
    pub node: Option<NodeId>,
    /// How the value is produced.
    pub kind: ValueKind,
    /// Byte offset in the arena (64-byte aligned).
    pub offset: u64,
    /// Size in bytes.
    pub bytes: u64,
}

/// One kernel of the schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// The kernel of a node.
    Node(NodeId),
    /// A copy of graph output `output` from `src`'s value.
    Copy {
        /// The graph output's name.
        output: String,
        /// The copied node.
        src: NodeId,
    },
}

/// The arena plan of a graph, as [`compile`](crate::compile) uses it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryPlan {
    /// Arena size in bytes.
    pub arena_size: u64,
    /// Kernels in execution order; kernel `k` (0-based) runs at step `k + 1`,
    /// graph inputs are written at step 0.
    pub steps: Vec<Step>,
    /// Every arena value: graph inputs and kernel outputs in schedule
    /// order, then output copies, then aliasing reshapes. Constants (and
    /// reshapes of constants) live in the weights and are not listed.
    pub values: Vec<PlannedValue>,
    /// Statistics.
    pub stats: PlanStats,
}

/// The arena plan [`compile`](crate::compile) would use for `graph`.
pub fn memory_plan(graph: &Graph) -> Result<MemoryPlan, CpuError> {
    let order = kiln_ir::schedule(graph)?;
    Ok(plan(graph, &order, &[], Weights::measuring(), Constants::All)?.memory)
}

/// Arena statistics of the plan [`compile`](crate::compile) would use for
/// `graph`: planned bytes vs the sum of all values.
pub fn plan_stats(graph: &Graph) -> Result<PlanStats, CpuError> {
    Ok(memory_plan(graph)?.stats)
}

pub(crate) fn align(x: u64) -> u64 {
    pack::align(x)
}

/// A kernel before offsets are known.
enum ProtoJob {
    Node(NodeId),
    Copy {
        output: String,
        src: NodeId,
        dst: usize,
        bytes: u64,
    },
}

/// An arena value during planning.
struct Val {
    bytes: u64,
    /// Step that writes it.
    def: u32,
    /// Last step that reads it (through its aliases too).
    last: u32,
    node: Option<NodeId>,
    name: String,
    kind: ValueKind,
}

fn find(parent: &mut [usize], mut v: usize) -> usize {
    while parent[v] != v {
        parent[v] = parent[parent[v]];
        v = parent[v];
    }
    v
}

/// The byte offsets at which the inputs of Concat `id` lie in its output,
/// when they are consecutive slices of it (every dim before the axis is 1)
/// that its inputs' kernels can write directly (see [`plan`]): every input
/// the output of a kernel of its own, used once here, not a graph output,
/// not a member of another such Concat, and 64-byte aligned in the output.
fn concat_slices(
    graph: &Graph,
    id: NodeId,
    axis: usize,
    vals: &[Val],
    val_of: &HashMap<NodeId, usize>,
    members: &HashMap<usize, (usize, u64)>,
) -> Option<Vec<u64>> {
    let out = &graph.node(id).ty;
    let inputs = graph.inputs_of(id);
    if inputs.len() < 2 || out.shape[..axis].iter().any(|&d| d != 1) {
        return None;
    }
    let mut at = 0u64;
    let mut offsets = Vec::with_capacity(inputs.len());
    for (k, &input) in inputs.iter().enumerate() {
        let v = *val_of.get(&input)?;
        let own_kernel = vals[v].node == Some(input)
            && matches!(vals[v].kind, ValueKind::Kernel { .. })
            && vals[v].bytes > 0;
        if !own_kernel
            || graph.is_output(input)
            || inputs[..k].contains(&input)
            || members.contains_key(&v)
            || at != align(at)
        {
            return None;
        }
        offsets.push(at);
        at += vals[v].bytes;
    }
    Some(offsets)
}

/// Whether `id`'s kernel may write over an input with `id`'s element count
/// and element size: the lowering (`elementwise::map`) reads every element
/// of such an input at the same index it writes, before writing it.
fn in_place_capable(graph: &Graph, id: NodeId) -> bool {
    match &graph.node(id).op {
        Op::Unary(_) | Op::Binary(_) | Op::Cast { .. } => true,
        // A headless fused kernel is one `map` too; with a head, the dense
        // op writes the output while it still reads its inputs.
        Op::Fused(k) => k.head().is_none(),
        _ => false,
    }
}

fn too_large(graph: &Graph, id: NodeId) -> CpuError {
    CpuError::TooLarge {
        node: graph.node(id).name.clone(),
        message: "the schedule has more than 2^32 steps".into(),
    }
}

/// Whether Reshape `id` shares its input's buffer. A graph output's does
/// too (a 1-D convolution lifted to 2-D and reshaped back as the model's
/// output copied 6.5 MB after its kernel): the output keeps the value live
/// to the end through the alias. Not when the input is itself an output,
/// or a graph input reshaped into an output: two tensors of the interface
/// would share bytes.
fn reshape_aliases(graph: &Graph, id: NodeId) -> bool {
    let input = graph.inputs_of(id)[0];
    let interface_shared = graph.is_output(input)
        || (graph.is_output(id) && matches!(graph.node(input).op, Op::Input { .. }));
    !interface_shared
}

/// The plan of `graph` run in `order` (a topological order), with `scratch[k]` bytes of scratch
/// for job `k` (live during its step only; missing entries need none),
/// placing the constants in `weights` (empty).
pub(crate) fn plan(
    graph: &Graph,
    order: &[NodeId],
    scratch: &[u64],
    mut weights: Weights,
    constants: Constants,
) -> Result<Plan, CpuError> {
    let mut locs: HashMap<NodeId, Loc> = HashMap::new();
    // Arena values; `val_of` maps every arena-resident node (aliases
    // included) to its value.
    let mut vals: Vec<Val> = Vec::new();
    let mut val_of: HashMap<NodeId, usize> = HashMap::new();
    let mut aliases: Vec<NodeId> = Vec::new();
    // Values written straight into a Concat's buffer: member → (the
    // Concat's value, byte offset in it).
    let mut members: HashMap<usize, (usize, u64)> = HashMap::new();
    let mut proto: Vec<ProtoJob> = Vec::new();
    let step_of = |n: usize, id: NodeId| u32::try_from(n).map_err(|_| too_large(graph, id));
    for &id in order {
        let node = graph.node(id);
        let bytes = node.ty.size_bytes() as u64;
        let new_val = |vals: &mut Vec<Val>, def: u32, kind: ValueKind| {
            vals.push(Val {
                bytes,
                def,
                last: def,
                node: Some(id),
                name: node.name.clone(),
                kind,
            });
            vals.len() - 1
        };
        // A Concat whose inputs are consecutive slices of its output costs
        // no kernel: their kernels write there (TensorRT's concatenation
        // elision). Its buffer lives from the first slice's write.
        let slices = match node.op {
            Op::Concat { axis } => concat_slices(graph, id, axis, &vals, &val_of, &members),
            _ => None,
        };
        if let Some(slices) = slices {
            let parts = graph.inputs_of(id);
            let def = parts.iter().map(|p| vals[val_of[p]].def).min().unwrap_or(0);
            let v = new_val(
                &mut vals,
                def,
                ValueKind::Concat {
                    parts: parts.clone(),
                },
            );
            for (part, at) in parts.iter().zip(slices) {
                members.insert(val_of[part], (v, at));
            }
            val_of.insert(id, v);
            continue;
        }
        match &node.op {
            Op::Input { .. } => {
                let v = new_val(&mut vals, 0, ValueKind::Input);
                val_of.insert(id, v);
            }
            Op::Constant(t) => {
                let offset = match constants {
                    Constants::Read(read) if !read.contains(&id) && bytes > 0 => UNPLACED,
                    _ => weights.add_with(bytes, || t.data().to_le_bytes()),
                };
                locs.insert(
                    id,
                    Loc {
                        base: Base::Weights,
                        offset,
                    },
                );
            }
            Op::Reshape { .. } if reshape_aliases(graph, id) => {
                let input = graph.inputs_of(id)[0];
                match val_of.get(&input) {
                    Some(&v) => {
                        val_of.insert(id, v);
                        aliases.push(id);
                    }
                    None => {
                        let loc = locs[&input];
                        locs.insert(id, loc);
                    }
                }
            }
            _ => {
                proto.push(ProtoJob::Node(id));
                let step = step_of(proto.len(), id)?;
                let v = new_val(
                    &mut vals,
                    step,
                    ValueKind::Kernel {
                        step,
                        in_place_of: None,
                    },
                );
                val_of.insert(id, v);
            }
        }
    }
    // Output copies, and the values the outputs point at.
    let mut out_val: Vec<Option<usize>> = Vec::new();
    let mut seen: Vec<NodeId> = Vec::new();
    for (name, id) in graph.outputs() {
        let node = graph.node(*id);
        let needs_copy = matches!(node.op, Op::Input { .. } | Op::Constant(_))
            || seen.contains(id)
            || !val_of.contains_key(id);
        seen.push(*id);
        if needs_copy {
            let bytes = node.ty.size_bytes() as u64;
            let step = step_of(proto.len() + 1, *id)?;
            vals.push(Val {
                bytes,
                def: step,
                last: step,
                node: None,
                name: format!("output:{name}"),
                kind: ValueKind::OutputCopy { step },
            });
            proto.push(ProtoJob::Copy {
                output: name.clone(),
                src: *id,
                dst: vals.len() - 1,
                bytes,
            });
            out_val.push(Some(vals.len() - 1));
        } else {
            out_val.push(None);
        }
    }
    let end = step_of(proto.len() + 1, order.last().copied().unwrap_or_default())?;
    // Liveness: last reads, outputs to the end.
    for (k, job) in proto.iter().enumerate() {
        let step = k as u32 + 1;
        let reads = match job {
            ProtoJob::Node(id) => graph.inputs_of(*id),
            ProtoJob::Copy { src, .. } => vec![*src],
        };
        for r in reads {
            if let Some(&v) = val_of.get(&r) {
                vals[v].last = vals[v].last.max(step);
            }
        }
    }
    for (k, (_, id)) in graph.outputs().iter().enumerate() {
        let v = match out_val[k] {
            Some(v) => v,
            None => val_of[id],
        };
        vals[v].last = end;
    }
    // A Concat's buffer holds its slices while any of them is read.
    for (&member, &(concat, _)) in &members {
        vals[concat].last = vals[concat].last.max(vals[member].last);
    }
    // In-place reuse, in schedule order: buffers (union-find roots) only
    // ever grow forward in time.
    let mut parent: Vec<usize> = (0..vals.len()).collect();
    for (&member, &(concat, _)) in &members {
        parent[member] = concat;
    }
    let mut in_place = 0;
    for (k, job) in proto.iter().enumerate() {
        let ProtoJob::Node(id) = *job else { continue };
        if !in_place_capable(graph, id) {
            continue;
        }
        let step = k as u32 + 1;
        let out_ty = &graph.node(id).ty;
        let out = val_of[&id];
        // A slice of a Concat has its place already.
        if members.contains_key(&out) {
            continue;
        }
        if vals[out].bytes == 0 {
            continue;
        }
        let inputs = graph.inputs_of(id);
        let same_indexing = |n: NodeId| {
            let t = &graph.node(n).ty;
            t.num_elements() == out_ty.num_elements()
                && t.dtype.size_bytes() == out_ty.dtype.size_bytes()
        };
        let roots: Vec<Option<usize>> = inputs
            .iter()
            .map(|n| val_of.get(n).map(|&v| find(&mut parent, v)))
            .collect();
        for (&input, &root) in inputs.iter().zip(&roots) {
            let Some(root) = root else { continue };
            if vals[root].last != step || vals[root].bytes != vals[out].bytes {
                continue;
            }
            // Every operand read from this buffer must be read at the
            // output's own index.
            let ok = inputs
                .iter()
                .zip(&roots)
                .all(|(&n, &r)| r != Some(root) || same_indexing(n));
            if !ok {
                continue;
            }
            parent[out] = root;
            vals[root].last = vals[root].last.max(vals[out].last);
            if let ValueKind::Kernel { in_place_of, .. } = &mut vals[out].kind {
                *in_place_of = Some(input);
            }
            in_place += 1;
            break;
        }
    }
    // Offsets.
    let roots: Vec<usize> = (0..vals.len())
        .filter(|&v| find(&mut parent, v) == v)
        .collect();
    let mut intervals: Vec<pack::Interval> = roots
        .iter()
        .map(|&r| pack::Interval {
            bytes: vals[r].bytes,
            start: vals[r].def,
            end: vals[r].last,
        })
        .collect();
    let value_intervals = intervals.len();
    // Each job's scratch, live at its step only.
    for (k, &bytes) in scratch.iter().enumerate().take(proto.len()) {
        let step = k as u32 + 1;
        intervals.push(pack::Interval {
            bytes,
            start: step,
            end: step,
        });
    }
    let (root_offsets, arena_size) = pack::pack(&intervals);
    let scratch_regions: Vec<(u64, u64)> = (root_offsets[value_intervals..].iter())
        .zip(scratch)
        .map(|(&offset, &bytes)| (offset, bytes))
        .collect();
    let intervals = &intervals[..value_intervals];
    let mut offset = vec![0u64; vals.len()];
    for (i, &r) in roots.iter().enumerate() {
        offset[r] = root_offsets[i];
    }
    for v in 0..vals.len() {
        let r = find(&mut parent, v);
        offset[v] = offset[r] + members.get(&v).map_or(0, |&(_, at)| at);
    }
    let arena = |offset: u64| Loc {
        base: Base::Arena,
        offset,
    };
    for &id in order {
        if let Some(&v) = val_of.get(&id) {
            locs.insert(id, arena(offset[v]));
        }
    }
    let mut jobs = Vec::with_capacity(proto.len());
    let mut steps = Vec::with_capacity(proto.len());
    for job in &proto {
        match job {
            ProtoJob::Node(id) => {
                jobs.push(Job::Node(*id));
                steps.push(Step::Node(*id));
            }
            ProtoJob::Copy {
                output,
                src,
                dst,
                bytes,
            } => {
                jobs.push(Job::Copy {
                    name: format!("output:{output}"),
                    src: locs[src],
                    dst: arena(offset[*dst]),
                    bytes: *bytes,
                });
                steps.push(Step::Copy {
                    output: output.clone(),
                    src: *src,
                });
            }
        }
    }
    let spec = |name: &str, id: NodeId, offset: u64| {
        let ty = &graph.node(id).ty;
        TensorSpec {
            name: name.to_owned(),
            dtype: ty.dtype,
            shape: ty.shape.iter().map(|&d| d as u64).collect(),
            arena_offset: offset,
        }
    };
    let inputs = graph
        .inputs()
        .iter()
        .map(|&id| spec(&graph.node(id).name, id, offset[val_of[&id]]))
        .collect();
    let outputs = graph
        .outputs()
        .iter()
        .zip(&out_val)
        .map(|((name, id), v)| spec(name, *id, offset[v.unwrap_or_else(|| val_of[id])]))
        .collect();
    // The public view.
    let mut values: Vec<PlannedValue> = Vec::with_capacity(vals.len() + aliases.len());
    for (v, val) in vals.iter().enumerate() {
        values.push(PlannedValue {
            name: val.name.clone(),
            node: val.node,
            kind: val.kind.clone(),
            offset: offset[v],
            bytes: val.bytes,
        });
    }
    for &id in &aliases {
        let node = graph.node(id);
        values.push(PlannedValue {
            name: node.name.clone(),
            node: Some(id),
            kind: ValueKind::Alias {
                of: graph.inputs_of(id)[0],
            },
            offset: offset[val_of[&id]],
            bytes: node.ty.size_bytes() as u64,
        });
    }
    let stats = PlanStats {
        arena_bytes: arena_size,
        total_bytes: vals.iter().map(|v| align(v.bytes)).sum(),
        peak_live_bytes: pack::peak_live(intervals),
        values: vals.len(),
        buffers: roots.iter().filter(|&&r| vals[r].bytes > 0).count(),
        in_place,
        aliases: aliases.len(),
    };
    Ok(Plan {
        locs,
        weights,
        scratch: Scratch {
            offset: 0,
            bytes: 0,
            held: 0,
        },
        scratch_regions,
        dense_kernels: Vec::new(),
        arena_size,
        inputs,
        outputs,
        jobs,
        memory: MemoryPlan {
            arena_size,
            steps,
            values,
            stats,
        },
    })
}
