//! Executable memory for TEXT: copied into anonymous pages, relocated while
//! writable, then switched to read+execute (never writable and executable at
//! once).

use std::io;
use std::ptr::NonNull;

use crate::format::{KernelEntry, Reloc};
use crate::memory::round_to_pages;
use crate::{reloc, Error};

/// The signature of every kernel: returns 0 on success, an error code
/// otherwise.
pub(crate) type KernelFn = unsafe extern "C" fn(arena: *mut u8, weights: *const u8) -> i32;

/// Relocated machine code mapped read+execute; unmapped on drop.
pub(crate) struct CodeMemory {
    ptr: NonNull<u8>,
    map_len: usize,
}

// SAFETY: the mapping is owned exclusively and never written after
// construction.
unsafe impl Send for CodeMemory {}
// SAFETY: see above; shared access only executes or reads it.
unsafe impl Sync for CodeMemory {}

impl CodeMemory {
    /// Maps `text`, applies `relocs`, and makes it executable.
    pub(crate) fn new(
        text: &[u8],
        kernels: &[KernelEntry],
        relocs: &[Reloc],
    ) -> Result<CodeMemory, Error> {
        let map_len = round_to_pages(text.len()).ok_or_else(|| {
            Error::CodeMemory(io::Error::new(io::ErrorKind::OutOfMemory, "TEXT too large"))
        })?;
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
            return Err(Error::CodeMemory(io::Error::last_os_error()));
        }
        let ptr = NonNull::new(raw.cast::<u8>())
            .ok_or_else(|| Error::CodeMemory(io::Error::other("mmap returned a null mapping")))?;
        // From here on, `Drop` unmaps on every error path.
        let code = CodeMemory { ptr, map_len };
        // SAFETY: the mapping is `map_len >= text.len()` bytes, writable, and
        // only reachable through `code`.
        let image = unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr(), text.len()) };
        image.copy_from_slice(text);
        reloc::apply(image, ptr.as_ptr() as u64, kernels, relocs)?;
        // SAFETY: changes the protection of our own mapping only.
        let rc = unsafe { libc::mprotect(raw, map_len, libc::PROT_READ | libc::PROT_EXEC) };
        if rc != 0 {
            return Err(Error::CodeMemory(io::Error::last_os_error()));
        }
        flush_icache(ptr.as_ptr(), text.len());
        Ok(code)
    }

    /// The entry point of `kernel` (validated to lie inside TEXT).
    pub(crate) fn entry(&self, kernel: &KernelEntry) -> KernelFn {
        // SAFETY: `text_offset` < TEXT length <= mapping length, so the
        // address is inside the mapping; the artifact declares a kernel with
        // the `KernelFn` ABI there. Calling it remains unsafe.
        unsafe {
            let addr = self.ptr.as_ptr().add(kernel.text_offset as usize);
            std::mem::transmute::<*mut u8, KernelFn>(addr)
        }
    }
}

impl Drop for CodeMemory {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in `new`.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.map_len) };
    }
}

#[cfg(target_arch = "aarch64")]
fn flush_icache(start: *mut u8, len: usize) {
    extern "C" {
        fn __clear_cache(start: *mut libc::c_char, end: *mut libc::c_char);
    }
    // SAFETY: the range lies inside our mapping.
    unsafe { __clear_cache(start.cast(), start.add(len).cast()) }
}

#[cfg(not(target_arch = "aarch64"))]
fn flush_icache(_start: *mut u8, _len: usize) {
    // x86-64 keeps instruction caches coherent with data writes.
}
