//! Writing the new tokens' K and V rows into a K/V cache (shaders/append_kv.wgsl), on the
//! caller's buffers: the first half of a serving step, whose second half is the decode call over
//! the same cache ([`FlashAttention::encode_forward`]); recorded into one encoder, the two run as
//! one submission.

use wgpu::util::DeviceExt;

use crate::error::{Error, Result};
use crate::gpu::binding::{bind, check_disjoint, check_written_apart_from_read, TensorBuffer};
use crate::plan::ForwardKernel;
use crate::problem::varlen::refuse_packed;
use crate::problem::{AttentionProblem, Layout, Tensor, TensorLayout};
use crate::runtime::forward::{FlashAttention, ForwardBuffers};
use crate::runtime::index::IndexBuffers;
use crate::wgsl::params::Params;
use crate::wgsl::KernelConfig;

/// The tensors of one append, in the caller's buffers.
#[derive(Clone, Copy, Debug)]
pub struct AppendBuffers<'a> {
    /// Read: the new tokens' keys, `[batch, seq_q, num_kv_heads, head_dim]` contiguous, in the
    /// problem's dtype (`seq_q` of the problem: the new tokens of each sequence).
    pub new_k: TensorBuffer<'a>,
    /// Read: their values, laid out as `new_k`.
    pub new_v: TensorBuffer<'a>,
    /// Written: the K cache at the problem's K layout (the pool, when paged).
    pub k_cache: TensorBuffer<'a>,
    /// Written: the V cache at the problem's V layout; it may share `k_cache`'s buffer at
    /// disjoint bytes.
    pub v_cache: TensorBuffer<'a>,
    /// Read: the page table, when the problem's cache is paged.
    pub page_table: Option<TensorBuffer<'a>>,
    /// Read: the key counts, when the problem has them; they include the new tokens.
    pub kv_lens: Option<TensorBuffer<'a>>,
}

impl FlashAttention {
    /// The serving step in one call: the append of the new tokens' K/V into the cache
    /// ([`encode_append_kv`](Self::encode_append_kv)), then attention over that cache
    /// ([`encode_forward`](Self::encode_forward) with `attend`, whose K, V and index tensors are
    /// the cache `append` writes), recorded into `encoder` in that order: one submission.
    /// Everything both calls check is checked before either records, so a problem, buffer or
    /// pipeline error records nothing. Returns the attention's kernel.
    pub fn encode_append_and_forward(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        problem: &AttentionProblem,
        append: &AppendBuffers<'_>,
        attend: &ForwardBuffers<'_>,
        timestamps: Option<wgpu::ComputePassTimestampWrites<'_>>,
    ) -> Result<ForwardKernel> {
        let prepared = self.prepare_forward(problem, attend)?;
        self.encode_append_kv(encoder, problem, append)?;
        self.record_forward(encoder, problem, &prepared, timestamps)
    }

    /// Records the append of `problem.shape.seq_q` new tokens per sequence into the cache: new
    /// token `t` of sequence `b` goes to key position `kv_len(b) − seq_q + t` (`kv_len` is
    /// `kv_lens[b]`, or `seq_kv`), through the page table when paged. Positions below 0 and
    /// pages past the pool are skipped (the host cannot see the caller's index tensors; the
    /// attention call that follows writes such sequences as NaN when their index is invalid).
    /// Of `problem`, the shape, dtype, K/V layouts and cache matter. Never blocks; nothing is
    /// recorded on an error (the problem's, a buffer too small, misaligned, without
    /// `BufferUsages::STORAGE`, or written while read: [`Error::InvalidBuffer`]).
    pub fn encode_append_kv(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        problem: &AttentionProblem,
        buffers: &AppendBuffers<'_>,
    ) -> Result<()> {
        let ctx = self.context();
        ctx.check_device(false)?;
        problem.validate()?;
        refuse_packed(problem, "the K/V append")?;
        let s = problem.shape;
        let max = ctx.caps.max_workgroups_per_dimension as usize;
        for (what, n) in [
            ("new tokens", s.seq_q),
            ("K/V heads", s.num_kv_heads),
            ("batch entries", s.batch),
        ] {
            if n > max {
                return Err(Error::TooLarge(format!(
                    "the append runs one workgroup per new token, K/V head and sequence: {n} {what} exceed \
                     the device's {max} workgroups per dispatch dimension"
                )));
            }
        }
        let config = KernelConfig::AppendKv {
            storage: problem.dtype,
            paged: problem.kv_cache.paged.is_some(),
            kv_lengths: problem.kv_cache.lengths,
        };
        let pipeline = self.pipelines().get(&config)?;
        let es = problem.dtype.size_bytes();
        let caps = &ctx.caps;
        let new_layout = TensorLayout::contiguous(Layout::Bshd, s.seq_q, s.num_kv_heads, s.head_dim);
        let new_len = s.batch * s.seq_q * s.num_kv_heads * s.head_dim;
        check_written_apart_from_read(
            &[("k_cache", Some(&buffers.k_cache)), ("v_cache", Some(&buffers.v_cache))],
            &[("new_k", Some(&buffers.new_k)), ("new_v", Some(&buffers.new_v))],
        )?;
        let new_k = bind("new_k", &buffers.new_k, &new_layout, new_len, es, caps)?;
        let new_v = bind("new_v", &buffers.new_v, &new_layout, new_len, es, caps)?;
        // The caches are written here: like O, no two of their elements may share an address, or
        // two tokens' rows would race for it (inputs may overlap; these are outputs of this call).
        // Found by tests/campaign.rs: a V layout whose rows overlapped was accepted.
        for (name, t) in [("k_cache", Tensor::K), ("v_cache", Tensor::V)] {
            let (batch, seq, heads) = problem.stored_extent(t);
            let extent = (batch, seq, heads, s.head_dim);
            problem
                .layout(t)
                .check(name, extent, Some(" (the append writes the cache)"))?;
        }
        let cache = |name, t: Tensor, tb| bind(name, tb, problem.layout(t), problem.required_len(t), es, caps);
        let k_cache = cache("k_cache", Tensor::K, &buffers.k_cache)?;
        let v_cache = cache("v_cache", Tensor::V, &buffers.v_cache)?;
        check_disjoint("v_cache", &v_cache, "k_cache", &k_cache)?;
        let written = [("k_cache", &buffers.k_cache), ("v_cache", &buffers.v_cache)];
        let index = IndexBuffers {
            page_table: buffers.page_table,
            kv_lens: buffers.kv_lens,
            ..IndexBuffers::default()
        };
        let index = self.bind_index(problem, &index, &written)?;

        let mut params = Params::for_problem(problem, 1.0);
        params.q = new_k.strides;
        params.o = new_v.strides;
        params.k = k_cache.strides;
        params.v = v_cache.strides;
        if let Some(pages) = problem.kv_cache.paged {
            (params.page_size, params.pages_per_seq, params.num_pages) = (
                pages.page_size as u32,
                pages.pages_per_seq as u32,
                pages.num_pages as u32,
            );
        }
        let params_buffer = ctx.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("wgpu-flash-attn append params"),
            contents: bytemuck::bytes_of(&params),
            usage: wgpu::BufferUsages::UNIFORM,
        });
        let entries = [
            wgpu::BindGroupEntry {
                binding: 0,
                resource: params_buffer.as_entire_binding(),
            },
            new_k.entry(1),
            new_v.entry(2),
            k_cache.entry(3),
            v_cache.entry(4),
            index.page_table.entry(5),
            index.kv_lens.entry(6),
        ];
        let name = config.name();
        let group = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(&name),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some(&name),
            timestamp_writes: None,
        });
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &group, &[]);
        pass.dispatch_workgroups(s.seq_q as u32, s.num_kv_heads as u32, s.batch as u32);
        Ok(())
    }
}
