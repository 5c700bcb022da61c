"""NumPy arrays through the wgpu route against the float64 reference: every masking and shape the
library supports, packed batches, K/V caches, and the errors."""

from __future__ import annotations

import ast
import os

import numpy as np
import pytest
from conftest import REL_L2, assert_close, assert_lse, dtype_of, randn
from reference import applied_p, attention, rel_l2

import wgpu_flash_attn as fa
from wgpu_flash_attn import _native

# (name, batch, seq_q, seq_k, heads, kv_heads, head_dim, options)
CASES = [
    ("mha", 2, 37, 37, 4, 4, 64, {}),
    ("causal", 2, 37, 37, 4, 4, 64, {"causal": True}),
    ("causal_fewer_queries", 1, 17, 50, 4, 4, 32, {"causal": True}),
    ("causal_more_queries", 1, 50, 17, 2, 2, 32, {"causal": True}),  # first 33 rows see no key
    ("gqa", 2, 33, 45, 8, 2, 64, {}),
    ("mqa_causal", 1, 20, 20, 4, 1, 32, {"causal": True}),
    ("window", 2, 64, 64, 4, 4, 32, {"window_size": (8, 4)}),
    ("window_left_causal", 1, 64, 80, 4, 2, 32, {"causal": True, "window_size": (16, -1)}),
    ("softcap", 2, 40, 40, 4, 4, 64, {"softcap": 2.0, "softmax_scale": 0.5}),
    ("scale", 1, 16, 24, 2, 2, 32, {"softmax_scale": 0.3}),
    ("head_dim_20_padded", 1, 19, 23, 2, 2, 20, {"causal": True}),
    ("head_dim_128", 1, 33, 33, 2, 2, 128, {}),
]

# The 16-bit types on the cases that change what the kernels load.
SIXTEEN_BIT = {"mha", "causal", "gqa", "softcap"}


def run_case(name, batch, seq_q, seq_k, heads, heads_k, dim, opts, dtype, seed):
    q = randn(seed, (batch, seq_q, heads, dim), dtype)
    k = randn(seed + 1, (batch, seq_k, heads_k, dim), dtype)
    v = randn(seed + 2, (batch, seq_k, heads_k, dim), dtype)
    out, lse = fa.flash_attn_func(q, k, v, return_lse=True, **opts)
    ref_opts = {
        "causal": opts.get("causal", False),
        "window": opts.get("window_size", (-1, -1)),
        "softcap": opts.get("softcap", 0.0),
        "scale": opts.get("softmax_scale"),
    }
    ref_out, ref_lse = attention(q, k, v, **ref_opts)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (batch, heads, seq_q) and lse.dtype == np.float32
    assert_close(out, ref_out, dtype, name, seed)
    assert_lse(lse, ref_lse, name, seed)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_matches_reference_f32(case):
    run_case(*case, "float32", seed=10)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", [c for c in CASES if c[0] in SIXTEEN_BIT], ids=lambda c: c[0])
def test_matches_reference_16bit(case, dtype):
    run_case(*case, dtype, seed=20)


@pytest.mark.parametrize("causal", [False, True])
def test_alibi_matches_the_reference(causal):
    """ALiBi slopes, (nheads,) and FlashAttention's (batch, nheads) with equal rows, GQA, with a
    window and a soft-cap: against the float64 reference."""
    q = randn(30, (2, 19, 4, 32), "float32")
    k = randn(31, (2, 27, 2, 32), "float32")
    v = randn(32, (2, 27, 2, 32), "float32")
    slopes = np.array([0.5, 0.25, 0.125, 0.0625], np.float32)
    for given in (slopes, np.stack([slopes, slopes])):
        for opts in ({}, {"window_size": (5, 3), "softcap": 4.0}):
            out, lse = fa.flash_attn_func(q, k, v, causal=causal, alibi_slopes=given, return_lse=True, **opts)
            ref_out, ref_lse = attention(
                q,
                k,
                v,
                causal=causal,
                window=opts.get("window_size", (-1, -1)),
                softcap=opts.get("softcap", 0.0),
                alibi_slopes=slopes,
            )
            assert_close(out, ref_out, "float32", f"alibi {given.shape} {opts}", 30)
            assert_lse(lse, ref_lse, f"alibi {given.shape} {opts}", 30)
    # The bias matters: without it the result differs.
    plain = fa.flash_attn_func(q, k, v, causal=causal)
    assert not np.allclose(plain, out)


def test_rows_that_see_no_key_are_zero():
    q, k, v = (randn(s, (1, 9, 2, 32)) for s in (1, 2, 3))
    out, lse = fa.flash_attn_func(q, k[:, :3], v[:, :3], causal=True, return_lse=True)
    assert np.all(out[:, :6] == 0) and np.all(lse[:, :, :6] == -np.inf)
    assert np.all(np.isfinite(out[:, 6:]))


def test_non_contiguous_inputs():
    """Transposed, strided and packed views give what their contiguous copies give."""
    seed = 30
    bhsd = randn(seed, (2, 4, 29, 32))  # PyTorch's [batch, heads, seq, dim]
    q = bhsd.transpose(0, 2, 1, 3)
    wide = randn(seed + 1, (2, 58, 4, 32))
    k = wide[:, ::2]  # every other row
    qkv = randn(seed + 2, (2, 29, 3, 4, 32))
    v = qkv[:, :, 2]
    assert not (q.flags.c_contiguous or k.flags.c_contiguous or v.flags.c_contiguous)
    out = fa.flash_attn_func(q, k, v, causal=True)
    ref, _ = attention(q, k, v, causal=True)
    assert_close(out, ref, "float32", "non-contiguous", seed)


def test_packed_variants():
    seed = 35
    qkv = randn(seed, (2, 21, 3, 4, 32))
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    ref, _ = attention(q, k, v, causal=True)
    assert_close(fa.flash_attn_qkvpacked_func(qkv, causal=True), ref, "float32", "qkvpacked", seed)
    kv = qkv[:, :, 1:]
    assert_close(fa.flash_attn_kvpacked_func(q, kv, causal=True), ref, "float32", "kvpacked", seed)
    cu = np.array([0, 21, 42], np.int32)
    flat = qkv.reshape(42, 3, 4, 32)
    out = fa.flash_attn_varlen_qkvpacked_func(flat, cu, 21, causal=True)
    assert_close(out.reshape(2, 21, 4, 32), ref, "float32", "varlen qkvpacked", seed)
    out = fa.flash_attn_varlen_kvpacked_func(flat[:, 0], flat[:, 1:], cu, cu, 21, 21, causal=True)
    assert_close(out.reshape(2, 21, 4, 32), ref, "float32", "varlen kvpacked", seed)


def test_return_attn_probs_is_flash_attention_s_triple():
    q, k, v = (randn(s, (1, 8, 2, 32)) for s in (1, 2, 3))
    out, lse, s_dmask = fa.flash_attn_func(q, k, v, return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (1, 2, 8)
    assert s_dmask.shape == (0,) and s_dmask.dtype == q.dtype  # no dropout: nothing to return
    # deterministic is accepted (the backward always is); dropout_p=0.0 is FlashAttention's eval.
    again = fa.flash_attn_func(q, k, v, dropout_p=0.0, deterministic=True)
    assert np.array_equal(out, again)


def packed(lengths, heads, dim, seed, dtype="float32"):
    total = sum(lengths)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return randn(seed, (total, heads, dim), dtype), cu


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_ragged_sequences(causal):
    """Sequences of 5, 0, 33 and 17 queries over 7, 3, 40 and 17 keys, GQA 4:2: each one's
    result is that of attention over it alone."""
    seed = 40
    lq, lk = [5, 0, 33, 17], [7, 3, 40, 17]
    q, cu_q = packed(lq, 4, 32, seed)
    k, cu_k = packed(lk, 2, 32, seed + 1)
    v, _ = packed(lk, 2, 32, seed + 2)
    out, lse = fa.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max(lq), max(lk), causal=causal, window_size=(20, -1), return_lse=True
    )
    assert out.shape == q.shape and lse.shape == (4, q.shape[0])
    for b in range(len(lq)):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if lq[b] == 0:
            continue
        ref, ref_lse = attention(q[None, rows], k[None, keys], v[None, keys], causal=causal, window=(20, -1))
        assert_close(out[rows], ref[0], "float32", f"varlen sequence {b}", seed)
        assert_lse(lse[:, rows], ref_lse[0], f"varlen sequence {b}", seed)


# --- dropout ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("causal", [False, True])
def test_dropout_matches_the_reference_with_its_mask(dtype, causal):
    """O with dropout is the reference's with the mask ``dropout_mask`` returns; another seed's
    mask gives a reference the output is far from, and the LSE is the undropped softmax's."""
    seed, p, drop_seed = 60, 0.2, 123456789
    b, sq, sk, h, hk, d = 2, 37, 45, 4, 2, 64
    q = randn(seed, (b, sq, h, d), dtype)
    k = randn(seed + 1, (b, sk, hk, d), dtype)
    v = randn(seed + 2, (b, sk, hk, d), dtype)
    out, lse = fa.flash_attn_func(q, k, v, dropout_p=p, causal=causal, return_lse=True, dropout_seed=drop_seed)
    keep = fa.dropout_mask(p, drop_seed, b, h, sq, sk)
    assert keep.shape == (b, h, sq, sk) and keep.dtype == bool
    assert abs(keep.mean() - (1 - p)) < 0.02
    ref, ref_lse = attention(q, k, v, causal=causal, dropout=(applied_p(p), keep))
    assert_close(out, ref, dtype, "dropout", seed)
    assert_lse(lse, attention(q, k, v, causal=causal)[1], "dropout", seed)
    other = fa.dropout_mask(p, drop_seed + 1, b, h, sq, sk)
    wrong, _ = attention(q, k, v, causal=causal, dropout=(applied_p(p), other))
    assert rel_l2(out, wrong) > 100 * REL_L2[dtype], "another seed's mask fits as well: the bound proves nothing"


def test_dropout_seeds_decide_the_mask():
    q, k, v = (randn(70 + i, (1, 24, 2, 32)) for i in range(3))
    a = fa.flash_attn_func(q, k, v, dropout_p=0.3, dropout_seed=5)
    assert np.array_equal(a, fa.flash_attn_func(q, k, v, dropout_p=0.3, dropout_seed=5))
    assert not np.array_equal(a, fa.flash_attn_func(q, k, v, dropout_p=0.3, dropout_seed=6))
    # Without a seed, numpy.random's global state draws one: seeding it repeats the call.
    np.random.seed(11)
    first = fa.flash_attn_func(q, k, v, dropout_p=0.3)
    np.random.seed(11)
    assert np.array_equal(first, fa.flash_attn_func(q, k, v, dropout_p=0.3))
    assert not np.array_equal(first, fa.flash_attn_func(q, k, v, dropout_p=0.3))
    # dropout_p = 0 ignores the seed: the undropped result.
    assert np.array_equal(fa.flash_attn_func(q, k, v), fa.flash_attn_func(q, k, v, dropout_p=0.0, dropout_seed=5))


def test_varlen_dropout_masks_count_from_each_sequence():
    """Packed sequence ``b`` draws ``dropout_mask(...)[b]`` over its own rows and keys."""
    seed, p, drop_seed = 80, 0.25, 2**63 + 17
    lq, lk = [6, 1, 20], [9, 4, 20]
    q, cu_q = packed(lq, 4, 32, seed)
    k, cu_k = packed(lk, 2, 32, seed + 1)
    v, _ = packed(lk, 2, 32, seed + 2)
    out = fa.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max(lq), max(lk), dropout_p=p, causal=True, dropout_seed=drop_seed
    )
    keep = fa.dropout_mask(p, drop_seed, len(lq), 4, max(lq), max(lk))
    for b in range(len(lq)):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        mask = keep[b : b + 1, :, : lq[b], : lk[b]]
        ref, _ = attention(q[None, rows], k[None, keys], v[None, keys], causal=True, dropout=(applied_p(p), mask))
        assert_close(out[rows], ref[0], "float32", f"varlen dropout sequence {b}", seed)


def cache_case(seed, batch=3, cache_len=64, heads=4, heads_k=2, dim=32, seq_new=2, dtype="float32"):
    q = randn(seed, (batch, seq_new, heads, dim), dtype)
    k_cache = randn(seed + 1, (batch, cache_len, heads_k, dim), dtype)
    v_cache = randn(seed + 2, (batch, cache_len, heads_k, dim), dtype)
    k_new = randn(seed + 3, (batch, seq_new, heads_k, dim), dtype)
    v_new = randn(seed + 4, (batch, seq_new, heads_k, dim), dtype)
    return q, k_cache, v_cache, k_new, v_new


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_kvcache_contiguous_append_then_attend(dtype):
    seed = 50
    q, k_cache, v_cache, k_new, v_new = cache_case(seed, dtype=dtype)
    lens = np.array([10, 33, 0], dtype=np.int32)
    before = k_cache.copy()
    out, lse = fa.flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new, v_new, cache_seqlens=lens, causal=True, return_softmax_lse=True
    )
    for b, n in enumerate(lens):
        # The new tokens went into the caller's cache at n, n + 1; nothing else changed.
        assert np.array_equal(k_cache[b, n : n + 2], k_new[b]) and np.array_equal(v_cache[b, n : n + 2], v_new[b])
        assert np.array_equal(k_cache[b, :n], before[b, :n]) and np.array_equal(k_cache[b, n + 2 :], before[b, n + 2 :])
        keys = slice(0, n + 2)
        ref, ref_lse = attention(q[b : b + 1], k_cache[None, b, keys], v_cache[None, b, keys], causal=True)
        assert_close(out[b], ref[0], dtype, f"kvcache sequence {b}", seed)
        assert_lse(lse[b], ref_lse[0], f"kvcache sequence {b}", seed)


def test_kvcache_whole_cache_and_int_lengths():
    seed = 55
    q, k_cache, v_cache, _, _ = cache_case(seed, seq_new=1)
    out = fa.flash_attn_with_kvcache(q, k_cache, v_cache)  # every sequence: the whole cache
    ref, _ = attention(q, k_cache, v_cache)
    assert_close(out, ref, "float32", "whole cache", seed)
    out = fa.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=20, softcap=3.0, window_size=(8, -1))
    ref, _ = attention(q, k_cache[:, :20], v_cache[:, :20], softcap=3.0, window=(8, -1))
    assert_close(out, ref, "float32", "cache_seqlens=20", seed)


def test_kvcache_paged():
    """Pages of 16 tokens in a pool of 12, shuffled: each sequence's keys gathered through its
    row of the block table."""
    seed = 60
    batch, page, pool, per_seq, heads, heads_k, dim = 3, 16, 12, 4, 4, 2, 32
    rng = np.random.default_rng(seed)
    table = rng.permutation(pool)[: batch * per_seq].reshape(batch, per_seq).astype(np.int32)
    k_pool = randn(seed + 1, (pool, page, heads_k, dim))
    v_pool = randn(seed + 2, (pool, page, heads_k, dim))
    q = randn(seed + 3, (batch, 1, heads, dim))
    k_new, v_new = randn(seed + 4, (batch, 1, heads_k, dim)), randn(seed + 5, (batch, 1, heads_k, dim))
    lens = np.array([15, 40, 63], dtype=np.int32)  # the last append fills the last row of a page
    out, lse = fa.flash_attn_with_kvcache(
        q, k_pool, v_pool, k_new, v_new, cache_seqlens=lens, block_table=table, causal=True, return_softmax_lse=True
    )
    for b in range(batch):
        keys = np.concatenate([k_pool[p] for p in table[b]])[: lens[b] + 1]
        values = np.concatenate([v_pool[p] for p in table[b]])[: lens[b] + 1]
        assert np.array_equal(keys[-1], k_new[b, 0]) and np.array_equal(values[-1], v_new[b, 0])
        ref, ref_lse = attention(q[b : b + 1], keys[None], values[None], causal=True)
        assert_close(out[b], ref[0], "float32", f"paged sequence {b}", seed)
        assert_lse(lse[b], ref_lse[0], f"paged sequence {b}", seed)


def test_threads_share_the_engine():
    """Calls from several Python threads at once (the GIL is released during the GPU work) give
    what one thread gets."""
    from concurrent.futures import ThreadPoolExecutor

    inputs = [tuple(randn(70 + 3 * i + j, (1, 24, 4, 32)) for j in range(3)) for i in range(6)]
    alone = [fa.flash_attn_func(*x, causal=True) for x in inputs]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda x: fa.flash_attn_func(*x, causal=True), inputs))
    for a, b in zip(alone, together):
        assert np.array_equal(a, b)


# --- errors -------------------------------------------------------------------------------------

QKV = tuple(randn(s, (1, 8, 4, 32)) for s in (1, 2, 3))


def test_not_implemented_features_name_themselves():
    q, k, v = QKV
    with pytest.raises(NotImplementedError, match="alibi_slopes that differ"):
        two = np.concatenate([q, q])
        fa.flash_attn_func(two, two, two, alibi_slopes=np.array([[1, 2, 3, 4], [4, 3, 2, 1]], np.float32))
    with pytest.raises(NotImplementedError, match="block_table"):
        cu = np.array([0, 8], np.int32)
        fa.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 8, 8, block_table=np.zeros((1, 1), np.int32))
    with pytest.raises(NotImplementedError, match="rotary_cos"):
        fa.flash_attn_with_kvcache(q, k, v, rotary_cos=np.ones((8, 16), np.float32))
    # Refused before the append writes anything into the caches.
    k_cache, v_cache = k.copy(), v.copy()
    with pytest.raises(NotImplementedError, match="rotary_cos"):
        fa.flash_attn_with_kvcache(
            q[:, :1], k_cache, v_cache, k[:, :1], v[:, :1], cache_seqlens=3, rotary_cos=np.ones((8, 16), np.float32)
        )
    assert np.array_equal(k_cache, k) and np.array_equal(v_cache, v)


def test_library_errors_are_value_errors_with_its_message():
    q, k, v = QKV
    big = randn(4, (1, 8, 4, 264))
    with pytest.raises(fa.InvalidProblemError, match="head_dim 264") as e:
        fa.flash_attn_func(big, big, big)
    assert isinstance(e.value, ValueError) and isinstance(e.value, fa.FlashAttnError)
    assert e.value.kind == "UnsupportedHeadDim"
    k3 = randn(5, (1, 8, 3, 32))
    with pytest.raises(fa.InvalidProblemError, match=r"num_heads \(4\) must be a multiple of num_kv_heads \(3\)"):
        fa.flash_attn_func(q, k3, k3)
    with pytest.raises(fa.InvalidProblemError, match="not finite"):
        fa.flash_attn_func(q, k, v, softmax_scale=float("nan"))
    cu_bad = np.array([0, 5, 3], np.int32)
    with pytest.raises(fa.InvalidProblemError, match="decrease") as e:
        fa.flash_attn_varlen_func(q[0], k[0], v[0], cu_bad, cu_bad, 8, 8)
    assert e.value.kind == "InvalidBuffer"


def test_argument_errors():
    q, k, v = QKV
    with pytest.raises(ValueError, match="dtype float16 but q has float32"):
        fa.flash_attn_func(q, k.astype(np.float16), v)
    with pytest.raises(TypeError, match="float64"):
        fa.flash_attn_func(q.astype(np.float64), k, v)
    with pytest.raises(TypeError, match="NumPy array or a PyTorch tensor"):
        fa.flash_attn_func(q.tolist(), k, v)
    with pytest.raises(ValueError, match="4 dimensions"):
        fa.flash_attn_func(q[0], k, v)
    with pytest.raises(ValueError, match="window_size"):
        fa.flash_attn_func(q, k, v, window_size=(1, 2, 3))
    with pytest.raises(ValueError, match="dropout_p"):
        fa.flash_attn_func(q, k, v, dropout_p=1.5)
    with pytest.raises(ValueError, match="dropout_p"):
        fa.flash_attn_func(q, k, v, dropout_p=1.0)
    with pytest.raises(ValueError, match="dropout_seed"):
        fa.flash_attn_func(q, k, v, dropout_p=0.1, dropout_seed=-1)
    with pytest.raises(ValueError, match="dropout_seed"):
        fa.dropout_mask(0.1, 2**64, 1, 1, 4, 4)
    with pytest.raises(fa.InvalidProblemError, match="rounds to 1"):
        fa.flash_attn_func(q, k, v, dropout_p=1 - 2**-18)
    with pytest.raises(ValueError, match="more than the"):
        fa.dropout_mask(0.1, 1, 4096, 1024, 64, 64)  # 2^34 bytes
    with pytest.raises(ValueError, match="alibi_slopes has shape"):
        fa.flash_attn_func(q, k, v, alibi_slopes=np.ones(3, np.float32))
    cache = randn(6, (1, 16, 4, 32))
    with pytest.raises(ValueError, match="more than the cache's 16"):
        fa.flash_attn_with_kvcache(q[:, :1], cache, cache.copy(), k[:, :1], v[:, :1], cache_seqlens=16)
    with pytest.raises(ValueError, match="needs cache_seqlens"):
        fa.flash_attn_with_kvcache(q[:, :1], cache, cache.copy(), k[:, :1], v[:, :1])
    with pytest.raises(ValueError, match=r"\[0, 2\^31\)"):
        fa.flash_attn_with_kvcache(q[:, :1], cache, cache.copy(), cache_seqlens=np.array([-1], np.int32))


def test_cuda_route_without_a_driver_is_an_error_not_a_crash():
    driver, _ = _native.cuda_libraries()
    if driver:
        pytest.skip("this machine has a CUDA driver")
    problem = _native.Problem("bfloat16", 1, 8, 8, 2, 2, 64)
    fake = (0x1000, 1 << 20)  # never dereferenced: the driver check comes first
    with pytest.raises(fa.UnavailableError, match="libcuda") as e:
        _native.cuda_forward(problem, 0, 0, fake, fake, fake, fake)
    assert isinstance(e.value, RuntimeError)
    assert fa.cuda_status() == {"driver": False, "nvrtc": _native.cuda_libraries()[1]}


def test_bad_addresses_are_refused_before_use():
    problem = _native.Problem("float32", 1, 8, 8, 2, 2, 32)
    good, out = np.ones(512, np.float32), np.zeros(512, np.float32)
    addr, o = (good.ctypes.data, good.size), (out.ctypes.data, out.size)
    with pytest.raises(ValueError, match="null or not aligned"):
        _native.wgpu_forward(problem, (good.ctypes.data + 2, 8), addr, addr, o)
    with pytest.raises(fa.InvalidProblemError, match="`q`"):
        _native.wgpu_forward(problem, (good.ctypes.data, 7), addr, addr, o)


def test_stub_declares_what_the_module_exports():
    stub = os.path.join(os.path.dirname(fa.__file__), "_native.pyi")
    tree = ast.parse(open(stub).read())
    declared = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    declared |= {t.target.id for t in tree.body if isinstance(t, ast.AnnAssign)}
    exported = {n for n in dir(_native) if not n.startswith("_")}
    assert declared == exported
