//! Artifact encoding and decoding: round trips, determinism, and a clear
//! error for every kind of malformed file.

mod common;

use common::{copy_model, rich_artifact, spec};
use kiln_runtime::format::{
    read_header, Artifact, ArtifactView, DType, FormatError, RelocTarget, SectionKind,
    FORMAT_VERSION, HEADER_LEN, SECTION_ALIGN, SECTION_ENTRY_LEN,
};

fn sha256(data: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(data).into()
}

fn parse_err(bytes: &[u8]) -> FormatError {
    Artifact::parse(bytes).expect_err("parse should fail")
}

/// Offset of the section table entry for `kind`.
fn entry_at(kind: SectionKind) -> usize {
    HEADER_LEN + (kind as usize - 1) * SECTION_ENTRY_LEN
}

fn section_range(bytes: &[u8], kind: SectionKind) -> std::ops::Range<usize> {
    let s = read_header(bytes).unwrap().section(kind).clone();
    s.offset as usize..(s.offset + s.length) as usize
}

/// Re-encodes `a` after `edit`, for tests of semantic validation (the
/// checksums are then right, so parsing reaches the content checks).
fn encode_with(edit: impl FnOnce(&mut Artifact)) -> Vec<u8> {
    let mut a = rich_artifact();
    edit(&mut a);
    a.to_bytes()
}

#[test]
fn round_trip() {
    let a = rich_artifact();
    let bytes = a.to_bytes();
    assert_eq!(Artifact::parse(&bytes).unwrap(), a);
    let view = ArtifactView::parse(&bytes).unwrap();
    assert_eq!(view.header.version, FORMAT_VERSION);
    assert_eq!(view.header.content_hash, a.content_hash());
    assert_eq!(view.into_artifact(), a);
}

#[test]
fn serialization_is_deterministic_and_canonical() {
    let bytes = rich_artifact().to_bytes();
    assert_eq!(bytes, rich_artifact().to_bytes());
    assert_eq!(Artifact::parse(&bytes).unwrap().to_bytes(), bytes);
}

#[test]
fn sections_are_aligned_and_weights_in_place() {
    let bytes = rich_artifact().to_bytes();
    let header = read_header(&bytes).unwrap();
    for s in &header.sections {
        assert_eq!(s.offset % SECTION_ALIGN, 0, "{}", s.kind);
    }
    let w = section_range(&bytes, SectionKind::Weights);
    assert_eq!(bytes[w], rich_artifact().weights[..]);
}

#[test]
fn content_hash_changes_with_content() {
    let a = rich_artifact();
    let mut b = a.clone();
    b.weights[0] ^= 1;
    assert_ne!(a.content_hash(), b.content_hash());
}

#[test]
fn wrong_magic() {
    let mut bytes = copy_model().to_bytes();
    bytes[0] = b'X';
    let err = parse_err(&bytes);
    assert_eq!(err, FormatError::NotKiln);
    assert!(err.to_string().starts_with("not a Kiln artifact"), "{err}");
    assert_eq!(parse_err(b"\x7fELF\x02\x01\x01"), FormatError::NotKiln);
}

#[test]
fn newer_version() {
    let mut bytes = copy_model().to_bytes();
    let newer = FORMAT_VERSION + 1;
    bytes[8..12].copy_from_slice(&newer.to_le_bytes());
    let err = parse_err(&bytes);
    assert_eq!(
        err,
        FormatError::NewerVersion {
            found: newer,
            supported: FORMAT_VERSION
        }
    );
    assert_eq!(
        err.to_string(),
        format!(
            "artifact format version {newer} is newer than this runtime supports ({FORMAT_VERSION})"
        )
    );
}

#[test]
fn version_zero() {
    let mut bytes = copy_model().to_bytes();
    bytes[8..12].copy_from_slice(&0u32.to_le_bytes());
    assert_eq!(parse_err(&bytes), FormatError::InvalidVersion(0));
}

#[test]
fn truncated_file() {
    let bytes = rich_artifact().to_bytes();
    let err = parse_err(&bytes[..bytes.len() - 1]);
    assert!(matches!(err, FormatError::Truncated(_)), "{err:?}");
    // The last section is GOLDEN, empty here: the file ends with the
    // padding after SCHEDULE.
    assert!(
        err.to_string()
            .starts_with("artifact is truncated: section GOLDEN"),
        "{err}"
    );
    let err = parse_err(&bytes[..20]);
    assert_eq!(
        err.to_string(),
        "artifact is truncated: the header needs 64 bytes, the file has 20"
    );
    assert!(matches!(parse_err(&[]), FormatError::Truncated(_)));
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = rich_artifact().to_bytes();
    for len in 0..bytes.len() {
        assert!(Artifact::parse(&bytes[..len]).is_err(), "length {len}");
    }
}

#[test]
fn flipped_byte_in_text() {
    let mut bytes = copy_model().to_bytes();
    let text = section_range(&bytes, SectionKind::Text);
    bytes[text.start + 1] ^= 0x10;
    let err = parse_err(&bytes);
    assert_eq!(err, FormatError::SectionChecksum(SectionKind::Text));
    assert_eq!(err.to_string(), "checksum mismatch in section TEXT");
}

#[test]
fn flipped_byte_in_header() {
    let mut bytes = copy_model().to_bytes();
    bytes[16] ^= 1; // features
    assert_eq!(parse_err(&bytes), FormatError::HeaderChecksum);
}

#[test]
fn every_flipped_byte_is_an_error() {
    let bytes = rich_artifact().to_bytes();
    for i in 0..bytes.len() {
        let mut b = bytes.clone();
        b[i] ^= 0x01;
        assert!(
            Artifact::parse(&b).is_err(),
            "flipping byte {i} went unnoticed"
        );
    }
}

#[test]
fn trailing_bytes() {
    let mut bytes = copy_model().to_bytes();
    bytes.push(0);
    let err = parse_err(&bytes);
    assert_eq!(
        err,
        FormatError::SectionTable("1 unexpected bytes after the last section".into())
    );
}

#[test]
fn section_out_of_file() {
    let mut bytes = copy_model().to_bytes();
    let at = entry_at(SectionKind::Weights) + 16;
    bytes[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    // The header checksum catches it first ...
    assert_eq!(parse_err(&bytes), FormatError::HeaderChecksum);
    // ... and with a matching checksum, the range check does.
    fix_header_hash(&mut bytes);
    let err = parse_err(&bytes);
    assert!(matches!(err, FormatError::Truncated(_)), "{err:?}");
    assert!(
        err.to_string()
            .starts_with("artifact is truncated: section WEIGHTS (bytes ")
            && err.to_string().contains("extends past the end of the file"),
        "{err}"
    );
}

#[test]
fn misplaced_section() {
    let mut bytes = copy_model().to_bytes();
    let at = entry_at(SectionKind::Text) + 8;
    let offset = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
    bytes[at..at + 8].copy_from_slice(&(offset + 64).to_le_bytes());
    fix_header_hash(&mut bytes);
    let err = parse_err(&bytes);
    assert!(
        matches!(&err, FormatError::SectionTable(m) if m.starts_with("section TEXT starts at byte")),
        "{err:?}"
    );
}

fn malformed(bytes: &[u8], section: SectionKind, needle: &str) {
    match parse_err(bytes) {
        FormatError::Malformed { section: s, detail } => {
            assert_eq!(s, section);
            assert!(detail.contains(needle), "{detail:?} lacks {needle:?}");
        }
        other => panic!("expected Malformed in {section}, got {other:?}"),
    }
}

#[test]
fn kernel_outside_text() {
    let bytes = encode_with(|a| a.kernels[1].text_len = 1000);
    malformed(
        &bytes,
        SectionKind::Kernels,
        "kernel 'copy' (TEXT bytes 32..1032)",
    );
    let bytes = encode_with(|a| a.kernels[1].text_offset = u64::MAX);
    malformed(&bytes, SectionKind::Kernels, "lies outside TEXT");
    let bytes = encode_with(|a| a.kernels[1].text_len = 0);
    malformed(&bytes, SectionKind::Kernels, "is empty");
}

#[test]
fn reloc_outside_text() {
    // An Abs64 patch must fit entirely: TEXT is 43 bytes.
    let bytes = encode_with(|a| a.relocs[1].offset = 40);
    malformed(
        &bytes,
        SectionKind::Relocs,
        "patches TEXT bytes 40..48, outside TEXT (43 bytes)",
    );
    let bytes = encode_with(|a| a.relocs[1].offset = u64::MAX - 2);
    malformed(&bytes, SectionKind::Relocs, "outside TEXT");
    let bytes = encode_with(|a| a.relocs[2].target = RelocTarget::Text(44));
    malformed(&bytes, SectionKind::Relocs, "TEXT offset 44");
}

#[test]
fn reloc_addends_cannot_reach_outside_their_target() {
    // A host function is reached at its entry only.
    let bytes = encode_with(|a| a.relocs[1].addend = 3);
    malformed(
        &bytes,
        SectionKind::Relocs,
        "relocation 1 (Abs64 to Host(Tanhf)) has addend 3",
    );
    // PC-relative: the displacement counts from the end of the field, so
    // -4 reaches the kernel's entry; -4 - 33 reaches before TEXT.
    let bytes = encode_with(|a| a.relocs[0].addend = -37);
    malformed(
        &bytes,
        SectionKind::Relocs,
        "has addend -37, which reaches outside",
    );
    // TEXT is 43 bytes: offset 32 + 11 is its end, + 12 is past it.
    assert!(Artifact::parse(&encode_with(|a| a.relocs[2].addend = 11)).is_ok());
    let bytes = encode_with(|a| a.relocs[2].addend = 12);
    malformed(&bytes, SectionKind::Relocs, "has addend 12");
    let bytes = encode_with(|a| a.relocs[2].addend = i64::MIN);
    malformed(&bytes, SectionKind::Relocs, "reaches outside");
}

#[test]
fn reloc_kernel_index() {
    let bytes = encode_with(|a| a.relocs[0].target = RelocTarget::Kernel(2));
    malformed(
        &bytes,
        SectionKind::Relocs,
        "refers to kernel 2, but there are 2",
    );
}

#[test]
fn schedule_kernel_index() {
    let bytes = encode_with(|a| a.profiles[0].schedule[1].kernel = 9);
    malformed(
        &bytes,
        SectionKind::Profiles,
        "step 1 ('/b') calls kernels 9..10, but there are 2",
    );
}

#[test]
fn schedule_tasks_past_the_kernels_or_none() {
    let bytes = encode_with(|a| a.profiles[0].schedule[1].tasks = 2);
    malformed(
        &bytes,
        SectionKind::Profiles,
        "step 1 ('/b') calls kernels 1..3, but there are 2",
    );
    let bytes = encode_with(|a| a.profiles[0].schedule[0].tasks = 0);
    malformed(&bytes, SectionKind::Profiles, "step 0 ('/a') has no task");
}

#[test]
fn tensor_outside_arena() {
    let bytes = encode_with(|a| a.profiles[0].outputs[0].arena_offset = 28);
    malformed(
        &bytes,
        SectionKind::Profiles,
        "output 'y' (f32[2], 8 bytes at arena offset 28) does not fit in the arena (32 bytes)",
    );
    let bytes = encode_with(|a| a.profiles[0].inputs[0].shape = vec![u64::MAX, 2]);
    malformed(&bytes, SectionKind::Profiles, "too many bytes");
    let bytes = encode_with(|a| a.profiles[0].inputs[0].arena_offset = u64::MAX);
    malformed(&bytes, SectionKind::Profiles, "does not fit in the arena");
}

#[test]
fn duplicate_input_names() {
    let bytes = encode_with(|a| a.profiles[0].inputs.push(spec("x", DType::F32, &[], 0)));
    malformed(
        &bytes,
        SectionKind::Profiles,
        "input name 'x' appears twice",
    );
}

/// A second profile of `rich_artifact`: the same inputs and outputs with
/// another leading dim.
fn second_profile(a: &Artifact) -> kiln_runtime::format::Profile {
    let mut p = a.profiles[0].clone();
    p.inputs[0].shape = vec![1];
    p
}

#[test]
fn profiles_round_trip() {
    let mut a = rich_artifact();
    let p = second_profile(&a);
    a.profiles.push(p);
    let back = Artifact::parse(&a.to_bytes()).unwrap();
    assert_eq!(back, a);
    assert_eq!(back.profiles.len(), 2);
    assert_eq!(back.arena_size(), 32);
}

#[test]
fn padding_tables_round_trip_and_are_checked() {
    use kiln_runtime::format::PaddableDim;
    let dim = |inputs: Vec<Option<u32>>, outputs: Vec<Option<u32>>| PaddableDim {
        name: "batch".into(),
        inputs,
        outputs,
    };
    // rich_artifact: inputs x f32[2], mask bool[3,1]; outputs y f32[2], idx i64[].
    let mut a = rich_artifact();
    a.padding = vec![dim(vec![Some(0), Some(1)], vec![Some(0), None])];
    assert_eq!(Artifact::parse(&a.to_bytes()).unwrap(), a);
    for (table, why) in [
        (
            dim(vec![Some(1), None], vec![None, None]),
            "axis 1 of input 'x', whose rank is 1",
        ),
        (
            dim(vec![Some(0)], vec![None, None]),
            "has 1 input axes for 2 inputs",
        ),
        (dim(vec![None, None], vec![None, None]), "is on no input"),
        (
            dim(vec![Some(0), None], vec![None, Some(0)]),
            "axis 0 of output 'idx', whose rank is 0",
        ),
    ] {
        let bytes = encode_with(|a| a.padding = vec![table.clone()]);
        malformed(&bytes, SectionKind::Profiles, why);
    }
    let bytes = encode_with(|a| {
        a.padding = vec![
            dim(vec![Some(0), None], vec![None, None]),
            dim(vec![Some(0), None], vec![None, None]),
        ]
    });
    malformed(
        &bytes,
        SectionKind::Profiles,
        "repeats a name or an input axis",
    );
}

#[test]
fn bounded_outputs_round_trip_and_are_checked() {
    use kiln_runtime::format::BoundedOutput;
    let bounded = |output: u32, axis: u32, length_offset: u64| BoundedOutput {
        output,
        axis,
        length_offset,
    };
    // rich_artifact: outputs y f32[2], idx i64[]; a 32-byte arena.
    let mut a = rich_artifact();
    a.profiles[0].bounded = vec![bounded(0, 0, 24)];
    assert_eq!(Artifact::parse(&a.to_bytes()).unwrap(), a);
    for (table, why) in [
        (vec![bounded(2, 0, 0)], "bounded output 2 of 2 outputs"),
        (vec![bounded(1, 0, 0)], "bounded axis 0 of output 'idx'"),
        (
            vec![bounded(0, 0, 25)],
            "the length of output 'y' at arena+25 is outside the 32-byte arena",
        ),
        (
            vec![bounded(0, 0, u64::MAX)],
            "is outside the 32-byte arena",
        ),
        (
            vec![bounded(0, 0, 0), bounded(0, 0, 8)],
            "bounded output 0 out of order",
        ),
    ] {
        let bytes = encode_with(|a| a.profiles[0].bounded = table.clone());
        malformed(&bytes, SectionKind::Profiles, why);
    }
}

/// `rich_artifact` as the variants of one run-time `If`: profiles 0 and 1
/// guarded by the condition program 2 (one bool).
fn variants_artifact() -> Artifact {
    use kiln_runtime::format::{Guard, Role};
    let mut a = rich_artifact();
    let guard = |holds| Role::Model {
        guards: vec![Guard {
            condition: 2,
            holds,
        }],
    };
    a.profiles[0].role = guard(true);
    let mut other = a.profiles[0].clone();
    other.role = guard(false);
    let mut condition = a.profiles[0].clone();
    condition.outputs = vec![spec("condition", DType::Bool, &[1], 0)];
    condition.role = Role::Condition {
        what: "If 'If_0' takes its then branch".into(),
    };
    a.profiles.extend([other, condition]);
    a
}

#[test]
fn run_time_variants_round_trip_and_are_checked() {
    use kiln_runtime::format::{Guard, Role};
    let a = variants_artifact();
    assert_eq!(Artifact::parse(&a.to_bytes()).unwrap(), a);
    let refused = |a: &mut Artifact| {
        let mut p = a.profiles[1].clone();
        p.inputs[0].shape = vec![1];
        p.outputs.clear();
        p.schedule.clear();
        p.role = Role::Refused {
            guards: a.profiles[1].role.guards().to_vec(),
            reason: "does not import".into(),
        };
        p
    };
    let mut b = variants_artifact();
    let mut condition = b.profiles[2].clone();
    condition.inputs[0].shape = vec![1];
    b.profiles.push(condition);
    let mut r = refused(&mut b);
    r.role = Role::Refused {
        guards: vec![Guard {
            condition: 3,
            holds: false,
        }],
        reason: "does not import".into(),
    };
    b.profiles.push(r);
    assert_eq!(Artifact::parse(&b.to_bytes()).unwrap(), b);
    type Change<'a> = Box<dyn Fn(&mut Artifact) + 'a>;
    let cases: Vec<(Change, &str)> = vec![
        (
            Box::new(|a| a.profiles[1].role = a.profiles[0].role.clone()),
            "profile 1 has the input shapes and guards of an earlier profile",
        ),
        (
            Box::new(|a| {
                a.profiles[1].role = Role::Model {
                    guards: vec![Guard {
                        condition: 0,
                        holds: false,
                    }],
                }
            }),
            "profile 1 is guarded by profile 0, not a condition program",
        ),
        (
            Box::new(|a| {
                a.profiles[1].role = Role::Model {
                    guards: vec![Guard {
                        condition: 9,
                        holds: false,
                    }],
                }
            }),
            "a guard names condition profile 9 of 3",
        ),
        (
            Box::new(|a| a.profiles[2].outputs[0].dtype = DType::F32),
            "does not give one one-element bool",
        ),
        (
            Box::new(|a| a.profiles.swap(0, 2)),
            "profile 0 is not a model profile",
        ),
        (
            Box::new(|a| {
                let mut r = refused(a);
                r.outputs = a.profiles[0].outputs.clone();
                a.profiles.push(r);
            }),
            "a refused variant, has outputs, steps or no guards",
        ),
        (
            Box::new(|a| {
                a.padding = vec![kiln_runtime::format::PaddableDim {
                    name: "batch".into(),
                    inputs: vec![Some(0), None],
                    outputs: vec![None, None],
                }]
            }),
            "paddable dims in an artifact with run-time variants",
        ),
    ];
    for (change, why) in cases {
        let mut a = variants_artifact();
        change(&mut a);
        malformed(&a.to_bytes(), SectionKind::Profiles, why);
    }
}

#[test]
fn inconsistent_profile_tables_are_refused() {
    // No profile.
    let bytes = encode_with(|a| a.profiles.clear());
    malformed(&bytes, SectionKind::Profiles, "no profile");
    // Two profiles with the same input shapes: a run could not pick.
    let bytes = encode_with(|a| {
        let p = a.profiles[0].clone();
        a.profiles.push(p);
    });
    malformed(
        &bytes,
        SectionKind::Profiles,
        "profile 1 has the input shapes and guards of an earlier profile",
    );
    // A profile whose inputs differ in name, dtype or rank.
    for change in 0..3 {
        let bytes = encode_with(|a| {
            let mut p = second_profile(a);
            match change {
                0 => p.inputs[1].name = "other".into(),
                1 => p.inputs[1].dtype = DType::U8,
                _ => p.inputs[0].shape = vec![1, 1],
            }
            a.profiles.push(p);
        });
        malformed(
            &bytes,
            SectionKind::Profiles,
            "profile 1's inputs differ from profile 0's in name, dtype or rank",
        );
    }
    let bytes = encode_with(|a| {
        let mut p = second_profile(a);
        p.outputs.pop();
        a.profiles.push(p);
    });
    malformed(&bytes, SectionKind::Profiles, "profile 1's outputs differ");
    // A truncated table: the count claims one more profile than follows.
    let mut bytes = rich_artifact().to_bytes();
    patch_section(&mut bytes, SectionKind::Profiles, 0, &2u32.to_le_bytes());
    let err = parse_err(&bytes);
    assert!(
        matches!(
            &err,
            FormatError::Malformed {
                section: SectionKind::Profiles,
                ..
            }
        ),
        "{err:?}"
    );
}

/// Overwrites bytes of a section and fixes up its checksum and the header,
/// to reach the decoder's checks for codes the writer cannot produce.
fn patch_section(bytes: &mut [u8], kind: SectionKind, at: usize, new: &[u8]) {
    let range = section_range(bytes, kind);
    bytes[range.start + at..range.start + at + new.len()].copy_from_slice(new);
    let digest = sha256(&bytes[range]);
    let entry = entry_at(kind);
    bytes[entry + 24..entry + 56].copy_from_slice(&digest);
    fix_header_hash(bytes);
}

/// Recomputes the header's content hash after an edit of the header or
/// section table.
fn fix_header_hash(bytes: &mut [u8]) {
    let table_end = HEADER_LEN + SectionKind::ALL.len() * SECTION_ENTRY_LEN;
    let mut hashed = bytes[..32].to_vec();
    hashed.extend_from_slice(&bytes[64..table_end]);
    let h = sha256(&hashed);
    bytes[32..64].copy_from_slice(&h);
}

#[test]
fn unknown_dtype_code() {
    let mut bytes = copy_model().to_bytes();
    // PROFILES: profile count, arena size, input count, then the first
    // input's name ("x") and its dtype byte.
    let at = 4 + 8 + 4 + 4 + 1;
    patch_section(&mut bytes, SectionKind::Profiles, at, &[77]);
    let err = parse_err(&bytes);
    assert_eq!(
        err,
        FormatError::UnknownCode {
            what: "dtype",
            code: 77
        }
    );
    assert_eq!(err.to_string(), "unknown dtype code 77");
}

#[test]
fn unknown_reloc_codes() {
    let base = rich_artifact().to_bytes();
    // RELOCS: count, then 32-byte records: offset, kind, target kind, ...
    let mut bytes = base.clone();
    patch_section(&mut bytes, SectionKind::Relocs, 4 + 8, &9u32.to_le_bytes());
    assert_eq!(
        parse_err(&bytes).to_string(),
        "unknown relocation kind code 9"
    );
    let mut bytes = base.clone();
    patch_section(&mut bytes, SectionKind::Relocs, 4 + 12, &5u32.to_le_bytes());
    assert_eq!(
        parse_err(&bytes).to_string(),
        "unknown relocation target kind code 5"
    );
    let mut bytes = base;
    // Second record's target value: a host function code.
    patch_section(
        &mut bytes,
        SectionKind::Relocs,
        4 + 32 + 16,
        &999u64.to_le_bytes(),
    );
    assert_eq!(
        parse_err(&bytes).to_string(),
        "unknown host function code 999"
    );
}

#[test]
fn absurd_counts_are_refused_without_allocating() {
    let mut bytes = rich_artifact().to_bytes();
    patch_section(&mut bytes, SectionKind::Relocs, 0, &u32::MAX.to_le_bytes());
    malformed(
        &bytes,
        SectionKind::Relocs,
        "relocation count is 4294967295",
    );
}

#[test]
fn older_versions_are_refused_with_a_rebuild_hint() {
    for old in 1..FORMAT_VERSION {
        let mut bytes = copy_model().to_bytes();
        bytes[8..12].copy_from_slice(&old.to_le_bytes());
        let err = parse_err(&bytes);
        assert_eq!(
            err,
            FormatError::OlderVersion {
                found: old,
                supported: FORMAT_VERSION
            }
        );
        let text = err.to_string();
        assert!(
            text.contains("older Kiln") && text.contains("rebuild the artifact with this compiler"),
            "{text}"
        );
    }
}

#[test]
fn the_golden_section_round_trips_and_is_checksummed() {
    use kiln_runtime::format::{Golden, GoldenSet, GoldenTensor, Tolerance};
    use std::borrow::Cow;
    let t = |name: &str, v: &[f32]| GoldenTensor {
        name: name.into(),
        dtype: DType::F32,
        shape: vec![v.len() as u64],
        data: Cow::Owned(v.iter().flat_map(|x| x.to_le_bytes()).collect()),
    };
    let a = Artifact {
        golden: Golden {
            sets: vec![GoldenSet {
                inputs: vec![t("x", &[1.0, 2.0])],
                outputs: vec![t("y", &[1.0, 2.0])],
            }],
            tolerances: vec![Tolerance {
                output: "y".into(),
                max_rel_error: 1e-4,
            }],
        },
        ..copy_model()
    };
    let bytes = a.to_bytes();
    assert_eq!(Artifact::parse(&bytes).unwrap(), a);
    let range = section_range(&bytes, SectionKind::Golden);
    assert!(!range.is_empty());
    let mut bad = bytes.clone();
    bad[range.end - 1] ^= 1;
    assert_eq!(
        parse_err(&bad),
        FormatError::SectionChecksum(SectionKind::Golden)
    );
}
