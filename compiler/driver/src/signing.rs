//! Ed25519 keys and artifact signatures for `kiln keygen` and
//! `kiln compile --sign` (checked by `kiln_runtime::Model::load_verified`;
//! see `docs/security.md`).
//!
//! Keys are PEM files in the standard encodings, so OpenSSL makes and reads
//! the same files: the secret key is PKCS#8 (`-----BEGIN PRIVATE KEY-----`,
//! `openssl genpkey -algorithm ed25519`), the public key
//! SubjectPublicKeyInfo (`-----BEGIN PUBLIC KEY-----`, `openssl pkey
//! -pubout`).

use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::{DecodePrivateKey, EncodePrivateKey, EncodePublicKey};
use ed25519_dalek::{Signer, SigningKey};
use kiln_format::{read_header, signed_message, DetachedSignature, FormatError};
use thiserror::Error;

/// Why a key could not be made or used.
#[derive(Debug, Error)]
pub enum SigningError {
    /// The operating system gave no randomness.
    #[error("cannot get random bytes for a new key: {0}")]
    Random(String),
    /// The secret key file is not a PKCS#8 PEM Ed25519 key.
    #[error("not an Ed25519 private key in PKCS#8 PEM form ('-----BEGIN PRIVATE KEY-----', as from `kiln keygen` or `openssl genpkey -algorithm ed25519`): {0}")]
    SecretKey(String),
    /// PEM encoding failed.
    #[error("cannot encode the key: {0}")]
    Encode(String),
    /// The bytes to sign are not an artifact.
    #[error("cannot sign: {0}")]
    Artifact(#[from] FormatError),
}

/// A new key pair: (secret key PEM, public key PEM).
pub fn generate_key_pair() -> Result<(String, String), SigningError> {
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| SigningError::Random(e.to_string()))?;
    let key = SigningKey::from_bytes(&seed);
    let secret = key
        .to_pkcs8_pem(LineEnding::LF)
        .map_err(|e| SigningError::Encode(e.to_string()))?;
    let public = key
        .verifying_key()
        .to_public_key_pem(LineEnding::LF)
        .map_err(|e| SigningError::Encode(e.to_string()))?;
    Ok((secret.to_string(), public))
}

/// The public key PEM of a secret key PEM.
pub fn public_key_pem(secret_pem: &str) -> Result<String, SigningError> {
    let key = parse_secret(secret_pem)?;
    key.verifying_key()
        .to_public_key_pem(LineEnding::LF)
        .map_err(|e| SigningError::Encode(e.to_string()))
}

/// Signs the artifact `bytes` with `secret_pem`; the result is what
/// `ARTIFACT.sig` holds ([`DetachedSignature::to_bytes`]).
pub fn sign_artifact(bytes: &[u8], secret_pem: &str) -> Result<DetachedSignature, SigningError> {
    let key = parse_secret(secret_pem)?;
    let content_hash = read_header(bytes)?.content_hash;
    let signature = key.sign(&signed_message(&content_hash)).to_bytes();
    Ok(DetachedSignature {
        content_hash,
        signature,
    })
}

fn parse_secret(pem: &str) -> Result<SigningKey, SigningError> {
    SigningKey::from_pkcs8_pem(pem).map_err(|e| SigningError::SecretKey(e.to_string()))
}
