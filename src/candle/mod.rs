//! A drop-in for [candle-flash-attn](https://docs.rs/candle-flash-attn): its functions, with its
//! names, arguments and shapes, on any device (feature `candle`).
//!
//! ```no_run
//! use candle_core::{DType, Device, Tensor};
//! use wgpu_flash_attn::candle::{flash_attn, flash_attn_varlen_lse, flash_attn_windowed};
//! # fn main() -> candle_core::Result<()> {
//! let q = Tensor::randn(0f32, 1.0, (2, 1024, 32, 128), &Device::Cpu)?.to_dtype(DType::BF16)?;
//! let kv = Tensor::randn(0f32, 1.0, (2, 1024, 8, 128), &Device::Cpu)?.to_dtype(DType::BF16)?;
//! let out = flash_attn(&q, &kv, &kv, 128f32.powf(-0.5), true)?;          // causal, GQA 32/8
//! let local = flash_attn_windowed(&q, &kv, &kv, 0.088, Some(256), Some(0))?; // sliding window
//! let (packed, seqlens) = (q.reshape((2048, 32, 128))?, Tensor::new(&[0u32, 700, 2048], &Device::Cpu)?);
//! let kv_packed = kv.reshape((2048, 8, 128))?;
//! let (out, lse) = flash_attn_varlen_lse(&packed, &kv_packed, &kv_packed, &seqlens, &seqlens, 1348, 1348, 0.088, true)?;
//! # Ok(()) }
//! ```
//!
//! (The README's example.)
//!
//! * **Where it runs.** Tensors in CPU memory run on the wgpu engine (a GPU that wgpu reaches, or
//!   a CPU Vulkan driver): f32, f16 and bf16. One engine serves the program, created at the first
//!   call ([`wgpu_engine`]); `FLASH_ADAPTER=<part of a name>` picks the adapter. With the feature
//!   `candle-cuda`, tensors in CUDA memory run on our CUDA kernels (f16, bf16) on the stream of
//!   the candle device that holds them, reading candle's buffers in place. It needs a CUDA toolkit
//!   at build time, as candle's CUDA backend does (docs/candle.md).
//! * **Tensors.** `q` is `[batch, seq_q, num_heads, head_dim]`, `k` and `v`
//!   `[batch, seq_kv, num_kv_heads, head_dim]` (`num_heads` a multiple of `num_kv_heads`:
//!   grouped-query and multi-query attention), `head_dim` a multiple of 8 up to 256; the varlen
//!   calls take `[total rows, heads, head_dim]` packed tensors and `[batch + 1]` u32 offsets.
//!   Views (transposes, narrows, a fused QKV projection's parts) are read in place when the last
//!   dimension is contiguous and the other strides and the start are multiples of 4 elements;
//!   other views are copied first.
//! * **Masks.** `causal` is FlashAttention's bottom-right-aligned mask (query `i` sees keys up to
//!   `i + seq_kv − seq_q`); `window_size_left/right` are its sliding window, a side past `seq_kv`
//!   (`max_seqlen_k` when packed) or `None` unbounded, `(None, Some(0))` the causal mask. Rows
//!   that see no key give 0 (and LSE −∞).
//! * **The LSE.** The `_lse` twins also return each row's natural-log log-sum-exp of the scaled
//!   scores, f32 `[batch, num_heads, seq_q]` (`[num_heads, total_q]` packed), on the output's
//!   device: what candle-flash-attn computes and drops, and what merging partial results needs
//!   (`wgpu_flash_attn::FlashAttention::merge`).
//! * **ALiBi.** The `*alibi*` functions take candle-flash-attn's `alibi_slopes`: one slope per
//!   query head, `[num_heads]` (f32; other float types are converted, and slopes on another
//!   device than `q` are moved to it), adding `−slope·|i + seq_kv − seq_q − j|` to the scaled
//!   scores (after the soft-cap, as FlashAttention does).
//! * **Not yet:** paged K/V (`flash_attn_varlen_paged_windowed`). Gradients: candle's backward
//!   through these calls is an error, as through candle-flash-attn's.
//!
//! Every refusal is a [`candle_core::Error`] naming the function, with the library's own message
//! where the library refused: never a panic.

mod cpu;
#[cfg(feature = "candle-cuda")]
mod cuda;
mod op;
mod problem;

use candle_core::{Result, Tensor};

use op::{run, FlashAttnOp, Packed};
use problem::{refuse, Args};

/// The wgpu engine that CPU tensors run on, created at its first use on the best adapter
/// (`FLASH_ADAPTER=<part of a name>` picks another): what it runs on
/// (`wgpu_engine()?.context().info`), and a way to build its pipelines before the first call.
/// Where there is no adapter, that error, at every call.
pub fn wgpu_engine() -> Result<&'static crate::runtime::forward::FlashAttention> {
    cpu::engine()
}

/// The mask arguments of a causal flag, as candle-flash-attn passes them on.
fn causal_window(causal: bool) -> (Option<usize>, Option<usize>) {
    (None, causal.then_some(0))
}

/// candle-flash-attn's soft-cap argument: 0 is none.
fn softcap(cap: f32) -> Option<f32> {
    (cap != 0.0).then_some(cap)
}

/// ALiBi slopes as the routes read them: f32, contiguous, on `q`'s device. Their count is
/// checked against the heads with the rest of the problem.
fn alibi(function: &str, slopes: &Tensor, q: &Tensor) -> Result<Tensor> {
    if slopes.rank() != 1 {
        return Err(refuse(
            function,
            format!(
                "alibi_slopes must be [num_heads], one slope per query head; it is {:?}",
                slopes.dims()
            ),
        ));
    }
    slopes
        .to_dtype(candle_core::DType::F32)?
        .to_device(q.device())?
        .contiguous()
}

/// One call: O, and the LSE when `lse`. `packed`: a packed batch's offsets ([`offsets`]), `None`
/// for `[batch, seq, heads, head_dim]` tensors; `alibi_slopes`: candle-flash-attn's slopes.
fn call(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    packed: Option<Packed>,
    alibi_slopes: Option<&Tensor>,
    mut args: Args,
    lse: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    let alibi_slopes = alibi_slopes.map(|s| alibi(args.function, s, q)).transpose()?;
    args.alibi_heads = alibi_slopes.as_ref().map(|s| s.elem_count());
    let op = FlashAttnOp {
        args,
        packed,
        alibi_slopes,
        lse: lse.then(Default::default),
    };
    run(q, k, v, op)
}

/// A packed batch's offsets and longest sequences, as the varlen calls take them.
fn offsets(seqlens_q: &Tensor, seqlens_k: &Tensor, max_seqlen_q: usize, max_seqlen_k: usize) -> Option<Packed> {
    Some(Packed {
        seqlens_q: seqlens_q.clone(),
        seqlens_k: seqlens_k.clone(),
        max_seqlen_q,
        max_seqlen_k,
    })
}

/// The LSE of a call that asked for it.
fn with_lse(function: &str, (out, lse): (Tensor, Option<Tensor>)) -> Result<(Tensor, Tensor)> {
    let lse = lse.ok_or_else(|| refuse(function, "no LSE came back (a bug)"))?;
    Ok((out, lse))
}

fn args(
    function: &'static str,
    softmax_scale: f32,
    (window_size_left, window_size_right): (Option<usize>, Option<usize>),
    softcap: Option<f32>,
) -> Args {
    Args {
        function,
        softmax_scale,
        window_size_left,
        window_size_right,
        softcap,
        alibi_heads: None,
    }
}

/// `softmax(q·kᵀ·softmax_scale [+ causal mask])·v`: `q` `[batch, seq_q, num_heads, head_dim]`, `k`
/// and `v` `[batch, seq_kv, num_kv_heads, head_dim]`; the output has `q`'s shape. candle-flash-attn's
/// `flash_attn` (the [module](self) says where it runs and what it takes).
pub fn flash_attn(q: &Tensor, k: &Tensor, v: &Tensor, softmax_scale: f32, causal: bool) -> Result<Tensor> {
    let args = args("flash_attn", softmax_scale, causal_window(causal), None);
    Ok(call(q, k, v, None, None, args, false)?.0)
}

/// [`flash_attn`], also returning the LSE, f32 `[batch, num_heads, seq_q]`.
pub fn flash_attn_lse(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    softmax_scale: f32,
    causal: bool,
) -> Result<(Tensor, Tensor)> {
    let args = args("flash_attn_lse", softmax_scale, causal_window(causal), None);
    with_lse("flash_attn_lse", call(q, k, v, None, None, args, true)?)
}

/// [`flash_attn`] over a sliding window: query `i` (at position `p = i + seq_kv − seq_q`) sees
/// keys `p − window_size_left ..= p + window_size_right`; `None` or a size past `seq_kv` leaves
/// a side unbounded, and `(None, Some(0))` is the causal mask. candle-flash-attn's
/// `flash_attn_windowed`.
pub fn flash_attn_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
) -> Result<Tensor> {
    let args = args(
        "flash_attn_windowed",
        softmax_scale,
        (window_size_left, window_size_right),
        None,
    );
    Ok(call(q, k, v, None, None, args, false)?.0)
}

/// [`flash_attn_windowed`], also returning the LSE, f32 `[batch, num_heads, seq_q]`.
pub fn flash_attn_windowed_lse(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
) -> Result<(Tensor, Tensor)> {
    let args = args(
        "flash_attn_windowed_lse",
        softmax_scale,
        (window_size_left, window_size_right),
        None,
    );
    with_lse("flash_attn_windowed_lse", call(q, k, v, None, None, args, true)?)
}

/// [`flash_attn`] with ALiBi: `−slope·|i + seq_kv − seq_q − j|` added to query head `h`'s scaled
/// scores, `alibi_slopes` `[num_heads]` f32. candle-flash-attn's `flash_attn_alibi`.
pub fn flash_attn_alibi(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: &Tensor,
    softmax_scale: f32,
    causal: bool,
) -> Result<Tensor> {
    let args = args("flash_attn_alibi", softmax_scale, causal_window(causal), None);
    Ok(call(q, k, v, None, Some(alibi_slopes), args, false)?.0)
}

/// [`flash_attn_windowed`] with ALiBi ([`flash_attn_alibi`]). candle-flash-attn's
/// `flash_attn_alibi_windowed`.
pub fn flash_attn_alibi_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: &Tensor,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
) -> Result<Tensor> {
    let args = args(
        "flash_attn_alibi_windowed",
        softmax_scale,
        (window_size_left, window_size_right),
        None,
    );
    Ok(call(q, k, v, None, Some(alibi_slopes), args, false)?.0)
}

/// [`flash_attn_windowed`] with Gemma's soft-cap of the scores, `softcap·tanh(s / softcap)` (0
/// for none), and ALiBi when `alibi_slopes` is given (added after the cap):
/// candle-flash-attn's `flash_attn_alibi_windowed_softcap`.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_alibi_windowed_softcap(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: Option<&Tensor>,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    softcap: f32,
) -> Result<Tensor> {
    let args = args(
        "flash_attn_alibi_windowed_softcap",
        softmax_scale,
        (window_size_left, window_size_right),
        self::softcap(softcap),
    );
    Ok(call(q, k, v, None, alibi_slopes, args, false)?.0)
}

/// [`flash_attn`] on a packed batch of sequences of different lengths: `q`
/// `[total_q, num_heads, head_dim]`, `k` and `v` `[total_kv, num_kv_heads, head_dim]`,
/// sequence `b`'s rows from `seqlens_q[b]` to `seqlens_q[b + 1]` (u32 `[batch + 1]`, likewise
/// `seqlens_k`), none longer than `max_seqlen_q` / `max_seqlen_k`; causal aligns to each
/// sequence's own end. The output has `q`'s shape. On CPU tensors the offsets are checked
/// before the call (an error); on CUDA the kernels check them as they read them, and a
/// sequence whose offsets are wrong comes back NaN. candle-flash-attn's `flash_attn_varlen`.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    causal: bool,
) -> Result<Tensor> {
    let args = args("flash_attn_varlen", softmax_scale, causal_window(causal), None);
    let batch = offsets(seqlens_q, seqlens_k, max_seqlen_q, max_seqlen_k);
    let out = call(q, k, v, batch, None, args, false)?;
    Ok(out.0)
}

/// [`flash_attn_varlen`], also returning the LSE, f32 `[num_heads, total_q]`.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_lse(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    causal: bool,
) -> Result<(Tensor, Tensor)> {
    let args = args("flash_attn_varlen_lse", softmax_scale, causal_window(causal), None);
    let batch = offsets(seqlens_q, seqlens_k, max_seqlen_q, max_seqlen_k);
    let out = call(q, k, v, batch, None, args, true)?;
    with_lse("flash_attn_varlen_lse", out)
}

/// [`flash_attn_varlen`] over a sliding window, each sequence's aligned to its own end (see
/// [`flash_attn_windowed`]; a side past `max_seqlen_k` is unbounded). candle-flash-attn's
/// `flash_attn_varlen_windowed`.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
) -> Result<Tensor> {
    let args = args(
        "flash_attn_varlen_windowed",
        softmax_scale,
        (window_size_left, window_size_right),
        None,
    );
    let batch = offsets(seqlens_q, seqlens_k, max_seqlen_q, max_seqlen_k);
    let out = call(q, k, v, batch, None, args, false)?;
    Ok(out.0)
}

/// [`flash_attn_varlen_windowed`], also returning the LSE, f32 `[num_heads, total_q]`.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_windowed_lse(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
) -> Result<(Tensor, Tensor)> {
    let args = args(
        "flash_attn_varlen_windowed_lse",
        softmax_scale,
        (window_size_left, window_size_right),
        None,
    );
    let batch = offsets(seqlens_q, seqlens_k, max_seqlen_q, max_seqlen_k);
    let out = call(q, k, v, batch, None, args, true)?;
    with_lse("flash_attn_varlen_windowed_lse", out)
}

/// [`flash_attn_varlen`] with ALiBi ([`flash_attn_alibi`]; positions within each sequence).
/// candle-flash-attn's `flash_attn_varlen_alibi`.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_alibi(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    causal: bool,
) -> Result<Tensor> {
    let args = args("flash_attn_varlen_alibi", softmax_scale, causal_window(causal), None);
    let batch = offsets(seqlens_q, seqlens_k, max_seqlen_q, max_seqlen_k);
    let out = call(q, k, v, batch, Some(alibi_slopes), args, false)?;
    Ok(out.0)
}

/// [`flash_attn_varlen_windowed`] with ALiBi ([`flash_attn_alibi`]). candle-flash-attn's
/// `flash_attn_varlen_alibi_windowed`.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_alibi_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
) -> Result<Tensor> {
    let args = args(
        "flash_attn_varlen_alibi_windowed",
        softmax_scale,
        (window_size_left, window_size_right),
        None,
    );
    let batch = offsets(seqlens_q, seqlens_k, max_seqlen_q, max_seqlen_k);
    let out = call(q, k, v, batch, Some(alibi_slopes), args, false)?;
    Ok(out.0)
}

/// [`flash_attn_varlen_windowed`] with Gemma's soft-cap (0 for none) and ALiBi when
/// `alibi_slopes` is given: candle-flash-attn's `flash_attn_varlen_alibi_windowed_softcap`.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_alibi_windowed_softcap(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: Option<&Tensor>,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    softcap: f32,
) -> Result<Tensor> {
    let args = args(
        "flash_attn_varlen_alibi_windowed_softcap",
        softmax_scale,
        (window_size_left, window_size_right),
        self::softcap(softcap),
    );
    let batch = offsets(seqlens_q, seqlens_k, max_seqlen_q, max_seqlen_k);
    let out = call(q, k, v, batch, alibi_slopes, args, false)?;
    Ok(out.0)
}
