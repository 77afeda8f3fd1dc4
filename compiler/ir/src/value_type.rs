//! The static type of an IR value.

use crate::{DType, Shape};
use std::fmt;

/// The static type of a value: element type and concrete shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ValueType {
    /// Element type.
    pub dtype: DType,
    /// Concrete shape (symbolic dims are bound by the frontend).
    pub shape: Shape,
}

impl ValueType {
    /// Creates a value type.
    pub fn new(dtype: DType, shape: impl AsRef<[usize]>) -> ValueType {
        ValueType {
            dtype,
            shape: Shape::from_slice(shape.as_ref()),
        }
    }

    /// Number of elements.
    pub fn num_elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// Size in bytes, or `None` when it does not fit in an `isize`.
    pub fn checked_size_bytes(&self) -> Option<usize> {
        self.shape
            .iter()
            .try_fold(self.dtype.size_bytes(), |acc, &d| acc.checked_mul(d))
            .filter(|&b| b <= isize::MAX as usize)
    }

    /// Size in bytes.
    pub fn size_bytes(&self) -> usize {
        self.num_elements() * self.dtype.size_bytes()
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype)?;
        for (i, d) in self.shape.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}
