//! The crate graph's invariants (docs/architecture.md), read from
//! `cargo metadata`: dependencies point one way, the runtime carries no
//! compiler crate, and the artifact schema depends on nothing heavy.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use serde_json::Value;

/// The standard output of `cmd` run in the repository; fails the test,
/// with everything it printed, unless it succeeds.
fn stdout_of(mut cmd: Command) -> Vec<u8> {
    let out = cmd
        .current_dir(kiln_tests::repo_root())
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// The workspace's resolved graph: package name -> names of the packages it
/// needs to build and run (normal and build dependencies, not dev ones).
fn dependency_graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut cargo = Command::new(env!("CARGO"));
    cargo.args(["metadata", "--format-version", "1", "--locked", "--offline"]);
    let meta: Value = serde_json::from_slice(&stdout_of(cargo)).expect("cargo metadata JSON");
    let name_of: BTreeMap<&str, &str> = meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|p| (p["id"].as_str().unwrap(), p["name"].as_str().unwrap()))
        .collect();
    let mut graph = BTreeMap::new();
    for node in meta["resolve"]["nodes"].as_array().expect("resolve nodes") {
        let deps = node["deps"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| {
                d["dep_kinds"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|k| k["kind"].is_null() || k["kind"] == "build")
            })
            .map(|d| name_of[d["pkg"].as_str().unwrap()].to_string())
            .collect();
        graph.insert(name_of[node["id"].as_str().unwrap()].to_string(), deps);
    }
    graph
}

/// Every package `root` needs, transitively (not `root` itself).
fn closure(graph: &BTreeMap<String, BTreeSet<String>>, root: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut stack = vec![root.to_string()];
    while let Some(p) = stack.pop() {
        for d in graph.get(&p).into_iter().flatten() {
            if seen.insert(d.clone()) {
                stack.push(d.clone());
            }
        }
    }
    seen
}

/// Crates that belong to the compiler: none of them may reach the runtime.
const COMPILER_CRATES: [&str; 12] = [
    "kiln",
    "kiln-driver",
    "kiln-ir",
    "kiln-onnx",
    "kiln-passes",
    "kiln-target-cpu",
    "kiln-target-cuda",
    "cranelift-codegen",
    "iced-x86",
    "tract-onnx",
    "petgraph",
    "prost",
];

#[test]
fn the_runtime_depends_on_the_format_and_no_compiler_crate() {
    let graph = dependency_graph();
    let needs = closure(&graph, "kiln-runtime");
    assert!(needs.contains("kiln-format"));
    let compiler: Vec<_> = COMPILER_CRATES
        .iter()
        .filter(|c| needs.contains(**c))
        .collect();
    assert!(compiler.is_empty(), "kiln-runtime depends on {compiler:?}");
}

#[test]
fn the_artifact_schema_depends_only_on_sha2_and_thiserror() {
    let graph = dependency_graph();
    let direct: Vec<_> = graph["kiln-format"].iter().map(String::as_str).collect();
    assert_eq!(direct, ["sha2", "thiserror"]);
}

/// The runtime's host kernels (`runtime/host`) are plain Rust on slices,
/// shared by the runtime, the reference evaluator and the importer.
#[test]
fn the_host_kernels_depend_on_nothing() {
    let graph = dependency_graph();
    assert!(graph["kiln-host"].is_empty(), "{:?}", graph["kiln-host"]);
    for user in ["kiln-runtime", "kiln-ir"] {
        assert!(graph[user].iter().any(|d| d == "kiln-host"), "{user}");
    }
}

#[test]
fn dependencies_point_from_the_cli_to_the_ir() {
    let graph = dependency_graph();
    // The graph is read: the CLI reaches every layer.
    let cli = closure(&graph, "kiln");
    assert!([
        "kiln-driver",
        "kiln-ir",
        "kiln-passes",
        "kiln-target-cpu",
        "kiln-runtime",
        "kiln-format"
    ]
    .iter()
    .all(|c| cli.contains(*c)));
    // Each crate and the workspace crates it must never reach.
    let forbidden: [(&str, &[&str]); 7] = [
        ("kiln-format", &["kiln-ir", "kiln-runtime"]),
        (
            "kiln-ir",
            &[
                "kiln-onnx",
                "kiln-passes",
                "kiln-target-cpu",
                "kiln-target-cuda",
                "kiln-runtime",
                "kiln-driver",
                "kiln",
            ],
        ),
        (
            "kiln-onnx",
            &[
                "kiln-passes",
                "kiln-target-cpu",
                "kiln-target-cuda",
                "kiln-runtime",
                "kiln-driver",
                "kiln",
            ],
        ),
        (
            "kiln-passes",
            &[
                "kiln-onnx",
                "kiln-target-cpu",
                "kiln-target-cuda",
                "kiln-runtime",
                "kiln-driver",
                "kiln",
            ],
        ),
        (
            "kiln-target-cpu",
            &[
                "kiln-onnx",
                "kiln-target-cuda",
                "kiln-runtime",
                "kiln-driver",
                "kiln",
            ],
        ),
        (
            "kiln-target-cuda",
            &[
                "kiln-onnx",
                "kiln-target-cpu",
                "kiln-runtime",
                "kiln-driver",
                "kiln",
            ],
        ),
        // The compiler as a library never needs its command line.
        ("kiln-driver", &["kiln"]),
    ];
    // Test helpers never ship.
    for krate in [
        "kiln",
        "kiln-driver",
        "kiln-runtime",
        "kiln-format",
        "kiln-ir",
        "kiln-onnx",
        "kiln-passes",
        "kiln-target-cpu",
        "kiln-target-cuda",
    ] {
        assert!(
            !closure(&graph, krate).contains("kiln-test-kit"),
            "{krate} needs kiln-test-kit"
        );
    }
    for (krate, never) in forbidden {
        let needs = closure(&graph, krate);
        let bad: Vec<_> = never.iter().filter(|c| needs.contains(**c)).collect();
        assert!(bad.is_empty(), "{krate} depends on {bad:?}");
    }
}

#[test]
fn no_module_of_a_crate_imports_one_that_imports_it() {
    // scripts/module_cycles.py: circles between the files of each crate
    // (siblings and cousins; a module may use its ancestors).
    let mut check = Command::new("python3");
    check.arg("scripts/module_cycles.py");
    stdout_of(check);
}
