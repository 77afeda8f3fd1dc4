//! What the `kiln` command's end-to-end suites share.
// Each suite uses part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository root (the fixtures' paths are relative to it).
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `kiln` in the repository root; returns (exit code, stdout +
/// stderr).
pub fn kiln(args: &[&str]) -> (i32, String) {
    kiln_with_env(&[], args)
}

/// [`kiln`] with these environment variables set.
pub fn kiln_with_env(env: &[(&str, &str)], args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .envs(env.iter().copied())
        .current_dir(repo())
        .output()
        .expect("kiln runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().expect("exit code"), text)
}
