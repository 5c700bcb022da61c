//! How the sequences of a batch are stored, and the index tensors that say where each one lies:
//! sequences of different lengths packed end to end ([`AttentionProblem::with_varlen`](crate::AttentionProblem::with_varlen),
//! [`Varlen`]), K/V caches as decoding reads them — pages addressed through a page table and
//! per-sequence key counts ([`AttentionProblem::with_paged_kv`](crate::AttentionProblem::with_paged_kv),
//! [`AttentionProblem::with_kv_lengths`](crate::AttentionProblem::with_kv_lengths)) — the host's
//! [`BatchIndex`] of them, and the append of new tokens' K/V
//! ([`FlashAttention::encode_append_kv`](crate::FlashAttention::encode_append_kv)); and the
//! types of the side tensors a [`BatchIndex`] carries for the variants: ALiBi's slope source
//! ([`Alibi`]) and the score bias ([`ScoreBias`], its [`BiasLayout`], its host [`BiasValues`]);
//! and dropout's description ([`Dropout`], with the host's copy of its mask).
//! The public facade over `problem::{varlen, cache, index, head_terms, score_bias, dropout}` and
//! `runtime::append`.

pub use crate::problem::cache::{KvCache, PagedKv, PAGE_SIZE_MULTIPLE};
pub use crate::problem::dropout::Dropout;
pub use crate::problem::head_terms::Alibi;
pub use crate::problem::index::BatchIndex;
pub use crate::problem::score_bias::{BiasLayout, BiasValues, ScoreBias};
pub use crate::problem::varlen::{SequenceRows, Varlen};
pub use crate::runtime::append::AppendBuffers;
