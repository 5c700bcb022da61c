//! Timing GPU work: timestamps written by the GPU at the start and end of a compute pass when the
//! device has them (1 ns ticks on NVIDIA), else the wall clock around submit-and-wait.
//! Used by the example and the benchmarks; blocking, so native only.

use std::time::Instant;

use crate::device::context::GpuContext;
use crate::error::{Error, Result};
use crate::gpu::readback::read_back;

/// Where a measurement came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Clock {
    GpuTimestamps,
    WallClock,
}

/// Median and spread of repeated runs, in seconds.
#[derive(Clone, Debug)]
pub struct Timing {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub runs: usize,
    pub clock: Clock,
}

impl Timing {
    fn from_samples(mut samples: Vec<f64>, clock: Clock) -> Self {
        samples.sort_by(f64::total_cmp);
        Timing {
            median: samples[samples.len() / 2],
            min: samples[0],
            max: samples[samples.len() - 1],
            runs: samples.len(),
            clock,
        }
    }
}

/// Runs `encode` `warmup` times untimed, then `runs` times timed (each in its own submission),
/// and returns the median. `encode` records one compute pass and must pass the given timestamp
/// writes to it (they are `None` when the device has no timestamps).
pub fn time_passes(
    ctx: &GpuContext,
    warmup: usize,
    runs: usize,
    mut encode: impl FnMut(&mut wgpu::CommandEncoder, Option<wgpu::ComputePassTimestampWrites<'_>>) -> Result<()>,
) -> Result<Timing> {
    let device = &ctx.device;
    let queue = &ctx.queue;
    let wait = || {
        device
            .poll(wgpu::PollType::wait_indefinitely())
            .map(|_| ())
            .map_err(|e| Error::ReadBack(e.to_string()))
    };
    for _ in 0..warmup {
        let mut encoder = device.create_command_encoder(&Default::default());
        encode(&mut encoder, None)?;
        queue.submit([encoder.finish()]);
        wait()?;
    }
    let runs = runs.max(1);
    let mut samples = Vec::with_capacity(runs);
    if ctx.caps.timestamps {
        // The runs go back to back in one submission, each pass between its own two timestamps,
        // as an application submits them (and as PyTorch's CUDA-event loops time its kernels):
        // waiting after every run would let the GPU idle and drop its clocks between runs, which
        // distorts kernels of tens of microseconds (decode steps).
        const RUNS_PER_SUBMIT: usize = 1024;
        let mut left = runs;
        while left > 0 {
            let batch = left.min(RUNS_PER_SUBMIT);
            left -= batch;
            let queries = 2 * batch as u32;
            let query_set = device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("wgpu-flash-attn timer"),
                ty: wgpu::QueryType::Timestamp,
                count: queries,
            });
            let resolved = device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("wgpu-flash-attn timer"),
                size: 8 * queries as u64,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            });
            let period = queue.get_timestamp_period() as f64 * 1e-9;
            let mut encoder = device.create_command_encoder(&Default::default());
            for run in 0..batch as u32 {
                encode(
                    &mut encoder,
                    Some(wgpu::ComputePassTimestampWrites {
                        query_set: &query_set,
                        beginning_of_pass_write_index: Some(2 * run),
                        end_of_pass_write_index: Some(2 * run + 1),
                    }),
                )?;
            }
            encoder.resolve_query_set(&query_set, 0..queries, &resolved, 0);
            queue.submit([encoder.finish()]);
            let bytes = pollster::block_on(read_back(device, queue, &[(&resolved, 0, 8 * queries as u64)]))?;
            let ticks: Vec<u64> = bytemuck::pod_collect_to_vec(&bytes[0]);
            for pair in ticks.chunks_exact(2) {
                samples.push(pair[1].saturating_sub(pair[0]) as f64 * period);
            }
        }
        Ok(Timing::from_samples(samples, Clock::GpuTimestamps))
    } else {
        for _ in 0..runs {
            let mut encoder = device.create_command_encoder(&Default::default());
            encode(&mut encoder, None)?;
            let start = Instant::now();
            queue.submit([encoder.finish()]);
            wait()?;
            samples.push(start.elapsed().as_secs_f64());
        }
        Ok(Timing::from_samples(samples, Clock::WallClock))
    }
}
