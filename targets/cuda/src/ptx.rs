//! A small typed builder for PTX text.
//!
//! Registers carry their PTX type, so an instruction's type suffix comes
//! from its operands instead of being spelled at every call site, and a
//! kernel declares exactly the registers it used. Labels are numbered per
//! kernel. Float immediates are written as exact hex (`0f3F800000`), so the
//! text never depends on decimal printing.

use std::fmt::{self, Write as _};

/// The PTX type of a register.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ty {
    /// Predicate.
    Pred,
    /// Unsigned 32-bit integer.
    U32,
    /// Signed 32-bit integer.
    S32,
    /// Unsigned 64-bit integer (addresses).
    U64,
    /// Signed 64-bit integer (integer tensor arithmetic).
    S64,
    /// binary32.
    F32,
    /// binary64.
    F64,
    /// A 16-bit value (an f16 for `cvt`, or raw bits for loads and stores).
    B16,
}

impl Ty {
    /// The instruction type suffix (`f32`, `s64`, ...).
    pub fn suffix(self) -> &'static str {
        match self {
            Ty::Pred => "pred",
            Ty::U32 => "u32",
            Ty::S32 => "s32",
            Ty::U64 => "u64",
            Ty::S64 => "s64",
            Ty::F32 => "f32",
            Ty::F64 => "f64",
            Ty::B16 => "b16",
        }
    }

    /// Whether the type is a float type.
    pub fn is_float(self) -> bool {
        matches!(self, Ty::F32 | Ty::F64)
    }

    /// Size in bytes (predicates: 0).
    pub fn bytes(self) -> u32 {
        match self {
            Ty::Pred => 0,
            Ty::B16 => 2,
            Ty::U32 | Ty::S32 | Ty::F32 => 4,
            Ty::U64 | Ty::S64 | Ty::F64 => 8,
        }
    }

    /// The bit-size type of the same width (`b32`, `b64`).
    fn bits(self) -> &'static str {
        match self.bytes() {
            8 => "b64",
            2 => "b16",
            _ => "b32",
        }
    }

    fn class(self) -> usize {
        match self {
            Ty::Pred => 0,
            Ty::U32 | Ty::S32 => 1,
            Ty::U64 | Ty::S64 => 2,
            Ty::F32 => 3,
            Ty::F64 => 4,
            Ty::B16 => 5,
        }
    }
}

/// Register name prefixes and declared types per register class.
const CLASSES: [(&str, &str); 6] = [
    ("%p", ".pred"),
    ("%r", ".b32"),
    ("%rd", ".b64"),
    ("%f", ".f32"),
    ("%fd", ".f64"),
    ("%h", ".b16"),
];

/// A virtual register.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reg {
    ty: Ty,
    n: u32,
}

impl Reg {
    /// The register's type.
    pub fn ty(self) -> Ty {
        self.ty
    }

    /// The same register read as another type of the same class (e.g. a
    /// `u32` index used in signed arithmetic).
    pub fn as_ty(self, ty: Ty) -> Reg {
        assert_eq!(ty.class(), self.ty.class(), "reinterpreting across classes");
        Reg { ty, n: self.n }
    }
}

impl fmt::Display for Reg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", CLASSES[self.ty.class()].0, self.n)
    }
}

/// An instruction operand.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Opnd {
    /// A register.
    R(Reg),
    /// An integer immediate.
    I(i64),
    /// An f32 immediate.
    F32(f32),
    /// An f64 immediate.
    F64(f64),
}

impl From<Reg> for Opnd {
    fn from(r: Reg) -> Opnd {
        Opnd::R(r)
    }
}

impl From<i64> for Opnd {
    fn from(v: i64) -> Opnd {
        Opnd::I(v)
    }
}

impl From<u32> for Opnd {
    fn from(v: u32) -> Opnd {
        Opnd::I(v as i64)
    }
}

impl fmt::Display for Opnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Opnd::R(r) => write!(f, "{r}"),
            Opnd::I(v) => write!(f, "{v}"),
            Opnd::F32(v) => write!(f, "0f{:08X}", v.to_bits()),
            Opnd::F64(v) => write!(f, "0d{:016X}", v.to_bits()),
        }
    }
}

/// A float immediate of type `ty`.
pub fn fimm(ty: Ty, v: f64) -> Opnd {
    match ty {
        Ty::F64 => Opnd::F64(v),
        Ty::F32 => Opnd::F32(v as f32),
        _ => panic!("float immediate of integer type {ty:?}"),
    }
}

/// A branch target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Label(u32);

impl fmt::Display for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "$L{}", self.0)
    }
}

/// Two-operand arithmetic and bitwise operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Bin {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    Min,
    Max,
    And,
    Or,
    Xor,
    Shl,
    Shr,
}

/// Comparisons (ordered for floats: false when either side is NaN, except
/// `Ne`, which is true then, like IEEE `!=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Cmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// Special registers read with `mov`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Special {
    TidX,
    TidY,
    NtidX,
    CtaidX,
    CtaidY,
    CtaidZ,
}

impl Special {
    fn name(self) -> &'static str {
        match self {
            Special::TidX => "%tid.x",
            Special::TidY => "%tid.y",
            Special::NtidX => "%ntid.x",
            Special::CtaidX => "%ctaid.x",
            Special::CtaidY => "%ctaid.y",
            Special::CtaidZ => "%ctaid.z",
        }
    }
}

/// A memory state space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Space {
    /// Device memory.
    Global,
    /// The block's shared memory.
    Shared,
}

impl Space {
    fn name(self) -> &'static str {
        match self {
            Space::Global => "global",
            Space::Shared => "shared",
        }
    }
}

/// The type of a memory access (`f32`, `s8`, `u8`, ...), which may be
/// narrower than the register it loads into or stores from: PTX
/// sign/zero-extends on load and truncates on store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemTy(pub &'static str);

/// The name of the dynamic shared-memory array every kernel may use.
pub const SMEM: &str = "kiln_smem";

/// Builds one `.entry` kernel.
pub struct KernelBuilder {
    name: String,
    body: String,
    counts: [u32; 6],
    labels: u32,
    uses_smem: bool,
    max_threads: [u32; 3],
    arena: Option<Reg>,
    weights: Option<Reg>,
}

impl KernelBuilder {
    /// A kernel named `name` (a PTX identifier) for blocks of at most
    /// `max_threads` threads. Its parameters are the arena and weights base
    /// addresses.
    pub fn new(name: &str, max_threads: [u32; 3]) -> KernelBuilder {
        KernelBuilder {
            name: name.to_owned(),
            body: String::new(),
            counts: [0; 6],
            labels: 0,
            uses_smem: false,
            max_threads,
            arena: None,
            weights: None,
        }
    }

    /// A fresh register of type `ty`.
    pub fn reg(&mut self, ty: Ty) -> Reg {
        let c = ty.class();
        self.counts[c] += 1;
        Reg {
            ty,
            n: self.counts[c],
        }
    }

    /// Emits one instruction: `opcode a, b, ...;`.
    pub fn inst(&mut self, opcode: &str, args: &[Opnd]) {
        let _ = write!(self.body, "\t{opcode}");
        for (i, a) in args.iter().enumerate() {
            let sep = if i == 0 { " " } else { ", " };
            let _ = write!(self.body, "{sep}{a}");
        }
        self.body.push_str(";\n");
    }

    fn raw(&mut self, line: std::fmt::Arguments) {
        let _ = writeln!(self.body, "\t{line}");
    }

    /// `mov` of an immediate or register into a new register of type `ty`.
    pub fn mov(&mut self, ty: Ty, src: impl Into<Opnd>) -> Reg {
        let d = self.reg(ty);
        self.inst(
            &format!("mov.{}", ty.bits_or_self()),
            &[d.into(), src.into()],
        );
        d
    }

    /// Copies `src` into the existing register `dst` (loop-carried values).
    pub fn assign(&mut self, dst: Reg, src: impl Into<Opnd>) {
        self.inst(
            &format!("mov.{}", dst.ty.bits_or_self()),
            &[dst.into(), src.into()],
        );
    }

    /// A special register, as `u32`.
    pub fn special(&mut self, s: Special) -> Reg {
        let d = self.reg(Ty::U32);
        self.raw(format_args!("mov.u32 {d}, {};", s.name()));
        d
    }

    /// `a op b` into a new register of `a`'s type.
    pub fn bin(&mut self, op: Bin, a: Reg, b: impl Into<Opnd>) -> Reg {
        let d = self.reg(a.ty);
        self.bin_into(d, op, a, b);
        d
    }

    /// `dst = a op b` (dst may be `a`, for accumulators).
    pub fn bin_into(&mut self, dst: Reg, op: Bin, a: Reg, b: impl Into<Opnd>) {
        let t = a.ty;
        let f = t.is_float();
        let opcode = match op {
            Bin::Add if f => format!("add.rn.{}", t.suffix()),
            Bin::Sub if f => format!("sub.rn.{}", t.suffix()),
            Bin::Mul if f => format!("mul.rn.{}", t.suffix()),
            Bin::Div if f => format!("div.rn.{}", t.suffix()),
            Bin::Add => format!("add.{}", t.suffix()),
            Bin::Sub => format!("sub.{}", t.suffix()),
            Bin::Mul => format!("mul.lo.{}", t.suffix()),
            Bin::Div => format!("div.{}", t.suffix()),
            Bin::Rem => format!("rem.{}", t.suffix()),
            Bin::Min => format!("min.{}", t.suffix()),
            Bin::Max => format!("max.{}", t.suffix()),
            Bin::And => format!("and.{}", t.bits()),
            Bin::Or => format!("or.{}", t.bits()),
            Bin::Xor => format!("xor.{}", t.bits()),
            Bin::Shl => format!("shl.{}", t.bits()),
            Bin::Shr => format!("shr.{}", t.suffix()),
        };
        self.inst(&opcode, &[dst.into(), a.into(), b.into()]);
    }

    /// `a * b + c`: `fma.rn` for floats, `mad.lo` for integers.
    pub fn mad(&mut self, a: Reg, b: impl Into<Opnd>, c: impl Into<Opnd>) -> Reg {
        let d = self.reg(a.ty);
        self.mad_into(d, a, b, c);
        d
    }

    /// `dst = a * b + c`.
    pub fn mad_into(&mut self, dst: Reg, a: Reg, b: impl Into<Opnd>, c: impl Into<Opnd>) {
        let op = if a.ty.is_float() {
            format!("fma.rn.{}", a.ty.suffix())
        } else {
            format!("mad.lo.{}", a.ty.suffix())
        };
        self.inst(&op, &[dst.into(), a.into(), b.into(), c.into()]);
    }

    /// A one-operand instruction `op.<type>` (e.g. `neg`, `abs`,
    /// `sqrt.rn`, `ex2.approx`) into a new register of `a`'s type.
    pub fn un(&mut self, op: &str, a: Reg) -> Reg {
        let d = self.reg(a.ty);
        self.inst(&format!("{op}.{}", a.ty.suffix()), &[d.into(), a.into()]);
        d
    }

    /// A predicate `a cmp b`.
    pub fn setp(&mut self, cmp: Cmp, a: Reg, b: impl Into<Opnd>) -> Reg {
        let c = match cmp {
            Cmp::Eq => "eq",
            Cmp::Ne if a.ty.is_float() => "neu",
            Cmp::Ne => "ne",
            Cmp::Lt => "lt",
            Cmp::Le => "le",
            Cmp::Gt => "gt",
            Cmp::Ge => "ge",
        };
        let p = self.reg(Ty::Pred);
        self.inst(
            &format!("setp.{c}.{}", a.ty.suffix()),
            &[p.into(), a.into(), b.into()],
        );
        p
    }

    /// A predicate: whether `a` or `b` is NaN.
    pub fn is_nan(&mut self, a: Reg, b: Reg) -> Reg {
        let p = self.reg(Ty::Pred);
        self.inst(
            &format!("setp.nan.{}", a.ty.suffix()),
            &[p.into(), a.into(), b.into()],
        );
        p
    }

    /// Predicate logic (`and`, `or`, `xor`).
    pub fn pred_op(&mut self, op: &str, a: Reg, b: Reg) -> Reg {
        let p = self.reg(Ty::Pred);
        self.inst(&format!("{op}.pred"), &[p.into(), a.into(), b.into()]);
        p
    }

    /// `p ? a : b` into a new register of type `ty`.
    pub fn selp(&mut self, ty: Ty, p: Reg, a: impl Into<Opnd>, b: impl Into<Opnd>) -> Reg {
        let d = self.reg(ty);
        self.inst(
            &format!("selp.{}", ty.suffix()),
            &[d.into(), a.into(), b.into(), p.into()],
        );
        d
    }

    /// Type conversion with an explicit rounding/mode suffix (`""`, `rn`,
    /// `rzi`, `rmi`, `rpi`).
    pub fn cvt(&mut self, to: Ty, mode: &str, a: Reg) -> Reg {
        let d = self.reg(to);
        let m = if mode.is_empty() {
            String::new()
        } else {
            format!(".{mode}")
        };
        self.inst(
            &format!("cvt{m}.{}.{}", to.suffix(), a.ty.suffix()),
            &[d.into(), a.into()],
        );
        d
    }

    /// The 64-bit product of two `u32` values.
    pub fn mul_wide(&mut self, a: Reg, b: impl Into<Opnd>) -> Reg {
        let d = self.reg(Ty::U64);
        self.inst("mul.wide.u32", &[d.into(), a.into(), b.into()]);
        d
    }

    /// The bits of `a` as a register of type `to` (same width).
    pub fn bitcast(&mut self, to: Ty, a: Reg) -> Reg {
        assert_eq!(to.bytes(), a.ty.bytes(), "bitcast across widths");
        let d = self.reg(to);
        self.inst(&format!("mov.{}", to.bits()), &[d.into(), a.into()]);
        d
    }

    /// An f16 (in a `B16` register) widened exactly to f32.
    pub fn f16_to_f32(&mut self, h: Reg) -> Reg {
        assert_eq!(h.ty, Ty::B16);
        let d = self.reg(Ty::F32);
        self.inst("cvt.f32.f16", &[d.into(), h.into()]);
        d
    }

    /// An f32 rounded to the nearest f16 (ties to even; overflow gives
    /// infinity, NaN stays NaN), in a `B16` register.
    pub fn f32_to_f16(&mut self, f: Reg) -> Reg {
        assert_eq!(f.ty, Ty::F32);
        let d = self.reg(Ty::B16);
        self.inst("cvt.rn.f16.f32", &[d.into(), f.into()]);
        d
    }

    /// A warp-wide tensor-core product `acc += A · B` (`mma.sync.aligned`
    /// of `shape`, e.g. `m16n8k16.row.col.f32.bf16.bf16.f32`): four
    /// registers of A's row-major fragment, two of B's column-major one,
    /// four accumulators per thread, updated in place. sm_80+.
    pub fn mma_sync(&mut self, shape: &str, acc: [Reg; 4], a: [Reg; 4], b: [Reg; 2]) {
        let list = |rs: &[Reg]| {
            rs.iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let (acc, a, b) = (list(&acc), list(&a), list(&b));
        self.raw(format_args!(
            "mma.sync.aligned.{shape} {{{acc}}}, {{{a}}}, {{{b}}}, {{{acc}}};"
        ));
    }

    /// `base + idx * scale` as a 64-bit address (`idx` a `u32`).
    pub fn addr(&mut self, base: Reg, idx: Reg, scale: u32) -> Reg {
        let w = self.mul_wide(idx, scale);
        self.bin(Bin::Add, w, base)
    }

    /// Loads a `mem`-typed value at `[addr + off]` into a new register of
    /// type `ty`.
    pub fn ld(&mut self, space: Space, mem: MemTy, ty: Ty, addr: Reg, off: i64) -> Reg {
        let d = self.reg(ty);
        self.raw(format_args!(
            "ld.{}.{} {d}, [{addr}+{off}];",
            space.name(),
            mem.0
        ));
        d
    }

    /// Loads four consecutive `mem`-typed values at `[addr + off]` (which
    /// must be aligned to their total size) into new registers of type
    /// `ty`: one `ld.<space>.v4` instruction.
    pub fn ld_v4(&mut self, space: Space, mem: MemTy, ty: Ty, addr: Reg, off: i64) -> [Reg; 4] {
        let d: [Reg; 4] = std::array::from_fn(|_| self.reg(ty));
        self.raw(format_args!(
            "ld.{}.v4.{} {{{}, {}, {}, {}}}, [{addr}+{off}];",
            space.name(),
            mem.0,
            d[0],
            d[1],
            d[2],
            d[3]
        ));
        d
    }

    /// Stores four registers as consecutive `mem`-typed values at
    /// `[addr + off]` (aligned to their total size): one `st.<space>.v4`.
    pub fn st_v4(&mut self, space: Space, mem: MemTy, addr: Reg, off: i64, v: [Reg; 4]) {
        self.raw(format_args!(
            "st.{}.v4.{} [{addr}+{off}], {{{}, {}, {}, {}}};",
            space.name(),
            mem.0,
            v[0],
            v[1],
            v[2],
            v[3]
        ));
    }

    /// Stores `val` as a `mem`-typed value at `[addr + off]`.
    pub fn st(&mut self, space: Space, mem: MemTy, addr: Reg, off: i64, val: impl Into<Opnd>) {
        let v: Opnd = val.into();
        self.raw(format_args!(
            "st.{}.{} [{addr}+{off}], {v};",
            space.name(),
            mem.0
        ));
    }

    /// The shared-memory address of the dynamic shared array plus `off`
    /// bytes, as a 32-bit shared-window address.
    pub fn smem_base(&mut self) -> Reg {
        self.uses_smem = true;
        let d = self.reg(Ty::U64);
        self.raw(format_args!("mov.u64 {d}, {SMEM};"));
        d
    }

    /// The arena base address (a global pointer).
    pub fn arena(&mut self) -> Reg {
        if let Some(r) = self.arena {
            return r;
        }
        let r = self.param("arena");
        self.arena = Some(r);
        r
    }

    /// The weights base address (a global pointer).
    pub fn weights(&mut self) -> Reg {
        if let Some(r) = self.weights {
            return r;
        }
        let r = self.param("weights");
        self.weights = Some(r);
        r
    }

    fn param(&mut self, name: &str) -> Reg {
        let p = self.reg(Ty::U64);
        self.raw(format_args!("ld.param.u64 {p}, [{name}];"));
        let g = self.reg(Ty::U64);
        self.raw(format_args!("cvta.to.global.u64 {g}, {p};"));
        g
    }

    /// Loads both base pointers now, so that later uses inside branches
    /// refer to registers defined on every path.
    pub fn load_params(&mut self) {
        self.arena();
        self.weights();
    }

    /// A fresh label.
    pub fn label(&mut self) -> Label {
        self.labels += 1;
        Label(self.labels)
    }

    /// Places `l` here.
    pub fn place(&mut self, l: Label) {
        let _ = writeln!(self.body, "{l}:");
    }

    /// Unconditional branch (uniform: every thread of the warp takes it).
    pub fn bra(&mut self, l: Label) {
        self.raw(format_args!("bra.uni {l};"));
    }

    /// Branch to `l` when `p` (or `!p` with `negate`).
    pub fn bra_if(&mut self, p: Reg, negate: bool, l: Label) {
        let n = if negate { "!" } else { "" };
        self.raw(format_args!("@{n}{p} bra {l};"));
    }

    /// Runs `body` only where `p` holds.
    pub fn when(&mut self, p: Reg, body: impl FnOnce(&mut KernelBuilder)) {
        let skip = self.label();
        self.bra_if(p, true, skip);
        body(self);
        self.place(skip);
    }

    /// A counted loop `for i in (start..end).step_by(step)` over `u32`
    /// values; `end` may be a register.
    pub fn for_range(
        &mut self,
        start: impl Into<Opnd>,
        end: impl Into<Opnd>,
        step: impl Into<Opnd>,
        body: impl FnOnce(&mut KernelBuilder, Reg),
    ) {
        let i = self.mov(Ty::U32, start);
        let (top, done) = (self.label(), self.label());
        let end = end.into();
        self.place(top);
        let p = self.setp(Cmp::Ge, i, end);
        self.bra_if(p, false, done);
        body(self, i);
        self.bin_into(i, Bin::Add, i, step);
        self.bra(top);
        self.place(done);
    }

    /// Returns from the kernel where `p` holds.
    pub fn ret_if(&mut self, p: Reg) {
        self.raw(format_args!("@{p} ret;"));
    }

    /// `bar.sync 0`.
    pub fn barrier(&mut self) {
        self.raw(format_args!("bar.sync 0;"));
    }

    /// `shfl.sync.down` of a 32- or 64-bit value across the full warp.
    pub fn shfl_down(&mut self, v: Reg, delta: u32) -> Reg {
        let d = self.reg(v.ty);
        if v.ty.bytes() == 4 {
            self.raw(format_args!(
                "shfl.sync.down.b32 {d}, {v}, {delta}, 31, -1;"
            ));
        } else {
            let (lo, hi) = (self.reg(Ty::U32), self.reg(Ty::U32));
            self.raw(format_args!("mov.b64 {{{lo}, {hi}}}, {v};"));
            let (lo2, hi2) = (self.reg(Ty::U32), self.reg(Ty::U32));
            self.raw(format_args!(
                "shfl.sync.down.b32 {lo2}, {lo}, {delta}, 31, -1;"
            ));
            self.raw(format_args!(
                "shfl.sync.down.b32 {hi2}, {hi}, {delta}, 31, -1;"
            ));
            self.raw(format_args!("mov.b64 {d}, {{{lo2}, {hi2}}};"));
        }
        d
    }

    /// `shfl.sync.idx` of a 32-bit value: every lane gets lane `src`'s `v`.
    pub fn shfl_idx(&mut self, v: Reg, src: u32) -> Reg {
        assert_eq!(v.ty.bytes(), 4, "shfl_idx takes 32-bit values");
        let d = self.reg(v.ty);
        self.raw(format_args!("shfl.sync.idx.b32 {d}, {v}, {src}, 31, -1;"));
        d
    }

    /// Ends the kernel: returns its `.entry` text.
    pub fn finish(mut self) -> String {
        self.raw(format_args!("ret;"));
        let mut s = String::new();
        let [x, y, z] = self.max_threads;
        let _ = writeln!(
            s,
            ".visible .entry {}(\n\t.param .u64 arena,\n\t.param .u64 weights\n)\n.maxntid {x}, {y}, {z}\n{{",
            self.name
        );
        for (c, (prefix, decl)) in CLASSES.iter().enumerate() {
            if self.counts[c] > 0 {
                let _ = writeln!(s, "\t.reg {decl} {prefix}<{}>;", self.counts[c] + 1);
            }
        }
        s.push_str(&self.body);
        s.push_str("}\n");
        s
    }

    /// Whether the kernel reads the dynamic shared array.
    pub fn uses_smem(&self) -> bool {
        self.uses_smem
    }
}

impl Ty {
    /// `mov` accepts bit-size and typed forms; predicates need `pred`.
    fn bits_or_self(self) -> &'static str {
        match self {
            Ty::Pred => "pred",
            t => t.suffix(),
        }
    }
}

/// A PTX module: header and kernels.
pub fn module(ptx_isa: (u32, u32), sm: u32, kernels: &[String], uses_smem: bool) -> String {
    let mut s = format!(
        "//\n// Generated by Kiln\n//\n\n.version {}.{}\n.target sm_{sm}\n.address_size 64\n\n",
        ptx_isa.0, ptx_isa.1
    );
    if uses_smem {
        let _ = writeln!(s, ".extern .shared .align 16 .b8 {SMEM}[];\n");
    }
    for k in kernels {
        s.push_str(k);
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_are_declared_per_class_and_typed_by_operands() {
        let mut k = KernelBuilder::new("k", [32, 1, 1]);
        let a = k.mov(Ty::F32, fimm(Ty::F32, 1.0));
        let b = k.bin(Bin::Add, a, a);
        let i = k.special(Special::TidX);
        let p = k.setp(Cmp::Lt, i, 7u32);
        let _ = k.selp(Ty::F32, p, b, a);
        let text = k.finish();
        assert!(text.contains(".reg .f32 %f<4>;"), "{text}");
        assert!(text.contains(".reg .pred %p<2>;"), "{text}");
        assert!(text.contains("mov.f32 %f1, 0f3F800000;"), "{text}");
        assert!(text.contains("add.rn.f32 %f2, %f1, %f1;"), "{text}");
        assert!(text.contains("setp.lt.u32 %p1, %r1, 7;"), "{text}");
        assert!(text.contains("selp.f32 %f3, %f2, %f1, %p1;"), "{text}");
        assert!(text.trim_end().ends_with("ret;\n}") || text.contains("\tret;\n}"));
    }

    #[test]
    fn loops_branch_on_the_bound_and_labels_are_unique() {
        let mut k = KernelBuilder::new("k", [32, 1, 1]);
        k.for_range(0u32, 10u32, 1u32, |k, i| {
            k.for_range(i, 10u32, 2u32, |_, _| {});
        });
        let text = k.finish();
        for l in 1..=4 {
            assert_eq!(text.matches(&format!("$L{l}:")).count(), 1, "{text}");
        }
        assert_eq!(text.matches("bra.uni").count(), 2, "{text}");
    }

    #[test]
    fn float_immediates_are_exact_hex() {
        assert_eq!(fimm(Ty::F32, -0.5).to_string(), "0fBF000000");
        assert_eq!(fimm(Ty::F64, 1.0).to_string(), "0d3FF0000000000000");
        assert_eq!(Opnd::F32(f32::INFINITY).to_string(), "0f7F800000");
    }
}
