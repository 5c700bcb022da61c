//! Variable-length batches: sequences of different lengths packed end to end, without padding
//! (FlashAttention's `varlen` calls).
//!
//! Q and O are `[total_q, num_heads, head_dim]` and K and V `[total_kv, num_kv_heads, head_dim]`
//! at their layouts' sequence and head strides (the batch stride is not used). Sequence `b`'s
//! query rows are rows `cu_seqlens_q[b] .. cu_seqlens_q[b + 1]` and its keys rows
//! `cu_seqlens_k[b] .. cu_seqlens_k[b + 1]`, both `[batch + 1]` u32 tensors of non-decreasing
//! offsets; with per-sequence key counts (`seqused_k`) sequence `b` uses only the first
//! `kv_lens[b]` of its key rows. The problem's `seq_q` and `seq_kv` are the longest sequence's
//! lengths (`max_seqlen_q`, `max_seqlen_k`); each sequence is attended as a problem of its own,
//! the causal mask aligned to its own bottom-right corner. The LSE is `[num_heads, total_q]`.

use crate::error::{invalid, Error, Result};

/// Sequences packed end to end (see the module's documentation): the rows of the packed tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Varlen {
    /// Rows of the packed Q and O: at least the last `cu_seqlens_q` entry.
    pub total_q: usize,
    /// Rows of the packed K and V: at least the last `cu_seqlens_k` entry.
    pub total_kv: usize,
}

/// Where one sequence of a batch lies, as a kernel finds it: its first row in the (packed or
/// batched) tensors and its lengths. Dense problems have `q_first = kv_first = 0` and the
/// problem's lengths.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SequenceRows {
    /// Row of Q/O where the sequence starts (0 unless packed).
    pub q_first: usize,
    /// Query rows.
    pub seq_q: usize,
    /// Row of K/V where the sequence's keys start (0 unless packed).
    pub kv_first: usize,
    /// Keys the sequence attends to.
    pub seq_kv: usize,
}

impl Varlen {
    /// Checks the packed extents: at least one row each, within 32-bit row counters.
    pub(crate) fn validate(&self) -> Result<()> {
        for (name, value) in [("total_q", self.total_q), ("total_kv", self.total_kv)] {
            if value == 0 {
                return invalid!("varlen {name} is 0; a packed batch needs at least one row");
            }
            if value > i32::MAX as usize {
                return Err(Error::TooLarge(format!(
                    "varlen {name} = {value} exceeds the kernels' 31-bit counters"
                )));
            }
        }
        Ok(())
    }
}

/// An error for a packed problem given to `what`, which works on `[batch, seq, ...]` rows (the
/// merge, the K/V append).
pub(crate) fn refuse_packed(problem: &super::AttentionProblem, what: &str) -> Result<()> {
    if problem.varlen.is_some() {
        return Err(Error::Unavailable {
            what: what.into(),
            why: "it works on [batch, seq, ...] rows, not on a packed (varlen) batch; give it each sequence as a batch of one".into(),
        });
    }
    Ok(())
}

/// Checks one `[batch + 1]` offsets tensor: long enough, non-decreasing, ending within `total`
/// rows, no sequence longer than `max_len`.
pub(crate) fn validate_offsets(
    name: &'static str,
    offsets: &[u32],
    batch: usize,
    total: usize,
    max_len: usize,
) -> Result<()> {
    let bad = |message: String| Err(Error::InvalidBuffer { tensor: name, message });
    if offsets.len() <= batch {
        return bad(format!(
            "holds {} entries, needs batch + 1 = {}",
            offsets.len(),
            batch.saturating_add(1)
        ));
    }
    for b in 0..batch {
        let (start, end) = (offsets[b] as usize, offsets[b + 1] as usize);
        if end < start {
            return bad(format!("offsets decrease at sequence {b}: {start} then {end}"));
        }
        if end - start > max_len {
            return bad(format!(
                "sequence {b} has {} rows, more than the problem's longest ({max_len})",
                end - start
            ));
        }
    }
    if offsets[batch] as usize > total {
        return bad(format!(
            "ends at row {}, past the packed tensor's {total} rows",
            offsets[batch]
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_must_rise_and_stay_inside() {
        validate_offsets("cu", &[0, 3, 3, 10], 3, 10, 7).unwrap();
        let err = |o: &[u32], total, max| validate_offsets("cu", o, 3, total, max).unwrap_err().to_string();
        assert!(err(&[0, 3, 3], 10, 7).contains("needs batch + 1"));
        assert!(err(&[0, 3, 2, 10], 10, 8).contains("decrease at sequence 1"));
        assert!(err(&[0, 3, 3, 11], 10, 8).contains("past the packed"));
        assert!(err(&[0, 3, 3, 10], 10, 6).contains("sequence 2 has 7 rows"));
        assert!(Varlen {
            total_q: 0,
            total_kv: 1
        }
        .validate()
        .is_err());
    }
}
