//! Encoding of the structured sections (META, RELOCS, KERNELS, PROFILES).

use super::cursor::Writer;
use super::{
    DType, Guard, KernelEntry, Metadata, PaddableDim, Profile, Reloc, RelocTarget, Role, TensorSpec,
};

/// On-disk codes of [`RelocTarget`] variants.
pub(crate) const TARGET_HOST: u32 = 1;
pub(crate) const TARGET_KERNEL: u32 = 2;
pub(crate) const TARGET_TEXT: u32 = 3;

pub(crate) fn meta(m: &Metadata) -> Vec<u8> {
    let mut w = Writer::default();
    w.str(&m.compiler_version);
    w.str(&m.target);
    w.str(&m.options);
    w.bytes(&m.source_sha256);
    w.0
}

pub(crate) fn profiles(profiles: &[Profile], padding: &[PaddableDim]) -> Vec<u8> {
    let mut w = Writer::default();
    w.len(profiles.len());
    for p in profiles {
        w.u64(p.arena_size);
        tensors(&mut w, &p.inputs);
        tensors(&mut w, &p.outputs);
        w.len(p.dense_kernels.len());
        for k in &p.dense_kernels {
            w.str(&k.node);
            w.str(&k.op);
            w.str(&k.kernel);
            w.u64(k.flops);
            w.len(k.declined.len());
            for d in &k.declined {
                w.str(&d.kernel);
                w.str(&d.reason);
            }
        }
        w.len(p.schedule.len());
        for s in &p.schedule {
            w.u32(s.kernel);
            w.u32(s.tasks);
            w.str(&s.node);
        }
        role(&mut w, &p.role);
        w.len(p.bounded.len());
        for b in &p.bounded {
            w.u32(b.output);
            w.u32(b.axis);
            w.u64(b.length_offset);
        }
    }
    w.len(padding.len());
    for d in padding {
        w.str(&d.name);
        for axes in [&d.inputs, &d.outputs] {
            w.len(axes.len());
            for a in axes.iter() {
                w.u32(a.map_or(NO_AXIS, |a| a));
            }
        }
    }
    w.0
}

/// On-disk codes of [`Role`] variants.
pub(crate) const ROLE_MODEL: u8 = 0;
pub(crate) const ROLE_REFUSED: u8 = 1;
pub(crate) const ROLE_CONDITION: u8 = 2;

fn role(w: &mut Writer, role: &Role) {
    let guards = |w: &mut Writer, guards: &[Guard]| {
        w.len(guards.len());
        for g in guards {
            w.u32(g.condition);
            w.u8(u8::from(g.holds));
        }
    };
    match role {
        Role::Model { guards: list } => {
            w.u8(ROLE_MODEL);
            guards(w, list);
        }
        Role::Refused {
            guards: list,
            reason,
        } => {
            w.u8(ROLE_REFUSED);
            guards(w, list);
            w.str(reason);
        }
        Role::Condition { what } => {
            w.u8(ROLE_CONDITION);
            w.str(what);
        }
    }
}

/// An absent axis in a [`PaddableDim`] table.
pub(crate) const NO_AXIS: u32 = u32::MAX;

fn tensors(w: &mut Writer, specs: &[TensorSpec]) {
    w.len(specs.len());
    for s in specs {
        tensor_head(w, &s.name, s.dtype, &s.shape);
        w.u64(s.arena_offset);
    }
}

/// A tensor's name, dtype code, rank and dims: how META's tensor specs
/// and GOLDEN's tensors begin.
pub(crate) fn tensor_head(w: &mut Writer, name: &str, dtype: DType, shape: &[u64]) {
    w.str(name);
    w.u8(dtype as u8);
    w.len(shape.len());
    for &d in shape {
        w.u64(d);
    }
}

pub(crate) fn relocs(relocs: &[Reloc]) -> Vec<u8> {
    let mut w = Writer::default();
    w.len(relocs.len());
    for r in relocs {
        let (target_kind, target_value) = match r.target {
            RelocTarget::Host(h) => (TARGET_HOST, u64::from(h as u32)),
            RelocTarget::Kernel(k) => (TARGET_KERNEL, u64::from(k)),
            RelocTarget::Text(t) => (TARGET_TEXT, t),
        };
        w.u64(r.offset);
        w.u32(r.kind as u32);
        w.u32(target_kind);
        w.u64(target_value);
        w.i64(r.addend);
    }
    w.0
}

pub(crate) fn kernels(kernels: &[KernelEntry]) -> Vec<u8> {
    let mut w = Writer::default();
    w.len(kernels.len());
    for k in kernels {
        w.str(&k.name);
        w.u64(k.text_offset);
        w.u64(k.text_len);
    }
    w.0
}
