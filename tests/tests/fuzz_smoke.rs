//! The stable-toolchain smoke run of the fuzz targets (`kiln_tests::fuzz`):
//! replays seed corpora built from the fixtures, `fixtures/bad/` and a
//! sample of the ONNX conformance models, then feeds each target random
//! byte-level and structure-aware mutations of its seeds for a fixed time.
//! Every input must give `Ok` or a typed error: a panic fails the test and
//! the input is saved under `target/fuzz-smoke-crashes/` (replay it with
//! `KILN_FUZZ_REPLAY=FILE`); the process's peak RSS must stay under 2 GiB.
//!
//! `KILN_FUZZ_SECONDS` (default 60) is the mutation time per target,
//! `KILN_FUZZ_SEED` the random seed (default: a fixed one, printed),
//! `KILN_FUZZ_CONFORMANCE_STRIDE` which conformance models seed target (a)
//! (every 8th by default; 1 for all). Coverage-guided runs use cargo-fuzz
//! on the same bodies (`fuzz/`, `docs/robustness.md`).

use kiln_onnx::pb::ModelProto;
use kiln_runtime::format::Artifact;
use kiln_test_kit::Rng;
use kiln_tests::{fuzz, repo_root, Fixture};
use prost::Message;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Peak resident set the whole run may reach.
const PEAK_RSS_LIMIT: u64 = 2 << 30;
/// An input slower than this is reported as a hang.
const SLOW_INPUT: Duration = Duration::from_secs(20);

/// Values that break size arithmetic.
const INTERESTING_I64: [i64; 10] = [
    0,
    -1,
    1,
    2,
    255,
    1 << 31,
    1 << 40,
    i64::MAX,
    i64::MIN,
    -(1 << 40),
];

/// One byte-level mutation of `data` (possibly spliced with `other`).
fn mutate_bytes(rng: &mut Rng, data: &mut Vec<u8>, other: &[u8]) {
    let len = data.len();
    match rng.below(8) {
        0 if len > 0 => {
            let i = rng.below(len);
            data[i] ^= 1 << rng.below(8);
        }
        1 if len > 0 => {
            let i = rng.below(len);
            data[i] = *rng.pick(&[0u8, 1, 0x7f, 0x80, 0xff]);
        }
        2 if len >= 8 => {
            let i = rng.below(len - 7);
            let v = *rng.pick(&INTERESTING_I64);
            data[i..i + 8].copy_from_slice(&v.to_le_bytes());
        }
        3 if len > 0 => data.truncate(rng.below(len)),
        4 if len > 0 => {
            let start = rng.below(len);
            let end = (start + 1 + rng.below(64)).min(len);
            data.drain(start..end);
        }
        5 if len > 0 => {
            let start = rng.below(len);
            let end = (start + 1 + rng.below(64)).min(len);
            let chunk = data[start..end].to_vec();
            let at = rng.below(len);
            data.splice(at..at, chunk);
        }
        6 if !other.is_empty() => {
            let at = rng.below(len + 1);
            let from = rng.below(other.len());
            data.truncate(at);
            data.extend_from_slice(&other[from..]);
        }
        _ => {
            let at = rng.below(len + 1);
            let byte = rng.next_u64() as u8;
            data.insert(at, byte);
        }
    }
}

/// A structure-aware mutation of an ONNX model: decoded, one field changed
/// (a dim, an attribute, an initializer's size or type, a node's wiring),
/// encoded again. Falls back to a byte mutation if it does not decode.
fn mutate_onnx(rng: &mut Rng, data: &mut Vec<u8>, other: &[u8]) {
    let Ok(mut m) = ModelProto::decode(data.as_slice()) else {
        return mutate_bytes(rng, data, other);
    };
    let Some(g) = m.graph.as_mut() else {
        return mutate_bytes(rng, data, other);
    };
    let v = *rng.pick(&INTERESTING_I64);
    match rng.below(7) {
        0 if !g.initializer.is_empty() => {
            let t = rng.below(g.initializer.len());
            let t = &mut g.initializer[t];
            if t.dims.is_empty() {
                t.dims.push(v);
            } else {
                let d = rng.below(t.dims.len());
                t.dims[d] = v;
            }
        }
        1 if !g.initializer.is_empty() => {
            let t = rng.below(g.initializer.len());
            g.initializer[t].data_type = *rng.pick(&[0, 1, 2, 3, 6, 7, 9, 10, 11, 16, 999]);
        }
        2 if !g.node.is_empty() => {
            let n = rng.below(g.node.len());
            let node = &mut g.node[n];
            if node.attribute.is_empty() {
                return mutate_bytes(rng, data, other);
            }
            let a = rng.below(node.attribute.len());
            let a = &mut node.attribute[a];
            a.i = v;
            if let Some(x) = a.ints.first_mut() {
                *x = v;
            }
            if let Some(t) = a.t.as_mut() {
                t.dims = vec![v];
            }
        }
        3 if !g.node.is_empty() => {
            // Rewire an input to another value (maybe a later one: a cycle).
            let n = rng.below(g.node.len());
            let names: Vec<String> = g.node.iter().flat_map(|n| n.output.clone()).collect();
            let node = &mut g.node[n];
            if !node.input.is_empty() && !names.is_empty() {
                let i = rng.below(node.input.len());
                node.input[i] = rng.pick(&names).clone();
            }
        }
        4 => {
            for o in &mut m.opset_import {
                o.version = *rng.pick(&[1, 6, 9, 13, 18, 23, 99, 0, -1]);
            }
        }
        5 if !g.input.is_empty() => {
            use kiln_onnx::pb::tensor_shape_proto::dimension::Value;
            use kiln_onnx::pb::type_proto::Value as T;
            let i = rng.below(g.input.len());
            if let Some(T::TensorType(t)) =
                g.input[i].r#type.as_mut().and_then(|t| t.value.as_mut())
            {
                if let Some(s) = t.shape.as_mut().filter(|s| !s.dim.is_empty()) {
                    let d = rng.below(s.dim.len());
                    s.dim[d].value = Some(Value::DimValue(v));
                }
            }
        }
        _ if !g.node.is_empty() => {
            let n = rng.below(g.node.len());
            g.node.remove(n);
        }
        _ => return mutate_bytes(rng, data, other),
    }
    *data = m.encode_to_vec();
}

/// A structure-aware mutation of an artifact: decoded, one table or
/// metadata field changed, encoded again with valid checksums, so only the
/// loader's structural checks stand between it and execution. Prefixed
/// with the "as given" mode byte of [`fuzz::artifact_load`].
fn mutate_artifact(rng: &mut Rng, data: &mut Vec<u8>, other: &[u8]) {
    let parsed = data
        .split_first()
        .and_then(|(_, b)| Artifact::parse(b).ok());
    let Some(mut a) = parsed.filter(|_| rng.below(2) == 0) else {
        // Byte mutations, half of them behind recomputed checksums (mode 1).
        // Mode 0 runs what loads: a byte mutation never passes the
        // checksums, so only seeds run.
        mutate_bytes(rng, data, other);
        if let Some(mode) = data.first_mut() {
            *mode = rng.below(2) as u8;
        }
        return;
    };
    let v = *rng.pick(&INTERESTING_I64) as u64;
    let p = rng.below(a.profiles.len().max(1));
    match rng.below(14) {
        0 if !a.kernels.is_empty() => {
            let k = rng.below(a.kernels.len());
            a.kernels[k].text_offset = v;
        }
        1 if !a.kernels.is_empty() => {
            let k = rng.below(a.kernels.len());
            a.kernels[k].text_len = v;
        }
        2 if !a.relocs.is_empty() => {
            let r = rng.below(a.relocs.len());
            a.relocs[r].offset = v;
        }
        3 if !a.profiles.is_empty() && !a.profiles[p].schedule.is_empty() => {
            let schedule = &mut a.profiles[p].schedule;
            let s = rng.below(schedule.len());
            schedule[s].kernel = v as u32;
        }
        4 if !a.profiles.is_empty() && !a.profiles[p].inputs.is_empty() => {
            let inputs = &mut a.profiles[p].inputs;
            let i = rng.below(inputs.len());
            inputs[i].arena_offset = v;
        }
        5 if !a.profiles.is_empty() && !a.profiles[p].outputs.is_empty() => {
            let outputs = &mut a.profiles[p].outputs;
            let i = rng.below(outputs.len());
            if let Some(d) = outputs[i].shape.first_mut() {
                *d = v;
            }
        }
        6 if !a.profiles.is_empty() => a.profiles[p].arena_size = v,
        7 => a.text.truncate(rng.below(a.text.len() + 1)),
        // The profile table: a duplicate (same input shapes), one input
        // renamed or retyped, none at all, one dropped.
        8 if !a.profiles.is_empty() => {
            let copy = a.profiles[p].clone();
            a.profiles.push(copy);
        }
        9 if !a.profiles.is_empty() && !a.profiles[p].inputs.is_empty() => {
            let mut copy = a.profiles[p].clone();
            copy.inputs[0].name.push('_');
            if let Some(d) = copy.inputs[0].shape.first_mut() {
                *d += 1;
            }
            a.profiles.push(copy);
        }
        10 => a.profiles.truncate(rng.below(a.profiles.len() + 1)),
        // A padding table: an axis of each input, maybe past its rank.
        11 if !a.profiles.is_empty() => {
            let axis = |_| Some(v as u32 % 4);
            a.padding.push(kiln_runtime::format::PaddableDim {
                name: "batch".into(),
                inputs: a.profiles[0].inputs.iter().map(axis).collect(),
                outputs: a.profiles[0].outputs.iter().map(axis).collect(),
            });
        }
        // A role: a variant guarded by any profile, a condition program,
        // a refused path (the runtime picks variants by them).
        12 if !a.profiles.is_empty() => {
            use kiln_runtime::format::{Guard, Role};
            let guards = vec![Guard {
                condition: v as u32 % (a.profiles.len() as u32 + 1),
                holds: rng.below(2) == 0,
            }];
            a.profiles[p].role = match rng.below(3) {
                0 => Role::Condition { what: "c".into() },
                1 => Role::Refused {
                    guards,
                    reason: "r".into(),
                },
                _ => Role::Model { guards },
            };
        }
        _ => a.weights.truncate(rng.below(a.weights.len() + 1)),
    }
    // Mode 1: loaded but never run. The checksums are the writer's own, so
    // only the structural checks stand between the changed fields and the
    // code; a changed artifact is not compiler output and may not be run.
    let mut bytes = vec![1u8];
    bytes.extend_from_slice(&a.to_bytes());
    *data = bytes;
}

/// Stacked mutations can leave a re-encoded (valid-checksum) artifact
/// behind mode 0, which runs what loads. A valid artifact that is not one
/// of the compiler-written seeds is switched to mode 1 (load, never run).
fn never_run_changed_artifacts(input: &mut [u8], seeds: &[Vec<u8>]) {
    let Some((mode, body)) = input.split_first_mut() else {
        return;
    };
    let is_seed = seeds.iter().any(|s| s[1..] == *body);
    if *mode & 1 == 0 && !is_seed && Artifact::parse(body).is_ok() {
        *mode |= 1;
    }
}

/// A mutation of IR text: a byte mutation, or a token replaced by another
/// token from the seeds.
fn mutate_ir(rng: &mut Rng, data: &mut Vec<u8>, other: &[u8]) {
    if rng.below(2) == 0 {
        return mutate_bytes(rng, data, other);
    }
    let text = String::from_utf8_lossy(data).into_owned();
    let tokens: Vec<&str> = text
        .split_inclusive([' ', ',', '(', ')', '[', ']', '\n'])
        .collect();
    let donors: Vec<String> = String::from_utf8_lossy(other)
        .split_inclusive([' ', ',', '(', ')', '[', ']', '\n'])
        .map(str::to_owned)
        .chain([
            "1099511627776,".into(),
            "-1,".into(),
            "f64[".into(),
            "%0 ".into(),
            "%99 ".into(),
        ])
        .collect();
    if tokens.is_empty() {
        return mutate_bytes(rng, data, other);
    }
    let at = rng.below(tokens.len());
    let donor = rng.pick(&donors).clone();
    let mut out = String::new();
    for (i, t) in tokens.iter().enumerate() {
        out.push_str(if i == at { &donor } else { t });
    }
    *data = out.into_bytes();
}

type Body = fn(&[u8]) -> bool;
type Mutator = fn(&mut Rng, &mut Vec<u8>, &[u8]);

struct Target {
    name: &'static str,
    body: Body,
    mutate: Mutator,
    seeds: Vec<Vec<u8>>,
}

/// Counts of one target's run.
#[derive(Default)]
struct Tally {
    executions: u64,
    accepted: u64,
    slowest: Duration,
}

/// Runs `body` on `input`; returns an error message (after saving the
/// input) if it panicked or took too long.
fn execute(target: &Target, input: &[u8], tally: &mut Tally) -> Result<(), String> {
    let start = Instant::now();
    let outcome = catch_unwind(AssertUnwindSafe(|| (target.body)(input)));
    let took = start.elapsed();
    tally.executions += 1;
    tally.slowest = tally.slowest.max(took);
    let problem = match outcome {
        Ok(accepted) => {
            tally.accepted += u64::from(accepted);
            if took <= SLOW_INPUT {
                return Ok(());
            }
            format!("took {took:?}")
        }
        Err(payload) => {
            let msg = (payload.downcast_ref::<String>().cloned())
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            format!("panicked: {msg}")
        }
    };
    let dir = repo_root().join("target/fuzz-smoke-crashes");
    std::fs::create_dir_all(&dir).unwrap();
    let hash: u64 = input.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    let path = dir.join(format!("{}-{hash:016x}", target.name));
    std::fs::write(&path, input).unwrap();
    Err(format!(
        "{}: input {} {problem}",
        target.name,
        path.display()
    ))
}

fn peak_rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    (status.lines())
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn onnx_seeds() -> Vec<Vec<u8>> {
    let root = repo_root();
    let mut paths: Vec<PathBuf> = Fixture::all_names()
        .iter()
        .map(|n| root.join("fixtures/models").join(n).join("model.onnx"))
        .collect();
    let mut bad: Vec<PathBuf> = std::fs::read_dir(root.join("fixtures/bad"))
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    bad.sort();
    paths.extend(bad);
    let stride: usize = std::env::var("KILN_FUZZ_CONFORMANCE_STRIDE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let node_dir = std::env::var_os("KILN_ONNX_TESTS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/onnx-node-tests"))
        .join("node");
    if let Ok(dir) = std::fs::read_dir(&node_dir) {
        let mut cases: Vec<PathBuf> = dir.filter_map(|e| e.ok().map(|e| e.path())).collect();
        cases.sort();
        paths.extend(
            cases
                .iter()
                .step_by(stride.max(1))
                .map(|c| c.join("model.onnx")),
        );
    }
    paths.iter().filter_map(|p| std::fs::read(p).ok()).collect()
}

fn artifact_seeds() -> Vec<Vec<u8>> {
    [
        "digits_mlp",
        "op_add_bcast",
        "op_gather_indices_input",
        "op_conv_basic",
        "op_slice_basic",
        // Variants of run-time control flow and their condition program.
        "control_if_runtime_then",
        // Bounded outputs and the NMS host call.
        "bounded_nms_some",
    ]
    .iter()
    .filter(|n| Fixture::all_names().iter().any(|f| f == *n))
    .filter_map(|n| {
        Fixture::load(n)
            .compile_with(&Fixture::load(n).compile_options())
            .ok()
    })
    .map(|bytes| {
        let mut seed = vec![0u8];
        seed.extend_from_slice(&bytes);
        seed
    })
    .collect()
}

fn ir_seeds() -> Vec<Vec<u8>> {
    let dir = repo_root().join("compiler/ir/src/text/snapshots");
    let mut seeds: Vec<Vec<u8>> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path())
                .collect::<Vec<_>>()
        })
        .unwrap_or_default()
        .into_iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        // Drop insta's front matter: the IR follows the second `---`.
        .filter_map(|s| s.splitn(3, "---\n").nth(2).map(|ir| ir.as_bytes().to_vec()))
        .collect();
    let full = kiln_ir::text::PrintOptions {
        full_constants: true,
    };
    for name in [
        "digits_mlp",
        "op_mixed_conv_bn_relu_pool_opset9",
        "op_gather_indices_input",
        "op_slice_neg_steps",
        "op_concat_axis_neg1",
    ] {
        if let Ok(g) = kiln_onnx::import(
            &Fixture::load(name).model_path(),
            &Fixture::load(name).compile_options().import,
        ) {
            seeds.push(kiln_ir::text::print_with(&g, &full).into_bytes());
        }
    }
    seeds
}

#[test]
fn fuzz_targets_smoke_run() {
    let seconds: u64 = std::env::var("KILN_FUZZ_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let seed: u64 = std::env::var("KILN_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        // A fixed default keeps CI reproducible; set KILN_FUZZ_SEED to explore.
        .unwrap_or(0x6b69_6c6e_2026_1202);
    let targets = [
        Target {
            name: "onnx_compile",
            body: fuzz::onnx_compile,
            mutate: mutate_onnx,
            seeds: onnx_seeds(),
        },
        Target {
            name: "artifact_load",
            body: fuzz::artifact_load,
            mutate: mutate_artifact,
            seeds: artifact_seeds(),
        },
        Target {
            name: "ir_text",
            body: fuzz::ir_text,
            mutate: mutate_ir,
            seeds: ir_seeds(),
        },
    ];
    if let Some(path) = std::env::var_os("KILN_FUZZ_REPLAY") {
        let path = PathBuf::from(path);
        let input = std::fs::read(&path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let target = targets
            .iter()
            .find(|t| name.starts_with(t.name))
            .expect("file named <target>-<hash>");
        execute(target, &input, &mut Tally::default()).unwrap();
        return;
    }
    println!("fuzz smoke run: seed {seed}, {seconds} s of mutations per target");
    let mut failures = Vec::new();
    for target in &targets {
        assert!(!target.seeds.is_empty(), "{}: no seeds", target.name);
        let mut tally = Tally::default();
        for s in &target.seeds {
            if let Err(e) = execute(target, s, &mut tally) {
                failures.push(e);
            }
        }
        let seeds_accepted = tally.accepted;
        let mut rng = Rng::new(seed ^ 0x9E37_79B9_7F4A_7C15 ^ target.name.len() as u64);
        let deadline = Instant::now() + Duration::from_secs(seconds);
        while Instant::now() < deadline && failures.len() < 10 {
            let mut input = rng.pick(&target.seeds).clone();
            let other = rng.pick(&target.seeds).clone();
            // Stack a few mutations, as libFuzzer does.
            for _ in 0..=rng.below(4) {
                (target.mutate)(&mut rng, &mut input, &other);
            }
            if target.name == "artifact_load" {
                never_run_changed_artifacts(&mut input, &target.seeds);
            }
            if let Err(e) = execute(target, &input, &mut tally) {
                failures.push(e);
            }
        }
        println!(
            "{}: {} seeds ({} accepted), {} executions in total, {} accepted, slowest {:?}",
            target.name,
            target.seeds.len(),
            seeds_accepted,
            tally.executions,
            tally.accepted,
            tally.slowest
        );
    }
    let peak = peak_rss_bytes();
    println!("peak RSS {:.0} MiB", peak as f64 / (1 << 20) as f64);
    assert!(
        failures.is_empty(),
        "{} failing input(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        peak <= PEAK_RSS_LIMIT,
        "peak RSS {peak} bytes exceeds {PEAK_RSS_LIMIT}"
    );
}
