//! ONNX element types and `TensorProto` decoding (inline and external data).

use crate::external::ExternalData;
use crate::OnnxError;
use half::{bf16, f16};
use kiln_ir::{DType, Data, Tensor};
use tract_onnx::pb::{tensor_proto::DataType, TensorProto};

/// The ONNX name of an element type code (`FLOAT`, `STRING`...).
pub fn onnx_dtype_name(code: i32) -> String {
    match (code, DataType::try_from(code)) {
        (24, _) => "FLOAT8E8M0".into(),
        (25, _) => "UINT2".into(),
        (26, _) => "INT2".into(),
        (27, _) => "FLOAT6E2M3".into(),
        (28, _) => "FLOAT6E3M2".into(),
        (_, Ok(t)) => t.as_str_name().to_string(),
        (_, Err(_)) => format!("type code {code}"),
    }
}

/// Elements per byte in ONNX's serialized form: 2 for the 4-bit types,
/// 4 for the 2-bit ones (packed from the low bits up), 1 otherwise. Kiln
/// holds one element per byte.
fn packing(dtype: DType) -> u64 {
    match kiln_ir::narrow::code_bits(dtype) {
        Some(4) => 2,
        Some(2) => 4,
        _ => 1,
    }
}

/// Bytes that `count` elements of `dtype` take serialized.
fn serialized_bytes(dtype: DType, count: u64) -> Option<u64> {
    let per = packing(dtype);
    if per > 1 {
        return Some(count.div_ceil(per));
    }
    count.checked_mul(dtype.size_bytes() as u64)
}

/// Kiln's data from serialized bytes: packed elements spread one per byte.
fn data_from_serialized(dtype: DType, bytes: &[u8], count: usize) -> Option<Data> {
    let per = packing(dtype) as usize;
    if per == 1 {
        return Data::from_le_bytes(dtype, bytes);
    }
    if bytes.len() < count.div_ceil(per) {
        return None;
    }
    let bits = 8 / per;
    let mask = (1u8 << bits) - 1;
    let codes = (0..count)
        .map(|i| (bytes[i / per] >> (bits * (i % per))) & mask)
        .collect::<Vec<u8>>();
    Data::from_le_bytes(dtype, &codes)
}

/// Maps an ONNX `TensorProto.DataType` code to a Kiln element type.
pub fn dtype_from_onnx(code: i32) -> Option<DType> {
    // Codes newer than the protobuf definitions tract ships.
    match code {
        17 => return Some(DType::F8E4M3FN),
        18 => return Some(DType::F8E4M3FNUZ),
        19 => return Some(DType::F8E5M2),
        20 => return Some(DType::F8E5M2FNUZ),
        21 => return Some(DType::U4),
        22 => return Some(DType::I4),
        23 => return Some(DType::F4E2M1),
        25 => return Some(DType::U2),
        26 => return Some(DType::I2),
        _ => {}
    }
    Some(match DataType::try_from(code).ok()? {
        DataType::Float => DType::F32,
        DataType::Uint8 => DType::U8,
        DataType::Int8 => DType::I8,
        DataType::Int16 => DType::I16,
        DataType::Uint16 => DType::U16,
        DataType::Uint32 => DType::U32,
        DataType::Uint64 => DType::U64,
        DataType::Int32 => DType::I32,
        DataType::Int64 => DType::I64,
        DataType::Bool => DType::Bool,
        DataType::Float16 => DType::F16,
        DataType::Double => DType::F64,
        DataType::Bfloat16 => DType::BF16,
        _ => return None,
    })
}

/// Maps an ONNX element type code to a Kiln type, or an `UnsupportedDType`
/// error naming `value`.
pub fn dtype_or_err(code: i32, value: &str) -> Result<DType, OnnxError> {
    dtype_from_onnx(code).ok_or_else(|| OnnxError::UnsupportedDType {
        value: value.to_string(),
        dtype: onnx_dtype_name(code),
    })
}

/// Parses an ONNX type name as written in opset 1-5 `Cast.to` (`FLOAT`).
pub fn dtype_from_onnx_name(name: &str) -> Option<DType> {
    let upper = name.to_ascii_uppercase();
    (0..=28)
        .find(|&c| onnx_dtype_name(c) == upper)
        .and_then(dtype_from_onnx)
}

/// The element count of `dims`, or `None` on a negative dim or overflow.
fn element_count(dims: &[i64]) -> Option<u64> {
    dims.iter().try_fold(1u64, |acc, &d| {
        u64::try_from(d).ok().and_then(|d| acc.checked_mul(d))
    })
}

/// The byte size a tensor proto declares through its dims and type
/// (saturating at `u64::MAX`); `None` for types Kiln does not support.
pub fn declared_bytes(t: &TensorProto) -> Option<u64> {
    let dtype = dtype_from_onnx(t.data_type)?;
    Some(
        element_count(&t.dims)
            .and_then(|n| serialized_bytes(dtype, n))
            .unwrap_or(u64::MAX),
    )
}

/// Decodes a `TensorProto` into a tensor.
///
/// `name` names it in errors. Sizes are checked before anything is
/// allocated: the declared size must not exceed `max_bytes` nor the data the
/// proto (or its external file) actually holds. External data is read
/// through `external` (see [`ExternalData`]).
pub fn tensor_from_proto(
    t: &TensorProto,
    name: &str,
    external: &ExternalData<'_>,
    max_bytes: u64,
) -> Result<Tensor, OnnxError> {
    let dtype = dtype_or_err(t.data_type, name)?;
    if t.dims.iter().any(|&d| d < 0) {
        return Err(OnnxError::InvalidTensor {
            tensor: name.to_string(),
            message: format!("negative dim in {:?}", t.dims),
        });
    }
    let too_large = |declared: u64, reason: String| OnnxError::TooLarge {
        tensor: name.to_string(),
        declared_bytes: declared,
        reason,
    };
    let count = element_count(&t.dims);
    let bytes = count.and_then(|n| serialized_bytes(dtype, n));
    let (count, bytes) = match (count, bytes) {
        (Some(c), Some(b)) if b <= max_bytes => (c, b),
        (_, b) => {
            return Err(too_large(
                b.unwrap_or(u64::MAX),
                format!("more than the limit of {max_bytes} bytes"),
            ))
        }
    };
    let count = usize::try_from(count).map_err(|_| too_large(bytes, "too many elements".into()))?;
    let shape: Vec<usize> = t.dims.iter().map(|&d| d as usize).collect();
    let invalid = |message: String| OnnxError::InvalidTensor {
        tensor: name.to_string(),
        message,
    };

    let data = if t.data_location == Some(1) {
        let raw = external.read(t, name, bytes)?;
        data_from_serialized(dtype, &raw, count)
            .ok_or_else(|| invalid("external data length".into()))?
    } else if !t.raw_data.is_empty() || count == 0 {
        let present = t.raw_data.len() as u64;
        if present < bytes {
            return Err(too_large(
                bytes,
                format!("only {present} bytes of raw data are present"),
            ));
        }
        if present > bytes {
            return Err(invalid(format!(
                "raw_data holds {present} bytes but dims {:?} of {} need {bytes}",
                t.dims, dtype
            )));
        }
        data_from_serialized(dtype, &t.raw_data, count)
            .ok_or_else(|| invalid("raw data length".into()))?
    } else {
        typed_data(t, dtype, count, name)?
    };
    Tensor::new(&shape, data).ok_or_else(|| invalid("element count does not match dims".into()))
}

/// Decodes the typed repeated fields (`float_data`, `int32_data`, ...).
fn typed_data(t: &TensorProto, dtype: DType, count: usize, name: &str) -> Result<Data, OnnxError> {
    let present = match dtype {
        DType::F32 => t.float_data.len(),
        DType::F64 => t.double_data.len(),
        DType::I64 => t.int64_data.len(),
        // ONNX keeps uint32 and uint64 in `uint64_data`, uint16 in `int32_data`.
        DType::U32 | DType::U64 => t.uint64_data.len(),
        // The 4- and 2-bit types: one packed byte per `int32_data` entry.
        d if packing(d) > 1 => {
            let packed = serialized_bytes(d, count as u64).unwrap_or(u64::MAX);
            if t.int32_data.len() as u64 == packed {
                let bytes: Vec<u8> = t.int32_data.iter().map(|&x| x as u8).collect();
                return data_from_serialized(d, &bytes, count).ok_or_else(|| {
                    OnnxError::InvalidTensor {
                        tensor: name.to_string(),
                        message: "int32_data holds values that are not codes of its type".into(),
                    }
                });
            }
            t.int32_data.len()
        }
        _ => t.int32_data.len(),
    };
    if present != count {
        let bytes = (count as u64).saturating_mul(dtype.size_bytes() as u64);
        if present < count {
            return Err(OnnxError::TooLarge {
                tensor: name.to_string(),
                declared_bytes: bytes,
                reason: format!("only {present} of its {count} elements are present"),
            });
        }
        return Err(OnnxError::InvalidTensor {
            tensor: name.to_string(),
            message: format!(
                "holds {present} elements but its dims {:?} need {count}",
                t.dims
            ),
        });
    }
    let i32s = &t.int32_data;
    Ok(match dtype {
        DType::F32 => Data::F32(t.float_data.clone()),
        DType::F64 => Data::F64(t.double_data.clone()),
        DType::I64 => Data::I64(t.int64_data.clone()),
        DType::I32 => Data::I32(i32s.clone()),
        DType::I16 => Data::I16(i32s.iter().map(|&x| x as i16).collect()),
        DType::I8 => Data::I8(i32s.iter().map(|&x| x as i8).collect()),
        DType::U8 => Data::U8(i32s.iter().map(|&x| x as u8).collect()),
        DType::U16 => Data::U16(i32s.iter().map(|&x| x as u16).collect()),
        DType::U32 => Data::U32(t.uint64_data.iter().map(|&x| x as u32).collect()),
        DType::U64 => Data::U64(t.uint64_data.clone()),
        DType::Bool => Data::Bool(i32s.iter().map(|&x| x != 0).collect()),
        DType::F16 => Data::F16(i32s.iter().map(|&x| f16::from_bits(x as u16)).collect()),
        DType::BF16 => Data::BF16(i32s.iter().map(|&x| bf16::from_bits(x as u16)).collect()),
        d => {
            let codes: Vec<u8> = i32s.iter().map(|&x| x as u8).collect();
            Data::from_le_bytes(d, &codes).ok_or_else(|| OnnxError::InvalidTensor {
                tensor: name.to_string(),
                message: format!("int32_data holds values that are not {d} codes"),
            })?
        }
    })
}
