//! Reading the files the loader is given, trusting nothing about them:
//! regular files only (a FIFO or a device would block or never end), read
//! once, completely, into memory the process owns.
//!
//! Reading once is what makes a signed load mean something: the signature
//! is checked on the same bytes that are decoded, relocated and served as
//! weights, so rewriting or truncating the file during or after the load
//! changes nothing that runs (a shared file mapping would show every later
//! write, and a truncation would kill the process with `SIGBUS`).

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use crate::memory::AlignedBuf;
use crate::Error;

/// Opens `path` for reading without blocking (opening a FIFO for reading
/// waits for a writer) and returns it with its size, refusing anything
/// but a regular file.
pub fn open_regular(path: &Path) -> io::Result<(File, u64)> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    let kind = meta.file_type();
    if !kind.is_file() {
        let what = if kind.is_dir() {
            "a directory"
        } else if kind.is_fifo() {
            "a named pipe (FIFO)"
        } else if kind.is_socket() {
            "a socket"
        } else if kind.is_char_device() || kind.is_block_device() {
            "a device"
        } else {
            "not a regular file"
        };
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("it is {what}; only regular files are read"),
        ));
    }
    Ok((file, meta.len()))
}

/// Reads exactly `buf.len()` bytes, the size the file had when opened; a
/// file that shrank meanwhile is an error, not a short read.
fn read_all(file: &mut File, buf: &mut [u8]) -> io::Result<()> {
    file.read_exact(buf).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the file shrank while it was being read",
        ),
        _ => e,
    })
}

/// The whole regular file at `path`, read once into a private, page-aligned
/// buffer.
pub(crate) fn read_private(path: &Path) -> Result<AlignedBuf, Error> {
    let io_err = |source| Error::Io {
        path: path.to_owned(),
        source,
    };
    let (mut file, len) = open_regular(path).map_err(io_err)?;
    let mut buf = AlignedBuf::zeroed(len, "artifact file")?;
    read_all(&mut file, buf.as_mut_slice()).map_err(io_err)?;
    Ok(buf)
}

/// The whole regular file at `path` if it holds at most `limit` bytes
/// (signatures, artifacts to inspect).
pub fn read_regular(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let (mut file, len) = open_regular(path)?;
    if len > limit {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("it has {len} bytes, more than the {limit} expected"),
        ));
    }
    let too_big = || {
        io::Error::new(
            io::ErrorKind::OutOfMemory,
            format!("cannot hold its {len} bytes"),
        )
    };
    let size = usize::try_from(len).map_err(|_| too_big())?;
    let mut buf = Vec::new();
    buf.try_reserve_exact(size).map_err(|_| too_big())?;
    buf.resize(size, 0);
    read_all(&mut file, &mut buf)?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let dir = std::env::temp_dir().join(format!("kiln-fifo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("pipe");
        let _ = std::fs::remove_file(&fifo);
        let status = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(status.success());
        let err = read_regular(&fifo, 1 << 10).unwrap_err();
        assert!(err.to_string().contains("FIFO"), "{err}");
        let err = read_private(&fifo).err().unwrap();
        assert!(err.to_string().contains("FIFO"), "{err}");
        let err = read_regular(&dir, 1 << 10).unwrap_err();
        assert!(err.to_string().contains("directory"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn files_over_the_limit_are_refused() {
        let path = std::env::temp_dir().join(format!("kiln-big-{}", std::process::id()));
        std::fs::write(&path, [0u8; 200]).unwrap();
        assert_eq!(read_regular(&path, 200).unwrap().len(), 200);
        let err = read_regular(&path, 199).unwrap_err();
        assert!(err.to_string().contains("200 bytes"), "{err}");
        assert_eq!(read_private(&path).unwrap().as_slice(), &[0u8; 200]);
        std::fs::remove_file(&path).unwrap();
    }
}
