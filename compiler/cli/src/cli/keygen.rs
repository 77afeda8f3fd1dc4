//! `kiln keygen`: an Ed25519 key pair for `kiln compile --sign`.

use super::{exit, write_file, Failure};
use clap::Args;
use kiln_driver::signing;
use std::path::{Path, PathBuf};

#[derive(Args)]
pub(super) struct KeygenArgs {
    /// Where to write the secret key (PKCS#8 PEM, mode 0600); the public key
    /// goes to the same path with `.pub` appended.
    output: PathBuf,
    /// Overwrite existing key files.
    #[arg(long)]
    force: bool,
}

pub(super) fn cmd_keygen(a: KeygenArgs) -> Result<(), Failure> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let public_path = {
        let mut p = a.output.clone().into_os_string();
        p.push(".pub");
        PathBuf::from(p)
    };
    let (secret, public) =
        signing::generate_key_pair().map_err(|e| Failure::new(exit::INTERNAL, e.to_string()))?;
    let io =
        |path: &Path, e: std::io::Error| Failure::new(exit::IO, format!("{}: {e}", path.display()));
    for path in [&a.output, &public_path] {
        if path.exists() && !a.force {
            return Err(Failure::new(
                exit::IO,
                format!("{} exists; pass --force to overwrite it", path.display()),
            ));
        }
    }
    // The secret key is readable by its owner only, from its first byte.
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&a.output)
        .map_err(|e| io(&a.output, e))?;
    file.write_all(secret.as_bytes())
        .map_err(|e| io(&a.output, e))?;
    write_file(&public_path, public.as_bytes())?;
    println!(
        "wrote secret key {} and public key {}",
        a.output.display(),
        public_path.display()
    );
    Ok(())
}
