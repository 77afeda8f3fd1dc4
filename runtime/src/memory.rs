//! Memory the loader owns: 64-byte aligned buffers and the weights.

use std::ptr::NonNull;

use crate::Error;

/// Alignment of the arena and of the weights.
pub(crate) const ALIGN: usize = 64;

/// A zero-initialised buffer aligned to [`ALIGN`] bytes (in fact to a
/// page): an anonymous mapping, so its pages cost memory only once
/// touched. An artifact that declares a huge arena therefore makes loading
/// reserve address space, not resident memory; the allocator's zeroing of
/// over-aligned blocks would have written every byte at load time.
pub(crate) struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    map_len: usize,
}

// SAFETY: AlignedBuf owns its mapping exclusively, like `Box<[u8]>`.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only reads.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Maps `len` zero bytes (at least one page, so the pointer is always
    /// valid and aligned). `what` names the buffer in the error when the
    /// mapping fails.
    pub(crate) fn zeroed(len: u64, what: &'static str) -> Result<AlignedBuf, Error> {
        let oom = || Error::OutOfMemory { what, bytes: len };
        let size = usize::try_from(len).map_err(|_| oom())?;
        let map_len = round_to_pages(size).ok_or_else(oom)?;
        // SAFETY: a fresh private anonymous mapping; no existing memory is
        // affected.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(oom());
        }
        let ptr = NonNull::new(raw.cast::<u8>()).ok_or_else(oom)?;
        Ok(AlignedBuf {
            ptr,
            len: size,
            map_len,
        })
    }

    /// A copy of `bytes` in an aligned buffer.
    pub(crate) fn copy_of(bytes: &[u8], what: &'static str) -> Result<AlignedBuf, Error> {
        let mut buf = AlignedBuf::zeroed(bytes.len() as u64, what)?;
        buf.as_mut_slice().copy_from_slice(bytes);
        Ok(buf)
    }

    pub(crate) fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` initialised bytes live at `ptr` while `self` does.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in `zeroed`.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.map_len) };
    }
}

/// `len` rounded up to whole pages (at least one page).
pub(crate) fn round_to_pages(len: usize) -> Option<usize> {
    // SAFETY: sysconf has no preconditions.
    let page = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        p if p > 0 => p as usize,
        _ => 4096,
    };
    len.max(1).checked_next_multiple_of(page)
}

/// An [`AlignedBuf`] made read-only: nothing, not even a faulty kernel
/// writing through the weights pointer, can change it after loading.
pub(crate) struct SealedBuf(AlignedBuf);

impl AlignedBuf {
    /// Makes the buffer read-only for good.
    pub(crate) fn seal(self) -> Result<SealedBuf, Error> {
        // SAFETY: changes the protection of this buffer's own mapping,
        // which nothing else references; afterwards only shared (read)
        // access to it exists.
        let rc = unsafe { libc::mprotect(self.ptr.as_ptr().cast(), self.map_len, libc::PROT_READ) };
        if rc != 0 {
            return Err(Error::SealWeights(std::io::Error::last_os_error()));
        }
        Ok(SealedBuf(self))
    }
}

/// The weights kernels read: a sealed private buffer (the whole artifact
/// file as read at load, or a copy of the weights) and where in it the
/// weights start, aligned to [`ALIGN`].
pub(crate) struct Weights {
    buf: SealedBuf,
    offset: usize,
}

impl Weights {
    /// The weights at `range` of `buf`: kept in place when they start
    /// aligned (section offsets are multiples of 64, so they do in every
    /// valid artifact), otherwise copied.
    pub(crate) fn new(buf: AlignedBuf, range: std::ops::Range<usize>) -> Result<Weights, Error> {
        let (buf, offset) = if range.start.is_multiple_of(ALIGN) {
            (buf, range.start)
        } else {
            (AlignedBuf::copy_of(&buf.as_slice()[range], "weights")?, 0)
        };
        Ok(Weights {
            buf: buf.seal()?,
            offset,
        })
    }

    /// The address of the first weight byte (aligned to [`ALIGN`]).
    pub(crate) fn as_ptr(&self) -> *const u8 {
        // `offset` is at most the buffer's length, so this stays in bounds.
        self.buf.0.as_slice()[self.offset..].as_ptr()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_and_zeroed() {
        for len in [0, 1, 63, 64, 1000] {
            let b = AlignedBuf::zeroed(len, "test").unwrap();
            assert_eq!(b.as_slice().as_ptr() as usize % ALIGN, 0);
            assert_eq!(b.as_slice().len() as u64, len);
            assert!(b.as_slice().iter().all(|&x| x == 0));
        }
    }

    #[test]
    fn a_huge_buffer_costs_no_resident_memory_until_touched() {
        let rss = || {
            let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
            statm
                .split_whitespace()
                .nth(1)
                .unwrap()
                .parse::<u64>()
                .unwrap()
                * 4096
        };
        let before = rss();
        let b = AlignedBuf::zeroed(1 << 30, "arena").unwrap();
        assert!(rss() < before + (64 << 20), "{} -> {}", before, rss());
        drop(b);
    }

    #[test]
    fn absurd_sizes_are_errors() {
        let err = AlignedBuf::zeroed(u64::MAX, "arena").err().unwrap();
        assert!(err.to_string().contains("arena"), "{err}");
    }
}
