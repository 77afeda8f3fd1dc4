//! Memory the loader owns: 64-byte aligned buffers and the weights.

use std::alloc::{self, Layout};
use std::ptr::NonNull;

use crate::Error;

/// Alignment of the arena and of the weights.
pub(crate) const ALIGN: usize = 64;

/// A zero-initialised heap buffer aligned to [`ALIGN`] bytes.
pub(crate) struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    layout: Layout,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like `Box<[u8]>`.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only reads.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocates `len` zero bytes (at least one byte is reserved so the
    /// pointer is always valid and aligned). `what` names the buffer in the
    /// error when the allocation fails.
    pub(crate) fn zeroed(len: u64, what: &'static str) -> Result<AlignedBuf, Error> {
        let oom = || Error::OutOfMemory { what, bytes: len };
        let size = usize::try_from(len).map_err(|_| oom())?;
        let layout = Layout::from_size_align(size.max(1), ALIGN).map_err(|_| oom())?;
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc::alloc_zeroed(layout) }).ok_or_else(oom)?;
        Ok(AlignedBuf {
            ptr,
            len: size,
            layout,
        })
    }

    /// A copy of `bytes` in an aligned buffer.
    pub(crate) fn copy_of(bytes: &[u8], what: &'static str) -> Result<AlignedBuf, Error> {
        let mut buf = AlignedBuf::zeroed(bytes.len() as u64, what)?;
        buf.as_mut_slice().copy_from_slice(bytes);
        Ok(buf)
    }

    pub(crate) fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
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
        // SAFETY: allocated in `zeroed` with this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// The weights kernels read: kept in the file mapping when it is suitably
/// aligned, otherwise copied.
pub(crate) enum Weights {
    /// A range of the mapped artifact file.
    Mapped { map: memmap2::Mmap, offset: usize },
    /// An aligned copy.
    Owned(AlignedBuf),
}

impl Weights {
    /// Uses the mapping if the weights (`range` of `map`) start at an
    /// aligned address, otherwise copies them.
    pub(crate) fn from_map(
        map: memmap2::Mmap,
        range: std::ops::Range<usize>,
    ) -> Result<Weights, Error> {
        if (map.as_ptr() as usize + range.start).is_multiple_of(ALIGN) {
            Ok(Weights::Mapped {
                map,
                offset: range.start,
            })
        } else {
            AlignedBuf::copy_of(&map[range], "weights").map(Weights::Owned)
        }
    }

    /// The address of the first weight byte (aligned to [`ALIGN`]).
    pub(crate) fn as_ptr(&self) -> *const u8 {
        match self {
            // `offset` is at most the map length, so this stays in bounds.
            Weights::Mapped { map, offset } => map[*offset..].as_ptr(),
            Weights::Owned(buf) => buf.as_ptr(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_and_zeroed() {
        for len in [0, 1, 63, 64, 1000] {
            let b = AlignedBuf::zeroed(len, "test").unwrap();
            assert_eq!(b.as_ptr() as usize % ALIGN, 0);
            assert_eq!(b.as_slice().len() as u64, len);
            assert!(b.as_slice().iter().all(|&x| x == 0));
        }
    }

    #[test]
    fn absurd_sizes_are_errors() {
        let err = AlignedBuf::zeroed(u64::MAX, "arena").err().unwrap();
        assert!(err.to_string().contains("arena"), "{err}");
    }
}
