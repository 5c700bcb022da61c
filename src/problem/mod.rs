//! What an attention call computes: shapes, element type, masking, scale and memory layouts,
//! and the validation that every entry point runs before touching a GPU.

pub mod backward;
pub mod cache;
pub mod dropout;
pub mod features;
pub mod head_terms;
pub mod index;
pub mod mask;
pub mod score_bias;
pub mod softcap;
pub mod varlen;

pub use cache::{KvCache, PagedKv};
pub use dropout::Dropout;
pub use head_terms::Alibi;
pub use index::BatchIndex;
pub use mask::AttentionMask;
pub use score_bias::ScoreBias;
pub use softcap::CapForm;
pub use varlen::{SequenceRows, Varlen};

pub use crate::dtype::{DType, Element};
use crate::error::{check_holds, invalid, Error, Result};

/// The two common orders of a 4-D attention tensor, both with `head_dim` innermost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// `[batch, seq, heads, head_dim]`: FlashAttention's layout, and what a linear projection
    /// produces before any transpose. The default.
    Bshd,
    /// `[batch, heads, seq, head_dim]`: PyTorch's `scaled_dot_product_attention` layout.
    Bhsd,
}

/// Where element `(b, s, h, d)` of one tensor lives: `offset + b·batch_stride + s·seq_stride +
/// h·head_stride + d`, in elements. The last dimension is always contiguous.
///
/// Any strides are accepted for inputs (a stride of 0 broadcasts); the output must not overlap
/// itself. Offsets and strides must be multiples of 4 elements, because the kernels move data in
/// aligned groups of four elements (16 bytes of f32, 8 bytes of f16/bf16).
///
/// Q, K and V packed in one `[batch, seq, 3, heads, head_dim]` buffer (a fused QKV projection's
/// output) are three layouts over the same elements, each `3·heads·head_dim` elements per row:
///
/// ```rust
/// use wgpu_flash_attn::{AttentionProblem, DType, Tensor, TensorLayout};
/// # fn main() -> wgpu_flash_attn::Result<()> {
/// let (batch, seq, heads, head_dim) = (2, 100, 4, 64);
/// let row = 3 * heads * head_dim;
/// let packed = |which: usize| TensorLayout {
///     offset: which * heads * head_dim,
///     batch_stride: seq * row,
///     seq_stride: row,
///     head_stride: head_dim,
/// };
/// let problem = AttentionProblem::mha(batch, seq, heads, head_dim, DType::F16)
///     .with_tensor_layout(Tensor::Q, packed(0))
///     .with_tensor_layout(Tensor::K, packed(1))
///     .with_tensor_layout(Tensor::V, packed(2));
/// problem.validate()?;
/// // Element (b, s, h, d) of K, and the length each binding of the shared buffer needs:
/// assert_eq!(packed(1).index(1, 2, 3, 4), heads * head_dim + seq * row + 2 * row + 3 * head_dim + 4);
/// assert_eq!(problem.required_len(Tensor::V), batch * seq * row);
/// // O keeps its own contiguous [batch, seq, heads, head_dim] buffer.
/// assert_eq!(problem.required_len(Tensor::O), batch * seq * heads * head_dim);
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TensorLayout {
    /// Elements from the start of the buffer (or of the `TensorBuffer`'s
    /// byte offset) to element `(0, 0, 0, 0)`.
    pub offset: usize,
    /// Elements between `(b, s, h, d)` and `(b + 1, s, h, d)`; 0 broadcasts one batch to all.
    pub batch_stride: usize,
    /// Elements between consecutive sequence positions (rows) of one head.
    pub seq_stride: usize,
    /// Elements between consecutive heads at one sequence position.
    pub head_stride: usize,
}

impl TensorLayout {
    /// A densely packed tensor of the given order. Strides that would overflow saturate at
    /// `usize::MAX`, which validation then refuses.
    pub fn contiguous(order: Layout, seq: usize, heads: usize, head_dim: usize) -> Self {
        let mul = usize::saturating_mul;
        match order {
            Layout::Bshd => TensorLayout {
                offset: 0,
                batch_stride: mul(mul(seq, heads), head_dim),
                seq_stride: mul(heads, head_dim),
                head_stride: head_dim,
            },
            Layout::Bhsd => TensorLayout {
                offset: 0,
                batch_stride: mul(mul(heads, seq), head_dim),
                seq_stride: head_dim,
                head_stride: mul(seq, head_dim),
            },
        }
    }

    /// Element index of `(b, s, h, d)`; `usize::MAX` (past every buffer) where that overflows.
    pub fn index(&self, b: usize, s: usize, h: usize, d: usize) -> usize {
        let (add, mul) = (usize::saturating_add, usize::saturating_mul);
        let rows = add(mul(b, self.batch_stride), mul(s, self.seq_stride));
        add(add(add(self.offset, rows), mul(h, self.head_stride)), d)
    }

    /// Number of elements a buffer must hold for a tensor of this extent: one past the last
    /// element, `Some(0)` for an empty tensor (a zero dimension), or `None` if that overflows.
    pub fn required_len(&self, batch: usize, seq: usize, heads: usize, head_dim: usize) -> Option<usize> {
        if batch == 0 || seq == 0 || heads == 0 || head_dim == 0 {
            return Some(0);
        }
        let last = |n: usize, stride: usize| (n - 1).checked_mul(stride);
        self.offset
            .checked_add(last(batch, self.batch_stride)?)?
            .checked_add(last(seq, self.seq_stride)?)?
            .checked_add(last(heads, self.head_stride)?)?
            .checked_add(head_dim)
    }
}

impl TensorLayout {
    /// Checks this layout for a tensor named `name` of extent `(batch, seq, heads, head_dim)`:
    /// offsets and strides in whole granules, an extent the kernels' 32-bit indexing reaches, and,
    /// for a tensor the kernels write (`written`), no two elements at one address. Returns the
    /// number of elements a buffer must hold. `written` is `Some(advice)` for an output, the
    /// advice ending the message when its elements overlap.
    pub(crate) fn check(
        &self,
        name: &str,
        (batch, seq, heads, head_dim): (usize, usize, usize, usize),
        written: Option<&str>,
    ) -> Result<usize> {
        for (what, value) in [
            ("offset", self.offset),
            ("batch_stride", self.batch_stride),
            ("seq_stride", self.seq_stride),
            ("head_stride", self.head_stride),
        ] {
            if value % ELEMENT_ALIGNMENT != 0 {
                return invalid!("tensor `{name}`: {what} {value} is not a multiple of {ELEMENT_ALIGNMENT} elements");
            }
        }
        let Some(len) = self.required_len(batch, seq, heads, head_dim) else {
            return invalid!("tensor `{name}`: its strides address more than usize::MAX elements");
        };
        // The kernels index in groups of four elements with 32-bit integers.
        if len / ELEMENT_ALIGNMENT > u32::MAX as usize {
            return Err(Error::TooLarge(format!(
                "tensor `{name}` spans {len} elements, more than 32-bit indexing reaches"
            )));
        }
        if let Some(advice) = written {
            // Sort the three outer dimensions by stride; each must step past everything inside
            // it, or two elements would share an address (and one workgroup's write clobber
            // another's). Inputs may overlap: a stride of 0 broadcasts.
            let mut dims = [
                (self.head_stride, heads),
                (self.seq_stride, seq),
                (self.batch_stride, batch),
            ];
            dims.sort();
            let mut inner_extent = head_dim;
            for (stride, count) in dims {
                if count > 1 {
                    if stride < inner_extent {
                        return invalid!(
                            "tensor `{name}`: strides (batch {}, seq {}, head {}) make its elements overlap{advice}",
                            self.batch_stride,
                            self.seq_stride,
                            self.head_stride
                        );
                    }
                    // Saturates: a stride past usize::MAX elements already failed `required_len`.
                    inner_extent = stride.saturating_mul(count);
                }
            }
        }
        Ok(len)
    }
}

/// How far a query sees around its own position (see [`AttentionProblem::window`]); `None` on a
/// side means unbounded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Window {
    /// Keys before the query's position it sees.
    pub left: Option<usize>,
    /// Keys after the query's position it sees.
    pub right: Option<usize>,
}

/// The four tensors of the forward pass, for messages and per-tensor settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tensor {
    /// Queries: `seq_q` rows of `num_heads` heads.
    Q,
    /// Keys: `seq_kv` rows of `num_kv_heads` heads.
    K,
    /// Values: `seq_kv` rows of `num_kv_heads` heads.
    V,
    /// The output: `seq_q` rows of `num_heads` heads, the same extent as Q.
    O,
}

impl Tensor {
    /// The lowercase name (`"q"`, `"k"`, `"v"`, `"o"`) that error messages use.
    pub const fn name(self) -> &'static str {
        match self {
            Tensor::Q => "q",
            Tensor::K => "k",
            Tensor::V => "v",
            Tensor::O => "o",
        }
    }
}

/// The sizes of an attention problem.
///
/// `num_heads` query heads share `num_kv_heads` key/value heads (`num_heads % num_kv_heads == 0`):
/// equal counts are multi-head attention, fewer K/V heads grouped-query attention, one K/V head
/// multi-query attention. Query head `h` reads K/V head `h / (num_heads / num_kv_heads)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttentionShape {
    /// Independent sequences; at least 1.
    pub batch: usize,
    /// Query rows per sequence (rows of Q and O); at least 1.
    pub seq_q: usize,
    /// Key/value rows per sequence (rows of K and V); at least 1, independent of `seq_q`.
    pub seq_kv: usize,
    /// Query (and output) heads; a multiple of `num_kv_heads`.
    pub num_heads: usize,
    /// Key/value heads; equal to `num_heads` for MHA, 1 for MQA.
    pub num_kv_heads: usize,
    /// Elements per head vector, shared by Q, K, V and O: a multiple of 8, at most 256.
    pub head_dim: usize,
}

/// Largest supported `head_dim` (a multiple of 8 up to this).
pub const MAX_HEAD_DIM: usize = 256;

/// Granularity, in elements, that offsets and strides must respect (see [`TensorLayout`]).
pub const ELEMENT_ALIGNMENT: usize = 4;

/// The largest |x| whose base-2 form `x·log2 e` is finite in f32, about 2.36e38: the kernels take
/// exp2 of base-2 logits, so a scale, sink logit, ALiBi slope or bias value past it is refused.
pub(crate) const MAX_BASE2_INPUT: f32 = f32::MAX / std::f32::consts::LOG2_E;

/// Whether `x` and its base-2 form `x·log2 e` are both finite (see [`MAX_BASE2_INPUT`]).
pub(crate) fn base2_finite(x: f32) -> bool {
    (x * std::f32::consts::LOG2_E).is_finite()
}

/// One attention call: `O = softmax(scale·QKᵀ [+ causal mask])·V`, per batch and head, plus the
/// natural-log row log-sum-exp `LSE[b, h, i] = log Σⱼ exp(scale·qᵢ·kⱼ)` (f32,
/// `[batch, num_heads, seq_q]` contiguous).
///
/// Build with [`AttentionProblem::new`] and the `with_*` methods; every entry point calls
/// [`validate`](Self::validate), so an inconsistent problem is an [`Error`], never a panic.
///
/// Causal masking follows FlashAttention ≥ 2.1: the mask is aligned to the bottom-right corner,
/// so query `i` sees keys `j ≤ i + seq_kv − seq_q`. When `seq_q > seq_kv` the first
/// `seq_q − seq_kv` query rows see no key at all: their output is 0 and their LSE is −∞.
///
/// Grouped-query attention (32 query heads over 8 K/V heads) on PyTorch's
/// `[batch, heads, seq, head_dim]` tensors, causal, with an explicit scale:
///
/// ```rust
/// use wgpu_flash_attn::{AttentionProblem, AttentionShape, DType, Layout, Tensor};
/// # fn main() -> wgpu_flash_attn::Result<()> {
/// let shape = AttentionShape { batch: 2, seq_q: 256, seq_kv: 1024, num_heads: 32, num_kv_heads: 8, head_dim: 128 };
/// let problem = AttentionProblem::new(shape, DType::BF16)
///     .with_layout(Layout::Bhsd)
///     .with_causal(true)
///     .with_scale(0.1);
/// problem.validate()?;
/// assert_eq!(problem.group_size(), 4); // query head h reads K/V head h / 4
/// assert_eq!(problem.causal_offset(), 768); // query i sees keys 0..=i + 768
/// assert_eq!(problem.required_len(Tensor::Q), 2 * 32 * 256 * 128);
/// assert_eq!(problem.required_len(Tensor::K), 2 * 8 * 1024 * 128);
/// assert_eq!(problem.lse_len(), 2 * 32 * 256);
///
/// // 32 query heads cannot share 6 K/V heads: an error, not a panic.
/// let bad = AttentionProblem::new(AttentionShape { num_kv_heads: 6, ..shape }, DType::BF16);
/// assert!(matches!(bad.validate(), Err(wgpu_flash_attn::Error::InvalidProblem(_))));
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionProblem {
    /// The sizes.
    pub shape: AttentionShape,
    /// Element type of Q, K, V and O in memory (the LSE is always f32).
    pub dtype: DType,
    /// Bottom-right-aligned causal mask: query `i` sees keys `j ≤ i + seq_kv − seq_q`.
    pub causal: bool,
    /// Softmax scale; `None` means `1/sqrt(head_dim)`.
    pub scale: Option<f32>,
    /// Local (sliding-window) attention: query `i` sees keys `j` with
    /// `p − left ≤ j ≤ p + right`, where `p = i + seq_kv − seq_q` is its position aligned to the
    /// end of the keys (FlashAttention's `window_size`); `None` for no window. With `causal`, the
    /// right side is 0 whatever is set.
    pub window: Option<Window>,
    /// Soft-capping of the scores (Gemma 2, Grok): `cap · tanh(scale·q·k / cap)` before the
    /// softmax; `None` for none.
    pub softcap: Option<f32>,
    /// ALiBi's linear position bias, added after the cap: `−slope_h · |p − j|` with `p` the
    /// query's position as for `window` (src/problem/head_terms.rs); `None` for none.
    pub alibi: Option<Alibi>,
    /// Attention sinks: one logit per query head, from a `[num_heads]` f32 tensor given with the
    /// call, joins every row's softmax denominator (src/problem/head_terms.rs).
    pub sinks: bool,
    /// An additive bias over the scores from a tensor given with the call, after ALiBi
    /// (src/problem/score_bias.rs); `None` for none.
    pub bias: Option<ScoreBias>,
    /// Dropout on the attention probabilities (src/problem/dropout.rs): the kept ones scaled by
    /// `1/(1 − p)` before they multiply V; the LSE stays the undropped softmax's. `None` (or
    /// `p = 0`) for none.
    pub dropout: Option<Dropout>,
    /// A boolean (byte) mask tensor given with the call: 0 hides a key, as the causal mask does
    /// (src/problem/mask.rs); `None` for none. With a bias too, both apply.
    pub mask: Option<AttentionMask>,
    /// Whether the call gives a block summary of the mask (or of the bias's −∞ entries), which
    /// lets the kernels skip the key tiles it hides ([`mask::MaskBlocks`]).
    pub mask_blocks: bool,
    /// Where Q's elements are in its buffer.
    pub q_layout: TensorLayout,
    /// Where K's elements are in its buffer.
    pub k_layout: TensorLayout,
    /// Where V's elements are in its buffer.
    pub v_layout: TensorLayout,
    /// Where O is written in its buffer; its elements must not overlap.
    pub o_layout: TensorLayout,
    /// How the keys are stored: contiguous with `seq_kv` each (the default), or paged and/or with
    /// per-sequence counts (src/problem/cache.rs).
    pub kv_cache: KvCache,
    /// Sequences of different lengths packed end to end, or `None` for `[batch, seq, ...]`
    /// tensors (src/problem/varlen.rs).
    pub varlen: Option<Varlen>,
}

impl AttentionProblem {
    /// A non-causal problem with the default scale and all four tensors contiguous in
    /// `[batch, seq, heads, head_dim]` order.
    pub fn new(shape: AttentionShape, dtype: DType) -> Self {
        let mut p = AttentionProblem {
            shape,
            dtype,
            causal: false,
            scale: None,
            window: None,
            softcap: None,
            alibi: None,
            sinks: false,
            bias: None,
            dropout: None,
            mask: None,
            mask_blocks: false,
            q_layout: TensorLayout::contiguous(Layout::Bshd, 0, 0, 0),
            k_layout: TensorLayout::contiguous(Layout::Bshd, 0, 0, 0),
            v_layout: TensorLayout::contiguous(Layout::Bshd, 0, 0, 0),
            o_layout: TensorLayout::contiguous(Layout::Bshd, 0, 0, 0),
            kv_cache: KvCache::default(),
            varlen: None,
        };
        p = p.with_layout(Layout::Bshd);
        p
    }

    /// Multi-head attention with `seq_q == seq_kv` and as many K/V heads as query heads.
    pub fn mha(batch: usize, seq: usize, num_heads: usize, head_dim: usize, dtype: DType) -> Self {
        Self::new(
            AttentionShape {
                batch,
                seq_q: seq,
                seq_kv: seq,
                num_heads,
                num_kv_heads: num_heads,
                head_dim,
            },
            dtype,
        )
    }

    /// Turns the bottom-right-aligned causal mask on or off.
    pub fn with_causal(mut self, causal: bool) -> Self {
        self.causal = causal;
        self
    }

    /// Local attention: each query sees `left` keys before its position and `right` after
    /// ([`AttentionProblem::window`]).
    pub fn with_window(mut self, left: Option<usize>, right: Option<usize>) -> Self {
        self.window = Some(Window { left, right });
        self
    }

    /// Soft-caps the scores at `cap` ([`AttentionProblem::softcap`]); `cap` must be finite and
    /// positive.
    pub fn with_softcap(mut self, cap: f32) -> Self {
        self.softcap = Some(cap);
        self
    }

    /// How the kernels that compile the soft-cap in evaluate it ([`CapForm::of`] the cap; `None`
    /// without one).
    pub fn cap_form(&self) -> Option<CapForm> {
        self.softcap.map(CapForm::of)
    }

    /// Adds ALiBi's position bias with the ALiBi paper's geometric slopes for the head count
    /// ([`AttentionProblem::alibi`]; the kernels compute them).
    pub fn with_geometric_alibi(mut self) -> Self {
        self.alibi = Some(Alibi::Geometric);
        self
    }

    /// Adds ALiBi's position bias with one slope per query head, from the `[num_heads]` f32
    /// `alibi_slopes` tensor the call gives ([`AttentionProblem::alibi`]).
    pub fn with_alibi_slopes(mut self) -> Self {
        self.alibi = Some(Alibi::PerHead);
        self
    }

    /// Adds attention sinks ([`AttentionProblem::sinks`]): the call gives their `[num_heads]`
    /// logits.
    pub fn with_sinks(mut self) -> Self {
        self.sinks = true;
        self
    }

    /// Adds a score bias ([`AttentionProblem::bias`]): the call gives its tensor, of
    /// `bias.dtype`, laid out as `bias.layout` says.
    pub fn with_bias(mut self, bias: ScoreBias) -> Self {
        self.bias = Some(bias);
        self
    }

    /// Adds a mask tensor ([`AttentionProblem::mask`]): the call gives its bytes, laid out as
    /// `mask.layout` says.
    pub fn with_mask(mut self, mask: AttentionMask) -> Self {
        self.mask = Some(mask);
        self
    }

    /// Says that the call gives the block summary of the mask (or, without a mask, of the bias's
    /// −∞ entries) that `FlashAttention::encode_mask_blocks` computed for this problem
    /// ([`AttentionProblem::mask_blocks`], [`mask::MaskBlocks`]); host-slice calls compute it
    /// themselves.
    pub fn with_mask_blocks(mut self) -> Self {
        self.mask_blocks = true;
        self
    }

    /// Adds dropout on the attention probabilities ([`AttentionProblem::dropout`]); give the
    /// backward the same problem, whose mask it regenerates.
    pub fn with_dropout(mut self, dropout: Dropout) -> Self {
        self.dropout = Some(dropout);
        self
    }

    /// The problem's dropout when it drops anything (`p` at least 2⁻¹⁷): what the kernels that
    /// implement it compile in.
    pub fn active_dropout(&self) -> Option<Dropout> {
        self.dropout.filter(Dropout::is_active)
    }

    /// The keys `[begin, end)` query `i` sees in a sequence of `seq_kv` keys, by the causal mask
    /// and the window (both aligned to the end of the keys); empty when it sees none.
    pub fn visible_keys(&self, i: usize, seq_q: usize, seq_kv: usize) -> std::ops::Range<usize> {
        // In 128 bits: every length `usize` holds, unvalidated, and every window side, with no
        // overflow and no bound below 0 (a debug build overflowed, and `clamp` panicked on
        // seq_kv past i64::MAX; found by tests/campaign.rs).
        let position = i as i128 + seq_kv as i128 - seq_q as i128;
        let keys = seq_kv as i128;
        let mut end = keys;
        let mut begin = 0;
        if self.causal {
            end = end.min(position + 1);
        }
        if let Some(w) = self.window {
            if let Some(left) = w.left {
                begin = begin.max(position - left as i128);
            }
            if let (Some(right), false) = (w.right, self.causal) {
                end = end.min(position + right as i128 + 1);
            }
        }
        let end = end.clamp(0, keys);
        let begin = begin.clamp(0, keys).min(end);
        begin as usize..end as usize
    }

    /// The (query, key) pairs the mask and window leave visible, over one sequence of `seq_q`
    /// rows: the sum of [`visible_keys`](Self::visible_keys) over the rows, in closed form. A
    /// row's count is linear in its index between the rows where a window edge or the mask
    /// meets either end of the keys, so each such run is an arithmetic series. (The loop over
    /// rows this replaces took minutes for the 2³¹ rows validation admits, and forever on an
    /// unvalidated length.)
    fn visible_pairs(&self) -> f64 {
        let s = &self.shape;
        let (rows, keys) = (s.seq_q as i128, s.seq_kv as i128);
        let offset = keys - rows;
        let window = self.window.unwrap_or_default();
        let right = if self.causal { Some(0) } else { window.right };
        let mut cuts = vec![0, rows];
        for edge in [0, keys] {
            // Row i's last key is i + offset + right; its first, i + offset − left.
            if let Some(r) = right {
                cuts.push(edge - r as i128 - 1 - offset);
            }
            if let Some(l) = window.left {
                cuts.push(edge + l as i128 - offset);
            }
        }
        let mut cuts: Vec<i128> = cuts.into_iter().map(|c| c.clamp(0, rows)).collect();
        cuts.sort_unstable();
        cuts.dedup();
        let count = |i: i128| self.visible_keys(i as usize, s.seq_q, s.seq_kv).len() as f64;
        cuts.windows(2)
            .map(|w| (count(w[0]) + count(w[1] - 1)) * (w[1] - w[0]) as f64 / 2.0)
            .sum()
    }

    /// Sets the softmax scale (replacing the default `1/sqrt(head_dim)`); it must be finite.
    pub fn with_scale(mut self, scale: f32) -> Self {
        self.scale = Some(scale);
        self
    }

    /// Makes all four tensors contiguous in the given order, each in its own buffer (K and V as
    /// pools of pages when the cache is paged). Set the shape and the cache first: the strides are
    /// computed from them.
    pub fn with_layout(mut self, order: Layout) -> Self {
        let s = self.shape;
        let (q_rows, kv_rows) = match self.varlen {
            Some(v) => (v.total_q, v.total_kv),
            None => (s.seq_q, s.seq_kv),
        };
        self.q_layout = TensorLayout::contiguous(order, q_rows, s.num_heads, s.head_dim);
        let kv_rows = self.kv_cache.paged.map_or(kv_rows, |p| p.page_size);
        self.k_layout = TensorLayout::contiguous(order, kv_rows, s.num_kv_heads, s.head_dim);
        self.v_layout = self.k_layout;
        self.o_layout = self.q_layout;
        self
    }

    /// Packs sequences of different lengths end to end (src/problem/varlen.rs): Q and O become
    /// `[total_q, num_heads, head_dim]`, K and V `[total_kv, num_kv_heads, head_dim]`, contiguous;
    /// `[batch + 1]` u32 offsets (`cu_seqlens_q`, `cu_seqlens_k`) say where each sequence starts.
    /// The shape's `batch` is the number of sequences and `seq_q`/`seq_kv` the longest ones.
    ///
    /// ```rust
    /// use wgpu_flash_attn::batch::{BatchIndex, Varlen};
    /// use wgpu_flash_attn::{AttentionProblem, AttentionShape, DType, Tensor};
    /// # fn main() -> wgpu_flash_attn::Result<()> {
    /// // Three sequences of 5, 0 and 9 tokens, self-attention, causal.
    /// let cu = [0u32, 5, 5, 14];
    /// let shape = AttentionShape { batch: 3, seq_q: 9, seq_kv: 9, num_heads: 8, num_kv_heads: 2, head_dim: 64 };
    /// let problem = AttentionProblem::new(shape, DType::F16)
    ///     .with_causal(true)
    ///     .with_varlen(Varlen { total_q: 14, total_kv: 14 });
    /// let index = BatchIndex { cu_seqlens_q: Some(&cu), cu_seqlens_k: Some(&cu), ..Default::default() };
    /// index.validate(&problem)?;
    /// assert_eq!(problem.required_len(Tensor::Q), 14 * 8 * 64);
    /// assert_eq!(problem.lse_len(), 8 * 14); // [num_heads, total_q]
    /// assert_eq!(index.sequence(&problem, 2).q_first, 5);
    /// # Ok(()) }
    /// ```
    pub fn with_varlen(mut self, varlen: Varlen) -> Self {
        self.varlen = Some(varlen);
        let s = self.shape;
        let packed = |rows, heads| TensorLayout {
            batch_stride: 0,
            ..TensorLayout::contiguous(Layout::Bshd, rows, heads, s.head_dim)
        };
        self.q_layout = packed(varlen.total_q, s.num_heads);
        self.o_layout = self.q_layout;
        if self.kv_cache.paged.is_none() {
            self.k_layout = packed(varlen.total_kv, s.num_kv_heads);
            self.v_layout = self.k_layout;
        }
        self
    }

    /// Stores K and V in pages (`[num_pages, page_size, num_kv_heads, head_dim]` pools addressed
    /// through a `[batch, pages_per_seq]` page table) and makes them contiguous pools in `order`;
    /// Q and O keep their layouts. Only the decode kernel reads paged caches
    /// (src/problem/cache.rs says how keys are found).
    ///
    /// ```rust
    /// use wgpu_flash_attn::batch::PagedKv;
    /// use wgpu_flash_attn::{AttentionProblem, AttentionShape, DType, Layout, Tensor};
    /// # fn main() -> wgpu_flash_attn::Result<()> {
    /// let shape = AttentionShape { batch: 4, seq_q: 1, seq_kv: 4096, num_heads: 32, num_kv_heads: 8, head_dim: 128 };
    /// let pages = PagedKv { page_size: 64, num_pages: 300, pages_per_seq: 64 };
    /// let problem = AttentionProblem::new(shape, DType::F16)
    ///     .with_causal(true)
    ///     .with_paged_kv(pages, Layout::Bshd)
    ///     .with_kv_lengths(true); // each sequence's key count in a [batch] u32 tensor
    /// problem.validate()?;
    /// assert_eq!(problem.required_len(Tensor::K), 300 * 64 * 8 * 128);
    /// assert_eq!(problem.kv_cache.page_table_len(4), 4 * 64);
    /// # Ok(()) }
    /// ```
    pub fn with_paged_kv(mut self, pages: PagedKv, order: Layout) -> Self {
        self.kv_cache.paged = Some(pages);
        let s = self.shape;
        self.k_layout = TensorLayout::contiguous(order, pages.page_size, s.num_kv_heads, s.head_dim);
        self.v_layout = self.k_layout;
        self
    }

    /// Gives each sequence its own key count, at most `seq_kv`, in a `[batch]` u32 tensor
    /// (FlashAttention's `seqused_k`); causal masks align to each sequence's own end.
    pub fn with_kv_lengths(mut self, lengths: bool) -> Self {
        self.kv_cache.lengths = lengths;
        self
    }

    /// Sets one tensor's strides and offset (checked by [`validate`](Self::validate)).
    pub fn with_tensor_layout(mut self, tensor: Tensor, layout: TensorLayout) -> Self {
        *self.layout_mut(tensor) = layout;
        self
    }

    /// One tensor's strides and offset.
    pub fn layout(&self, tensor: Tensor) -> &TensorLayout {
        match tensor {
            Tensor::Q => &self.q_layout,
            Tensor::K => &self.k_layout,
            Tensor::V => &self.v_layout,
            Tensor::O => &self.o_layout,
        }
    }

    fn layout_mut(&mut self, tensor: Tensor) -> &mut TensorLayout {
        match tensor {
            Tensor::Q => &mut self.q_layout,
            Tensor::K => &mut self.k_layout,
            Tensor::V => &mut self.v_layout,
            Tensor::O => &mut self.o_layout,
        }
    }

    /// `(seq, heads)` of a tensor: Q and O have `seq_q` rows of `num_heads`, K and V `seq_kv` rows
    /// of `num_kv_heads`.
    pub fn extent(&self, tensor: Tensor) -> (usize, usize) {
        let s = &self.shape;
        match tensor {
            Tensor::Q | Tensor::O => (s.seq_q, s.num_heads),
            Tensor::K | Tensor::V => (s.seq_kv, s.num_kv_heads),
        }
    }

    /// Elements a buffer holding `tensor` must have: 0 when a dimension is 0 (which
    /// [`validate`](Self::validate) refuses), `usize::MAX` when the layout overflows (refused
    /// too); after validation the exact count.
    pub fn required_len(&self, tensor: Tensor) -> usize {
        let (batch, seq, heads) = self.stored_extent(tensor);
        self.layout(tensor)
            .required_len(batch, seq, heads, self.shape.head_dim)
            .unwrap_or(usize::MAX)
    }

    /// `(batch, seq, heads)` of a tensor as stored: [`extent`](Self::extent) with the batch, for
    /// paged K and V `(num_pages, page_size, num_kv_heads)`, for packed tensors `(1, total rows,
    /// heads)`.
    pub fn stored_extent(&self, tensor: Tensor) -> (usize, usize, usize) {
        match (tensor, self.kv_cache.paged, self.varlen) {
            (Tensor::K | Tensor::V, Some(p), _) => (p.num_pages, p.page_size, self.shape.num_kv_heads),
            (Tensor::Q | Tensor::O, _, Some(v)) => (1, v.total_q, self.shape.num_heads),
            (Tensor::K | Tensor::V, None, Some(v)) => (1, v.total_kv, self.shape.num_kv_heads),
            _ => {
                let (seq, heads) = self.extent(tensor);
                (self.shape.batch, seq, heads)
            }
        }
    }

    /// Elements of the LSE output: `batch · num_heads · seq_q`, or `num_heads · total_q` when
    /// packed (saturating at `usize::MAX`, which validation refuses).
    pub fn lse_len(&self) -> usize {
        let s = &self.shape;
        match self.varlen {
            Some(v) => s.num_heads.saturating_mul(v.total_q),
            None => s.batch.saturating_mul(s.num_heads).saturating_mul(s.seq_q),
        }
    }

    /// Index of row `i` of sequence `seq`, head `h`, in the LSE: `[batch, num_heads, seq_q]`,
    /// or `[num_heads, total_q]` when packed; `usize::MAX` where that overflows.
    pub fn lse_index(&self, b: usize, seq: &SequenceRows, h: usize, i: usize) -> usize {
        let (add, mul) = (usize::saturating_add, usize::saturating_mul);
        match self.varlen {
            Some(v) => add(add(mul(h, v.total_q), seq.q_first), i),
            None => add(mul(add(mul(b, self.shape.num_heads), h), self.shape.seq_q), i),
        }
    }

    /// The softmax scale in use.
    pub fn softmax_scale(&self) -> f32 {
        self.scale.unwrap_or_else(|| 1.0 / (self.shape.head_dim as f32).sqrt())
    }

    /// The softmax scale in base 2 (`scale · log2 e`), as the flash kernels apply it with `exp2`.
    pub fn softmax_scale_log2(&self) -> f32 {
        self.softmax_scale() * std::f32::consts::LOG2_E
    }

    /// `seq_kv − seq_q`: query `i` may see keys `j ≤ i + causal_offset` when causal.
    pub fn causal_offset(&self) -> i64 {
        // In 128 bits, clamped: an unvalidated length may be anything `usize` holds.
        let offset = self.shape.seq_kv as i128 - self.shape.seq_q as i128;
        offset.clamp(i64::MIN as i128, i64::MAX as i128) as i64
    }

    /// Query heads per K/V head.
    pub fn group_size(&self) -> usize {
        self.shape.num_heads / self.shape.num_kv_heads.max(1)
    }

    /// Floating-point operations by the usual convention: `4·B·H·Sq·Skv·D`, halved when causal
    /// (the FlashAttention papers' and PyTorch benchmarks' count); with a sliding window,
    /// `4·B·H·D` times the (query, key) pairs the window and mask leave visible, counted exactly
    /// (a window's point is the work it removes). A packed batch counts here as if every sequence
    /// were the longest; [`BatchIndex::flops`] counts its real lengths.
    pub fn flops(&self) -> f64 {
        let s = &self.shape;
        let per_pair = 4.0 * s.batch as f64 * s.num_heads as f64 * s.head_dim as f64;
        if self.window.is_some() {
            return per_pair * self.visible_pairs();
        }
        let full = per_pair * s.seq_q as f64 * s.seq_kv as f64;
        if self.causal {
            full / 2.0
        } else {
            full
        }
    }

    /// Checks everything that can be checked without a device: no dimension 0, `head_dim` a
    /// multiple of 8 up to 256 ([`Error::UnsupportedHeadDim`]), `num_heads` a multiple of
    /// `num_kv_heads`, a finite scale, offsets and strides multiples of 4 elements, O's elements
    /// not overlapping ([`Error::InvalidProblem`]), and extents within the kernels' 32-bit
    /// indexing ([`Error::TooLarge`]). Every entry point calls this.
    pub fn validate(&self) -> Result<()> {
        let s = &self.shape;
        for (name, value) in [
            ("batch", s.batch),
            ("seq_q", s.seq_q),
            ("seq_kv", s.seq_kv),
            ("num_heads", s.num_heads),
            ("num_kv_heads", s.num_kv_heads),
        ] {
            if value == 0 {
                return invalid!("{name} is 0; every dimension must be at least 1");
            }
        }
        for (name, value) in [
            ("batch", s.batch),
            ("seq_q", s.seq_q),
            ("seq_kv", s.seq_kv),
            ("num_heads", s.num_heads),
        ] {
            if value > i32::MAX as usize {
                return Err(Error::TooLarge(format!(
                    "{name} = {value} exceeds the kernels' 31-bit counters"
                )));
            }
        }
        if s.head_dim == 0 || !s.head_dim.is_multiple_of(8) || s.head_dim > MAX_HEAD_DIM {
            return Err(Error::UnsupportedHeadDim {
                got: s.head_dim,
                max: MAX_HEAD_DIM,
            });
        }
        if !s.num_heads.is_multiple_of(s.num_kv_heads) {
            return invalid!(
                "num_heads ({}) must be a multiple of num_kv_heads ({})",
                s.num_heads,
                s.num_kv_heads
            );
        }
        if let Some(scale) = self.scale {
            if !scale.is_finite() {
                return invalid!("softmax scale {scale} is not finite");
            }
            // The flash kernels apply `scale·log2 e` with exp2: it must be finite too.
            if !self.softmax_scale_log2().is_finite() {
                return invalid!(
                    "softmax scale {scale} is too large: scale·log2(e) overflows f32 (|scale| must be below {:e})",
                    MAX_BASE2_INPUT
                );
            }
        }
        if let Some(v) = self.varlen {
            v.validate()?;
            if self.kv_cache.paged.is_some() {
                return invalid!("a packed (varlen) batch over a paged cache is not supported yet");
            }
        }
        // The LSE (and D in the backward) is indexed with 32-bit integers.
        let lse = (s.batch as u64)
            .checked_mul(s.num_heads as u64)
            .and_then(|n| n.checked_mul(s.seq_q as u64));
        if lse.is_none_or(|n| n > u32::MAX as u64) || self.lse_len() > u32::MAX as usize {
            return Err(Error::TooLarge(format!(
                "the LSE has batch·num_heads·seq_q = {}·{}·{} rows, more than 32-bit indexing reaches",
                s.batch, s.num_heads, s.seq_q
            )));
        }
        if let Some(cap) = self.softcap {
            if !(cap.is_finite() && cap > 0.0) {
                return invalid!("soft-cap {cap} is not a finite positive number");
            }
            // The kernels take the cap in base 2, `cap·log2 e`, as an f32: past f32::MAX / log2 e
            // it is infinite (the scores became NaN: inf · tanh(x / inf)), and below the smallest
            // normal f32 a GPU may flush it to 0, which means "no cap" (found by
            // tests/campaign.rs).
            let base2 = cap * std::f32::consts::LOG2_E;
            if !base2.is_finite() || base2 < f32::MIN_POSITIVE {
                return invalid!(
                    "soft-cap {cap} is out of range: cap·log2(e) must be a normal f32 ({:e} ≤ cap < {:e})",
                    f32::MIN_POSITIVE / std::f32::consts::LOG2_E,
                    f32::MAX / std::f32::consts::LOG2_E
                );
            }
        }
        self.kv_cache.validate(s.batch, s.seq_kv)?;
        if let Some(bias) = self.bias {
            bias.validate(self)?;
        }
        if let Some(mask) = self.mask {
            mask.layout.validate(self, "mask")?;
        }
        if self.mask_blocks {
            mask::MaskBlocks::of(self)?.validate()?;
        }
        if let Some(dropout) = self.dropout {
            dropout.validate()?;
        }
        for tensor in [Tensor::Q, Tensor::K, Tensor::V, Tensor::O] {
            self.validate_layout(tensor)?;
        }
        Ok(())
    }

    fn validate_layout(&self, tensor: Tensor) -> Result<()> {
        let (batch, seq, heads) = self.stored_extent(tensor);
        let extent = (batch, seq, heads, self.shape.head_dim);
        let written = (tensor == Tensor::O).then_some("");
        let kv = matches!(tensor, Tensor::K | Tensor::V);
        check_packed_batch_stride(self, tensor.name(), self.layout(tensor), kv)?;
        self.layout(tensor).check(tensor.name(), extent, written).map(|_| ())
    }
}

/// The inputs of a merge of two partial results on host slices (the float64 reference's and both
/// engines' `merge`): a valid problem, not packed, O slices of its dtype holding its O layout's
/// extent, LSEs of its `[batch, num_heads, seq_q]` rows.
pub(crate) fn check_merge_inputs<T: Element>(
    problem: &AttentionProblem,
    o_a: &[T],
    lse_a: &[f32],
    o_b: &[T],
    lse_b: &[f32],
) -> Result<()> {
    problem.validate()?;
    varlen::refuse_packed(problem, "the merge")?;
    if T::DTYPE != problem.dtype {
        return Err(Error::DTypeMismatch {
            tensor: "o_a",
            expected: problem.dtype,
            got: T::DTYPE,
        });
    }
    let (o_len, lse_len) = (problem.required_len(Tensor::O), problem.lse_len());
    check_holds([
        ("o_a", o_a.len(), o_len),
        ("lse_a", lse_a.len(), lse_len),
        ("o_b", o_b.len(), o_len),
        ("lse_b", lse_b.len(), lse_len),
    ])
}

/// Refuses a batch stride on a packed tensor (a packed batch's Q and O, and its K and V unless
/// paged): its sequences lie end to end along the rows, so no batch dimension exists to stride
/// over. The kernels read such tensors with a batch stride of 0 whatever is set, while the float64
/// reference used it and read past the tensor (an index out of bounds; found by
/// tests/campaign.rs): either would silently disagree with what the caller meant.
pub(crate) fn check_packed_batch_stride(
    problem: &AttentionProblem,
    name: &str,
    layout: &TensorLayout,
    kv: bool,
) -> Result<()> {
    let packed = problem.varlen.is_some() && (!kv || problem.kv_cache.paged.is_none());
    if packed && layout.batch_stride != 0 {
        return invalid!(
            "tensor `{name}` of a packed (varlen) batch has batch_stride {}: its sequences lie end to \
             end along the rows, so the batch stride must be 0",
            layout.batch_stride
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The closed form of the visible pairs equals the sum over rows, on windows, masks and
    /// lengths of every relation; and a length of 2⁶⁰ rows takes no longer.
    #[test]
    fn visible_pairs_match_the_rows() {
        let sides = [None, Some(0), Some(1), Some(3), Some(40), Some(usize::MAX)];
        for (seq_q, seq_kv) in [(1, 1), (7, 30), (30, 7), (33, 33), (5, 100), (100, 5)] {
            for causal in [false, true] {
                for left in sides {
                    for right in sides {
                        let p = AttentionProblem::new(
                            AttentionShape {
                                batch: 1,
                                seq_q,
                                seq_kv,
                                num_heads: 1,
                                num_kv_heads: 1,
                                head_dim: 8,
                            },
                            DType::F32,
                        )
                        .with_causal(causal)
                        .with_window(left, right);
                        let rows: usize = (0..seq_q).map(|i| p.visible_keys(i, seq_q, seq_kv).len()).sum();
                        assert_eq!(
                            p.visible_pairs(),
                            rows as f64,
                            "{seq_q}x{seq_kv} causal {causal} {left:?} {right:?}"
                        );
                    }
                }
            }
        }
        let mut huge = AttentionProblem::mha(1, 1 << 60, 1, 8, DType::F32).with_window(Some(3), Some(0));
        assert_eq!(huge.visible_pairs(), 4.0 * (1u64 << 60) as f64 - 6.0);
        huge.shape.seq_kv = usize::MAX - 3;
        assert_eq!(huge.visible_keys(0, huge.shape.seq_q, huge.shape.seq_kv).len(), 4);
        assert!(huge.flops().is_finite());
    }
    use crate::problem::features::Feature;

    fn shape() -> AttentionShape {
        AttentionShape {
            batch: 2,
            seq_q: 5,
            seq_kv: 7,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 16,
        }
    }

    #[test]
    fn contiguous_layouts_index_every_element_once() {
        for order in [Layout::Bshd, Layout::Bhsd] {
            let l = TensorLayout::contiguous(order, 5, 3, 8);
            let mut seen = vec![false; 2 * 5 * 3 * 8];
            for b in 0..2 {
                for s in 0..5 {
                    for h in 0..3 {
                        for d in 0..8 {
                            let i = l.index(b, s, h, d);
                            assert!(!seen[i], "{order:?} visits {i} twice");
                            seen[i] = true;
                        }
                    }
                }
            }
            assert!(seen.iter().all(|&x| x));
            assert_eq!(l.required_len(2, 5, 3, 8), Some(seen.len()));
        }
    }

    #[test]
    fn validation_names_the_problem() {
        let ok = AttentionProblem::new(shape(), DType::F32);
        ok.validate().unwrap();

        let mut p = ok;
        p.shape.num_kv_heads = 3;
        assert!(p
            .validate()
            .unwrap_err()
            .to_string()
            .contains("multiple of num_kv_heads"));

        let mut p = ok;
        p.shape.seq_q = 0;
        assert!(p.validate().unwrap_err().to_string().contains("seq_q is 0"));

        for bad in [0, 12, 264] {
            let mut p = ok;
            p.shape.head_dim = bad;
            assert!(matches!(p.validate(), Err(Error::UnsupportedHeadDim { got, .. }) if got == bad));
        }

        let p = ok.with_scale(f32::NAN);
        assert!(p.validate().unwrap_err().to_string().contains("not finite"));

        let mut l = ok.k_layout;
        l.seq_stride = 6;
        let msg = ok.with_tensor_layout(Tensor::K, l).validate().unwrap_err().to_string();
        assert!(msg.contains("`k`") && msg.contains("seq_stride 6"), "{msg}");

        // An output whose rows overlap is refused; an input that broadcasts with stride 0 is not.
        let mut l = ok.o_layout;
        l.seq_stride = 8;
        let msg = ok.with_tensor_layout(Tensor::O, l).validate().unwrap_err().to_string();
        assert!(msg.contains("overlap"), "{msg}");
        let mut l = ok.k_layout;
        l.batch_stride = 0;
        ok.with_tensor_layout(Tensor::K, l).validate().unwrap();
    }

    #[test]
    fn windows_bound_the_visible_keys_around_each_position() {
        let p = AttentionProblem::new(shape(), DType::F32); // seq_q 5, seq_kv 7: positions 2..=6
        assert_eq!(p.visible_keys(0, 5, 7), 0..7);
        assert_eq!(p.with_causal(true).visible_keys(0, 5, 7), 0..3);
        let w = p.with_window(Some(1), Some(2));
        assert_eq!(w.visible_keys(0, 5, 7), 1..5);
        assert_eq!(w.visible_keys(4, 5, 7), 5..7);
        // Causal overrides the right side; a window wider than the keys is no window.
        assert_eq!(w.with_causal(true).visible_keys(0, 5, 7), 1..3);
        assert_eq!(p.with_window(Some(100), Some(100)).visible_keys(2, 5, 7), 0..7);
        assert!(p
            .with_window(Some(100), None)
            .features()
            .contains(Feature::SlidingWindow));
        // A window only on the right of a causal problem changes nothing, and asks for nothing.
        assert!(!p
            .with_causal(true)
            .with_window(None, Some(3))
            .features()
            .contains(Feature::SlidingWindow));
        // More queries than keys: the first rows see nothing.
        assert!(p.with_causal(true).visible_keys(0, 9, 3).is_empty());
        // Soft-caps must be finite and positive.
        for cap in [0.0, -1.0, f32::INFINITY, f32::NAN] {
            assert!(p.with_softcap(cap).validate().is_err(), "{cap}");
        }
        p.with_softcap(30.0).validate().unwrap();
    }

    #[test]
    fn flops_and_defaults() {
        let p = AttentionProblem::mha(1, 8, 2, 64, DType::F16);
        assert_eq!(p.flops(), 4.0 * 2.0 * 64.0 * 64.0);
        assert_eq!(p.with_causal(true).flops(), 2.0 * 2.0 * 64.0 * 64.0);
        // A window counts its visible pairs: rows 0..=3 see 1..=4 keys, the other 4 rows 4 each.
        let windowed = p.with_causal(true).with_window(Some(3), None);
        assert_eq!(windowed.flops(), 4.0 * 2.0 * 64.0 * (1 + 2 + 3 + 4 * 5) as f64);
        assert_eq!(p.softmax_scale(), 0.125);
        assert_eq!(p.with_scale(0.5).softmax_scale(), 0.5);
    }
}
