//! The block summary of a mask on the device (shaders/mask_blocks.wgsl; src/problem/mask.rs says
//! what it holds and how the kernels use it): recorded once per mask into a buffer the caller
//! keeps, or by the host-slice calls into one of their own before the attention reads it.

use crate::error::{Error, Result};
use crate::gpu::binding::{bind_f32, check_buffer_size, check_written_apart_from_read, TensorBuffer};
use crate::problem::mask::MaskBlocks;
use crate::problem::AttentionProblem;
use crate::runtime::forward::FlashAttention;
use crate::runtime::index::IndexBuffers;
use crate::wgsl::params::Params;
use crate::wgsl::KernelConfig;

impl FlashAttention {
    /// Records the block summary of `problem`'s mask — or, for a problem without a mask, of its
    /// score bias's −∞ entries — into `blocks`, for later calls of the problem with
    /// [`AttentionProblem::with_mask_blocks`] to read (`ForwardBuffers::mask_blocks`,
    /// `BackwardBuffers::mask_blocks`). Never blocks; `timestamps`, if given, are written at the
    /// start and end of its pass. `source` is the mask's buffer as the calls
    /// give it (`ForwardBuffers::mask`), or the bias's; `blocks` must hold
    /// [`MaskBlocks::size_bytes`] bytes from an offset meeting the device's storage offset
    /// alignment, and not share a buffer with `source`. Returns the summary's description.
    ///
    /// One summary serves every call with the same mask layout and contents, forward and
    /// backward, and every head of a mask the heads share; record it again after writing the
    /// mask (see the contract in the `batch::MaskBlocks` documentation). Errors: the problem's
    /// validation error, [`Error::InvalidProblem`] for a problem with neither mask nor bias,
    /// [`Error::InvalidBuffer`] for a buffer too small, misaligned or shared, [`Error::TooLarge`]
    /// where the summary's grid (key blocks, query blocks, summarized heads) exceeds the device's
    /// dispatch limits.
    ///
    /// ```no_run
    /// use wgpu_flash_attn::batch::{AttentionMask, MaskBlocks};
    /// use wgpu_flash_attn::{AttentionProblem, DType, FlashAttention, GpuContext, TensorBuffer};
    /// # fn main() -> wgpu_flash_attn::Result<()> {
    /// let ctx = pollster::block_on(GpuContext::new())?;
    /// let attn = FlashAttention::new(&ctx);
    /// let problem = AttentionProblem::mha(1, 8192, 16, 128, DType::F16);
    /// // One [seq_q, seq_kv] byte mask shared by the batch and the heads (a document mask, say).
    /// let problem = problem.with_mask(AttentionMask::dense(&problem, false, false)).with_mask_blocks();
    /// let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST;
    /// let mask_buf = ctx.device.create_buffer(&wgpu::BufferDescriptor {
    ///     label: Some("mask"),
    ///     size: 8192 * 8192,
    ///     usage,
    ///     mapped_at_creation: false,
    /// });
    /// // ... write the mask ...
    /// let blocks_buf = ctx.device.create_buffer(&wgpu::BufferDescriptor {
    ///     label: Some("mask blocks"),
    ///     size: MaskBlocks::of(&problem)?.size_bytes(),
    ///     usage: wgpu::BufferUsages::STORAGE,
    ///     mapped_at_creation: false,
    /// });
    /// let mut encoder = ctx.device.create_command_encoder(&Default::default());
    /// attn.encode_mask_blocks(
    ///     &mut encoder,
    ///     &problem,
    ///     TensorBuffer::new(&mask_buf),
    ///     TensorBuffer::new(&blocks_buf),
    ///     None,
    /// )?;
    /// ctx.queue.submit([encoder.finish()]);
    /// // Every later call: ForwardBuffers { mask: Some(..), mask_blocks: Some(TensorBuffer::new(&blocks_buf)), .. }
    /// # Ok(()) }
    /// ```
    pub fn encode_mask_blocks(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        problem: &AttentionProblem,
        source: TensorBuffer<'_>,
        blocks: TensorBuffer<'_>,
        timestamps: Option<wgpu::ComputePassTimestampWrites<'_>>,
    ) -> Result<MaskBlocks> {
        self.context().check_device(false)?;
        problem.validate()?;
        let summary = MaskBlocks::of(problem)?;
        summary.validate()?;
        let caps = &self.context().caps;
        let grid = [
            ("key blocks", summary.kv_blocks()),
            ("query blocks", summary.q_blocks()),
            ("summarized (batch, head) pairs", summary.batches() * summary.heads()),
        ];
        let max = caps.max_workgroups_per_dimension as usize;
        if let Some((what, n)) = grid.iter().find(|(_, n)| *n > max) {
            return Err(Error::TooLarge(format!(
                "the mask's block summary has {n} {what}, more than the device's {max} workgroups per dispatch dimension"
            )));
        }
        // Both read as whole u32 words: the word of the last element.
        let (name, words, bias) = match (problem.mask, problem.bias) {
            (Some(m), _) => ("mask", m.required_len(problem).unwrap_or(usize::MAX).div_ceil(4), None),
            (None, Some(b)) => (
                "bias",
                b.required_len(problem)
                    .unwrap_or(usize::MAX)
                    .saturating_mul(b.dtype.size_bytes())
                    .div_ceil(4),
                Some(b.dtype),
            ),
            // MaskBlocks::of refused it above.
            (None, None) => return Err(Error::InvalidProblem("no mask and no bias to summarize".into())),
        };
        check_written_apart_from_read(&[("mask_blocks", Some(&blocks))], &[(name, Some(&source))])?;
        let source = bind_f32(name, &source, words, caps)?;
        let blocks = bind_f32("mask_blocks", &blocks, summary.len_words().unwrap_or(usize::MAX), caps)?;
        let config = KernelConfig::MaskBlocks { bias };
        let pipeline = self.pipelines().get(&config)?;
        // The scale is unused: the summary reads the mask's (or bias's) strides and its own.
        let params = self.uniform(&Params::for_problem(problem, 0.0));
        let bind_group = self.context().device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(&config.name()),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: params.as_entire_binding(),
                },
                blocks.entry(1),
                source.entry(crate::wgsl::mask::SUMMARY_SOURCE_BINDING),
            ],
        });
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some(&config.name()),
            timestamp_writes: timestamps,
        });
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bind_group, &[]);
        pass.dispatch_workgroups(
            summary.kv_blocks() as u32,
            summary.q_blocks() as u32,
            (summary.batches() * summary.heads()) as u32,
        );
        Ok(summary)
    }

    /// A host-slice call's summary buffer, when `problem` asks for one: created here, written by
    /// [`record_host_mask_blocks`](Self::record_host_mask_blocks) before the call reads it.
    pub(crate) fn host_mask_blocks_buffer(&self, problem: &AttentionProblem) -> Result<Option<wgpu::Buffer>> {
        if !problem.mask_blocks {
            return Ok(None);
        }
        let summary = MaskBlocks::of(problem)?;
        summary.validate()?;
        let bytes = summary.size_bytes();
        check_buffer_size("mask_blocks", bytes, &self.context().caps)?;
        Ok(Some(self.context().device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("wgpu-flash-attn mask blocks"),
            size: bytes,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        })))
    }

    /// Records a host-slice call's summary from its uploaded mask (or bias) into its own buffer,
    /// when the problem asks for one.
    pub(crate) fn record_host_mask_blocks(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        problem: &AttentionProblem,
        index: &IndexBuffers<'_>,
    ) -> Result<()> {
        let (Some(blocks), Some(source)) = (index.mask_blocks, index.mask.or(index.bias)) else {
            return Ok(());
        };
        self.encode_mask_blocks(encoder, problem, source, blocks, None)
            .map(|_| ())
    }
}
