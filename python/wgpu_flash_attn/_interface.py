"""FlashAttention's Python API (``flash_attn.flash_attn_interface``) on wgpu-flash-attn.

Arguments, shapes (``[batch, seq, heads, head_dim]``), defaults and results follow FlashAttention
2's functions of the same names, so code written for them runs unchanged where the library
computes the same thing; what it does not compute yet raises ``NotImplementedError`` naming the
argument.

Where the work runs:

* NumPy arrays and CPU PyTorch tensors: the wgpu engine (any GPU through Vulkan, Metal or DX12;
  Mesa's lavapipe on a machine without one), created on the first call and kept for the process.
  Inputs are read in place when contiguous (else copied once); results are written into arrays
  allocated here.
* PyTorch CUDA tensors: the library's CUDA kernels (forward and backward), on PyTorch's current
  stream, reading the tensors and writing the output where they are (no copy), like any PyTorch
  operation.
* PyTorch tensors on other devices (``mps``, ``xpu``, ...): copied to the CPU and back.

Every tensor passed to ``_native`` is referenced by a local variable for the whole call: the Rust
side reads and writes the addresses it is given and trusts them to stay valid.
"""

from __future__ import annotations

import sys
from typing import Any, Dict, Optional, Sequence, Tuple, Union

from . import _native
from ._cuda_libs import ensure_nvrtc
from ._errors import UnavailableError

Array = Any  # numpy.ndarray or torch.Tensor; neither is imported unless the caller uses it.

_DTYPES = ("float32", "float16", "bfloat16")
_INT32_MAX = 2**31 - 1
#: What the last CUDA call launched with (kernel, tensor addresses, stream); for tests.
_last_cuda_launch: Dict[str, Any] = {}


# ---------------------------------------------------------------------------------------------
# Arrays: NumPy or PyTorch, told apart without importing either.


def _torch():
    return sys.modules.get("torch")


def _is_torch(x: Any) -> bool:
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def _is_numpy(x: Any) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(x, np.ndarray)


def _where(x: Any) -> str:
    """``"numpy"``, ``"cpu"``, ``"cuda"`` or another torch device type."""
    if _is_numpy(x):
        return "numpy"
    if _is_torch(x):
        return x.device.type
    raise TypeError(f"expected a NumPy array or a PyTorch tensor, got {type(x).__name__}")


def _dtype_name(x: Any, name: str) -> str:
    if _is_numpy(x):
        dtype = x.dtype.name  # ml_dtypes' bfloat16 is named "bfloat16"
    else:
        dtype = str(x.dtype).replace("torch.", "")
    if dtype not in _DTYPES:
        raise TypeError(f"{name} has dtype {dtype}; wgpu-flash-attn takes float32, float16 or bfloat16")
    return dtype


def _contiguous(x: Any) -> Any:
    if _is_numpy(x):
        np = sys.modules["numpy"]
        return np.ascontiguousarray(x)
    return x.contiguous()


def _empty(like: Any, shape: Sequence[int], float32: bool = False) -> Any:
    if _is_numpy(like):
        np = sys.modules["numpy"]
        return np.empty(tuple(shape), dtype=np.float32 if float32 else like.dtype)
    torch = _torch()
    return torch.empty(tuple(shape), dtype=torch.float32 if float32 else like.dtype, device=like.device)


def _empty_probs(like: Any) -> Any:
    """FlashAttention's ``S_dmask`` when there is no dropout: an empty tensor of the input dtype."""
    return _empty(like, (0,))


def _host_address(x: Any) -> Tuple[int, int]:
    """``(address, elements)`` of a contiguous host array, as ``_native`` takes host tensors."""
    if _is_numpy(x):
        assert x.flags.c_contiguous
        return (x.ctypes.data, x.size)
    assert x.is_contiguous() and x.device.type == "cpu"
    return (x.data_ptr(), x.numel())


def _device_address(x: Any) -> Tuple[int, int]:
    """``(address, elements from there to the end of its storage)`` of a CUDA tensor: the most
    the library may reach through the tensor's strides."""
    return (x.data_ptr(), x.untyped_storage().nbytes() // x.element_size() - x.storage_offset())


def _pad_head_dim(x: Any, to: int) -> Any:
    """Zeros appended to the last dimension: they add nothing to q·k, and O's extra columns are
    sliced off (FlashAttention pads head dimensions that are not multiples of 8 the same way)."""
    extra = to - x.shape[-1]
    if extra == 0:
        return x
    if _is_numpy(x):
        np = sys.modules["numpy"]
        return np.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, extra)])
    return _torch().nn.functional.pad(x, (0, extra))


def _host_index(x: Any, name: str, length: Optional[int] = None) -> Any:
    """An index tensor (offsets, page table, key counts) as contiguous int32 host memory with
    every value in [0, 2^31), which the library reads as u32."""
    if isinstance(x, int):
        raise TypeError(f"{name} must be an array or a tensor")
    if _is_torch(x):
        torch = _torch()
        x = x.detach().to("cpu", torch.int64)
        lo, hi = (int(x.min()), int(x.max())) if x.numel() else (0, 0)
        out = x.to(torch.int32).contiguous()
    elif _is_numpy(x):
        np = sys.modules["numpy"]
        if x.dtype.kind not in "iu":
            raise TypeError(f"{name} must hold integers, not {x.dtype}")
        lo, hi = (int(x.min()), int(x.max())) if x.size else (0, 0)
        out = np.ascontiguousarray(x, dtype=np.int32)
    else:
        raise TypeError(f"{name} must be a NumPy array or a PyTorch tensor, got {type(x).__name__}")
    if lo < 0 or hi > _INT32_MAX:
        raise ValueError(f"{name} holds {lo if lo < 0 else hi}; its values must be in [0, 2^31)")
    if length is not None and len(out.reshape(-1)) < length:
        raise ValueError(f"{name} has {len(out.reshape(-1))} entries; the call needs {length}")
    return out


def _device_index(x: Any, device: Any) -> Any:
    """An index tensor on the CUDA device, int32, contiguous: read there as u32 without a check
    of its values (that would synchronize); the kernels never read or write out of bounds for a
    bad entry, they write the rows it affects as NaN."""
    torch = _torch()
    if not _is_torch(x):
        x = torch.as_tensor(x)
    return x.to(device=device, dtype=torch.int32).contiguous()


# ---------------------------------------------------------------------------------------------
# Arguments FlashAttention takes.


_SEED_END = 2**64


def _checked_seed(seed: Any) -> int:
    """``seed`` when it is an int the generator takes (``[0, 2^64)``), else ``ValueError``."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < _SEED_END:
        raise ValueError(f"dropout_seed must be an int in [0, 2^64), got {seed!r}")
    return seed


def _dropout(dropout_p: float, dropout_seed: Optional[int], like: Any) -> Optional[Tuple[float, int]]:
    """FlashAttention's ``dropout_p`` as ``Problem``'s ``(p, seed)``, or ``None`` for none. The seed
    is ``dropout_seed`` when given, else drawn from the global generator of ``like``'s framework
    (PyTorch's default generator, NumPy's ``numpy.random``), so ``torch.manual_seed`` or
    ``numpy.random.seed`` make the masks reproducible, as they do FlashAttention's. The call keeps
    the seed: its backward draws the same mask again."""
    p = float(dropout_p)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if p == 0.0:
        return None
    if dropout_seed is not None:
        return (p, _checked_seed(dropout_seed))
    if _is_torch(like):
        torch = _torch()
        seed = int(torch.randint(0, 2**63 - 1, (1,), dtype=torch.int64).item())
    else:
        np = sys.modules["numpy"]
        seed = int(np.random.randint(0, 2**63 - 1, dtype=np.int64))
    return (p, seed)


def dropout_mask(
    dropout_p: float, dropout_seed: int, batch: int, nheads: int, seqlen_q: int, seqlen_k: int
) -> Any:
    """The keep mask a call with ``dropout_p`` and ``dropout_seed`` applies: a NumPy bool array
    ``(batch, nheads, seqlen_q, seqlen_k)``, ``True`` where the probability of query ``i`` for key
    ``j`` is kept (and scaled by ``1 / (1 - dropout_p)``), ``False`` where it is dropped. For a
    packed (varlen) call, ``batch`` counts sequences and sequence ``b``'s mask is
    ``[b, :, :seqlen_q_b, :seqlen_k_b]``. The library rounds ``dropout_p`` to a multiple of
    ``2^-16``; the mask is the kernels' bit for bit, so a test can build the exact reference. Up to
    ``2^32`` elements a call."""
    import numpy as np

    _checked_seed(dropout_seed)
    sizes = (int(batch), int(nheads), int(seqlen_q), int(seqlen_k))
    if min(sizes) < 0:
        raise ValueError(f"sizes must not be negative, got {sizes}")
    raw = _native.dropout_mask(float(dropout_p), dropout_seed, *sizes)
    return np.frombuffer(raw, dtype=np.uint8).astype(bool).reshape(sizes)


def _window(window_size: Sequence[int]) -> Optional[Tuple[Optional[int], Optional[int]]]:
    """FlashAttention's ``(left, right)``, a negative side unbounded, as ``Problem``'s window."""
    if len(window_size) != 2:
        raise ValueError(f"window_size must be (left, right), got {window_size!r}")
    left, right = (None if int(w) < 0 else int(w) for w in window_size)
    return None if left is None and right is None else (left, right)


def _softcap(softcap: float) -> Optional[float]:
    # FlashAttention: 0 (or below) means no soft-capping.
    return float(softcap) if softcap > 0.0 else None


def _alibi(alibi_slopes: Any, batch: int, num_heads: int) -> Optional[Any]:
    """ALiBi slopes (``(nheads,)`` or ``(batch, nheads)``, FlashAttention's shapes) as
    ``num_heads`` contiguous float32 values where they were given (a NumPy array, or a tensor on
    its own device), or ``None``. The library has one slope per head: a ``(batch, nheads)``
    tensor whose rows differ raises ``NotImplementedError`` (checking that reads the slopes)."""
    if alibi_slopes is None:
        return None
    shape = tuple(alibi_slopes.shape)
    if shape not in ((num_heads,), (batch, num_heads)):
        raise ValueError(f"alibi_slopes has shape {shape}; expected ({num_heads},) or ({batch}, {num_heads})")
    if _is_torch(alibi_slopes):
        rows = alibi_slopes.detach().to(_torch().float32).reshape(-1, num_heads)
        same = len(rows) == 1 or bool((rows == rows[0]).all())
        first = rows[0].contiguous()
    else:
        np = sys.modules["numpy"]
        rows = np.asarray(alibi_slopes, dtype=np.float32).reshape(-1, num_heads)
        same = bool((rows == rows[0]).all())
        first = np.ascontiguousarray(rows[0])
    if not same:
        raise NotImplementedError(
            "alibi_slopes that differ between the sequences of a batch: wgpu-flash-attn has one slope per head"
        )
    return first


def _add_slopes(call: "_Call", slopes: Optional[Any], q: Any) -> None:
    """The slopes join the call's side tensors, in the memory the route of ``q`` reads: its CUDA
    device for the CUDA route (a copy of ``nheads`` values when they were elsewhere), host memory
    for the wgpu route."""
    if slopes is None:
        return
    if _where(q) == "cuda":
        torch = _torch()
        slopes = torch.as_tensor(slopes).to(device=q.device, dtype=torch.float32).contiguous()
    elif _is_torch(slopes):
        slopes = slopes.cpu()
    call.index["alibi_slopes"] = slopes


def _same(where: str, dtype: str, tensors: Dict[str, Any]) -> None:
    for name, t in tensors.items():
        if _where(t) != where:
            raise ValueError(f"{name} is on {_where(t)} but q is on {where}; pass them on one device")
        if _is_torch(t) and t.device != next(iter(tensors.values())).device:
            raise ValueError(f"{name} is on {t.device}; q is on another device")
        if _dtype_name(t, name) != dtype:
            raise ValueError(f"{name} has dtype {_dtype_name(t, name)} but q has {dtype}")


def _shape(x: Any, name: str, ndim: int) -> Tuple[int, ...]:
    if x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")
    return tuple(int(n) for n in x.shape)


class _Call:
    """One call's problem, before the tensors' strides (which the CUDA route passes) are known."""

    def __init__(self, dtype: str, sizes: Tuple[int, ...], **kwargs: Any) -> None:
        self.dtype = dtype
        self.sizes = sizes  # batch, seq_q, seq_kv, num_heads, num_kv_heads, head_dim
        self.kwargs = kwargs
        self.index: Dict[str, Any] = {}  # name -> int32 array, on the route's side
        self.out_shape: Tuple[int, ...] = ()
        self.lse_shape: Tuple[int, ...] = ()
        self.packed = "varlen" in kwargs
        #: FlashAttention's ``deterministic``: the CUDA backward's fixed-order dQ accumulation.
        self.deterministic = False

    def problem(self, layouts: Optional[Dict[str, Tuple[int, int, int, int]]] = None) -> Any:
        return _native.Problem(self.dtype, *self.sizes, layouts=layouts, **self.kwargs)


# ---------------------------------------------------------------------------------------------
# The two routes.


def _host_forward(call: _Call, q: Any, k: Any, v: Any) -> Tuple[Any, Any, Any]:
    """The wgpu route: contiguous inputs in place, O and the LSE written into new arrays."""
    q, k, v = _contiguous(q), _contiguous(k), _contiguous(v)
    problem = call.problem()
    out = _empty(q, call.out_shape)
    lse = _empty(q, call.lse_shape, float32=True)
    index = {name: _host_address(t) for name, t in call.index.items()}
    _native.wgpu_forward(
        problem, _host_address(q), _host_address(k), _host_address(v), _host_address(out), _host_address(lse), **index
    )
    return out, lse, problem


def _host_backward(call: _Call, problem: Any, saved: Sequence[Any], d_out: Any) -> Tuple[Any, Any, Any]:
    q, k, v, out, lse = saved
    d_out = _contiguous(d_out)
    dq, dk, dv = _empty(q, q.shape), _empty(k, k.shape), _empty(v, v.shape)
    backward_side = ("cu_seqlens_q", "cu_seqlens_k", "alibi_slopes")
    index = {name: _host_address(t) for name, t in call.index.items() if name in backward_side}
    tensors = (q, k, v, out, lse, d_out, dq, dk, dv)
    _native.wgpu_backward(problem, *(_host_address(t) for t in tensors), **index)
    return dq, dk, dv


def _cuda_ready(x: Any) -> Any:
    """``x`` itself when the kernels can read it where it is (last dimension contiguous, the
    strides of the other dimensions longer than 1 whole groups of 4 elements, an 8-byte-aligned
    start), else a contiguous copy: FlashAttention's ``maybe_contiguous``, with the library's
    stride rule."""
    strides = x.stride()
    steps = (s for s, n in zip(strides[:-1], x.shape[:-1]) if n > 1)
    if strides[-1] == 1 and all(s % 4 == 0 for s in steps) and x.data_ptr() % 8 == 0:
        return x
    return x.contiguous()


def _cuda_layout(x: Any, packed: bool) -> Tuple[int, int, int, int]:
    """``(offset, batch_stride, seq_stride, head_stride)`` of a CUDA tensor, relative to its own
    address: ``[batch, seq, heads, dim]`` (or a page pool), or packed ``[total, heads, dim]``. A
    dimension of length 1 is never stepped along: its stride (which PyTorch leaves arbitrary)
    goes as 0."""
    s = [0 if n == 1 else st for st, n in zip(x.stride(), x.shape)]
    return (0, 0, s[0], s[1]) if packed else (0, s[0], s[1], s[2])


def _cuda_forward(call: _Call, q: Any, k: Any, v: Any) -> Tuple[Any, Any, Any]:
    """The CUDA route: the kernel enqueued on PyTorch's current stream, on the tensors in place."""
    torch = _torch()
    ensure_nvrtc()
    q, k, v = _cuda_ready(q), _cuda_ready(k), _cuda_ready(v)
    paged = "paged" in call.kwargs
    layouts = {
        "q": _cuda_layout(q, call.packed),
        "k": _cuda_layout(k, call.packed and not paged),
        "v": _cuda_layout(v, call.packed and not paged),
    }
    problem = call.problem(layouts)
    out = _empty(q, call.out_shape)
    lse = _empty(q, call.lse_shape, float32=True)
    index = {name: _device_address(t) for name, t in call.index.items()}
    device = q.device
    with torch.cuda.device(device):
        stream = torch.cuda.current_stream(device).cuda_stream
        kernel, handed = _native.cuda_forward(
            problem,
            device.index,
            stream,
            _device_address(q),
            _device_address(k),
            _device_address(v),
            _device_address(out),
            _device_address(lse),
            **index,
        )
    _last_cuda_launch.clear()
    _last_cuda_launch.update(handed, kernel=kernel, out=out.data_ptr(), lse_tensor=lse.data_ptr())
    return out, lse, problem


def _cuda_dense(x: Any) -> Any:
    """``x`` itself when contiguous with a 16-byte-aligned start, else a contiguous copy: the
    backward reads every tensor in the default (contiguous) layouts."""
    if x.is_contiguous() and x.data_ptr() % 16 == 0:
        return x
    return x.clone(memory_format=_torch().contiguous_format)


def _cuda_backward(call: _Call, saved: Sequence[Any], d_out: Any) -> Tuple[Any, Any, Any]:
    """The CUDA backward on PyTorch's current stream: dQ, dK, dV written into tensors allocated
    here (``torch.empty_like`` of the contiguous inputs). Q, K, V, O and dO are read contiguous
    (a strided one is copied once; dO from ``out.sum()`` is an expanded tensor). What the CUDA
    backward refuses (ALiBi, packed batches, head_dim past 128, ...), the library's
    ``Unavailable`` error, raises ``NotImplementedError`` with its message."""
    torch = _torch()
    q, k, v, out, lse = saved
    q, k, v, out, d_out, lse = (_cuda_dense(x) for x in (q, k, v, out, d_out, lse))
    problem = call.problem()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    device = q.device
    tensors = (q, k, v, out, lse, d_out, dq, dk, dv)
    with torch.cuda.device(device):
        stream = torch.cuda.current_stream(device).cuda_stream
        try:
            kernel, handed = _native.cuda_backward(
                problem,
                device.index,
                stream,
                *(_device_address(t) for t in tensors),
                deterministic=call.deterministic,
            )
        except UnavailableError as e:
            raise NotImplementedError(str(e)) from e
    _last_cuda_launch.clear()
    _last_cuda_launch.update(handed, kernel=kernel, dq_tensor=dq.data_ptr(), dk_tensor=dk.data_ptr(), dv_tensor=dv.data_ptr())
    return dq, dk, dv


def _autograd_function():
    """``torch.autograd.Function`` for the host and CUDA routes, defined once torch is in use."""
    global _FlashAttnFunction
    if _FlashAttnFunction is not None:
        return _FlashAttnFunction
    torch = _torch()

    class FlashAttnFunction(torch.autograd.Function):
        """Attention with a backward pass: the forward keeps Q, K, V, O and the LSE, the backward
        runs the library's (FlashAttention-2's recomputing) backward on them: the wgpu backward
        on host tensors, the CUDA backward (``CudaAttention::backward_device``) on CUDA ones,
        where what it does not run raises ``NotImplementedError`` with the library's message."""

        @staticmethod
        def forward(ctx, q, k, v, call):
            if q.device.type == "cuda":
                out, lse, _ = _cuda_forward(call, q, k, v)
                ctx.cuda = True
                ctx.call = call
            else:
                out, lse, problem = _host_forward(call, q, k, v)
                ctx.cuda = False
                ctx.call, ctx.problem = call, problem
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.mark_non_differentiable(lse)
            return out, lse

        @staticmethod
        def backward(ctx, d_out, _d_lse):
            q, k, v, out, lse = ctx.saved_tensors
            if ctx.cuda:
                dq, dk, dv = _cuda_backward(ctx.call, (q, k, v, out, lse), d_out)
                return dq, dk, dv, None
            q, k, v, out = (x.contiguous() for x in (q, k, v, out))
            dq, dk, dv = _host_backward(ctx.call, ctx.problem, (q, k, v, out, lse), d_out)
            return dq, dk, dv, None

    _FlashAttnFunction = FlashAttnFunction
    return FlashAttnFunction


_FlashAttnFunction: Any = None


def _attention(call: _Call, q: Any, k: Any, v: Any) -> Tuple[Any, Any]:
    """O and the LSE of ``call`` on q, k, v by the route their type and device choose, through
    the autograd function when PyTorch will want gradients."""
    where = _where(q)
    if where == "numpy":
        out, lse, _ = _host_forward(call, q, k, v)
        return out, lse
    torch = _torch()
    if where not in ("cpu", "cuda"):
        # No route reads this device's memory: through the CPU and back (differentiably).
        device = q.device
        out, lse = _attention(call, q.cpu(), k.cpu(), v.cpu())
        return out.to(device), lse.to(device)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        return _autograd_function().apply(q, k, v, call)
    out, lse, _ = (_cuda_forward if where == "cuda" else _host_forward)(call, q, k, v)
    return out, lse


def _results(out: Any, lse: Any, like: Any, return_attn_probs: bool, return_lse: bool) -> Any:
    if return_attn_probs:
        return out, lse, _empty_probs(like)
    if return_lse:
        return out, lse
    return out


# ---------------------------------------------------------------------------------------------
# The public functions.


def flash_attn_func(
    q: Array,
    k: Array,
    v: Array,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[Array] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    return_lse: bool = False,
    dropout_seed: Optional[int] = None,
) -> Union[Array, Tuple[Array, ...]]:
    """Exact attention ``softmax(softmax_scale · q kᵀ [masked]) v``, FlashAttention's
    ``flash_attn_func``.

    Args:
        q: ``(batch, seqlen_q, nheads, headdim)``: a NumPy array (float32, float16, or
            ``ml_dtypes.bfloat16``) or a PyTorch tensor (float32, float16, bfloat16; the CUDA
            route takes float16 and bfloat16).
        k: ``(batch, seqlen_k, nheads_k, headdim)``; ``nheads`` must be a multiple of
            ``nheads_k`` (query head ``h`` reads K/V head ``h // (nheads // nheads_k)``: MQA, GQA).
        v: like ``k``.
        dropout_p: the probability of dropping each attention probability (the kept ones scaled
            by ``1 / (1 - dropout_p)``; FlashAttention's dropout, fused: the mask is drawn in the
            kernels from a counter-based generator, never stored, and drawn again by the
            backward). In ``[0, 1)``, rounded to a multiple of ``2^-16``; 0.0 (FlashAttention's
            setting for evaluation) is none. The LSE is the undropped softmax's.
        softmax_scale: defaults to ``1 / sqrt(headdim)``.
        causal: the mask aligned to the bottom-right corner: query ``i`` sees keys
            ``j <= i + seqlen_k - seqlen_q``; rows that see no key give 0 (LSE ``-inf``).
        window_size: ``(left, right)`` local attention around each query's aligned position
            ``i + seqlen_k - seqlen_q``; ``-1`` leaves a side unbounded.
        softcap: ``> 0`` soft-caps the scores, ``softcap · tanh(score / softcap)``.
        alibi_slopes: ``(nheads,)`` or ``(batch, nheads)`` float32 ALiBi slopes, adding
            ``-slope * |i + seqlen_k - seqlen_q - j|`` to the scores (after the soft-cap), on
            both routes; ``(batch, nheads)`` rows that differ raise ``NotImplementedError``.
        deterministic: on CUDA tensors, the backward accumulates dQ in a fixed order, so that
            every gradient is bit-identical from run to run (slower); without it dQ's last bits
            may vary between runs (dK and dV never do). The wgpu backward (host tensors) is
            always deterministic.
        return_attn_probs: also return the LSE and FlashAttention's ``S_dmask``, which is empty
            here (the probabilities are never written; ``dropout_mask`` gives the dropout
            pattern).
        return_lse: also return the LSE (without the empty ``S_dmask``).
        dropout_seed: the generator's seed for ``dropout_p`` (an int in ``[0, 2^64)``): one seed,
            one mask, on every route and device. ``None`` draws one from PyTorch's default
            generator (PyTorch tensors) or ``numpy.random`` (NumPy arrays), so
            ``torch.manual_seed`` / ``numpy.random.seed`` make runs repeat.

    Returns:
        ``out`` ``(batch, seqlen_q, nheads, headdim)``, of q's type, dtype and device; with
        ``return_attn_probs`` ``(out, softmax_lse, S_dmask)``, with ``return_lse``
        ``(out, softmax_lse)``, ``softmax_lse`` ``(batch, nheads, seqlen_q)`` float32, the natural
        log of each row's softmax denominator.

    PyTorch tensors that require grad go through a ``torch.autograd.Function``: ``backward()``
    runs the library's backward, the wgpu one on CPU tensors and the CUDA one on CUDA tensors
    (float16/bfloat16, ``headdim`` a multiple of 8 up to 128, causal or not, sliding windows,
    ``softcap``, MQA/GQA, ``dropout_p``). What the CUDA backward does not run (``alibi_slopes``,
    other head dimensions) raises ``NotImplementedError`` from ``backward()``, with the library's
    message.
    Library errors raise ``wgpu_flash_attn.InvalidProblemError`` (a ``ValueError``),
    ``UnavailableError`` or ``DeviceError`` (``RuntimeError``s) with the library's message.
    """
    where = _where(q)
    dtype = _dtype_name(q, "q")
    _same(where, dtype, {"q": q, "k": k, "v": v})
    dropout = _dropout(dropout_p, dropout_seed, q)
    batch, seq_q, heads, dim = _shape(q, "q", 4)
    _, seq_k, heads_k, _ = _shape(k, "k", 4)
    if tuple(k.shape) != (batch, seq_k, heads_k, dim) or tuple(v.shape) != tuple(k.shape):
        raise ValueError(
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: k and v must be "
            f"(batch, seqlen_k, nheads_k, headdim) with q's batch and headdim"
        )
    scale = dim**-0.5 if softmax_scale is None else float(softmax_scale)
    padded = (dim + 7) // 8 * 8
    slopes = _alibi(alibi_slopes, batch, heads)
    call = _Call(
        dtype,
        (batch, seq_q, seq_k, heads, heads_k, padded),
        causal=bool(causal),
        scale=scale,
        window=_window(window_size),
        softcap=_softcap(softcap),
        alibi=slopes is not None,
        dropout=dropout,
    )
    _add_slopes(call, slopes, q)
    call.deterministic = bool(deterministic)
    call.out_shape = (batch, seq_q, heads, padded)
    call.lse_shape = (batch, heads, seq_q)
    out, lse = _attention(call, *(_pad_head_dim(x, padded) for x in (q, k, v)))
    return _results(out[..., :dim], lse, q, return_attn_probs, return_lse)


def flash_attn_varlen_func(
    q: Array,
    k: Array,
    v: Array,
    cu_seqlens_q: Array,
    cu_seqlens_k: Array,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[Array] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    block_table: Optional[Array] = None,
    *,
    return_lse: bool = False,
    dropout_seed: Optional[int] = None,
) -> Union[Array, Tuple[Array, ...]]:
    """Attention over sequences of different lengths packed end to end without padding,
    FlashAttention's ``flash_attn_varlen_func``.

    Args:
        q: ``(total_q, nheads, headdim)``: sequence ``b`` is rows
            ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]``.
        k: ``(total_k, nheads_k, headdim)``, rows ``cu_seqlens_k[b]:cu_seqlens_k[b + 1]``.
        v: like ``k``.
        cu_seqlens_q: ``(batch + 1,)`` int32 non-decreasing offsets (a CUDA tensor on the CUDA
            route; host arrays are moved there).
        cu_seqlens_k: ``(batch + 1,)`` int32.
        max_seqlen_q: the longest query sequence.
        max_seqlen_k: the longest key sequence.
        block_table: not implemented for packed batches (``NotImplementedError``); use
            ``flash_attn_with_kvcache`` for paged caches.

    Each sequence is attended as a problem of its own (causal masks and windows aligned to its own
    end; its dropout mask is ``dropout_mask(...)[b]``, rows and keys counted from its start). The other arguments and the results are ``flash_attn_func``'s; ``softmax_lse`` is
    ``(nheads, total_q)``. Offsets that decrease or leave the tensors raise
    ``InvalidProblemError`` on the host route; on CUDA they are not read back (that would
    synchronize): the kernels never access memory out of bounds and write the affected
    sequence as NaN.
    """
    if block_table is not None:
        raise NotImplementedError(
            "block_table with flash_attn_varlen_func: a packed (varlen) batch over a paged K/V cache "
            "is not implemented in wgpu-flash-attn yet; use flash_attn_with_kvcache for paged caches"
        )
    where = _where(q)
    dtype = _dtype_name(q, "q")
    _same(where, dtype, {"q": q, "k": k, "v": v})
    dropout = _dropout(dropout_p, dropout_seed, q)
    total_q, heads, dim = _shape(q, "q", 3)
    total_k, heads_k, _ = _shape(k, "k", 3)
    if tuple(k.shape) != (total_k, heads_k, dim) or tuple(v.shape) != tuple(k.shape):
        raise ValueError(
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: k and v must be "
            f"(total_k, nheads_k, headdim) with q's headdim"
        )
    batch = len(cu_seqlens_q) - 1
    if batch < 1 or len(cu_seqlens_k) != batch + 1:
        raise ValueError(
            f"cu_seqlens_q has {len(cu_seqlens_q)} entries and cu_seqlens_k {len(cu_seqlens_k)}: "
            "both must be (batch + 1,) with batch >= 1"
        )
    scale = dim**-0.5 if softmax_scale is None else float(softmax_scale)
    padded = (dim + 7) // 8 * 8
    slopes = _alibi(alibi_slopes, batch, heads)
    call = _Call(
        dtype,
        (batch, int(max_seqlen_q), int(max_seqlen_k), heads, heads_k, padded),
        causal=bool(causal),
        scale=scale,
        window=_window(window_size),
        softcap=_softcap(softcap),
        alibi=slopes is not None,
        dropout=dropout,
        varlen=(total_q, total_k),
    )
    if where == "cuda":
        call.index = {
            "cu_seqlens_q": _device_index(cu_seqlens_q, q.device),
            "cu_seqlens_k": _device_index(cu_seqlens_k, q.device),
        }
    else:
        call.index = {
            "cu_seqlens_q": _host_index(cu_seqlens_q, "cu_seqlens_q"),
            "cu_seqlens_k": _host_index(cu_seqlens_k, "cu_seqlens_k"),
        }
    _add_slopes(call, slopes, q)
    call.deterministic = bool(deterministic)
    call.out_shape = (total_q, heads, padded)
    call.lse_shape = (heads, total_q)
    out, lse = _attention(call, *(_pad_head_dim(x, padded) for x in (q, k, v)))
    return _results(out[..., :dim], lse, q, return_attn_probs, return_lse)


def flash_attn_with_kvcache(
    q: Array,
    k_cache: Array,
    v_cache: Array,
    k: Optional[Array] = None,
    v: Optional[Array] = None,
    rotary_cos: Optional[Array] = None,
    rotary_sin: Optional[Array] = None,
    cache_seqlens: Optional[Union[int, Array]] = None,
    cache_batch_idx: Optional[Array] = None,
    cache_leftpad: Optional[Array] = None,
    block_table: Optional[Array] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: Optional[Array] = None,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
) -> Union[Array, Tuple[Array, Array]]:
    """A decoding step against a K/V cache, FlashAttention's ``flash_attn_with_kvcache``: appends
    the new tokens' ``k``/``v`` to the cache *in place* (when given), then attends ``q`` over each
    sequence's cached keys.

    Args:
        q: ``(batch, seqlen_q, nheads, headdim)``: the new tokens' queries.
        k_cache: ``(batch, seqlen_cache, nheads_k, headdim)``, or with ``block_table`` a pool of
            pages ``(num_blocks, page_block_size, nheads_k, headdim)`` (``page_block_size`` a
            multiple of 16).
        v_cache: like ``k_cache``.
        k: ``(batch, seqlen_new, nheads_k, headdim)`` new keys, written at positions
            ``cache_seqlens[b] ...`` of sequence ``b``; needs ``cache_seqlens``.
        v: like ``k``.
        cache_seqlens: int or ``(batch,)`` int32: each sequence's cached keys before the append.
            ``None``: every sequence uses the whole cache (``seqlen_cache`` keys).
        block_table: ``(batch, max_num_blocks_per_seq)`` int32 page numbers, for a paged cache.
        num_splits: accepted for compatibility; the library picks the split of the keys itself.
        return_softmax_lse: also return ``softmax_lse`` ``(batch, nheads, seqlen_q)``.
        rotary_cos, rotary_sin, cache_batch_idx, cache_leftpad: not implemented
            (``NotImplementedError`` when given); ``rotary_interleaved`` is then unused.

    The causal mask and the window align each sequence's queries to the end of its own keys
    (``cache_seqlens[b] + seqlen_new``). The other arguments are ``flash_attn_func``'s. There is
    no backward (FlashAttention has none for this call either). On the host route, positions
    past the cache raise ``ValueError``; on CUDA they are not read back: the append skips them
    and the affected sequence's output is NaN.
    """
    for name, value in (
        ("rotary_cos", rotary_cos),
        ("rotary_sin", rotary_sin),
        ("cache_batch_idx", cache_batch_idx),
        ("cache_leftpad", cache_leftpad),
    ):
        if value is not None:
            raise NotImplementedError(f"{name} is not implemented in wgpu-flash-attn yet; pass {name}=None")
    if (k is None) != (v is None):
        raise ValueError("pass both k and v (the new tokens' keys and values), or neither")
    where = _where(q)
    dtype = _dtype_name(q, "q")
    tensors = {"q": q, "k_cache": k_cache, "v_cache": v_cache}
    if k is not None:
        tensors.update(k=k, v=v)
    _same(where, dtype, tensors)
    batch, seq_q, heads, dim = _shape(q, "q", 4)
    blocks, block_size, heads_k, cache_dim = _shape(k_cache, "k_cache", 4)
    if tuple(v_cache.shape) != tuple(k_cache.shape) or cache_dim != dim:
        raise ValueError(
            f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} must have one shape, "
            f"with q's headdim {dim}"
        )
    paged = block_table is not None
    if paged:
        if block_table.ndim != 2 or block_table.shape[0] != batch:
            raise ValueError(f"block_table must be (batch, max_num_blocks_per_seq), got {tuple(block_table.shape)}")
        pages_per_seq = int(block_table.shape[1])
        seq_kv = pages_per_seq * block_size
    else:
        if blocks != batch:
            raise ValueError(f"k_cache holds {blocks} sequences and q {batch}; without cache_batch_idx they must match")
        seq_kv = block_size
    seq_new = 0
    if k is not None:
        if cache_seqlens is None:
            raise ValueError("appending k and v needs cache_seqlens: where each sequence's new tokens go")
        seq_new = _shape(k, "k", 4)[1]
        if tuple(k.shape) != (batch, seq_new, heads_k, dim) or tuple(v.shape) != tuple(k.shape):
            raise ValueError(
                f"k {tuple(k.shape)} and v {tuple(v.shape)} must be (batch, seqlen_new, nheads_k, headdim) "
                f"= ({batch}, seqlen_new, {heads_k}, {dim})"
            )
    if isinstance(cache_seqlens, int):
        cache_seqlens = [cache_seqlens] * batch
    scale = dim**-0.5 if softmax_scale is None else float(softmax_scale)
    slopes = _alibi(alibi_slopes, batch, heads)
    kwargs: Dict[str, Any] = dict(
        causal=bool(causal),
        scale=scale,
        window=_window(window_size),
        softcap=_softcap(softcap),
        alibi=slopes is not None,
        kv_lengths=cache_seqlens is not None,
    )
    if paged:
        kwargs["paged"] = (block_size, blocks, pages_per_seq)
    call = _Call(dtype, (batch, seq_q, seq_kv, heads, heads_k, dim), **kwargs)
    _add_slopes(call, slopes, q)
    call.out_shape = (batch, seq_q, heads, dim)
    call.lse_shape = (batch, heads, seq_q)

    if where == "cuda":
        out, lse = _kvcache_cuda(call, q, k_cache, v_cache, k, v, cache_seqlens, block_table, seq_new)
    else:
        out, lse = _kvcache_host(call, q, k_cache, v_cache, k, v, cache_seqlens, block_table, seq_new)
    return (out, lse) if return_softmax_lse else out


def _kvcache_host(call, q, k_cache, v_cache, k, v, cache_seqlens, block_table, seq_new):
    """The host route of a decoding step: the append done in place on the caller's caches (any
    device: plain indexing), then attention over the cache through wgpu. Everything is checked
    before the append writes anything."""
    batch, seq_kv = call.sizes[0], call.sizes[2]
    if block_table is not None:
        table = _host_index(block_table, "block_table")
        blocks = int(k_cache.shape[0])
        if table.size and int(table.max()) >= blocks:
            raise ValueError(f"block_table names page {int(table.max())}; the caches hold {blocks} pages")
        call.index["page_table"] = table
    lens = None
    if cache_seqlens is not None:
        lens = _host_index(_as_array(cache_seqlens, q), "cache_seqlens", batch)[:batch]
        kv_lens = lens + seq_new
        if int(kv_lens.max()) > seq_kv:
            raise ValueError(
                f"a sequence would hold {int(kv_lens.max())} keys, more than the cache's {seq_kv}"
                + (" (pages per sequence × page size)" if block_table is not None else "")
            )
        call.index["kv_lens"] = _host_index(kv_lens, "kv_lens")
    call.problem()  # the library's checks (and the refusals) before anything is written
    if seq_new:
        _append_in_place(call, k_cache, v_cache, k, v, lens, seq_new)
    where = _where(q)
    if where not in ("numpy", "cpu"):
        device = q.device
        out, lse, _ = _host_forward(call, q.cpu(), k_cache.cpu(), v_cache.cpu())
        return out.to(device), lse.to(device)
    torch = _torch()
    if where != "numpy" and torch.is_grad_enabled():
        # FlashAttention has no backward for this call either; keep autograd out of it.
        with torch.no_grad():
            out, lse, _ = _host_forward(call, q, k_cache, v_cache)
        return out, lse
    out, lse, _ = _host_forward(call, q, k_cache, v_cache)
    return out, lse


def _as_array(values: Any, like: Any) -> Any:
    if _is_numpy(values) or _is_torch(values):
        return values
    if _is_numpy(like):
        return sys.modules["numpy"].asarray(values, dtype="int64")
    return _torch().as_tensor(values, dtype=_torch().int64)


def _append_in_place(call, k_cache, v_cache, k, v, lens, seq_new) -> None:
    """Writes token ``t`` of sequence ``b`` at key position ``lens[b] + t`` of its cache (through
    the page table when paged), by indexing the caller's caches."""
    batch, heads_k, dim = call.sizes[0], call.sizes[4], call.sizes[5]
    table = call.index.get("page_table")
    b_rows, positions = [], []
    for b in range(batch):
        for t in range(seq_new):
            b_rows.append(b)
            positions.append(int(lens[b]) + t)
    if table is not None:
        block_size = call.kwargs["paged"][0]
        table = table.reshape(batch, -1)
        rows = [int(table[b, p // block_size]) for b, p in zip(b_rows, positions)]
        cols = [p % block_size for p in positions]
    else:
        rows, cols = b_rows, positions
    if _is_torch(k_cache):
        torch = _torch()
        rows_t = torch.tensor(rows, device=k_cache.device)
        cols_t = torch.tensor(cols, device=k_cache.device)
        with torch.no_grad():
            k_cache[rows_t, cols_t] = k.reshape(-1, heads_k, dim).to(k_cache.device)
            v_cache[rows_t, cols_t] = v.reshape(-1, heads_k, dim).to(v_cache.device)
    else:
        k_cache[rows, cols] = k.reshape(-1, heads_k, dim)
        v_cache[rows, cols] = v.reshape(-1, heads_k, dim)


def _kvcache_cuda(call, q, k_cache, v_cache, k, v, cache_seqlens, block_table, seq_new):
    """The CUDA route of a decoding step: the library's append kernel writes the new tokens into
    the caller's caches in place, then the decode kernel attends, both on the current stream.
    Both problems are built (and checked) before the append is enqueued."""
    torch = _torch()
    ensure_nvrtc()
    device = q.device
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if _cuda_ready(cache) is not cache:
            raise ValueError(
                f"{name} has strides {tuple(cache.stride())}: the cache is updated in place, so it must "
                "have a contiguous last dimension and other strides that are multiples of 4 elements"
            )
    if block_table is not None:
        call.index["page_table"] = _device_index(block_table, device)
    if cache_seqlens is not None:
        lens = _device_index(_as_array(cache_seqlens, q), device)
        call.index["kv_lens"] = (lens + seq_new).to(torch.int32) if seq_new else lens
    layouts = {"k": _cuda_layout(k_cache, False), "v": _cuda_layout(v_cache, False)}
    q = _cuda_ready(q)
    problem = call.problem(dict(layouts, q=_cuda_layout(q, False)))
    index = {n: _device_address(t) for n, t in call.index.items()}
    if seq_new:
        sizes = call.sizes[:1] + (seq_new,) + call.sizes[2:]
        # The append writes K/V only: the problem of the cache, without the score's terms.
        append = _Call(call.dtype, sizes, **dict(call.kwargs, alibi=False)).problem(layouts)
        k_new, v_new = k.contiguous(), v.contiguous()
    out = _empty(q, call.out_shape)
    lse = _empty(q, call.lse_shape, float32=True)
    with torch.cuda.device(device):
        stream = torch.cuda.current_stream(device).cuda_stream
        if seq_new:
            # The append reads only the cache's index.
            append_index = {n: a for n, a in index.items() if n in ("page_table", "kv_lens")}
            _native.cuda_append_kv(
                append,
                device.index,
                stream,
                _device_address(k_new),
                _device_address(v_new),
                _device_address(k_cache),
                _device_address(v_cache),
                **append_index,
            )
        kernel, handed = _native.cuda_forward(
            problem,
            device.index,
            stream,
            _device_address(q),
            _device_address(k_cache),
            _device_address(v_cache),
            _device_address(out),
            _device_address(lse),
            **index,
        )
    _last_cuda_launch.clear()
    _last_cuda_launch.update(handed, kernel=kernel, out=out.data_ptr(), lse_tensor=lse.data_ptr())
    return out, lse


# ---------------------------------------------------------------------------------------------
# FlashAttention's packed variants: views into the packed tensor, passed on as q, k, v (their
# strides reach the CUDA kernels as they are; gradients flow back into the packed tensor).


def _unpack(x: Any, axis: int, count: int) -> Tuple[Any, ...]:
    if x.shape[axis] != count:
        raise ValueError(f"the packed tensor must have {count} at dimension {axis}, got shape {tuple(x.shape)}")
    if _is_numpy(x):
        return tuple(x.take(i, axis=axis) for i in range(count))
    return tuple(x.unbind(axis))


def flash_attn_qkvpacked_func(
    qkv: Array,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[Array] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> Union[Array, Tuple[Array, ...]]:
    """``flash_attn_func`` on ``qkv`` ``(batch, seqlen, 3, nheads, headdim)``, FlashAttention's
    ``flash_attn_qkvpacked_func``."""
    q, k, v = _unpack(qkv, 2, 3)
    return flash_attn_func(
        q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs
    )


def flash_attn_kvpacked_func(
    q: Array,
    kv: Array,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[Array] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> Union[Array, Tuple[Array, ...]]:
    """``flash_attn_func`` with ``kv`` ``(batch, seqlen_k, 2, nheads_k, headdim)``, FlashAttention's
    ``flash_attn_kvpacked_func``."""
    k, v = _unpack(kv, 2, 2)
    return flash_attn_func(
        q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs
    )


def flash_attn_varlen_qkvpacked_func(
    qkv: Array,
    cu_seqlens: Array,
    max_seqlen: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[Array] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> Union[Array, Tuple[Array, ...]]:
    """``flash_attn_varlen_func`` on ``qkv`` ``(total, 3, nheads, headdim)``, FlashAttention's
    ``flash_attn_varlen_qkvpacked_func``."""
    q, k, v = _unpack(qkv, 1, 3)
    return flash_attn_varlen_func(
        q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale, causal,
        window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
    )  # fmt: skip


def flash_attn_varlen_kvpacked_func(
    q: Array,
    kv: Array,
    cu_seqlens_q: Array,
    cu_seqlens_k: Array,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[Array] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> Union[Array, Tuple[Array, ...]]:
    """``flash_attn_varlen_func`` with ``kv`` ``(total_k, 2, nheads_k, headdim)``, FlashAttention's
    ``flash_attn_varlen_kvpacked_func``."""
    k, v = _unpack(kv, 1, 2)
    return flash_attn_varlen_func(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
        window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
    )  # fmt: skip
