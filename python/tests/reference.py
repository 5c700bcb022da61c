"""Float64 attention in NumPy: the forward (O and the LSE) and the gradients, written as plainly as
possible, with FlashAttention's masks (bottom-right causal, windows), soft-capping, GQA and
per-sequence key counts, ALiBi and dropout (given its keep mask). Inputs are taken as they are stored (already rounded to their
dtype)."""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np


def visible(seq_q: int, seq_k: int, causal: bool, window: Tuple[int, int]) -> np.ndarray:
    """``[seq_q, seq_k]`` booleans: key ``j`` is visible to query ``i``. Both the causal mask and the
    window align query ``i`` to key position ``i + seq_k - seq_q``; a negative side is unbounded."""
    i = np.arange(seq_q)[:, None] + seq_k - seq_q
    j = np.arange(seq_k)[None, :]
    ok = np.ones((seq_q, seq_k), dtype=bool)
    left, right = window
    if causal:
        right = 0
    if left >= 0:
        ok &= j >= i - left
    if right >= 0:
        ok &= j <= i + right
    return ok


def _f64(x) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


def alibi_bias(slopes, seq_q: int, seq_k: int) -> np.ndarray:
    """``[h, seq_q, seq_k]``: ALiBi's ``−slope_h · |i + seq_k − seq_q − j|`` (FlashAttention's)."""
    i = np.arange(seq_q)[:, None] + seq_k - seq_q
    j = np.arange(seq_k)[None, :]
    return -_f64(slopes)[:, None, None] * np.abs(i - j)[None]


def applied_p(p: float) -> float:
    """A dropout probability as the library applies it: rounded to a multiple of 2^-16."""
    return round(p * 2**16) / 2**16


def dropped(p: np.ndarray, dropout) -> np.ndarray:
    """The normalized probabilities ``p`` ``[b, h, sq, sk]`` after dropout ``(drop_p, keep)``: kept
    ones (``keep`` ``[b, h, sq, sk]`` bools) scaled by ``1 / (1 − drop_p)``, the others 0."""
    if dropout is None:
        return p
    drop_p, keep = dropout
    return np.where(keep, p / (1.0 - drop_p), 0.0)


def attention(
    q, k, v, *, scale: Optional[float] = None, causal=False, window=(-1, -1), softcap=0.0, alibi_slopes=None,
    dropout=None,
) -> Tuple[np.ndarray, np.ndarray]:
    """O ``[b, sq, h, d]`` and LSE ``[b, h, sq]`` of ``[b, s, h, d]`` inputs; K/V may have fewer heads.
    ``dropout``: ``(drop_p, keep)`` (``dropped``); the LSE stays the undropped softmax's."""
    q, k, v = _f64(q), _f64(k), _f64(v)
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    scale = d**-0.5 if scale is None else scale
    k = np.repeat(k, h // hk, axis=2)
    v = np.repeat(v, h // hk, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap > 0:
        s = softcap * np.tanh(s / softcap)
    if alibi_slopes is not None:
        s = s + alibi_bias(alibi_slopes, sq, sk)[None]
    mask = visible(sq, sk, causal, window)
    s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m_safe)
    l = p.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        o = np.einsum("bhqk,bkhd->bqhd", dropped(np.where(l > 0, p / l, 0.0), dropout), v)
        lse = np.where(l[..., 0] > 0, np.log(l[..., 0]) + m_safe[..., 0], -np.inf)
    return o, lse


def attention_grads(
    q, k, v, d_o, *, scale=None, causal=False, window=(-1, -1), softcap=0.0, alibi_slopes=None, dropout=None
):
    """dQ, dK, dV of ``sum(O * d_o)``; dK and dV summed over the query heads sharing a K/V head."""
    q, k, v, d_o = _f64(q), _f64(k), _f64(v), _f64(d_o)
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    g = h // hk
    scale = d**-0.5 if scale is None else scale
    ke, ve = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    raw = np.einsum("bqhd,bkhd->bhqk", q, ke) * scale
    s = softcap * np.tanh(raw / softcap) if softcap > 0 else raw
    if alibi_slopes is not None:
        s = s + alibi_bias(alibi_slopes, sq, sk)[None]
    mask = visible(sq, sk, causal, window)
    s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m)
    l = p.sum(axis=-1, keepdims=True)
    p = np.where(l > 0, p / np.where(l > 0, l, 1.0), 0.0)
    z = dropped(p, dropout)
    dv = np.einsum("bhqk,bqhd->bkhd", z, d_o)
    # d(loss)/dP through the dropout: dZ = dO·Vᵀ, zero where dropped, scaled where kept.
    dp = dropped(np.einsum("bqhd,bkhd->bhqk", d_o, ve), dropout)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    if softcap > 0:
        ds = ds * (1.0 - np.tanh(raw / softcap) ** 2)
    dq = np.einsum("bhqk,bkhd->bqhd", ds, ke) * scale
    dk = np.einsum("bhqk,bqhd->bkhd", ds, q) * scale
    fold = lambda x: x.reshape(b, sk, hk, g, d).sum(axis=3)  # noqa: E731
    return dq, fold(dk), fold(dv)


def rel_l2(out, ref) -> float:
    """``‖out − ref‖₂ / ‖ref‖₂`` in float64, or ``‖out − ref‖₂`` where the reference is 0 (the
    gradient of a one-key softmax); NaN in ``out`` gives NaN, which fails every bound."""
    out, ref = _f64(out), _f64(ref)
    norm = np.linalg.norm(ref.ravel())
    return float(np.linalg.norm((out - ref).ravel()) / (norm if norm > 1e-12 else 1.0))
