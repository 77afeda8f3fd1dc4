//! `kiln keygen`, `kiln compile --sign` and `kiln run --public-key` end to
//! end: a signed artifact runs; an unsigned one, one signed with another
//! key and one modified after signing are refused with exit code 5.

mod common;

use common::kiln;

#[test]
fn signed_artifacts_run_and_others_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).to_str().unwrap().to_owned();
    let (key, other) = (p("release.pem"), p("other.pem"));
    for k in [&key, &other] {
        let (code, text) = kiln(&["keygen", k]);
        assert_eq!(code, 0, "{text}");
    }
    let secret = std::fs::read_to_string(&key).unwrap();
    assert!(
        secret.starts_with("-----BEGIN PRIVATE KEY-----"),
        "{secret}"
    );
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&key).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "secret key mode {mode:o}");
    let public = std::fs::read_to_string(format!("{key}.pub")).unwrap();
    assert!(public.starts_with("-----BEGIN PUBLIC KEY-----"), "{public}");
    // keygen never overwrites a key by accident.
    let (code, text) = kiln(&["keygen", &key]);
    assert_ne!(code, 0, "{text}");
    assert!(text.contains("--force"), "{text}");

    let model = "fixtures/models/digits_mlp/model.onnx";
    let shape = "input=1x64";
    let signed = p("signed.kiln");
    let (code, text) = kiln(&[
        "compile",
        model,
        "--input-shape",
        shape,
        "-o",
        &signed,
        "--sign",
        &key,
    ]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains(&format!("signed: {signed}.sig")), "{text}");
    let run =
        |artifact: &str, public: &str| kiln(&["run", artifact, "--random", "--public-key", public]);

    let (code, text) = run(&signed, &format!("{key}.pub"));
    assert_eq!(code, 0, "a signed artifact runs: {text}");

    let (code, text) = run(&signed, &format!("{other}.pub"));
    assert_eq!(code, 5, "{text}");
    assert!(
        text.contains("does not verify with the given public key"),
        "{text}"
    );

    let unsigned = p("unsigned.kiln");
    let (code, text) = kiln(&["compile", model, "--input-shape", shape, "-o", &unsigned]);
    assert_eq!(code, 0, "{text}");
    let (code, text) = run(&unsigned, &format!("{key}.pub"));
    assert_eq!(code, 5, "{text}");
    assert!(text.contains("is not signed"), "{text}");
    // Without --public-key the unsigned artifact runs.
    let (code, text) = kiln(&["run", &unsigned, "--random"]);
    assert_eq!(code, 0, "{text}");

    // Another model's artifact behind the first one's signature.
    let (code, text) = kiln(&[
        "compile",
        "fixtures/models/digits_cnn/model.onnx",
        "--input-shape",
        "input=1x1x8x8",
        "-o",
        &signed,
    ]);
    assert_eq!(code, 0, "{text}");
    let (code, text) = run(&signed, &format!("{key}.pub"));
    assert_eq!(code, 5, "{text}");
    assert!(text.contains("modified after signing"), "{text}");

    // A public key file that is not a key.
    let (code, text) = run(&unsigned, &key);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("invalid public key"), "{text}");
}
