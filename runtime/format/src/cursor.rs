//! Little-endian encoding helpers: a growable writer and a bounds-checked
//! reader that never allocates more than the remaining input justifies.

use super::{FormatError, SectionKind};

/// Appends little-endian values to a byte vector.
#[derive(Default)]
pub(crate) struct Writer(pub(crate) Vec<u8>);

impl Writer {
    pub(crate) fn u8(&mut self, v: u8) {
        self.0.push(v);
    }

    pub(crate) fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    pub(crate) fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    pub(crate) fn i64(&mut self, v: i64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    pub(crate) fn bytes(&mut self, v: &[u8]) {
        self.0.extend_from_slice(v);
    }

    /// A count or string length; values beyond `u32::MAX` cannot be
    /// represented in format v1 and are a bug in the writer's caller.
    pub(crate) fn len(&mut self, n: usize) {
        let n = u32::try_from(n).expect("artifact table or string longer than u32::MAX");
        self.u32(n);
    }

    /// `u32` byte length, then UTF-8 bytes.
    pub(crate) fn str(&mut self, s: &str) {
        self.len(s.len());
        self.bytes(s.as_bytes());
    }
}

/// Reads little-endian values from one section, checking every length
/// against the bytes that remain.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    section: SectionKind,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8], section: SectionKind) -> Self {
        Reader {
            bytes,
            pos: 0,
            section,
        }
    }

    /// A [`FormatError::Malformed`] for this section.
    pub(crate) fn error(&self, detail: impl Into<String>) -> FormatError {
        FormatError::Malformed {
            section: self.section,
            detail: detail.into(),
        }
    }

    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    pub(crate) fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], FormatError> {
        let available = self.remaining();
        match usize::try_from(n) {
            Ok(n) if n <= available => {
                let out = &self.bytes[self.pos..self.pos + n];
                self.pos += n;
                Ok(out)
            }
            _ => Err(self.error(format!(
                "{what} needs {n} bytes at offset {} but only {available} remain",
                self.pos
            ))),
        }
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], FormatError> {
        let bytes = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    pub(crate) fn u8(&mut self, what: &str) -> Result<u8, FormatError> {
        Ok(self.array::<1>(what)?[0])
    }

    pub(crate) fn u32(&mut self, what: &str) -> Result<u32, FormatError> {
        self.array(what).map(u32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self, what: &str) -> Result<u64, FormatError> {
        self.array(what).map(u64::from_le_bytes)
    }

    pub(crate) fn i64(&mut self, what: &str) -> Result<i64, FormatError> {
        self.array(what).map(i64::from_le_bytes)
    }

    pub(crate) fn sha256(&mut self, what: &str) -> Result<[u8; 32], FormatError> {
        self.array(what)
    }

    /// `u32` byte length, then that many bytes of UTF-8.
    pub(crate) fn str(&mut self, what: &str) -> Result<String, FormatError> {
        let len = self.u32(what)?;
        let bytes = self.take(u64::from(len), what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(self.error(format!("{what} is not valid UTF-8"))),
        }
    }

    /// A `u32` record count, refused if `count` records of at least
    /// `min_record` bytes each cannot fit in what remains.
    pub(crate) fn count(&mut self, what: &str, min_record: usize) -> Result<usize, FormatError> {
        let count = self.u32(what)?;
        let fits = usize::try_from(count)
            .ok()
            .filter(|&c| c.saturating_mul(min_record) <= self.remaining());
        fits.ok_or_else(|| {
            self.error(format!(
                "{what} is {count}, but only {} bytes remain",
                self.remaining()
            ))
        })
    }

    /// Errors unless every byte was consumed.
    pub(crate) fn finish(self) -> Result<(), FormatError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(self.error(format!("{n} unexpected bytes at the end"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reader_round_trips_writer() {
        let mut w = Writer::default();
        w.u8(7);
        w.u32(0xdead_beef);
        w.u64(u64::MAX - 1);
        w.i64(-5);
        w.str("héllo");
        let mut r = Reader::new(&w.0, SectionKind::Meta);
        assert_eq!(r.u8("a").unwrap(), 7);
        assert_eq!(r.u32("b").unwrap(), 0xdead_beef);
        assert_eq!(r.u64("c").unwrap(), u64::MAX - 1);
        assert_eq!(r.i64("d").unwrap(), -5);
        assert_eq!(r.str("e").unwrap(), "héllo");
        r.finish().unwrap();
    }

    #[test]
    fn huge_lengths_are_refused_before_allocating() {
        let mut w = Writer::default();
        w.u32(u32::MAX);
        let err = Reader::new(&w.0, SectionKind::Kernels).str("kernel name");
        let msg = err.unwrap_err().to_string();
        assert!(msg.contains("kernel name needs 4294967295 bytes"), "{msg}");
        let err = Reader::new(&w.0, SectionKind::Relocs).count("relocation count", 32);
        assert!(err
            .unwrap_err()
            .to_string()
            .contains("relocation count is 4294967295"));
    }

    #[test]
    fn trailing_bytes_are_refused() {
        let r = Reader::new(&[1, 2], SectionKind::Profiles);
        assert!(r
            .finish()
            .unwrap_err()
            .to_string()
            .contains("2 unexpected bytes"));
    }
}
