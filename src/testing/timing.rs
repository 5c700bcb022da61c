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

/// Samples a timing takes at most: `runs` are spread over this many submissions.
const SAMPLES: usize = 5;

/// Runs `encode` `warmup` times untimed, then `runs` times timed, and returns the median of the
/// samples. With timestamps, a sample is the mean of a submission of up to `runs / SAMPLES`
/// runs back to back; without, each run is its own submission timed by the wall clock.
/// `encode` records one compute pass and must pass the given timestamp writes to it (`None`
/// when the device has no timestamps, or for the passes inside a sample).
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
    // The warm-up runs back to back, without waiting in between: an idle GPU lowers its core
    // and memory clocks, and only sustained work brings them back up.
    if warmup > 0 {
        let mut encoder = device.create_command_encoder(&Default::default());
        for _ in 0..warmup {
            encode(&mut encoder, None)?;
        }
        queue.submit([encoder.finish()]);
        wait()?;
    }
    let runs = runs.max(1);
    let mut samples = Vec::with_capacity(runs);
    if ctx.caps.timestamps {
        // Each sample is one submission of several runs back to back, as an application submits
        // them (and as PyTorch's CUDA-event loops time its kernels), timed from the first pass's
        // start to the last pass's end and divided by the runs: waiting after every run lets the
        // GPU idle and drop its clocks, and a pass's own start timestamp may be taken while the
        // previous pass still runs (a top-of-pipe write), so per-pass durations of short kernels
        // back to back are unreliable. The span of one submission is neither.
        let per_sample = runs.div_ceil(SAMPLES).max(1);
        let query_set = device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("wgpu-flash-attn timer"),
            ty: wgpu::QueryType::Timestamp,
            count: 2,
        });
        let resolved = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("wgpu-flash-attn timer"),
            size: 16,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let period = queue.get_timestamp_period() as f64 * 1e-9;
        let mut left = runs;
        while left > 0 {
            let batch = left.min(per_sample);
            left -= batch;
            let mut encoder = device.create_command_encoder(&Default::default());
            for run in 0..batch {
                let (first, last) = (run == 0, run + 1 == batch);
                let writes = (first || last).then(|| wgpu::ComputePassTimestampWrites {
                    query_set: &query_set,
                    beginning_of_pass_write_index: first.then_some(0),
                    end_of_pass_write_index: last.then_some(1),
                });
                encode(&mut encoder, writes)?;
            }
            encoder.resolve_query_set(&query_set, 0..2, &resolved, 0);
            queue.submit([encoder.finish()]);
            let bytes = pollster::block_on(read_back(device, queue, &[(&resolved, 0, 16)]))?;
            let ticks: Vec<u64> = bytemuck::pod_collect_to_vec(&bytes[0]);
            samples.push(ticks[1].saturating_sub(ticks[0]) as f64 * period / batch as f64);
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

/// Seconds per run of [`time_submission`], by the wall clock.
#[derive(Clone, Copy, Debug)]
pub struct SubmissionTiming {
    /// Recording one run into the encoder, on the host.
    pub record: f64,
    /// From the submission to its completion, divided by the runs in it.
    pub complete: f64,
}

/// Runs `encode` `warmup` times untimed, then `runs` times back to back in one submission, timing
/// the recording and the submission's completion by the wall clock: what an application that
/// records several calls and waits once sees. A cross-check of [`time_passes`], whose timestamps
/// bracket the passes alone.
pub fn time_submission(
    ctx: &GpuContext,
    warmup: usize,
    runs: usize,
    mut encode: impl FnMut(&mut wgpu::CommandEncoder) -> Result<()>,
) -> Result<SubmissionTiming> {
    let mut submit = |times: usize| -> Result<SubmissionTiming> {
        let recording = Instant::now();
        let mut encoder = ctx.device.create_command_encoder(&Default::default());
        for _ in 0..times {
            encode(&mut encoder)?;
        }
        let commands = encoder.finish();
        let record = recording.elapsed().as_secs_f64();
        let start = Instant::now();
        ctx.queue.submit([commands]);
        ctx.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::ReadBack(e.to_string()))?;
        let times = times as f64;
        Ok(SubmissionTiming {
            record: record / times,
            complete: start.elapsed().as_secs_f64() / times,
        })
    };
    if warmup > 0 {
        submit(warmup)?;
    }
    submit(runs.max(1))
}

/// How [`cuda_timing`] issues the timed calls.
#[cfg(feature = "cuda")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launches {
    /// Back to back: every call between its own two events, the host enqueueing the next call
    /// while the GPU runs this one, one wait at the end — PyTorch's event loop in
    /// `torch_sdpa.py`/`torch_decode.py`, so a call's time is its GPU time as long as the host
    /// enqueues faster than the GPU runs (the report says whether it did).
    Queued,
    /// One at a time: the host waits for each call before enqueueing the next, so each time
    /// also holds the host's latency to launch the call's kernels onto an idle GPU.
    OneAtATime,
}

/// A CUDA timing: the median (and fastest) GPU time of a call between its events, and the host's
/// time per call to enqueue it (queued launches: when it is close to or above `median_ms`, the
/// host, not the GPU, set the pace).
#[cfg(feature = "cuda")]
#[derive(Clone, Copy, Debug)]
pub struct CudaTiming {
    pub median_ms: f64,
    pub min_ms: f64,
    pub host_ms_per_call: f64,
}

/// Times `reps` calls of `call` on `device`'s stream, each between two CUDA events, after
/// `warmup` calls (kernels compile or load on the first). The CUDA examples' clock.
#[cfg(feature = "cuda")]
pub fn cuda_timing(
    device: &crate::cuda::CudaDevice,
    warmup: usize,
    reps: usize,
    launches: Launches,
    mut call: impl FnMut() -> Result<()>,
) -> Result<CudaTiming> {
    use cudarc::driver::sys::CUevent_flags;
    let stream = device.stream();
    for _ in 0..warmup {
        call()?;
    }
    stream.synchronize()?;
    let reps = reps.max(1);
    let new_event = || device.context().new_event(Some(CUevent_flags::CU_EVENT_DEFAULT));
    let mut events = Vec::with_capacity(reps);
    for _ in 0..reps {
        events.push((new_event()?, new_event()?));
    }
    let host = Instant::now();
    for (start, end) in &events {
        start.record(stream)?;
        call()?;
        end.record(stream)?;
        if launches == Launches::OneAtATime {
            end.synchronize()?;
        }
    }
    let host_ms_per_call = host.elapsed().as_secs_f64() * 1e3 / reps as f64;
    stream.synchronize()?;
    let mut times = Vec::with_capacity(reps);
    for (start, end) in &events {
        times.push(start.elapsed_ms(end)? as f64);
    }
    times.sort_by(|a, b| a.total_cmp(b));
    Ok(CudaTiming {
        median_ms: times[times.len() / 2],
        min_ms: times[0],
        host_ms_per_call,
    })
}

/// The median GPU time in ms of `reps` queued calls of `call` ([`cuda_timing`] with
/// [`Launches::Queued`]).
#[cfg(feature = "cuda")]
pub fn cuda_median_ms(
    device: &crate::cuda::CudaDevice,
    warmup: usize,
    reps: usize,
    call: impl FnMut() -> Result<()>,
) -> Result<f64> {
    cuda_timing(device, warmup, reps, Launches::Queued, call).map(|t| t.median_ms)
}
