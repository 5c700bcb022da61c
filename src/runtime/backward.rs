//! The backward pass on a device: `dQ`, `dK`, `dV` from `Q`, `K`, `V`, `O`, the forward's LSE and
//! `dO`, by recomputation (FlashAttention-2): three kernels recorded into one compute pass, on the
//! caller's buffers or on host slices; a fourth for the score bias's gradient when the problem
//! asks for it ([`BackwardProblem::with_bias_grad`]).
//!
//! Device memory beyond the tensors themselves: `4·batch·num_heads·seq_q` bytes for
//! `D = rowsum(dO ∘ O)` — O(seq), nothing of size `seq_q × seq_kv` (but the bias's gradient,
//! which is the bias's size).

use wgpu::util::DeviceExt;

use crate::caps::Caps;
use crate::error::{check_holds, host_output};
use crate::error::{Error, Result};
use crate::gpu::binding::{
    bind, bind_f32, binding_start, byte_len, check_binding_size, check_buffer_size, check_disjoint,
    check_written_apart_from_read, f32_offset_alignment, Bound, TensorBuffer,
};
use crate::gpu::readback::{read_back_within, upload_queued};
use crate::plan::{backward_grid, select_backward, BackwardChoice, BackwardConfig, BackwardKernel, BackwardPass};
use crate::problem::backward::{BackwardProblem, GradTensor};
use crate::problem::{AttentionProblem, BatchIndex, Element, Tensor, TensorLayout};
use crate::runtime::forward::FlashAttention;
use crate::runtime::index::IndexBuffers;
use crate::runtime::split::{
    self, on_own_buffers, part_slice, part_timestamps, scatter_rows, shifted, Part, Pass, Placement,
};
use crate::wgsl::mask::BACKWARD_MASK_BINDING;
use crate::wgsl::params::{GradParams, Params};
use crate::wgsl::{
    KernelConfig, BACKWARD_BIAS_BINDING, BACKWARD_HEAD_BINDING, BACKWARD_INDEX_BINDING, SINK_GRAD_INDEX_BINDING,
};

/// The tensors of one backward call, in the caller's buffers.
///
/// Read: `q`, `k`, `v`, `o` (laid out as the forward problem says), `lse` (the forward's
/// `[batch, num_heads, seq_q]` f32 natural-log LSE, −∞ for rows that saw no key) and `d_o`.
/// Written: `dq`, `dk`, `dv` (laid out as the [`BackwardProblem`] says), which must not share a
/// buffer with any input (wgpu forbids reading and writing one buffer in a dispatch); they may
/// share one with each other if their byte ranges (first element to last) do not overlap.
#[derive(Clone, Copy, Debug)]
pub struct BackwardBuffers<'a> {
    /// Read: Q at the forward problem's `q_layout`.
    pub q: TensorBuffer<'a>,
    /// Read: K at `k_layout`.
    pub k: TensorBuffer<'a>,
    /// Read: V at `v_layout`.
    pub v: TensorBuffer<'a>,
    /// Read: the forward's output at `o_layout`.
    pub o: TensorBuffer<'a>,
    /// Read: the forward's LSE. Its byte offset must meet the device's
    /// `min_storage_buffer_offset_alignment`.
    pub lse: TensorBuffer<'a>,
    /// Read: `dL/dO` at the backward problem's `d_o_layout`.
    pub d_o: TensorBuffer<'a>,
    /// Written: `dL/dQ` at `dq_layout`.
    pub dq: TensorBuffer<'a>,
    /// Written: `dL/dK` at `dk_layout` (summed over the query heads that share each K/V head).
    pub dk: TensorBuffer<'a>,
    /// Written: `dL/dV` at `dv_layout` (summed like dK).
    pub dv: TensorBuffer<'a>,
    /// Workspace for `D = rowsum(dO ∘ O)`: `batch·num_heads·seq_q` f32 values, byte offset aligned
    /// like `lse`'s. Written: it must not share a buffer with `o`, `d_o`, `dq`, `dk`, `dv`, nor
    /// overlap the bytes of `q`, `k`, `v` or `lse`. Allocated for the call when `None`; give one
    /// to reuse it across calls (and to record the three kernels separately with
    /// [`FlashAttention::encode_backward_pass`]).
    pub delta: Option<TensorBuffer<'a>>,
    /// Read: the `[batch + 1]` u32 query-row offsets of a packed batch
    /// ([`AttentionProblem::with_varlen`](crate::problem::AttentionProblem::with_varlen)), as in the
    /// forward ([`ForwardBuffers::cu_seqlens_q`](crate::runtime::forward::ForwardBuffers::cu_seqlens_q)); `None`
    /// otherwise. Gradient rows past the last sequence are not written.
    pub cu_seqlens_q: Option<TensorBuffer<'a>>,
    /// Read: the `[batch + 1]` u32 key-row offsets of a packed batch; `None` otherwise.
    pub cu_seqlens_k: Option<TensorBuffer<'a>>,
    /// Read: the forward's `[num_heads]` f32 ALiBi slopes
    /// ([`AttentionProblem::with_alibi_slopes`](crate::problem::AttentionProblem::with_alibi_slopes)); `None` otherwise.
    pub alibi_slopes: Option<TensorBuffer<'a>>,
    /// Read: the forward's `[num_heads]` f32 sink logits
    /// ([`AttentionProblem::with_sinks`](crate::problem::AttentionProblem::with_sinks)); `None`
    /// otherwise.
    pub sinks: Option<TensorBuffer<'a>>,
    /// Written: `dL/d(sinks)`, `[num_heads]` f32, when the problem has sinks and the caller wants
    /// their gradient (`None`: not computed, as for frozen sinks). Recorded with the
    /// preprocessing kernel, whose `D` it reads.
    pub d_sinks: Option<TensorBuffer<'a>>,
    /// Read: the forward's score bias
    /// ([`AttentionProblem::with_bias`](crate::problem::AttentionProblem::with_bias)), as
    /// [`ForwardBuffers::bias`](crate::runtime::forward::ForwardBuffers::bias); `None` otherwise. dQ, dK and
    /// dV treat it as a constant of the scores.
    pub bias: Option<TensorBuffer<'a>>,
    /// Read: the forward's mask
    /// ([`AttentionProblem::with_mask`](crate::problem::AttentionProblem::with_mask)), as
    /// [`ForwardBuffers::mask`](crate::runtime::forward::ForwardBuffers::mask); `None` otherwise.
    pub mask: Option<TensorBuffer<'a>>,
    /// Read: the mask's block summary, as
    /// [`ForwardBuffers::mask_blocks`](crate::runtime::forward::ForwardBuffers::mask_blocks) (the
    /// forward's serves); `None` otherwise.
    pub mask_blocks: Option<TensorBuffer<'a>>,
    /// Written: `dL/d(bias)`, exactly when the problem asks for it
    /// ([`BackwardProblem::with_bias_grad`]): [`BackwardProblem::d_bias_len`] f32 values, dense
    /// as [`BackwardProblem::d_bias_layout`] says (summed over the dimensions the bias
    /// broadcasts), from a byte offset aligned like `lse`'s. Every element is written (0 where no
    /// query sees the key). It must not share a buffer with a tensor the backward reads, nor
    /// overlap the bytes of `dq`, `dk`, `dv` or `d_sinks`. Recorded after the dQ kernel, by a
    /// kernel of its own ([`BackwardPass::DBias`]).
    pub d_bias: Option<TensorBuffer<'a>>,
}

impl<'a> BackwardBuffers<'a> {
    /// The nine tensors every backward call has; the optional ones `None` (D allocated per call).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        q: TensorBuffer<'a>,
        k: TensorBuffer<'a>,
        v: TensorBuffer<'a>,
        o: TensorBuffer<'a>,
        lse: TensorBuffer<'a>,
        d_o: TensorBuffer<'a>,
        dq: TensorBuffer<'a>,
        dk: TensorBuffer<'a>,
        dv: TensorBuffer<'a>,
    ) -> Self {
        BackwardBuffers {
            q,
            k,
            v,
            o,
            lse,
            d_o,
            dq,
            dk,
            dv,
            delta: None,
            cu_seqlens_q: None,
            cu_seqlens_k: None,
            alibi_slopes: None,
            sinks: None,
            d_sinks: None,
            bias: None,
            mask: None,
            mask_blocks: None,
            d_bias: None,
        }
    }

    /// The side tensors the kernels read (the forward's, without a paged cache or key counts,
    /// which the backward does not take).
    fn index(&self) -> IndexBuffers<'a> {
        IndexBuffers {
            cu_seqlens_q: self.cu_seqlens_q,
            cu_seqlens_k: self.cu_seqlens_k,
            alibi_slopes: self.alibi_slopes,
            sinks: self.sinks,
            bias: self.bias,
            mask: self.mask,
            mask_blocks: self.mask_blocks,
            ..IndexBuffers::default()
        }
    }

    /// The tensors the call writes, by name, that the side tensors must stay apart from.
    fn written(&self) -> Vec<(&'static str, &TensorBuffer<'a>)> {
        let mut written = vec![("dq", &self.dq), ("dk", &self.dk), ("dv", &self.dv)];
        written.extend(self.d_sinks.as_ref().map(|d| ("d_sinks", d)));
        written.extend(self.d_bias.as_ref().map(|d| ("d_bias", d)));
        written
    }

    /// The tensors every kernel of the call may read, by name, that a written one must not share
    /// a buffer with (`delta`, written by the first kernel and read by the others, apart).
    fn read(&self) -> Vec<(&'static str, Option<&TensorBuffer<'a>>)> {
        vec![
            ("q", Some(&self.q)),
            ("k", Some(&self.k)),
            ("v", Some(&self.v)),
            ("o", Some(&self.o)),
            ("lse", Some(&self.lse)),
            ("d_o", Some(&self.d_o)),
        ]
    }
}

/// The host-slice inputs of [`FlashAttention::backward`]; each slice must hold at least the
/// problem's `required_len` for its tensor (extra elements are ignored).
#[derive(Clone, Copy, Debug)]
pub struct BackwardInputs<'a, T> {
    /// Q, laid out as the forward problem's `q_layout` says.
    pub q: &'a [T],
    /// K, at `k_layout`.
    pub k: &'a [T],
    /// V, at `v_layout`.
    pub v: &'a [T],
    /// The forward's output.
    pub o: &'a [T],
    /// The forward's `[batch, num_heads, seq_q]` log-sum-exp (natural log).
    pub lse: &'a [f32],
    /// `dL/dO`, laid out as the problem's `d_o_layout` says.
    pub d_o: &'a [T],
}

/// Result of a host-slice backward call.
#[derive(Clone, Debug)]
pub struct BackwardOutput<T> {
    /// Laid out as the problem's `dq_layout`, `dk_layout` and `dv_layout` say
    /// (`problem.required_len(..)` elements each; elements the layouts skip are 0).
    pub dq: Vec<T>,
    /// `dL/dK`: `num_kv_heads` heads, each summed over the query heads that share it.
    pub dk: Vec<T>,
    /// `dL/dV`, summed like `dk`.
    pub dv: Vec<T>,
    /// `[num_heads]` `dL/d(sinks)` of a problem with sinks; empty otherwise.
    pub d_sinks: Vec<f32>,
    /// `dL/d(bias)` when the problem asks for it ([`BackwardProblem::with_bias_grad`]), laid out
    /// as [`BackwardProblem::d_bias_layout`] says; empty otherwise.
    pub d_bias: Vec<f32>,
    /// The kernels that ran.
    pub config: BackwardConfig,
    /// Bytes of device memory the call allocated (inputs, gradients, the D workspace).
    pub device_bytes: u64,
}

/// A backward call checked and built, ready to record: each kernel's pipeline, bind group and
/// grid, in order.
struct PreparedBackward {
    label: String,
    steps: Vec<(std::sync::Arc<wgpu::ComputePipeline>, wgpu::BindGroup, [usize; 3])>,
}

/// Records a prepared backward call as one compute pass.
fn record_passes(
    encoder: &mut wgpu::CommandEncoder,
    prepared: &PreparedBackward,
    timestamps: Option<wgpu::ComputePassTimestampWrites<'_>>,
) {
    let mut cpass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
        label: Some(&prepared.label),
        timestamp_writes: timestamps,
    });
    for (pipeline, bind_group, [x, y, z]) in &prepared.steps {
        cpass.set_pipeline(pipeline);
        cpass.set_bind_group(0, bind_group, &[]);
        cpass.dispatch_workgroups(*x as u32, *y as u32, *z as u32);
    }
}

/// A `d_bias` output is given exactly when the problem asks for it.
fn check_d_bias_wanted(problem: &BackwardProblem, d_bias: Option<&TensorBuffer<'_>>) -> Result<()> {
    let message = match (problem.bias_grad, d_bias.is_some()) {
        (true, true) | (false, false) => return Ok(()),
        (false, true) => {
            "given for a backward that does not compute the bias's gradient (see BackwardProblem::with_bias_grad)"
        }
        (true, false) => "missing: the backward problem asks for the bias's gradient (BackwardProblem::with_bias_grad)",
    };
    Err(Error::InvalidBuffer {
        tensor: "d_bias",
        message: message.into(),
    })
}

/// A `d_sinks` output is for a problem with sinks.
fn check_d_sinks_wanted(problem: &AttentionProblem) -> Result<()> {
    if problem.sinks {
        return Ok(());
    }
    Err(Error::InvalidBuffer {
        tensor: "d_sinks",
        message: "given for a problem without sinks (see AttentionProblem::with_sinks)".into(),
    })
}

/// A caller's `delta` (bound as `delta`) against the tensors of the call: it is written, so it may
/// not share a buffer with a tensor read in the same dispatches (O, dO) or the gradients, nor
/// overlap the bytes of Q, K, V or the LSE.
fn check_delta(buffers: &BackwardBuffers<'_>, bound: &BoundBackward<'_>, delta: &Bound<'_>) -> Result<()> {
    check_written_apart_from_read(
        &[("delta", buffers.delta.as_ref())],
        &[
            ("o", Some(&buffers.o)),
            ("d_o", Some(&buffers.d_o)),
            ("dq", Some(&buffers.dq)),
            ("dk", Some(&buffers.dk)),
            ("dv", Some(&buffers.dv)),
        ],
    )?;
    for (name, read) in [("q", &bound.q), ("k", &bound.k), ("v", &bound.v), ("lse", &bound.lse)] {
        check_disjoint("delta", delta, name, read)?;
    }
    Ok(())
}

/// The checked bindings of one call.
struct BoundBackward<'a> {
    q: Bound<'a>,
    k: Bound<'a>,
    v: Bound<'a>,
    o: Bound<'a>,
    lse: Bound<'a>,
    d_o: Bound<'a>,
    dq: Bound<'a>,
    dk: Bound<'a>,
    dv: Bound<'a>,
}

impl FlashAttention {
    /// The backward kernels this engine would run for `problem` (honouring a variant forced in
    /// its [`Options`](crate::runtime::forward::Options)).
    pub fn select_backward(&self, problem: impl Into<BackwardProblem>) -> Result<BackwardConfig> {
        let choice = BackwardChoice {
            variant: self.options().choice.tiled().variant,
            ..Default::default()
        };
        select_backward(&problem.into(), &self.context().caps, &choice)
    }

    /// Selects the backward kernels for `problem` and builds their pipelines, waiting for the
    /// driver's verdict on every platform (see [`prepare`](Self::prepare)).
    pub async fn prepare_backward(&self, problem: impl Into<BackwardProblem>) -> Result<BackwardConfig> {
        let config = self.select_backward(problem)?;
        for kernel in config.kernels() {
            self.pipelines().get_async(&KernelConfig::Backward(kernel)).await?;
        }
        Ok(config)
    }

    /// Records the backward pass — D, then dK and dV, then dQ — into `encoder` as one compute
    /// pass, reading and writing the caller's buffers. Never blocks. `timestamps`, if given, are
    /// written at the start and end of the pass.
    ///
    /// `problem` is an [`AttentionProblem`] (gradients laid out like
    /// their tensors) or a [`BackwardProblem`].
    ///
    /// A problem whose tensors span more than one binding, or whose grids exceed the device's
    /// dispatch limits, is recorded as one such pass per part of it (whole batch entries, or
    /// whole K/V head groups of one entry; every head with ALiBi), with the same result; a part's
    /// LSE rows whose offset the device cannot bind are copied out first, which needs `COPY_SRC`
    /// on the LSE's buffer. What no split fixes (a group's rows beyond one binding, or a call that
    /// asks for `d_sinks`, a sum over all parts) is [`Error::TooLarge`].
    pub fn encode_backward(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        problem: impl Into<BackwardProblem>,
        buffers: &BackwardBuffers<'_>,
        timestamps: Option<wgpu::ComputePassTimestampWrites<'_>>,
    ) -> Result<BackwardConfig> {
        let problem = problem.into();
        match self.select_backward(problem) {
            Ok(config) => {
                self.encode_backward_with(encoder, problem, buffers, &config, timestamps)?;
                Ok(config)
            }
            Err(Error::TooLarge(why)) => {
                let at = Placement::whole(&problem.forward);
                self.encode_backward_in_parts(encoder, &problem, at, buffers, None, timestamps, &why)
            }
            Err(e) => Err(e),
        }
    }

    /// [`encode_backward`](Self::encode_backward) with given kernels: a [`BackwardConfig`] from
    /// [`select_backward`](Self::select_backward), selected once and reused, or one with other
    /// plans to try. [`Error::Unavailable`] if the device cannot run it, [`Error::InvalidProblem`]
    /// if it was selected for another dtype or head_dim.
    pub fn encode_backward_with(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        problem: impl Into<BackwardProblem>,
        buffers: &BackwardBuffers<'_>,
        config: &BackwardConfig,
        timestamps: Option<wgpu::ComputePassTimestampWrites<'_>>,
    ) -> Result<()> {
        let problem = problem.into();
        let at = Placement::whole(&problem.forward);
        self.encode_passes(encoder, &problem, at, buffers, config, &config.passes(), timestamps)
    }

    /// Records a single one of the backward kernels, in its own compute pass: for profiling, or to
    /// interleave other work. The passes must run in the order [`BackwardConfig::passes`] lists
    /// them, on the same buffers, and `buffers.delta` must be given (it carries D from the first
    /// pass to the others). The sinks' gradient is recorded with the preprocessing pass; the
    /// bias's gradient is a pass of its own ([`BackwardPass::DBias`]).
    pub fn encode_backward_pass(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        problem: impl Into<BackwardProblem>,
        buffers: &BackwardBuffers<'_>,
        config: &BackwardConfig,
        pass: BackwardPass,
        timestamps: Option<wgpu::ComputePassTimestampWrites<'_>>,
    ) -> Result<()> {
        if buffers.delta.is_none() {
            return Err(Error::InvalidBuffer {
                tensor: "delta",
                message: "must be given when the backward kernels are recorded one at a time".into(),
            });
        }
        let problem = problem.into();
        let at = Placement::whole(&problem.forward);
        self.encode_passes(encoder, &problem, at, buffers, config, &[pass], timestamps)
    }

    /// Records `passes` of `config` for `problem` placed at `at`, or, where the whole call is too
    /// large for one dispatch per kernel and all three are recorded, its parts
    /// ([`encode_backward_in_parts`](Self::encode_backward_in_parts)).
    #[allow(clippy::too_many_arguments)]
    fn encode_passes(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        problem: &BackwardProblem,
        at: Placement,
        buffers: &BackwardBuffers<'_>,
        config: &BackwardConfig,
        passes: &[BackwardPass],
        timestamps: Option<wgpu::ComputePassTimestampWrites<'_>>,
    ) -> Result<()> {
        match self.prepare_passes(problem, at, buffers, config, passes) {
            Ok(prepared) => {
                record_passes(encoder, &prepared, timestamps);
                Ok(())
            }
            // One kernel recorded alone reads D from the caller's `delta`, which parts would
            // overwrite: only all of them together are split.
            Err(Error::TooLarge(why)) if passes == config.passes() => self
                .encode_backward_in_parts(encoder, problem, at, buffers, Some(config), timestamps, &why)
                .map(|_| ()),
            Err(e) => Err(e),
        }
    }

    /// Everything [`encode_passes`](Self::encode_passes) checks and builds before it records: the
    /// problem, the configuration, the buffers, each kernel's pipeline and bind group.
    fn prepare_passes(
        &self,
        problem: &BackwardProblem,
        at: Placement,
        buffers: &BackwardBuffers<'_>,
        config: &BackwardConfig,
        passes: &[BackwardPass],
    ) -> Result<PreparedBackward> {
        self.context().check_device(false)?;
        problem.validate()?;
        self.check_config(problem, config)?;
        let device = &self.context().device;
        let caps = &self.context().caps;
        let mut kernels = Vec::new();
        for &pass in passes {
            let kernel = config.kernel(pass).ok_or_else(|| {
                Error::InvalidProblem(format!(
                    "configuration `{}` has no {} kernel: {}",
                    config.name(),
                    pass.entry_point(),
                    if config.dq.writes_d_bias {
                        "its dQ kernel writes the bias's gradient"
                    } else {
                        "it does not compute the bias's gradient"
                    }
                ))
            })?;
            kernels.push((pass, kernel, self.pipelines().get(&KernelConfig::Backward(kernel))?));
        }
        let bound = self.bind_backward(problem, buffers, caps)?;
        let index_bindings = self.bind_index(&problem.forward, &buffers.index(), &buffers.written())?;
        let sink_grad = self.bind_sink_grad(problem, buffers)?;
        let d_bias = self.bind_d_bias(problem, buffers, &bound, sink_grad.as_ref().map(|(_, b)| b))?;
        let scratch;
        let delta_buffer = match &buffers.delta {
            Some(d) => *d,
            None => {
                let bytes = byte_len("delta", problem.forward.lse_len(), 4)?;
                check_buffer_size("delta", bytes, caps)?;
                scratch = device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("wgpu-flash-attn backward delta"),
                    size: bytes,
                    usage: wgpu::BufferUsages::STORAGE,
                    mapped_at_creation: false,
                });
                TensorBuffer::new(&scratch)
            }
        };
        let delta = bind_f32("delta", &delta_buffer, problem.forward.lse_len(), caps)?;
        if buffers.delta.is_some() {
            check_delta(buffers, &bound, &delta)?;
        }

        let f = &problem.forward;
        let mut params = Params::for_flash(
            f,
            [bound.q.strides, bound.k.strides, bound.v.strides, bound.o.strides],
            backward_grid(problem, config, BackwardPass::Dq)[0] as u32,
            false,
        );
        // A part's place in the caller's problem, for dropout (parts keep every row). Validation
        // bounds the batch and heads by u32.
        (params.part_batch, params.part_head, params.part_row) = (at.batch as u32, at.head as u32, at.row as u32);
        let mut grad = GradParams {
            d_o: bound.d_o.strides,
            dq: bound.dq.strides,
            dk: bound.dk.strides,
            dv: bound.dv.strides,
            scale: f.softmax_scale(),
            _pad: [0; 3],
        };
        if f.varlen.is_some() {
            // Packed tensors have one batch, as in Params::for_flash.
            for t in [&mut grad.d_o, &mut grad.dq, &mut grad.dk, &mut grad.dv] {
                t.batch = 0;
            }
        }
        let uniform = |label, contents: &[u8]| {
            device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents,
                usage: wgpu::BufferUsages::UNIFORM,
            })
        };
        let params_buffer = uniform("wgpu-flash-attn params", bytemuck::bytes_of(&params));
        let grad_buffer = uniform("wgpu-flash-attn grad params", bytemuck::bytes_of(&grad));
        let uniforms = [
            wgpu::BindGroupEntry {
                binding: 0,
                resource: params_buffer.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 1,
                resource: grad_buffer.as_entire_binding(),
            },
        ];

        let mut steps = Vec::new();
        for (pass, kernel, pipeline) in &kernels {
            let pass = *pass;
            let mut entries = uniforms.to_vec();
            match pass {
                BackwardPass::Preprocess => {
                    entries.extend([bound.o.entry(2), bound.d_o.entry(3), delta.entry(4)]);
                }
                BackwardPass::DkDv | BackwardPass::Dq | BackwardPass::DBias => {
                    entries.extend([
                        bound.q.entry(2),
                        bound.k.entry(3),
                        bound.v.entry(4),
                        bound.d_o.entry(5),
                        bound.lse.entry(6),
                        delta.entry(7),
                    ]);
                    match (pass, &d_bias) {
                        (BackwardPass::DkDv, _) => entries.extend([bound.dk.entry(8), bound.dv.entry(9)]),
                        (BackwardPass::Dq, d) => {
                            entries.push(bound.dq.entry(8));
                            // For a bias per batch entry and head the dQ kernel writes d(bias).
                            if config.dq.writes_d_bias {
                                entries.extend(d.as_ref().map(|d| d.entry(9)));
                            }
                        }
                        (_, Some(d)) => entries.push(d.entry(8)),
                        // A DBias kernel is in the configuration only for a problem that asks for
                        // the gradient, whose `d_bias` was required above.
                        (_, None) => {
                            return Err(Error::InvalidBuffer {
                                tensor: "d_bias",
                                message: "missing: the configuration computes the bias's gradient".into(),
                            })
                        }
                    }
                }
            }
            if kernel.sequences().is_indexed() {
                entries.extend(index_bindings.sequence_entries(BACKWARD_INDEX_BINDING));
            }
            if let BackwardKernel::Grad(g) = kernel {
                // The gradient kernels read the slopes only: the sinks are inside the LSE.
                if g.head_tensors {
                    entries.push(index_bindings.alibi_slopes.entry(BACKWARD_HEAD_BINDING));
                }
                if g.bias.is_some() {
                    entries.push(index_bindings.bias.entry(BACKWARD_BIAS_BINDING));
                }
                entries.extend(index_bindings.mask_entries(g.mask, BACKWARD_MASK_BINDING));
            }
            let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(&kernel.name()),
                layout: &pipeline.get_bind_group_layout(0),
                entries: &entries,
            });
            steps.push((pipeline.clone(), bind_group, backward_grid(problem, config, pass)));
            // The sinks' gradient reads the D the preprocessing kernel has just written.
            if let (BackwardPass::Preprocess, Some((pipeline, d_sinks))) = (pass, &sink_grad) {
                let mut entries = vec![
                    uniforms[0].clone(),
                    bound.lse.entry(1),
                    delta.entry(2),
                    index_bindings.sinks.entry(3),
                    d_sinks.entry(4),
                ];
                let sequences = kernel.sequences();
                if sequences.is_indexed() {
                    entries.extend(index_bindings.sequence_entries(SINK_GRAD_INDEX_BINDING));
                }
                let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some("flash_bwd_sinks"),
                    layout: &pipeline.get_bind_group_layout(0),
                    entries: &entries,
                });
                steps.push((pipeline.clone(), bind_group, [problem.forward.shape.num_heads, 1, 1]));
            }
        }
        Ok(PreparedBackward {
            label: config.name(),
            steps,
        })
    }

    /// [`encode_backward_with`](Self::encode_backward_with) for a problem too large for one
    /// dispatch per kernel (`too_large` says why), with `config` or, when `None`, the kernels
    /// selected for the first part: the whole call's buffers are checked as one, [`split::plan`]
    /// picks parts of whole batch entries or whole K/V head groups (dK and dV sum over a group's
    /// heads and every query row), every part is prepared, and only then is anything recorded.
    /// Each part's three kernels run before the next part's, so the parts share D: the caller's
    /// `delta` at its offset, or one scratch buffer. A part's LSE is bound in place where its
    /// offset is one the device can bind, else copied into a scratch buffer first (which needs
    /// `COPY_SRC` on the caller's LSE buffer).
    #[allow(clippy::too_many_arguments)]
    fn encode_backward_in_parts(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        whole: &BackwardProblem,
        at: Placement,
        buffers: &BackwardBuffers<'_>,
        config: Option<&BackwardConfig>,
        timestamps: Option<wgpu::ComputePassTimestampWrites<'_>>,
        too_large: &str,
    ) -> Result<BackwardConfig> {
        self.context().check_device(false)?;
        whole.validate()?;
        let f = &whole.forward;
        let caps = &self.context().caps;
        // Everything but the size of one binding, on the whole call.
        let unbounded = split::unbounded(caps);
        let bound = self.bind_backward(whole, buffers, &unbounded)?;
        self.bind_index(f, &buffers.index(), &buffers.written())?;
        check_d_bias_wanted(whole, buffers.d_bias.as_ref())?;
        if let Some(d) = &buffers.delta {
            check_delta(buffers, &bound, &bind_f32("delta", d, f.lse_len(), &unbounded)?)?;
        }
        refuse_split_bias_grad(whole, too_large)?;
        // The sinks' gradient sums over every batch entry and row: each part's kernel would write
        // its own sum over the last's (src/runtime/split.rs).
        if buffers.d_sinks.is_some() {
            check_d_sinks_wanted(f)?;
            return Err(Error::TooLarge(format!(
                "{too_large}; the problem cannot be split into smaller dispatches while it computes the sinks' \
                 gradient, a sum over every part: give `d_sinks: None` (and take it from a host-slice backward, \
                 which adds the parts' sums up), or a device that binds the whole call"
            )));
        }

        let es = f.dtype.size_bytes();
        let group = f.group_size();
        let moved = |part: &Part, lse, delta| {
            let q_rows = |l| (es * part.offset_in(l, false, group)) as u64;
            let kv_rows = |l| (es * part.offset_in(l, true, group)) as u64;
            BackwardBuffers {
                q: shifted(&buffers.q, q_rows(&f.q_layout)),
                k: shifted(&buffers.k, kv_rows(&f.k_layout)),
                v: shifted(&buffers.v, kv_rows(&f.v_layout)),
                o: shifted(&buffers.o, q_rows(&f.o_layout)),
                lse,
                d_o: shifted(&buffers.d_o, q_rows(whole.layout(GradTensor::DO))),
                dq: shifted(&buffers.dq, q_rows(whole.layout(GradTensor::DQ))),
                dk: shifted(&buffers.dk, kv_rows(whole.layout(GradTensor::DK))),
                dv: shifted(&buffers.dv, kv_rows(whole.layout(GradTensor::DV))),
                delta,
                cu_seqlens_q: None,
                cu_seqlens_k: None,
                // Parts have every head where the kernels read a per-head term
                // (split::keeps_heads_whole): the whole call's tensors as they are.
                alibi_slopes: buffers.alibi_slopes,
                sinks: buffers.sinks,
                d_sinks: None,
                // The whole call's, read from the part's first element (split::Part::problem); a
                // block summary `plan` refuses.
                bias: buffers.bias,
                mask: buffers.mask,
                mask_blocks: buffers.mask_blocks,
                d_bias: None,
            }
        };
        let align = f32_offset_alignment(caps);
        // A backward part has every query row, and all heads or one batch entry: its LSE rows
        // are one run of the whole's.
        let lse_at = |part: &Part| buffers.lse.byte_offset + 4 * part.lse_runs(f)[0].1 as u64;
        let lse_in_place = |part: &Part| lse_at(part).is_multiple_of(align);
        let config_for = |sub: &BackwardProblem| match config {
            Some(c) => Ok(*c),
            None => self.select_backward(*sub),
        };
        let parts = split::plan(f, Pass::Backward, too_large, |part| {
            let sub = part_problem(whole, part);
            self.check_config(&sub, &config_for(&sub)?)?;
            let b = moved(part, buffers.lse, None);
            let input = |t: Tensor, tb| bind(t.name(), tb, f.layout(t), sub.forward.required_len(t), es, caps);
            let grad = |t: GradTensor, tb| bind(t.name(), tb, whole.layout(t), sub.required_len(t), es, caps);
            input(Tensor::Q, &b.q)?;
            input(Tensor::K, &b.k)?;
            input(Tensor::V, &b.v)?;
            input(Tensor::O, &b.o)?;
            grad(GradTensor::DO, &b.d_o)?;
            grad(GradTensor::DQ, &b.dq)?;
            grad(GradTensor::DK, &b.dk)?;
            grad(GradTensor::DV, &b.dv)?;
            // The LSE and D of the part, wherever they are bound.
            check_binding_size("lse", 4 * part.lse_len() as u64, caps)?;
            check_binding_size("delta", 4 * part.lse_len() as u64, caps)
        })?;
        let config = config_for(&part_problem(whole, &parts[0]))?;
        let largest = parts.iter().map(|p| 4 * p.lse_len() as u64).max().unwrap_or(4);
        let scratch = |label: &'static str, usage| -> Result<wgpu::Buffer> {
            check_buffer_size(label, largest, caps)?;
            Ok(self.context().device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: largest,
                usage: wgpu::BufferUsages::STORAGE | usage,
                mapped_at_creation: false,
            }))
        };
        let lse_scratch = if parts.iter().all(lse_in_place) {
            None
        } else if !buffers.lse.buffer.usage().contains(wgpu::BufferUsages::COPY_SRC) {
            return Err(Error::InvalidBuffer {
                tensor: "lse",
                message: format!(
                    "the problem is split into {} dispatches ({too_large}), and some parts' LSE rows do not \
                     start at a multiple of the device's storage offset alignment ({align} bytes); they are \
                     copied to a scratch buffer first, which needs BufferUsages::COPY_SRC",
                    parts.len()
                ),
            });
        } else {
            Some(scratch("lse", wgpu::BufferUsages::COPY_DST)?)
        };
        let delta_scratch = match buffers.delta {
            Some(_) => None,
            None => Some(scratch("delta", wgpu::BufferUsages::empty())?),
        };
        let delta = buffers.delta.or(delta_scratch.as_ref().map(TensorBuffer::new));
        let mut prepared = Vec::with_capacity(parts.len());
        for part in &parts {
            let lse = match (&lse_scratch, lse_in_place(part)) {
                (Some(s), false) => TensorBuffer::new(s),
                _ => TensorBuffer::at(buffers.lse.buffer, lse_at(part)),
            };
            let b = moved(part, lse, delta);
            let part_at = at.of_part(part);
            prepared.push(self.prepare_passes(&part_problem(whole, part), part_at, &b, &config, &BackwardPass::ALL)?);
        }
        for (i, (part, p)) in parts.iter().zip(&prepared).enumerate() {
            if let (Some(s), false) = (&lse_scratch, lse_in_place(part)) {
                encoder.copy_buffer_to_buffer(buffers.lse.buffer, lse_at(part), s, 0, 4 * part.lse_len() as u64);
            }
            record_passes(encoder, p, part_timestamps(&timestamps, i, parts.len()));
        }
        Ok(config)
    }

    /// The sinks' gradient kernel and its output, when the call asks for it: `d_sinks` given
    /// exactly for a problem with sinks (else an error), `[num_heads]` f32, apart from every
    /// tensor the backward reads.
    fn bind_sink_grad<'a>(
        &self,
        problem: &BackwardProblem,
        buffers: &BackwardBuffers<'a>,
    ) -> Result<Option<(std::sync::Arc<wgpu::ComputePipeline>, Bound<'a>)>> {
        let f = &problem.forward;
        let Some(d_sinks) = &buffers.d_sinks else {
            return Ok(None);
        };
        check_d_sinks_wanted(f)?;
        let mut read = buffers.read();
        read.extend([("delta", buffers.delta.as_ref()), ("sinks", buffers.sinks.as_ref())]);
        check_written_apart_from_read(&[("d_sinks", Some(d_sinks))], &read)?;
        let bound = bind_f32("d_sinks", d_sinks, f.shape.num_heads, &self.context().caps)?;
        let sequences = crate::plan::SequenceIndex::of(f);
        let pipeline = self.pipelines().get(&KernelConfig::SinkGrad { sequences })?;
        Ok(Some((pipeline, bound)))
    }

    /// The bias gradient's output, when the call asks for it: `d_bias` given exactly when the
    /// problem asks for the gradient (else an error), [`BackwardProblem::d_bias_len`] f32 values,
    /// apart from every tensor the backward reads and from the bytes of the other gradients
    /// (`d_sinks` bound, when the call computes it).
    fn bind_d_bias<'a>(
        &self,
        problem: &BackwardProblem,
        buffers: &BackwardBuffers<'a>,
        bound: &BoundBackward<'a>,
        d_sinks: Option<&Bound<'a>>,
    ) -> Result<Option<Bound<'a>>> {
        check_d_bias_wanted(problem, buffers.d_bias.as_ref())?;
        let Some(d_bias) = &buffers.d_bias else {
            return Ok(None);
        };
        // The index tensors (the bias among them) are checked against it in `bind_index`.
        let mut read = buffers.read();
        read.push(("delta", buffers.delta.as_ref()));
        check_written_apart_from_read(&[("d_bias", Some(d_bias))], &read)?;
        let d = bind_f32("d_bias", d_bias, problem.d_bias_len(), &self.context().caps)?;
        for (name, other) in [
            ("dq", Some(&bound.dq)),
            ("dk", Some(&bound.dk)),
            ("dv", Some(&bound.dv)),
            ("d_sinks", d_sinks),
        ] {
            if let Some(other) = other {
                check_disjoint("d_bias", &d, name, other)?;
            }
        }
        Ok(Some(d))
    }

    /// Checks that `config` can run here and was made for this problem.
    fn check_config(&self, problem: &BackwardProblem, config: &BackwardConfig) -> Result<()> {
        let caps = &self.context().caps;
        if let Some(why) = config.unavailable_reason(caps) {
            return Err(Error::Unavailable {
                what: format!("backward configuration `{}`", config.name()),
                why,
            });
        }
        let f = &problem.forward;
        if problem.bias_grad != config.computes_d_bias() {
            return crate::error::invalid!(
                "configuration `{}` was selected for a problem that {} the score bias's gradient; this one {}",
                config.name(),
                if config.computes_d_bias() {
                    "asks for"
                } else {
                    "does not ask for"
                },
                if problem.bias_grad { "does" } else { "does not" }
            );
        }
        for kernel in config.kernels() {
            let fits = match kernel {
                // The index tensors it reads, which a kernel built without them would not.
                BackwardKernel::Preprocess(p) => p.sequences == crate::plan::SequenceIndex::of(f),
                // The per-head tensors it binds, and the soft-cap and ALiBi a matrix kernel
                // compiles in (the tiled kernels read both at run time); the index tensors, the
                // mask and dropout, which a kernel built without them would silently not apply.
                BackwardKernel::Grad(g) => {
                    g.head_dim_pad == g.pads_head_dim_to(f.shape.head_dim as u32)
                        && g.bias == f.bias.map(|b| b.dtype)
                        && g.head_tensors == f.has_alibi_tensor()
                        && g.sequences == crate::plan::SequenceIndex::of(f)
                        && g.mask == crate::plan::MaskBinding::of(f)
                        && g.dropout.is_some() == f.active_dropout().is_some()
                        && (!g.coop || (g.softcap == f.cap_form() && g.alibi == f.alibi.is_some()))
                }
            };
            if kernel.storage() != f.dtype || !fits {
                return crate::error::invalid!(
                    "kernel `{}` was selected for another problem (dtype {}, head_dim {}, bias {}, soft-cap {:?}, \
                     ALiBi {:?}, index tensors {:?}, mask {:?}, dropout {})",
                    kernel.name(),
                    f.dtype.name(),
                    f.shape.head_dim,
                    f.bias.map_or("none", |b| b.dtype.name()),
                    f.softcap,
                    f.alibi,
                    crate::plan::SequenceIndex::of(f),
                    crate::plan::MaskBinding::of(f),
                    f.active_dropout().is_some()
                );
            }
        }
        let max = caps.max_workgroups_per_dimension as usize;
        for pass in config.passes() {
            if backward_grid(problem, config, pass).iter().any(|&n| n > max) {
                return Err(Error::TooLarge(format!(
                    "the {} grid exceeds the device's {max} workgroups per dispatch dimension",
                    pass.entry_point()
                )));
            }
        }
        Ok(())
    }

    /// What [`bind_backward`](Self::bind_backward) checks, except the size of one binding: the
    /// whole call's buffers, before a caller cuts the call into blocks (src/runtime/ring.rs).
    pub(super) fn check_backward_buffers(
        &self,
        problem: &BackwardProblem,
        buffers: &BackwardBuffers<'_>,
    ) -> Result<()> {
        self.bind_backward(problem, buffers, &split::unbounded(&self.context().caps))
            .map(|_| ())
    }

    /// Checks the caller's buffers against the problem and the limits in `caps`.
    fn bind_backward<'a>(
        &self,
        problem: &BackwardProblem,
        buffers: &BackwardBuffers<'a>,
        caps: &Caps,
    ) -> Result<BoundBackward<'a>> {
        let f = &problem.forward;
        let es = f.dtype.size_bytes();
        check_written_apart_from_read(
            &[
                ("dq", Some(&buffers.dq)),
                ("dk", Some(&buffers.dk)),
                ("dv", Some(&buffers.dv)),
            ],
            &buffers.read(),
        )?;
        let input = |t: Tensor, tb: &TensorBuffer<'a>| bind(t.name(), tb, f.layout(t), f.required_len(t), es, caps);
        let grad = |t: GradTensor, tb: &TensorBuffer<'a>| {
            bind(t.name(), tb, problem.layout(t), problem.required_len(t), es, caps)
        };
        let bound = BoundBackward {
            q: input(Tensor::Q, &buffers.q)?,
            k: input(Tensor::K, &buffers.k)?,
            v: input(Tensor::V, &buffers.v)?,
            o: input(Tensor::O, &buffers.o)?,
            lse: bind_f32("lse", &buffers.lse, f.lse_len(), caps)?,
            d_o: grad(GradTensor::DO, &buffers.d_o)?,
            dq: grad(GradTensor::DQ, &buffers.dq)?,
            dk: grad(GradTensor::DK, &buffers.dk)?,
            dv: grad(GradTensor::DV, &buffers.dv)?,
        };
        // The gradients may share a buffer, not bytes.
        check_disjoint("dk", &bound.dk, "dq", &bound.dq)?;
        check_disjoint("dv", &bound.dv, "dq", &bound.dq)?;
        check_disjoint("dv", &bound.dv, "dk", &bound.dk)?;
        Ok(bound)
    }

    /// The backward pass on host slices: uploads the inputs (laid out as the problem says), runs
    /// the three kernels and returns dQ, dK and dV. Device memory used: the inputs, the three
    /// gradients and `4·batch·num_heads·seq_q` bytes for D — nothing of size `seq_q × seq_kv`.
    pub async fn backward<T: Element>(
        &self,
        problem: impl Into<BackwardProblem>,
        inputs: &BackwardInputs<'_, T>,
    ) -> Result<BackwardOutput<T>> {
        self.backward_with_index(problem.into(), inputs, None).await
    }

    /// [`backward`](Self::backward) for a packed batch
    /// ([`AttentionProblem::with_varlen`](crate::problem::AttentionProblem::with_varlen)): the inputs
    /// packed, `index` the row offsets, checked before anything is uploaded
    /// ([`BatchIndex::validate`]). Gradient rows past the last sequence come back 0.
    pub async fn backward_indexed<T: Element>(
        &self,
        problem: impl Into<BackwardProblem>,
        inputs: &BackwardInputs<'_, T>,
        index: &BatchIndex<'_>,
    ) -> Result<BackwardOutput<T>> {
        self.backward_with_index(problem.into(), inputs, Some(index)).await
    }

    /// [`backward_indexed`](Self::backward_indexed), blocking (not on the web).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn backward_indexed_blocking<T: Element>(
        &self,
        problem: impl Into<BackwardProblem>,
        inputs: &BackwardInputs<'_, T>,
        index: &BatchIndex<'_>,
    ) -> Result<BackwardOutput<T>> {
        pollster::block_on(self.backward_indexed(problem, inputs, index))
    }

    async fn backward_with_index<T: Element>(
        &self,
        problem: BackwardProblem,
        inputs: &BackwardInputs<'_, T>,
        index: Option<&BatchIndex<'_>>,
    ) -> Result<BackwardOutput<T>> {
        problem.validate()?;
        if let Some(index) = index {
            index.validate(&problem.forward)?;
        }
        // An index of more than per-head terms (packed offsets) keeps a problem whole
        // (src/runtime/split.rs).
        if index.is_none() || split::splittable(&problem.forward) {
            if let Err(Error::TooLarge(why)) = self.backward_fits_on_own_buffers(&problem) {
                return self.backward_in_parts(problem, inputs, index, &why).await;
            }
        }
        let at = Placement::whole(&problem.forward);
        self.backward_whole(problem, at, inputs, index).await
    }

    /// A host-slice backward as one call of each kernel (see
    /// [`backward_with_index`](Self::backward_with_index)).
    async fn backward_whole<T: Element>(
        &self,
        problem: BackwardProblem,
        at: Placement,
        inputs: &BackwardInputs<'_, T>,
        index: Option<&BatchIndex<'_>>,
    ) -> Result<BackwardOutput<T>> {
        let lengths = check_backward_slices(&problem, inputs)?;
        let f = &problem.forward;
        let config = self.prepare_backward(problem).await?;
        let device = &self.context().device;
        let es = f.dtype.size_bytes();
        let caps = &self.context().caps;
        for (tensor, _, need) in lengths {
            let es = if tensor == "lse" { 4 } else { es };
            check_buffer_size(tensor, byte_len(tensor, need, es)?, caps)?;
        }
        // Every buffer is checked before the first is created (see `FlashAttention::forward`).
        for t in [GradTensor::DQ, GradTensor::DK, GradTensor::DV] {
            check_buffer_size(t.name(), byte_len(t.name(), problem.required_len(t), es)?, caps)?;
        }
        check_buffer_size("delta", byte_len("delta", f.lse_len(), 4)?, caps)?;
        let d_bias_bytes = byte_len("d_bias", problem.d_bias_len(), 4)?;
        check_buffer_size("d_bias", d_bias_bytes, caps)?;
        self.context().check_device(true)?;
        let mut uploaded = self.upload_index(index)?;
        // A summary of the mask, if asked for, computed on the device before the call reads it.
        uploaded.mask_blocks = self.host_mask_blocks_buffer(f)?;
        let index = uploaded.buffers();
        let queue = &self.context().queue;
        let [q, k, v, o, lse, d_o] = self.upload_backward_inputs(inputs, &lengths);
        let grad_bytes = |t| problem.required_len(t) as u64 * es as u64;
        let output = |t: GradTensor| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(t.name()),
                size: grad_bytes(t),
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            })
        };
        let (dq, dk, dv) = (output(GradTensor::DQ), output(GradTensor::DK), output(GradTensor::DV));
        let delta = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("wgpu-flash-attn backward delta"),
            size: 4 * f.lse_len() as u64,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        let sinks_bytes = 4 * f.shape.num_heads as u64;
        let d_sinks = f.sinks.then(|| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("d_sinks"),
                size: sinks_bytes,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            })
        });
        let d_bias = problem.bias_grad.then(|| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("d_bias"),
                size: d_bias_bytes,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            })
        });
        let buffers = BackwardBuffers {
            q: TensorBuffer::new(&q),
            k: TensorBuffer::new(&k),
            v: TensorBuffer::new(&v),
            o: TensorBuffer::new(&o),
            lse: TensorBuffer::new(&lse),
            d_o: TensorBuffer::new(&d_o),
            dq: TensorBuffer::new(&dq),
            dk: TensorBuffer::new(&dk),
            dv: TensorBuffer::new(&dv),
            delta: Some(TensorBuffer::new(&delta)),
            cu_seqlens_q: index.cu_seqlens_q,
            cu_seqlens_k: index.cu_seqlens_k,
            alibi_slopes: index.alibi_slopes,
            sinks: index.sinks,
            d_sinks: d_sinks.as_ref().map(TensorBuffer::new),
            bias: index.bias,
            mask: index.mask,
            mask_blocks: index.mask_blocks,
            d_bias: d_bias.as_ref().map(TensorBuffer::new),
        };
        let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some(&config.name()),
        });
        self.record_host_mask_blocks(&mut encoder, f, &index)?;
        self.encode_passes(&mut encoder, &problem, at, &buffers, &config, &config.passes(), None)?;
        self.context().queue.submit([encoder.finish()]);
        let mut ranges = vec![
            (&dq, 0, grad_bytes(GradTensor::DQ)),
            (&dk, 0, grad_bytes(GradTensor::DK)),
            (&dv, 0, grad_bytes(GradTensor::DV)),
        ];
        ranges.extend(d_sinks.as_ref().map(|d| (d, 0, sinks_bytes)));
        ranges.extend(d_bias.as_ref().map(|d| (d, 0, d_bias_bytes)));
        let bytes = read_back_within(device, queue, &ranges, self.options().read_back_timeout).await;
        // An error the device recorded meanwhile explains a failed read-back, and spoils a good one.
        self.context().check_device(false)?;
        let bytes = bytes?;
        let all = [&q, &k, &v, &o, &lse, &d_o, &dq, &dk, &dv, &delta];
        let optional = [&d_sinks, &d_bias].map(|b| b.as_ref().map_or(0, |b| b.size()));
        // After dQ, dK, dV: d_sinks where the problem has sinks, then d_bias where it asks for it.
        let mut extra = bytes[3..].iter();
        let mut next_f32 = |present: bool| match present {
            true => extra.next().map_or_else(Vec::new, |b| bytemuck::pod_collect_to_vec(b)),
            false => Vec::new(),
        };
        Ok(BackwardOutput {
            dq: bytemuck::pod_collect_to_vec(&bytes[0]),
            dk: bytemuck::pod_collect_to_vec(&bytes[1]),
            dv: bytemuck::pod_collect_to_vec(&bytes[2]),
            d_sinks: next_f32(d_sinks.is_some()),
            d_bias: next_f32(d_bias.is_some()),
            config,
            device_bytes: all.iter().map(|b| b.size()).sum::<u64>() + optional.iter().sum::<u64>(),
        })
    }

    /// Whether a host-slice backward runs `problem` as one call of each kernel: the grids, and
    /// each buffer it creates (the inputs from element 0 of their slices, the gradients, D) within
    /// what the device allocates and binds. [`Error::TooLarge`] says which does not fit.
    fn backward_fits_on_own_buffers(&self, problem: &BackwardProblem) -> Result<()> {
        self.select_backward(*problem)?;
        let caps = &self.context().caps;
        let f = &problem.forward;
        let es = f.dtype.size_bytes();
        let tensors = [Tensor::Q, Tensor::K, Tensor::V, Tensor::O].map(|t| (t.name(), f.layout(t), f.required_len(t)));
        let grads = GradTensor::ALL.map(|t| (t.name(), problem.layout(t), problem.required_len(t)));
        for (name, layout, len) in tensors.into_iter().chain(grads) {
            let bytes = byte_len(name, len, es)?;
            check_buffer_size(name, bytes, caps)?;
            let first = byte_len(name, layout.offset, es)?;
            check_binding_size(name, bytes - binding_start(first, es, caps), caps)?;
        }
        for (name, len) in [
            ("lse", f.lse_len()),
            ("delta", f.lse_len()),
            ("d_bias", problem.d_bias_len()),
        ] {
            let bytes = byte_len(name, len, 4)?;
            check_buffer_size(name, bytes, caps)?;
            check_binding_size(name, bytes, caps)?;
        }
        Ok(())
    }

    /// A host-slice backward too large for one call of each kernel on buffers of its own
    /// (`too_large` says why): its parts ([`split::plan`]: whole batch entries or K/V head
    /// groups), each uploaded, run and read back in turn, scattered into the whole's gradients.
    /// `index`, checked by the caller, holds at most the per-head terms: each part gets its heads'
    /// share of them, and the sinks' gradient is the sum of the parts'.
    async fn backward_in_parts<T: Element>(
        &self,
        whole: BackwardProblem,
        inputs: &BackwardInputs<'_, T>,
        index: Option<&BatchIndex<'_>>,
        too_large: &str,
    ) -> Result<BackwardOutput<T>> {
        check_backward_slices(&whole, inputs)?;
        refuse_split_bias_grad(&whole, too_large)?;
        let f = &whole.forward;
        let parts = split::plan(f, Pass::Backward, too_large, |part| {
            self.backward_fits_on_own_buffers(&on_own_buffers_backward(whole, part))
        })?;
        let zero = <T as bytemuck::Zeroable>::zeroed();
        let mut grads = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
        for (g, t) in grads.iter_mut().zip(GradTensor::ALL).skip(1) {
            *g = host_output(t.name(), whole.required_len(t), zero)?;
        }
        let mut d_sinks = if f.sinks {
            vec![0.0f32; f.shape.num_heads]
        } else {
            Vec::new()
        };
        let (mut config, mut device_bytes) = (None, 0);
        let group = f.group_size();
        let whole_at = Placement::whole(f);
        for part in &parts {
            let sub = on_own_buffers_backward(whole, part);
            // The part's heads of each (validated) `[num_heads]` tensor.
            let heads = part.h0..part.h0 + part.nh;
            // The score bias and mask whole: the part's layouts start at its first element.
            let sub_index = index.map(|i| BatchIndex {
                alibi_slopes: i.alibi_slopes.map(|t| &t[heads.clone()]),
                sinks: i.sinks.map(|t| &t[heads.clone()]),
                bias: i.bias,
                mask: i.mask,
                ..BatchIndex::default()
            });
            let sf = &sub.forward;
            let slice =
                |data, layout: &TensorLayout, kv, len| part_slice(data, layout, part.offset_in(layout, kv, group), len);
            let (_, lse_at, lse_len) = part.lse_runs(f)[0];
            let sub_inputs = BackwardInputs {
                q: slice(inputs.q, &f.q_layout, false, sf.required_len(Tensor::Q)),
                k: slice(inputs.k, &f.k_layout, true, sf.required_len(Tensor::K)),
                v: slice(inputs.v, &f.v_layout, true, sf.required_len(Tensor::V)),
                o: slice(inputs.o, &f.o_layout, false, sf.required_len(Tensor::O)),
                lse: &inputs.lse[lse_at..lse_at + lse_len],
                d_o: slice(
                    inputs.d_o,
                    whole.layout(GradTensor::DO),
                    false,
                    sub.required_len(GradTensor::DO),
                ),
            };
            let result = self
                .backward_whole(sub, whole_at.of_part(part), &sub_inputs, sub_index.as_ref())
                .await?;
            for (total, part) in d_sinks.iter_mut().skip(part.h0).zip(&result.d_sinks) {
                *total += part;
            }
            let s = f.shape;
            let kv_heads = sf.shape.num_kv_heads;
            for (i, (t, from)) in [
                (GradTensor::DQ, &result.dq),
                (GradTensor::DK, &result.dk),
                (GradTensor::DV, &result.dv),
            ]
            .into_iter()
            .enumerate()
            {
                let (extent, start) = match t {
                    GradTensor::DQ => ((part.nb, s.seq_q, part.nh), (part.b0, 0, part.h0)),
                    _ => ((part.nb, s.seq_kv, kv_heads), (part.b0, 0, part.h0 / group)),
                };
                scatter_rows(
                    &mut grads[i + 1],
                    whole.layout(t),
                    from,
                    sub.layout(t),
                    extent,
                    start,
                    s.head_dim,
                );
            }
            config.get_or_insert(result.config);
            device_bytes += result.device_bytes;
        }
        let [_, dq, dk, dv] = grads;
        Ok(BackwardOutput {
            dq,
            dk,
            dv,
            d_sinks,
            // A problem with a bias is never split (src/runtime/split.rs).
            d_bias: Vec::new(),
            // `plan` returns at least one part.
            config: config.ok_or_else(|| Error::TooLarge(too_large.to_string()))?,
            device_bytes,
        })
    }

    /// Queues the upload of a host-slice backward's six inputs, cut to the lengths
    /// [`check_backward_slices`] found: q, k, v, o, lse, d_o. The LSE's buffer can be copied from
    /// (a call split on the device, or a ring, copies its rows out).
    pub(super) fn upload_backward_inputs<T: Element>(
        &self,
        inputs: &BackwardInputs<'_, T>,
        lengths: &[(&'static str, usize, usize); 6],
    ) -> [wgpu::Buffer; 6] {
        let (device, queue) = (&self.context().device, &self.context().queue);
        fn cut<E: bytemuck::Pod>(x: &[E], len: usize) -> &[u8] {
            bytemuck::cast_slice(&x[..len])
        }
        let up = |i: usize, bytes: &[u8], usage| upload_queued(device, queue, lengths[i].0, bytes, usage);
        let none = wgpu::BufferUsages::empty();
        [
            up(0, cut(inputs.q, lengths[0].2), none),
            up(1, cut(inputs.k, lengths[1].2), none),
            up(2, cut(inputs.v, lengths[2].2), none),
            up(3, cut(inputs.o, lengths[3].2), none),
            up(4, cut(inputs.lse, lengths[4].2), wgpu::BufferUsages::COPY_SRC),
            up(5, cut(inputs.d_o, lengths[5].2), none),
        ]
    }

    /// [`backward`](Self::backward), blocking until the result is back (not on the web).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn backward_blocking<T: Element>(
        &self,
        problem: impl Into<BackwardProblem>,
        inputs: &BackwardInputs<'_, T>,
    ) -> Result<BackwardOutput<T>> {
        pollster::block_on(self.backward(problem, inputs))
    }
}

/// [`Error::TooLarge`] for a backward too large for one dispatch (`too_large` says why) that asks
/// for the score bias's gradient: a sum over the dimensions the bias broadcasts, which each part
/// would write over the last's.
fn refuse_split_bias_grad(whole: &BackwardProblem, too_large: &str) -> Result<()> {
    if !whole.bias_grad {
        return Ok(());
    }
    Err(Error::TooLarge(format!(
        "{too_large}; the problem cannot be split into smaller dispatches while it computes the score bias's \
         gradient (each part would write its own sums over the last's): a device that binds the whole call, \
         or the bias's gradient left out"
    )))
}

/// A part's backward problem: the part's forward problem, the whole's gradient layouts.
fn part_problem(whole: &BackwardProblem, part: &Part) -> BackwardProblem {
    BackwardProblem {
        forward: part.problem(&whole.forward),
        ..*whole
    }
}

/// A part's backward problem on buffers of its own (a host-slice call's): every layout starts at
/// the part's first element.
fn on_own_buffers_backward(whole: BackwardProblem, part: &Part) -> BackwardProblem {
    let mut sub = part_problem(&whole, part);
    sub.forward = on_own_buffers(part, &whole.forward);
    for l in [
        &mut sub.d_o_layout,
        &mut sub.dq_layout,
        &mut sub.dk_layout,
        &mut sub.dv_layout,
    ] {
        l.offset = 0;
    }
    sub
}

/// The checks of a host-slice backward's inputs that need no device: the element type and each
/// slice's length; returns `(tensor, length, needed)` for q, k, v, o, lse, d_o.
pub(super) fn check_backward_slices<T: Element>(
    problem: &BackwardProblem,
    inputs: &BackwardInputs<'_, T>,
) -> Result<[(&'static str, usize, usize); 6]> {
    let f = &problem.forward;
    if T::DTYPE != f.dtype {
        return Err(Error::DTypeMismatch {
            tensor: "q",
            expected: f.dtype,
            got: T::DTYPE,
        });
    }
    let lengths = [
        ("q", inputs.q.len(), f.required_len(Tensor::Q)),
        ("k", inputs.k.len(), f.required_len(Tensor::K)),
        ("v", inputs.v.len(), f.required_len(Tensor::V)),
        ("o", inputs.o.len(), f.required_len(Tensor::O)),
        ("lse", inputs.lse.len(), f.lse_len()),
        ("d_o", inputs.d_o.len(), problem.required_len(GradTensor::DO)),
    ];
    check_holds(lengths)?;
    Ok(lengths)
}
