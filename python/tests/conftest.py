"""Shared pieces of the package's tests: seeded inputs, the GPU check, tolerances."""

from __future__ import annotations

import os

import numpy as np
import pytest

import wgpu_flash_attn

try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # bf16 NumPy cases skip without it
    BF16 = None

#: Relative L2 error bounds against the float64 reference (STYLE.md: f32 ~1e-5, 16-bit ~1e-2).
REL_L2 = {"float32": 2e-5, "float16": 2e-3, "bfloat16": 1e-2}


def dtype_of(name: str):
    if name == "bfloat16":
        if BF16 is None:
            pytest.skip("ml_dtypes is not installed: no bfloat16 NumPy arrays")
        return BF16
    return np.dtype(name)


def randn(seed: int, shape, dtype="float32") -> np.ndarray:
    """Seeded standard normals (never zeros), rounded to ``dtype``."""
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype_of(dtype))


@pytest.fixture(scope="session", autouse=True)
def gpu():
    """The wgpu adapter; the tests skip without one unless FLASH_REQUIRE_GPU=1 (CI's setting:
    lavapipe is installed there)."""
    try:
        return wgpu_flash_attn.wgpu_adapter()
    except wgpu_flash_attn.UnavailableError as e:
        if os.environ.get("FLASH_REQUIRE_GPU") == "1":
            pytest.fail(f"FLASH_REQUIRE_GPU=1 but wgpu found no adapter: {e}")
        pytest.skip(f"no wgpu adapter: {e}")


def assert_close(out, ref, dtype: str, what: str, seed) -> None:
    from reference import rel_l2

    err = rel_l2(out, ref)
    assert err <= REL_L2[dtype], f"{what} (seed {seed}, {dtype}): relative L2 error {err:.3e} > {REL_L2[dtype]:.0e}"


def assert_lse(lse, ref, what: str, seed) -> None:
    lse, ref = np.asarray(lse, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    assert lse.shape == ref.shape, f"{what}: LSE shape {lse.shape}, expected {ref.shape}"
    finite = np.isfinite(ref)
    assert np.array_equal(np.isfinite(lse), finite), f"{what} (seed {seed}): LSE -inf where the reference is not"
    assert np.all(lse[~finite] == -np.inf), f"{what} (seed {seed}): rows that see no key must have LSE -inf"
    if finite.any():
        err = np.abs(lse[finite] - ref[finite]).max()
        assert err <= 1e-4 * max(1.0, np.abs(ref[finite]).max()), f"{what} (seed {seed}): LSE off by {err:.3e}"
