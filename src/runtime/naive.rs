//! The naive baseline: the three kernels that write the whole `seq_q × seq_kv` score matrix
//! (shaders/naive_*.wgsl) — scores, a row softmax, P·V — in passes over (batch, head) pairs that
//! fit one binding. The reference point the flash kernels are measured against, on host slices
//! or the caller's buffers.

use crate::error::{Error, Result};
use crate::problem::{AttentionProblem, Element};
use crate::runtime::forward::{AttentionOutput, FlashAttention, ForwardBuffers};
use crate::wgsl::params::Params;
use crate::wgsl::{KernelConfig, NaivePass};

/// How the naive baseline splits a problem: the score matrices of `heads_per_pass`
/// (batch, head) pairs are materialized at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NaivePlan {
    /// (batch, head) pairs whose score matrices are in memory at once.
    pub heads_per_pass: usize,
    /// Rounds of the three naive kernels: `ceil(batch · num_heads / heads_per_pass)`.
    pub passes: usize,
    /// Size of the score buffer: `heads_per_pass · seq_q · seq_kv · 4` bytes.
    pub scores_bytes: u64,
}

impl FlashAttention {
    /// How the naive baseline would split `problem`, or [`Error::TooLarge`] when even one head's
    /// `seq_q × seq_kv` score matrix exceeds what the device binds — which is the point of flash
    /// attention.
    pub fn naive_plan(&self, problem: &AttentionProblem) -> Result<NaivePlan> {
        problem.validate()?;
        if let Some(why) =
            crate::plan::missing_features("the naive kernel", problem.features(), crate::plan::NAIVE_FEATURES)
        {
            return Err(Error::Unavailable {
                what: "the naive baseline".into(),
                why,
            });
        }
        let caps = &self.context().caps;
        let s = problem.shape;
        let per_head = 4 * s.seq_q as u64 * s.seq_kv as u64;
        let limit = caps.max_storage_binding_bytes.min(caps.max_buffer_bytes);
        if per_head > limit {
            return Err(Error::TooLarge(format!(
                "the naive kernel materializes a {}×{} score matrix per head ({per_head} bytes), more than \
                 this device binds at once ({limit} bytes)",
                s.seq_q, s.seq_kv
            )));
        }
        let max_dim = caps.max_workgroups_per_dimension as usize;
        if s.seq_q > max_dim {
            return Err(Error::TooLarge(format!(
                "the naive softmax runs one workgroup per row: {} rows exceed {max_dim}",
                s.seq_q
            )));
        }
        // The score and PV passes run 16×16 tiles (see `encode_naive`'s grids).
        for (what, n) in [
            ("key", s.seq_kv.div_ceil(16)),
            ("query", s.seq_q.div_ceil(16)),
            ("head_dim", (s.head_dim / 4).div_ceil(16)),
        ] {
            if n > max_dim {
                return Err(Error::TooLarge(format!(
                    "the naive kernel's grid has {n} {what} tiles of 16, more than the device's {max_dim} \
                     workgroups per dispatch dimension"
                )));
            }
        }
        let total = s.batch * s.num_heads;
        let heads_per_pass = ((limit / per_head) as usize).min(total).min(max_dim);
        Ok(NaivePlan {
            heads_per_pass,
            passes: total.div_ceil(heads_per_pass),
            scores_bytes: heads_per_pass as u64 * per_head,
        })
    }

    /// Records standard attention (scores, softmax, PV, with the score matrices in a scratch
    /// buffer it allocates) into `encoder`. The GPU baseline; same buffers as
    /// [`encode_forward`](Self::encode_forward).
    pub fn encode_naive(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        problem: &AttentionProblem,
        buffers: &ForwardBuffers<'_>,
        timestamps: Option<wgpu::ComputePassTimestampWrites<'_>>,
    ) -> Result<NaivePlan> {
        self.context().check_device(false)?;
        let plan = self.naive_plan(problem)?;
        let pipelines = NaivePass::ALL.map(|pass| {
            self.pipelines().get(&KernelConfig::Naive {
                pass,
                storage: problem.dtype,
            })
        });
        let [scores_p, softmax_p, pv_p] = pipelines;
        let (scores_p, softmax_p, pv_p) = (scores_p?, softmax_p?, pv_p?);
        let bound = self.bind_forward(problem, buffers)?;
        let scores = self.context().device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("naive scores"),
            size: plan.scores_bytes,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        let scores_entry = |binding| wgpu::BindGroupEntry {
            binding,
            resource: scores.as_entire_binding(),
        };

        let s = problem.shape;
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("naive attention"),
            timestamp_writes: timestamps,
        });
        let total = s.batch * s.num_heads;
        for first in (0..total).step_by(plan.heads_per_pass) {
            let heads = plan.heads_per_pass.min(total - first) as u32;
            let mut params = Params::for_problem(problem, problem.softmax_scale());
            params.q = bound[0].strides;
            params.k = bound[1].strides;
            params.v = bound[2].strides;
            params.o = bound[3].strides;
            params.write_lse = buffers.lse.is_some() as u32;
            params.bh_base = first as u32;
            let params_buffer = self.uniform(&params);
            let params_entry = wgpu::BindGroupEntry {
                binding: 0,
                resource: params_buffer.as_entire_binding(),
            };
            let group = |pipeline: &wgpu::ComputePipeline, entries: &[wgpu::BindGroupEntry<'_>]| {
                self.context().device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some("naive attention"),
                    layout: &pipeline.get_bind_group_layout(0),
                    entries,
                })
            };
            let steps = [
                (
                    &scores_p,
                    group(
                        &scores_p,
                        &[
                            params_entry.clone(),
                            bound[0].entry(1),
                            bound[1].entry(2),
                            scores_entry(3),
                        ],
                    ),
                    [s.seq_kv.div_ceil(16) as u32, s.seq_q.div_ceil(16) as u32, heads],
                ),
                (
                    &softmax_p,
                    group(&softmax_p, &[params_entry.clone(), scores_entry(1), bound[4].entry(2)]),
                    [s.seq_q as u32, heads, 1],
                ),
                (
                    &pv_p,
                    group(
                        &pv_p,
                        &[
                            params_entry.clone(),
                            scores_entry(1),
                            bound[2].entry(2),
                            bound[3].entry(3),
                        ],
                    ),
                    [(s.head_dim / 4).div_ceil(16) as u32, s.seq_q.div_ceil(16) as u32, heads],
                ),
            ];
            for (pipeline, bind_group, [x, y, z]) in &steps {
                pass.set_pipeline(pipeline);
                pass.set_bind_group(0, bind_group, &[]);
                pass.dispatch_workgroups(*x, *y, *z);
            }
        }
        Ok(plan)
    }

    /// The naive baseline on host slices (see [`forward`](Self::forward)).
    pub async fn naive_forward<T: Element>(
        &self,
        problem: &AttentionProblem,
        q: &[T],
        k: &[T],
        v: &[T],
    ) -> Result<AttentionOutput<T>> {
        let plan = self.naive_plan(problem)?;
        for pass in NaivePass::ALL {
            self.pipelines()
                .get_async(&KernelConfig::Naive {
                    pass,
                    storage: problem.dtype,
                })
                .await?;
        }
        let name = format!("naive_{}", problem.dtype.name());
        self.run_on_host(problem, q, k, v, name, plan.scores_bytes, |engine, encoder, buffers| {
            engine.encode_naive(encoder, problem, buffers, None).map(|_| ())
        })
        .await
    }

    /// [`naive_forward`](Self::naive_forward), blocking (not on the web).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn naive_forward_blocking<T: Element>(
        &self,
        problem: &AttentionProblem,
        q: &[T],
        k: &[T],
        v: &[T],
    ) -> Result<AttentionOutput<T>> {
        pollster::block_on(self.naive_forward(problem, q, k, v))
    }
}
