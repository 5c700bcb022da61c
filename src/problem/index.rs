//! The index tensors that say where each sequence of a batch lies, on the host: the packed
//! offsets of a variable-length batch (src/problem/varlen.rs), the page table of a paged cache
//! and the per-sequence key counts (src/problem/cache.rs).

use super::head_terms::check_head_tensor;
use super::mask::check_mask_values;
use super::score_bias::{check_bias_values, BiasValues};
use super::varlen::{validate_offsets, SequenceRows};
use super::AttentionProblem;
use crate::error::{Error, Result};

/// A call's small side tensors on the host, each given exactly when the problem uses it: the
/// batch's index tensors (where its sequences and keys lie) and the per-head terms (ALiBi slopes,
/// sink logits; src/problem/head_terms.rs).
#[derive(Clone, Copy, Debug, Default)]
pub struct BatchIndex<'a> {
    /// `[batch + 1]` query-row offsets of a packed batch ([`AttentionProblem::with_varlen`]).
    pub cu_seqlens_q: Option<&'a [u32]>,
    /// `[batch + 1]` key-row offsets of a packed batch.
    pub cu_seqlens_k: Option<&'a [u32]>,
    /// `[batch, pages_per_seq]` page numbers, when the cache is paged.
    pub page_table: Option<&'a [u32]>,
    /// `[batch]` key counts, when the problem has them.
    pub kv_lens: Option<&'a [u32]>,
    /// `[num_heads]` ALiBi slopes ([`AttentionProblem::with_alibi_slopes`](crate::problem::AttentionProblem::with_alibi_slopes)).
    pub alibi_slopes: Option<&'a [f32]>,
    /// `[num_heads]` sink logits ([`AttentionProblem::with_sinks`]).
    pub sinks: Option<&'a [f32]>,
    /// The score bias ([`AttentionProblem::with_bias`]), in its layout.
    pub bias: Option<BiasValues<'a>>,
    /// The mask ([`AttentionProblem::with_mask`]): its bytes in its layout, 0 hiding a key (a
    /// `bool` tensor's bytes).
    pub mask: Option<&'a [u8]>,
}

impl BatchIndex<'_> {
    /// Checks the tensors against the problem (present exactly when asked for, long enough) and
    /// their values: offsets non-decreasing and within the packed rows, no sequence longer than
    /// `seq_q`/`seq_kv`, page numbers below `num_pages`, counts at most the sequence's keys.
    pub fn validate(&self, problem: &AttentionProblem) -> Result<()> {
        let s = &problem.shape;
        let batch = s.batch;
        let presence = |name: &'static str, given: bool, wanted: bool, call: &str| -> Result<()> {
            let message = match (given, wanted) {
                (true, false) => format!("given for a problem that does not use it ({call})"),
                (false, true) => format!("missing: the problem uses it ({call})"),
                _ => return Ok(()),
            };
            Err(Error::InvalidBuffer { tensor: name, message })
        };
        let varlen = problem.varlen;
        presence(
            "cu_seqlens_q",
            self.cu_seqlens_q.is_some(),
            varlen.is_some(),
            "AttentionProblem::with_varlen",
        )?;
        presence(
            "cu_seqlens_k",
            self.cu_seqlens_k.is_some(),
            varlen.is_some(),
            "AttentionProblem::with_varlen",
        )?;
        let cache = &problem.kv_cache;
        presence(
            "page_table",
            self.page_table.is_some(),
            cache.paged.is_some(),
            "AttentionProblem::with_paged_kv",
        )?;
        presence(
            "kv_lens",
            self.kv_lens.is_some(),
            cache.lengths,
            "AttentionProblem::with_kv_lengths",
        )?;
        let bad = |tensor, message: String| Err(Error::InvalidBuffer { tensor, message });
        check_head_tensor(
            "alibi_slopes",
            self.alibi_slopes,
            problem.has_alibi_tensor(),
            s.num_heads,
        )?;
        check_head_tensor("sinks", self.sinks, problem.sinks, s.num_heads)?;
        check_bias_values(self.bias, problem)?;
        check_mask_values(self.mask, problem)?;

        if let (Some(v), Some(cu_q), Some(cu_k)) = (varlen, self.cu_seqlens_q, self.cu_seqlens_k) {
            validate_offsets("cu_seqlens_q", cu_q, batch, v.total_q, s.seq_q)?;
            // With counts, a sequence's key rows may exceed seq_kv: only its count must not.
            let longest_keys = if cache.lengths { v.total_kv } else { s.seq_kv };
            validate_offsets("cu_seqlens_k", cu_k, batch, v.total_kv, longest_keys)?;
        }
        if let (Some(p), Some(table)) = (cache.paged, self.page_table) {
            let need = batch.saturating_mul(p.pages_per_seq);
            if table.len() < need {
                return bad("page_table", format!("holds {} entries, needs {need}", table.len()));
            }
            if let Some((i, &page)) = table[..need]
                .iter()
                .enumerate()
                .find(|(_, &x)| x as usize >= p.num_pages)
            {
                return bad(
                    "page_table",
                    format!("entry {i} names page {page}, past the pool's {} pages", p.num_pages),
                );
            }
        }
        if let Some(lens) = self.kv_lens {
            if lens.len() < batch {
                return bad("kv_lens", format!("holds {} entries, needs {batch}", lens.len()));
            }
            for (b, &len) in lens[..batch].iter().enumerate() {
                let stored = self.stored_keys(problem, b);
                if len as usize > stored.min(s.seq_kv) {
                    return bad(
                        "kv_lens",
                        format!(
                            "sequence {b} has {len} keys, more than its {} stored keys or seq_kv {}",
                            stored, s.seq_kv
                        ),
                    );
                }
            }
        }
        Ok(())
    }

    /// Key rows stored for sequence `b` before any count applies: its packed rows, or `seq_kv`.
    fn stored_keys(&self, problem: &AttentionProblem, b: usize) -> usize {
        match self.cu_seqlens_k {
            Some(cu) if problem.varlen.is_some() => entry(cu, b.saturating_add(1)).saturating_sub(entry(cu, b)),
            _ => problem.shape.seq_kv,
        }
    }

    /// [`AttentionProblem::flops`] summed over the sequences at their own lengths (a packed
    /// batch computes no padding), for an index validated against `problem` (else as meaningless
    /// as [`sequence`](Self::sequence)'s answer, and no panic either).
    pub fn flops(&self, problem: &AttentionProblem) -> f64 {
        (0..problem.shape.batch)
            .map(|b| {
                let seq = self.sequence(problem, b);
                let mut one = *problem;
                one.shape.batch = 1;
                one.shape.seq_q = seq.seq_q;
                one.shape.seq_kv = seq.seq_kv;
                one.flops()
            })
            .sum()
    }

    /// Where sequence `b` lies, for an index validated against `problem`
    /// ([`validate`](Self::validate)). On one that is not (offsets too short or decreasing, `b`
    /// past the batch) the answer is meaningless but never a panic: entries past a tensor's end
    /// read as 0, and a decreasing pair as an empty sequence.
    pub fn sequence(&self, problem: &AttentionProblem, b: usize) -> SequenceRows {
        let s = &problem.shape;
        let (q_first, seq_q) = match self.cu_seqlens_q {
            Some(cu) => (
                entry(cu, b),
                entry(cu, b.saturating_add(1)).saturating_sub(entry(cu, b)),
            ),
            None => (0, s.seq_q),
        };
        let kv_first = self.cu_seqlens_k.map_or(0, |cu| entry(cu, b));
        let seq_kv = match self.kv_lens {
            Some(lens) => entry(lens, b),
            None => self.stored_keys(problem, b),
        };
        SequenceRows {
            q_first,
            seq_q,
            kv_first,
            seq_kv,
        }
    }
}

/// Entry `i` of an index tensor, 0 past its end (see [`BatchIndex::sequence`]).
fn entry(tensor: &[u32], i: usize) -> usize {
    tensor.get(i).map_or(0, |&x| x as usize)
}
