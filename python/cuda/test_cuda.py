"""The CUDA route of wgpu_flash_attn on PyTorch CUDA tensors (run on an NVIDIA GPU; the H200 in
practice, through python/cuda/h200-run.sh).

Correctness follows FlashAttention's own test rule: the largest error of our output against a
float64 reference must be at most twice that of PyTorch's attention computed in the inputs' 16-bit
type (bf16 or f16 matmuls and softmax) against the same reference. Zero copy is checked by the
addresses the library launched with (the inputs' own, and the output tensor returned), by
PyTorch's allocator (no transient allocation beyond O and the LSE), and by the stream (PyTorch's
current one). The backward (``loss.backward()``) is held to the same rule against float64 autograd
(FlashAttention's hopper tests' form of it, which adds the reference's own 16-bit rounding), and
its deterministic mode to bit-identical gradients.

Runs under pytest, or as ``python3 test_cuda.py`` where pytest is not installed.
"""

from __future__ import annotations

import sys
import traceback

import torch

import wgpu_flash_attn as fa
from wgpu_flash_attn import _interface

DEV = torch.device("cuda", 0)


def randn(seed, shape, dtype=torch.bfloat16):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return torch.randn(shape, generator=g, device=DEV, dtype=torch.float32).to(dtype)


def visible(seq_q, seq_k, causal, window, kv_len=None):
    """``[seq_q, seq_k]``: key ``j`` visible to query ``i`` (bottom-right aligned to ``kv_len``)."""
    kv_len = seq_k if kv_len is None else kv_len
    i = torch.arange(seq_q, device=DEV)[:, None] + kv_len - seq_q
    j = torch.arange(seq_k, device=DEV)[None, :]
    ok = (j < kv_len).expand(seq_q, seq_k).clone()  # full size before the in-place updates
    left, right = window
    if causal:
        right = 0
    if left >= 0:
        ok &= j >= i - left
    if right >= 0:
        ok &= j <= i + right
    return ok


def math_attention(
    q, k, v, *, causal=False, window=(-1, -1), softcap=0.0, scale=None, alibi_slopes=None, dropout=None,
    dtype=torch.float64,
):
    """Attention computed in ``dtype``: float64 for the reference, the inputs' 16-bit type for
    "PyTorch's math implementation" of the rule (each matmul and the softmax rounded to it).
    ``alibi_slopes`` ``[h]``: ``-slope * |i + sk - sq - j|`` added after the soft-cap. ``dropout``:
    ``(p, keep)``, ``keep`` ``[b, h, sq, sk]`` bools (``wgpu_flash_attn.dropout_mask``): the kept
    probabilities scaled by ``1 / (1 - p)``, the others 0; the LSE stays the undropped one.
    Returns O ``[b, sq, h, d]`` (in ``dtype``) and the LSE ``[b, h, sq]`` (float64)."""
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    scale = d**-0.5 if scale is None else scale
    q, k, v = (x.to(dtype) for x in (q, k, v))
    k, v = (x.repeat_interleave(h // hk, dim=2) for x in (k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if alibi_slopes is not None:
        i = torch.arange(sq, device=DEV)[:, None] + sk - sq
        j = torch.arange(sk, device=DEV)[None, :]
        s = s - alibi_slopes.to(dtype)[:, None, None] * (i - j).abs().to(dtype)
    s = s.masked_fill(~visible(sq, sk, causal, window), float("-inf"))
    lse = torch.logsumexp(s.double(), dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # rows that see no key: 0
    if dropout is not None:
        drop_p, keep = dropout
        p = torch.where(keep, p / (1.0 - drop_p), torch.zeros((), dtype=p.dtype, device=DEV))
    return torch.einsum("bhqk,bkhd->bqhd", p, v), lse


def check_rule(name, ours, ref, pt):
    """FlashAttention's rule, max-abs errors against the float64 reference."""
    err = (ours.double() - ref).abs().max().item()
    err_pt = (pt.double() - ref).abs().max().item()
    kernel = _interface._last_cuda_launch.get("kernel", "?")
    print(f"  {name}: max error {err:.3e}, PyTorch {pt.dtype} math {err_pt:.3e} ({err / max(err_pt, 1e-30):.2f}x), {kernel}")
    assert err <= 2 * err_pt + 1e-5, f"{name}: error {err:.3e} > 2 x PyTorch's {err_pt:.3e}"


def check_lse(name, lse, ref_lse):
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite), f"{name}: LSE -inf where the reference is not"
    err = (lse.double() - ref_lse)[finite].abs().max().item() if finite.any() else 0.0
    assert err <= 2e-3, f"{name}: LSE off by {err:.3e}"


def check_addresses(q, k, v, out):
    launch = _interface._last_cuda_launch
    assert launch["q"] == q.data_ptr() and launch["k"] == k.data_ptr() and launch["v"] == v.data_ptr(), launch
    assert launch["o"] == out.data_ptr(), "the output returned is not the memory the kernel wrote"
    assert launch["stream"] == torch.cuda.current_stream(DEV).cuda_stream


DENSE = [
    # name, batch, seq_q, seq_k, heads, kv_heads, head_dim, options
    ("hd128_gqa", 2, 1000, 1000, 8, 2, 128, {}),
    ("hd128_gqa_causal", 2, 1000, 1000, 8, 2, 128, {"causal": True}),
    ("hd64_causal_fewer_queries", 1, 512, 1500, 4, 4, 64, {"causal": True}),
    ("hd256", 2, 333, 333, 8, 8, 256, {}),
    ("hd128_window", 1, 1024, 1024, 4, 4, 128, {"window_size": (100, 50)}),
    ("hd128_softcap_causal", 1, 777, 777, 4, 2, 128, {"causal": True, "softcap": 5.0, "softmax_scale": 0.2}),
    # Head dims between the kernels' tile widths (96 runs in 128-wide tiles; 100 is padded to
    # 104 as FlashAttention pads, then to 128 in the kernel).
    ("hd96_gqa_causal", 1, 500, 700, 6, 2, 96, {"causal": True}),
    ("hd100", 2, 300, 300, 4, 4, 100, {}),
    # ALiBi: slopes 2^-(h+1) (``slopes``), as a (heads,) tensor or repeated (batch, heads).
    ("hd128_alibi", 2, 600, 900, 8, 2, 128, {"alibi": (8,)}),
    ("hd128_alibi_causal_window", 1, 1000, 1000, 4, 4, 128, {"causal": True, "window_size": (300, 0), "alibi": (1, 4)}),
    ("hd64_alibi_softcap", 2, 500, 500, 4, 1, 64, {"softcap": 5.0, "alibi": (2, 4)}),
]


def slopes(heads):
    """ALiBi slopes 2^-(h+1): each head's bias tangibly different over a few hundred keys."""
    return torch.tensor([0.5 ** (h + 1) for h in range(heads)], dtype=torch.float32, device=DEV)


def run_dense(case, dtype, seed):
    name, b, sq, sk, h, hk, d, opts = case
    q, k, v = randn(seed, (b, sq, h, d), dtype), randn(seed + 1, (b, sk, hk, d), dtype), randn(seed + 2, (b, sk, hk, d), dtype)
    opts = dict(opts)
    alibi = opts.pop("alibi", None)
    if alibi is not None:
        opts["alibi_slopes"] = slopes(h).expand(alibi)
    out, lse = fa.flash_attn_func(q, k, v, return_lse=True, **opts)
    if d % 8 == 0:
        check_addresses(q, k, v, out)
    else:
        # FlashAttention's own rule: a head_dim off the 8-element grid is padded by a copy.
        launch = _interface._last_cuda_launch
        assert f"_d{(d + 7) // 8 * 8}_" in launch["kernel"] and launch["q"] != q.data_ptr(), launch
    if alibi is not None:
        launch = _interface._last_cuda_launch
        assert "_alibi" in launch["kernel"] and launch["alibi_slopes"] != 0, launch
    args = dict(
        causal=opts.get("causal", False),
        window=opts.get("window_size", (-1, -1)),
        softcap=opts.get("softcap", 0.0),
        scale=opts.get("softmax_scale"),
        alibi_slopes=None if alibi is None else slopes(h),
    )
    ref, ref_lse = math_attention(q, k, v, **args)
    pt, _ = math_attention(q, k, v, dtype=dtype, **args)
    check_rule(f"{name} {dtype}", out, ref, pt)
    check_lse(name, lse, ref_lse)


def test_dense_bf16():
    for i, case in enumerate(DENSE):
        run_dense(case, torch.bfloat16, 10 * i)


def test_dense_f16():
    for i, case in enumerate(DENSE[:3]):
        run_dense(case, torch.float16, 100 + 10 * i)


def test_varlen():
    seed, lengths = 200, [100, 1, 777, 300]
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32, device=DEV)
    total = int(cu[-1])
    q, k, v = randn(seed, (total, 8, 128)), randn(seed + 1, (total, 2, 128)), randn(seed + 2, (total, 2, 128))
    out = fa.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), causal=True)
    check_addresses(q, k, v, out)
    for b in range(len(lengths)):
        r = slice(int(cu[b]), int(cu[b + 1]))
        ref, _ = math_attention(q[None, r], k[None, r], v[None, r], causal=True)
        pt, _ = math_attention(q[None, r], k[None, r], v[None, r], causal=True, dtype=torch.bfloat16)
        check_rule(f"varlen sequence {b}", out[None, r], ref, pt)


def test_varlen_alibi():
    """ALiBi in a packed batch: distances within each sequence."""
    seed, lengths = 250, [300, 17, 650]
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32, device=DEV)
    total = int(cu[-1])
    q, k, v = randn(seed, (total, 8, 64)), randn(seed + 1, (total, 4, 64)), randn(seed + 2, (total, 4, 64))
    out = fa.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), causal=True, alibi_slopes=slopes(8))
    check_addresses(q, k, v, out)
    for b in range(len(lengths)):
        r = slice(int(cu[b]), int(cu[b + 1]))
        x = (q[None, r], k[None, r], v[None, r])
        ref, _ = math_attention(*x, causal=True, alibi_slopes=slopes(8))
        pt, _ = math_attention(*x, causal=True, alibi_slopes=slopes(8), dtype=torch.bfloat16)
        check_rule(f"varlen alibi sequence {b}", out[None, r], ref, pt)


def test_kvcache_alibi():
    """ALiBi in a decoding step: a contiguous cache without lengths (the prefill kernels), then
    counted and paged caches with the append (the decode kernel), positions aligned to each
    sequence's own end."""
    q, k_cache, v_cache = randn(450, (2, 4, 8, 128)), randn(451, (2, 1000, 2, 128)), randn(452, (2, 1000, 2, 128))
    out = fa.flash_attn_with_kvcache(q, k_cache, v_cache, causal=True, alibi_slopes=slopes(8))
    ref, _ = math_attention(q, k_cache, v_cache, causal=True, alibi_slopes=slopes(8))
    pt, _ = math_attention(q, k_cache, v_cache, causal=True, alibi_slopes=slopes(8), dtype=torch.bfloat16)
    check_rule("kvcache alibi, whole cache", out, ref, pt)
    k_new, v_new = randn(453, (2, 1, 2, 128)), randn(454, (2, 1, 2, 128))
    lens = torch.tensor([10, 500], dtype=torch.int32, device=DEV)
    page, per_seq = 64, 1000 // 64 + 1
    table = torch.randperm(2 * per_seq, device=DEV).to(torch.int32).reshape(2, per_seq)
    k_pool = torch.zeros((2 * per_seq, page, 2, 128), dtype=torch.bfloat16, device=DEV)
    v_pool = torch.zeros_like(k_pool)
    for b in range(2):
        flat_k = torch.zeros((per_seq * page, 2, 128), dtype=torch.bfloat16, device=DEV)
        flat_v = torch.zeros_like(flat_k)
        flat_k[:1000], flat_v[:1000] = k_cache[b], v_cache[b]
        k_pool[table[b].long()] = flat_k.reshape(per_seq, page, 2, 128)
        v_pool[table[b].long()] = flat_v.reshape(per_seq, page, 2, 128)
    counted = fa.flash_attn_with_kvcache(
        q[:, :1], k_cache, v_cache, k_new, v_new, cache_seqlens=lens, causal=True, alibi_slopes=slopes(8)
    )
    assert "_alibi" in _interface._last_cuda_launch["kernel"], _interface._last_cuda_launch
    paged = fa.flash_attn_with_kvcache(
        q[:, :1], k_pool, v_pool, k_new, v_new, cache_seqlens=lens, block_table=table, causal=True, alibi_slopes=slopes(8)
    )
    for b in range(2):
        n = int(lens[b]) + 1
        x = (q[b : b + 1, :1], k_cache[b : b + 1, :n], v_cache[b : b + 1, :n])
        ref, _ = math_attention(*x, causal=True, alibi_slopes=slopes(8))
        pt, _ = math_attention(*x, causal=True, alibi_slopes=slopes(8), dtype=torch.bfloat16)
        check_rule(f"kvcache alibi, counted, sequence {b}", counted[b : b + 1], ref, pt)
        check_rule(f"kvcache alibi, paged, sequence {b}", paged[b : b + 1], ref, pt)


def test_strided_inputs_are_read_in_place():
    """Q, K, V as views of one packed QKV tensor: launched on the views' own addresses."""
    qkv = randn(300, (2, 512, 3, 8, 128))
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    out = fa.flash_attn_func(q, k, v, causal=True)
    check_addresses(q, k, v, out)
    ref, _ = math_attention(q, k, v, causal=True)
    pt, _ = math_attention(q, k, v, causal=True, dtype=torch.bfloat16)
    check_rule("packed qkv views", out, ref, pt)


def test_no_copy_allocations():
    """PyTorch's allocator sees only O and the LSE: no copy of Q, K or V, even transiently."""
    q, k, v = (randn(310 + i, (2, 2048, 16, 128)) for i in range(3))
    fa.flash_attn_func(q, k, v)  # compile / load the kernel first
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated(DEV)
    torch.cuda.reset_peak_memory_stats(DEV)
    out = fa.flash_attn_func(q, k, v)
    peak = torch.cuda.max_memory_allocated(DEV) - before
    expected = out.numel() * out.element_size() + 2 * 16 * 2048 * 4  # O and the LSE
    print(f"  allocated during the call: {peak} bytes; O + LSE = {expected}; Q alone = {q.numel() * 2}")
    assert peak <= expected + 4096, f"{peak} bytes allocated; O and the LSE are {expected}"


def test_runs_on_the_current_stream():
    q, k, v = (randn(320 + i, (1, 256, 4, 64)) for i in range(3))
    side = torch.cuda.Stream(DEV)
    side.wait_stream(torch.cuda.current_stream(DEV))
    with torch.cuda.stream(side):
        out = fa.flash_attn_func(q, k, v, causal=True)
        assert _interface._last_cuda_launch["stream"] == side.cuda_stream
    side.synchronize()
    ref, _ = math_attention(q, k, v, causal=True)
    pt, _ = math_attention(q, k, v, causal=True, dtype=torch.bfloat16)
    check_rule("side stream", out, ref, pt)


def test_kvcache_contiguous_and_paged():
    """A decoding step: append 1 (and 4) new tokens per sequence in place, attend over the cache."""
    seed, batch, heads, heads_k, d = 400, 4, 32, 8, 128
    lens = torch.tensor([100, 2000, 4095, 0], dtype=torch.int32, device=DEV)
    for seq_new in (1, 4):
        q = randn(seed, (batch, seq_new, heads, d))
        k_new, v_new = randn(seed + 1, (batch, seq_new, heads_k, d)), randn(seed + 2, (batch, seq_new, heads_k, d))
        page, per_seq = 256, 17  # 4352 slots per sequence: room for 4095 + 4
        k_cache = randn(seed + 3, (batch, page * per_seq, heads_k, d))
        v_cache = randn(seed + 4, (batch, page * per_seq, heads_k, d))
        out = fa.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=lens, causal=True)
        check_addresses(q, k_cache, v_cache, out)
        # Paged: the same cache (new tokens included) in shuffled pages of 256 tokens; the paged
        # call's append writes the same values again.
        table = torch.randperm(batch * per_seq, device=DEV).to(torch.int32).reshape(batch, per_seq)
        k_pool = torch.empty((batch * per_seq, page, heads_k, d), dtype=torch.bfloat16, device=DEV)
        v_pool = torch.empty_like(k_pool)
        for b in range(batch):
            k_pool[table[b].long()] = k_cache[b].reshape(per_seq, page, heads_k, d)
            v_pool[table[b].long()] = v_cache[b].reshape(per_seq, page, heads_k, d)
        paged = fa.flash_attn_with_kvcache(
            q, k_pool, v_pool, k_new, v_new, cache_seqlens=lens, block_table=table, causal=True
        )
        for b in range(batch):
            n = int(lens[b]) + seq_new
            assert torch.equal(k_cache[b, n - seq_new : n], k_new[b]), "the append did not land in the cache"
            ref, _ = math_attention(q[b : b + 1], k_cache[b : b + 1, :n], v_cache[b : b + 1, :n], causal=True)
            pt, _ = math_attention(
                q[b : b + 1], k_cache[b : b + 1, :n], v_cache[b : b + 1, :n], causal=True, dtype=torch.bfloat16
            )
            check_rule(f"kvcache {seq_new} new, sequence {b}", out[b : b + 1], ref, pt)
            check_rule(f"paged kvcache {seq_new} new, sequence {b}", paged[b : b + 1], ref, pt)


BACKWARD = [
    # name, batch, seq_q, seq_k, heads, kv_heads, head_dim, causal (seq_q <= seq_k: every query
    # sees a key, so the reference's gradients have no NaN rows)
    ("hd128_gqa", 2, 500, 500, 8, 2, 128, False),
    ("hd128_gqa_causal", 2, 500, 500, 8, 2, 128, True),
    ("hd64_causal_more_keys", 1, 300, 700, 4, 4, 64, True),
    ("hd64_mqa", 2, 257, 333, 8, 1, 64, False),
    # Head dims the kernels' tiles pad: 96 in 128-wide tiles, 40 in 64-wide ones.
    ("hd96_gqa_causal", 1, 300, 400, 6, 2, 96, True),
    ("hd40", 2, 257, 333, 4, 4, 40, False),
]


def math_grads(q, k, v, g, causal, dtype, **variant):
    """dQ, dK, dV of ``sum(O * g)`` through ``math_attention`` computed in ``dtype`` (float64:
    the reference; the 16-bit type: "PyTorch's math implementation" of the rule); ``variant``:
    ``math_attention``'s window and softcap."""
    leaves = [x.detach().to(dtype).requires_grad_(True) for x in (q, k, v)]
    out, _ = math_attention(*leaves, causal=causal, dtype=dtype, **variant)
    (out * g.to(dtype)).sum().backward()
    return [x.grad for x in leaves]


def check_grad(name, ours, ref, pt):
    """Issue 20's rule, the forward's: at most twice PyTorch's 16-bit math error against float64
    (measured on the H200 at 0.23-0.95x of it, session 14)."""
    err = (ours.double() - ref).abs().max().item()
    err_pt = (pt.double() - ref).abs().max().item()
    kernel = _interface._last_cuda_launch.get("kernel", "?")
    print(f"  {name}: max error {err:.3e}, PyTorch {pt.dtype} math {err_pt:.3e} ({err / max(err_pt, 1e-30):.2f}x), {kernel}")
    assert err <= 2 * err_pt, f"{name}: error {err:.3e} > 2 x PyTorch's {err_pt:.3e}"


def grad_inputs(seed, b, sq, sk, h, hk, d, dtype):
    """Q, K, V (leaves that require grad) and the upstream gradient dL/dO, seeded."""
    q = randn(seed, (b, sq, h, d), dtype).requires_grad_(True)
    k = randn(seed + 1, (b, sk, hk, d), dtype).requires_grad_(True)
    v = randn(seed + 2, (b, sk, hk, d), dtype).requires_grad_(True)
    g = randn(seed + 3, (b, sq, h, d), dtype)
    return q, k, v, g


def run_backward(case, dtype, seed, deterministic=False):
    name, b, sq, sk, h, hk, d, causal = case
    q, k, v, g = grad_inputs(seed, b, sq, sk, h, hk, d, dtype)
    out = fa.flash_attn_func(q, k, v, causal=causal, deterministic=deterministic)
    (out * g).sum().backward()
    launch = _interface._last_cuda_launch
    assert launch["kernel"].startswith("flash_bwd"), launch
    assert launch["stream"] == torch.cuda.current_stream(DEV).cuda_stream
    assert launch["dq"] == launch["dq_tensor"] and launch["dk"] == launch["dk_tensor"], launch
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
    return q, k, v, g


def test_backward():
    """loss.backward() through flash_attn_func on CUDA tensors: the CUDA backward's dQ, dK, dV
    against float64 autograd through the math attention (GQA/MQA gradients summed per K/V head)."""
    for dtype in (torch.bfloat16, torch.float16):
        for i, case in enumerate(BACKWARD):
            q, k, v, g = run_backward(case, dtype, 700 + 10 * i)
            causal = case[-1]
            ref = math_grads(q, k, v, g, causal, torch.float64)
            pt = math_grads(q, k, v, g, causal, dtype)
            for grad, name, r, p in zip((q.grad, k.grad, v.grad), ("dq", "dk", "dv"), ref, pt):
                check_grad(f"{case[0]} {dtype} {name}", grad, r, p)


def test_backward_windows_and_softcap():
    """Sliding windows and soft-caps through loss.backward() on CUDA tensors, against float64
    autograd through the math attention with the same window and cap."""
    cases = [
        ("window_causal", 2, 500, 500, 8, 2, 128, True, {"window_size": (64, 0)}, {"window": (64, 0)}),
        ("window_both_sides", 1, 300, 450, 4, 4, 64, False, {"window_size": (40, 25)}, {"window": (40, 25)}),
        ("softcap", 2, 400, 400, 8, 2, 128, False, {"softcap": 20.0}, {"softcap": 20.0}),
        ("softcap_window_causal", 1, 333, 333, 4, 1, 64, True,
         {"softcap": 5.0, "window_size": (100, 0)}, {"softcap": 5.0, "window": (100, 0)}),
    ]
    for i, (name, b, sq, sk, h, hk, d, causal, opts, variant) in enumerate(cases):
        for dtype in (torch.bfloat16, torch.float16):
            seed = 900 + 10 * i
            q, k, v, g = grad_inputs(seed, b, sq, sk, h, hk, d, dtype)
            (fa.flash_attn_func(q, k, v, causal=causal, **opts) * g).sum().backward()
            assert _interface._last_cuda_launch["kernel"].startswith("flash_bwd"), _interface._last_cuda_launch
            ref = math_grads(q, k, v, g, causal, torch.float64, **variant)
            pt = math_grads(q, k, v, g, causal, dtype, **variant)
            for grad, gname, r, p in zip((q.grad, k.grad, v.grad), ("dq", "dk", "dv"), ref, pt):
                check_grad(f"{name} {dtype} {gname}", grad, r, p)


def test_dropout_forward_and_backward():
    """dropout_p on CUDA tensors: the forward and loss.backward() against float64 attention and
    autograd with the mask ``dropout_mask`` gives for the seed (the backward draws it again), by
    the rule; another seed's reference must break the rule (the mask is what is checked)."""
    cases = [
        ("hd128_gqa_causal", 2, 500, 500, 8, 2, 128, True, 0.1),
        ("hd64_fewer_queries", 1, 300, 700, 4, 4, 64, False, 0.3),
        ("hd96_causal", 1, 333, 333, 6, 2, 96, True, 0.5),
    ]
    for i, (name, b, sq, sk, h, hk, d, causal, drop_p) in enumerate(cases):
        for dtype in (torch.bfloat16, torch.float16):
            seed = 950 + 10 * i
            q, k, v, g = grad_inputs(seed, b, sq, sk, h, hk, d, dtype)
            out = fa.flash_attn_func(q, k, v, dropout_p=drop_p, causal=causal, dropout_seed=seed)
            assert "_dropout" in _interface._last_cuda_launch["kernel"], _interface._last_cuda_launch
            applied = round(drop_p * 2**16) / 2**16
            keep = torch.from_numpy(fa.dropout_mask(drop_p, seed, b, h, sq, sk)).to(DEV)
            variant = {"dropout": (applied, keep)}
            ref, _ = math_attention(q.detach(), k.detach(), v.detach(), causal=causal, **variant)
            pt, _ = math_attention(q.detach(), k.detach(), v.detach(), causal=causal, dtype=dtype, **variant)
            check_rule(f"dropout {name} {dtype} out", out.detach(), ref, pt)
            (out * g).sum().backward()
            assert "_dropout" in _interface._last_cuda_launch["kernel"], _interface._last_cuda_launch
            grads = math_grads(q, k, v, g, causal, torch.float64, **variant)
            pt_grads = math_grads(q, k, v, g, causal, dtype, **variant)
            for grad, gname, r, p in zip((q.grad, k.grad, v.grad), ("dq", "dk", "dv"), grads, pt_grads):
                check_grad(f"dropout {name} {dtype} {gname}", grad, r, p)
            other = torch.from_numpy(fa.dropout_mask(drop_p, seed + 1, b, h, sq, sk)).to(DEV)
            wrong, _ = math_attention(q.detach(), k.detach(), v.detach(), causal=causal, dropout=(applied, other))
            err_wrong = (out.detach().double() - wrong).abs().max().item()
            err_pt = (pt.double() - ref).abs().max().item()
            assert err_wrong > 10 * err_pt, f"{name}: another seed's mask fits too ({err_wrong:.3e})"


def test_backward_of_out_sum():
    """``out.sum().backward()``: dO arrives as an expanded (stride 0) tensor, copied once."""
    q, k, v = (randn(800 + i, (1, 256, 4, 64)).requires_grad_(True) for i in range(3))
    fa.flash_attn_func(q, k, v, causal=True).sum().backward()
    ref = math_grads(q, k, v, torch.ones(1, 256, 4, 64, device=DEV), True, torch.float64)
    pt = math_grads(q, k, v, torch.ones(1, 256, 4, 64, device=DEV), True, torch.bfloat16)
    for grad, name, r, p in zip((q.grad, k.grad, v.grad), ("dq", "dk", "dv"), ref, pt):
        check_grad(f"out.sum() {name}", grad, r, p)


def test_backward_deterministic():
    """deterministic=True: bit-identical dQ, dK, dV over 3 runs (dQ's atomics otherwise add in
    any order)."""
    case = ("hd128_gqa_causal_2k", 2, 2048, 2048, 16, 4, 128, True)
    for dtype in (torch.bfloat16, torch.float16):
        grads = []
        for run in range(3):
            q, k, v, _ = run_backward(case, dtype, 900, deterministic=True)
            assert "det" in _interface._last_cuda_launch["kernel"], _interface._last_cuda_launch
            grads.append((q.grad, k.grad, v.grad))
        for run in (1, 2):
            for name, a, b in zip(("dq", "dk", "dv"), grads[0], grads[run]):
                assert torch.equal(a, b), f"{dtype} {name}: run {run} differs from run 0"
        print(f"  {dtype}: 3 deterministic runs bit-identical ({_interface._last_cuda_launch['kernel']})")


def test_backward_refusals_are_not_implemented():
    """What the CUDA backward does not run: the forward runs, backward() raises
    NotImplementedError with the library's message."""
    cases = [
        ("head_dim 256", (1, 64, 4, 256), {}, "head_dim 256"),
        ("alibi", (1, 64, 4, 64), {"alibi_slopes": slopes(4)}, "ALiBi"),
    ]
    for name, shape, opts, words in cases:
        q, k, v = (randn(500 + i, shape).requires_grad_(True) for i in range(3))
        out = fa.flash_attn_func(q, k, v, **opts)  # the forward runs
        try:
            out.sum().backward()
        except NotImplementedError as e:
            assert "CUDA backward" in str(e) and words in str(e), f"{name}: {e}"
            assert isinstance(e.__cause__, fa.UnavailableError), f"{name}: {e.__cause__!r}"
            print(f"  {name}: {e}")
        else:
            raise AssertionError(f"{name}: backward on CUDA tensors did not raise NotImplementedError")


def test_f32_is_refused_by_name():
    q = randn(600, (1, 64, 4, 64), torch.float32)
    try:
        fa.flash_attn_func(q, q, q)
    except fa.UnavailableError as e:
        assert "bf16 or f16" in str(e), e
    else:
        raise AssertionError("f32 CUDA tensors were accepted")


if __name__ == "__main__":
    tests = [(n, f) for n, f in sorted(globals().items()) if n.startswith("test_") and callable(f)]
    print(f"{torch.cuda.get_device_name(DEV)}, PyTorch {torch.__version__}, wgpu_flash_attn {fa.__version__}")
    failed = 0
    for name, test in tests:
        print(name)
        try:
            test()
            print(f"ok {name}")
        except Exception:
            failed += 1
            print(f"FAILED {name}")
            traceback.print_exc()
    print(f"{len(tests) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
