//! Merging two partial attention results of the same query rows over disjoint key sets by their
//! LSEs (shaders/merge.wgsl; the float64 definition is `reference::merge_attention_states`): on the
//! caller's buffers, or on host slices.

use wgpu::util::DeviceExt;

use crate::error::{Error, Result};
use crate::gpu::binding::{
    bind, bind_f32, byte_len, check_buffer_size, check_disjoint, check_written_apart_from_read, Bound, TensorBuffer,
};
use crate::gpu::readback::{read_back, upload_queued};
use crate::problem::varlen::refuse_packed;
use crate::problem::{check_merge_inputs, AttentionProblem, Element, Tensor, TensorLayout};
use crate::runtime::forward::{AttentionOutput, FlashAttention};
use crate::wgsl::params::Params;
use crate::wgsl::KernelConfig;

/// Invocations per workgroup of the granule walks (shaders/granule_walk.wgsl's `WG`): the
/// merge's and the ring's gradient sums.
const GRANULE_WALK_WORKGROUP: u64 = 64;

/// The tensors of one merge, in the caller's buffers.
///
/// Read: `o_a`, `o_b` (elements of the problem's dtype at its `o_layout`), `lse_a`, `lse_b`
/// (f32 `[batch, num_heads, seq_q]`, as the forward writes them: finite, or −∞ for a row that saw
/// no key). Written: `o` (at `o_layout`) and, when given, `lse`. A written tensor must not share a
/// buffer with a read one (wgpu's rule; so nothing is merged in place: merge into a second buffer
/// and swap), and `o` and `lse` may share a buffer only at disjoint bytes. The read tensors may
/// share buffers freely. Every LSE's byte offset must meet the device's
/// `min_storage_buffer_offset_alignment`.
#[derive(Clone, Copy, Debug)]
pub struct MergeBuffers<'a> {
    /// Read: the first partial O.
    pub o_a: TensorBuffer<'a>,
    /// Read: its LSE.
    pub lse_a: TensorBuffer<'a>,
    /// Read: the second partial O.
    pub o_b: TensorBuffer<'a>,
    /// Read: its LSE.
    pub lse_b: TensorBuffer<'a>,
    /// Written: the merged O.
    pub o: TensorBuffer<'a>,
    /// Written when given: the merged LSE.
    pub lse: Option<TensorBuffer<'a>>,
}

impl FlashAttention {
    /// Records the merge of two partial results into `encoder`, on the caller's buffers: for each
    /// row of `[batch, num_heads, seq_q]`, `lse = log(exp(lse_a) + exp(lse_b))` (computed from the
    /// larger) and `o = exp(lse_a − lse)·o_a + exp(lse_b − lse)·o_b`; a side with LSE −∞ has
    /// weight 0 and both −∞ give `o = 0`, `lse = −∞` (see `reference::merge_attention_states`).
    /// Of `problem`, only batch, num_heads, seq_q, head_dim, the dtype and `o_layout` matter.
    /// Never blocks; nothing is recorded on an error (the problem's; a buffer too small,
    /// misaligned, without `BufferUsages::STORAGE`, or written while read:
    /// [`Error::InvalidBuffer`]; a tensor or grid past the device's limits: [`Error::TooLarge`]).
    pub fn encode_merge(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        problem: &AttentionProblem,
        buffers: &MergeBuffers<'_>,
    ) -> Result<()> {
        self.encode_merge_laid_out(encoder, problem, [problem.o_layout; 3], buffers)
    }

    /// [`encode_merge`](Self::encode_merge) with each O at its own layout (`o_a`, `o_b`, `o`):
    /// the ring merges chunk-sized scratch into views of the caller's O (src/runtime/ring.rs).
    pub(crate) fn encode_merge_laid_out(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        problem: &AttentionProblem,
        layouts: [TensorLayout; 3],
        buffers: &MergeBuffers<'_>,
    ) -> Result<()> {
        self.context().check_device(false)?;
        problem.validate()?;
        refuse_packed(problem, "the merge")?;
        let grid = self.merge_grid(problem)?;
        let config = KernelConfig::Merge { storage: problem.dtype };
        let bound = self.bind_merge(problem, layouts, buffers)?;
        let [o_a, _, o_b, _, o, _] = bound;
        let params = Params::for_merge(problem, [o_a.strides, o_b.strides, o.strides], buffers.lse.is_some());
        self.record_elementwise(encoder, &config, &params, &bound, grid)
    }

    /// Records one dispatch of an element-wise kernel over O-shaped tensors (the merge, ring
    /// attention's gradient sums): `params` at binding 0, `bound` from binding 1 on, `grid`
    /// workgroups, in a compute pass of its own labelled with the config's name.
    pub(super) fn record_elementwise(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        config: &KernelConfig,
        params: &Params,
        bound: &[Bound<'_>],
        [x, y, z]: [u32; 3],
    ) -> Result<()> {
        let pipeline = self.pipelines().get(config)?;
        let name = config.name();
        let device = &self.context().device;
        let params_buffer = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(&name),
            contents: bytemuck::bytes_of(params),
            usage: wgpu::BufferUsages::UNIFORM,
        });
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: params_buffer.as_entire_binding(),
        }];
        for (i, b) in bound.iter().enumerate() {
            entries.push(b.entry(i as u32 + 1));
        }
        let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(&name),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some(&name),
            timestamp_writes: None,
        });
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bind_group, &[]);
        pass.dispatch_workgroups(x, y, z);
        Ok(())
    }

    /// The merge's grid: (granule blocks of one (batch, head), num_heads, batch); the kernel
    /// strides over what the x dimension cannot cover.
    pub(super) fn merge_grid(&self, problem: &AttentionProblem) -> Result<[u32; 3]> {
        let s = problem.shape;
        let max_dim = self.context().caps.max_workgroups_per_dimension as u64;
        for (what, n) in [("heads", s.num_heads), ("batch entries", s.batch)] {
            if n as u64 > max_dim {
                return Err(Error::TooLarge(format!(
                    "the merge runs one workgroup row per head and batch entry: {n} {what} exceed the \
                     device's {max_dim} workgroups per dispatch dimension"
                )));
            }
        }
        let granules = s.seq_q as u64 * (s.head_dim / 4) as u64;
        let x = granules.div_ceil(GRANULE_WALK_WORKGROUP).clamp(1, max_dim.max(1));
        // The kernel counts granules in u32, one stride past the last.
        if granules + x * GRANULE_WALK_WORKGROUP > u32::MAX as u64 {
            return Err(Error::TooLarge(format!(
                "the merge counts one head's seq_q × head_dim / 4 = {granules} granules in 32 bits"
            )));
        }
        Ok([x as u32, s.num_heads as u32, s.batch as u32])
    }

    /// Checks the caller's buffers against the problem and the device: o_a, lse_a, o_b, lse_b, o,
    /// lse bindings.
    fn bind_merge<'a>(
        &'a self,
        problem: &AttentionProblem,
        [layout_a, layout_b, layout_o]: [TensorLayout; 3],
        buffers: &MergeBuffers<'a>,
    ) -> Result<[Bound<'a>; 6]> {
        let caps = &self.context().caps;
        let reads = [
            ("o_a", &buffers.o_a),
            ("lse_a", &buffers.lse_a),
            ("o_b", &buffers.o_b),
            ("lse_b", &buffers.lse_b),
        ];
        check_written_apart_from_read(
            &[("o", Some(&buffers.o)), ("lse", buffers.lse.as_ref())],
            &reads.map(|(name, t)| (name, Some(t))),
        )?;
        let (es, rows) = (problem.dtype.size_bytes(), problem.lse_len());
        let o_tensor = |name, tb: &TensorBuffer<'a>, layout: TensorLayout| {
            let laid_out = AttentionProblem {
                o_layout: layout,
                ..*problem
            };
            laid_out.validate()?;
            bind(name, tb, &layout, laid_out.required_len(Tensor::O), es, caps)
        };
        let unused = TensorBuffer::new(self.unused_lse());
        let lse = match &buffers.lse {
            Some(l) => bind_f32("lse", l, rows, caps)?,
            None => bind_f32("lse", &unused, 1, caps)?,
        };
        let bound = [
            o_tensor("o_a", &buffers.o_a, layout_a)?,
            bind_f32("lse_a", &buffers.lse_a, rows, caps)?,
            o_tensor("o_b", &buffers.o_b, layout_b)?,
            bind_f32("lse_b", &buffers.lse_b, rows, caps)?,
            o_tensor("o", &buffers.o, layout_o)?,
            lse,
        ];
        // Both are written: O and the LSE may share a buffer, not bytes.
        check_disjoint("lse", &bound[5], "o", &bound[4])?;
        Ok(bound)
    }

    /// [`encode_merge`](Self::encode_merge) on host slices: uploads the two partial results
    /// (`o_a`, `o_b` at the problem's `o_layout`, `lse_a`, `lse_b` f32 `[batch, num_heads,
    /// seq_q]`), merges them and reads O and the LSE back (`kernel` is `merge_{dtype}`). Without a
    /// GPU, `reference::merge_attention_states_host` computes the same on the host.
    pub async fn merge<T: Element>(
        &self,
        problem: &AttentionProblem,
        o_a: &[T],
        lse_a: &[f32],
        o_b: &[T],
        lse_b: &[f32],
    ) -> Result<AttentionOutput<T>> {
        check_merge_inputs(problem, o_a, lse_a, o_b, lse_b)?;
        let config = KernelConfig::Merge { storage: problem.dtype };
        self.pipelines().get_async(&config).await?;
        self.merge_grid(problem)?;
        let caps = &self.context().caps;
        let (o_len, rows) = (problem.required_len(Tensor::O), problem.lse_len());
        let o_bytes = byte_len("o", o_len, problem.dtype.size_bytes())?;
        let lse_bytes = byte_len("lse", rows, 4)?;
        // Every buffer is checked before the first is created (see `FlashAttention::forward`).
        for (tensor, bytes) in [("o", o_bytes), ("lse", lse_bytes)] {
            check_buffer_size(tensor, bytes, caps)?;
        }
        self.context().check_device(true)?;
        let (device, queue) = (&self.context().device, &self.context().queue);
        let up = |name, bytes: &[u8]| upload_queued(device, queue, name, bytes, wgpu::BufferUsages::empty());
        let inputs = [
            up("o_a", bytemuck::cast_slice(&o_a[..o_len])),
            up("lse_a", bytemuck::cast_slice(&lse_a[..rows])),
            up("o_b", bytemuck::cast_slice(&o_b[..o_len])),
            up("lse_b", bytemuck::cast_slice(&lse_b[..rows])),
        ];
        let output = |label, size| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            })
        };
        let (o, lse) = (output("o", o_bytes), output("lse", lse_bytes));
        let buffers = MergeBuffers {
            o_a: TensorBuffer::new(&inputs[0]),
            lse_a: TensorBuffer::new(&inputs[1]),
            o_b: TensorBuffer::new(&inputs[2]),
            lse_b: TensorBuffer::new(&inputs[3]),
            o: TensorBuffer::new(&o),
            lse: Some(TensorBuffer::new(&lse)),
        };
        let kernel = config.name();
        let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(&kernel) });
        self.encode_merge(&mut encoder, problem, &buffers)?;
        queue.submit([encoder.finish()]);
        let bytes = read_back(device, queue, &[(&o, 0, o_bytes), (&lse, 0, lse_bytes)]).await;
        // An error the device recorded meanwhile explains a failed read-back, and spoils a good one.
        self.context().check_device(false)?;
        let mut bytes = bytes?;
        let lse_out = bytemuck::pod_collect_to_vec(&bytes.pop().unwrap_or_default());
        let out = bytemuck::pod_collect_to_vec(&bytes.pop().unwrap_or_default());
        let device_bytes = inputs.iter().map(|b| b.size()).sum::<u64>() + o.size() + lse.size();
        Ok(AttentionOutput {
            out,
            lse: lse_out,
            kernel,
            device_bytes,
        })
    }

    /// [`merge`](Self::merge), blocking until the result is back (not on the web).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn merge_blocking<T: Element>(
        &self,
        problem: &AttentionProblem,
        o_a: &[T],
        lse_a: &[f32],
        o_b: &[T],
        lse_b: &[f32],
    ) -> Result<AttentionOutput<T>> {
        pollster::block_on(self.merge(problem, o_a, lse_a, o_b, lse_b))
    }
}
