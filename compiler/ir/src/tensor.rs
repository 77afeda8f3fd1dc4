//! Constant tensors: initializers, folded values and evaluator results.

use crate::{DType, Shape};
use half::{bf16, f16};
use std::fmt;
use std::sync::Arc;

/// Typed element storage of a [`Tensor`].
///
/// Typed rather than raw bytes so that the reference evaluator can match on
/// the element type once and then work on plain slices.
#[derive(Clone, Debug, PartialEq)]
#[allow(missing_docs)]
pub enum Data {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    F64(Vec<f64>),
    I8(Vec<i8>),
    U8(Vec<u8>),
    I16(Vec<i16>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    Bool(Vec<bool>),
    U16(Vec<u16>),
    U32(Vec<u32>),
    U64(Vec<u64>),
    /// A narrow type's codes, one per byte ([`crate::narrow`]); the type
    /// is one for which [`DType::is_narrow`] holds.
    Narrow(DType, Vec<u8>),
}

/// Applies `$body` to the vector inside a [`Data`], whatever its type.
#[macro_export]
macro_rules! with_data {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            $crate::Data::F32($v) => $body,
            $crate::Data::F16($v) => $body,
            $crate::Data::BF16($v) => $body,
            $crate::Data::F64($v) => $body,
            $crate::Data::I8($v) => $body,
            $crate::Data::U8($v) => $body,
            $crate::Data::I16($v) => $body,
            $crate::Data::I32($v) => $body,
            $crate::Data::I64($v) => $body,
            $crate::Data::Bool($v) => $body,
            $crate::Data::U16($v) => $body,
            $crate::Data::U32($v) => $body,
            $crate::Data::U64($v) => $body,
            $crate::Data::Narrow(_, $v) => $body,
        }
    };
}

impl Data {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            Data::F32(_) => DType::F32,
            Data::F16(_) => DType::F16,
            Data::BF16(_) => DType::BF16,
            Data::F64(_) => DType::F64,
            Data::I8(_) => DType::I8,
            Data::U8(_) => DType::U8,
            Data::I16(_) => DType::I16,
            Data::I32(_) => DType::I32,
            Data::I64(_) => DType::I64,
            Data::Bool(_) => DType::Bool,
            Data::U16(_) => DType::U16,
            Data::U32(_) => DType::U32,
            Data::U64(_) => DType::U64,
            Data::Narrow(d, _) => *d,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        with_data!(self, v => v.len())
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A vector of `len` zeros of type `dtype`.
    pub fn zeros(dtype: DType, len: usize) -> Data {
        match dtype {
            DType::F32 => Data::F32(vec![0.0; len]),
            DType::F16 => Data::F16(vec![f16::ZERO; len]),
            DType::BF16 => Data::BF16(vec![bf16::ZERO; len]),
            DType::F64 => Data::F64(vec![0.0; len]),
            DType::I8 => Data::I8(vec![0; len]),
            DType::U8 => Data::U8(vec![0; len]),
            DType::I16 => Data::I16(vec![0; len]),
            DType::I32 => Data::I32(vec![0; len]),
            DType::I64 => Data::I64(vec![0; len]),
            DType::Bool => Data::Bool(vec![false; len]),
            DType::U16 => Data::U16(vec![0; len]),
            DType::U32 => Data::U32(vec![0; len]),
            DType::U64 => Data::U64(vec![0; len]),
            d => Data::Narrow(d, vec![0; len]),
        }
    }

    /// Element `i` converted to f64 (bools as 0/1).
    pub fn get_f64(&self, i: usize) -> f64 {
        match self {
            Data::F32(v) => v[i] as f64,
            Data::F16(v) => v[i].to_f64(),
            Data::BF16(v) => v[i].to_f64(),
            Data::F64(v) => v[i],
            Data::I8(v) => v[i] as f64,
            Data::U8(v) => v[i] as f64,
            Data::I16(v) => v[i] as f64,
            Data::I32(v) => v[i] as f64,
            Data::I64(v) => v[i] as f64,
            Data::Bool(v) => v[i] as u8 as f64,
            Data::U16(v) => v[i] as f64,
            Data::U32(v) => v[i] as f64,
            Data::U64(v) => v[i] as f64,
            Data::Narrow(d, v) => crate::narrow::decode(*d, v[i]) as f64,
        }
    }

    /// Element `i` converted to i64 (floats truncated toward zero, saturating;
    /// a `u64` above `i64::MAX` keeps its bits, so it wraps to a negative
    /// value: use [`Data::get_u64`] for unsigned semantics).
    pub fn get_i64(&self, i: usize) -> i64 {
        match self {
            Data::I8(v) => v[i] as i64,
            Data::U8(v) => v[i] as i64,
            Data::I16(v) => v[i] as i64,
            Data::I32(v) => v[i] as i64,
            Data::I64(v) => v[i],
            Data::Bool(v) => v[i] as i64,
            Data::U16(v) => v[i] as i64,
            Data::U32(v) => v[i] as i64,
            Data::U64(v) => v[i] as i64,
            Data::Narrow(d, v) => crate::narrow::decode_int(*d, v[i]),
            _ => self.get_f64(i) as i64,
        }
    }

    /// Element `i` as u64: unsigned types exactly, signed integers and bools
    /// by their two's-complement bits (as [`Data::get_i64`] then `as u64`),
    /// floats truncated toward zero and saturating to `0..=u64::MAX`.
    pub fn get_u64(&self, i: usize) -> u64 {
        match self {
            Data::U64(v) => v[i],
            d if d.dtype().is_float() => d.get_f64(i) as u64,
            d => d.get_i64(i) as u64,
        }
    }

    /// Builds a vector of type `dtype` from f64 values (ONNX Cast semantics:
    /// float to int truncates toward zero, saturating; to bool is `!= 0`).
    pub fn from_f64s(dtype: DType, values: impl Iterator<Item = f64>) -> Data {
        match dtype {
            DType::F32 => Data::F32(values.map(|x| x as f32).collect()),
            DType::F16 => Data::F16(values.map(f16::from_f64).collect()),
            DType::BF16 => Data::BF16(values.map(bf16::from_f64).collect()),
            DType::F64 => Data::F64(values.collect()),
            DType::I8 => Data::I8(values.map(|x| x as i8).collect()),
            DType::U8 => Data::U8(values.map(|x| x as u8).collect()),
            DType::I16 => Data::I16(values.map(|x| x as i16).collect()),
            DType::I32 => Data::I32(values.map(|x| x as i32).collect()),
            DType::I64 => Data::I64(values.map(|x| x as i64).collect()),
            DType::Bool => Data::Bool(values.map(|x| x != 0.0).collect()),
            DType::U16 => Data::U16(values.map(|x| x as u16).collect()),
            DType::U32 => Data::U32(values.map(|x| x as u32).collect()),
            DType::U64 => Data::U64(values.map(|x| x as u64).collect()),
            d => Data::Narrow(
                d,
                values.map(|x| crate::narrow::encode(d, x as f32)).collect(),
            ),
        }
    }

    /// Builds a vector of type `dtype` from i64 values (wrapping for narrow
    /// integer types, like a two's-complement cast).
    pub fn from_i64s(dtype: DType, values: impl Iterator<Item = i64>) -> Data {
        match dtype {
            DType::I8 => Data::I8(values.map(|x| x as i8).collect()),
            DType::U8 => Data::U8(values.map(|x| x as u8).collect()),
            DType::I16 => Data::I16(values.map(|x| x as i16).collect()),
            DType::I32 => Data::I32(values.map(|x| x as i32).collect()),
            DType::I64 => Data::I64(values.collect()),
            DType::Bool => Data::Bool(values.map(|x| x != 0).collect()),
            DType::U16 => Data::U16(values.map(|x| x as u16).collect()),
            DType::U32 => Data::U32(values.map(|x| x as u32).collect()),
            DType::U64 => Data::U64(values.map(|x| x as u64).collect()),
            d if d.is_narrow() => {
                Data::Narrow(d, values.map(|x| crate::narrow::encode_int(d, x)).collect())
            }
            _ => Data::from_f64s(dtype, values.map(|x| x as f64)),
        }
    }

    /// Converts to another element type (ONNX Cast semantics).
    pub fn cast(&self, to: DType) -> Data {
        if self.dtype() == to {
            return self.clone();
        }
        // half's f64 → bf16/f16 conversion drops the low mantissa bits
        // before rounding (wrong ties); from f32 it rounds to nearest even
        // exactly, as the kernels do.
        if let (Data::F32(v), DType::BF16) = (self, to) {
            return Data::BF16(v.iter().map(|&x| bf16::from_f32(x)).collect());
        }
        if let (Data::F32(v), DType::F16) = (self, to) {
            return Data::F16(v.iter().map(|&x| f16::from_f32(x)).collect());
        }
        // Integer to float goes through f64 too, so that a u64 above
        // i64::MAX converts by value, not by its bits. A narrow type
        // converts through its value (f32-exact) unless both sides are
        // integers.
        let float = |d: DType| d.is_float() || crate::narrow::is_narrow_float(d);
        if float(self.dtype()) || float(to) {
            Data::from_f64s(to, (0..self.len()).map(|i| self.get_f64(i)))
        } else {
            Data::from_i64s(to, (0..self.len()).map(|i| self.get_i64(i)))
        }
    }

    /// Little-endian bytes of the elements (bools as one byte 0/1).
    pub fn to_le_bytes(&self) -> Vec<u8> {
        match self {
            Data::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Data::F16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Data::BF16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Data::F64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Data::I8(v) => v.iter().map(|x| *x as u8).collect(),
            Data::U8(v) => v.clone(),
            Data::I16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Data::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Data::I64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Data::Bool(v) => v.iter().map(|x| *x as u8).collect(),
            Data::U16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Data::U32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Data::U64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Data::Narrow(_, v) => v.clone(),
        }
    }

    /// Decodes little-endian bytes; `None` when the length is not a multiple
    /// of the element size, or a narrow type's byte is not one of its codes.
    pub fn from_le_bytes(dtype: DType, bytes: &[u8]) -> Option<Data> {
        if !bytes.len().is_multiple_of(dtype.size_bytes()) {
            return None;
        }
        macro_rules! decode {
            ($t:ty, $n:expr) => {
                bytes
                    .chunks_exact($n)
                    .map(|c| <$t>::from_le_bytes(c.try_into().expect("exact chunk")))
                    .collect()
            };
        }
        Some(match dtype {
            DType::F32 => Data::F32(decode!(f32, 4)),
            DType::F16 => Data::F16(decode!(f16, 2)),
            DType::BF16 => Data::BF16(decode!(bf16, 2)),
            DType::F64 => Data::F64(decode!(f64, 8)),
            DType::I8 => Data::I8(bytes.iter().map(|b| *b as i8).collect()),
            DType::U8 => Data::U8(bytes.to_vec()),
            DType::I16 => Data::I16(decode!(i16, 2)),
            DType::I32 => Data::I32(decode!(i32, 4)),
            DType::I64 => Data::I64(decode!(i64, 8)),
            DType::Bool => Data::Bool(bytes.iter().map(|b| *b != 0).collect()),
            DType::U16 => Data::U16(decode!(u16, 2)),
            DType::U32 => Data::U32(decode!(u32, 4)),
            DType::U64 => Data::U64(decode!(u64, 8)),
            d => {
                let bits = crate::narrow::code_bits(d)?;
                if bytes.iter().any(|&b| (b as u32) >> bits != 0) {
                    return None;
                }
                Data::Narrow(d, bytes.to_vec())
            }
        })
    }
}

/// An immutable tensor with a static shape. Cloning is cheap (the elements
/// are shared), so large weights are referenced, not copied.
#[derive(Clone, PartialEq)]
pub struct Tensor {
    shape: Shape,
    data: Arc<Data>,
}

impl Tensor {
    /// Creates a tensor; `None` when the element count does not match the shape.
    pub fn new(shape: impl AsRef<[usize]>, data: Data) -> Option<Tensor> {
        let shape = Shape::from_slice(shape.as_ref());
        (shape.iter().product::<usize>() == data.len()).then(|| Tensor {
            shape,
            data: Arc::new(data),
        })
    }

    /// A rank-0 f32 tensor.
    pub fn scalar_f32(x: f32) -> Tensor {
        Tensor::new([], Data::F32(vec![x])).expect("scalar")
    }

    /// A rank-1 i64 tensor.
    pub fn vec_i64(values: Vec<i64>) -> Tensor {
        let n = values.len();
        Tensor::new([n], Data::I64(values)).expect("vector")
    }

    /// The shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }

    /// The elements.
    pub fn data(&self) -> &Data {
        &self.data
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Size in bytes.
    pub fn size_bytes(&self) -> usize {
        self.len() * self.dtype().size_bytes()
    }

    /// The same elements under another shape with the same element count.
    pub fn reshaped(&self, shape: impl AsRef<[usize]>) -> Option<Tensor> {
        let shape = Shape::from_slice(shape.as_ref());
        (shape.iter().product::<usize>() == self.len()).then(|| Tensor {
            shape,
            data: self.data.clone(),
        })
    }

    /// All elements as i64 (for shape-like tensors).
    pub fn to_i64_vec(&self) -> Vec<i64> {
        (0..self.len()).map(|i| self.data.get_i64(i)).collect()
    }

    /// All elements as f64.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        (0..self.len()).map(|i| self.data.get_f64(i)).collect()
    }

    /// All elements as f32.
    pub fn to_f32_vec(&self) -> Vec<f32> {
        match self.data() {
            Data::F32(v) => v.clone(),
            d => (0..d.len()).map(|i| d.get_f64(i) as f32).collect(),
        }
    }

    /// Converts to another element type (ONNX Cast semantics).
    pub fn cast(&self, to: DType) -> Tensor {
        Tensor {
            shape: self.shape.clone(),
            data: Arc::new(self.data.cast(to)),
        }
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tensor({}{:?}", self.dtype(), self.shape.as_slice())?;
        if self.len() <= 8 {
            write!(f, " {:?}", self.to_f64_vec())?;
        }
        write!(f, ")")
    }
}
