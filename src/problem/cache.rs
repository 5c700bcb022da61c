//! A K/V cache as decoding reads it: K and V in fixed-size pages addressed through a page table,
//! and each sequence's own number of cached keys.
//!
//! Paged, K and V are pools of `num_pages` pages of `page_size` token rows each, laid out as
//! `[num_pages, page_size, num_kv_heads, head_dim]` by the problem's K/V layouts (the layout's
//! batch stride is the page stride); sequence `b`'s key `j` is row `j % page_size` of page
//! `page_table[b · pages_per_seq + j / page_size]`. The page table is a `[batch, pages_per_seq]`
//! u32 tensor. With lengths, sequence `b` has `kv_lens[b] ≤ seq_kv` keys (a `[batch]` u32 tensor;
//! FlashAttention's `seqused_k`), and the causal mask aligns each sequence's new tokens to the
//! end of its own keys: query `i` sees keys `j ≤ i + kv_lens[b] − seq_q`.

use crate::error::{invalid, Error, Result};

/// K/V stored in pages (see the module's documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PagedKv {
    /// Token rows per page: a multiple of 16.
    pub page_size: usize,
    /// Pages in each of the K and V pools.
    pub num_pages: usize,
    /// Columns of the page table: the most pages one sequence may use.
    pub pages_per_seq: usize,
}

/// How a problem's keys are stored: contiguous `[batch, seq_kv, ...]` (the default), or in pages;
/// with every sequence at `seq_kv` keys (the default), or each at its own count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct KvCache {
    /// Paged K/V, or `None` for K/V at their layouts' batch and sequence strides.
    pub paged: Option<PagedKv>,
    /// Whether a `[batch]` u32 tensor gives each sequence's key count (at most `seq_kv`).
    pub lengths: bool,
}

/// Page sizes must be multiples of this many tokens.
pub const PAGE_SIZE_MULTIPLE: usize = 16;

impl KvCache {
    /// Whether the keys are stored as the plain problem says: contiguous, `seq_kv` each.
    pub fn is_plain(&self) -> bool {
        self.paged.is_none() && !self.lengths
    }

    /// Elements of the page table (`batch · pages_per_seq`), 0 when not paged.
    pub fn page_table_len(&self, batch: usize) -> usize {
        self.paged.map_or(0, |p| batch.saturating_mul(p.pages_per_seq))
    }

    /// Checks the paging against the problem's `batch` and `seq_kv`.
    pub(crate) fn validate(&self, batch: usize, seq_kv: usize) -> Result<()> {
        let Some(p) = self.paged else { return Ok(()) };
        if p.page_size == 0 || !p.page_size.is_multiple_of(PAGE_SIZE_MULTIPLE) {
            return invalid!(
                "page size {} is not a positive multiple of {PAGE_SIZE_MULTIPLE} tokens",
                p.page_size
            );
        }
        if p.num_pages == 0 || p.pages_per_seq == 0 {
            return invalid!(
                "a paged cache needs at least one page and one page per sequence (num_pages {}, pages_per_seq {})",
                p.num_pages,
                p.pages_per_seq
            );
        }
        let reach = p.pages_per_seq.saturating_mul(p.page_size);
        if seq_kv > reach {
            return invalid!(
                "seq_kv {seq_kv} exceeds what {} pages of {} tokens per sequence hold ({reach})",
                p.pages_per_seq,
                p.page_size
            );
        }
        for (what, n) in [
            ("num_pages", p.num_pages),
            (
                "page table entries (batch · pages_per_seq)",
                batch.saturating_mul(p.pages_per_seq),
            ),
        ] {
            if n > u32::MAX as usize {
                return Err(Error::TooLarge(format!("{what} = {n} exceeds 32-bit indexing")));
            }
        }
        Ok(())
    }
}
