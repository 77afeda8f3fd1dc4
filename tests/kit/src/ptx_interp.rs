//! A small PTX interpreter for the subset of PTX the emitter writes, so the
//! kernels' numbers can be checked against the IR reference evaluator on a
//! machine without a GPU.
//!
//! Threads of a block run one at a time until they reach `bar.sync` or a
//! warp shuffle (or finish); when every live thread waits, the shuffles of
//! each warp whose 32 threads all wait at one are resolved, else the
//! barrier is released. `mma.sync` is resolved like a shuffle, from the
//! PTX ISA's fragment layouts of `m16n8k16` (f16/bf16, f32 accumulators:
//! f64 sums of the exact products rounded once to f32; the hardware adds in
//! another order and the comparisons allow for it) and `m16n8k32` (u8/s8,
//! wrapping s32 accumulators, exact). Registers hold
//! raw bits in a `u64`. `ex2.approx` and
//! `lg2.approx` are computed exactly (`exp2`, `log2`), or at the edge of
//! the ISA's error bound under `run_program_at_error_bounds`: the
//! interpreter checks the kernels' logic and that their accuracy does not
//! rest on more than the hardware promises, ptxas checks their syntax, and
//! the GPU script their hardware numbers. Anything outside the subset panics with the
//! instruction, so a new emitter pattern cannot be silently misread.

use std::collections::HashMap;

/// Where the arena and the weights are mapped in the interpreter's global
/// address space.
const ARENA_BASE: u64 = 0x1000_0000;
const WEIGHTS_BASE: u64 = 0x8000_0000;

#[derive(Clone, Debug)]
enum Arg {
    Reg(usize),
    Imm(u64),
    /// `{%r1, %r2, ...}`.
    List(Vec<usize>),
    /// `[%rd + off]` or `[name]`.
    Mem(Option<usize>, i64, Option<String>),
    Label(usize),
    Special(&'static str),
    Symbol(String),
}

#[derive(Clone, Debug)]
struct Inst {
    guard: Option<(bool, usize)>,
    op: Vec<String>,
    args: Vec<Arg>,
    text: String,
}

/// One parsed kernel.
pub struct Kernel {
    insts: Vec<Inst>,
    regs: usize,
}

/// Parses every kernel of a module.
pub fn parse_module(ptx: &str) -> HashMap<String, Kernel> {
    let mut kernels = HashMap::new();
    let mut lines = ptx.lines().peekable();
    while let Some(line) = lines.next() {
        let Some(rest) = line.strip_prefix(".visible .entry ") else {
            continue;
        };
        let name = rest.trim_end_matches('(').to_string();
        let mut body = Vec::new();
        for l in lines.by_ref() {
            if l == "}" {
                break;
            }
            body.push(l);
        }
        kernels.insert(name, parse_kernel(&body));
    }
    kernels
}

fn parse_kernel(body: &[&str]) -> Kernel {
    let mut regs: HashMap<String, usize> = HashMap::new();
    let mut labels: HashMap<String, usize> = HashMap::new();
    let mut count = 0;
    for l in body {
        let t = l.trim();
        if t.starts_with('$') && t.ends_with(':') {
            labels.insert(t.trim_end_matches(':').to_string(), count);
        } else if l.starts_with('\t') && !t.starts_with('.') && !t.is_empty() {
            count += 1;
        }
    }
    let mut insts = Vec::new();
    for l in body {
        let t = l.trim();
        if !l.starts_with('\t') || t.starts_with('.') || t.is_empty() || t.starts_with('$') {
            continue;
        }
        let t = t.trim_end_matches(';');
        let (guard, t) = match t.strip_prefix('@') {
            Some(g) => {
                let (p, rest) = g.split_once(' ').unwrap();
                let (neg, p) = match p.strip_prefix('!') {
                    Some(p) => (true, p),
                    None => (false, p),
                };
                (Some((neg, reg_index(&mut regs, p))), rest)
            }
            None => (None, t),
        };
        let (opcode, rest) = t.split_once(' ').unwrap_or((t, ""));
        let op: Vec<String> = opcode.split('.').map(str::to_string).collect();
        let args = split_args(rest)
            .into_iter()
            .map(|a| parse_arg(&a, &mut regs, &labels))
            .collect();
        insts.push(Inst {
            guard,
            op,
            args,
            text: t.to_string(),
        });
    }
    Kernel {
        insts,
        regs: regs.len(),
    }
}

fn split_args(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '{' | '[' => depth += 1,
            '}' | ']' => depth -= 1,
            _ => {}
        }
        if c == ',' && depth == 0 {
            out.push(cur.trim().to_string());
            cur.clear();
        } else {
            cur.push(c);
        }
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

fn reg_index(regs: &mut HashMap<String, usize>, name: &str) -> usize {
    let n = regs.len();
    *regs.entry(name.to_string()).or_insert(n)
}

fn parse_arg(a: &str, regs: &mut HashMap<String, usize>, labels: &HashMap<String, usize>) -> Arg {
    const SPECIALS: [&str; 6] = [
        "%tid.x", "%tid.y", "%ntid.x", "%ctaid.x", "%ctaid.y", "%ctaid.z",
    ];
    if let Some(s) = SPECIALS.iter().find(|s| **s == a) {
        return Arg::Special(s);
    }
    if let Some(inner) = a.strip_prefix('{') {
        let inner = inner.trim_end_matches('}');
        return Arg::List(
            inner
                .split(',')
                .map(|r| reg_index(regs, r.trim()))
                .collect(),
        );
    }
    if let Some(inner) = a.strip_prefix('[') {
        let inner = inner.trim_end_matches(']');
        if !inner.starts_with('%') {
            return Arg::Mem(None, 0, Some(inner.to_string()));
        }
        let (r, off) = match inner.split_once('+') {
            Some((r, o)) => (r, o.parse().unwrap()),
            None => (inner, 0),
        };
        return Arg::Mem(Some(reg_index(regs, r)), off, None);
    }
    if a.starts_with('%') {
        return Arg::Reg(reg_index(regs, a));
    }
    if a.starts_with('$') {
        return Arg::Label(labels[a]);
    }
    if let Some(h) = a.strip_prefix("0f") {
        return Arg::Imm(u32::from_str_radix(h, 16).unwrap() as u64);
    }
    if let Some(h) = a.strip_prefix("0d") {
        return Arg::Imm(u64::from_str_radix(h, 16).unwrap());
    }
    if let Ok(v) = a.parse::<i64>() {
        return Arg::Imm(v as u64);
    }
    Arg::Symbol(a.to_string())
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Run,
    Barrier,
    /// At a warp-collective instruction (`shfl.sync`, `mma.sync`).
    Warp,
    Done,
}

struct Thread {
    pc: usize,
    regs: Vec<u64>,
    state: State,
    tid: [u32; 2],
}

/// Device memory: the arena and the weights.
pub struct Memory {
    pub arena: Vec<u8>,
    pub weights: Vec<u8>,
}

impl Memory {
    fn slice(&mut self, addr: u64, len: usize) -> &mut [u8] {
        let (buf, base) = if addr >= WEIGHTS_BASE {
            (&mut self.weights, WEIGHTS_BASE)
        } else {
            (&mut self.arena, ARENA_BASE)
        };
        let at = addr.checked_sub(base).expect("address below its buffer") as usize;
        assert!(
            at + len <= buf.len(),
            "access {at}+{len} past a {}-byte buffer",
            buf.len()
        );
        &mut buf[at..at + len]
    }
}

fn f32v(x: u64) -> f32 {
    f32::from_bits(x as u32)
}
fn f64v(x: u64) -> f64 {
    f64::from_bits(x)
}
fn from_f32(x: f32) -> u64 {
    x.to_bits() as u64
}

/// Width in bytes and signedness of a type suffix.
fn ty_info(t: &str) -> (usize, bool) {
    match t {
        "u8" | "b8" => (1, false),
        "s8" => (1, true),
        "u16" | "b16" | "f16" => (2, false),
        "s16" => (2, true),
        "u32" | "b32" => (4, false),
        "s32" => (4, true),
        "f32" => (4, false),
        "u64" | "b64" | "f64" => (8, false),
        "s64" => (8, true),
        _ => panic!("type {t}"),
    }
}

fn extend(raw: u64, t: &str) -> u64 {
    let (w, signed) = ty_info(t);
    if w == 8 {
        return raw;
    }
    let bits = (w * 8) as u32;
    let masked = raw & ((1u64 << bits) - 1);
    if signed && masked >> (bits - 1) == 1 {
        masked | !((1u64 << bits) - 1)
    } else {
        masked
    }
}

/// Runs `kernel` over the launch `grid` × `block` with `shared` bytes of
/// shared memory.
pub fn launch(k: &Kernel, grid: [u32; 3], block: [u32; 3], shared: u32, mem: &mut Memory) {
    for bz in 0..grid[2] {
        for by in 0..grid[1] {
            for bx in 0..grid[0] {
                run_block(k, [bx, by, bz], block, shared, mem);
            }
        }
    }
}

fn run_block(k: &Kernel, ctaid: [u32; 3], block: [u32; 3], shared: u32, mem: &mut Memory) {
    assert_eq!(block[2], 1);
    let mut smem = vec![0u8; shared as usize];
    let mut threads: Vec<Thread> = (0..block[1])
        .flat_map(|y| (0..block[0]).map(move |x| [x, y]))
        .map(|tid| Thread {
            pc: 0,
            regs: vec![0; k.regs],
            state: State::Run,
            tid,
        })
        .collect();
    loop {
        for t in threads.iter_mut() {
            while t.state == State::Run {
                step(k, t, ctaid, block, mem, &mut smem);
            }
        }
        if threads.iter().all(|t| t.state == State::Done) {
            return;
        }
        let mut progressed = false;
        for warp in threads.chunks_mut(32) {
            let live: Vec<usize> = (0..warp.len())
                .filter(|&i| warp[i].state != State::Done)
                .collect();
            if live.is_empty() || !live.iter().all(|&i| warp[i].state == State::Warp) {
                continue;
            }
            let pc = warp[live[0]].pc;
            let inst = &k.insts[pc];
            assert!(
                live.iter().all(|&i| warp[i].pc == pc),
                "divergent {}",
                inst.text
            );
            assert_eq!(live.len(), 32, "{} in a partial warp", inst.text);
            match inst.op[0].as_str() {
                "shfl" => shuffle(inst, warp),
                _ => mma(inst, warp),
            }
            progressed = true;
        }
        if progressed {
            continue;
        }
        assert!(
            threads
                .iter()
                .all(|t| matches!(t.state, State::Barrier | State::Done)),
            "deadlock"
        );
        for t in threads.iter_mut().filter(|t| t.state == State::Barrier) {
            t.state = State::Run;
            t.pc += 1;
        }
    }
}

fn shuffle(inst: &Inst, warp: &mut [Thread]) {
    let (Arg::Reg(d), Arg::Reg(a), Arg::Imm(lane)) = (&inst.args[0], &inst.args[1], &inst.args[2])
    else {
        panic!("shuffle operands: {}", inst.text)
    };
    let vals: Vec<u64> = warp.iter().map(|t| t.regs[*a] & 0xffff_ffff).collect();
    for (i, t) in warp.iter_mut().enumerate() {
        let src = match inst.op[2].as_str() {
            "down" if i + (*lane as usize) < 32 => i + *lane as usize,
            "down" => i,
            "idx" => *lane as usize,
            m => panic!("shuffle mode {m}"),
        };
        t.regs[*d] = vals[src];
        t.state = State::Run;
        t.pc += 1;
    }
}

/// `mma.sync.aligned.m16n8kK.row.col.<acc>.<a>.<b>.<acc> {d}, {a}, {b}, {c}`
/// over the 32 threads of `warp`: `m16n8k16` with f16/bf16 elements and
/// f32 accumulators, `m16n8k32` with u8/s8 elements and wrapping s32
/// ones. A register holds `e` elements (`e` = 2 or 4) of consecutive k,
/// the lowest k in the lowest bits. Lane `l` (group `g = l / 4`, pair
/// `p = l % 4`) holds, in register `r` of `{a}`, A's row `g + 8 (r % 2)`
/// from k `e p + (K/2) (r / 2)`; in register `r` of `{b}`, B's column `g`
/// from k `e p + (K/2) r`; accumulator `i` at row `g + 8 (i / 2)`, column
/// `2p + i % 2`.
fn mma(inst: &Inst, warp: &mut [Thread]) {
    let shape = inst.op.iter().map(String::as_str).collect::<Vec<_>>();
    assert_eq!(
        (&shape[..3], &shape[4..6]),
        (&["mma", "sync", "aligned"][..], &["row", "col"][..]),
        "{}",
        inst.text
    );
    let (acc, ta, tb) = (shape[6], shape[7], shape[8]);
    assert_eq!(acc, shape[9], "{}", inst.text);
    let (k, per_reg) = match (shape[3], acc) {
        ("m16n8k16", "f32") => (16, 2),
        ("m16n8k32", "s32") => (32, 4),
        other => panic!("mma shape {other:?}: {}", inst.text),
    };
    let element = |t: &str, bits: u64| -> f64 {
        match t {
            "bf16" => half::bf16::from_bits(bits as u16).to_f64(),
            "f16" => half::f16::from_bits(bits as u16).to_f64(),
            "u8" => (bits as u8) as f64,
            "s8" => (bits as u8 as i8) as f64,
            other => panic!("mma element type {other}"),
        }
    };
    let width = 32 / per_reg;
    let [Arg::List(d), Arg::List(a), Arg::List(b), Arg::List(c)] = &inst.args[..] else {
        panic!("mma operands: {}", inst.text)
    };
    let (mut am, mut bm) = (vec![[0f64; 32]; 16], vec![[0f64; 8]; 32]);
    let mut cm = [[0u64; 8]; 16];
    for (lane, t) in warp.iter().enumerate() {
        let (g, p) = (lane / 4, lane % 4);
        for (r, &reg) in a.iter().enumerate() {
            let (row, k0) = (g + 8 * (r % 2), per_reg * p + k / 2 * (r / 2));
            for e in 0..per_reg {
                am[row][k0 + e] = element(ta, t.regs[reg] >> (width * e));
            }
        }
        for (r, &reg) in b.iter().enumerate() {
            let k0 = per_reg * p + k / 2 * r;
            for e in 0..per_reg {
                bm[k0 + e][g] = element(tb, t.regs[reg] >> (width * e));
            }
        }
        for (i, &reg) in c.iter().enumerate() {
            cm[g + 8 * (i / 2)][2 * p + i % 2] = t.regs[reg];
        }
    }
    for (lane, t) in warp.iter_mut().enumerate() {
        let (g, p) = (lane / 4, lane % 4);
        for (i, &reg) in d.iter().enumerate() {
            let (row, col) = (g + 8 * (i / 2), 2 * p + i % 2);
            let dot: f64 = (0..k).map(|kk| am[row][kk] * bm[kk][col]).sum();
            t.regs[reg] = match acc {
                "f32" => from_f32((dot + f32v(cm[row][col]) as f64) as f32),
                // Exact: |dot| < 2^53; wrapping like the hardware's s32.
                _ => (cm[row][col] as u32 as i32).wrapping_add(dot as i64 as i32) as u32 as u64,
            };
        }
        t.state = State::Run;
        t.pc += 1;
    }
}

fn step(
    k: &Kernel,
    t: &mut Thread,
    ctaid: [u32; 3],
    block: [u32; 3],
    mem: &mut Memory,
    smem: &mut [u8],
) {
    let inst = &k.insts[t.pc];
    if let Some((neg, p)) = inst.guard {
        if (t.regs[p] != 0) == neg {
            t.pc += 1;
            return;
        }
    }
    let op: Vec<&str> = inst.op.iter().map(String::as_str).collect();
    let val = |t: &Thread, a: &Arg| -> u64 {
        match a {
            Arg::Reg(r) => t.regs[*r],
            Arg::Imm(v) => *v,
            Arg::Special(s) => match *s {
                "%tid.x" => t.tid[0] as u64,
                "%tid.y" => t.tid[1] as u64,
                "%ntid.x" => block[0] as u64,
                "%ctaid.x" => ctaid[0] as u64,
                "%ctaid.y" => ctaid[1] as u64,
                "%ctaid.z" => ctaid[2] as u64,
                _ => unreachable!(),
            },
            Arg::Symbol(s) if s == "kiln_smem" => 0,
            other => panic!("operand {other:?} in {}", inst.text),
        }
    };
    let dst = |a: &Arg| match a {
        Arg::Reg(r) => *r,
        other => panic!("destination {other:?} in {}", inst.text),
    };
    let ty = *op.last().unwrap();
    let args = &inst.args;
    let mut next = t.pc + 1;
    let result: Option<u64> = match op[0] {
        "ret" => {
            t.state = State::Done;
            return;
        }
        "bra" => {
            let Arg::Label(l) = args[0] else {
                panic!("{}", inst.text)
            };
            next = l;
            None
        }
        "bar" => {
            t.state = State::Barrier;
            return;
        }
        "shfl" | "mma" => {
            t.state = State::Warp;
            return;
        }
        "ld" if op[1] == "param" => {
            let Arg::Mem(_, _, Some(name)) = &args[1] else {
                panic!("{}", inst.text)
            };
            Some(if name == "arena" {
                ARENA_BASE
            } else {
                WEIGHTS_BASE
            })
        }
        "cvta" => Some(val(t, &args[1])),
        "ld" | "st" => {
            let (addr_arg, reg_arg) = if op[0] == "ld" {
                (&args[1], &args[0])
            } else {
                (&args[0], &args[1])
            };
            let Arg::Mem(Some(r), off, _) = addr_arg else {
                panic!("{}", inst.text)
            };
            let addr = t.regs[*r].wrapping_add(*off as u64);
            let (w, _) = ty_info(ty);
            // `.v2`/`.v4`: that many consecutive elements, one register each.
            let lanes = match op[2] {
                "v2" => 2,
                "v4" => 4,
                _ => 1,
            };
            let regs: Vec<&Arg> = match (lanes, reg_arg) {
                (1, a) => vec![a],
                (_, Arg::List(_)) => Vec::new(),
                _ => panic!("vector access without a register list: {}", inst.text),
            };
            let list: Vec<usize> = match reg_arg {
                Arg::List(l) => l.clone(),
                _ => Vec::new(),
            };
            assert_eq!(
                (addr as usize) % (w * lanes),
                0,
                "misaligned access: {}",
                inst.text
            );
            let buf: &mut [u8] = if op[1] == "shared" {
                &mut smem[addr as usize..addr as usize + w * lanes]
            } else {
                mem.slice(addr, w * lanes)
            };
            for (lane, chunk) in buf.chunks_mut(w).enumerate() {
                if op[0] == "ld" {
                    let mut raw = [0u8; 8];
                    raw[..w].copy_from_slice(chunk);
                    let v = extend(u64::from_le_bytes(raw), ty);
                    let d = if lanes == 1 { dst(regs[0]) } else { list[lane] };
                    t.regs[d] = v;
                } else {
                    let v = if lanes == 1 {
                        val(t, regs[0])
                    } else {
                        t.regs[list[lane]]
                    };
                    chunk.copy_from_slice(&v.to_le_bytes()[..w]);
                }
            }
            None
        }
        "mov" => match (&args[0], &args[1]) {
            (Arg::List(halves), src) => {
                let v = val(t, src);
                t.regs[halves[0]] = v & 0xffff_ffff;
                t.regs[halves[1]] = v >> 32;
                None
            }
            (_, Arg::List(halves)) => {
                Some((t.regs[halves[0]] & 0xffff_ffff) | (t.regs[halves[1]] << 32))
            }
            (_, src) => Some(val(t, src)),
        },
        "setp" => {
            let (a, b) = (val(t, &args[1]), val(t, &args[2]));
            let r = match ty {
                "f32" | "f64" => {
                    let (x, y) = if ty == "f32" {
                        (f32v(a) as f64, f32v(b) as f64)
                    } else {
                        (f64v(a), f64v(b))
                    };
                    match op[1] {
                        "eq" => x == y,
                        "ne" => x != y && !x.is_nan() && !y.is_nan(),
                        "neu" => x != y,
                        "lt" => x < y,
                        "le" => x <= y,
                        "gt" => x > y,
                        "ge" => x >= y,
                        "nan" => x.is_nan() || y.is_nan(),
                        c => panic!("compare {c}"),
                    }
                }
                _ => {
                    let (signed, x, y) = match ty {
                        "s32" | "s64" => (
                            true,
                            extend(a, ty) as i64 as i128,
                            extend(b, ty) as i64 as i128,
                        ),
                        "u32" => (false, (a & 0xffff_ffff) as i128, (b & 0xffff_ffff) as i128),
                        _ => (false, a as i128, b as i128),
                    };
                    let _ = signed;
                    match op[1] {
                        "eq" => x == y,
                        "ne" => x != y,
                        "lt" => x < y,
                        "le" => x <= y,
                        "gt" => x > y,
                        "ge" => x >= y,
                        c => panic!("compare {c}"),
                    }
                }
            };
            Some(r as u64)
        }
        "selp" => {
            let p = val(t, &args[3]);
            Some(if p != 0 {
                val(t, &args[1])
            } else {
                val(t, &args[2])
            })
        }
        "and" | "or" | "xor" if ty == "pred" => {
            let (a, b) = (val(t, &args[1]) != 0, val(t, &args[2]) != 0);
            Some(match op[0] {
                "and" => a && b,
                "or" => a || b,
                _ => a != b,
            } as u64)
        }
        "cvt" => {
            let (to, from) = (op[op.len() - 2], op[op.len() - 1]);
            let mode = if op.len() == 4 { op[1] } else { "" };
            let x = val(t, &args[1]);
            let fx = match from {
                "f16" => Some(half::f16::from_bits(x as u16).to_f64()),
                "f32" => Some(f32v(x) as f64),
                "f64" => Some(f64v(x)),
                _ => None,
            };
            let ix = extend(x, from) as i64;
            let round = |v: f64| match mode {
                "rzi" => v.trunc(),
                "rmi" => v.floor(),
                "rpi" => v.ceil(),
                "rni" => v.round_ties_even(),
                _ => v,
            };
            Some(match (to, fx) {
                // Only from f32 (exact in f64), so one rounding.
                ("f16", Some(v)) => half::f16::from_f64(v).to_bits() as u64,
                ("f32", Some(v)) => from_f32(round(v) as f32),
                ("f64", Some(v)) => round(v).to_bits(),
                ("s64", Some(v)) => round(v) as i64 as u64,
                // PTX float-to-integer conversions saturate (NaN: 0), as
                // Rust's `as` does.
                ("u32", Some(v)) => round(v) as u32 as u64,
                ("u64", Some(v)) => round(v) as u64,
                ("f32", None) if from == "u64" => from_f32(x as f32),
                ("f32", None) if from.starts_with('u') => from_f32(x as u32 as f32),
                ("f32", None) => from_f32(ix as f32),
                ("f64", None) if from == "u64" => (x as f64).to_bits(),
                ("f64", None) => (ix as f64).to_bits(),
                (_, None) => extend(ix as u64, to),
                other => panic!("cvt {other:?}"),
            })
        }
        _ => Some(arith(
            &op,
            args.iter().skip(1).map(|a| val(t, a)).collect(),
            &inst.text,
        )),
    };
    if let Some(v) = result {
        let d = dst(&args[0]);
        // A conversion's destination type is its first type suffix.
        let dst_ty = if op[0] == "cvt" { op[op.len() - 2] } else { ty };
        let masked = match dst_ty {
            "u16" | "b16" | "f16" => v & 0xffff,
            "u32" | "s32" | "b32" | "f32" => v & 0xffff_ffff,
            _ => v,
        };
        t.regs[d] = masked;
    }
    t.pc = next;
}

fn arith(op: &[&str], v: Vec<u64>, text: &str) -> u64 {
    let ty = *op.last().unwrap();
    match ty {
        "f32" => {
            let x: Vec<f32> = v.iter().map(|&b| f32v(b)).collect();
            from_f32(match op[0] {
                "add" => x[0] + x[1],
                "sub" => x[0] - x[1],
                "mul" => x[0] * x[1],
                "div" => x[0] / x[1],
                "fma" => x[0].mul_add(x[1], x[2]),
                "min" => x[0].min(x[1]),
                "max" => x[0].max(x[1]),
                "neg" => -x[0],
                "abs" => x[0].abs(),
                "sqrt" => x[0].sqrt(),
                "rcp" => 1.0 / x[0],
                "ex2" => at_error_bound(x[0].exp2(), x[0], true),
                "lg2" => at_error_bound(x[0].log2(), x[0], false),
                o => panic!("{o} in {text}"),
            })
        }
        "f64" => {
            let x: Vec<f64> = v.iter().map(|&b| f64v(b)).collect();
            (match op[0] {
                "add" => x[0] + x[1],
                "sub" => x[0] - x[1],
                "mul" => x[0] * x[1],
                "div" => x[0] / x[1],
                "fma" => x[0].mul_add(x[1], x[2]),
                "min" => x[0].min(x[1]),
                "max" => x[0].max(x[1]),
                "neg" => -x[0],
                "abs" => x[0].abs(),
                "sqrt" => x[0].sqrt(),
                "rcp" => 1.0 / x[0],
                o => panic!("{o} in {text}"),
            })
            .to_bits()
        }
        _ if op[0] == "mul" && op[1] == "wide" => (v[0] & 0xffff_ffff) * (v[1] & 0xffff_ffff),
        "u32" | "b32" => {
            let x: Vec<u32> = v.iter().map(|&b| b as u32).collect();
            (match op[0] {
                "add" => x[0].wrapping_add(x[1]),
                "sub" => x[0].wrapping_sub(x[1]),
                "mul" => x[0].wrapping_mul(x[1]),
                "mad" => x[0].wrapping_mul(x[1]).wrapping_add(x[2]),
                "div" => x[0] / x[1],
                "rem" => x[0] % x[1],
                "min" => x[0].min(x[1]),
                "max" => x[0].max(x[1]),
                "and" => x[0] & x[1],
                "or" => x[0] | x[1],
                "xor" => x[0] ^ x[1],
                // PTX clamps shift amounts to the register width.
                "shl" => x[0].checked_shl(x[1]).unwrap_or(0),
                "shr" => x[0].checked_shr(x[1]).unwrap_or(0),
                o => panic!("{o} in {text}"),
            }) as u64
        }
        "s32" => {
            let x: Vec<i32> = v.iter().map(|&b| b as u32 as i32).collect();
            (match op[0] {
                "add" => x[0].wrapping_add(x[1]),
                "sub" => x[0].wrapping_sub(x[1]),
                "mul" => x[0].wrapping_mul(x[1]),
                "mad" => x[0].wrapping_mul(x[1]).wrapping_add(x[2]),
                "min" => x[0].min(x[1]),
                "max" => x[0].max(x[1]),
                o => panic!("{o} in {text}"),
            }) as u32 as u64
        }
        "u64" if matches!(op[0], "div" | "rem" | "min" | "max") => match op[0] {
            "div" => v[0] / v[1],
            "rem" => v[0] % v[1],
            "min" => v[0].min(v[1]),
            _ => v[0].max(v[1]),
        },
        "s64" | "u64" | "b64" => {
            let x: Vec<i64> = v.iter().map(|&b| b as i64).collect();
            (match op[0] {
                "add" => x[0].wrapping_add(x[1]),
                "sub" => x[0].wrapping_sub(x[1]),
                "mul" => x[0].wrapping_mul(x[1]),
                "mad" => x[0].wrapping_mul(x[1]).wrapping_add(x[2]),
                "div" => x[0].wrapping_div(x[1]),
                "rem" => x[0].wrapping_rem(x[1]),
                "min" => x[0].min(x[1]),
                "max" => x[0].max(x[1]),
                "and" => x[0] & x[1],
                "or" => x[0] | x[1],
                "xor" => x[0] ^ x[1],
                // PTX clamps shift amounts (u32) to the register width.
                "shl" => x[0].checked_shl(x[1] as u32).unwrap_or(0),
                "shr" if ty == "s64" => x[0] >> (x[1] as u64).min(63),
                "shr" => (x[0] as u64).checked_shr(x[1] as u32).unwrap_or(0) as i64,
                "neg" => x[0].wrapping_neg(),
                "abs" => x[0].wrapping_abs(),
                o => panic!("{o} in {text}"),
            }) as u64
        }
        o => panic!("type {o} in {text}"),
    }
}

thread_local! {
    /// Whether `ex2.approx`/`lg2.approx` answer at their error bound
    /// ([`run_program_at_error_bounds`]) rather than exactly.
    static AT_ERROR_BOUNDS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// An `ex2.approx`/`lg2.approx` result moved by the PTX ISA's error bound
/// for it (2^-22: relative for `ex2`, absolute for `lg2`), up or down by
/// the input's lowest bit, so that a kernel leaning on more accuracy than
/// the hardware promises (a logarithm of a value near 1, say) fails here
/// as it would on a GPU. Exact unless [`AT_ERROR_BOUNDS`] is set.
fn at_error_bound(exact: f32, input: f32, relative: bool) -> f32 {
    if !exact.is_finite() || !AT_ERROR_BOUNDS.get() {
        return exact;
    }
    let bound = if input.to_bits() & 1 == 0 {
        2f32.powi(-22)
    } else {
        -(2f32.powi(-22))
    };
    if relative {
        exact * (1.0 + bound)
    } else {
        exact + bound
    }
}

/// Runs a whole compiled program on `inputs` (bytes per graph input) and
/// returns each output's bytes, or `Err` when the status word is set.
pub fn run_program(
    p: &kiln_target_cuda::CudaProgram,
    inputs: &[Vec<u8>],
) -> Result<Vec<Vec<u8>>, String> {
    let kernels = parse_module(&p.ptx);
    let mut mem = Memory {
        arena: vec![0u8; p.arena_size as usize],
        weights: p.weights.clone(),
    };
    for (spec, bytes) in p.inputs.iter().zip(inputs) {
        let at = spec.arena_offset as usize;
        mem.arena[at..at + bytes.len()].copy_from_slice(bytes);
    }
    for k in &p.kernels {
        let l = k.launch;
        launch(&kernels[&k.name], l.grid, l.block, l.shared_bytes, &mut mem);
    }
    if mem.arena[..4] != [0; 4] {
        return Err("status word set (index out of range)".into());
    }
    Ok(p.outputs
        .iter()
        .map(|s| {
            let n: usize = s.shape.iter().product::<usize>() * s.dtype.size_bytes();
            mem.arena[s.arena_offset as usize..s.arena_offset as usize + n].to_vec()
        })
        .collect())
}

/// [`run_program`] with `ex2.approx` and `lg2.approx` answering at the
/// edge of their documented error instead of exactly: for checks of
/// accuracy element by element (over a chain of half-precision ops, a
/// result moved by the bound can round the other way at each step, which
/// the scale-relative checks are not meant to follow).
// Used by `targets/cuda/tests/numerics.rs`; kiln-tests' CUDA tests include
// this module too and do not call it.
#[allow(dead_code)]
pub fn run_program_at_error_bounds(
    p: &kiln_target_cuda::CudaProgram,
    inputs: &[Vec<u8>],
) -> Result<Vec<Vec<u8>>, String> {
    AT_ERROR_BOUNDS.set(true);
    let result = run_program(p, inputs);
    AT_ERROR_BOUNDS.set(false);
    result
}

/// Compiles `g` for sm_80, runs it in the interpreter on `inputs`, and
/// compares every output with the reference evaluator: floats within
/// 1e-4 relative to the output's scale (plus NaN where NaN), others exact.
pub fn check_against_reference(g: &kiln_ir::Graph, inputs: &[kiln_ir::Tensor]) {
    check_against_reference_on(kiln_target_cuda::SmArch::parse("sm80").unwrap(), g, inputs)
}

/// [`check_against_reference`] for the architecture `sm`.
pub fn check_against_reference_on(
    sm: kiln_target_cuda::SmArch,
    g: &kiln_ir::Graph,
    inputs: &[kiln_ir::Tensor],
) {
    check_against_reference_within(sm, g, inputs, 1e-4)
}

/// [`check_against_reference_on`] with float outputs within `rel` of
/// their scale: a graph that requantizes may round a value one
/// quantization step the other way when a float sum differs in its last
/// bits.
pub fn check_against_reference_within(
    sm: kiln_target_cuda::SmArch,
    g: &kiln_ir::Graph,
    inputs: &[kiln_ir::Tensor],
    rel: f64,
) {
    let expected = kiln_ir::eval::eval_graph(g, inputs).expect("reference");
    let p = kiln_target_cuda::compile(g, sm).expect("compile");
    let bytes: Vec<Vec<u8>> = inputs.iter().map(|t| t.data().to_le_bytes()).collect();
    let got = run_program(&p, &bytes).expect("run");
    for ((e, g), spec) in expected.iter().zip(&got).zip(&p.outputs) {
        let got = kiln_ir::Data::from_le_bytes(e.dtype(), g).expect("output bytes");
        let name = &spec.name;
        if e.dtype().is_float() {
            let scale = (0..e.len())
                .map(|i| e.data().get_f64(i).abs())
                .filter(|v| v.is_finite())
                .fold(1e-6f64, f64::max);
            // A 16-bit result may round the other way from a value that
            // differs in f32's last bits: one unit in its last place.
            let ulp = match e.dtype() {
                kiln_ir::DType::F16 => 1.0 / 1024.0,
                kiln_ir::DType::BF16 => 1.0 / 128.0,
                _ => 0.0,
            };
            for i in 0..e.len() {
                let (x, y) = (got.get_f64(i), e.data().get_f64(i));
                let tol = (rel * scale).max(ulp * y.abs());
                let ok = (x.is_nan() && y.is_nan()) || x == y || (x - y).abs() <= tol;
                assert!(ok, "{name}[{i}]: got {x}, expected {y} (scale {scale})");
            }
        } else {
            assert_eq!(&got, e.data(), "{name}");
        }
    }
}
