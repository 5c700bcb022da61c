//! Recording the decode kernel: one dispatch over (pieces of the keys, K/V heads × row blocks,
//! batch), and with more than one piece the combine dispatch over (query rows, heads, batch),
//! in one compute pass. The partial results live in scratch buffers the engine keeps between
//! calls (src/gpu/scratch.rs): a serving loop decodes thousands of times a second, and a buffer
//! per call would cost an allocation and a zero-fill each.

use wgpu::util::DeviceExt;

use crate::error::{Error, Result};
use crate::gpu::binding::{check_buffer_size, Bound};
use crate::plan::{DecodeConfig, DecodeSplit};
use crate::problem::AttentionProblem;
use crate::runtime::forward::{scratch_bytes, FlashAttention};
use crate::runtime::index::IndexBindings;
use crate::wgsl::params::Params;
use crate::wgsl::{KernelConfig, COMBINE_HEAD_BINDING, DECODE_HEAD_BINDING};

impl FlashAttention {
    /// Records the decode kernel (and the combine) for `problem` on the checked bindings `bound`
    /// (q, k, v, o, lse as `bind_forward` returns them).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn encode_decode(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        problem: &AttentionProblem,
        bound: &[Bound<'_>; 5],
        cache: &IndexBindings<'_>,
        write_lse: bool,
        timestamps: Option<wgpu::ComputePassTimestampWrites<'_>>,
        config: &DecodeConfig,
        split: &DecodeSplit,
    ) -> Result<()> {
        let ctx = self.context();
        // Selection checked the layouts for 16-byte loads (plan::wide_layout_reason); a caller's
        // byte offset can still leave K or V 8 bytes off a 16-byte boundary. The matrix kernel
        // then refuses; the lane kernel loads granule by granule.
        let off_16 = [("K", &bound[1]), ("V", &bound[2])]
            .into_iter()
            .find(|(_, b)| !b.strides.offset.is_multiple_of(2));
        let granule_loads;
        let config = match off_16 {
            Some((name, b)) if config.is_coop() => {
                return Err(Error::Unavailable {
                    what: "the cooperative-matrix decode kernel".into(),
                    why: format!(
                        "{name} starts at byte {} of its buffer, not a multiple of 16, and the kernel loads it \
                         in 16-byte pieces; move it, or ask for the lane kernel \
                         (DecodeChoice::cooperative_matrix: Some(false))",
                        b.first
                    ),
                })
            }
            Some(_) if config.word_granules() == 2 => {
                granule_loads = config.with_granule_loads();
                &granule_loads
            }
            _ => config,
        };
        let decode = self.pipelines().get(&KernelConfig::Decode(*config))?;
        let combine = match split.splits {
            1 => None,
            _ => Some(self.pipelines().get(&KernelConfig::DecodeCombine {
                storage: problem.dtype,
                sinks: problem.sinks,
            })?),
        };
        let (o_bytes, lse_bytes) = self.check_decode_scratch(problem, split)?;
        // With one piece nothing is written there, but every binding needs a buffer of its own:
        // WebGPU refuses two writable bindings of one buffer's bytes in a dispatch.
        let [o_partial, lse_partial] = self.decode_scratch().at_least(&ctx.device, [o_bytes, lse_bytes]);
        let (o_partial, lse_partial) = (&o_partial, &lse_partial);

        let strides = [bound[0].strides, bound[1].strides, bound[2].strides, bound[3].strides];
        let mut params = Params::for_flash(problem, strides, split.row_blocks, write_lse);
        params.num_splits = split.splits;
        params.keys_per_split = split.keys_per_split;
        if let Some(pages) = problem.kv_cache.paged {
            // Validation bounds all three by u32 (src/problem/cache.rs).
            params.page_size = pages.page_size as u32;
            params.pages_per_seq = pages.pages_per_seq as u32;
            params.num_pages = pages.num_pages as u32;
        }
        let params_buffer = ctx.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("wgpu-flash-attn decode params"),
            contents: bytemuck::bytes_of(&params),
            usage: wgpu::BufferUsages::UNIFORM,
        });

        let mut entries = vec![whole(0, &params_buffer)];
        entries.extend(bound.iter().enumerate().map(|(i, b)| b.entry(i as u32 + 1)));
        entries.push(whole(6, o_partial));
        entries.push(whole(7, lse_partial));
        entries.push(cache.page_table.entry(8));
        entries.push(cache.kv_lens.entry(9));
        if config.head_tensors {
            entries.extend(cache.head_entries(DECODE_HEAD_BINDING));
        }
        let name = config.name();
        let decode_group = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(&name),
            layout: &decode.get_bind_group_layout(0),
            entries: &entries,
        });
        let combine_group = combine.as_ref().map(|pipeline| {
            let mut entries = vec![
                whole(0, &params_buffer),
                whole(1, o_partial),
                whole(2, lse_partial),
                bound[3].entry(3),
                bound[4].entry(4),
            ];
            // The combine reads only the sinks, the second per-head tensor.
            if problem.sinks {
                entries.push(cache.sinks.entry(COMBINE_HEAD_BINDING + 1));
            }
            ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("decode_combine"),
                layout: &pipeline.get_bind_group_layout(0),
                entries: &entries,
            })
        });

        let s = problem.shape;
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some(&name),
            timestamp_writes: timestamps,
        });
        pass.set_pipeline(&decode);
        pass.set_bind_group(0, &decode_group, &[]);
        pass.dispatch_workgroups(split.splits, s.num_kv_heads as u32 * split.row_blocks, s.batch as u32);
        if let (Some(pipeline), Some(group)) = (&combine, &combine_group) {
            pass.set_pipeline(pipeline);
            pass.set_bind_group(0, group, &[]);
            pass.dispatch_workgroups(s.seq_q as u32, s.num_heads as u32, s.batch as u32);
        }
        Ok(())
    }
}

impl FlashAttention {
    /// The bytes of the decode kernel's partial results for `split`, refused where the device
    /// cannot allocate or bind them (checked before anything is recorded).
    pub(crate) fn check_decode_scratch(&self, problem: &AttentionProblem, split: &DecodeSplit) -> Result<(u64, u64)> {
        let caps = &self.context().caps;
        let (o_bytes, lse_bytes) = scratch_bytes(problem, split)?;
        for (name, bytes) in [("o_partial", o_bytes), ("lse_partial", lse_bytes)] {
            check_buffer_size(name, bytes, caps)?;
            if bytes > caps.max_storage_binding_bytes {
                return Err(Error::TooLarge(format!(
                    "the decode kernel's `{name}` needs {bytes} bytes, more than this device binds at once"
                )));
            }
        }
        Ok((o_bytes, lse_bytes))
    }
}

fn whole(binding: u32, buffer: &wgpu::Buffer) -> wgpu::BindGroupEntry<'_> {
    wgpu::BindGroupEntry {
        binding,
        resource: buffer.as_entire_binding(),
    }
}
