//! Bounds of a CUDA cubin (an ELF64 file) before the driver sees it.
//!
//! `cuModuleLoadData` takes a pointer, not a length: the driver trusts the
//! ELF headers to say where the file's parts are. A cubin whose header,
//! section table, program headers, section contents or symbol and section
//! names point past its end would make the driver read past the buffer, so
//! such a cubin is refused here, while the artifact is decoded.

/// `e_machine` of NVIDIA CUDA code.
const EM_CUDA: u16 = 190;
const HEADER_LEN: usize = 64;
const SECTION_HEADER_LEN: u64 = 64;
const PROGRAM_HEADER_LEN: u64 = 56;
const SYMBOL_LEN: u64 = 24;
const SHT_SYMTAB: u32 = 2;
const SHT_STRTAB: u32 = 3;
/// Occupies no file bytes.
const SHT_NOBITS: u32 = 8;
const SHT_DYNSYM: u32 = 11;

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// `count` records of `len` bytes at `offset` inside a file of `file_len`
/// bytes, as a range.
fn table(offset: u64, count: u64, len: u64, file_len: usize) -> Option<std::ops::Range<usize>> {
    let end = offset.checked_add(count.checked_mul(len)?)?;
    (end <= file_len as u64).then_some(offset as usize..end as usize)
}

/// One section header's fields that locate its bytes.
struct Section {
    kind: u32,
    name: u32,
    range: std::ops::Range<usize>,
    link: u32,
    entsize: u64,
}

/// Checks that every part of the ELF64 little-endian CUDA file `elf` that
/// its headers locate lies inside it; the error says what does not.
pub(crate) fn check_cubin(elf: &[u8]) -> Result<(), String> {
    if elf.len() < HEADER_LEN || elf[..4] != *b"\x7fELF" {
        return Err("the cubin is not an ELF file".into());
    }
    if elf[4] != 2 || elf[5] != 1 {
        return Err("the cubin is not a 64-bit little-endian ELF file".into());
    }
    if u16_at(elf, 18) != EM_CUDA {
        return Err(format!(
            "the cubin's machine is {}, not CUDA ({EM_CUDA})",
            u16_at(elf, 18)
        ));
    }
    if usize::from(u16_at(elf, 52)) != HEADER_LEN {
        return Err("the cubin's ELF header size is not 64".into());
    }
    let (phoff, phentsize, phnum) = (u64_at(elf, 32), u16_at(elf, 54), u16_at(elf, 56));
    let (shoff, shentsize, shnum) = (u64_at(elf, 40), u16_at(elf, 58), u16_at(elf, 60));
    let shstrndx = u16_at(elf, 62);
    let outside = |what: &str| format!("the cubin's {what} lies outside its {} bytes", elf.len());
    if phnum > 0 {
        if u64::from(phentsize) != PROGRAM_HEADER_LEN {
            return Err("the cubin's program header size is not 56".into());
        }
        let headers = table(phoff, phnum.into(), PROGRAM_HEADER_LEN, elf.len())
            .ok_or_else(|| outside("program header table"))?;
        for (i, h) in elf[headers]
            .chunks_exact(PROGRAM_HEADER_LEN as usize)
            .enumerate()
        {
            table(u64_at(h, 8), u64_at(h, 32), 1, elf.len())
                .ok_or_else(|| outside(&format!("segment {i}")))?;
        }
    }
    if shnum == 0 {
        // No sections (or the extended numbering, which cubins never need).
        return if shoff == 0 && shstrndx == 0 {
            Ok(())
        } else {
            Err("the cubin uses ELF extended section numbering".into())
        };
    }
    if u64::from(shentsize) != SECTION_HEADER_LEN {
        return Err("the cubin's section header size is not 64".into());
    }
    let headers = table(shoff, shnum.into(), SECTION_HEADER_LEN, elf.len())
        .ok_or_else(|| outside("section header table"))?;
    let mut sections = Vec::with_capacity(shnum.into());
    for (i, h) in elf[headers]
        .chunks_exact(SECTION_HEADER_LEN as usize)
        .enumerate()
    {
        let kind = u32_at(h, 4);
        let size = if kind == SHT_NOBITS { 0 } else { u64_at(h, 32) };
        let range = table(u64_at(h, 24), size, 1, elf.len())
            .ok_or_else(|| outside(&format!("section {i}")))?;
        sections.push(Section {
            kind,
            name: u32_at(h, 0),
            range,
            link: u32_at(h, 40),
            entsize: u64_at(h, 56),
        });
    }
    // Names: offsets into string tables, which must end with a NUL so that
    // reading a name stops inside them.
    let strings = |index: u64, what: &str| -> Result<&[u8], String> {
        let table = usize::try_from(index)
            .ok()
            .and_then(|i| sections.get(i))
            .filter(|s| s.kind == SHT_STRTAB && elf[s.range.clone()].last() == Some(&0))
            .ok_or_else(|| format!("the cubin's {what} has no NUL-terminated string table"))?;
        Ok(&elf[table.range.clone()])
    };
    let check_name = |names: &[u8], name: u32, what: &str| {
        if name as usize >= names.len() {
            return Err(outside(&format!("{what} name")));
        }
        Ok(())
    };
    if shstrndx != 0 {
        let names = strings(shstrndx.into(), "section header")?;
        for (i, s) in sections.iter().enumerate() {
            check_name(names, s.name, &format!("section {i}"))?;
        }
    }
    for (i, s) in sections.iter().enumerate() {
        if s.kind != SHT_SYMTAB && s.kind != SHT_DYNSYM {
            continue;
        }
        if s.entsize != SYMBOL_LEN || !(s.range.len() as u64).is_multiple_of(SYMBOL_LEN) {
            return Err(format!(
                "the cubin's symbol table (section {i}) is malformed"
            ));
        }
        let names = strings(s.link.into(), &format!("symbol table (section {i})"))?;
        for sym in elf[s.range.clone()].chunks_exact(SYMBOL_LEN as usize) {
            check_name(names, u32_at(sym, 0), &format!("a symbol of section {i}"))?;
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A minimal valid cubin: the ELF header, a NULL section, a string
    /// table (also the section-name table) and a symbol table naming one
    /// symbol.
    pub(crate) fn tiny_cubin() -> Vec<u8> {
        let strtab = b"\0.strtab\0.symtab\0k\0".to_vec();
        let mut symtab = vec![0u8; 48];
        symtab[24..28].copy_from_slice(&17u32.to_le_bytes()); // "k"
        let data_start = 64u64;
        let strtab_off = data_start;
        let symtab_off = strtab_off + strtab.len() as u64;
        let shoff = (symtab_off + symtab.len() as u64).next_multiple_of(8);
        let mut f = vec![0u8; 64];
        f[..4].copy_from_slice(b"\x7fELF");
        f[4] = 2;
        f[5] = 1;
        f[6] = 1;
        f[18..20].copy_from_slice(&EM_CUDA.to_le_bytes());
        f[40..48].copy_from_slice(&shoff.to_le_bytes());
        f[52..54].copy_from_slice(&64u16.to_le_bytes());
        f[58..60].copy_from_slice(&64u16.to_le_bytes());
        f[60..62].copy_from_slice(&3u16.to_le_bytes());
        f[62..64].copy_from_slice(&1u16.to_le_bytes());
        f.extend_from_slice(&strtab);
        f.extend_from_slice(&symtab);
        f.resize(shoff as usize, 0);
        let section = |name: u32, kind: u32, off: u64, size: u64, link: u32, entsize: u64| {
            let mut h = vec![0u8; 64];
            h[0..4].copy_from_slice(&name.to_le_bytes());
            h[4..8].copy_from_slice(&kind.to_le_bytes());
            h[24..32].copy_from_slice(&off.to_le_bytes());
            h[32..40].copy_from_slice(&size.to_le_bytes());
            h[40..44].copy_from_slice(&link.to_le_bytes());
            h[56..64].copy_from_slice(&entsize.to_le_bytes());
            h
        };
        f.extend(section(0, 0, 0, 0, 0, 0));
        f.extend(section(
            1,
            SHT_STRTAB,
            strtab_off,
            strtab.len() as u64,
            0,
            0,
        ));
        f.extend(section(9, SHT_SYMTAB, symtab_off, 48, 1, SYMBOL_LEN));
        f
    }

    #[test]
    fn a_well_formed_cubin_passes() {
        check_cubin(&tiny_cubin()).unwrap();
    }

    #[test]
    fn anything_pointing_past_the_end_is_refused() {
        let good = tiny_cubin();
        let shoff = u64_at(&good, 40) as usize;
        let patch = |at: usize, v: u64, width: usize| {
            let mut f = good.clone();
            f[at..at + width].copy_from_slice(&v.to_le_bytes()[..width]);
            check_cubin(&f).unwrap_err()
        };
        let e = patch(40, good.len() as u64, 8);
        assert!(e.contains("section header table"), "{e}");
        let e = patch(60, 4, 2);
        assert!(e.contains("section header table"), "{e}");
        // The string table's size reaches past the end.
        let e = patch(shoff + 64 + 32, 1 << 20, 8);
        assert!(e.contains("section 1"), "{e}");
        // A symbol's name offset past its string table.
        let mut f = good.clone();
        let symtab = u64_at(&good, shoff + 128 + 24) as usize;
        f[symtab + 24..symtab + 28].copy_from_slice(&999u32.to_le_bytes());
        let e = check_cubin(&f).unwrap_err();
        assert!(e.contains("symbol"), "{e}");
        // Program headers past the end.
        let mut f = good.clone();
        f[32..40].copy_from_slice(&(good.len() as u64).to_le_bytes());
        f[54..56].copy_from_slice(&56u16.to_le_bytes());
        f[56..58].copy_from_slice(&1u16.to_le_bytes());
        let e = check_cubin(&f).unwrap_err();
        assert!(e.contains("program header"), "{e}");
        for cut in [0, 10, 63, good.len() - 1] {
            assert!(check_cubin(&good[..cut]).is_err(), "cut {cut}");
        }
        let e = patch(18, 62, 2);
        assert!(e.contains("not CUDA"), "{e}");
    }
}
