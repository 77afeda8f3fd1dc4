//! `.npy` / `.npz` tensor files for `kiln run`, via the `npyz` crate.

use kiln_runtime::{DType, Tensor};
use npyz::{TypeChar, WriterBuilder};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read};
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
    #[error("{path}: unsupported .npy element type '{descr}' (supported: f4, f8, i1, u1, i2, i4, i8, b1, little-endian)")]
    UnsupportedType {
        /// The file.
        path: String,
        /// numpy's type string.
        descr: String,
    },
}

fn dtype_of(path: &str, descr: &npyz::DType) -> Result<DType, NpyError> {
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
    Ok(match (ts.type_char(), ts.size_field()) {
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
        _ => return Err(unsupported()),
    })
}

fn malformed(path: &str) -> impl Fn(std::io::Error) -> NpyError + '_ {
    move |e| NpyError::Malformed {
        path: path.to_string(),
        message: e.to_string(),
    }
}

/// Converts one parsed `.npy` array into a tensor.
fn tensor_from_npy<R: Read>(
    path: &str,
    name: &str,
    file: npyz::NpyFile<R>,
) -> Result<Tensor, NpyError> {
    let malformed = malformed(path);
    if file.order() == npyz::Order::Fortran {
        return Err(NpyError::Malformed {
            path: path.to_string(),
            message: "Fortran-ordered arrays are not supported; save with np.ascontiguousarray"
                .into(),
        });
    }
    let dtype = dtype_of(path, &file.dtype())?;
    let shape = file.shape().to_vec();
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
        _ => unreachable!("dtype_of returns only the types above"),
    })
}

/// Reads an `.npy` file as the tensor named `name`.
pub fn read_tensor(name: &str, path: &Path) -> Result<Tensor, NpyError> {
    let p = path.display().to_string();
    let file = File::open(path).map_err(|source| NpyError::Io {
        path: p.clone(),
        source,
    })?;
    let npy = npyz::NpyFile::new(BufReader::new(file)).map_err(malformed(&p))?;
    tensor_from_npy(&p, name, npy)
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
    let dtype = kiln_ir::DType::from_name(t.dtype.name())
        .ok_or_else(|| malformed("its element type has no compiler equivalent"))?;
    let data = kiln_ir::Data::from_le_bytes(dtype, &t.data)
        .ok_or_else(|| malformed("its data is not a whole number of elements"))?;
    let shape: Vec<usize> = t.shape.iter().map(|&d| d as usize).collect();
    kiln_ir::Tensor::new(&shape, data)
        .ok_or_else(|| malformed("its element count does not match its shape"))
}

/// Reads every array of an `.npz` file; array names are tensor names.
pub fn read_npz(path: &Path) -> Result<Vec<Tensor>, NpyError> {
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
        tensors.push(tensor_from_npy(&p, &name, file)?);
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

/// Runs `$write!(T, values)` with `$tensor`'s elements as a `Vec<T>` of
/// their Rust type (`$p` names the file in errors).
macro_rules! with_values {
    ($tensor:expr, $p:expr, $write:ident) => {{
        let t: &Tensor = $tensor;
        let bad = || NpyError::Malformed {
            path: $p.clone(),
            message: "tensor bytes do not match its type".into(),
        };
        match t.dtype {
            DType::F32 => $write!(f32, t.to_vec::<f32>().ok_or_else(bad)?),
            DType::F64 => $write!(f64, t.to_vec::<f64>().ok_or_else(bad)?),
            DType::I8 => $write!(i8, t.to_vec::<i8>().ok_or_else(bad)?),
            DType::U8 => $write!(u8, t.to_vec::<u8>().ok_or_else(bad)?),
            DType::I16 => $write!(i16, t.to_vec::<i16>().ok_or_else(bad)?),
            DType::I32 => $write!(i32, t.to_vec::<i32>().ok_or_else(bad)?),
            DType::I64 => $write!(i64, t.to_vec::<i64>().ok_or_else(bad)?),
            DType::U16 => $write!(u16, t.to_vec::<u16>().ok_or_else(bad)?),
            DType::U32 => $write!(u32, t.to_vec::<u32>().ok_or_else(bad)?),
            DType::U64 => $write!(u64, t.to_vec::<u64>().ok_or_else(bad)?),
            DType::Bool => $write!(bool, t.to_vec::<bool>().ok_or_else(bad)?),
            other => {
                return Err(NpyError::UnsupportedType {
                    path: $p.clone(),
                    descr: other.to_string(),
                })
            }
        }
    }};
}

/// Writes `tensor` as an `.npy` file.
pub fn write_tensor(path: &Path, tensor: &Tensor) -> Result<(), NpyError> {
    let p = path.display().to_string();
    let io = |source| NpyError::Io {
        path: p.clone(),
        source,
    };
    let file = File::create(path).map_err(io)?;
    let mut out = BufWriter::new(file);
    macro_rules! write_as {
        ($t:ty, $values:expr) => {{
            let values: Vec<$t> = $values;
            let mut w = npyz::WriteOptions::new()
                .default_dtype()
                .shape(&tensor.shape)
                .writer(&mut out)
                .begin_nd()
                .map_err(io)?;
            w.extend(values).map_err(io)?;
            w.finish().map_err(io)?;
        }};
    }
    with_values!(tensor, p, write_as);
    Ok(())
}

/// Writes `tensors` as one `.npz` archive, each array named as its tensor
/// (the layout `kiln compile --calibrate` reads, one file per sample).
pub fn write_npz(path: &Path, tensors: &[Tensor]) -> Result<(), NpyError> {
    let p = path.display().to_string();
    let io = |source| NpyError::Io {
        path: p.clone(),
        source,
    };
    let mut npz = npyz::npz::NpzWriter::create(path).map_err(io)?;
    for tensor in tensors {
        macro_rules! write_as {
            ($t:ty, $values:expr) => {{
                let values: Vec<$t> = $values;
                let mut w = npz
                    .array::<$t>(&tensor.name, Default::default())
                    .map_err(io)?
                    .default_dtype()
                    .shape(&tensor.shape)
                    .begin_nd()
                    .map_err(io)?;
                w.extend(values).map_err(io)?;
                w.finish().map_err(io)?;
            }};
        }
        with_values!(tensor, p, write_as);
    }
    npz.zip_writer()
        .finish()
        .map_err(|e| io(std::io::Error::other(e)))?;
    Ok(())
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
