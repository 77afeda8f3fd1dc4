//! External tensor data: the files next to a model that its initializers
//! name (`data_location = EXTERNAL`), read so that a model can make the
//! compiler read only what it should, and only as much as the files hold.
//!
//! - **Where**: a relative path below the model's directory, walked one
//!   component at a time from a descriptor of that directory with
//!   `O_NOFOLLOW` (no symbolic link is followed, so none can be swapped in
//!   between a check and the open) and without hidden components (a model
//!   saved in a home directory cannot name `.ssh/id_ed25519`).
//! - **What**: regular files only, opened without blocking (a FIFO would
//!   hang the compiler; a device would never end).
//! - **How much**: the bytes read, summed over the model, never exceed the
//!   sizes of the distinct files read from, so initializers that alias the
//!   same bytes cannot turn a small model into gigabytes of allocation;
//!   each buffer is reserved fallibly.

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{openat, statat, AtFlags, FileType, Mode, OFlags, CWD};
use tract_onnx::pb::TensorProto;

use crate::error::ExternalDataError;
use crate::OnnxError;

/// The external data files of one model, and how many bytes the import
/// may still read from them.
#[derive(Debug)]
pub struct ExternalData<'a> {
    dir: Option<&'a Path>,
    /// Files read from so far, by device and inode.
    files: RefCell<HashSet<(u64, u64)>>,
    /// Bytes of the distinct files read from, minus the bytes read.
    budget: Cell<u64>,
}

impl<'a> ExternalData<'a> {
    /// External data below `dir` (`None`: the model has no directory, so
    /// any external data is an error).
    pub fn new(dir: Option<&'a Path>) -> ExternalData<'a> {
        ExternalData {
            dir,
            files: RefCell::default(),
            budget: Cell::new(0),
        }
    }

    /// Reads the `bytes` bytes of external data of `t` (called `name` in
    /// errors).
    pub(crate) fn read(
        &self,
        t: &TensorProto,
        name: &str,
        bytes: u64,
    ) -> Result<Vec<u8>, OnnxError> {
        let err = |reason| OnnxError::ExternalData {
            tensor: name.to_string(),
            reason,
        };
        let key = |k: &str| {
            (t.external_data.iter())
                .find(|e| e.key == k)
                .map(|e| e.value.as_str())
        };
        let location = key("location").ok_or(err(ExternalDataError::NoLocation))?;
        let number = |k: &str| -> Result<Option<u64>, OnnxError> {
            key(k)
                .map(|v| {
                    v.trim().parse::<u64>().map_err(|_| {
                        err(ExternalDataError::BadNumber {
                            key: k.into(),
                            value: v.into(),
                        })
                    })
                })
                .transpose()
        };
        let offset = number("offset")?.unwrap_or(0);
        if let Some(length) = number("length")? {
            if length < bytes {
                return Err(OnnxError::TooLarge {
                    tensor: name.to_string(),
                    declared_bytes: bytes,
                    reason: format!("its external data 'length' is only {length} bytes"),
                });
            }
            if length > bytes {
                return Err(err(ExternalDataError::Length {
                    length,
                    needed: bytes,
                }));
            }
        }
        let (mut file, path, identity, file_len) = self.open(location).map_err(err)?;
        match offset.checked_add(bytes) {
            Some(end) if end <= file_len => {}
            _ => {
                return Err(err(ExternalDataError::PastEnd {
                    offset,
                    bytes,
                    path,
                    file_len,
                }))
            }
        }
        // Aliasing bytes is allowed, multiplying them is not: the model's
        // reads may sum to the sizes of the files it reads, no more.
        if self.files.borrow_mut().insert(identity) {
            self.budget.set(self.budget.get().saturating_add(file_len));
        }
        let too_large = |reason: String| OnnxError::TooLarge {
            tensor: name.to_string(),
            declared_bytes: bytes,
            reason,
        };
        let left = self.budget.get();
        if bytes > left {
            return Err(too_large(format!(
                "the model's initializers would read more external data than its files hold \
                 ({left} bytes left): initializers alias the same bytes"
            )));
        }
        self.budget.set(left - bytes);
        let mut buf = Vec::new();
        usize::try_from(bytes)
            .ok()
            .and_then(|n| buf.try_reserve_exact(n).ok())
            .ok_or_else(|| too_large("the memory for it cannot be allocated".into()))?;
        let io_err = |source| {
            err(ExternalDataError::Io {
                action: "read",
                path: path.clone(),
                source,
            })
        };
        file.seek(SeekFrom::Start(offset)).map_err(io_err)?;
        file.take(bytes).read_to_end(&mut buf).map_err(io_err)?;
        if buf.len() as u64 != bytes {
            return Err(io_err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the file shrank while it was being read",
            )));
        }
        Ok(buf)
    }

    /// Opens `location` below the model directory: returns the file, its
    /// path for messages, its identity and its size.
    fn open(&self, location: &str) -> Result<(File, PathBuf, (u64, u64), u64), ExternalDataError> {
        let rel = Path::new(location);
        let escapes = location.is_empty()
            || rel.is_absolute()
            || rel
                .components()
                .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir));
        if escapes {
            return Err(ExternalDataError::Escapes(location.into()));
        }
        let parts: Vec<&OsStr> = (rel.components())
            .filter_map(|c| match c {
                Component::Normal(p) => Some(p),
                _ => None,
            })
            .collect();
        if parts.is_empty() {
            return Err(ExternalDataError::Escapes(location.into()));
        }
        if let Some(hidden) = parts.iter().find(|p| p.as_bytes().starts_with(b".")) {
            return Err(ExternalDataError::Hidden {
                location: location.into(),
                component: hidden.to_string_lossy().into_owned(),
            });
        }
        let dir = self
            .dir
            .ok_or_else(|| ExternalDataError::NoModelDirectory(location.into()))?;
        let mut path = dir.to_path_buf();
        let mut fd = rustix::fs::open(
            dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(io_err("open the model directory", dir))?;
        let last = parts.len() - 1;
        for (i, part) in parts.iter().enumerate() {
            path.push(part);
            // Say why a link is refused; the open itself does not follow
            // one either, so a link swapped in after this check fails too.
            let stat =
                statat(&fd, *part, AtFlags::SYMLINK_NOFOLLOW).map_err(io_err("open", &path))?;
            if FileType::from_raw_mode(stat.st_mode) == FileType::Symlink {
                return Err(ExternalDataError::Symlink(path));
            }
            let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            let flags = if i < last {
                flags | OFlags::DIRECTORY
            } else {
                flags | OFlags::NONBLOCK | OFlags::NOCTTY
            };
            fd = openat(&fd, *part, flags, Mode::empty()).map_err(io_err("open", &path))?;
        }
        let stat = rustix::fs::fstat(&fd).map_err(io_err("open", &path))?;
        let kind = FileType::from_raw_mode(stat.st_mode);
        if kind != FileType::RegularFile {
            return Err(ExternalDataError::NotRegularFile {
                path,
                kind: file_kind(kind),
            });
        }
        let identity = (stat.st_dev as u64, stat.st_ino as u64);
        Ok((File::from(fd), path, identity, stat.st_size as u64))
    }
}

/// An [`ExternalDataError::Io`] for a failed system call on `path`.
fn io_err<'p>(
    action: &'static str,
    path: &'p Path,
) -> impl FnOnce(rustix::io::Errno) -> ExternalDataError + 'p {
    move |e| ExternalDataError::Io {
        action,
        path: path.to_path_buf(),
        source: e.into(),
    }
}

/// How a file that is not a regular one is described in errors.
fn file_kind(kind: FileType) -> &'static str {
    match kind {
        FileType::Directory => "a directory",
        FileType::Fifo => "a named pipe (FIFO)",
        FileType::Socket => "a socket",
        FileType::CharacterDevice | FileType::BlockDevice => "a device",
        FileType::Symlink => "a symbolic link",
        _ => "not a regular file",
    }
}

/// Opens the model file at `path` for reading, refusing anything but a
/// regular file before reading a byte (opening a FIFO would block).
pub(crate) fn open_model_file(path: &Path) -> io::Result<File> {
    let fd = rustix::fs::openat(
        CWD,
        path,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let kind = FileType::from_raw_mode(rustix::fs::fstat(&fd)?.st_mode);
    if kind != FileType::RegularFile {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("it is {}; only regular files are read", file_kind(kind)),
        ));
    }
    Ok(File::from(fd))
}
