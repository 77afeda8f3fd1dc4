//! Every fixture model imported and run through the `-O2` pipeline; the
//! reference evaluator must give the same outputs before and after.

mod common;

use kiln_passes::{PassManager, PipelineOptions};
use std::path::{Path, PathBuf};

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/models")
}

fn import(dir: &Path) -> kiln_ir::Graph {
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("meta.json")).unwrap()).unwrap();
    let mut opts = kiln_onnx::ImportOptions::default();
    if let Some(shapes) = meta["input_shapes"].as_object() {
        for (name, dims) in shapes {
            let dims = dims
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap() as usize)
                .collect();
            opts.input_shapes.insert(name.clone(), dims);
        }
    }
    kiln_onnx::import(&dir.join("model.onnx"), &opts)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// The `control_` fixtures branch on run-time values: one graph per path,
/// which a compile enumerates (`kiln_driver`'s variants; their paths are
/// checked against onnxruntime in `tests/tests/fixtures.rs` and through
/// the reference evaluator in `compiler/onnx/tests/fixtures.rs`).
fn runs_time_control_flow(dir: &Path) -> bool {
    dir.file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with("control_"))
}

#[test]
fn o2_preserves_every_fixture() {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(fixtures_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("model.onnx").exists())
        .filter(|p| !runs_time_control_flow(p))
        .collect();
    dirs.sort();
    assert!(dirs.len() > 10, "fixtures not found");
    let pm = PassManager::for_level(2).unwrap();
    let opts = PipelineOptions { verify_each: true };
    for dir in dirs {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let before = import(&dir);
        let mut after = before.clone();
        let report = pm
            .run(&mut after, &opts)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        eprintln!(
            "{name}: {} nodes after import, {} after -O2 ({})",
            before.node_count(),
            after.node_count(),
            report
                .passes
                .iter()
                .map(|p| format!(
                    "{} -{} +{} ~{}",
                    p.name, p.stats.removed, p.stats.added, p.stats.rewritten
                ))
                .collect::<Vec<_>>()
                .join(", ")
        );
        assert!(after.node_count() <= before.node_count(), "{name} grew");
        let inputs = common::random_inputs(&before, 7);
        let want = kiln_ir::eval::eval_graph(&before, &inputs)
            .unwrap_or_else(|e| panic!("{name}: eval before: {e}"));
        let got = kiln_ir::eval::eval_graph(&after, &inputs)
            .unwrap_or_else(|e| panic!("{name}: eval after: {e}"));
        assert_eq!(got.len(), want.len(), "{name}");
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            common::assert_close(&format!("{name} output {k}"), g, w, 1e-5);
        }
    }
}

#[test]
fn levels_name_their_pipelines_and_unknown_levels_are_refused() {
    let names = |l| PassManager::for_level(l).unwrap().names();
    assert!(names(0).is_empty());
    assert_eq!(names(1), ["fold-constants", "dce"]);
    assert!(names(2).contains(&"recognize") && names(2).contains(&"fuse"));
    // -O3 runs the -O2 pipeline (docs/passes.md says why).
    assert_eq!(names(3), names(2));
    let err = PassManager::for_level(4).err().expect("level 4 is refused");
    assert!(err.to_string().contains("use 0, 1, 2 or 3"), "{err}");
}
