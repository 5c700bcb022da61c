//! Shared by the GPU tests of both engines (tests/common/mod.rs re-exports it for the wgpu ones;
//! the CUDA ones include this file alone): shapes from positional sizes, and batches that are
//! dense or packed (varlen) with their row offsets.
#![allow(dead_code)]

use wgpu_flash_attn::batch::{BatchIndex, Varlen};
use wgpu_flash_attn::{AttentionProblem, AttentionShape, DType};

/// An [`AttentionShape`] from positional sizes, for the tests' case tables.
pub fn shape(
    batch: usize,
    seq_q: usize,
    seq_kv: usize,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
) -> AttentionShape {
    AttentionShape {
        batch,
        seq_q,
        seq_kv,
        num_heads,
        num_kv_heads,
        head_dim,
    }
}

/// A problem and, for a packed batch, its row offsets (empty for a dense one).
pub struct Batch {
    pub problem: AttentionProblem,
    pub cu_q: Vec<u32>,
    pub cu_k: Vec<u32>,
}

impl Batch {
    pub fn dense(problem: AttentionProblem) -> Self {
        Batch {
            problem,
            cu_q: Vec::new(),
            cu_k: Vec::new(),
        }
    }

    /// Sequences of `(seq_q, seq_kv)` packed end to end, `heads` query heads of `head_dim`.
    pub fn packed(lengths: &[(usize, usize)], heads: usize, kv_heads: usize, head_dim: usize, dtype: DType) -> Self {
        let mut cu_q = vec![0u32];
        let mut cu_k = vec![0u32];
        for &(q, k) in lengths {
            cu_q.push(cu_q.last().unwrap() + q as u32);
            cu_k.push(cu_k.last().unwrap() + k as u32);
        }
        let max_q = lengths.iter().map(|l| l.0).max().unwrap();
        let max_k = lengths.iter().map(|l| l.1).max().unwrap();
        let problem = AttentionProblem::new(shape(lengths.len(), max_q, max_k, heads, kv_heads, head_dim), dtype)
            .with_varlen(Varlen {
                total_q: *cu_q.last().unwrap() as usize,
                total_kv: *cu_k.last().unwrap() as usize,
            });
        Batch { problem, cu_q, cu_k }
    }

    /// The index tensors the problem reads: the row offsets of a packed batch, else none.
    pub fn index(&self) -> BatchIndex<'_> {
        if self.cu_q.is_empty() {
            return BatchIndex::default();
        }
        BatchIndex {
            cu_seqlens_q: Some(&self.cu_q),
            cu_seqlens_k: Some(&self.cu_k),
            ..BatchIndex::default()
        }
    }
}
