//! Output files written all or nothing.

use std::fs::File;
use std::path::Path;

/// Runs `write` on a temporary file beside `path`, then renames it to
/// `path`: a write that fails leaves no file behind (a failed command
/// leaves no partial output), and a reader never sees half of one. I/O
/// errors of the temporary file and the rename become `E` by `io_error`.
pub fn write_atomically<E>(
    path: &Path,
    io_error: impl Fn(std::io::Error) -> E,
    write: impl FnOnce(&mut File) -> Result<(), E>,
) -> Result<(), E> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut builder = tempfile::Builder::new();
    builder.prefix(".kiln-");
    // A file as `File::create` makes it (the umask applies), not the
    // owner-only file a temporary one is.
    #[cfg(unix)]
    builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
    let mut tmp = builder.tempfile_in(dir).map_err(&io_error)?;
    write(tmp.as_file_mut())?;
    tmp.persist(path).map_err(|e| io_error(e.error))?;
    Ok(())
}
