//! A call's side tensors on the device: the batch's index tensors (packed offsets, page table,
//! key counts) and the variants' tensors (ALiBi slopes, sinks, bias, mask and its block summary)
//! as the caller's buffers give them ([`IndexBuffers`]), as a host call uploads them
//! ([`UploadedIndex`], from a [`BatchIndex`]), and bound for the kernels, checked against the
//! problem and the tensors the call writes ([`IndexBindings`]).

use crate::caps::Caps;
use crate::device::context::GpuContext;
use crate::error::{Error, Result};
use crate::gpu::binding::{bind_f32, check_buffer_size, check_written_apart_from_read, Bound, TensorBuffer};
use crate::gpu::readback::upload_queued;
use crate::plan::MaskBinding;
use crate::problem::index::BatchIndex;
use crate::problem::mask::MaskBlocks;
use crate::problem::AttentionProblem;

/// The side tensors of a call (see [`ForwardBuffers`]), each given when the problem uses it: the
/// batch's index tensors and the per-head tensors.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct IndexBuffers<'a> {
    pub cu_seqlens_q: Option<TensorBuffer<'a>>,
    pub cu_seqlens_k: Option<TensorBuffer<'a>>,
    pub page_table: Option<TensorBuffer<'a>>,
    pub kv_lens: Option<TensorBuffer<'a>>,
    pub alibi_slopes: Option<TensorBuffer<'a>>,
    pub sinks: Option<TensorBuffer<'a>>,
    pub bias: Option<TensorBuffer<'a>>,
    pub mask: Option<TensorBuffer<'a>>,
    pub mask_blocks: Option<TensorBuffer<'a>>,
}

/// A host call's side tensors, uploaded.
pub(crate) struct UploadedIndex {
    cu_seqlens_q: Option<wgpu::Buffer>,
    cu_seqlens_k: Option<wgpu::Buffer>,
    page_table: Option<wgpu::Buffer>,
    kv_lens: Option<wgpu::Buffer>,
    alibi_slopes: Option<wgpu::Buffer>,
    sinks: Option<wgpu::Buffer>,
    bias: Option<wgpu::Buffer>,
    mask: Option<wgpu::Buffer>,
    /// Written by the summary kernel before the call reads it (src/runtime/mask_blocks.rs).
    pub(crate) mask_blocks: Option<wgpu::Buffer>,
}

impl UploadedIndex {
    pub fn buffers(&self) -> IndexBuffers<'_> {
        IndexBuffers {
            cu_seqlens_q: self.cu_seqlens_q.as_ref().map(TensorBuffer::new),
            cu_seqlens_k: self.cu_seqlens_k.as_ref().map(TensorBuffer::new),
            page_table: self.page_table.as_ref().map(TensorBuffer::new),
            kv_lens: self.kv_lens.as_ref().map(TensorBuffer::new),
            alibi_slopes: self.alibi_slopes.as_ref().map(TensorBuffer::new),
            sinks: self.sinks.as_ref().map(TensorBuffer::new),
            bias: self.bias.as_ref().map(TensorBuffer::new),
            mask: self.mask.as_ref().map(TensorBuffer::new),
            mask_blocks: self.mask_blocks.as_ref().map(TensorBuffer::new),
        }
    }
}

/// The checked bindings of a call's side tensors (placeholders where the problem has none).
pub(crate) struct IndexBindings<'a> {
    pub cu_seqlens_q: Bound<'a>,
    pub cu_seqlens_k: Bound<'a>,
    pub page_table: Bound<'a>,
    pub kv_lens: Bound<'a>,
    pub alibi_slopes: Bound<'a>,
    pub sinks: Bound<'a>,
    pub bias: Bound<'a>,
    pub mask: Bound<'a>,
    pub mask_blocks: Bound<'a>,
}

impl IndexBindings<'_> {
    /// The entries of the prefill and backward kernels' index bindings, from `first` on
    /// (shaders/sequence_indexed.wgsl).
    pub fn sequence_entries(&self, first: u32) -> [wgpu::BindGroupEntry<'_>; 3] {
        [
            self.cu_seqlens_q.entry(first),
            self.cu_seqlens_k.entry(first + 1),
            self.kv_lens.entry(first + 2),
        ]
    }

    /// The entries of the per-head tensors, from `first` on (shaders/head_terms_bound.wgsl).
    pub fn head_entries(&self, first: u32) -> [wgpu::BindGroupEntry<'_>; 2] {
        [self.alibi_slopes.entry(first), self.sinks.entry(first + 1)]
    }

    /// The entries of the mask tensor and its summary that `mask` binds, at `first` and
    /// `first + 1` (shaders/mask_bound.wgsl, mask_blocks_bound.wgsl).
    pub fn mask_entries(&self, mask: MaskBinding, first: u32) -> Vec<wgpu::BindGroupEntry<'_>> {
        let mut entries = Vec::new();
        if mask.tensor {
            entries.push(self.mask.entry(first));
        }
        if mask.blocks {
            entries.push(self.mask_blocks.entry(first + 1));
        }
        entries
    }
}

/// The side tensors of any call bound for its kernels: those given, checked against the problem
/// and against the tensors the call writes; `unused` (a 4-byte buffer) in place of the others.
pub(crate) fn bind<'a>(
    caps: &Caps,
    unused: &'a wgpu::Buffer,
    problem: &AttentionProblem,
    index: &IndexBuffers<'a>,
    written: &[(&'static str, &TensorBuffer<'a>)],
) -> Result<IndexBindings<'a>> {
    let cache = &problem.kv_cache;
    let unused = TensorBuffer::new(unused);
    let bind_index = |name: &'static str, given: Option<TensorBuffer<'a>>, len: Option<usize>| {
        let (tensor, len) = match (given, len) {
            (Some(t), Some(len)) => (t, len),
            (None, None) => (unused, 1),
            (Some(_), None) => {
                return Err(Error::InvalidBuffer {
                    tensor: name,
                    message: "given for a problem that does not use it (see AttentionProblem::with_varlen / with_paged_kv / with_kv_lengths / with_alibi / with_sinks / with_bias / with_mask / with_mask_blocks)".into(),
                })
            }
            (None, Some(_)) => {
                return Err(Error::InvalidBuffer {
                    tensor: name,
                    message: "missing: the problem needs it (on host slices: FlashAttention::forward_indexed)".into(),
                })
            }
        };
        // Reported from the index's side: the call's outputs are fine, the index is misplaced.
        let outputs: Vec<(&str, Option<&TensorBuffer<'_>>)> = written.iter().map(|(n, w)| (*n, Some(*w))).collect();
        check_written_apart_from_read(&[(name, Some(&tensor))], &outputs)?;
        bind_f32(name, &tensor, len, caps)
    };
    let batch = problem.shape.batch;
    let offsets = problem.varlen.map(|_| batch.saturating_add(1));
    Ok(IndexBindings {
        cu_seqlens_q: bind_index("cu_seqlens_q", index.cu_seqlens_q, offsets)?,
        cu_seqlens_k: bind_index("cu_seqlens_k", index.cu_seqlens_k, offsets)?,
        page_table: bind_index(
            "page_table",
            index.page_table,
            cache.paged.map(|_| cache.page_table_len(batch)),
        )?,
        kv_lens: bind_index("kv_lens", index.kv_lens, cache.lengths.then_some(batch))?,
        alibi_slopes: bind_index(
            "alibi_slopes",
            index.alibi_slopes,
            problem.has_alibi_tensor().then_some(problem.shape.num_heads),
        )?,
        sinks: bind_index("sinks", index.sinks, problem.sinks.then_some(problem.shape.num_heads))?,
        // Read as u32 words: the word that holds the last element.
        bias: bind_index(
            "bias",
            index.bias,
            problem.bias.map(|b| {
                let elements = b.required_len(problem).unwrap_or(usize::MAX);
                elements.saturating_mul(b.dtype.size_bytes()).div_ceil(4)
            }),
        )?,
        mask: bind_index(
            "mask",
            index.mask,
            problem
                .mask
                .map(|m| m.required_len(problem).unwrap_or(usize::MAX).div_ceil(4)),
        )?,
        mask_blocks: bind_index(
            "mask_blocks",
            index.mask_blocks,
            problem.mask_blocks.then(|| {
                MaskBlocks::of(problem)
                    .ok()
                    .and_then(|b| b.len_words())
                    .unwrap_or(usize::MAX)
            }),
        )?,
    })
}

/// Uploads a host call's side tensors to `ctx`'s device (none without an index).
pub(crate) fn upload(ctx: &GpuContext, index: Option<&BatchIndex<'_>>) -> Result<UploadedIndex> {
    let upload = |name: &'static str, bytes: Option<&[u8]>| -> Result<Option<wgpu::Buffer>> {
        let Some(bytes) = bytes else { return Ok(None) };
        check_buffer_size(name, bytes.len() as u64, &ctx.caps)?;
        Ok(Some(upload_queued(
            &ctx.device,
            &ctx.queue,
            name,
            bytes,
            wgpu::BufferUsages::empty(),
        )))
    };
    let index = index.copied().unwrap_or_default();
    fn bytes<T: bytemuck::Pod>(x: Option<&[T]>) -> Option<&[u8]> {
        x.map(bytemuck::cast_slice)
    }
    Ok(UploadedIndex {
        cu_seqlens_q: upload("cu_seqlens_q", bytes(index.cu_seqlens_q))?,
        cu_seqlens_k: upload("cu_seqlens_k", bytes(index.cu_seqlens_k))?,
        page_table: upload("page_table", bytes(index.page_table))?,
        kv_lens: upload("kv_lens", bytes(index.kv_lens))?,
        alibi_slopes: upload("alibi_slopes", bytes(index.alibi_slopes))?,
        sinks: upload("sinks", bytes(index.sinks))?,
        // Padded to whole words, as the kernels read it.
        bias: upload(
            "bias",
            index
                .bias
                .map(|b| {
                    let mut v = b.bytes().to_vec();
                    v.resize(v.len().next_multiple_of(4), 0);
                    v
                })
                .as_deref(),
        )?,
        mask: upload(
            "mask",
            index
                .mask
                .map(|m| {
                    let mut v = m.to_vec();
                    v.resize(v.len().next_multiple_of(4), 0);
                    v
                })
                .as_deref(),
        )?,
        mask_blocks: None,
    })
}
