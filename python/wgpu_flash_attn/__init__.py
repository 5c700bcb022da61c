"""wgpu-flash-attn: exact FlashAttention on any GPU, with FlashAttention's Python API.

>>> import numpy as np
>>> from wgpu_flash_attn import flash_attn_func
>>> q, k, v = (np.random.default_rng(i).standard_normal((2, 128, 8, 64), dtype=np.float32) for i in range(3))
>>> out = flash_attn_func(q, k, v, causal=True)  # (2, 128, 8, 64), on the best GPU wgpu finds
>>> out.shape
(2, 128, 8, 64)

NumPy arrays and CPU PyTorch tensors run on the wgpu engine (Vulkan, Metal, DX12; a CPU Vulkan
driver where there is no GPU); PyTorch CUDA tensors run on the CUDA kernels, in place on PyTorch's
current stream. See ``flash_attn_func``, ``flash_attn_varlen_func`` and
``flash_attn_with_kvcache`` (and the packed variants ``flash_attn_qkvpacked_func``,
``flash_attn_kvpacked_func`` and their ``varlen`` forms).
"""

from __future__ import annotations

from typing import Any, Dict

from . import _native
from ._errors import (
    DeviceError,
    FlashAttnError,
    InternalError,
    InvalidProblemError,
    TooLargeError,
    UnavailableError,
)
from ._interface import (
    dropout_mask,
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
)

__version__ = _native.LIBRARY_VERSION

__all__ = [
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_with_kvcache",
    "flash_attn_qkvpacked_func",
    "flash_attn_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
    "dropout_mask",
    "wgpu_adapter",
    "cuda_status",
    "FlashAttnError",
    "InvalidProblemError",
    "TooLargeError",
    "UnavailableError",
    "DeviceError",
    "InternalError",
]


def wgpu_adapter() -> Dict[str, str]:
    """The adapter the wgpu route runs on (``name``, ``backend``, ``device_type``, ``driver``).

    Creates the engine if no call has yet (seconds: the device is opened and probed). Raises
    ``UnavailableError`` when wgpu finds no adapter.
    """
    return dict(_native.wgpu_adapter())


def cuda_status() -> Dict[str, Any]:
    """Whether the CUDA route can run here: ``driver`` (libcuda loads) and ``nvrtc`` (libnvrtc
    loads, after looking for it beside PyTorch's and the toolkit's libraries)."""
    from ._cuda_libs import ensure_nvrtc

    ensure_nvrtc()
    driver, nvrtc = _native.cuda_libraries()
    return {"driver": driver, "nvrtc": nvrtc}
