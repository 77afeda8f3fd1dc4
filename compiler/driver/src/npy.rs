//! `.npy` / `.npz` tensor files for `kiln run`, via the `npyz` crate.
//!
//! numpy's own types map to Kiln's (`<f2` is f16). The types numpy has
//! only through `ml_dtypes` (bfloat16, the float8 kinds, float4, the 4-
//! and 2-bit integers) are saved by numpy as raw elements (`<V2`, `<V1`,
//! or `<f1` for `float8_e5m2`) that do not say which type they are: they
//! are read as the type of the input they feed, and written as `|V2` /
//! `|V1`, which `np.load(f).view(ml_dtypes.bfloat16)` reads back. Raw
//! bits given as unsigned integers of the same size (`.view(np.uint16)`)
//! are accepted too. The 4- and 2-bit types hold one element per byte,
//! its code in the low bits, as `ml_dtypes` does.

use crate::output::write_atomically;
use kiln_runtime::{DType, Tensor};
use npyz::{FixedSizeBytes, TypeChar, WriterBuilder};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;
use thiserror::Error;

/// Errors reading or writing tensor files.
#[derive(Debug, Error)]
pub enum NpyError {
    /// The file could not be opened, read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not a readable `.npy`/`.npz`.
    #[error("{path}: not a readable .npy file: {message}")]
    Malformed {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// The array's element type has no Kiln equivalent.
    #[error("{path}: unsupported .npy element type '{descr}' (supported: f2, f4, f8, i1, u1, i2, i4, i8, u2, u4, u8, b1, little-endian; raw V1/V2 elements for the ml_dtypes types)")]
    UnsupportedType {
        /// The file.
        path: String,
        /// numpy's type string.
        descr: String,
    },
    /// The file's element type is not the type of the tensor it gives.
    #[error("{path}: holds {file} elements ('{descr}'), but {tensor} is {expected}{hint}")]
    TypeMismatch {
        /// The file.
        path: String,
        /// The tensor it was given for (`input 'x'`).
        tensor: String,
        /// What the file holds (a Kiln type, or `raw N-byte`).
        file: String,
        /// numpy's type string.
        descr: String,
        /// The tensor's type.
        expected: DType,
        /// How to make a matching file.
        hint: String,
    },
}

/// What a `.npy` array's elements are.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Elements {
    /// One of numpy's own types.
    Typed(DType),
    /// Raw elements of this many bytes (`V1`, `V2`, `f1`): an `ml_dtypes`
    /// type, which numpy saves without naming it.
    Raw(usize),
}

/// Whether `d` is a type numpy has only through `ml_dtypes`, so that a file
/// holds its elements raw: bfloat16 and the narrow storage types (one
/// code per byte, [`DType::is_narrow`]).
fn needs_raw_bits(d: DType) -> bool {
    d == DType::BF16 || d.is_narrow()
}

/// One element's bytes, whatever numpy type a file gives them (the reader
/// of [`Elements::Raw`] arrays and of raw bits saved as unsigned ints).
#[derive(Clone, Copy)]
struct Bits<const N: usize>([u8; N]);

struct BitsReader<const N: usize>;

impl<const N: usize> npyz::TypeRead for BitsReader<N> {
    type Value = Bits<N>;
    fn read_one<R: Read>(&self, mut bytes: R) -> std::io::Result<Bits<N>> {
        let mut b = [0u8; N];
        bytes.read_exact(&mut b)?;
        Ok(Bits(b))
    }
}

impl<const N: usize> npyz::Deserialize for Bits<N> {
    type TypeReader = BitsReader<N>;
    fn reader(dtype: &npyz::DType) -> Result<BitsReader<N>, npyz::DTypeError> {
        match dtype {
            npyz::DType::Plain(ts) if ts.size_field() == N as u64 => Ok(BitsReader),
            _ => Err(npyz::DTypeError::custom(format!(
                "not {N}-byte elements: {}",
                dtype.descr()
            ))),
        }
    }
}

fn elements_of(path: &str, descr: &npyz::DType) -> Result<Elements, NpyError> {
    let unsupported = || NpyError::UnsupportedType {
        path: path.to_string(),
        descr: descr.descr(),
    };
    let npyz::DType::Plain(ts) = descr else {
        return Err(unsupported());
    };
    if ts.endianness() == npyz::Endianness::Big && ts.size_field() > 1 {
        return Err(unsupported());
    }
    Ok(Elements::Typed(match (ts.type_char(), ts.size_field()) {
        (TypeChar::Float, 2) => DType::F16,
        (TypeChar::Float, 4) => DType::F32,
        (TypeChar::Float, 8) => DType::F64,
        (TypeChar::Int, 1) => DType::I8,
        (TypeChar::Uint, 1) => DType::U8,
        (TypeChar::Int, 2) => DType::I16,
        (TypeChar::Int, 4) => DType::I32,
        (TypeChar::Int, 8) => DType::I64,
        (TypeChar::Uint, 2) => DType::U16,
        (TypeChar::Uint, 4) => DType::U32,
        (TypeChar::Uint, 8) => DType::U64,
        (TypeChar::Bool, 1) => DType::Bool,
        (TypeChar::RawData, n @ (1 | 2)) | (TypeChar::Float, n @ 1) => {
            return Ok(Elements::Raw(n as usize))
        }
        _ => return Err(unsupported()),
    }))
}

/// The type of the tensor a file of `elements` gives, for a tensor of type
/// `want` when it has one: the file's own type, or `want` for raw bits of
/// its size; a mismatch names both.
fn tensor_type(
    path: &str,
    tensor: &str,
    descr: &npyz::DType,
    elements: Elements,
    want: Option<DType>,
) -> Result<DType, NpyError> {
    let mismatch = |file: String, expected: DType| NpyError::TypeMismatch {
        path: path.to_string(),
        tensor: tensor.to_string(),
        file,
        descr: descr.descr(),
        expected,
        hint: if needs_raw_bits(expected) {
            format!(
                "; save an ml_dtypes.{} array, or its bits as {}-byte unsigned ints",
                ml_dtypes_name(expected),
                expected.size_bytes()
            )
        } else {
            format!("; save it with .astype(np.{})", numpy_name(expected))
        },
    };
    let raw_size = |d: DType| needs_raw_bits(d).then(|| d.size_bytes());
    match (elements, want) {
        (Elements::Typed(d), None) => Ok(d),
        (Elements::Typed(d), Some(w)) if d == w => Ok(d),
        // Raw bits saved as unsigned ints of the same size.
        (Elements::Typed(d @ (DType::U8 | DType::U16)), Some(w))
            if raw_size(w) == Some(d.size_bytes()) =>
        {
            Ok(w)
        }
        (Elements::Typed(d), Some(w)) => Err(mismatch(d.to_string(), w)),
        (Elements::Raw(n), Some(w)) if w.size_bytes() == n && !matches!(w, DType::Bool) => Ok(w),
        (Elements::Raw(n), Some(w)) => Err(mismatch(format!("raw {n}-byte"), w)),
        (Elements::Raw(n), None) => Err(NpyError::Malformed {
            path: path.to_string(),
            message: format!(
                "{tensor}: raw {n}-byte elements ('{}') name no type, and nothing here says which",
                descr.descr()
            ),
        }),
    }
}

/// The `ml_dtypes` name of a type numpy lacks.
fn ml_dtypes_name(d: DType) -> &'static str {
    match d {
        DType::BF16 => "bfloat16",
        DType::F8E4M3FN => "float8_e4m3fn",
        DType::F8E4M3FNUZ => "float8_e4m3fnuz",
        DType::F8E5M2 => "float8_e5m2",
        DType::F8E5M2FNUZ => "float8_e5m2fnuz",
        DType::F4E2M1 => "float4_e2m1fn",
        DType::I4 => "int4",
        DType::U4 => "uint4",
        DType::I2 => "int2",
        _ => "uint2",
    }
}

/// numpy's name of one of its own types.
fn numpy_name(d: DType) -> &'static str {
    match d {
        DType::F16 => "float16",
        DType::F32 => "float32",
        DType::F64 => "float64",
        DType::I8 => "int8",
        DType::U8 => "uint8",
        DType::I16 => "int16",
        DType::U16 => "uint16",
        DType::I32 => "int32",
        DType::U32 => "uint32",
        DType::I64 => "int64",
        DType::U64 => "uint64",
        _ => "bool_",
    }
}

fn malformed(path: &str) -> impl Fn(std::io::Error) -> NpyError + '_ {
    move |e| NpyError::Malformed {
        path: path.to_string(),
        message: e.to_string(),
    }
}

/// Converts one parsed `.npy` array into the tensor `name` (of type
/// `want`, when known: see [`tensor_type`]).
fn tensor_from_npy<R: Read>(
    path: &str,
    name: &str,
    file: npyz::NpyFile<R>,
    want: Option<DType>,
) -> Result<Tensor, NpyError> {
    let malformed = malformed(path);
    if file.order() == npyz::Order::Fortran {
        return Err(NpyError::Malformed {
            path: path.to_string(),
            message: "Fortran-ordered arrays are not supported; save with np.ascontiguousarray"
                .into(),
        });
    }
    let descr = file.dtype();
    let elements = elements_of(path, &descr)?;
    let dtype = tensor_type(path, &format!("'{name}'"), &descr, elements, want)?;
    let shape = file.shape().to_vec();
    if Elements::Typed(dtype) != elements {
        // Raw bits of `dtype`, little-endian as every type Kiln holds.
        let data = match dtype.size_bytes() {
            1 => (file.into_vec::<Bits<1>>().map_err(malformed)?.iter())
                .flat_map(|b| b.0)
                .collect(),
            _ => (file.into_vec::<Bits<2>>().map_err(malformed)?.iter())
                .flat_map(|b| b.0)
                .collect(),
        };
        return Ok(Tensor {
            name: name.to_string(),
            dtype,
            shape,
            data,
        });
    }
    if dtype == DType::F16 {
        let values = file.into_vec::<half::f16>().map_err(malformed)?;
        return Ok(Tensor {
            name: name.to_string(),
            dtype,
            shape,
            data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        });
    }
    macro_rules! read_as {
        ($t:ty) => {
            Tensor::from_slice(name, &shape, &file.into_vec::<$t>().map_err(malformed)?)
        };
    }
    Ok(match dtype {
        DType::F32 => read_as!(f32),
        DType::F64 => read_as!(f64),
        DType::I8 => read_as!(i8),
        DType::U8 => read_as!(u8),
        DType::I16 => read_as!(i16),
        DType::I32 => read_as!(i32),
        DType::I64 => read_as!(i64),
        DType::U16 => read_as!(u16),
        DType::U32 => read_as!(u32),
        DType::U64 => read_as!(u64),
        DType::Bool => read_as!(bool),
        _ => unreachable!("elements_of types only the types above"),
    })
}

/// Reads an `.npy` file as the tensor named `name`, of the file's type
/// (see [`read_tensor_as`] for raw `ml_dtypes` elements).
pub fn read_tensor(name: &str, path: &Path) -> Result<Tensor, NpyError> {
    read_typed(name, path, None)
}

/// Reads an `.npy` file as the tensor named `name` of type `want` (an
/// input or output of a model): a file of another type is refused naming
/// both, and raw `ml_dtypes` elements of `want`'s size take it.
pub fn read_tensor_as(name: &str, path: &Path, want: DType) -> Result<Tensor, NpyError> {
    read_typed(name, path, Some(want))
}

fn read_typed(name: &str, path: &Path, want: Option<DType>) -> Result<Tensor, NpyError> {
    let p = path.display().to_string();
    let file = File::open(path).map_err(|source| NpyError::Io {
        path: p.clone(),
        source,
    })?;
    let npy = npyz::NpyFile::new(BufReader::new(file)).map_err(malformed(&p))?;
    tensor_from_npy(&p, name, npy, want)
}

/// Reads an `.npy` file as a compiler-side tensor (for values fixed at
/// compile time, `--bind-input`).
pub fn read_ir_tensor(path: &Path) -> Result<kiln_ir::Tensor, NpyError> {
    to_ir_tensor(read_tensor("", path)?, path)
}

/// A tensor read from `path` as a compiler-side tensor.
pub fn to_ir_tensor(t: Tensor, path: &Path) -> Result<kiln_ir::Tensor, NpyError> {
    let malformed = |message: &str| NpyError::Malformed {
        path: path.display().to_string(),
        message: message.into(),
    };
    let data = kiln_ir::Data::from_le_bytes(t.dtype, &t.data)
        .ok_or_else(|| malformed("its data is not a whole number of elements"))?;
    let shape: Vec<usize> = t.shape.iter().map(|&d| d as usize).collect();
    kiln_ir::Tensor::new(&shape, data)
        .ok_or_else(|| malformed("its element count does not match its shape"))
}

/// Reads every array of an `.npz` file; array names are tensor names, and
/// `want` gives the type of the tensor of a name, when known (see
/// [`read_tensor`]).
pub fn read_npz(
    path: &Path,
    want: impl Fn(&str) -> Option<DType>,
) -> Result<Vec<Tensor>, NpyError> {
    let p = path.display().to_string();
    let io = |source| NpyError::Io {
        path: p.clone(),
        source,
    };
    let mut archive = npyz::npz::NpzArchive::open(path).map_err(io)?;
    let names: Vec<String> = archive.array_names().map(str::to_string).collect();
    let mut tensors = Vec::with_capacity(names.len());
    for name in names {
        let file = archive
            .by_name(&name)
            .map_err(io)?
            .ok_or_else(|| NpyError::Malformed {
                path: p.clone(),
                message: format!("array '{name}' listed but missing"),
            })?;
        let want = want(&name);
        tensors.push(tensor_from_npy(&p, &name, file, want)?);
    }
    Ok(tensors)
}

/// Replaces characters outside `[A-Za-z0-9_.-]` by `_` (output file names).
pub fn sanitize_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_.-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The dtype numpy gives raw `n`-byte elements (`|V2`).
fn raw_dtype(n: usize) -> npyz::DType {
    let ts: npyz::TypeStr = format!("|V{n}").parse().expect("a valid type string");
    npyz::DType::Plain(ts)
}

/// Runs `$write!(T, dtype, values)` with `$tensor`'s elements as a
/// `Vec<T>` of their Rust type and the `.npy` dtype to write them as
/// (`$p` names the file in errors).
macro_rules! with_values {
    ($tensor:expr, $p:expr, $write:ident) => {{
        let t: &Tensor = $tensor;
        let bad = || NpyError::Malformed {
            path: $p.clone(),
            message: "tensor bytes do not match its type".into(),
        };
        macro_rules! plain {
            ($t:ty) => {
                $write!(
                    $t,
                    <$t as npyz::AutoSerialize>::default_dtype(),
                    t.to_vec::<$t>().ok_or_else(bad)?
                )
            };
        }
        match t.dtype {
            DType::F16 => $write!(
                half::f16,
                <half::f16 as npyz::AutoSerialize>::default_dtype(),
                (t.data.chunks_exact(2))
                    .map(|c| half::f16::from_le_bytes([c[0], c[1]]))
                    .collect()
            ),
            d if needs_raw_bits(d) && d.size_bytes() == 2 => $write!(
                FixedSizeBytes<2>,
                raw_dtype(2),
                (t.data.chunks_exact(2))
                    .map(|c| FixedSizeBytes([c[0], c[1]]))
                    .collect()
            ),
            d if needs_raw_bits(d) => $write!(
                FixedSizeBytes<1>,
                raw_dtype(1),
                t.data.iter().map(|&b| FixedSizeBytes([b])).collect()
            ),
            DType::F32 => plain!(f32),
            DType::F64 => plain!(f64),
            DType::I8 => plain!(i8),
            DType::U8 => plain!(u8),
            DType::I16 => plain!(i16),
            DType::I32 => plain!(i32),
            DType::I64 => plain!(i64),
            DType::U16 => plain!(u16),
            DType::U32 => plain!(u32),
            DType::U64 => plain!(u64),
            DType::Bool => plain!(bool),
            other => {
                return Err(NpyError::UnsupportedType {
                    path: $p.clone(),
                    descr: other.to_string(),
                })
            }
        }
    }};
}

/// Writes `tensor` as an `.npy` file, all or nothing.
pub fn write_tensor(path: &Path, tensor: &Tensor) -> Result<(), NpyError> {
    let p = path.display().to_string();
    let io = |source| NpyError::Io {
        path: p.clone(),
        source,
    };
    write_atomically(path, io, |file| {
        let mut out = BufWriter::new(file);
        macro_rules! write_as {
            ($t:ty, $dtype:expr, $values:expr) => {{
                let values: Vec<$t> = $values;
                let mut w = npyz::WriteOptions::new()
                    .dtype($dtype)
                    .shape(&tensor.shape)
                    .writer(&mut out)
                    .begin_nd()
                    .map_err(io)?;
                w.extend(values).map_err(io)?;
                w.finish().map_err(io)?;
            }};
        }
        with_values!(tensor, p, write_as);
        out.flush().map_err(io)
    })
}

/// Writes `tensors` as one `.npz` archive, each array named as its tensor
/// (the layout `kiln compile --calibrate` reads, one file per sample), all
/// or nothing.
pub fn write_npz(path: &Path, tensors: &[Tensor]) -> Result<(), NpyError> {
    let p = path.display().to_string();
    let io = |source| NpyError::Io {
        path: p.clone(),
        source,
    };
    write_atomically(path, io, |file| {
        let mut npz = npyz::npz::NpzWriter::new(BufWriter::new(file));
        for tensor in tensors {
            macro_rules! write_as {
                ($t:ty, $dtype:expr, $values:expr) => {{
                    let values: Vec<$t> = $values;
                    let mut w = npz
                        .array::<$t>(&tensor.name, Default::default())
                        .map_err(io)?
                        .dtype($dtype)
                        .shape(&tensor.shape)
                        .begin_nd()
                        .map_err(io)?;
                    w.extend(values).map_err(io)?;
                    w.finish().map_err(io)?;
                }};
            }
            with_values!(tensor, p, write_as);
        }
        let mut out = (npz.zip_writer().finish()).map_err(|e| io(std::io::Error::other(e)))?;
        out.flush().map_err(io)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsigned_arrays_round_trip_with_their_numpy_types() {
        let dir = tempfile::tempdir().unwrap();
        let tensors = [
            Tensor::from_slice("a", &[2], &[0u16, u16::MAX]),
            Tensor::from_slice("b", &[3], &[1u32, 7, u32::MAX]),
            Tensor::from_slice("c", &[1, 2], &[1u64 << 63, u64::MAX]),
        ];
        for (t, descr) in tensors.iter().zip(["<u2", "<u4", "<u8"]) {
            let path = dir.path().join(format!("{}.npy", t.name));
            write_tensor(&path, t).unwrap();
            let header = std::fs::read(&path).unwrap();
            assert!(
                String::from_utf8_lossy(&header[..64]).contains(descr),
                "{descr}"
            );
            let back = read_tensor(&t.name, &path).unwrap();
            assert_eq!(&back, t);
        }
    }
}
