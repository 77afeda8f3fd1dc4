//! Tensors passed to and returned from [`Model::run`](crate::Model::run).

use crate::format::{type_string, DType};

mod sealed {
    pub trait Sealed: Copy {
        fn write_le(self, out: &mut Vec<u8>);
        fn read_le(bytes: &[u8]) -> Self;
    }
}

/// A Rust element type with a [`DType`]; its in-memory layout has no
/// padding, and on little-endian machines its bytes are the tensor bytes.
pub trait Element: sealed::Sealed {
    /// The matching dtype.
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:ident),*) => {$(
        impl sealed::Sealed for $t {
            fn write_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn read_le(bytes: &[u8]) -> Self {
                <$t>::from_le_bytes(bytes.try_into().expect("element-sized chunk"))
            }
        }
        impl Element for $t {
            const DTYPE: DType = DType::$d;
        }
    )*};
}

element!(
    f32 => F32, f64 => F64, i8 => I8, u8 => U8, i16 => I16, i32 => I32, i64 => I64,
    u16 => U16, u32 => U32, u64 => U64
);

impl sealed::Sealed for bool {
    fn write_le(self, out: &mut Vec<u8>) {
        out.push(u8::from(self));
    }
    fn read_le(bytes: &[u8]) -> Self {
        bytes[0] != 0
    }
}

impl Element for bool {
    const DTYPE: DType = DType::Bool;
}

/// An owned tensor: dense, row-major, little-endian element bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    /// Input or output name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Dimensions (empty for a scalar).
    pub shape: Vec<u64>,
    /// Element bytes.
    pub data: Vec<u8>,
}

impl Tensor {
    /// A tensor of `T` elements. The element count is not checked here;
    /// [`Model::run`](crate::Model::run) checks it against the model.
    pub fn from_slice<T: Element>(name: impl Into<String>, shape: &[u64], values: &[T]) -> Tensor {
        let mut data = Vec::with_capacity(std::mem::size_of_val(values));
        for &v in values {
            v.write_le(&mut data);
        }
        Tensor {
            name: name.into(),
            dtype: T::DTYPE,
            shape: shape.to_vec(),
            data,
        }
    }

    /// An `f32` tensor.
    pub fn from_f32(name: impl Into<String>, shape: &[u64], values: &[f32]) -> Tensor {
        Tensor::from_slice(name, shape, values)
    }

    /// An `i64` tensor.
    pub fn from_i64(name: impl Into<String>, shape: &[u64], values: &[i64]) -> Tensor {
        Tensor::from_slice(name, shape, values)
    }

    /// The elements as `T`, or `None` if the dtype is not `T`'s or the data
    /// is not a whole number of elements.
    pub fn to_vec<T: Element>(&self) -> Option<Vec<T>> {
        let size = T::DTYPE.size_bytes();
        if self.dtype != T::DTYPE || !self.data.len().is_multiple_of(size) {
            return None;
        }
        Some(self.data.chunks_exact(size).map(T::read_le).collect())
    }

    /// The elements of an `f32` tensor.
    pub fn to_f32_vec(&self) -> Option<Vec<f32>> {
        self.to_vec()
    }

    /// The elements of an `i64` tensor.
    pub fn to_i64_vec(&self) -> Option<Vec<i64>> {
        self.to_vec()
    }

    /// The elements of an `i32` tensor.
    pub fn to_i32_vec(&self) -> Option<Vec<i32>> {
        self.to_vec()
    }

    /// A borrowed view, for [`Model::run`](crate::Model::run).
    pub fn view(&self) -> TensorRef<'_> {
        TensorRef {
            name: &self.name,
            dtype: self.dtype,
            shape: &self.shape,
            data: &self.data,
        }
    }

    /// The type as written in messages: `f32[1,3]`.
    pub fn type_string(&self) -> String {
        type_string(self.dtype, &self.shape)
    }
}

/// A borrowed input tensor: dense, row-major, little-endian element bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TensorRef<'a> {
    /// Input name.
    pub name: &'a str,
    /// Element type.
    pub dtype: DType,
    /// Dimensions (empty for a scalar).
    pub shape: &'a [u64],
    /// Element bytes.
    pub data: &'a [u8],
}

impl<'a> TensorRef<'a> {
    /// A view of raw element bytes.
    pub fn new(name: &'a str, dtype: DType, shape: &'a [u64], data: &'a [u8]) -> Self {
        TensorRef {
            name,
            dtype,
            shape,
            data,
        }
    }

    /// A view of `values` without copying (little-endian machines only, as
    /// is every machine Kiln generates code for).
    #[cfg(target_endian = "little")]
    pub fn from_slice<T: Element>(name: &'a str, shape: &'a [u64], values: &'a [T]) -> Self {
        // SAFETY: `Element` types are plain numbers or `bool` without padding;
        // any initialised value is a valid byte sequence of its size.
        let data = unsafe {
            std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values))
        };
        TensorRef::new(name, T::DTYPE, shape, data)
    }

    /// The type as written in messages: `f32[1,3]`.
    pub fn type_string(&self) -> String {
        type_string(self.dtype, self.shape)
    }
}

impl<'a> From<&'a Tensor> for TensorRef<'a> {
    fn from(t: &'a Tensor) -> Self {
        t.view()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32_round_trip() {
        let t = Tensor::from_f32("x", &[2], &[1.5, -2.0]);
        assert_eq!(t.data, [0, 0, 0xc0, 0x3f, 0, 0, 0, 0xc0]);
        assert_eq!(t.to_f32_vec(), Some(vec![1.5, -2.0]));
        assert_eq!(t.to_i32_vec(), None);
        assert_eq!(t.type_string(), "f32[2]");
        let values = [1.5f32, -2.0];
        assert_eq!(TensorRef::from_slice("x", &[2], &values), t.view());
    }

    #[test]
    fn bool_and_ints() {
        let t = Tensor::from_slice("b", &[3], &[true, false, true]);
        assert_eq!(t.data, [1, 0, 1]);
        assert_eq!(t.to_vec::<bool>(), Some(vec![true, false, true]));
        let t = Tensor::from_i64("i", &[], &[-1]);
        assert_eq!(t.to_i64_vec(), Some(vec![-1]));
        assert_eq!(t.type_string(), "i64[]");
    }
}
