//! A boolean (byte) mask tensor given with the call, and the block summary that lets the kernels
//! skip the tiles it hides.
//!
//! The mask `M[b, h, i, j]` is one byte per (batch entry, query head, query row, key): 0 hides key
//! `j` from query `i`, any other value shows it — a `bool` or `u8` tensor as PyTorch stores it
//! (`scaled_dot_product_attention`'s boolean `attn_mask`, where true takes part). Its tensor is
//! `[batch | 1, num_heads | 1, seq_q, seq_kv]` at any element strides, laid out as a score bias is
//! ([`BiasLayout`]: a stride of 0 broadcasts), rows and columns counted from each sequence's start
//! (packed batches included). A hidden key is hidden exactly as the causal mask hides it; a row
//! whose every key is hidden gives O = 0 and LSE = −∞ (with sinks, the sink alone: O = 0 and the
//! sink's logit as LSE), and no gradient.
//!
//! A mask and a score bias ([`ScoreBias`]) may be given together (T5's relative bias and a padding
//! mask): the bias is added to every score and the mask hides keys on top — a key is hidden where
//! the mask is 0 or the bias is −∞.
//!
//! # The block summary
//!
//! [`MaskBlocks`] describes a summary of the mask (or, for a problem without one, of its bias's −∞
//! entries) in blocks of [`MASK_BLOCK`] query rows × [`MASK_BLOCK`] keys: for each block of each
//! summarized (batch entry, head), whether every element is hidden, none is, or some are. It is
//! computed once per mask on the device (`FlashAttention::encode_mask_blocks`) into a buffer the
//! caller keeps, and read by every later call that gives it (`ForwardBuffers::mask_blocks`,
//! `BackwardBuffers::mask_blocks`; [`AttentionProblem::with_mask_blocks`]): the kernels then never
//! load the K/V tiles of a query tile whose blocks are all hidden, and do not read the mask for
//! tiles whose blocks are all visible. Dimensions the mask broadcasts are summarized once, so one
//! summary serves every head of a mask shared by the heads. The block size does not depend on any
//! kernel's tiles: a tile covering several blocks is skipped when all of them are hidden, and reads
//! no mask when all are visible.
//!
//! The contract: the summary describes the mask's contents when it was computed. Its size is
//! checked against the problem, and its header holds a key of what it summarized (the mask's or
//! bias's layout and type, the sequence lengths, which dimensions broadcast): a buffer whose key
//! differs from the call's — never computed, or computed for another mask layout or size — is
//! ignored by the kernels, which then visit every tile and read the mask (right, only slower).
//! Writing new values into the mask needs a new summary: with a stale one, tiles it says are
//! hidden are skipped and tiles it says are visible are not masked, whatever the mask now holds.

use super::score_bias::{bias_at, BiasLayout, BiasValues, ScoreBias};
use super::{AttentionProblem, BatchIndex};
use crate::error::{Error, Result};

/// Query rows and keys one block of a [`MaskBlocks`] summary covers, each way. Small enough that a
/// document boundary or a window's edge wastes little, large enough that a summary is 1/1024 of
/// its mask's elements; the tiled kernels' tiles (32 to 128 each way) cover whole blocks.
pub const MASK_BLOCK: usize = 32;

/// u32 words before a summary's block states: [`BLOCKS_MAGIC`], the key of what it summarized,
/// and two reserved words (so that the states start at a 16-byte boundary).
pub const BLOCKS_HEADER_WORDS: usize = 4;

/// The first word of a summary the summary kernel wrote: "MBLK" in little-endian bytes, a word
/// that zeroed or stale memory is unlikely to hold.
pub const BLOCKS_MAGIC: u32 = 0x4b4c_424d;

/// The state of one block of a summary, as stored (one u32 word per block).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum BlockState {
    /// Some elements hidden and some visible (and the meaning of 0: a word nobody wrote reads as
    /// the state that trusts nothing).
    Mixed = 0,
    /// Every element hidden: the kernels skip the block's keys.
    Hidden = 1,
    /// No element hidden: the kernels need not read the mask there.
    Visible = 2,
}

impl BlockState {
    /// The state a summary word holds (anything unknown reads as [`Mixed`](Self::Mixed)).
    pub fn from_word(word: u32) -> Self {
        match word {
            1 => BlockState::Hidden,
            2 => BlockState::Visible,
            _ => BlockState::Mixed,
        }
    }
}

/// A problem's mask tensor ([`AttentionProblem::with_mask`]): one byte per element, 0 hiding its
/// key, at `layout` (in bytes; see the module's documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttentionMask {
    /// Where the mask's bytes lie, as a score bias's elements do.
    pub layout: BiasLayout,
}

impl AttentionMask {
    /// A dense `[batch | 1, num_heads | 1, seq_q, seq_kv]` mask for `problem`: one per batch entry
    /// unless `per_batch` is false, per head unless `per_head` is false (see [`BiasLayout::dense`]).
    pub fn dense(problem: &AttentionProblem, per_batch: bool, per_head: bool) -> Self {
        AttentionMask {
            layout: BiasLayout::dense(problem, per_batch, per_head),
        }
    }

    /// Bytes the mask buffer must hold for `problem` (one past its last element), or `None` when
    /// that overflows.
    pub fn required_len(&self, problem: &AttentionProblem) -> Option<usize> {
        self.layout.required_len(problem)
    }
}

/// What a summary summarizes: the mask, or the bias's −∞ entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Summarized {
    Mask(BiasLayout),
    Bias(ScoreBias),
}

/// The block summary of a problem's mask ([`AttentionMask`]) or, without one, of its bias's −∞
/// entries: its shape, its size, and the key its header carries. See the module's documentation
/// for what it holds and the contract of its use.
///
/// Layout of the buffer, in u32 words: [`BLOCKS_HEADER_WORDS`] of header, then one
/// [`BlockState`] per block at [`state_index`](Self::state_index): `[batches, heads, q_blocks,
/// kv_blocks]`, where `batches` is 1 when the summarized tensor broadcasts over the batch
/// (else `batch`), and `heads` likewise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MaskBlocks {
    summarized: Summarized,
    seq_q: usize,
    seq_kv: usize,
    batches: usize,
    heads: usize,
}

impl MaskBlocks {
    /// The summary of `problem`'s mask, or of its bias when it has no mask. An
    /// [`Error::InvalidProblem`] for a problem with neither.
    pub fn of(problem: &AttentionProblem) -> Result<Self> {
        let (summarized, layout) = match (problem.mask, problem.bias) {
            (Some(m), _) => (Summarized::Mask(m.layout), m.layout),
            (None, Some(b)) => (Summarized::Bias(b), b.layout),
            (None, None) => {
                return crate::error::invalid!(
                    "a block summary summarizes a mask tensor (AttentionProblem::with_mask) or a score bias's −∞ \
                     entries (with_bias); the problem has neither"
                )
            }
        };
        let s = problem.shape;
        let broadcast = |n: usize, stride: usize| if stride == 0 { 1 } else { n };
        Ok(MaskBlocks {
            summarized,
            seq_q: s.seq_q,
            seq_kv: s.seq_kv,
            batches: broadcast(s.batch, layout.batch_stride),
            heads: broadcast(s.num_heads, layout.head_stride),
        })
    }

    /// Whether it summarizes a mask tensor (else a bias).
    pub fn summarizes_mask(&self) -> bool {
        matches!(self.summarized, Summarized::Mask(_))
    }

    /// The batch entries summarized: 1 when the tensor broadcasts over the batch.
    pub fn batches(&self) -> usize {
        self.batches
    }

    /// The heads summarized: 1 when the tensor broadcasts over the heads.
    pub fn heads(&self) -> usize {
        self.heads
    }

    /// Blocks down the query rows: `ceil(seq_q / MASK_BLOCK)`.
    pub fn q_blocks(&self) -> usize {
        self.seq_q.div_ceil(MASK_BLOCK)
    }

    /// Blocks along the keys: `ceil(seq_kv / MASK_BLOCK)`.
    pub fn kv_blocks(&self) -> usize {
        self.seq_kv.div_ceil(MASK_BLOCK)
    }

    /// The strides of the states, in words: between summarized batch entries (0 when they
    /// broadcast), heads (likewise) and rows of blocks.
    pub fn strides(&self) -> (usize, usize, usize) {
        // Saturating: a summary whose buffer size overflows (len_words is None) is refused
        // before any stride is used.
        let row = self.kv_blocks();
        let head = self.q_blocks().saturating_mul(row);
        let batch = self.heads.saturating_mul(head);
        (
            if self.batches > 1 { batch } else { 0 },
            if self.heads > 1 { head } else { 0 },
            row,
        )
    }

    /// Words of the buffer: the header and the states, or `None` when that overflows.
    pub fn len_words(&self) -> Option<usize> {
        [self.heads, self.q_blocks(), self.kv_blocks()]
            .iter()
            .try_fold(self.batches, |acc, &n| acc.checked_mul(n))?
            .checked_add(BLOCKS_HEADER_WORDS)
    }

    /// Bytes of the buffer (`4 · len_words`), saturating.
    pub fn size_bytes(&self) -> u64 {
        self.len_words().map_or(u64::MAX, |w| (w as u64).saturating_mul(4))
    }

    /// Where the state of block (`q_block`, `kv_block`) of batch entry `b` and query head `h` lies
    /// in the buffer, in words (a broadcast dimension reads its one summary whatever `b` or `h`);
    /// `usize::MAX` where that overflows.
    pub fn state_index(&self, b: usize, h: usize, q_block: usize, kv_block: usize) -> usize {
        let (add, mul) = (usize::saturating_add, usize::saturating_mul);
        let (batch, head, row) = self.strides();
        let blocks = add(mul(q_block, row), kv_block);
        add(add(add(BLOCKS_HEADER_WORDS, mul(b, batch)), mul(h, head)), blocks)
    }

    /// The key of what it summarizes (FNV-1a over the block size, the sequence lengths, the
    /// summarized counts, and the summarized tensor's kind, type and layout), which the summary
    /// kernel writes into the header and the attention kernels compare with their own.
    pub fn key(&self) -> u32 {
        let (kind, layout) = match self.summarized {
            Summarized::Mask(l) => (0, l),
            Summarized::Bias(b) => (1 + b.dtype as usize, b.layout),
        };
        let words = [
            MASK_BLOCK,
            self.seq_q,
            self.seq_kv,
            self.batches,
            self.heads,
            kind,
            layout.offset,
            layout.batch_stride,
            layout.head_stride,
            layout.row_stride,
        ];
        let mut hash: u32 = 0x811c_9dc5;
        for w in words {
            for byte in (w as u64).to_le_bytes() {
                hash = (hash ^ byte as u32).wrapping_mul(0x0100_0193);
            }
        }
        hash
    }

    /// The header words a summary of this description starts with.
    pub fn header(&self) -> [u32; BLOCKS_HEADER_WORDS] {
        [BLOCKS_MAGIC, self.key(), 0, 0]
    }

    /// Checks what the kernels index with u32: the words of the buffer.
    pub(crate) fn validate(&self) -> Result<()> {
        match self.len_words() {
            Some(n) if n <= u32::MAX as usize => Ok(()),
            _ => Err(Error::TooLarge(format!(
                "the mask's block summary has {} × {} × {} × {} blocks, more than 32-bit indexing reaches",
                self.batches,
                self.heads,
                self.q_blocks(),
                self.kv_blocks()
            ))),
        }
    }

    /// The summary the device computes, on the host: the buffer's words (header and states) from a
    /// host call's mask or bias values (checked against `problem` first, as
    /// [`BatchIndex::validate`] checks them). To upload instead of computing on the device, or to
    /// check the device's.
    pub fn summarize_host(problem: &AttentionProblem, index: &BatchIndex<'_>) -> Result<Vec<u32>> {
        problem.validate()?;
        let blocks = Self::of(problem)?;
        blocks.validate()?;
        check_mask_values(index.mask, problem)?;
        super::score_bias::check_bias_values(index.bias, problem)?;
        let mut words = vec![0u32; blocks.len_words().unwrap_or(0)];
        words[..BLOCKS_HEADER_WORDS].copy_from_slice(&blocks.header());
        let hidden = |b: usize, h: usize, i: usize, j: usize| match blocks.summarized {
            Summarized::Mask(_) => mask_hides(problem, index.mask, b, h, i, j),
            Summarized::Bias(_) => bias_at(problem, index.bias, b, h, i, j) == f64::NEG_INFINITY,
        };
        for b in 0..blocks.batches {
            for h in 0..blocks.heads {
                for qb in 0..blocks.q_blocks() {
                    for kb in 0..blocks.kv_blocks() {
                        let (mut some_hidden, mut some_visible) = (false, false);
                        for i in qb * MASK_BLOCK..((qb + 1) * MASK_BLOCK).min(blocks.seq_q) {
                            for j in kb * MASK_BLOCK..((kb + 1) * MASK_BLOCK).min(blocks.seq_kv) {
                                if hidden(b, h, i, j) {
                                    some_hidden = true;
                                } else {
                                    some_visible = true;
                                }
                            }
                        }
                        let state = match (some_hidden, some_visible) {
                            (_, false) => BlockState::Hidden,
                            (false, true) => BlockState::Visible,
                            (true, true) => BlockState::Mixed,
                        };
                        words[blocks.state_index(b, h, qb, kb)] = state as u32;
                    }
                }
            }
        }
        Ok(words)
    }
}

/// Checks a host call's mask against the problem: given exactly when the problem has one, and long
/// enough for its layout.
pub(crate) fn check_mask_values(values: Option<&[u8]>, problem: &AttentionProblem) -> Result<()> {
    let error = |message: String| {
        Err(Error::InvalidBuffer {
            tensor: "mask",
            message,
        })
    };
    match (values, problem.mask) {
        (None, None) => Ok(()),
        (Some(_), None) => error("given for a problem without a mask (AttentionProblem::with_mask)".into()),
        (None, Some(_)) => error("missing: the problem has a mask".into()),
        (Some(v), Some(m)) => {
            let need = m.required_len(problem).unwrap_or(usize::MAX);
            if v.len() < need {
                return error(format!("holds {} bytes, the problem needs {need}", v.len()));
            }
            Ok(())
        }
    }
}

/// Whether the checked mask values hide key `j` from query `i` of head `h` in batch entry `b`
/// (never without a mask).
pub(crate) fn mask_hides(
    problem: &AttentionProblem,
    values: Option<&[u8]>,
    b: usize,
    h: usize,
    i: usize,
    j: usize,
) -> bool {
    match (problem.mask, values) {
        (Some(m), Some(v)) => {
            let l = m.layout;
            v[l.offset + b * l.batch_stride + h * l.head_stride + i * l.row_stride + j] == 0
        }
        _ => false,
    }
}

/// The bias and the mask of `(b, h, i, j)` as one term of the score: the bias (0 without one),
/// or −∞ where the mask hides the key. What the float64 reference adds.
pub(crate) fn score_terms(
    problem: &AttentionProblem,
    bias: Option<BiasValues<'_>>,
    mask: Option<&[u8]>,
    b: usize,
    h: usize,
    i: usize,
    j: usize,
) -> f64 {
    if mask_hides(problem, mask, b, h, i, j) {
        f64::NEG_INFINITY
    } else {
        bias_at(problem, bias, b, h, i, j)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::DType;

    #[test]
    fn summaries_broadcast_what_the_mask_broadcasts() {
        let p = AttentionProblem::mha(3, 70, 4, 64, DType::F16);
        let shared = p.with_mask(AttentionMask::dense(&p, false, false));
        let b = MaskBlocks::of(&shared).unwrap();
        assert_eq!((b.batches(), b.heads(), b.q_blocks(), b.kv_blocks()), (1, 1, 3, 3));
        assert_eq!(b.len_words(), Some(BLOCKS_HEADER_WORDS + 9));
        assert_eq!(b.state_index(2, 3, 1, 2), BLOCKS_HEADER_WORDS + 5);
        let per_head = p.with_mask(AttentionMask::dense(&p, false, true));
        let b = MaskBlocks::of(&per_head).unwrap();
        assert_eq!((b.batches(), b.heads()), (1, 4));
        assert_eq!(b.strides(), (0, 9, 3));
        assert_ne!(b.key(), MaskBlocks::of(&shared).unwrap().key());
        assert!(MaskBlocks::of(&p).is_err(), "no mask and no bias");
        // A bias alone is summarized by its −∞ entries.
        let biased = p.with_bias(ScoreBias {
            dtype: DType::BF16,
            layout: BiasLayout::dense(&p, true, false),
        });
        let b = MaskBlocks::of(&biased).unwrap();
        assert!(!b.summarizes_mask());
        assert_eq!((b.batches(), b.heads()), (3, 1));
    }

    #[test]
    fn host_summaries_state_each_block() {
        // 40 × 40, one mask for all: block (0, 0) visible, (0, 1) mixed, (1, 0) hidden, (1, 1)
        // (8 × 8 elements) hidden by the causal-looking pattern below.
        let p = AttentionProblem::mha(1, 40, 2, 64, DType::F32);
        let p = p.with_mask(AttentionMask::dense(&p, false, false));
        let mut mask = vec![1u8; 40 * 40];
        for i in 0..40 {
            for j in 0..40 {
                let hidden = (i >= 32) || (j >= 32 && j > i + 20);
                mask[i * 40 + j] = if hidden { 0 } else { 3 };
            }
        }
        let index = BatchIndex {
            mask: Some(&mask),
            ..BatchIndex::default()
        };
        let words = MaskBlocks::summarize_host(&p, &index).unwrap();
        let b = MaskBlocks::of(&p).unwrap();
        assert_eq!(words[..BLOCKS_HEADER_WORDS], b.header());
        let state = |qb, kb| BlockState::from_word(words[b.state_index(0, 1, qb, kb)]);
        assert_eq!(state(0, 0), BlockState::Visible);
        assert_eq!(state(0, 1), BlockState::Mixed);
        assert_eq!(state(1, 0), BlockState::Hidden);
        assert_eq!(state(1, 1), BlockState::Hidden);
        // Values are checked first.
        let short = BatchIndex {
            mask: Some(&mask[..1599]),
            ..BatchIndex::default()
        };
        assert!(matches!(
            MaskBlocks::summarize_host(&p, &short),
            Err(Error::InvalidBuffer { tensor: "mask", .. })
        ));
    }

    #[test]
    fn bad_masks_are_refused() {
        let p = AttentionProblem::mha(1, 4, 2, 64, DType::F32);
        let dense = AttentionMask::dense(&p, true, true);
        let short_rows = AttentionMask {
            layout: BiasLayout {
                row_stride: 3,
                ..dense.layout
            },
        };
        let err = p.with_mask(short_rows).validate().unwrap_err().to_string();
        assert!(err.contains("mask's row stride"), "{err}");
        let huge = AttentionMask {
            layout: BiasLayout {
                offset: u32::MAX as usize,
                ..dense.layout
            },
        };
        assert!(matches!(p.with_mask(huge).validate(), Err(Error::TooLarge(_))));
        let p = p.with_mask(dense);
        let values = vec![1u8; 32];
        assert!(check_mask_values(Some(&values), &p).is_ok());
        assert!(check_mask_values(None, &p).is_err());
        assert!(check_mask_values(Some(&values[..31]), &p).is_err());
        assert!(check_mask_values(Some(&values), &AttentionProblem::mha(1, 4, 2, 64, DType::F32)).is_err());
        // A summary needs something to summarize.
        let err = AttentionProblem::mha(1, 4, 2, 64, DType::F32)
            .with_mask_blocks()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("block summary"), "{err}");
    }
}
