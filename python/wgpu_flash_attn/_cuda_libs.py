"""Finding NVRTC for the CUDA route.

The library loads ``libnvrtc`` by name at run time (nothing CUDA is linked into the wheel), so the
dynamic loader must find it. Processes started without the toolkit's lib directory on
``LD_LIBRARY_PATH`` often still have NVRTC on disk: in the ``nvidia-cuda-nvrtc`` wheel PyTorch
installs, or under ``/usr/local/cuda``. Loading that file once with ``RTLD_GLOBAL`` makes the
library's later load by soname find it.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
from typing import List

from . import _native

_tried = False


def _candidates() -> List[str]:
    found: List[str] = []
    explicit = os.environ.get("WGPU_FLASH_ATTN_NVRTC")
    if explicit:
        found.append(explicit)
    roots = [p for p in sys.path if p and os.path.isdir(os.path.join(p, "nvidia"))]
    for root in roots:
        found += glob.glob(os.path.join(root, "nvidia", "*", "lib", "libnvrtc.so*"))
        found += glob.glob(os.path.join(root, "nvidia", "*", "*", "lib", "libnvrtc.so*"))
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            found += glob.glob(os.path.join(home, "lib64", "libnvrtc.so*"))
            found += glob.glob(os.path.join(home, "targets", "*", "lib", "libnvrtc.so*"))
    # Newest first: "libnvrtc.so.13" sorts after "libnvrtc.so.12".
    return [explicit] * bool(explicit) + sorted(set(found) - {explicit}, reverse=True)


def ensure_nvrtc() -> None:
    """Makes NVRTC loadable if it is on disk but not on the loader's path (once per process).

    Does nothing when NVRTC already loads; when nothing is found the library's own error (with
    its advice about ``LD_LIBRARY_PATH``) is what the first CUDA call raises.
    """
    global _tried
    if _tried:
        return
    _tried = True
    if _native.cuda_libraries()[1]:
        return
    for path in _candidates():
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            continue
        if _native.cuda_libraries()[1]:
            return
