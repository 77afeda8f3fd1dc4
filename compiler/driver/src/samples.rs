//! Input samples from `.npz` files, one array per model input: what
//! calibration (`--calibrate DIR`) and the golden self-test (`--golden`)
//! read.

use std::path::{Path, PathBuf};

use kiln_ir::Graph;

use crate::error::DriverError;

/// The `.npz` files in `dir`, in name order.
pub(crate) fn npz_files(dir: &Path) -> Result<Vec<PathBuf>, DriverError> {
    let entries = std::fs::read_dir(dir).map_err(|source| DriverError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "npz"))
        .collect();
    files.sort();
    Ok(files)
}

/// One sample or golden set: the `.npz` file `file` with one array per
/// input of `graph`, named as the input, of its exact dtype and shape, all
/// values finite; otherwise the reason, naming the array.
pub(crate) fn read_sample(file: &Path, graph: &Graph) -> Result<Vec<kiln_ir::Tensor>, String> {
    let inputs: Vec<&kiln_ir::Node> = graph.inputs().iter().map(|&i| graph.node(i)).collect();
    let names: Vec<&str> = inputs.iter().map(|n| n.name.as_str()).collect();
    // Raw (ml_dtypes) arrays read as the input they feed.
    let want = |name: &str| {
        let input = inputs.iter().find(|n| n.name == name)?;
        Some(input.ty.dtype)
    };
    let arrays = crate::npy::read_npz(file, want).map_err(|e| e.to_string())?;
    if let Some(extra) = arrays.iter().find(|a| !names.contains(&a.name.as_str())) {
        return Err(format!(
            "array '{}' is not a model input (inputs: {})",
            extra.name,
            names.join(", ")
        ));
    }
    let mut sample = Vec::with_capacity(inputs.len());
    for input in &inputs {
        let array = arrays
            .iter()
            .find(|a| a.name == input.name)
            .ok_or_else(|| format!("no array for input '{}'", input.name))?;
        let t = crate::npy::to_ir_tensor(array.clone(), file).map_err(|e| e.to_string())?;
        if t.dtype() != input.ty.dtype || t.shape() != &input.ty.shape {
            let given = kiln_ir::ValueType::new(t.dtype(), t.shape());
            return Err(format!(
                "array '{}' is {given}, the model input is {}",
                input.name, input.ty
            ));
        }
        if t.dtype().is_float() {
            if let Some(i) = t.to_f64_vec().iter().position(|v| !v.is_finite()) {
                return Err(format!(
                    "array '{}' has a non-finite value at flat index {i}",
                    input.name
                ));
            }
        }
        sample.push(t);
    }
    Ok(sample)
}
