//! Applying relocations to a copy of TEXT.

use crate::format::{KernelEntry, Reloc, RelocKind, RelocTarget};
use crate::{host, Error};

/// Patches `text`, which will execute at address `base`. The relocations and
/// kernels must have been validated against `text` (as
/// [`ArtifactView::parse`](crate::format::ArtifactView::parse) does).
pub(crate) fn apply(
    text: &mut [u8],
    base: u64,
    kernels: &[KernelEntry],
    relocs: &[Reloc],
) -> Result<(), Error> {
    for (index, r) in relocs.iter().enumerate() {
        let target = match r.target {
            RelocTarget::Host(f) => host::address(f),
            RelocTarget::Kernel(k) => base + kernels[k as usize].text_offset,
            RelocTarget::Text(offset) => base + offset,
        };
        let value = i128::from(target) + i128::from(r.addend);
        let at = r.offset as usize;
        match r.kind {
            RelocKind::Abs64 => {
                // Wrapping is the defined meaning of an address plus a
                // negative addend below zero; it cannot happen for sane code.
                text[at..at + 8].copy_from_slice(&(value as u64).to_le_bytes());
            }
            RelocKind::PcRel32 => {
                let distance = value - i128::from(base + r.offset);
                let Ok(rel) = i32::try_from(distance) else {
                    return Err(Error::RelocationOutOfRange {
                        index,
                        offset: r.offset,
                        distance,
                    });
                };
                text[at..at + 4].copy_from_slice(&rel.to_le_bytes());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::HostFn;

    fn reloc(offset: u64, kind: RelocKind, target: RelocTarget, addend: i64) -> Reloc {
        Reloc {
            offset,
            kind,
            target,
            addend,
        }
    }

    #[test]
    fn patches_each_kind() {
        let kernels = [KernelEntry {
            name: "k".into(),
            text_offset: 16,
            text_len: 16,
        }];
        let relocs = [
            reloc(0, RelocKind::Abs64, RelocTarget::Kernel(0), 2),
            reloc(8, RelocKind::PcRel32, RelocTarget::Text(20), -4),
            reloc(12, RelocKind::PcRel32, RelocTarget::Text(0), 0),
            reloc(16, RelocKind::Abs64, RelocTarget::Host(HostFn::Expf), 0),
        ];
        let mut text = [0u8; 32];
        apply(&mut text, 0x1000, &kernels, &relocs).unwrap();
        assert_eq!(u64::from_le_bytes(text[0..8].try_into().unwrap()), 0x1012);
        assert_eq!(i32::from_le_bytes(text[8..12].try_into().unwrap()), 8);
        assert_eq!(i32::from_le_bytes(text[12..16].try_into().unwrap()), -12);
        let expf = u64::from_le_bytes(text[16..24].try_into().unwrap());
        assert_eq!(expf, host::address(HostFn::Expf));
    }

    #[test]
    fn out_of_range_pc_relative_is_an_error() {
        let relocs = [reloc(0, RelocKind::PcRel32, RelocTarget::Text(0), 1 << 40)];
        let err = apply(&mut [0; 4], 0x1000, &[], &relocs).unwrap_err();
        assert!(err.to_string().contains("does not fit in 32 bits"), "{err}");
    }
}
