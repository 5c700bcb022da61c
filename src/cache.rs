//! K/V caches as decoding reads them: pages addressed through a page table, per-sequence key
//! counts ([`AttentionProblem::with_paged_kv`](crate::AttentionProblem::with_paged_kv),
//! [`AttentionProblem::with_kv_lengths`](crate::AttentionProblem::with_kv_lengths)), and the
//! append of new tokens' K/V ([`FlashAttention::encode_append_kv`](crate::FlashAttention::encode_append_kv)).
//! The public facade over `problem::cache` and `runtime::append`.

pub use crate::problem::cache::{CacheIndex, KvCache, PagedKv, PAGE_SIZE_MULTIPLE};
pub use crate::runtime::append::AppendBuffers;
