//! The `kiln` command: compile, run, inspect and benchmark models.

mod cli;

fn main() {
    std::process::exit(cli::main());
}
