//! Reduced-precision builds (`--precision bf16|fp16|mixed`,
//! `docs/precision.md`) on real data:
//!
//! - the digits MLP and CNN keep their test-set accuracy within 0.5 point
//!   of the fp32 build, and the weights section halves in bf16/fp16;
//! - the compiled kernels compute what the reference evaluator says the
//!   reduced-precision graph computes (bf16-rounded operands, f32
//!   accumulation), on the AVX-512 microkernels and on `x86_64-v3`;
//! - the CUDA target refuses bf16 dense nodes by name;
//! - the real models (when fetched): MiniLM-L3 embedding cosine ≥ 0.999
//!   against fp32, PP-OCRv4 rec per-step argmax agreement;
//! - int8 (`--quantize dynamic|static`): the digits MLP keeps its accuracy
//!   within one point with a quarter of the weights, its kernels match the
//!   evaluator, MiniLM-L3's embeddings keep cosine ≥ 0.99.

use kiln_driver::{compile, CompileOptions};
use kiln_passes::{Mode, Policy};
use kiln_runtime::Tensor;
use kiln_tests::{argmax_rows, repo_root, run_artifact, Fixture};

/// Kernel vs reference evaluator: max abs error relative to the output's
/// scale. Both read the same 16-bit operands; what differs is the order of
/// the f32 (kernel) and f64 (evaluator) accumulation.
const KERNEL_VS_EVAL: f64 = 1e-4;

fn with_precision(mut opts: CompileOptions, mode: Mode) -> CompileOptions {
    opts.precision = Policy {
        mode,
        ..Policy::default()
    };
    opts.calibrate_random = 0;
    opts
}

fn ir_tensor(t: &Tensor) -> kiln_ir::Tensor {
    let shape: Vec<usize> = t.shape.iter().map(|&d| d as usize).collect();
    let data = match t.to_f32_vec() {
        Some(v) => kiln_ir::Data::F32(v),
        None => kiln_ir::Data::I64(t.to_i64_vec().expect("f32 or i64 input")),
    };
    kiln_ir::Tensor::new(shape, data).expect("element count")
}

/// Max abs difference over the largest reference magnitude.
fn rel_max(got: &[f32], want: &[f32]) -> f64 {
    let scale = want.iter().fold(1e-12f64, |m, &x| m.max((x as f64).abs()));
    got.iter()
        .zip(want)
        .map(|(&a, &b)| (a as f64 - b as f64).abs())
        .fold(0.0, f64::max)
        / scale
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    let na: f64 = a.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

/// The kernel outputs of a compiled build against `kiln_ir::eval` of its
/// final graph.
fn check_kernels_against_eval(
    name: &str,
    compiled: &kiln_driver::Compiled,
    inputs: &[Tensor],
) -> Vec<Tensor> {
    let outputs = run_artifact(&compiled.bytes, inputs).unwrap();
    let ir_inputs: Vec<kiln_ir::Tensor> = inputs.iter().map(ir_tensor).collect();
    let want = kiln_ir::eval::eval_graph(&compiled.graph, &ir_inputs).unwrap();
    for (o, w) in outputs.iter().zip(&want) {
        let err = rel_max(&o.to_f32_vec().unwrap(), &w.to_f32_vec());
        assert!(
            err <= KERNEL_VS_EVAL,
            "{name}: output {} kernel vs eval {err:.3e}",
            o.name
        );
    }
    outputs
}

/// A digits model with its test set: images (the whole set as one batch),
/// labels, and the compile options for that batch.
struct Digits {
    fixture: Fixture,
    images: Tensor,
    labels: Vec<i64>,
    base: CompileOptions,
}

impl Digits {
    fn load(name: &str) -> Digits {
        let fixture = Fixture::load(name);
        let acc = &fixture.meta["accuracy"];
        let images = kiln_driver::npy::read_tensor(
            acc["input"].as_str().unwrap(),
            &fixture.dir.join(acc["images"].as_str().unwrap()),
        )
        .unwrap();
        let labels = kiln_driver::npy::read_tensor(
            "labels",
            &fixture.dir.join(acc["labels"].as_str().unwrap()),
        )
        .unwrap()
        .to_i64_vec()
        .unwrap();
        let mut base = fixture.compile_options();
        base.import.input_shapes.insert(
            images.name.clone(),
            images.shape.iter().map(|&d| d as usize).collect(),
        );
        Digits {
            fixture,
            images,
            labels,
            base,
        }
    }

    /// Test-set accuracy of the model's outputs.
    fn score(&self, outs: &[Tensor]) -> f64 {
        let name = self.fixture.meta["accuracy"]["output"].as_str().unwrap();
        let scores = outs.iter().find(|t| t.name == name).unwrap();
        let correct = argmax_rows(scores)
            .iter()
            .zip(&self.labels)
            .filter(|(p, l)| **p as i64 == **l)
            .count();
        correct as f64 / self.labels.len() as f64
    }
}

fn digits(name: &str) {
    let digits = Digits::load(name);
    let (fixture, images, base) = (&digits.fixture, &digits.images, &digits.base);
    let score = |outs: &[Tensor]| digits.score(outs);
    let fp32 = compile(&fixture.model_path(), base).unwrap();
    let acc32 = score(&run_artifact(&fp32.bytes, std::slice::from_ref(images)).unwrap());
    let w32 = fp32.artifact.weights.len();
    println!("{name} fp32: accuracy {acc32:.4}, weights {w32} B");
    for mode in [Mode::Bf16, Mode::Mixed, Mode::Fp16] {
        let opts = with_precision(base.clone(), mode);
        let c = compile(&fixture.model_path(), &opts).unwrap();
        let outs = check_kernels_against_eval(name, &c, std::slice::from_ref(images));
        let a = score(&outs);
        let w = c.artifact.weights.len();
        println!(
            "{name} {}: accuracy {a:.4} ({:+.2} points), weights {w} B ({:.2}x)",
            mode.name(),
            (a - acc32) * 100.0,
            w as f64 / w32 as f64
        );
        assert!(
            (a - acc32).abs() <= 0.005,
            "{name} {}: accuracy {a} vs fp32 {acc32}",
            mode.name()
        );
        if mode != Mode::Mixed {
            // Every dense weight is 16-bit; biases stay f32.
            assert!(
                (w as f64) < 0.55 * w32 as f64,
                "{name} {}: weights {w} B vs fp32 {w32} B",
                mode.name()
            );
        }
    }
}

#[test]
fn digits_mlp_int8_dynamic_and_static_keep_accuracy() {
    digits_int8("digits_mlp");
}

#[test]
fn digits_cnn_int8_dynamic_and_static_keep_accuracy() {
    digits_int8("digits_cnn");
}

/// Every dense layer of digits model `name` in int8 (dynamic, and static
/// with each observer; u8 and symmetric int8 activations): test-set accuracy within 1 point of fp32, the
/// compiled kernels matching the reference evaluator, i8 weights.
fn digits_int8(name: &str) {
    let digits = Digits::load(name);
    let (fixture, images, base) = (&digits.fixture, &digits.images, &digits.base);
    let score = |outs: &[Tensor]| digits.score(outs);
    let fp32 = compile(&fixture.model_path(), base).unwrap();
    let acc32 = score(&run_artifact(&fp32.bytes, std::slice::from_ref(images)).unwrap());
    let w32 = fp32.artifact.weights.len();
    // Static ranges are observed on the test images themselves: this checks
    // the static path and its accuracy, not how a calibration set
    // generalizes.
    let calibration = tempfile::tempdir().unwrap();
    kiln_driver::npy::write_npz(
        &calibration.path().join("test_set.npz"),
        std::slice::from_ref(images),
    )
    .unwrap();
    use kiln_driver::Smooth;
    use kiln_passes::{ActivationType, Observer};
    use ActivationType::{Int8, Uint8};
    // (static ranges, observer, activation type, smoothing)
    for (static_activations, observer, activation_type, smooth) in [
        (false, Observer::MinMax, Uint8, Smooth::Auto),
        (true, Observer::MinMax, Uint8, Smooth::Auto),
        (true, Observer::MinMax, Uint8, Smooth::Off),
        (true, Observer::Percentile(99.99), Uint8, Smooth::Off),
        (true, Observer::Entropy, Uint8, Smooth::Off),
        (false, Observer::MinMax, Int8, Smooth::Auto),
        (true, Observer::MinMax, Int8, Smooth::Auto),
        (false, Observer::MinMax, Uint8, Smooth::Alpha(0.5)),
    ] {
        let mut opts = with_precision(base.clone(), Mode::Int8);
        opts.static_activations = static_activations;
        opts.observer = observer;
        opts.precision.activation_type = activation_type;
        opts.smooth = smooth;
        if static_activations || smooth != Smooth::Auto {
            opts.calibrate = Some(calibration.path().to_path_buf());
            opts.calibrate_random = 1;
        }
        let c = compile(&fixture.model_path(), &opts).unwrap();
        let int8 = c
            .graph
            .node_ids()
            .filter(|&id| c.graph.node(id).op.is_integer_product())
            .count();
        let dense = fp32
            .graph
            .node_ids()
            .filter(|&id| {
                matches!(
                    fp32.graph.node(id).op,
                    kiln_ir::Op::MatMul | kiln_ir::Op::Gemm { .. } | kiln_ir::Op::Conv(_)
                ) || matches!(&fp32.graph.node(id).op, kiln_ir::Op::Fused(k) if k.head().is_some())
            })
            .count();
        assert!(
            int8 >= 2 && int8 == dense,
            "{name}: every dense layer is int8, got {int8} of {dense}"
        );
        if static_activations {
            // The report measures each int8 layer's quantization error
            // under its ONNX name.
            let report = (c.precision.as_ref())
                .and_then(|p| p.report.as_ref())
                .expect("a calibrated build has a report");
            let layers: Vec<_> = (report.layers.iter())
                .filter(|l| l.precision == kiln_passes::Precision::Int8)
                .collect();
            assert_eq!(layers.len(), int8, "{:?}", report.layers);
            for l in layers {
                // Accumulated error: 0.115 at the logits (fc2, minmax).
                assert!(l.rel_l2 > 0.0 && l.rel_l2 < 0.5, "{l:?}");
            }
        }
        let outs =
            check_kernels_against_eval(&format!("{name} int8"), &c, std::slice::from_ref(images));
        let a = score(&outs);
        let w = c.artifact.weights.len();
        println!(
            "{name} int8 {} {activation_type} activations, smoothing {smooth:?}: accuracy {a:.4} ({:+.2} points vs fp32 {acc32:.4}), weights {w} B ({:.2}x)",
            if static_activations { format!("static {observer}") } else { "dynamic".into() },
            (a - acc32) * 100.0,
            w as f64 / w32 as f64
        );
        assert!(
            (a - acc32).abs() <= 0.01,
            "{name} int8: accuracy {a} vs fp32 {acc32}"
        );
        // i8 weights and f32 per-column scales and biases.
        assert!(
            (w as f64) < 0.40 * w32 as f64,
            "int8 weights {w} B vs {w32} B"
        );
    }
}

#[test]
fn digits_mlp_bf16_mixed_fp16_keep_accuracy() {
    digits("digits_mlp");
}

#[test]
fn digits_cnn_bf16_mixed_fp16_keep_accuracy() {
    digits("digits_cnn");
}

#[test]
fn fp32_precision_leaves_the_artifact_unchanged() {
    let fixture = Fixture::load("digits_mlp");
    let opts = fixture.compile_options();
    let plain = compile(&fixture.model_path(), &opts).unwrap();
    let explicit = compile(&fixture.model_path(), &with_precision(opts, Mode::Fp32)).unwrap();
    assert_eq!(plain.bytes, explicit.bytes);
    assert!(explicit.precision.is_none());
}

#[test]
fn bf16_on_x86_64_v3_widens_to_f32_and_matches_eval() {
    if !std::arch::is_x86_feature_detected!("avx2") || !std::arch::is_x86_feature_detected!("fma") {
        eprintln!("host cannot run x86_64-v3 code");
        return;
    }
    for name in ["digits_mlp", "digits_cnn"] {
        let fixture = Fixture::load(name);
        let mut opts = with_precision(fixture.compile_options(), Mode::Bf16);
        opts.target = "x86_64-v3".parse().unwrap();
        let c = compile(&fixture.model_path(), &opts).unwrap();
        check_kernels_against_eval(name, &c, &fixture.inputs());
    }
}

#[test]
fn cuda_runs_bf16_dense_nodes_on_tensor_cores_from_sm80() {
    // The artifact's PTX: `mma.sync` bf16 GEMMs for sm_80, the SIMT GEMM
    // (widening bf16 loads) for sm_75. Their numbers are checked by the
    // PTX interpreter (`cuda_numerics.rs`).
    let fixture = Fixture::load("digits_mlp");
    for (sm, tensor_cores) in [("80", true), ("75", false)] {
        let mut opts = with_precision(fixture.compile_options(), Mode::Bf16);
        opts.target =
            kiln_driver::target::Target::Cuda(kiln_target_cuda::SmArch::parse(sm).unwrap());
        let c = compile(&fixture.model_path(), &opts).unwrap();
        let view = kiln_runtime::format::ArtifactView::parse(&c.bytes).unwrap();
        let kiln_runtime::format::Code::Cuda(code) = view.code().unwrap() else {
            panic!("a CUDA artifact");
        };
        assert_eq!(
            code.ptx
                .contains("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"),
            tensor_cores,
            "sm_{sm}"
        );
        assert!(code.ptx.contains("ld.global.u16"), "sm_{sm}: bf16 loads");
    }
}

fn real_model(name: &str) -> Option<Fixture> {
    let root = std::env::var_os("KILN_REAL_MODELS")
        .map(Into::into)
        .unwrap_or_else(|| repo_root().join("target/real-models"));
    let dir = root.join(name);
    if !dir.join("meta.json").exists() {
        assert!(
            std::env::var("KILN_REQUIRE_REAL_MODELS").as_deref() != Ok("1"),
            "real model {name} missing under {}",
            root.display()
        );
        eprintln!("skipping: real model {name} not fetched (fixtures/make_real.py)");
        return None;
    }
    Some(Fixture::load_dir(&dir))
}

#[test]
fn minilm_bf16_and_mixed_embeddings_keep_cosine() {
    let Some(fixture) = real_model("minilm_l3") else {
        return;
    };
    let inputs = fixture.inputs();
    let fp32 = compile(&fixture.model_path(), &fixture.compile_options()).unwrap();
    let ref_out = run_artifact(&fp32.bytes, &inputs).unwrap();
    for mode in [Mode::Bf16, Mode::Mixed, Mode::Fp16] {
        let c = compile(
            &fixture.model_path(),
            &with_precision(fixture.compile_options(), mode),
        )
        .unwrap();
        let out = run_artifact(&c.bytes, &inputs).unwrap();
        // The float outputs (the export also passes integer tensors through).
        let mut compared = 0;
        for (got, want) in out.iter().zip(&ref_out) {
            let (Some(got), Some(want)) = (got.to_f32_vec(), want.to_f32_vec()) else {
                continue;
            };
            let cos = cosine(&got, &want);
            println!(
                "minilm_l3 {}: output cosine vs fp32 {cos:.6}, weights {} B vs {} B",
                mode.name(),
                c.artifact.weights.len(),
                fp32.artifact.weights.len()
            );
            assert!(cos >= 0.999, "minilm {}: cosine {cos}", mode.name());
            compared += 1;
        }
        assert_eq!(compared, 2, "minilm has two float outputs");
        // Every weight in 16 bits, the 47 MB word-embedding table too
        // (mixed: but the first and last dense layer).
        assert!(
            c.artifact.weights.len() * 100 < fp32.artifact.weights.len() * 55,
            "minilm {}: weights {} B",
            mode.name(),
            c.artifact.weights.len()
        );
    }
}

#[test]
fn minilm_int8_dynamic_embeddings_keep_cosine() {
    let Some(fixture) = real_model("minilm_l3") else {
        return;
    };
    let inputs = fixture.inputs();
    let fp32 = compile(&fixture.model_path(), &fixture.compile_options()).unwrap();
    let ref_out = run_artifact(&fp32.bytes, &inputs).unwrap();
    let c = compile(
        &fixture.model_path(),
        &with_precision(fixture.compile_options(), Mode::Int8),
    )
    .unwrap();
    let out = run_artifact(&c.bytes, &inputs).unwrap();
    let mut compared = 0;
    for (got, want) in out.iter().zip(&ref_out) {
        let (Some(got), Some(want)) = (got.to_f32_vec(), want.to_f32_vec()) else {
            continue;
        };
        let cos = cosine(&got, &want);
        println!(
            "minilm_l3 int8 dynamic: output cosine vs fp32 {cos:.6}, weights {} B vs {} B",
            c.artifact.weights.len(),
            fp32.artifact.weights.len()
        );
        assert!(cos >= 0.99, "minilm int8: cosine {cos}");
        compared += 1;
    }
    assert_eq!(compared, 2, "minilm has two float outputs");
    // Every weight in int8, the word-embedding table (per row) too.
    assert!(
        c.artifact.weights.len() * 100 < fp32.artifact.weights.len() * 27,
        "minilm int8: weights {} B",
        c.artifact.weights.len()
    );
}

#[test]
fn ppocr_rec_bf16_keeps_per_step_argmax() {
    let Some(fixture) = real_model("ppocrv4_rec") else {
        return;
    };
    let inputs = fixture.inputs();
    let fp32 = compile(&fixture.model_path(), &fixture.compile_options()).unwrap();
    let ref_out = run_artifact(&fp32.bytes, &inputs).unwrap();
    for mode in [Mode::Bf16, Mode::Mixed] {
        let c = compile(
            &fixture.model_path(),
            &with_precision(fixture.compile_options(), mode),
        )
        .unwrap();
        let out = run_artifact(&c.bytes, &inputs).unwrap();
        let (a, b) = (argmax_rows(&out[0]), argmax_rows(&ref_out[0]));
        let agree = a.iter().zip(&b).filter(|(x, y)| x == y).count() as f64 / a.len() as f64;
        println!(
            "ppocrv4_rec {}: per-step argmax agreement {agree:.4} over {} steps",
            mode.name(),
            a.len()
        );
        assert!(
            agree >= 0.99,
            "ppocr rec {}: agreement {agree}",
            mode.name()
        );
    }
}

/// Lines the text-line tests calibrate on (`CALIBRATION` in
/// `fixtures/make_text_lines.py`); the others are the test set.
const CALIBRATION_LINES: usize = 8;

/// The rendered text lines of `fixtures/text_lines/<file>.npy` (uint8, one
/// gray channel) as PaddleOCR feeds them to its models: 1×3×H×W f32,
/// `(x/255 − 0.5)/0.5` on every channel, and each line also turned by
/// 180° (the cls model's other class).
fn text_lines(file: &str, input: &str) -> (Vec<Tensor>, Vec<Tensor>) {
    let path = repo_root().join(format!("fixtures/text_lines/{file}.npy"));
    let lines = kiln_driver::npy::read_tensor(input, &path).unwrap();
    let pixels: Vec<u8> = lines.to_vec().expect("uint8 text lines");
    let (n, h, w) = (lines.shape[0], lines.shape[1], lines.shape[2]);
    let plane = (h * w) as usize;
    let image = |gray: &mut dyn Iterator<Item = &u8>| {
        let one: Vec<f32> = gray.map(|&p| (p as f32 / 255.0 - 0.5) / 0.5).collect();
        Tensor::from_f32(input, &[1, 3, h, w], &one.repeat(3))
    };
    let upright = (0..n as usize)
        .map(|i| image(&mut pixels[i * plane..(i + 1) * plane].iter()))
        .collect();
    let turned = (0..n as usize)
        .map(|i| image(&mut pixels[i * plane..(i + 1) * plane].iter().rev()))
        .collect();
    (upright, turned)
}

/// PP-OCR rec and cls in int8 (`--quantize static`) on real text: English
/// lines rendered by `fixtures/make_text_lines.py` (onnxruntime's fp32 rec
/// reads them back as written, up to spaces). Calibrated on the first
/// lines, tested on the others (cls, whose job is to tell, upright and
/// turned by 180°): the argmax of every output row (rec: each of its 40
/// time steps) agrees with fp32 on at least 99% of the rows.
///
/// Both meet it with every eligible layer in int8, as a calibrated static
/// build comes by default: activations smoothed (α 0.5) and biases
/// corrected. rec agrees on 636 of 640 steps; with smoothing off 626
/// (checked here at 0.975: 628 before the depthwise kernel split its
/// taps over several accumulators, a change of f32 summation order that
/// moved two near-tied steps), and 629 with neither; the flips left are
/// steps where fp32's two best
/// classes (mostly blank against space) are within 0.42 of each other
/// (`docs/precision.md`).
#[test]
fn ppocr_int8_static_keeps_argmax() {
    for (name, file) in [("ppocr_cls", "cls"), ("ppocrv4_rec", "rec")] {
        // cls is a committed fixture, rec is fetched.
        let fixture = match name {
            "ppocr_cls" => Fixture::load(name),
            _ => match real_model(name) {
                Some(f) => f,
                None => continue,
            },
        };
        let input = fixture.inputs().remove(0).name;
        let (mut upright, mut turned) = text_lines(file, &input);
        let (test_upright, test_turned) = (
            upright.split_off(CALIBRATION_LINES),
            turned.split_off(CALIBRATION_LINES),
        );
        let calibration = tempfile::tempdir().unwrap();
        let mut samples = upright;
        if name == "ppocr_cls" {
            samples.extend(turned);
        }
        for (i, t) in samples.into_iter().enumerate() {
            let path = calibration.path().join(format!("line{i:02}.npz"));
            kiln_driver::npy::write_npz(&path, &[t]).unwrap();
        }
        let mut tests = test_upright;
        if name == "ppocr_cls" {
            tests.extend(test_turned);
        }
        let fp32 = compile(&fixture.model_path(), &fixture.compile_options()).unwrap();
        let fp32_rows: Vec<Vec<usize>> = (tests.iter())
            .map(|t| argmax_rows(&run_artifact(&fp32.bytes, std::slice::from_ref(t)).unwrap()[0]))
            .collect();
        let rows = fp32_rows.iter().map(Vec::len).sum::<usize>();
        if name == "ppocr_cls" {
            // The inputs are what cls is for: fp32 tells upright (class 0)
            // from turned (class 1) on (nearly) every test line.
            let lines = fp32_rows.len() / 2;
            let right = (fp32_rows.iter().enumerate())
                .filter(|(i, r)| r[0] == usize::from(*i >= lines))
                .count();
            assert!(
                right + 1 >= fp32_rows.len(),
                "cls fp32 orientation: {right}"
            );
        } else {
            // Text, not blanks: fp32 reads a character on many steps.
            let read = fp32_rows.iter().flatten().filter(|&&k| k != 0).count();
            assert!(read * 3 >= rows, "rec fp32 reads {read} of {rows} steps");
        }
        // (the smoothing, the agreement it must reach)
        use kiln_driver::Smooth;
        let builds: &[(Smooth, f64)] = match name {
            "ppocr_cls" => &[(Smooth::Auto, 0.99)],
            _ => &[(Smooth::Off, 0.975), (Smooth::Auto, 0.99)],
        };
        for &(smooth, bar) in builds {
            let mut opts = with_precision(fixture.compile_options(), Mode::Int8);
            opts.static_activations = true;
            opts.calibrate = Some(calibration.path().to_path_buf());
            opts.smooth = smooth;
            let int8 = compile(&fixture.model_path(), &opts).unwrap();
            let convs = (int8.graph.node_ids())
                .filter(|&id| int8.graph.node(id).op.is_integer_product())
                .count();
            assert!(convs > 10, "{name}: {convs} int8 layers");
            let mut agree = 0;
            for (t, b) in tests.iter().zip(&fp32_rows) {
                let a = run_artifact(&int8.bytes, std::slice::from_ref(t)).unwrap();
                agree += argmax_rows(&a[0])
                    .iter()
                    .zip(b)
                    .filter(|(p, q)| p == q)
                    .count();
            }
            let share = agree as f64 / rows as f64;
            println!(
                "{name} int8 static (smoothing {smooth:?}): argmax agreement {share:.4} over {rows} rows, {convs} int8 layers, weights {} B vs {} B",
                int8.artifact.weights.len(),
                fp32.artifact.weights.len()
            );
            assert!(share >= bar, "{name}: argmax agreement {share} < {bar}");
        }
    }
}

/// The digits MLP at batch 8 and a directory of `samples` calibration
/// files cut from its test set (8 images each).
fn mlp_with_calibration(samples: usize) -> (Fixture, CompileOptions, tempfile::TempDir) {
    let fixture = Fixture::load("digits_mlp");
    let images =
        kiln_driver::npy::read_tensor("input", &fixture.dir.join("inputs/input.npy")).unwrap();
    let pixels = images.to_f32_vec().unwrap();
    let mut base = fixture.compile_options();
    base.import.input_shapes.insert("input".into(), vec![8, 64]);
    let dir = tempfile::tempdir().unwrap();
    for s in 0..samples {
        let rows = &pixels[s * 8 * 64..(s + 1) * 8 * 64];
        let t = Tensor::from_f32("input", &[8, 64], rows);
        kiln_driver::npy::write_npz(&dir.path().join(format!("sample{s:02}.npz")), &[t]).unwrap();
    }
    (fixture, base, dir)
}

#[test]
fn calibration_directories_are_checked_before_any_work() {
    let (fixture, base, dir) = mlp_with_calibration(3);
    let mut opts = with_precision(base, Mode::Bf16);
    opts.calibrate = Some(dir.path().to_path_buf());
    let c = compile(&fixture.model_path(), &opts).unwrap();
    let report = c.precision.unwrap().report.unwrap();
    assert_eq!(report.samples, 3);
    assert!(!report.random);

    let refused = |files: &[(&str, Vec<Tensor>)], needles: &[&str]| {
        let bad = tempfile::tempdir().unwrap();
        for (name, tensors) in files {
            kiln_driver::npy::write_npz(&bad.path().join(name), tensors).unwrap();
        }
        let mut o = opts.clone();
        o.calibrate = Some(bad.path().to_path_buf());
        let Err(e) = compile(&fixture.model_path(), &o) else {
            panic!("bad calibration data {files:?} was accepted")
        };
        assert!(
            matches!(e, kiln_driver::DriverError::Calibration { .. }),
            "{e:?}"
        );
        for n in needles {
            assert!(e.to_string().contains(n), "expected '{n}' in: {e}");
        }
    };
    let good = || Tensor::from_f32("input", &[8, 64], &[0.5; 512]);
    refused(&[], &["no .npz"]);
    refused(
        &[("a.npz", vec![Tensor::from_f32("x", &[8, 64], &[0.5; 512])])],
        &["a.npz", "'x'", "not a model input", "input"],
    );
    refused(
        &[(
            "a.npz",
            vec![good(), Tensor::from_f32("labels", &[1], &[1.0])],
        )],
        &["'labels'"],
    );
    refused(
        &[(
            "b.npz",
            vec![Tensor::from_f32("input", &[4, 64], &[0.5; 256])],
        )],
        &["b.npz", "'input'", "f32[4,64]", "f32[8,64]"],
    );
    refused(
        &[(
            "c.npz",
            vec![Tensor::from_i64("input", &[8, 64], &[1; 512])],
        )],
        &["c.npz", "i64"],
    );
    let mut nan = vec![0.5f32; 512];
    nan[77] = f32::NAN;
    refused(
        &[
            ("ok.npz", vec![good()]),
            ("z.npz", vec![Tensor::from_f32("input", &[8, 64], &nan)]),
        ],
        &["z.npz", "non-finite", "77"],
    );
}

#[test]
fn max_rel_error_raises_layers_until_the_outputs_meet_it() {
    let (fixture, base, dir) = mlp_with_calibration(4);
    let mut opts = with_precision(base, Mode::Fp16);
    opts.calibrate = Some(dir.path().to_path_buf());
    let worst_output = |c: &kiln_driver::Compiled| {
        let report = c.precision.as_ref().unwrap().report.as_ref().unwrap();
        report.outputs.iter().map(|o| o.rel_l2).fold(0.0, f64::max)
    };
    let raised = |c: &kiln_driver::Compiled| {
        c.precision
            .as_ref()
            .unwrap()
            .decisions
            .iter()
            .filter(|d| matches!(d.reason, kiln_passes::Reason::ErrorFallback(_)))
            .count()
    };
    let free = compile(&fixture.model_path(), &opts).unwrap();
    let e0 = worst_output(&free);
    assert!(e0 > 0.0, "fp16 must change the outputs");
    assert_eq!(raised(&free), 0);

    // A loose bound changes nothing; a bound of zero raises every layer.
    opts.max_rel_error = Some(e0 * 2.0);
    let loose = compile(&fixture.model_path(), &opts).unwrap();
    assert_eq!(raised(&loose), 0);
    opts.max_rel_error = Some(0.0);
    let strict = compile(&fixture.model_path(), &opts).unwrap();
    let dense = strict.precision.as_ref().unwrap().decisions.len();
    assert_eq!(raised(&strict), dense);
    assert_eq!(worst_output(&strict), 0.0);

    // In between, some layers are raised and the bound holds.
    opts.max_rel_error = Some(e0 * 0.85);
    let mid = compile(&fixture.model_path(), &opts).unwrap();
    println!(
        "fp16 digits MLP: output error {e0:.3e} free, {:.3e} with --max-rel-error {:.3e} ({} of {dense} layers raised)",
        worst_output(&mid),
        e0 * 0.85,
        raised(&mid)
    );
    assert!(raised(&mid) >= 1);
    assert!(worst_output(&mid) <= e0 * 0.85);

    // Without samples there is nothing to measure.
    opts.calibrate = None;
    opts.calibrate_random = 0;
    assert!(matches!(
        compile(&fixture.model_path(), &opts),
        Err(kiln_driver::DriverError::Usage(_))
    ));
}

#[test]
fn precision_plans_round_trip_apply_edits_and_refuse_other_models() {
    use kiln_passes::{PassError, PlanError, Precision, PrecisionPlan, Reason};
    let (fixture, base, _dir) = mlp_with_calibration(1);
    let emitted = compile(
        &fixture.model_path(),
        &with_precision(base.clone(), Mode::Bf16),
    )
    .unwrap()
    .precision
    .unwrap()
    .plan;
    assert_eq!(emitted.entries.len(), 3);
    assert!(emitted
        .entries
        .iter()
        .all(|e| e.precision == Precision::Bf16));
    let text = emitted.to_json();
    assert_eq!(PrecisionPlan::parse(&text).unwrap().entries.len(), 3);

    // A person edits the middle layer back to fp32; the plan wins over
    // the (default fp32) mode everywhere.
    let mut edited = PrecisionPlan::parse(&text).unwrap();
    edited.entries[1].precision = Precision::Fp32;
    let mut opts = base.clone();
    opts.calibrate_random = 0;
    opts.precision.plan = Some(edited.clone());
    let c = compile(&fixture.model_path(), &opts).unwrap();
    let got: Vec<(Precision, Reason)> = c
        .precision
        .unwrap()
        .decisions
        .iter()
        .map(|d| (d.precision, d.reason.clone()))
        .collect();
    assert_eq!(
        got,
        [
            (Precision::Bf16, Reason::Plan),
            (Precision::Fp32, Reason::Plan),
            (Precision::Bf16, Reason::Plan)
        ]
    );

    let refused = |plan: PrecisionPlan, model: &std::path::Path, o: &CompileOptions| {
        let mut o = o.clone();
        o.precision.plan = Some(plan);
        match compile(model, &o) {
            Err(kiln_driver::DriverError::Pass(PassError::Plan(e))) => e,
            Err(e) => panic!("unexpected error {e}"),
            Ok(_) => panic!("a bad plan was accepted"),
        }
    };
    // An entry whose structure no longer matches.
    let mut changed = edited.clone();
    changed.entries[0].key = "gemm:0000000000000000".into();
    let e = refused(changed, &fixture.model_path(), &opts);
    assert!(
        matches!(&e, PlanError::KeyMismatch { node, .. } if *node == edited.entries[0].node),
        "{e}"
    );
    // An entry for a node the model does not have.
    let mut stale = edited.clone();
    stale.entries[2].node = "/no/such/Gemm".into();
    let e = refused(stale, &fixture.model_path(), &opts);
    assert_eq!(e, PlanError::Stale("/no/such/Gemm".into()));
    // The MLP's plan on the digits CNN.
    let cnn = Fixture::load("digits_cnn");
    let mut cnn_opts = cnn.compile_options();
    cnn_opts.calibrate_random = 0;
    let e = refused(edited, &cnn.model_path(), &cnn_opts);
    assert!(matches!(e, PlanError::Stale(_)), "{e}");
    // Text that is not a plan.
    assert!(matches!(
        PrecisionPlan::parse("{\"nodes\": []}"),
        Err(PlanError::Malformed(_))
    ));
    let twice = text.replacen(&emitted.entries[1].node, &emitted.entries[0].node, 1);
    assert!(matches!(
        PrecisionPlan::parse(&twice),
        Err(PlanError::Malformed(m)) if m.contains("twice")
    ));
}

/// What a [`kiln_driver::Progress`] heard, one line per call.
#[derive(Default)]
struct Recorder(std::cell::RefCell<Vec<String>>);

impl kiln_driver::Progress for Recorder {
    fn begin(&self, stage: &str, total: Option<u64>) {
        self.0.borrow_mut().push(format!("begin {stage} {total:?}"));
    }
    fn step(&self, note: &str) {
        self.0.borrow_mut().push(format!("step {note}"));
    }
    fn end(&self) {
        self.0.borrow_mut().push("end".into());
    }
}

/// A calibrated int8 build with the error-driven fallback reports every
/// long stage (the CLI draws them as bars on a terminal): import, the
/// passes one by one, each calibration sample observed, each fallback
/// round, code generation; every stage ends; and reporting changes nothing
/// in the artifact.
#[test]
fn long_compile_stages_report_progress() {
    let digits = Digits::load("digits_cnn");
    let mut opts = with_precision(digits.base.clone(), Mode::Int8);
    opts.static_activations = true;
    opts.calibrate_random = 3;
    // Unreachable: every dense layer is raised to fp32, one per round.
    opts.max_rel_error = Some(0.0);
    let recorder = Recorder::default();
    let path = digits.fixture.model_path();
    let heard = kiln_driver::compile_with_progress(&path, &opts, &recorder).unwrap();
    let silent = compile(&path, &opts).unwrap();
    assert_eq!(heard.bytes, silent.bytes);
    let events = recorder.0.into_inner();
    let begins: Vec<&str> = events
        .iter()
        .filter_map(|e| e.strip_prefix("begin "))
        .collect();
    assert_eq!(
        begins,
        [
            "importing None",
            &format!("optimizing Some({})", begins_total(&events, 1)),
            "observing activations Some(3)",
            "assigning precision on 3 samples None",
            &format!("optimizing Some({})", begins_total(&events, 4)),
            "generating code None",
        ],
        "{events:#?}"
    );
    let count = |p: &str| events.iter().filter(|e| e.starts_with(p)).count();
    assert_eq!(count("begin"), count("end"), "{events:#?}");
    assert_eq!(count("step sample"), 3, "{events:#?}");
    // digits_cnn has three dense layers; all are raised, one per round.
    assert_eq!(count("step 3 layer(s) raised to fp32"), 1, "{events:#?}");
    assert!(
        events.iter().any(|e| e == "step fold-constants"),
        "{events:#?}"
    );
}

/// The step count announced by the `n`-th `begin` (0-based) of `events`,
/// checked against the steps that followed it.
fn begins_total(events: &[String], n: usize) -> u64 {
    let start = (events.iter().enumerate())
        .filter(|(_, e)| e.starts_with("begin "))
        .nth(n)
        .map(|(i, _)| i)
        .expect("stage");
    let steps = events[start + 1..]
        .iter()
        .take_while(|e| e.starts_with("step "))
        .count();
    steps as u64
}
