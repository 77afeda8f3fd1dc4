//! Comparing outputs with reference tensors (`kiln run --check`, tests):
//! the runtime's comparison, the one the artifact's self-test uses too.

pub use kiln_runtime::compare::{compare, compare_data, Comparison};

/// A compiler-side tensor as the runtime's, named `name`.
pub fn to_runtime(name: &str, t: &kiln_ir::Tensor) -> kiln_runtime::Tensor {
    kiln_runtime::Tensor {
        name: name.to_owned(),
        dtype: t.dtype(),
        shape: t.shape().iter().map(|&d| d as u64).collect(),
        data: t.data().to_le_bytes(),
    }
}

/// A runtime tensor (or any bytes of a type and shape) as the compiler's,
/// `None` when the bytes do not fill the shape.
pub fn to_ir(dtype: kiln_ir::DType, shape: &[u64], data: &[u8]) -> Option<kiln_ir::Tensor> {
    let data = kiln_ir::Data::from_le_bytes(dtype, data)?;
    let shape: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
    kiln_ir::Tensor::new(&shape, data)
}
