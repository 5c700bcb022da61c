//! The library's errors as Python exceptions, and the guard every entry point runs its work in:
//! the GIL released, and a panic (a bug) caught and raised as an exception, never unwound into
//! the interpreter.
//!
//! The exception classes live in `wgpu_flash_attn/_errors.py` rather than here: Python lets a
//! class derive from both our base and `ValueError`/`RuntimeError`, which `create_exception!`
//! (one base) cannot express, and users import them from the package either way.

use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use wgpu_flash_attn::Error;

/// Why a native call failed: the library's error, or one of this module's own checks.
#[derive(Debug)]
pub enum Failure {
    /// An error of the library, raised as the `_errors` class of its variant.
    Lib(Error),
    /// An argument this module refuses before the library sees it (a null or misaligned pointer).
    Value(String),
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::Lib(e)
    }
}

impl From<wgpu_flash_attn::cuda::cudarc::driver::DriverError> for Failure {
    fn from(e: wgpu_flash_attn::cuda::cudarc::driver::DriverError) -> Self {
        Failure::Lib(Error::Driver(e))
    }
}

pub type Outcome<T> = Result<T, Failure>;

/// The `_errors` class and the `kind` attribute of each library error: who must act on it
/// decides between `ValueError` (the caller's arguments) and `RuntimeError` (the device).
fn class_of(e: &Error) -> (&'static str, &'static str) {
    match e {
        Error::InvalidProblem(_) => ("InvalidProblemError", "InvalidProblem"),
        Error::InvalidChoice(_) => ("InvalidProblemError", "InvalidChoice"),
        Error::UnsupportedHeadDim { .. } => ("InvalidProblemError", "UnsupportedHeadDim"),
        Error::InvalidBuffer { .. } => ("InvalidProblemError", "InvalidBuffer"),
        Error::DTypeMismatch { .. } => ("InvalidProblemError", "DTypeMismatch"),
        Error::TooLarge(_) => ("TooLargeError", "TooLarge"),
        Error::Unavailable { .. } => ("UnavailableError", "Unavailable"),
        Error::NoAdapter(_) => ("UnavailableError", "NoAdapter"),
        Error::RequestDevice(_) => ("UnavailableError", "RequestDevice"),
        Error::Shader { .. } => ("DeviceError", "Shader"),
        Error::Device(_) => ("DeviceError", "Device"),
        Error::ReadBack(_) => ("DeviceError", "ReadBack"),
        Error::Nvrtc { .. } => ("DeviceError", "Nvrtc"),
        Error::Driver(_) => ("DeviceError", "Driver"),
    }
}

/// A Python exception for `failure`, with the library's message unchanged.
pub fn to_pyerr(py: Python<'_>, failure: Failure) -> PyErr {
    match failure {
        Failure::Value(message) => PyValueError::new_err(message),
        Failure::Lib(e) => {
            let (class, kind) = class_of(&e);
            let message = e.to_string();
            let raised = py
                .import("wgpu_flash_attn._errors")
                .and_then(|m| m.getattr(class))
                .and_then(|cls| cls.call1((message.clone(), kind)));
            match raised {
                Ok(instance) => PyErr::from_value(instance),
                // The package's own module is missing (a broken install): still our message.
                Err(_) => PyRuntimeError::new_err(message),
            }
        }
    }
}

/// Runs `work` with the GIL released (the GPU work takes milliseconds to minutes, and other
/// Python threads should run meanwhile), catching a panic as an `InternalError`.
pub fn detached<T, F>(py: Python<'_>, work: F) -> PyResult<T>
where
    F: FnOnce() -> Outcome<T> + Send,
    T: Send,
{
    let result = py.detach(|| catch_unwind(AssertUnwindSafe(work)));
    match result {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(failure)) => Err(to_pyerr(py, failure)),
        Err(payload) => Err(internal_error(py, payload)),
    }
}

/// The exception for a panic: a bug in the library or these bindings, reported with its message
/// instead of crossing into the interpreter.
fn internal_error(py: Python<'_>, payload: Box<dyn std::any::Any + Send>) -> PyErr {
    let what = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into());
    let message = format!("internal error in wgpu-flash-attn (a bug; please report it): {what}");
    let raised = py
        .import("wgpu_flash_attn._errors")
        .and_then(|m| m.getattr("InternalError"))
        .and_then(|cls| cls.call1((message.clone(), "Internal")));
    match raised {
        Ok(instance) => PyErr::from_value(instance),
        Err(_) => PyRuntimeError::new_err(message),
    }
}

/// The element type named by `dtype` (`"float32"`, `"float16"`, `"bfloat16"`).
pub fn parse_dtype(dtype: &str) -> PyResult<wgpu_flash_attn::DType> {
    use wgpu_flash_attn::DType;
    match dtype {
        "float32" => Ok(DType::F32),
        "float16" => Ok(DType::F16),
        "bfloat16" => Ok(DType::BF16),
        other => Err(PyTypeError::new_err(format!(
            "dtype {other} is not supported: use float32, float16 or bfloat16"
        ))),
    }
}
