//! How a prefill or backward kernel finds each sequence of its batch: from the problem's sizes
//! alone, or from index tensors it reads (shaders/sequence_indexed.wgsl). Compiled into the
//! kernel, so it is part of every configuration that makes a pipeline.

use crate::problem::AttentionProblem;

/// Which of the batch's index tensors a kernel reads: none for a batch of equal sequences.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SequenceIndex {
    /// The packed row offsets of a variable-length batch (`cu_seqlens_q`, `cu_seqlens_k`).
    pub varlen: bool,
    /// Each sequence's key count (`kv_lens`).
    pub kv_lengths: bool,
}

impl SequenceIndex {
    /// What `problem` needs.
    pub fn of(problem: &AttentionProblem) -> Self {
        SequenceIndex {
            varlen: problem.varlen.is_some(),
            kv_lengths: problem.kv_cache.lengths,
        }
    }

    /// Whether the kernel reads any index tensor (and binds three more buffers).
    pub fn is_indexed(&self) -> bool {
        self.varlen || self.kv_lengths
    }

    /// What a pipeline's name gains: `_varlen`, `_lens`, both or nothing.
    pub fn name_suffix(&self) -> String {
        format!(
            "{}{}",
            if self.varlen { "_varlen" } else { "" },
            if self.kv_lengths { "_lens" } else { "" }
        )
    }
}
