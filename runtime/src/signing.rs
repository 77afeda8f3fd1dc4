//! Signed artifacts: [`PublicKey`] and the check behind
//! [`Model::load_verified`](crate::Model::load_verified) (feature
//! `signing`, on by default).
//!
//! An artifact is native code, so loading one means trusting whoever
//! produced it. A deployment that builds its own artifacts signs them
//! (`kiln compile --sign KEY`, Ed25519) and loads them with
//! `load_verified`, which refuses anything its pipeline did not sign.

use std::path::Path;

use ed25519_dalek::pkcs8::DecodePublicKey;
use ed25519_dalek::{Signature, VerifyingKey};

use crate::format::{signature_path, signed_message, DetachedSignature, SIGNATURE_FILE_LEN};
use crate::Error;

/// An Ed25519 public key that artifacts are checked against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PublicKey(VerifyingKey);

impl PublicKey {
    /// A key from its 32 raw bytes.
    pub fn from_bytes(bytes: &[u8; 32]) -> Result<PublicKey, Error> {
        VerifyingKey::from_bytes(bytes)
            .map(PublicKey)
            .map_err(|e| Error::InvalidPublicKey(e.to_string()))
    }

    /// A key from PEM text (`-----BEGIN PUBLIC KEY-----`, SubjectPublicKeyInfo),
    /// as written by `kiln keygen` or `openssl pkey -pubout`.
    pub fn from_pem(pem: &str) -> Result<PublicKey, Error> {
        VerifyingKey::from_public_key_pem(pem)
            .map(PublicKey)
            .map_err(|e| Error::InvalidPublicKey(e.to_string()))
    }

    /// Reads a PEM key file.
    pub fn from_pem_file(path: impl AsRef<Path>) -> Result<PublicKey, Error> {
        let path = path.as_ref();
        // A PEM public key is a few hundred bytes.
        let pem = crate::file::read_regular(path, 64 << 10).map_err(|source| Error::Io {
            path: path.to_owned(),
            source,
        })?;
        let pem = String::from_utf8(pem)
            .map_err(|_| Error::InvalidPublicKey(format!("'{}' is not text", path.display())))?;
        PublicKey::from_pem(&pem)
    }

    /// The 32 raw bytes.
    pub fn to_bytes(&self) -> [u8; 32] {
        self.0.to_bytes()
    }
}

/// Checks the detached signature of the artifact at `artifact`, whose
/// (already verified) header has `content_hash`, against `key`.
pub(crate) fn verify_detached(
    artifact: &Path,
    content_hash: &[u8; 32],
    key: &PublicKey,
) -> Result<(), Error> {
    let sig_path = signature_path(artifact);
    // A valid signature file has a fixed, small size: reading more is never
    // needed, and a FIFO or device in its place is refused, not waited on.
    let bytes = match crate::file::read_regular(&sig_path, SIGNATURE_FILE_LEN as u64) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::Unsigned {
                artifact: artifact.to_owned(),
                signature: sig_path,
            })
        }
        Err(e) => {
            return Err(Error::SignatureFile {
                path: sig_path,
                reason: e.to_string(),
            })
        }
    };
    let sig = DetachedSignature::parse(&bytes).map_err(|e| Error::SignatureFile {
        path: sig_path,
        reason: e.to_string(),
    })?;
    if &sig.content_hash != content_hash {
        return Err(Error::ModifiedAfterSigning {
            signed: hex(&sig.content_hash),
            found: hex(content_hash),
        });
    }
    let signature = Signature::from_bytes(&sig.signature);
    // Strict verification also refuses small-order keys and non-canonical
    // signatures.
    (key.0)
        .verify_strict(&signed_message(content_hash), &signature)
        .map_err(|_| Error::BadSignature)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
