"""CPU PyTorch tensors through the wgpu route: against ``scaled_dot_product_attention`` and the
float64 reference, forward and backward (``loss.backward()`` through the autograd function).
Skipped where PyTorch is not installed."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import REL_L2, assert_close, assert_lse
from reference import applied_p, attention, attention_grads, rel_l2, visible

torch = pytest.importorskip("torch")
F = torch.nn.functional

import wgpu_flash_attn as fa  # noqa: E402

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def randn(seed, shape, dtype="float32", requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(shape, generator=g).to(DTYPES[dtype])
    return t.requires_grad_(requires_grad)


def np64(t):
    return t.detach().to(torch.float64).numpy()


def sdpa(q, k, v, causal=False, window=(-1, -1), scale=None):
    """PyTorch's attention on ``[b, s, h, d]`` tensors, K/V heads repeated for GQA, masks as a
    boolean ``attn_mask`` aligned to the bottom-right corner like FlashAttention's."""
    group = q.shape[2] // k.shape[2]
    k, v = (x.repeat_interleave(group, dim=2) for x in (k, v))
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    mask = torch.from_numpy(visible(q.shape[2], k.shape[2], causal, window))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return out.transpose(1, 2)


FORWARD = [
    # name, batch, seq_q, seq_k, heads, kv_heads, head_dim, causal, window
    ("plain", 2, 37, 37, 4, 4, 64, False, (-1, -1)),
    ("causal", 2, 37, 37, 4, 4, 64, True, (-1, -1)),
    ("gqa_fewer_queries", 2, 20, 45, 8, 2, 32, True, (-1, -1)),
    ("window", 1, 64, 64, 4, 4, 32, False, (8, 4)),
]


@pytest.mark.parametrize("case", FORWARD, ids=lambda c: c[0])
def test_forward_matches_sdpa(case):
    name, b, sq, sk, h, hk, d, causal, window = case
    seed = 100
    q, k, v = randn(seed, (b, sq, h, d)), randn(seed + 1, (b, sk, hk, d)), randn(seed + 2, (b, sk, hk, d))
    out, lse = fa.flash_attn_func(q, k, v, causal=causal, window_size=window, return_lse=True)
    assert isinstance(out, torch.Tensor) and out.shape == q.shape and out.dtype == q.dtype
    theirs = sdpa(q, k, v, causal, window)
    ref, ref_lse = attention(q.numpy(), k.numpy(), v.numpy(), causal=causal, window=window)
    assert rel_l2(out.numpy(), theirs.numpy()) <= 2 * REL_L2["float32"], f"{name}: differs from SDPA"
    assert_close(out.numpy(), ref, "float32", name, seed)
    assert_lse(lse.numpy(), ref_lse, name, seed)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16bit_tensors(dtype):
    seed = 110
    q, k, v = (randn(seed + i, (2, 33, 4, 64), dtype) for i in range(3))
    out = fa.flash_attn_func(q, k, v, causal=True, softcap=3.0)
    assert out.dtype == DTYPES[dtype]
    ref, _ = attention(np64(q), np64(k), np64(v), causal=True, softcap=3.0)
    assert_close(np64(out), ref, dtype, f"{dtype} tensors", seed)


def test_non_contiguous_tensors():
    seed = 120
    q = randn(seed, (2, 4, 29, 32)).transpose(1, 2)  # from PyTorch's [b, h, s, d]
    kv = randn(seed + 1, (2, 29, 2, 4, 32))  # packed K/V
    k, v = kv[:, :, 0], kv[:, :, 1]
    out = fa.flash_attn_func(q, k, v, causal=True)
    ref, _ = attention(q.numpy(), k.numpy(), v.numpy(), causal=True)
    assert_close(out.numpy(), ref, "float32", "non-contiguous tensors", seed)


BACKWARD = [
    # name, batch, seq_q, seq_k, heads, kv_heads, head_dim, options
    ("causal_gqa", 2, 33, 33, 4, 2, 32, {"causal": True}),
    ("window_softcap", 1, 40, 48, 2, 2, 32, {"window_size": (8, 4), "softcap": 2.0, "softmax_scale": 0.5}),
    ("head_dim_20_padded", 1, 17, 17, 2, 2, 20, {"causal": True}),
    ("mqa_fewer_queries", 1, 12, 30, 2, 1, 64, {"causal": True}),
]


@pytest.mark.parametrize("case", BACKWARD, ids=lambda c: c[0])
def test_backward_matches_reference(case):
    """``loss.backward()`` gives the float64 reference's gradients (dK, dV summed over the query
    heads that share a K/V head)."""
    name, b, sq, sk, h, hk, d, opts = case
    seed = 130
    q = randn(seed, (b, sq, h, d), requires_grad=True)
    k = randn(seed + 1, (b, sk, hk, d), requires_grad=True)
    v = randn(seed + 2, (b, sk, hk, d), requires_grad=True)
    d_out = randn(seed + 3, (b, sq, h, d))
    out = fa.flash_attn_func(q, k, v, **opts)
    assert out.grad_fn is not None
    (out * d_out).sum().backward()
    ref_opts = {
        "causal": opts.get("causal", False),
        "window": opts.get("window_size", (-1, -1)),
        "softcap": opts.get("softcap", 0.0),
        "scale": opts.get("softmax_scale"),
    }
    grads = attention_grads(np64(q), np64(k), np64(v), np64(d_out), **ref_opts)
    for tensor, ref, label in zip((q, k, v), grads, ("dq", "dk", "dv")):
        assert tensor.grad.shape == tensor.shape
        err = rel_l2(tensor.grad.numpy(), ref)
        assert err <= 1e-4, f"{name} {label} (seed {seed}): relative L2 error {err:.3e}"


def test_backward_agrees_with_sdpa_autograd():
    seed = 140
    leaves = [randn(seed + i, (2, 24, 4, 32), requires_grad=True) for i in range(3)]
    twins = [t.detach().clone().requires_grad_(True) for t in leaves]
    d_out = randn(seed + 3, (2, 24, 4, 32))
    (fa.flash_attn_func(*leaves, causal=True) * d_out).sum().backward()
    (sdpa(*twins, causal=True) * d_out).sum().backward()
    for ours, theirs, label in zip(leaves, twins, ("dq", "dk", "dv")):
        assert rel_l2(ours.grad.numpy(), theirs.grad.numpy()) <= 1e-4, label


def test_qkvpacked_backward_reaches_the_packed_tensor():
    seed = 145
    qkv = randn(seed, (1, 20, 3, 2, 32), requires_grad=True)
    d_out = randn(seed + 1, (1, 20, 2, 32))
    (fa.flash_attn_qkvpacked_func(qkv, causal=True) * d_out).sum().backward()
    grads = attention_grads(*(np64(qkv[:, :, i]) for i in range(3)), np64(d_out), causal=True)
    for i, (ref, label) in enumerate(zip(grads, ("dq", "dk", "dv"))):
        assert rel_l2(qkv.grad[:, :, i].numpy(), ref) <= 1e-4, label


def test_backward_bf16():
    seed = 150
    q, k, v = (randn(seed + i, (1, 32, 2, 64), "bfloat16", requires_grad=True) for i in range(3))
    d_out = randn(seed + 3, (1, 32, 2, 64), "bfloat16")
    (fa.flash_attn_func(q, k, v, causal=True) * d_out).float().sum().backward()
    grads = attention_grads(np64(q), np64(k), np64(v), np64(d_out), causal=True)
    for tensor, ref, label in zip((q, k, v), grads, ("dq", "dk", "dv")):
        assert tensor.grad.dtype == torch.bfloat16
        err = rel_l2(np64(tensor.grad), ref)
        assert err <= 2e-2, f"bf16 {label}: relative L2 error {err:.3e}"


def test_varlen_backward():
    """Packed sequences of 9, 1 and 20 rows: each one's gradients are those of its own attention."""
    seed = 160
    lengths = [9, 1, 20]
    cu = torch.tensor([0, 9, 10, 30], dtype=torch.int32)
    q = randn(seed, (30, 4, 32), requires_grad=True)
    k = randn(seed + 1, (30, 2, 32), requires_grad=True)
    v = randn(seed + 2, (30, 2, 32), requires_grad=True)
    d_out = randn(seed + 3, (30, 4, 32))
    out, lse = fa.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), causal=True, return_lse=True)
    assert lse.shape == (4, 30) and not lse.requires_grad
    (out * d_out).sum().backward()
    for b in range(len(lengths)):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        grads = attention_grads(*(np64(t[rows])[None] for t in (q, k, v, d_out)), causal=True)
        for tensor, ref, label in zip((q, k, v), grads, ("dq", "dk", "dv")):
            err = rel_l2(tensor.grad[rows].numpy(), ref[0])
            assert err <= 1e-4, f"varlen sequence {b} {label}: relative L2 error {err:.3e}"


@pytest.mark.parametrize("causal", [False, True])
def test_dropout_backward_matches_reference(causal):
    """``loss.backward()`` through dropout: the backward draws the forward's mask again (the call
    keeps its seed), so the gradients are the reference's with ``dropout_mask``'s mask."""
    seed, p, drop_seed = 165, 0.2, 99
    b, sq, sk, h, hk, d = 2, 23, 31, 4, 2, 32
    q = randn(seed, (b, sq, h, d), requires_grad=True)
    k = randn(seed + 1, (b, sk, hk, d), requires_grad=True)
    v = randn(seed + 2, (b, sk, hk, d), requires_grad=True)
    d_out = randn(seed + 3, (b, sq, h, d))
    out = fa.flash_attn_func(q, k, v, dropout_p=p, causal=causal, dropout_seed=drop_seed)
    (out * d_out).sum().backward()
    dropout = (applied_p(p), fa.dropout_mask(p, drop_seed, b, h, sq, sk))
    ref_out, _ = attention(np64(q), np64(k), np64(v), causal=causal, dropout=dropout)
    assert rel_l2(out.detach().numpy(), ref_out) <= 1e-4
    grads = attention_grads(np64(q), np64(k), np64(v), np64(d_out), causal=causal, dropout=dropout)
    for tensor, ref, label in zip((q, k, v), grads, ("dq", "dk", "dv")):
        err = rel_l2(tensor.grad.numpy(), ref)
        assert err <= 1e-4, f"dropout {label} (seed {seed}): relative L2 error {err:.3e}"
    # Without dropout the gradients differ: the bound above tells a mask from none.
    plain = attention_grads(np64(q), np64(k), np64(v), np64(d_out), causal=causal)
    assert rel_l2(v.grad.numpy(), plain[2]) > 1e-2


def test_dropout_follows_torch_manual_seed():
    q, k, v = (randn(168 + i, (1, 16, 2, 32)) for i in range(3))
    torch.manual_seed(3)
    first = fa.flash_attn_func(q, k, v, dropout_p=0.4)
    torch.manual_seed(3)
    assert torch.equal(first, fa.flash_attn_func(q, k, v, dropout_p=0.4))
    assert not torch.equal(first, fa.flash_attn_func(q, k, v, dropout_p=0.4))


def test_no_grad_calls_skip_autograd():
    q, k, v = (randn(170 + i, (1, 8, 2, 32), requires_grad=True) for i in range(3))
    with torch.no_grad():
        out = fa.flash_attn_func(q, k, v)
    assert out.grad_fn is None and not out.requires_grad


def test_kvcache_updates_torch_caches_in_place():
    seed = 180
    q = randn(seed, (2, 1, 4, 32))
    k_cache, v_cache = randn(seed + 1, (2, 32, 2, 32)), randn(seed + 2, (2, 32, 2, 32))
    k_new, v_new = randn(seed + 3, (2, 1, 2, 32)), randn(seed + 4, (2, 1, 2, 32))
    lens = torch.tensor([5, 17], dtype=torch.int32)
    address = k_cache.data_ptr()
    out = fa.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=lens, causal=True)
    assert k_cache.data_ptr() == address
    for b, n in enumerate(lens.tolist()):
        assert torch.equal(k_cache[b, n], k_new[b, 0]) and torch.equal(v_cache[b, n], v_new[b, 0])
        ref, _ = attention(q[b : b + 1].numpy(), k_cache[None, b, : n + 1].numpy(), v_cache[None, b, : n + 1].numpy())
        assert_close(out[b].numpy(), ref[0], "float32", f"kvcache sequence {b}", seed)


def test_errors_on_tensors():
    q = randn(190, (1, 8, 4, 32))
    with pytest.raises(ValueError, match="dtype float16 but q has float32"):
        fa.flash_attn_func(q, q.half(), q)
    with pytest.raises(TypeError, match="float64"):
        fa.flash_attn_func(q.double(), q.double(), q.double())
    with pytest.raises(ValueError, match="is on numpy but q is on cpu"):
        fa.flash_attn_func(q, q.numpy(), q)
    with pytest.raises(ValueError, match="alibi_slopes has shape"):
        fa.flash_attn_func(q, q, q, alibi_slopes=torch.ones(3))


class _StandIn:
    """The CUDA route's Python half run on CPU tensors: ``_native.cuda_forward`` replaced by the
    wgpu call on the same addresses, problem and index tensors (host memory works for both), the
    append recorded, PyTorch's CUDA stream calls made no-ops. Checks what the route passes the
    library (strides, packed and paged layouts, key counts) without a GPU."""

    def __init__(self, monkeypatch):
        from wgpu_flash_attn import _interface, _native

        self.appends = []
        self.native = _native

        def forward(problem, device, stream, q, k, v, o, lse=None, **index):
            kernel = _native.wgpu_forward(problem, q, k, v, o, lse, **index)
            return kernel, {"q": q[0], "k": k[0], "v": v[0], "o": o[0], "stream": stream}

        def append(problem, device, stream, *tensors, **index):
            self.appends.append(problem)

        class Stream:
            cuda_stream = 0

        monkeypatch.setattr(_interface, "ensure_nvrtc", lambda: None)
        monkeypatch.setattr(_native, "cuda_forward", forward)
        monkeypatch.setattr(_native, "cuda_append_kv", append)
        monkeypatch.setattr(torch.cuda, "device", lambda device: __import__("contextlib").nullcontext())
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())
        self.route = _interface


def call_of(route, batch, seq_q, seq_k, heads, heads_k, dim=32, **kwargs):
    call = route._Call("float32", (batch, seq_q, seq_k, heads, heads_k, dim), scale=dim**-0.5, **kwargs)
    call.out_shape, call.lse_shape = (batch, seq_q, heads, dim), (batch, heads, seq_q)
    return call


def test_cuda_route_plumbing_with_a_stand_in(monkeypatch):
    stand_in = _StandIn(monkeypatch)
    route = stand_in.route
    seed = 200
    # Packed QKV views: passed with their own strides, not copied.
    qkv = randn(seed, (2, 29, 3, 4, 32))
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    call = route._Call("float32", (2, 29, 29, 4, 4, 32), causal=True, scale=32**-0.5)
    call.out_shape, call.lse_shape = (2, 29, 4, 32), (2, 4, 29)
    out, lse, _ = route._cuda_forward(call, q, k, v)
    assert route._last_cuda_launch["q"] == q.data_ptr() and route._last_cuda_launch["v"] == v.data_ptr()
    ref, ref_lse = attention(q.numpy(), k.numpy(), v.numpy(), causal=True)
    assert_close(out.numpy(), ref, "float32", "stand-in packed views", seed)
    assert_lse(lse.numpy(), ref_lse, "stand-in packed views", seed)

    # A length-1 dimension with a stride no kernel could step by: still read in place.
    q1 = randn(seed + 9, (1, 16, 4, 32)).as_strided((1, 16, 4, 32), (3, 128, 32, 1))
    out, _, _ = route._cuda_forward(call_of(route, 1, 16, 16, 4, 4), q1, q1, q1)
    assert route._last_cuda_launch["q"] == q1.data_ptr()
    ref, _ = attention(q1.numpy(), q1.numpy(), q1.numpy())
    assert_close(out.numpy(), ref, "float32", "stand-in odd stride of a length-1 dimension", seed)

    # Packed batch whose rows are strided views.
    cu = torch.tensor([0, 7, 20], dtype=torch.int32)
    wide = randn(seed + 1, (20, 2, 4, 32))
    q, k, v = wide[:, 0], wide[:, 1, :2], wide[:, 1, 2:]
    call = route._Call("float32", (2, 13, 13, 4, 2, 32), scale=32**-0.5, varlen=(20, 20))
    call.index = {"cu_seqlens_q": route._device_index(cu, "cpu"), "cu_seqlens_k": route._device_index(cu, "cpu")}
    call.out_shape, call.lse_shape = (20, 4, 32), (4, 20)
    out, _, _ = route._cuda_forward(call, q, k, v)
    for b in range(2):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        ref, _ = attention(q[rows].numpy()[None], k[rows].numpy()[None], v[rows].numpy()[None])
        assert_close(out[rows].numpy(), ref[0], "float32", f"stand-in varlen {b}", seed)

    # A paged decoding step: the append problem is built, the forward reads the new counts.
    page, per_seq, heads_k = 16, 3, 2
    table = torch.tensor([[4, 0, 2], [1, 5, 3]], dtype=torch.int32)
    k_pool, v_pool = randn(seed + 2, (6, page, heads_k, 32)), randn(seed + 3, (6, page, heads_k, 32))
    q = randn(seed + 4, (2, 1, 4, 32))
    lens = torch.tensor([20, 47], dtype=torch.int32)
    call = route._Call(
        "float32", (2, 1, page * per_seq, 4, heads_k, 32), causal=True, scale=32**-0.5,
        kv_lengths=True, paged=(page, 6, per_seq),
    )
    call.out_shape, call.lse_shape = (2, 1, 4, 32), (2, 4, 1)
    k_new = randn(seed + 5, (2, 1, heads_k, 32))
    out, _ = route._kvcache_cuda(call, q, k_pool, v_pool, k_new, k_new, lens, table, 1)
    assert len(stand_in.appends) == 1
    for b in range(2):
        keys = torch.cat([k_pool[p] for p in table[b].tolist()])[: int(lens[b]) + 1]
        values = torch.cat([v_pool[p] for p in table[b].tolist()])[: int(lens[b]) + 1]
        ref, _ = attention(q[b : b + 1].numpy(), keys[None].numpy(), values[None].numpy(), causal=True)
        assert_close(out[b].numpy(), ref[0], "float32", f"stand-in paged {b}", seed)
