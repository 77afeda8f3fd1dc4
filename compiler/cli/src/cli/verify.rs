//! `kiln verify`: the artifact's golden self-test on the machine at hand
//! (`kiln compile --golden`; `Model::verify` in the runtime).

use super::run::check_line;
use super::{exit, Failure};
use clap::Args;
use kiln_runtime::{Model, PublicKey};
use serde_json::{json, Value};
use std::path::PathBuf;

#[derive(Args)]
pub(super) struct VerifyArgs {
    /// The artifact.
    artifact: PathBuf,
    /// Refuse the artifact unless ARTIFACT.sig is a valid signature by this
    /// Ed25519 public key (PEM).
    #[arg(long, value_name = "PEM")]
    public_key: Option<PathBuf>,
    /// Print a machine-readable summary.
    #[arg(long)]
    json: bool,
}

pub(super) fn cmd_verify(a: VerifyArgs) -> Result<(), Failure> {
    let model = match &a.public_key {
        Some(key) => Model::load_verified(&a.artifact, &PublicKey::from_pem_file(key)?)?,
        None => Model::load(&a.artifact)?,
    };
    let report = model.verify()?;
    let failed = report.failures().count();
    if a.json {
        let checks: Vec<Value> = (report.checks.iter())
            .map(|c| {
                let m = &c.comparison;
                json!({"set": c.set, "output": m.name, "max_abs_error": m.max_abs_error, "scale": m.scale, "rel_error": m.rel_error, "tolerance": c.tolerance, "passed": c.passed(), "mismatch": m.mismatch})
            })
            .collect();
        let sets = model.golden().sets.len();
        println!(
            "{}",
            json!({"artifact": a.artifact.display().to_string(), "sets": sets, "passed": failed == 0, "checks": checks})
        );
    } else {
        for c in &report.checks {
            println!("set {} {}", c.set, check_line(&c.comparison, c.tolerance));
        }
    }
    if failed > 0 {
        let names: Vec<String> = (report.failures())
            .map(|c| format!("'{}' (set {})", c.comparison.name, c.set))
            .collect();
        return Err(Failure::new(
            exit::CHECK_FAILED,
            format!(
                "{failed} of {} golden outputs beyond tolerance on this machine: {}",
                report.checks.len(),
                names.join(", ")
            ),
        ));
    }
    if !a.json {
        println!(
            "verified: {} golden output(s) of {} set(s) within tolerance",
            report.checks.len(),
            model.golden().sets.len()
        );
    }
    Ok(())
}
