//! The pyo3 boundary: a thin shim that parses arguments and calls the Rust entry points.
use pyo3::prelude::*;

#[pymodule]
fn _router(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
