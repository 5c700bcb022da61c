//! The one error type of the crate, grouped by who has to act on it.

/// Everything that can go wrong, from a bad argument to a missing GPU.
///
/// The library never panics on user input: every check on shapes, layouts, buffers and device
/// capabilities ends in one of these variants, with a message that names the tensor and the values
/// involved.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    // --- the caller's problem description or buffers ---
    /// The attention problem is inconsistent (shapes, strides, scale); the message names the
    /// tensor and the values.
    #[error("invalid attention problem: {0}")]
    InvalidProblem(String),

    /// A `KernelChoice` built from knobs that contradict each other
    /// (the knobs of both kernels, or one kernel's knobs with the other kernel asked for).
    #[error("contradictory kernel choice: {0}")]
    InvalidChoice(String),

    /// `head_dim` is outside what the kernels handle.
    #[error("head_dim {got} is not supported: it must be a multiple of 8 between 8 and {max}")]
    UnsupportedHeadDim {
        /// The problem's `head_dim`.
        got: usize,
        /// The largest supported, 256.
        max: usize,
    },

    /// A host slice or GPU buffer passed in is too small, misaligned or lacks a usage flag.
    #[error("tensor `{tensor}`: {message}")]
    InvalidBuffer {
        /// The tensor: `q`, `k`, `v`, `o`, `lse`, `d_o`, `dq`, `dk`, `dv`, `delta` (on CUDA also
        /// `tensor map`).
        tensor: &'static str,
        /// What is wrong, with the sizes or offsets involved.
        message: String,
    },

    /// The element type of a host slice does not match the problem's `dtype`.
    #[error("tensor `{tensor}` holds {got:?} elements but the problem says {expected:?}")]
    DTypeMismatch {
        /// The first tensor checked (`q`; all inputs share one element type).
        tensor: &'static str,
        /// The problem's `dtype`.
        expected: crate::dtype::DType,
        /// The element type of the slices passed.
        got: crate::dtype::DType,
    },

    // --- what this device can do ---
    /// The problem is larger than this device can bind or dispatch at once.
    #[error("too large for this device: {0}")]
    TooLarge(String),

    /// A requested kernel variant or feature is not offered by this adapter.
    #[error("{what} is not available on this device: {why}")]
    Unavailable {
        /// What was asked for: a kernel, a variant, a plan, a configuration.
        what: String,
        /// Why not; where selection tried several kernels or plans, each one's reason, joined
        /// with `; `.
        why: String,
    },

    /// No GPU adapter could be found (no driver, or no backend compiled in).
    #[error("no GPU adapter found{0}")]
    NoAdapter(String),

    /// The adapter refused to create a device.
    #[error("could not create a device: {0}")]
    RequestDevice(String),

    // --- the library's own shaders or the driver ---
    /// A shader or pipeline was rejected by wgpu or the driver. This is a bug in the library
    /// (every shader is validated in its tests) or in the driver, or, in a build with the
    /// developer lab (`--features lab`), its edit file's doing.
    #[error("shader `{name}` was rejected: {message}")]
    Shader {
        /// The kernel's name (the pipeline label).
        name: String,
        /// wgpu's or the driver's message.
        message: String,
    },

    /// The device reported an error outside any check of the library's (out of memory, a driver
    /// failure) or was lost. Recorded on devices the library creates and returned by the next call
    /// on that context; a lost device stays lost.
    #[error("GPU device error: {0}")]
    Device(String),

    /// Reading results back from the GPU failed (device lost, out of memory), or the device did
    /// not finish within `Options::read_back_timeout`.
    #[error("GPU read-back failed: {0}")]
    ReadBack(String),

    /// NVRTC rejected a CUDA kernel (a bug in the library, or an NVRTC too old for its PTX); the
    /// log is the compiler's. In a build with the developer lab (`--features lab`), also an edit
    /// file that could not be read or parsed, with the reason as the log.
    #[cfg(feature = "cuda")]
    #[error("NVRTC failed for `{name}`:\n{log}")]
    Nvrtc {
        /// The kernel being compiled (its configuration's name).
        name: String,
        /// NVRTC's compile log.
        log: String,
    },

    /// A CUDA driver call failed (out of memory, launch failure, device lost).
    #[cfg(feature = "cuda")]
    #[error("CUDA driver call failed: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
}

/// `Result` with the crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Shorthand for `Err(Error::InvalidProblem(..))` with `format!` arguments.
macro_rules! invalid {
    ($($arg:tt)*) => {
        Err($crate::error::Error::InvalidProblem(format!($($arg)*)))
    };
}
pub(crate) use invalid;

/// An error and its sources, `: `-joined: wgpu's errors say only their kind ("Validation
/// Error") when displayed; what went wrong is in the sources.
pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut why = error.to_string();
    let mut source = error.source();
    while let Some(s) = source {
        why = format!("{why}: {s}");
        source = s.source();
    }
    why
}

/// Refuses the first tensor given fewer elements than its layout reaches: each entry is `(name,
/// elements held, elements needed)`. Host slices and device buffers alike.
pub(crate) fn check_holds(tensors: impl IntoIterator<Item = (&'static str, usize, usize)>) -> Result<()> {
    for (tensor, have, need) in tensors {
        if have < need {
            return Err(Error::InvalidBuffer {
                tensor,
                message: format!("holds {have} elements, the problem's layout needs {need}"),
            });
        }
    }
    Ok(())
}

/// A host output of `len` elements, each `zero`, for tensor `name`, or [`Error::TooLarge`] where
/// the host cannot hold it: a layout's strides, not its data, set a split call's output size
/// (a sparse O can span gigabytes), and the float64 reference's outputs take 8 bytes an element;
/// a failed allocation aborts the process, which no caller can handle (found by
/// tests/campaign.rs: a 51 GB O aborted a run). Where the kernel overcommits memory the
/// reservation itself succeeds and filling it is what fails (the out-of-memory killer ends the
/// process: a 275 GB O on a 128 GB machine), so an output past the host's memory and swap is
/// refused before it is reserved.
pub(crate) fn host_output<T: Clone>(name: &'static str, len: usize, zero: T) -> Result<Vec<T>> {
    let too_large = || {
        Error::TooLarge(format!(
            "tensor `{name}`: {len} elements of output do not fit in the host's memory"
        ))
    };
    let bytes = (len as u64).saturating_mul(std::mem::size_of::<T>() as u64);
    if host_memory_bytes().is_some_and(|total| bytes > total) {
        return Err(too_large());
    }
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| too_large())?;
    v.resize(len, zero);
    Ok(v)
}

/// The host's memory and swap in bytes, where the platform says (Linux: `/proc/meminfo`).
pub(crate) fn host_memory_bytes() -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        static TOTAL: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
        *TOTAL.get_or_init(|| {
            std::fs::read_to_string("/proc/meminfo")
                .ok()
                .and_then(|t| meminfo_bytes(&t))
        })
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

/// `MemTotal` plus `SwapTotal` of a `/proc/meminfo` text, in bytes.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn meminfo_bytes(meminfo: &str) -> Option<u64> {
    let kib = |key: &str| {
        meminfo.lines().find_map(|line| {
            let rest = line.strip_prefix(key)?.strip_prefix(':')?;
            rest.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()
        })
    };
    Some(
        kib("MemTotal")?
            .saturating_add(kib("SwapTotal").unwrap_or(0))
            .saturating_mul(1024),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_memory_is_read_from_meminfo() {
        let text = "MemTotal:       131072000 kB\nMemFree:        1000 kB\nSwapTotal:       2048 kB\n";
        assert_eq!(meminfo_bytes(text), Some((131_072_000 + 2048) * 1024));
        assert_eq!(meminfo_bytes("SwapTotal: 5 kB\n"), None);
        assert_eq!(meminfo_bytes("MemTotal: lots\n"), None);
    }

    #[test]
    fn outputs_past_the_host_memory_are_refused_before_reserving() {
        if let Some(total) = host_memory_bytes() {
            let len = usize::try_from(total / 4 + 1).unwrap_or(usize::MAX);
            let e = host_output("o", len, 0.0f32).unwrap_err();
            assert!(matches!(e, Error::TooLarge(ref m) if m.contains("`o`")), "{e}");
        }
        assert_eq!(host_output("o", 3, 1.5f32).unwrap(), vec![1.5; 3]);
    }
}
