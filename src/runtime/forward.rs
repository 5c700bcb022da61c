//! Running attention on a device: the flash kernel, the naive baseline, and host-slice
//! conveniences around both.

use wgpu::util::DeviceExt;

use crate::caps::Caps;
use crate::device::context::GpuContext;
use crate::error::{check_holds, host_output};
use crate::error::{Error, Result};
use crate::gpu::binding::{
    bind, bind_f32, binding_start, byte_len, check_binding_size, check_buffer_size, check_disjoint,
    check_written_apart_from_read, f32_offset_alignment, Bound, TensorBuffer,
};
use crate::gpu::pipelines::PipelineCache;
use crate::gpu::readback::{read_back_within, upload_queued, DEFAULT_READ_BACK_TIMEOUT};
use crate::gpu::scratch::ScratchBuffers;
use crate::plan::{
    num_q_tiles, select_forward, BoundsChecks, DecodeConfig, DecodeSplit, ForwardKernel, KernelChoice, MaskBinding,
    SequenceIndex,
};
use crate::problem::index::BatchIndex;
use crate::problem::{AttentionProblem, Element, Tensor};
use crate::runtime::index::{self, IndexBindings, IndexBuffers, UploadedIndex};
use crate::runtime::split::{
    self, on_own_buffers, part_slice, part_timestamps, scatter_rows, shifted, Part, Pass, Placement,
};
use crate::wgsl::mask::FORWARD_MASK_BINDING;
use crate::wgsl::params::Params;
use crate::wgsl::{
    KernelConfig, FORWARD_BIAS_BINDING, FORWARD_BIAS_FRAGMENTS_BINDING, FORWARD_HEAD_BINDING,
    FORWARD_HUGE_FLAGS_BINDING, FORWARD_INDEX_BINDING,
};

/// The tensors of one forward call, in the caller's buffers. Each holds elements of the problem's
/// `dtype` at the problem's layout for it, counted from its `byte_offset`.
#[derive(Clone, Copy, Debug)]
pub struct ForwardBuffers<'a> {
    /// Read: Q at `problem.q_layout`.
    pub q: TensorBuffer<'a>,
    /// Read: K at `problem.k_layout`; may share a buffer with q and v (packed QKV).
    pub k: TensorBuffer<'a>,
    /// Read: V at `problem.v_layout`.
    pub v: TensorBuffer<'a>,
    /// Written; must not share a buffer with q, k or v (wgpu forbids reading and writing one
    /// buffer in a dispatch).
    pub o: TensorBuffer<'a>,
    /// `[batch, num_heads, seq_q]` (packed: `[num_heads, total_q]`) f32, written when given. Its
    /// byte offset must meet the device's `min_storage_buffer_offset_alignment`. It may share a
    /// buffer with `o` if their bytes do not overlap.
    pub lse: Option<TensorBuffer<'a>>,
    /// Read: the `[batch + 1]` u32 query-row offsets of a packed batch
    /// ([`AttentionProblem::with_varlen`]); `None` otherwise. Offsets must rise and stay within
    /// `total_q`, each sequence at most `seq_q` rows: the kernels never read or write past the
    /// tensors, skip a sequence whose query rows fall outside Q, and write a sequence whose keys
    /// fall outside K/V (or exceed `seq_kv`) as NaN. Rows past the last sequence are not written.
    pub cu_seqlens_q: Option<TensorBuffer<'a>>,
    /// Read: the `[batch + 1]` u32 key-row offsets of a packed batch; `None` otherwise.
    pub cu_seqlens_k: Option<TensorBuffer<'a>>,
    /// Read: the `[batch, pages_per_seq]` u32 page table of a paged cache
    /// ([`AttentionProblem::with_paged_kv`]); `None` otherwise. Entries must be below
    /// `num_pages`: the kernel never reads past the pool, and writes the rows of a sequence that
    /// names a page past it as NaN.
    pub page_table: Option<TensorBuffer<'a>>,
    /// Read: the `[batch]` u32 key counts ([`AttentionProblem::with_kv_lengths`]); `None`
    /// otherwise. Counts must be at most `seq_kv` (a larger one makes the sequence's rows NaN).
    pub kv_lens: Option<TensorBuffer<'a>>,
    /// Read: the `[num_heads]` f32 ALiBi slopes
    /// ([`AttentionProblem::with_alibi_slopes`](crate::problem::AttentionProblem::with_alibi_slopes)); `None` otherwise.
    pub alibi_slopes: Option<TensorBuffer<'a>>,
    /// Read: the `[num_heads]` f32 sink logits ([`AttentionProblem::with_sinks`]); `None`
    /// otherwise.
    pub sinks: Option<TensorBuffer<'a>>,
    /// Read: the score bias ([`AttentionProblem::with_bias`]), of the problem's bias type at its
    /// layout, read as whole 4-byte words (the buffer must hold the word of the last element);
    /// `None` otherwise.
    pub bias: Option<TensorBuffer<'a>>,
    /// Read: the mask ([`AttentionProblem::with_mask`]), one byte per element at its layout (0
    /// hides the key; the layout's offset places element 0 from the binding's start, which must
    /// meet the device's storage offset alignment), read as whole 4-byte words (the buffer must
    /// hold the word of the last byte); `None` otherwise.
    pub mask: Option<TensorBuffer<'a>>,
    /// Read: the block summary of the mask, or of the bias without one
    /// ([`AttentionProblem::with_mask_blocks`]), as
    /// [`encode_mask_blocks`](FlashAttention::encode_mask_blocks) wrote it (its `size_bytes()`
    /// bytes, from an offset meeting the device's storage offset alignment); `None` otherwise. Kept between calls: one summary
    /// serves every call on the same mask.
    pub mask_blocks: Option<TensorBuffer<'a>>,
}

impl<'a> ForwardBuffers<'a> {
    /// The four tensors and the LSE, for a problem without side tensors (no packed offsets, page
    /// table, key counts, ALiBi slopes, sinks, bias or mask).
    pub fn new(
        q: TensorBuffer<'a>,
        k: TensorBuffer<'a>,
        v: TensorBuffer<'a>,
        o: TensorBuffer<'a>,
        lse: Option<TensorBuffer<'a>>,
    ) -> Self {
        ForwardBuffers {
            q,
            k,
            v,
            o,
            lse,
            cu_seqlens_q: None,
            cu_seqlens_k: None,
            page_table: None,
            kv_lens: None,
            alibi_slopes: None,
            sinks: None,
            bias: None,
            mask: None,
            mask_blocks: None,
        }
    }

    /// The side tensors among the buffers.
    pub(crate) fn index(&self) -> IndexBuffers<'a> {
        IndexBuffers {
            cu_seqlens_q: self.cu_seqlens_q,
            cu_seqlens_k: self.cu_seqlens_k,
            page_table: self.page_table,
            kv_lens: self.kv_lens,
            alibi_slopes: self.alibi_slopes,
            sinks: self.sinks,
            bias: self.bias,
            mask: self.mask,
            mask_blocks: self.mask_blocks,
        }
    }

    /// These buffers with the side tensors of `index` in place of their own.
    pub(crate) fn with_index(self, index: IndexBuffers<'a>) -> Self {
        ForwardBuffers {
            cu_seqlens_q: index.cu_seqlens_q,
            cu_seqlens_k: index.cu_seqlens_k,
            page_table: index.page_table,
            kv_lens: index.kv_lens,
            alibi_slopes: index.alibi_slopes,
            sinks: index.sinks,
            bias: index.bias,
            mask: index.mask,
            mask_blocks: index.mask_blocks,
            ..self
        }
    }
}

/// A forward call checked and ready to record ([`FlashAttention::prepare_forward`]): the kernel,
/// what recording it needs, the bound tensors and index tensors.
pub(crate) struct PreparedForward<'a> {
    config: ForwardKernel,
    kernel: PreparedKernel,
    bound: [Bound<'a>; 5],
    index: IndexBindings<'a>,
    write_lse: bool,
    /// Where the problem sits in the caller's: itself, or a part of a split problem
    /// (src/runtime/split.rs), whose row 0 is the whole's row `q0` and whose dropout counts from
    /// the part's first batch entry, head and row.
    at: Placement,
}

/// What recording a prepared forward needs: a prefill kernel's pipeline and the index tensors it
/// reads, or the decode kernel's configuration (its two pipelines come from the cache).
enum PreparedKernel {
    Prefill {
        pipeline: std::sync::Arc<wgpu::ComputePipeline>,
        /// The exact pass's second dispatch, where it has one.
        rerun: Option<RerunPass>,
        sequences: SequenceIndex,
        head_tensors: bool,
        bias: bool,
        /// The bias bound a second time, as fragments (CoopConfig::bias_fragments).
        bias_fragments: bool,
        mask: MaskBinding,
    },
    Decode {
        config: DecodeConfig,
        split: DecodeSplit,
    },
}

/// The cooperative-matrix forward's exact pass as a second dispatch ([`CoopConfig::rerun`]): its
/// pipeline and the bytes of the workgroups' flags both dispatches bind.
struct RerunPass {
    pipeline: std::sync::Arc<wgpu::ComputePipeline>,
    flag_bytes: u64,
}

/// Result of a host-slice call.
#[derive(Clone, Debug)]
pub struct AttentionOutput<T> {
    /// Laid out as the problem's `o_layout` says (`problem.required_len(Tensor::O)` elements;
    /// elements the layout skips are 0).
    pub out: Vec<T>,
    /// `[batch, num_heads, seq_q]`, natural log; −∞ for rows that see no key.
    pub lse: Vec<f32>,
    /// Name of the kernel that ran ([`ForwardKernel::name`], or `naive_{dtype}`); for a problem
    /// run in parts, the first part's followed by ` (in N parts)`.
    pub kernel: String,
    /// Bytes of device memory the call allocated (inputs, outputs, statistics, scratch).
    pub device_bytes: u64,
}

/// Settings of a [`FlashAttention`] engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// Which kernel variant and tile plan to use; automatic by default.
    pub choice: KernelChoice,
    /// Whether shaders are compiled with wgpu's run-time bounds checks; off by default. On rules
    /// out the cooperative-matrix kernel, which wgpu cannot check ([`BoundsChecks`]).
    pub bounds_checks: BoundsChecks,
    /// How long a host-slice call waits for the device to finish before it gives up with
    /// [`Error::ReadBack`] (native backends; the web's callbacks arrive by its event loop). 60 s
    /// by default. The wait blocks the calling thread, in the `async` calls too; it bounds wgpu's
    /// poll, not a driver that blocks in `queue.submit` (lavapipe).
    pub read_back_timeout: std::time::Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            choice: KernelChoice::default(),
            bounds_checks: BoundsChecks::default(),
            read_back_timeout: DEFAULT_READ_BACK_TIMEOUT,
        }
    }
}

/// Runs attention on one device. Pipelines are built on first use and cached, so keep one engine
/// per device for the program's lifetime.
pub struct FlashAttention {
    ctx: GpuContext,
    options: Options,
    pipelines: PipelineCache,
    /// Bound in place of the LSE when the caller does not want it, and of the decode kernel's
    /// partial results with one piece (written bindings).
    unused_lse: wgpu::Buffer,
    /// Bound in place of a cache index the problem does not use (read bindings: wgpu forbids one
    /// buffer both read and written in a dispatch).
    unused_index: wgpu::Buffer,
    /// The decode kernel's partial results, kept between calls and grown to the largest need
    /// (src/runtime/decode.rs).
    decode_scratch: ScratchBuffers<2>,
    /// The cooperative-matrix forward's workgroup flags when its exact pass is a second dispatch
    /// (shaders/huge_flags_bound.wgsl), kept the same way.
    huge_flags: ScratchBuffers<1>,
}

impl FlashAttention {
    /// An engine on `ctx`'s device with default [`Options`] (automatic kernel choice, no run-time
    /// bounds checks). Cheap: no pipeline is built until a problem needs it.
    pub fn new(ctx: &GpuContext) -> Self {
        Self::with_options(ctx, Options::default())
    }

    /// An engine with the given options: a forced kernel, bounds checks.
    pub fn with_options(ctx: &GpuContext, options: Options) -> Self {
        // 16 bytes: also bound in place of the decode kernel's vec4 partial outputs.
        let unused_lse = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("wgpu-flash-attn unused lse"),
            size: 16,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        let unused_index = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("wgpu-flash-attn unused cache index"),
            size: 16,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        FlashAttention {
            ctx: ctx.clone(),
            unused_index,
            options,
            pipelines: PipelineCache::new(
                ctx.device.clone(),
                options.bounds_checks,
                ctx.caps
                    .cooperative_matrix_emulated
                    .then_some(ctx.caps.subgroup_max_size),
            ),
            unused_lse,
            decode_scratch: ScratchBuffers::new(["decode o_partial", "decode lse_partial"]),
            huge_flags: ScratchBuffers::new(["coop forward huge_flags"]),
        }
    }

    /// The device this engine runs on.
    pub fn context(&self) -> &GpuContext {
        &self.ctx
    }

    /// The options it was created with.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// The engine's pipeline cache, shared with the backward pass (src/runtime/backward.rs).
    pub(crate) fn pipelines(&self) -> &PipelineCache {
        &self.pipelines
    }

    /// The 4-byte buffer bound in place of an LSE the caller does not want (src/runtime/merge.rs).
    pub(crate) fn unused_lse(&self) -> &wgpu::Buffer {
        &self.unused_lse
    }

    /// A call's side tensors bound for its kernels ([`index::bind`]): those given, checked against
    /// the problem and the tensors the call writes.
    pub(crate) fn bind_index<'a>(
        &'a self,
        problem: &AttentionProblem,
        index: &IndexBuffers<'a>,
        written: &[(&'static str, &TensorBuffer<'a>)],
    ) -> Result<IndexBindings<'a>> {
        index::bind(&self.ctx.caps, &self.unused_index, problem, index, written)
    }

    /// A host call's side tensors, uploaded ([`index::upload`]).
    pub(crate) fn upload_index(&self, index: Option<&BatchIndex<'_>>) -> Result<UploadedIndex> {
        index::upload(&self.ctx, index)
    }

    /// The decode kernel's reusable scratch (src/runtime/decode.rs).
    pub(crate) fn decode_scratch(&self) -> &ScratchBuffers<2> {
        &self.decode_scratch
    }

    /// Pipeline builds this engine has started (for tests that count them).
    #[cfg(feature = "internals")]
    pub fn pipeline_builds(&self) -> usize {
        self.pipelines.builds()
    }

    /// The flash kernel this engine would run for `problem`, without building anything: the
    /// problem's validation error, or [`Error::Unavailable`] (every reason) where no kernel, or
    /// not the forced one, runs it on this device, or [`Error::TooLarge`] where the grid exceeds
    /// the dispatch limits.
    pub fn select(&self, problem: &AttentionProblem) -> Result<ForwardKernel> {
        select_forward(
            problem,
            &self.ctx.caps,
            &self.options.choice,
            self.options.bounds_checks,
        )
    }

    /// The pipelines `kernel` records: one, or two for the cooperative-matrix kernel whose exact
    /// pass is a second dispatch and for the decode kernel with more than one piece of the keys
    /// (the decode kernel and the combine).
    fn pipeline_keys(kernel: &ForwardKernel, problem: &AttentionProblem) -> Vec<KernelConfig> {
        match kernel {
            ForwardKernel::Tiled(c) => vec![KernelConfig::Flash(*c)],
            ForwardKernel::Coop(c) => std::iter::once(*c)
                .chain(c.rerun())
                .map(KernelConfig::FlashCoop)
                .collect(),
            ForwardKernel::Decode { config, split } => {
                let mut keys = vec![KernelConfig::Decode(*config)];
                if split.splits > 1 {
                    keys.push(KernelConfig::DecodeCombine {
                        storage: problem.dtype,
                        sinks: problem.sinks,
                    });
                }
                keys
            }
        }
    }

    /// Selects the kernel for `problem` and builds its pipelines, waiting for the driver's
    /// verdict on every platform. Optional on native backends (the first encode builds them),
    /// advisable on the web, where a shader error is otherwise only reported asynchronously.
    pub async fn prepare(&self, problem: &AttentionProblem) -> Result<ForwardKernel> {
        self.prepare_at(problem, Placement::whole(problem)).await
    }

    /// [`prepare`](Self::prepare) for a problem placed at `at` (see
    /// [`encode_forward_at`](Self::encode_forward_at)).
    async fn prepare_at(&self, problem: &AttentionProblem, at: Placement) -> Result<ForwardKernel> {
        let kernel = self.select_at(problem, at)?;
        for key in Self::pipeline_keys(&kernel, problem) {
            self.pipelines.get_async(&key).await?;
        }
        Ok(kernel)
    }

    /// Records the flash forward pass into `encoder`, reading and writing the caller's buffers.
    /// Never blocks. `timestamps`, if given, are written at the start and end of the pass.
    /// Returns the kernel recorded; nothing is recorded on an error (the problem's, selection's
    /// as [`select`](Self::select), a buffer that is too small, misaligned, lacks
    /// `BufferUsages::STORAGE` or is both read and written: [`Error::InvalidBuffer`]).
    ///
    /// A problem whose tensors span more than one binding, or whose grid exceeds the device's
    /// dispatch limits, is recorded as several dispatches over parts of it (batch entries, heads,
    /// query rows; every head with ALiBi or sinks; see the README's "Larger than the device
    /// binds"), with the same result; the kernel returned is the first part's. A part's LSE rows
    /// that cannot be bound in place are copied, which needs `COPY_DST` on the LSE's buffer
    /// ([`Error::InvalidBuffer`] otherwise). What no split fixes (one K/V head's keys beyond a
    /// binding) is [`Error::TooLarge`].
    ///
    /// Q and K/V packed in shared buffers, O and the LSE in their own, f16:
    ///
    /// ```no_run
    /// use wgpu_flash_attn::{AttentionProblem, DType, FlashAttention, ForwardBuffers, GpuContext, Tensor, TensorBuffer};
    /// # fn main() -> wgpu_flash_attn::Result<()> {
    /// let ctx = pollster::block_on(GpuContext::new())?;
    /// let attn = FlashAttention::new(&ctx);
    /// let problem = AttentionProblem::mha(1, 2048, 16, 128, DType::F16).with_causal(true);
    ///
    /// let storage = |elements: usize| {
    ///     ctx.device.create_buffer(&wgpu::BufferDescriptor {
    ///         label: None,
    ///         size: (elements * problem.dtype.size_bytes()) as u64,
    ///         usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
    ///         mapped_at_creation: false,
    ///     })
    /// };
    /// let kv_len = problem.required_len(Tensor::K);
    /// let q_buf = storage(problem.required_len(Tensor::Q));
    /// let kv_buf = storage(2 * kv_len); // K, then V
    /// let o_buf = storage(problem.required_len(Tensor::O));
    /// let lse_buf = ctx.device.create_buffer(&wgpu::BufferDescriptor {
    ///     label: None,
    ///     size: 4 * problem.lse_len() as u64, // f32 [batch, num_heads, seq_q]
    ///     usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
    ///     mapped_at_creation: false,
    /// });
    /// // ... fill q_buf and kv_buf with queue.write_buffer or your own kernels ...
    ///
    /// let buffers = ForwardBuffers::new(
    ///     TensorBuffer::new(&q_buf),
    ///     TensorBuffer::new(&kv_buf),
    ///     TensorBuffer::at(&kv_buf, (kv_len * problem.dtype.size_bytes()) as u64),
    ///     TensorBuffer::new(&o_buf),
    ///     Some(TensorBuffer::new(&lse_buf)),
    /// );
    /// let mut encoder = ctx.device.create_command_encoder(&Default::default());
    /// let kernel = attn.encode_forward(&mut encoder, &problem, &buffers, None)?;
    /// ctx.queue.submit([encoder.finish()]);
    /// println!("recorded {}", kernel.name());
    /// # Ok(()) }
    /// ```
    pub fn encode_forward(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        problem: &AttentionProblem,
        buffers: &ForwardBuffers<'_>,
        timestamps: Option<wgpu::ComputePassTimestampWrites<'_>>,
    ) -> Result<ForwardKernel> {
        self.encode_forward_at(encoder, problem, Placement::whole(problem), buffers, timestamps)
    }

    /// [`encode_forward`](Self::encode_forward) for a problem placed at `at` in a larger one (a
    /// part of it; see src/runtime/split.rs). A problem too large for one dispatch is split into
    /// several where the layout allows.
    pub(crate) fn encode_forward_at(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        problem: &AttentionProblem,
        at: Placement,
        buffers: &ForwardBuffers<'_>,
        timestamps: Option<wgpu::ComputePassTimestampWrites<'_>>,
    ) -> Result<ForwardKernel> {
        match self.prepare_forward_at(problem, at, buffers) {
            Ok(prepared) => self.record_forward(encoder, problem, &prepared, timestamps),
            Err(Error::TooLarge(why)) => self.encode_forward_in_parts(encoder, problem, at, buffers, timestamps, &why),
            Err(e) => Err(e),
        }
    }

    /// The kernel for `problem` placed at `at`: [`select`](Self::select)'s,
    /// except that rows placed elsewhere than `seq_kv − seq_q` under a mask, window or ALiBi (whose
    /// bias is by position) go to the prefill kernels, which take their rows' place from
    /// `Params::causal_offset`; the decode kernel places rows from the problem's own sizes
    /// (shaders/flash_decode.wgsl).
    fn select_at(&self, problem: &AttentionProblem, at: Placement) -> Result<ForwardKernel> {
        let kernel = self.select(problem)?;
        let by_position = problem.causal || problem.window.is_some() || problem.alibi.is_some();
        let shifted = at.causal_offset != problem.causal_offset() && by_position;
        if !(shifted && matches!(kernel, ForwardKernel::Decode { .. })) {
            return Ok(kernel);
        }
        if let KernelChoice::Decode(_) = self.options.choice {
            return Err(Error::Unavailable {
                what: "the decode kernel".into(),
                why: "it cannot run a part of a split problem's query rows under a causal mask, window or ALiBi; \
                      choose KernelChoice::Auto or the tiled kernel for problems this large"
                    .into(),
            });
        }
        select_forward(
            problem,
            &self.ctx.caps,
            &KernelChoice::Tiled(self.options.choice.tiled()),
            self.options.bounds_checks,
        )
    }

    /// Everything [`encode_forward`](Self::encode_forward) checks and builds before it records:
    /// the device, the kernel selection, the buffers and index tensors, and the kernel's
    /// pipelines (built now if new), so that a caller recording more than the attention (the
    /// serving step) can check it before recording anything.
    pub(crate) fn prepare_forward<'a>(
        &'a self,
        problem: &AttentionProblem,
        buffers: &ForwardBuffers<'a>,
    ) -> Result<PreparedForward<'a>> {
        self.prepare_forward_at(problem, Placement::whole(problem), buffers)
    }

    /// [`prepare_forward`](Self::prepare_forward) for a problem placed at `at` (see
    /// [`encode_forward_at`](Self::encode_forward_at)).
    fn prepare_forward_at<'a>(
        &'a self,
        problem: &AttentionProblem,
        at: Placement,
        buffers: &ForwardBuffers<'a>,
    ) -> Result<PreparedForward<'a>> {
        self.ctx.check_device(false)?;
        let config = self.select_at(problem, at)?;
        let index = self.bind_forward_index(problem, buffers)?;
        let kernel = match &config {
            ForwardKernel::Tiled(c) => PreparedKernel::Prefill {
                pipeline: self.pipelines.get(&KernelConfig::Flash(*c))?,
                rerun: None,
                sequences: c.sequences,
                head_tensors: c.head_tensors,
                bias: c.bias.is_some(),
                bias_fragments: false,
                mask: c.mask,
            },
            ForwardKernel::Coop(c) => {
                // The flags' size before any build: nothing is built for a call that cannot run.
                let flag_bytes = self.check_huge_flags(problem, &config)?;
                PreparedKernel::Prefill {
                    pipeline: self.pipelines.get(&KernelConfig::FlashCoop(*c))?,
                    rerun: match c.rerun() {
                        Some(rerun) => Some(RerunPass {
                            pipeline: self.pipelines.get(&KernelConfig::FlashCoop(rerun))?,
                            flag_bytes,
                        }),
                        None => None,
                    },
                    sequences: c.sequences,
                    head_tensors: c.head_tensors,
                    bias: c.bias.is_some(),
                    bias_fragments: c.bias_fragments,
                    mask: c.mask,
                }
            }
            ForwardKernel::Decode { config, split } => {
                self.check_decode_scratch(problem, split)?;
                // Built here so that a build error comes before anything is recorded;
                // encode_decode takes them from the cache (with wide loads, also the granule
                // build it runs where a caller's byte offset leaves K or V off 16 bytes).
                self.pipelines.get(&KernelConfig::Decode(*config))?;
                if config.word_granules() == 2 {
                    self.pipelines.get(&KernelConfig::Decode(config.with_granule_loads()))?;
                }
                if split.splits > 1 {
                    self.pipelines.get(&KernelConfig::DecodeCombine {
                        storage: problem.dtype,
                        sinks: problem.sinks,
                    })?;
                }
                PreparedKernel::Decode {
                    config: *config,
                    split: *split,
                }
            }
        };
        let bound = self.bind_forward(problem, buffers)?;
        Ok(PreparedForward {
            config,
            kernel,
            bound,
            index,
            write_lse: buffers.lse.is_some(),
            at,
        })
    }

    /// Records a forward call [`prepare_forward`](Self::prepare_forward) checked.
    pub(crate) fn record_forward(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        problem: &AttentionProblem,
        prepared: &PreparedForward<'_>,
        timestamps: Option<wgpu::ComputePassTimestampWrites<'_>>,
    ) -> Result<ForwardKernel> {
        let PreparedForward {
            config,
            kernel,
            bound,
            index,
            write_lse,
            at,
        } = prepared;
        let (pipeline, rerun, sequences, head_tensors, bias, bias_fragments, mask) = match kernel {
            PreparedKernel::Prefill {
                pipeline,
                rerun,
                sequences,
                head_tensors,
                bias,
                bias_fragments,
                mask,
            } => (pipeline, rerun, sequences, *head_tensors, *bias, *bias_fragments, *mask),
            PreparedKernel::Decode { config: decode, split } => {
                self.encode_decode(encoder, problem, bound, index, *write_lse, timestamps, decode, split)?;
                return Ok(*config);
            }
        };
        let mut params = Params::for_flash(
            problem,
            [bound[0].strides, bound[1].strides, bound[2].strides, bound[3].strides],
            num_q_tiles(problem, config) as u32,
            *write_lse,
        );
        // Validation bounds both lengths by i32::MAX, and a part's first row lies below seq_q; the
        // batch, heads and rows by u32.
        params.causal_offset = at.causal_offset as i32;
        (params.part_batch, params.part_head, params.part_row) = (at.batch as u32, at.head as u32, at.row as u32);
        let params_buffer = self.uniform(&params);

        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: params_buffer.as_entire_binding(),
        }];
        for (i, b) in bound.iter().enumerate() {
            entries.push(b.entry(i as u32 + 1));
        }
        if sequences.is_indexed() {
            entries.extend(index.sequence_entries(FORWARD_INDEX_BINDING));
        }
        if head_tensors {
            entries.extend(index.head_entries(FORWARD_HEAD_BINDING));
        }
        if bias {
            entries.push(index.bias.entry(FORWARD_BIAS_BINDING));
        }
        entries.extend(index.mask_entries(mask, FORWARD_MASK_BINDING));
        if bias_fragments {
            entries.push(index.bias.entry(FORWARD_BIAS_FRAGMENTS_BINDING));
        }
        // Both dispatches bind the flags; wgpu orders the rerun's reads (and its writes of O and
        // the LSE) after the first dispatch's writes.
        let flags = rerun
            .as_ref()
            .map(|r| self.huge_flags.at_least(&self.ctx.device, [r.flag_bytes]));
        if let Some([flags]) = &flags {
            entries.push(wgpu::BindGroupEntry {
                binding: FORWARD_HUGE_FLAGS_BINDING,
                resource: flags.as_entire_binding(),
            });
        }
        let bind_group_of = |pipeline: &wgpu::ComputePipeline| {
            self.ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(&config.name()),
                layout: &pipeline.get_bind_group_layout(0),
                entries: &entries,
            })
        };
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some(&config.name()),
            timestamp_writes: timestamps,
        });
        let s = problem.shape;
        let passes = std::iter::once(pipeline.as_ref()).chain(rerun.as_ref().map(|r| r.pipeline.as_ref()));
        for pipeline in passes {
            pass.set_pipeline(pipeline);
            pass.set_bind_group(0, &bind_group_of(pipeline), &[]);
            pass.dispatch_workgroups(params.num_q_tiles, s.num_heads as u32, s.batch as u32);
        }
        Ok(*config)
    }

    /// Checks the caller's buffers against the problem and the device: q, k, v, o, lse bindings.
    pub(super) fn bind_forward<'a>(
        &'a self,
        problem: &AttentionProblem,
        buffers: &ForwardBuffers<'a>,
    ) -> Result<[Bound<'a>; 5]> {
        self.bind_forward_on(problem, buffers, &self.ctx.caps)
    }

    /// [`bind_forward`](Self::bind_forward) against the limits in `caps`.
    fn bind_forward_on<'a>(
        &'a self,
        problem: &AttentionProblem,
        buffers: &ForwardBuffers<'a>,
        caps: &Caps,
    ) -> Result<[Bound<'a>; 5]> {
        let es = problem.dtype.size_bytes();
        let tensor =
            |t: Tensor, tb: &TensorBuffer<'a>| bind(t.name(), tb, problem.layout(t), problem.required_len(t), es, caps);
        check_forward_aliasing(buffers)?;
        let unused = TensorBuffer::new(&self.unused_lse);
        let lse = match &buffers.lse {
            Some(l) => bind_f32("lse", l, problem.lse_len(), caps)?,
            None => bind_f32("lse", &unused, 1, caps)?,
        };
        let bound = [
            tensor(Tensor::Q, &buffers.q)?,
            tensor(Tensor::K, &buffers.k)?,
            tensor(Tensor::V, &buffers.v)?,
            tensor(Tensor::O, &buffers.o)?,
            lse,
        ];
        // Both are written: O and the LSE may share a buffer, not bytes.
        check_disjoint("lse", &bound[4], "o", &bound[3])?;
        Ok(bound)
    }

    /// Checks a forward call's index tensors against the problem: given exactly when the problem
    /// asks for them, long enough, readable, not sharing a buffer with O or the LSE.
    fn bind_forward_index<'a>(
        &'a self,
        problem: &AttentionProblem,
        buffers: &ForwardBuffers<'a>,
    ) -> Result<IndexBindings<'a>> {
        let mut written = vec![("o", &buffers.o)];
        written.extend(buffers.lse.as_ref().map(|l| ("lse", l)));
        self.bind_index(problem, &buffers.index(), &written)
    }

    /// What [`bind_forward`](Self::bind_forward) and [`bind_forward_index`](Self::bind_forward_index)
    /// check, except the size of one binding: the whole call's buffers, before it is split into
    /// parts whose bindings are checked one by one.
    pub(super) fn check_forward_buffers(&self, problem: &AttentionProblem, buffers: &ForwardBuffers<'_>) -> Result<()> {
        self.bind_forward_on(problem, buffers, &split::unbounded(&self.ctx.caps))?;
        self.bind_forward_index(problem, buffers).map(|_| ())
    }

    /// [`encode_forward_at`](Self::encode_forward_at) for a problem too large for one dispatch
    /// (`too_large` says why): the whole call's buffers are checked as one (a bad buffer is that
    /// error, not a split), [`split::plan`] picks parts that each fit, every part is prepared, and
    /// only then is anything recorded. A part's LSE is bound in place where it is one run of the
    /// whole's at an offset the device can bind; otherwise the part writes a scratch buffer that
    /// is copied into place, which needs `COPY_DST` on the caller's LSE buffer.
    fn encode_forward_in_parts(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        whole: &AttentionProblem,
        at: Placement,
        buffers: &ForwardBuffers<'_>,
        timestamps: Option<wgpu::ComputePassTimestampWrites<'_>>,
        too_large: &str,
    ) -> Result<ForwardKernel> {
        whole.validate()?;
        self.check_forward_buffers(whole, buffers)?;
        let caps = &self.ctx.caps;
        let es = whole.dtype.size_bytes();
        // A part has every head where the problem has per-head terms (split::keeps_heads_whole),
        // so it reads the whole call's `[num_heads]` tensors as they are; its score bias and mask
        // are the whole call's too, read from the part's first element (split::Part::problem).
        let head_terms = IndexBuffers {
            alibi_slopes: buffers.alibi_slopes,
            sinks: buffers.sinks,
            bias: buffers.bias,
            mask: buffers.mask,
            ..IndexBuffers::default()
        };
        let moved = |part: &Part, lse| {
            let at = |t: Tensor| (es * part.element_offset(whole, t)) as u64;
            ForwardBuffers::new(
                shifted(&buffers.q, at(Tensor::Q)),
                shifted(&buffers.k, at(Tensor::K)),
                shifted(&buffers.v, at(Tensor::V)),
                shifted(&buffers.o, at(Tensor::O)),
                lse,
            )
            .with_index(head_terms)
        };
        let align = f32_offset_alignment(caps);
        let lse_in_place = |part: &Part| {
            let lse = buffers.lse.as_ref()?;
            let &[(_, at, _)] = part.lse_runs(whole).as_slice() else {
                return None;
            };
            let bytes = lse.byte_offset + 4 * at as u64;
            bytes.is_multiple_of(align).then(|| TensorBuffer::at(lse.buffer, bytes))
        };
        let parts = split::plan(whole, Pass::Forward, too_large, |part| {
            let sub = part.problem(whole);
            if let ForwardKernel::Decode { split, .. } = self.select_at(&sub, at.of_part(part))? {
                self.check_decode_scratch(&sub, &split)?;
            }
            let b = moved(part, None);
            for (t, tb) in [(Tensor::Q, b.q), (Tensor::K, b.k), (Tensor::V, b.v), (Tensor::O, b.o)] {
                bind(t.name(), &tb, whole.layout(t), sub.required_len(t), es, caps)?;
            }
            if buffers.lse.is_some() {
                check_binding_size("lse", 4 * part.lse_len() as u64, caps)?;
            }
            Ok(())
        })?;
        // The parts whose LSE is copied into place share one scratch buffer: each part's copy is
        // recorded before the next part's pass writes it again.
        let copied = parts.iter().filter(|p| lse_in_place(p).is_none());
        let scratch = match (&buffers.lse, copied.map(|p| 4 * p.lse_len() as u64).max()) {
            (Some(lse), Some(bytes)) => {
                if !lse.buffer.usage().contains(wgpu::BufferUsages::COPY_DST) {
                    return Err(Error::InvalidBuffer {
                        tensor: "lse",
                        message: format!(
                            "the problem is split into {} dispatches ({too_large}), and some parts' LSE rows do \
                             not start at a multiple of the device's storage offset alignment ({align} bytes) \
                             or lie apart; they are copied into place, which needs BufferUsages::COPY_DST",
                            parts.len()
                        ),
                    });
                }
                check_buffer_size("lse", bytes, caps)?;
                Some(self.ctx.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("wgpu-flash-attn split lse"),
                    size: bytes,
                    usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: false,
                }))
            }
            _ => None,
        };
        let mut prepared = Vec::with_capacity(parts.len());
        for part in &parts {
            let sub = part.problem(whole);
            let lse = match (&buffers.lse, lse_in_place(part), &scratch) {
                (None, ..) => None,
                (Some(_), Some(in_place), _) => Some(in_place),
                (Some(_), None, scratch) => scratch.as_ref().map(TensorBuffer::new),
            };
            let p = self.prepare_forward_at(&sub, at.of_part(part), &moved(part, lse))?;
            prepared.push((sub, p));
        }
        let mut first = None;
        for (i, (part, (sub, p))) in parts.iter().zip(&prepared).enumerate() {
            let kernel = self.record_forward(encoder, sub, p, part_timestamps(&timestamps, i, parts.len()))?;
            first.get_or_insert(kernel);
            if let (Some(lse), Some(scratch), None) = (&buffers.lse, &scratch, lse_in_place(part)) {
                for (at_part, at_whole, len) in part.lse_runs(whole) {
                    encoder.copy_buffer_to_buffer(
                        scratch,
                        4 * at_part as u64,
                        lse.buffer,
                        lse.byte_offset + 4 * at_whole as u64,
                        4 * len as u64,
                    );
                }
            }
        }
        // `plan` returns at least one part.
        first.ok_or_else(|| Error::TooLarge(too_large.to_string()))
    }

    /// Whether a host-slice call runs `problem` (placed at `at`) as one dispatch: its
    /// kernel's grid and scratch, and each buffer it creates (the inputs from element 0 of their
    /// slices, O, the LSE) within what the device allocates and binds. [`Error::TooLarge`] says
    /// which does not fit.
    fn fits_on_own_buffers(&self, problem: &AttentionProblem, at: Placement) -> Result<()> {
        let kernel = self.select_at(problem, at)?;
        if let ForwardKernel::Decode { split, .. } = kernel {
            self.check_decode_scratch(problem, &split)?;
        }
        self.check_huge_flags(problem, &kernel)?;
        let caps = &self.ctx.caps;
        let es = problem.dtype.size_bytes();
        for t in [Tensor::Q, Tensor::K, Tensor::V, Tensor::O] {
            let bytes = byte_len(t.name(), problem.required_len(t), es)?;
            check_buffer_size(t.name(), bytes, caps)?;
            let first = byte_len(t.name(), problem.layout(t).offset, es)?;
            check_binding_size(t.name(), bytes - binding_start(first, es, caps), caps)?;
        }
        let lse = byte_len("lse", problem.lse_len(), 4)?;
        check_buffer_size("lse", lse, caps)?;
        check_binding_size("lse", lse, caps)
    }

    /// A host-slice forward too large for one dispatch on buffers of its own (`too_large` says
    /// why): its parts ([`split::plan`]), each uploaded, run and read back in turn, so device
    /// memory holds one part at a time, and scattered into the whole's O and LSE. `index`, checked
    /// by the caller, holds at most the per-head terms (every part has all heads), the score bias
    /// and the mask (each part reads them from its first element), uploaded once.
    async fn forward_in_parts<T: Element>(
        &self,
        whole: &AttentionProblem,
        q: &[T],
        k: &[T],
        v: &[T],
        index: Option<&BatchIndex<'_>>,
        too_large: &str,
    ) -> Result<AttentionOutput<T>> {
        check_host_slices::<T>(
            whole,
            [(Tensor::Q, q.len()), (Tensor::K, k.len()), (Tensor::V, v.len())],
        )?;
        let whole_at = Placement::whole(whole);
        let parts = split::plan(whole, Pass::Forward, too_large, |part| {
            self.fits_on_own_buffers(&on_own_buffers(part, whole), whole_at.of_part(part))
        })?;
        let mut out = host_output("o", whole.required_len(Tensor::O), <T as bytemuck::Zeroable>::zeroed())?;
        let mut lse = host_output("lse", whole.lse_len(), 0.0f32)?;
        let uploaded = self.upload_index(index)?;
        let head_terms = uploaded.buffers();
        let (mut kernel, mut device_bytes) = (None, 0);
        for part in &parts {
            let sub = on_own_buffers(part, whole);
            let at = whole_at.of_part(part);
            let config = self.prepare_at(&sub, at).await?;
            let scratch = kernel_scratch_bytes(&sub, &config)?;
            let slice = |t: Tensor, data| {
                part_slice(
                    data,
                    whole.layout(t),
                    part.element_offset(whole, t),
                    sub.required_len(t),
                )
            };
            let (q, k, v) = (slice(Tensor::Q, q), slice(Tensor::K, k), slice(Tensor::V, v));
            let result = self
                .run_on_host(&sub, q, k, v, config.name(), scratch, |engine, encoder, buffers| {
                    let buffers = buffers.with_index(head_terms);
                    engine.encode_forward_at(encoder, &sub, at, &buffers, None).map(|_| ())
                })
                .await?;
            scatter_rows(
                &mut out,
                &whole.o_layout,
                &result.out,
                &sub.o_layout,
                (part.nb, part.nq, part.nh),
                (part.b0, part.q0, part.h0),
                whole.shape.head_dim,
            );
            for (from, to, len) in part.lse_runs(whole) {
                lse[to..to + len].copy_from_slice(&result.lse[from..from + len]);
            }
            kernel.get_or_insert(result.kernel);
            device_bytes += result.device_bytes;
        }
        Ok(AttentionOutput {
            out,
            lse,
            kernel: format!("{} (in {} parts)", kernel.unwrap_or_default(), parts.len()),
            device_bytes,
        })
    }

    /// [`huge_flag_bytes`], checked against what the device allocates and binds.
    fn check_huge_flags(&self, problem: &AttentionProblem, kernel: &ForwardKernel) -> Result<u64> {
        let bytes = huge_flag_bytes(problem, kernel)?;
        check_buffer_size("huge_flags", bytes, &self.ctx.caps)?;
        check_binding_size("huge_flags", bytes, &self.ctx.caps)?;
        Ok(bytes)
    }

    pub(crate) fn uniform(&self, params: &Params) -> wgpu::Buffer {
        self.ctx.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("wgpu-flash-attn params"),
            contents: bytemuck::bytes_of(params),
            usage: wgpu::BufferUsages::UNIFORM,
        })
    }

    /// Flash attention on host slices: uploads `q`, `k`, `v` (laid out as the problem says),
    /// runs the kernel and returns `O` and the LSE. Device memory used: the three inputs, the
    /// output and `4·batch·num_heads·seq_q` bytes of LSE — nothing of size `seq_q × seq_kv`.
    pub async fn forward<T: Element>(
        &self,
        problem: &AttentionProblem,
        q: &[T],
        k: &[T],
        v: &[T],
    ) -> Result<AttentionOutput<T>> {
        self.forward_with_index(problem, q, k, v, None).await
    }

    /// [`forward`](Self::forward) for a problem with index tensors: a packed batch
    /// ([`AttentionProblem::with_varlen`]: `q`, `k`, `v` packed, `index` the row offsets), keys in
    /// pages or with per-sequence counts ([`AttentionProblem::with_paged_kv`],
    /// [`AttentionProblem::with_kv_lengths`]: `k` and `v` the page pools, `index` the page table
    /// and the counts). The index is checked before anything is uploaded
    /// ([`BatchIndex::validate`]: offsets that fall or leave the tensors, a page past the pool or
    /// a count past `seq_kv` is an [`Error::InvalidBuffer`]).
    pub async fn forward_indexed<T: Element>(
        &self,
        problem: &AttentionProblem,
        q: &[T],
        k: &[T],
        v: &[T],
        index: &BatchIndex<'_>,
    ) -> Result<AttentionOutput<T>> {
        self.forward_with_index(problem, q, k, v, Some(index)).await
    }

    /// [`forward`](Self::forward) and [`forward_indexed`](Self::forward_indexed): with an index,
    /// checked and uploaded beside the inputs; without, a problem that needs one fails when its
    /// buffers are bound, naming the call that takes it.
    async fn forward_with_index<T: Element>(
        &self,
        problem: &AttentionProblem,
        q: &[T],
        k: &[T],
        v: &[T],
        index: Option<&BatchIndex<'_>>,
    ) -> Result<AttentionOutput<T>> {
        if let Some(index) = index {
            problem.validate()?;
            index.validate(problem)?;
        }
        // An index of more than per-head terms (packed offsets, a page table, key counts) keeps
        // a problem whole (src/runtime/split.rs).
        if index.is_none() || split::splittable(problem) {
            if let Err(Error::TooLarge(why)) = self.fits_on_own_buffers(problem, Placement::whole(problem)) {
                return self.forward_in_parts(problem, q, k, v, index, &why).await;
            }
        }
        let config = self.prepare(problem).await?;
        let scratch = kernel_scratch_bytes(problem, &config)?;
        let mut uploaded = self.upload_index(index)?;
        // A summary of the mask, if asked for, computed on the device before the call reads it.
        uploaded.mask_blocks = self.host_mask_blocks_buffer(problem)?;
        let index = uploaded.buffers();
        self.run_on_host(problem, q, k, v, config.name(), scratch, |engine, encoder, buffers| {
            engine.record_host_mask_blocks(encoder, problem, &index)?;
            let buffers = buffers.with_index(index);
            engine.encode_forward(encoder, problem, &buffers, None).map(|_| ())
        })
        .await
    }

    /// [`forward_indexed`](Self::forward_indexed), blocking (not on the web).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn forward_indexed_blocking<T: Element>(
        &self,
        problem: &AttentionProblem,
        q: &[T],
        k: &[T],
        v: &[T],
        index: &BatchIndex<'_>,
    ) -> Result<AttentionOutput<T>> {
        pollster::block_on(self.forward_indexed(problem, q, k, v, index))
    }

    /// [`forward`](Self::forward), blocking until the result is back (not on the web).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn forward_blocking<T: Element>(
        &self,
        problem: &AttentionProblem,
        q: &[T],
        k: &[T],
        v: &[T],
    ) -> Result<AttentionOutput<T>> {
        pollster::block_on(self.forward(problem, q, k, v))
    }

    /// Uploads inputs, allocates outputs, lets `encode` record the work, and reads back.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn run_on_host<T: Element>(
        &self,
        problem: &AttentionProblem,
        q: &[T],
        k: &[T],
        v: &[T],
        kernel: String,
        scratch_bytes: u64,
        encode: impl FnOnce(&Self, &mut wgpu::CommandEncoder, &ForwardBuffers<'_>) -> Result<()>,
    ) -> Result<AttentionOutput<T>> {
        check_host_slices::<T>(
            problem,
            [(Tensor::Q, q.len()), (Tensor::K, k.len()), (Tensor::V, v.len())],
        )?;
        self.ctx.check_device(true)?;
        // Every check before the first allocation: a buffer the device cannot create would be
        // reported to its uncaptured-error handler (wgpu's default panics).
        let es = problem.dtype.size_bytes();
        let inputs = [(Tensor::Q, q), (Tensor::K, k), (Tensor::V, v)];
        for t in [Tensor::Q, Tensor::K, Tensor::V] {
            check_buffer_size(
                t.name(),
                byte_len(t.name(), problem.required_len(t), es)?,
                &self.ctx.caps,
            )?;
        }
        let o_bytes = byte_len("o", problem.required_len(Tensor::O), es)?;
        let lse_bytes = byte_len("lse", problem.lse_len(), 4)?;
        check_buffer_size("o", o_bytes, &self.ctx.caps)?;
        check_buffer_size("lse", lse_bytes, &self.ctx.caps)?;
        let device = &self.ctx.device;
        let inputs = inputs.map(|(t, data)| {
            let bytes = bytemuck::cast_slice(&data[..problem.required_len(t)]);
            upload_queued(device, &self.ctx.queue, t.name(), bytes, wgpu::BufferUsages::empty())
        });
        // COPY_DST: a call split on the device copies parts' LSE rows into place.
        let output = |label, size| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        };
        let o = output("o", o_bytes);
        let lse = output("lse", lse_bytes);
        let buffers = ForwardBuffers::new(
            TensorBuffer::new(&inputs[0]),
            TensorBuffer::new(&inputs[1]),
            TensorBuffer::new(&inputs[2]),
            TensorBuffer::new(&o),
            Some(TensorBuffer::new(&lse)),
        );
        let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(&kernel) });
        encode(self, &mut encoder, &buffers)?;
        self.ctx.queue.submit([encoder.finish()]);
        let ranges = [(&o, 0, o_bytes), (&lse, 0, lse_bytes)];
        let bytes = read_back_within(device, &self.ctx.queue, &ranges, self.options.read_back_timeout).await;
        // An error the device recorded meanwhile explains a failed read-back, and spoils a good one.
        self.ctx.check_device(false)?;
        let mut bytes = bytes?;
        let lse_out = bytemuck::pod_collect_to_vec(&bytes.pop().unwrap_or_default());
        let out = bytemuck::pod_collect_to_vec(&bytes.pop().unwrap_or_default());
        let device_bytes = inputs.iter().map(|b| b.size()).sum::<u64>() + o.size() + lse.size() + scratch_bytes;
        Ok(AttentionOutput {
            out,
            lse: lse_out,
            kernel,
            device_bytes,
        })
    }
}

/// Scratch bytes `kernel` uses beside the inputs and outputs (the decode kernel's partial results,
/// the workgroups' flags of a cooperative-matrix kernel whose exact pass is a second dispatch).
fn kernel_scratch_bytes(problem: &AttentionProblem, kernel: &ForwardKernel) -> Result<u64> {
    match kernel {
        ForwardKernel::Decode { split, .. } => {
            let (o, lse) = scratch_bytes(problem, split)?;
            Ok(o + lse)
        }
        _ => huge_flag_bytes(problem, kernel),
    }
}

/// Bytes of the workgroups' flags `kernel` binds (shaders/huge_flags_bound.wgsl): one u32 per
/// workgroup of its grid where its exact pass is a second dispatch, else 0.
fn huge_flag_bytes(problem: &AttentionProblem, kernel: &ForwardKernel) -> Result<u64> {
    match kernel {
        ForwardKernel::Coop(c) if c.rerun().is_some() => {
            let s = problem.shape;
            let workgroups = num_q_tiles(problem, kernel)
                .checked_mul(s.num_heads)
                .and_then(|n| n.checked_mul(s.batch))
                .unwrap_or(usize::MAX);
            byte_len("huge_flags", workgroups, 4)
        }
        _ => Ok(0),
    }
}

/// Bytes of the partial outputs and their LSEs a call allocates for `split` (0 with one piece).
pub(crate) fn scratch_bytes(problem: &AttentionProblem, split: &DecodeSplit) -> Result<(u64, u64)> {
    let (o_len, lse_len) = split.partial_lens(problem);
    let bytes = |name, len: u64| -> Result<u64> { byte_len(name, usize::try_from(len).unwrap_or(usize::MAX), 4) };
    Ok((bytes("o_partial", o_len)?, bytes("lse_partial", lse_len)?))
}

/// The tensors a forward call writes (O, the LSE) apart from those it reads: wgpu forbids one
/// buffer bound both ways in a dispatch.
fn check_forward_aliasing(buffers: &ForwardBuffers<'_>) -> Result<()> {
    check_written_apart_from_read(
        &[("o", Some(&buffers.o)), ("lse", buffers.lse.as_ref())],
        &[
            ("q", Some(&buffers.q)),
            ("k", Some(&buffers.k)),
            ("v", Some(&buffers.v)),
        ],
    )
}

/// The checks of a host-slice call's inputs that need no device: the problem, the slices'
/// element type (`T`) and their lengths against the layouts.
pub(crate) fn check_host_slices<T: Element>(
    problem: &AttentionProblem,
    lengths: impl IntoIterator<Item = (Tensor, usize)>,
) -> Result<()> {
    problem.validate()?;
    if T::DTYPE != problem.dtype {
        return Err(Error::DTypeMismatch {
            tensor: "q",
            expected: problem.dtype,
            got: T::DTYPE,
        });
    }
    check_holds(
        lengths
            .into_iter()
            .map(|(t, len)| (t.name(), len, problem.required_len(t))),
    )
}
