//! Signed artifacts: `Model::load_verified` loads an artifact whose
//! detached signature verifies with the given key and refuses, with a typed
//! error, one that is unsigned, modified after signing, or signed with
//! another key.
#![cfg(all(feature = "signing", target_arch = "x86_64"))]

mod common;

use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::EncodePublicKey;
use ed25519_dalek::{Signer, SigningKey};
use kiln_runtime::format::FormatError;
use kiln_runtime::format::{read_header, signature_path, signed_message, DetachedSignature};
use kiln_runtime::{Error, Model, PublicKey, Tensor};
use std::path::PathBuf;

/// A fixed producer key (tests need no randomness).
fn producer() -> SigningKey {
    SigningKey::from_bytes(&[7; 32])
}

fn public(key: &SigningKey) -> PublicKey {
    PublicKey::from_bytes(&key.verifying_key().to_bytes()).unwrap()
}

fn signature_for(bytes: &[u8], key: &SigningKey) -> DetachedSignature {
    let content_hash = read_header(bytes).unwrap().content_hash;
    DetachedSignature {
        content_hash,
        signature: key.sign(&signed_message(&content_hash)).to_bytes(),
    }
}

/// Writes `bytes` (and, if given, its signature file) to a fresh directory;
/// returns the artifact path.
fn write(tag: &str, bytes: &[u8], sig: Option<&DetachedSignature>) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-signing-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("model.kiln");
    std::fs::write(&path, bytes).unwrap();
    if let Some(sig) = sig {
        std::fs::write(signature_path(&path), sig.to_bytes()).unwrap();
    }
    path
}

#[test]
fn good_signature_loads_and_runs() {
    let bytes = common::copy_model().to_bytes();
    let path = write("good", &bytes, Some(&signature_for(&bytes, &producer())));
    let model = Model::load_verified(&path, &public(&producer())).unwrap();
    let x = Tensor::from_f32("x", &[2], &[1.5, -2.0]);
    let y = model.run(&[x.view()]).unwrap();
    assert_eq!(y[0].to_f32_vec(), Some(vec![1.5, -2.0]));
}

#[test]
fn pem_public_key_works_like_raw_bytes() {
    let pem = producer()
        .verifying_key()
        .to_public_key_pem(LineEnding::LF)
        .unwrap();
    assert_eq!(PublicKey::from_pem(&pem).unwrap(), public(&producer()));
    let err = PublicKey::from_pem("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")
        .unwrap_err();
    assert!(matches!(err, Error::InvalidPublicKey(_)), "{err:?}");
}

#[test]
fn unsigned_artifact_is_refused() {
    let bytes = common::copy_model().to_bytes();
    let path = write("unsigned", &bytes, None);
    // The same file loads without verification.
    Model::load(&path).unwrap();
    let err = Model::load_verified(&path, &public(&producer())).unwrap_err();
    assert!(matches!(err, Error::Unsigned { .. }), "{err:?}");
    assert!(err.to_string().contains("is not signed"), "{err}");
    assert!(err.is_signature_error());
}

#[test]
fn wrong_key_is_refused() {
    let bytes = common::copy_model().to_bytes();
    let path = write(
        "wrong-key",
        &bytes,
        Some(&signature_for(&bytes, &producer())),
    );
    let other = SigningKey::from_bytes(&[8; 32]);
    let err = Model::load_verified(&path, &public(&other)).unwrap_err();
    assert!(matches!(err, Error::BadSignature), "{err:?}");
    // Signed by the other key, checked against the producer's: also refused.
    let path = write("other-signer", &bytes, Some(&signature_for(&bytes, &other)));
    let err = Model::load_verified(&path, &public(&producer())).unwrap_err();
    assert!(matches!(err, Error::BadSignature), "{err:?}");
}

#[test]
fn tampered_artifact_is_refused() {
    let original = common::copy_model();
    let sig = signature_for(&original.to_bytes(), &producer());

    // A consistent rewrite (every checksum recomputed) of the signed
    // artifact: another kernel body behind the same signature.
    let mut changed = original.clone();
    changed.text = common::return_code(3);
    changed.kernels[0].text_len = changed.text.len() as u64;
    let path = write("rewritten", &changed.to_bytes(), Some(&sig));
    let err = Model::load_verified(&path, &public(&producer())).unwrap_err();
    assert!(matches!(err, Error::ModifiedAfterSigning { .. }), "{err:?}");

    // A flipped byte in TEXT: the section checksum catches it.
    let mut flipped = original.to_bytes();
    let text = read_header(&flipped)
        .unwrap()
        .section(kiln_runtime::format::SectionKind::Text)
        .offset as usize;
    flipped[text] ^= 0x40;
    let path = write("flipped", &flipped, Some(&sig));
    let err = Model::load_verified(&path, &public(&producer())).unwrap_err();
    assert!(
        matches!(err, Error::Format(FormatError::SectionChecksum(_))),
        "{err:?}"
    );

    // A signature file whose hash was edited to match the rewritten
    // artifact: the Ed25519 check fails.
    let forged = DetachedSignature {
        content_hash: read_header(&changed.to_bytes()).unwrap().content_hash,
        signature: sig.signature,
    };
    let path = write("forged", &changed.to_bytes(), Some(&forged));
    let err = Model::load_verified(&path, &public(&producer())).unwrap_err();
    assert!(matches!(err, Error::BadSignature), "{err:?}");

    // A damaged signature file.
    let path = write("bad-sig-file", &original.to_bytes(), None);
    std::fs::write(signature_path(&path), b"KILNSIG\0 too short").unwrap();
    let err = Model::load_verified(&path, &public(&producer())).unwrap_err();
    assert!(matches!(err, Error::SignatureFile { .. }), "{err:?}");
}

/// A file rewritten in place while it is loaded: a writer thread
/// alternates between the signed artifact and an unsigned one whose kernel
/// returns 77, sometimes cutting the file short, while this thread loads
/// with `load_verified` and runs. The signature is checked on the bytes
/// that run, so the unsigned kernel never runs and no load kills the
/// process; each load either runs the signed code or is refused.
#[test]
fn rewriting_a_signed_artifact_during_loads_never_runs_unsigned_code() {
    use std::io::{Seek, SeekFrom, Write};
    use std::sync::atomic::{AtomicBool, Ordering};

    let signed = common::copy_model().to_bytes();
    let mut evil = common::copy_model();
    evil.text = common::return_code(77);
    evil.kernels[0].text_len = evil.text.len() as u64;
    let evil = evil.to_bytes();
    let path = write("race", &signed, Some(&signature_for(&signed, &producer())));
    let key = public(&producer());
    // The unsigned build runs (and fails with 77) when loaded unverified.
    let err = Model::from_bytes(&evil)
        .unwrap()
        .run(&[Tensor::from_f32("x", &[2], &[0.0, 0.0]).view()]);
    assert!(
        matches!(err, Err(Error::Kernel { code: 77, .. })),
        "{err:?}"
    );

    let stop = AtomicBool::new(false);
    let (mut loaded, mut refused) = (0, 0);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            let mut round = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let bytes = if round.is_multiple_of(2) {
                    &evil
                } else {
                    &signed
                };
                f.seek(SeekFrom::Start(0)).unwrap();
                // Every third round leaves the file cut short for a while.
                let cut = if round.is_multiple_of(3) {
                    bytes.len() / 2
                } else {
                    bytes.len()
                };
                f.write_all(&bytes[..cut]).unwrap();
                f.set_len(cut as u64).unwrap();
                std::thread::yield_now();
                f.seek(SeekFrom::Start(0)).unwrap();
                f.write_all(bytes).unwrap();
                f.set_len(bytes.len() as u64).unwrap();
                round += 1;
            }
        });
        let x = Tensor::from_f32("x", &[2], &[1.5, -2.0]);
        for _ in 0..600 {
            match Model::load_verified(&path, &key) {
                Ok(model) => {
                    let y = model.run(&[x.view()]).expect("only the signed code runs");
                    assert_eq!(y[0].to_f32_vec(), Some(vec![1.5, -2.0]));
                    loaded += 1;
                }
                Err(e) => {
                    assert!(
                        matches!(
                            e,
                            Error::ModifiedAfterSigning { .. }
                                | Error::Format(_)
                                | Error::Io { .. }
                        ),
                        "{e:?}"
                    );
                    refused += 1;
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    eprintln!("{loaded} loads ran the signed code, {refused} were refused");
    assert_eq!(loaded + refused, 600);
    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
}

/// A signature file is read only up to its fixed size: a huge one is
/// refused without reading it.
#[test]
fn an_oversized_signature_file_is_refused_unread() {
    let bytes = common::copy_model().to_bytes();
    let path = write("oversized-sig", &bytes, None);
    let sig = signature_path(&path);
    std::fs::File::create(&sig)
        .unwrap()
        .set_len(1 << 40)
        .unwrap();
    let err = Model::load_verified(&path, &public(&producer())).unwrap_err();
    assert!(matches!(err, Error::SignatureFile { .. }), "{err:?}");
    assert!(
        err.to_string().contains("more than the 104 expected"),
        "{err}"
    );
    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
}
