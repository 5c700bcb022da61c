//! How the sequences of a batch are stored, and the index tensors that say where each one lies:
//! sequences of different lengths packed end to end ([`AttentionProblem::with_varlen`](crate::AttentionProblem::with_varlen),
//! [`Varlen`]), K/V caches as decoding reads them — pages addressed through a page table and
//! per-sequence key counts ([`AttentionProblem::with_paged_kv`](crate::AttentionProblem::with_paged_kv),
//! [`AttentionProblem::with_kv_lengths`](crate::AttentionProblem::with_kv_lengths)) — the host's
//! [`BatchIndex`] of them, and the append of new tokens' K/V
//! ([`FlashAttention::encode_append_kv`](crate::FlashAttention::encode_append_kv)); and the
//! types of the side tensors a [`BatchIndex`] carries for the variants: ALiBi's slope source
//! ([`Alibi`]), how compiled kernels evaluate a soft-cap ([`CapForm`]), the score bias ([`ScoreBias`], its [`BiasLayout`], its host [`BiasValues`]), the
//! mask tensor ([`AttentionMask`], at a [`BiasLayout`] too) and its block summary ([`MaskBlocks`]
//! of [`MASK_BLOCK`]-square [`BlockState`]s, computed by
//! [`FlashAttention::encode_mask_blocks`](crate::FlashAttention::encode_mask_blocks)); and
//! dropout's description ([`Dropout`], with the host's copy of its mask).
//! The public facade over
//! `problem::{varlen, cache, index, head_terms, score_bias, softcap, mask, dropout}`
//! and `runtime::append`.

pub use crate::problem::cache::{KvCache, PagedKv, PAGE_SIZE_MULTIPLE};
pub use crate::problem::dropout::Dropout;
pub use crate::problem::head_terms::Alibi;
pub use crate::problem::index::BatchIndex;
pub use crate::problem::mask::{AttentionMask, BlockState, MaskBlocks, BLOCKS_HEADER_WORDS, BLOCKS_MAGIC, MASK_BLOCK};
pub use crate::problem::score_bias::{BiasLayout, BiasValues, ScoreBias};
pub use crate::problem::softcap::CapForm;
pub use crate::problem::varlen::{SequenceRows, Varlen};
pub use crate::runtime::append::AppendBuffers;
