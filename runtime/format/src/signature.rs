//! Detached signatures of artifacts: the `ARTIFACT.sig` file written by
//! `kiln compile --sign` and checked by `Model::load_verified` (see
//! `docs/security.md`). This module only encodes and decodes the file and
//! defines the signed message; the Ed25519 arithmetic lives behind the
//! runtime's `signing` feature and in the compiler.
//!
//! File layout (104 bytes): magic `"KILNSIG\0"` (8), the artifact's content
//! hash (32), the Ed25519 signature (64) of [`signed_message`].

use std::path::{Path, PathBuf};

/// The first eight bytes of a signature file.
pub const SIGNATURE_MAGIC: [u8; 8] = *b"KILNSIG\0";

/// Size of a signature file.
pub const SIGNATURE_FILE_LEN: usize = 8 + 32 + 64;

/// Domain separation: a signature over an artifact can never be mistaken
/// for a signature over anything else signed with the same key.
const SIGNED_PREFIX: &[u8; 24] = b"kiln artifact signature\0";

/// What the producer's key signs: a fixed prefix and the artifact's content
/// hash (which commits to the header and, through the section table, to
/// every section's SHA-256; the loader checks all of them).
pub fn signed_message(content_hash: &[u8; 32]) -> [u8; 56] {
    let mut m = [0u8; 56];
    m[..24].copy_from_slice(SIGNED_PREFIX);
    m[24..].copy_from_slice(content_hash);
    m
}

/// Where the signature of the artifact at `artifact` lives: the same path
/// with `.sig` appended (`model.kiln` → `model.kiln.sig`).
pub fn signature_path(artifact: &Path) -> PathBuf {
    let mut p = artifact.as_os_str().to_owned();
    p.push(".sig");
    PathBuf::from(p)
}

/// A decoded signature file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DetachedSignature {
    /// Content hash of the artifact that was signed.
    pub content_hash: [u8; 32],
    /// Ed25519 signature of [`signed_message`]`(content_hash)`.
    pub signature: [u8; 64],
}

/// Why bytes are not a signature file.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SignatureFileError {
    /// Wrong length.
    #[error("a signature file has {SIGNATURE_FILE_LEN} bytes, this one has {0}")]
    Length(usize),
    /// Wrong magic.
    #[error("not a Kiln signature file (it does not start with \"KILNSIG\\0\")")]
    Magic,
}

impl DetachedSignature {
    /// The file bytes.
    pub fn to_bytes(&self) -> [u8; SIGNATURE_FILE_LEN] {
        let mut b = [0u8; SIGNATURE_FILE_LEN];
        b[..8].copy_from_slice(&SIGNATURE_MAGIC);
        b[8..40].copy_from_slice(&self.content_hash);
        b[40..].copy_from_slice(&self.signature);
        b
    }

    /// Decodes a signature file.
    pub fn parse(bytes: &[u8]) -> Result<DetachedSignature, SignatureFileError> {
        if bytes.len() != SIGNATURE_FILE_LEN {
            return Err(SignatureFileError::Length(bytes.len()));
        }
        if bytes[..8] != SIGNATURE_MAGIC {
            return Err(SignatureFileError::Magic);
        }
        let mut content_hash = [0u8; 32];
        content_hash.copy_from_slice(&bytes[8..40]);
        let mut signature = [0u8; 64];
        signature.copy_from_slice(&bytes[40..]);
        Ok(DetachedSignature {
            content_hash,
            signature,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_rejects() {
        let s = DetachedSignature {
            content_hash: [7; 32],
            signature: [9; 64],
        };
        assert_eq!(DetachedSignature::parse(&s.to_bytes()), Ok(s.clone()));
        let bytes = s.to_bytes();
        assert_eq!(
            DetachedSignature::parse(&bytes[..100]),
            Err(SignatureFileError::Length(100))
        );
        let mut bad = bytes;
        bad[0] = b'X';
        assert_eq!(
            DetachedSignature::parse(&bad),
            Err(SignatureFileError::Magic)
        );
        assert_eq!(
            signature_path(Path::new("dir/m.kiln")),
            PathBuf::from("dir/m.kiln.sig")
        );
        let m = signed_message(&[1; 32]);
        assert!(m.starts_with(b"kiln artifact signature\0") && m[24..] == [1; 32]);
    }
}
