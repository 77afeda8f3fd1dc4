//! The `kiln` command: compile, run, inspect and benchmark models.

fn main() {
    // Behave like other command-line tools when the reader of stdout goes
    // away (`kiln inspect m.kiln | head`): end quietly instead of panicking
    // on a failed print.
    #[cfg(unix)]
    // SAFETY: restoring the default disposition of SIGPIPE before any other
    // thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    std::process::exit(kiln::cli::main());
}
