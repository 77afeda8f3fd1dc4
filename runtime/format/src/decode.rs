//! Decoding and validation of the structured sections.

use std::collections::HashSet;

use super::cursor::Reader;
use super::encode::{TARGET_HOST, TARGET_KERNEL, TARGET_TEXT};
use super::{
    encode, BoundedOutput, DType, Declined, DenseKernel, FormatError, Guard, HostFn, KernelEntry,
    Metadata, PaddableDim, Profile, Reloc, RelocKind, RelocTarget, Role, SectionKind, Step,
    TensorSpec,
};

/// Smallest encoded sizes, used to cap counts by the bytes that remain.
const MIN_TENSOR: usize = 4 + 1 + 4 + 8;
const RELOC_LEN: usize = 32;
const MIN_KERNEL: usize = 4 + 8 + 8;
const MIN_STEP: usize = 4 + 4 + 4;

/// Smallest encoded dense-kernel record: three empty strings, the FLOPs
/// and an empty list.
const MIN_DENSE_KERNEL: usize = 4 + 4 + 4 + 8 + 4;
const MIN_DECLINED: usize = 4 + 4;

/// META: the provenance.
pub(crate) fn meta(bytes: &[u8]) -> Result<Metadata, FormatError> {
    let mut r = Reader::new(bytes, SectionKind::Meta);
    let compiler_version = r.str("compiler version")?;
    let target = r.str("target")?;
    let options = r.str("options")?;
    let source_sha256 = r.sha256("source hash")?;
    r.finish()?;
    Ok(Metadata {
        compiler_version,
        target,
        options,
        source_sha256,
    })
}

/// PROFILES: at least one, the first a model profile; each one's tensors
/// inside its arena and its steps calling kernels that exist; every
/// profile with the first one's input names, dtypes and ranks, every model
/// profile with its output names, dtypes and ranks too; a condition
/// program with one one-element bool output, a refused variant with no
/// outputs and no steps; guards naming condition programs of the same
/// input shapes; no two selectable profiles with the same input shapes
/// and guards (a run's shapes and conditions pick one profile); no guards
/// in an artifact with paddable dims.
pub(crate) fn profiles(
    bytes: &[u8],
    kernels: usize,
) -> Result<(Vec<Profile>, Vec<PaddableDim>), FormatError> {
    let mut r = Reader::new(bytes, SectionKind::Profiles);
    let count = r.count("profile count", MIN_PROFILE)?;
    if count == 0 {
        return Err(r.error("no profile"));
    }
    let mut out: Vec<Profile> = Vec::with_capacity(count);
    let mut keys = HashSet::with_capacity(count);
    for p in 0..count {
        let arena_size = r.u64("arena size")?;
        let inputs = tensors(&mut r, "input")?;
        let outputs = tensors(&mut r, "output")?;
        let dense_kernels = dense_kernels(&mut r)?;
        let schedule = steps(&mut r, kernels)?;
        let role = role(&mut r, count)?;
        let bounded = bounded_outputs(&mut r)?;
        let profile = Profile {
            inputs,
            outputs,
            arena_size,
            dense_kernels,
            schedule,
            role,
            bounded,
        };
        check_bounded(&profile).map_err(|detail| r.error(format!("profile {p}: {detail}")))?;
        check_tensors(arena_size, "input", &profile.inputs)?;
        check_tensors(arena_size, "output", &profile.outputs)?;
        match out.first() {
            Some(first) => same_signature(first, &profile, p)?,
            None if !matches!(profile.role, Role::Model { .. }) => {
                return Err(r.error("profile 0 is not a model profile"));
            }
            None => {}
        }
        check_role(&profile, p).map_err(|detail| r.error(detail))?;
        if profile.role.is_selectable() {
            let mut guards = profile.role.guards().to_vec();
            guards.sort_unstable();
            if !keys.insert((input_shapes(&profile), guards)) {
                return Err(r.error(format!(
                    "profile {p} has the input shapes and guards of an earlier profile ({})",
                    profile.describe_inputs()
                )));
            }
        }
        out.push(profile);
    }
    check_guards(&out).map_err(|detail| r.error(detail))?;
    let padding = paddable_dims(&mut r, &out[0])?;
    if !padding.is_empty() && out.iter().any(|p| !p.role.guards().is_empty()) {
        return Err(r.error("paddable dims in an artifact with run-time variants"));
    }
    r.finish()?;
    Ok((out, padding))
}

/// Smallest encoded role: its code and an empty guard list or string.
const MIN_ROLE: usize = 1 + 4;
/// An encoded guard: the condition's profile index and the value.
const GUARD_LEN: usize = 4 + 1;

/// A profile's [`Role`]; guard indices below `count`.
fn role(r: &mut Reader<'_>, count: usize) -> Result<Role, FormatError> {
    let guards = |r: &mut Reader<'_>| -> Result<Vec<Guard>, FormatError> {
        let n = r.count("guard count", GUARD_LEN)?;
        let mut guards = Vec::with_capacity(n);
        for _ in 0..n {
            let condition = r.u32("guard condition")?;
            if condition as usize >= count {
                return Err(r.error(format!(
                    "a guard names condition profile {condition} of {count}"
                )));
            }
            let holds = match r.u8("guard value")? {
                0 => false,
                1 => true,
                v => return Err(r.error(format!("guard value {v} is not 0 or 1"))),
            };
            guards.push(Guard { condition, holds });
        }
        Ok(guards)
    };
    match r.u8("profile role")? {
        encode::ROLE_MODEL => Ok(Role::Model { guards: guards(r)? }),
        encode::ROLE_REFUSED => Ok(Role::Refused {
            guards: guards(r)?,
            reason: r.str("refusal reason")?,
        }),
        encode::ROLE_CONDITION => Ok(Role::Condition {
            what: r.str("condition")?,
        }),
        code => Err(FormatError::UnknownCode {
            what: "profile role",
            code: code.into(),
        }),
    }
}

/// The shape of a profile of each role: a condition gives one
/// one-element bool; a refused variant computes nothing.
fn check_role(p: &Profile, index: usize) -> Result<(), String> {
    match &p.role {
        Role::Model { .. } => Ok(()),
        Role::Refused { guards, .. } => {
            if !p.outputs.is_empty() || !p.schedule.is_empty() || guards.is_empty() {
                return Err(format!(
                    "profile {index}, a refused variant, has outputs, steps or no guards"
                ));
            }
            Ok(())
        }
        Role::Condition { .. } => match p.outputs.as_slice() {
            [o] if o.dtype == DType::Bool && o.shape.iter().product::<u64>() == 1 => Ok(()),
            _ => Err(format!(
                "profile {index}, a condition program, does not give one one-element bool"
            )),
        },
    }
}

/// Every guard names a condition program of the guarded profile's input
/// shapes, at most once.
fn check_guards(profiles: &[Profile]) -> Result<(), String> {
    for (i, p) in profiles.iter().enumerate() {
        let guards = p.role.guards();
        for (k, g) in guards.iter().enumerate() {
            let c = &profiles[g.condition as usize];
            if !matches!(c.role, Role::Condition { .. }) || input_shapes(c) != input_shapes(p) {
                return Err(format!(
                    "profile {i} is guarded by profile {}, not a condition program of its input shapes",
                    g.condition
                ));
            }
            if guards[..k].iter().any(|e| e.condition == g.condition) {
                return Err(format!("profile {i} names condition {} twice", g.condition));
            }
        }
    }
    Ok(())
}

/// The padding table: names unique, one axis entry per input and output
/// of the profiles, every axis inside its tensor's rank, at least one input
/// axis, and no input axis claimed by two dims.
fn paddable_dims(r: &mut Reader<'_>, first: &Profile) -> Result<Vec<PaddableDim>, FormatError> {
    let count = r.count("paddable dim count", 4 + 4 + 4)?;
    let mut out: Vec<PaddableDim> = Vec::with_capacity(count);
    for _ in 0..count {
        let name = r.str("paddable dim name")?;
        let mut axes =
            |what: &str, specs: &[TensorSpec]| -> Result<Vec<Option<u32>>, FormatError> {
                let n = r.count(&format!("paddable dim '{name}' {what} count"), 4)?;
                if n != specs.len() {
                    return Err(r.error(format!(
                        "paddable dim '{name}' has {n} {what} axes for {} {what}s",
                        specs.len()
                    )));
                }
                let mut list = Vec::with_capacity(n);
                for spec in specs {
                    let a = r.u32("paddable axis")?;
                    if a == encode::NO_AXIS {
                        list.push(None);
                    } else if (a as usize) < spec.shape.len() {
                        list.push(Some(a));
                    } else {
                        return Err(r.error(format!(
                            "paddable dim '{name}': axis {a} of {what} '{}', whose rank is {}",
                            spec.name,
                            spec.shape.len()
                        )));
                    }
                }
                Ok(list)
            };
        let inputs = axes("input", &first.inputs)?;
        let outputs = axes("output", &first.outputs)?;
        if inputs.iter().all(Option::is_none) {
            return Err(r.error(format!("paddable dim '{name}' is on no input")));
        }
        let claimed =
            |d: &PaddableDim| (d.inputs.iter().zip(&inputs)).any(|(a, b)| a.is_some() && a == b);
        if out.iter().any(|d| d.name == name || claimed(d)) {
            return Err(r.error(format!(
                "paddable dim '{name}' repeats a name or an input axis of another"
            )));
        }
        out.push(PaddableDim {
            name,
            inputs,
            outputs,
        });
    }
    Ok(out)
}

/// Smallest encoded profile: arena size, four empty counts, a role, an
/// empty count.
const MIN_PROFILE: usize = 8 + 4 * 4 + MIN_ROLE + 4;

/// Encoded size of one [`BoundedOutput`].
const BOUNDED_OUTPUT: usize = 4 + 4 + 8;

fn bounded_outputs(r: &mut Reader<'_>) -> Result<Vec<BoundedOutput>, FormatError> {
    let count = r.count("bounded output count", BOUNDED_OUTPUT)?;
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        out.push(BoundedOutput {
            output: r.u32("bounded output")?,
            axis: r.u32("bounded axis")?,
            length_offset: r.u64("bounded length offset")?,
        });
    }
    Ok(out)
}

/// Errors unless each bounded output names a distinct output of a model
/// profile, in increasing order, an axis within its rank, and a length
/// slot inside the arena.
fn check_bounded(p: &Profile) -> Result<(), String> {
    if !p.bounded.is_empty() && !matches!(p.role, Role::Model { .. }) {
        return Err("bounded outputs in a profile that is not a model profile".into());
    }
    let mut previous = None;
    for b in &p.bounded {
        let Some(spec) = p.outputs.get(b.output as usize) else {
            return Err(format!(
                "bounded output {} of {} outputs",
                b.output,
                p.outputs.len()
            ));
        };
        if previous.is_some_and(|o| o >= b.output) {
            return Err(format!("bounded output {} out of order", b.output));
        }
        previous = Some(b.output);
        if b.axis as usize >= spec.shape.len() {
            return Err(format!(
                "bounded axis {} of output '{}' ({})",
                b.axis,
                spec.name,
                spec.type_string()
            ));
        }
        if b.length_offset
            .checked_add(8)
            .is_none_or(|end| end > p.arena_size)
        {
            return Err(format!(
                "the length of output '{}' at arena+{} is outside the {}-byte arena",
                spec.name, b.length_offset, p.arena_size
            ));
        }
    }
    Ok(())
}

/// A profile's input shapes, for finding duplicates.
fn input_shapes(p: &Profile) -> Vec<Vec<u64>> {
    p.inputs.iter().map(|s| s.shape.clone()).collect()
}

/// Errors unless `p` (profile number `index`) has `first`'s input names,
/// dtypes and ranks, in the same order, and, for a model profile, its
/// outputs' too.
fn same_signature(first: &Profile, p: &Profile, index: usize) -> Result<(), FormatError> {
    let same = |a: &[TensorSpec], b: &[TensorSpec]| {
        a.len() == b.len()
            && a.iter().zip(b).all(|(x, y)| {
                x.name == y.name && x.dtype == y.dtype && x.shape.len() == y.shape.len()
            })
    };
    let model = matches!(p.role, Role::Model { .. });
    for (what, a, b) in [
        ("inputs", &first.inputs, &p.inputs),
        ("outputs", &first.outputs, &p.outputs),
    ] {
        if (what == "inputs" || model) && !same(a, b) {
            return Err(FormatError::Malformed {
                section: SectionKind::Profiles,
                detail: format!(
                    "profile {index}'s {what} differ from profile 0's in name, dtype or rank"
                ),
            });
        }
    }
    Ok(())
}

fn dense_kernels(r: &mut Reader<'_>) -> Result<Vec<DenseKernel>, FormatError> {
    let count = r.count("dense kernel count", MIN_DENSE_KERNEL)?;
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let node = r.str("dense kernel node")?;
        let op = r.str("dense kernel op")?;
        let kernel = r.str("dense kernel")?;
        let flops = r.u64("dense kernel flops")?;
        let declined_count = r.count("declined kernel count", MIN_DECLINED)?;
        let mut declined = Vec::with_capacity(declined_count);
        for _ in 0..declined_count {
            declined.push(Declined {
                kernel: r.str("declined kernel")?,
                reason: r.str("declined reason")?,
            });
        }
        out.push(DenseKernel {
            node,
            op,
            kernel,
            flops,
            declined,
        });
    }
    Ok(out)
}

fn tensors(r: &mut Reader<'_>, what: &str) -> Result<Vec<TensorSpec>, FormatError> {
    let count = r.count(&format!("{what} count"), MIN_TENSOR)?;
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let (name, dtype, shape) = tensor_head(r, what)?;
        let arena_offset = r.u64("arena offset")?;
        out.push(TensorSpec {
            name,
            dtype,
            shape,
            arena_offset,
        });
    }
    Ok(out)
}

/// A tensor's name, dtype and shape (see `encode::tensor_head`).
pub(crate) fn tensor_head(
    r: &mut Reader<'_>,
    what: &str,
) -> Result<(String, DType, Vec<u64>), FormatError> {
    let name = r.str(&format!("{what} name"))?;
    let code = r.u8("dtype")?;
    let dtype = DType::from_u8(code).ok_or(FormatError::UnknownCode {
        what: "dtype",
        code: code.into(),
    })?;
    let rank = r.count(&format!("rank of {what} '{name}'"), 8)?;
    let mut shape = Vec::with_capacity(rank);
    for _ in 0..rank {
        shape.push(r.u64("dimension")?);
    }
    Ok((name, dtype, shape))
}

/// Every tensor lies inside the arena; names are unique (checked with a
/// hash set: linear in the count, which the file's size bounds).
fn check_tensors(arena_size: u64, what: &str, specs: &[TensorSpec]) -> Result<(), FormatError> {
    let bad = |detail: String| FormatError::Malformed {
        section: SectionKind::Profiles,
        detail,
    };
    let mut names = HashSet::with_capacity(specs.len());
    for s in specs {
        if !names.insert(s.name.as_str()) {
            return Err(bad(format!("{what} name '{}' appears twice", s.name)));
        }
        let end = s
            .checked_byte_len()
            .and_then(|len| len.checked_add(s.arena_offset));
        match end {
            Some(end) if end <= arena_size => {}
            _ => {
                return Err(bad(format!(
                    "{what} '{}' ({}, {} bytes at arena offset {}) does not fit in the arena ({} bytes)",
                    s.name,
                    s.type_string(),
                    s.checked_byte_len().map_or("too many".into(), |l| l.to_string()),
                    s.arena_offset,
                    arena_size
                )))
            }
        }
    }
    Ok(())
}

pub(crate) fn kernels(bytes: &[u8], text_len: u64) -> Result<Vec<KernelEntry>, FormatError> {
    let mut r = Reader::new(bytes, SectionKind::Kernels);
    let count = r.count("kernel count", MIN_KERNEL)?;
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let name = r.str("kernel name")?;
        let text_offset = r.u64("kernel offset")?;
        let len = r.u64("kernel length")?;
        let end = text_offset.checked_add(len).filter(|&e| e <= text_len);
        if end.is_none() || len == 0 {
            return Err(r.error(format!(
                "kernel '{name}' (TEXT bytes {text_offset}..{}) is empty or lies outside TEXT ({text_len} bytes)",
                text_offset.saturating_add(len)
            )));
        }
        out.push(KernelEntry {
            name,
            text_offset,
            text_len: len,
        });
    }
    r.finish()?;
    Ok(out)
}

pub(crate) fn relocs(
    bytes: &[u8],
    text_len: u64,
    kernel_table: &[KernelEntry],
) -> Result<Vec<Reloc>, FormatError> {
    let kernels = kernel_table.len();
    let mut r = Reader::new(bytes, SectionKind::Relocs);
    let count = r.count("relocation count", RELOC_LEN)?;
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        let offset = r.u64("relocation offset")?;
        let kind_code = r.u32("relocation kind")?;
        let target_kind = r.u32("relocation target kind")?;
        let value = r.u64("relocation target")?;
        let addend = r.i64("relocation addend")?;
        let kind = RelocKind::from_u32(kind_code).ok_or(FormatError::UnknownCode {
            what: "relocation kind",
            code: kind_code.into(),
        })?;
        let end = offset.checked_add(kind.patch_width());
        if end.is_none_or(|e| e > text_len) {
            return Err(r.error(format!(
                "relocation {i} patches TEXT bytes {offset}..{}, outside TEXT ({text_len} bytes)",
                offset.saturating_add(kind.patch_width())
            )));
        }
        let target = match target_kind {
            TARGET_HOST => u32::try_from(value)
                .ok()
                .and_then(HostFn::from_u32)
                .map(RelocTarget::Host)
                .ok_or(FormatError::UnknownCode {
                    what: "host function",
                    code: value,
                })?,
            TARGET_KERNEL => match u32::try_from(value) {
                Ok(k) if (k as usize) < kernels => RelocTarget::Kernel(k),
                _ => {
                    return Err(r.error(format!(
                        "relocation {i} refers to kernel {value}, but there are {kernels}"
                    )))
                }
            },
            TARGET_TEXT if value <= text_len => RelocTarget::Text(value),
            TARGET_TEXT => {
                return Err(r.error(format!(
                    "relocation {i} refers to TEXT offset {value}, outside TEXT ({text_len} bytes)"
                )))
            }
            code => {
                return Err(FormatError::UnknownCode {
                    what: "relocation target kind",
                    code: code.into(),
                })
            }
        };
        // The allow-list bounds where code may reach, not only what it
        // names: a host function's entry exactly, or an address inside TEXT.
        let reached =
            |base: u64| i128::from(base) + i128::from(addend) + i128::from(kind.reach_bias());
        let reach_ok = match target {
            RelocTarget::Host(_) => reached(0) == 0,
            RelocTarget::Kernel(k) => {
                (0..=i128::from(text_len)).contains(&reached(kernel_table[k as usize].text_offset))
            }
            RelocTarget::Text(t) => (0..=i128::from(text_len)).contains(&reached(t)),
        };
        if !reach_ok {
            return Err(r.error(format!(
                "relocation {i} ({kind:?} to {target:?}) has addend {addend}, which reaches outside its target"
            )));
        }
        out.push(Reloc {
            offset,
            kind,
            target,
            addend,
        });
    }
    r.finish()?;
    Ok(out)
}

/// One profile's schedule: steps calling kernels that exist.
fn steps(r: &mut Reader<'_>, kernels: usize) -> Result<Vec<Step>, FormatError> {
    let count = r.count("step count", MIN_STEP)?;
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        let kernel = r.u32("step kernel")?;
        let tasks = r.u32("step task count")?;
        let node = r.str("step node name")?;
        if tasks == 0 {
            return Err(r.error(format!("step {i} ('{node}') has no task")));
        }
        if kernel as u64 + tasks as u64 > kernels as u64 {
            return Err(r.error(format!(
                "step {i} ('{node}') calls kernels {kernel}..{}, but there are {kernels}",
                kernel as u64 + tasks as u64
            )));
        }
        out.push(Step {
            kernel,
            tasks,
            node,
        });
    }
    Ok(out)
}
