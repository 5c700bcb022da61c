"""The exceptions the package raises for the library's errors.

Each carries the library's message unchanged and, in ``kind``, the Rust error variant it came from
(``"InvalidProblem"``, ``"UnsupportedHeadDim"``, ``"Unavailable"``, ...). Who has to act decides
the built-in base: the caller's arguments are ``ValueError``s, the device's limits and failures
``RuntimeError``s, so code written for FlashAttention's exceptions keeps working.
"""

from __future__ import annotations

__all__ = [
    "FlashAttnError",
    "InvalidProblemError",
    "TooLargeError",
    "UnavailableError",
    "DeviceError",
    "InternalError",
]


class FlashAttnError(Exception):
    """Base class of every error of wgpu-flash-attn."""

    def __init__(self, message: str, kind: str = "") -> None:
        super().__init__(message)
        #: The library's error variant, e.g. ``"InvalidProblem"``.
        self.kind = kind


class InvalidProblemError(FlashAttnError, ValueError):
    """Shapes, strides, dtypes, head_dim, scale or index tensors the library refuses."""


class TooLargeError(FlashAttnError, ValueError):
    """The problem is larger than the kernels' indexing or the device's bindings reach."""


class UnavailableError(FlashAttnError, RuntimeError):
    """No GPU adapter, no CUDA driver or NVRTC, or a kernel this device cannot run."""


class DeviceError(FlashAttnError, RuntimeError):
    """The device or driver failed: out of memory, a lost device, a rejected shader."""


class InternalError(FlashAttnError, RuntimeError):
    """A bug in wgpu-flash-attn (a panic caught at the boundary); please report it."""
