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

/// Seconds of back-to-back work before the timed samples. A GPU lowers its clocks when idle and
/// raises them only under sustained load: on a fresh H100 the SM clock sat at 600–960 MHz (of
/// 1,980) for seconds while a timing loop that waited between its samples ran, and the forward
/// took 1.6–4.7× its time (BENCHMARKS.md, session 50).
const WARM_UP_S: f64 = 0.3;

/// Seconds of runs one warm-up submission holds, by the estimate, and at most this many runs (a
/// bound on the command buffer's size).
const WARM_UP_SUBMISSION_S: f64 = 0.02;
const WARM_UP_CHUNK: usize = 256;

/// The most runs [`time_passes_at_least`] times to fill its seconds.
pub const MAX_TIMED_RUNS: usize = 20_000;

/// Runs `encode` `warmup` times (at least once), then back to back for `WARM_UP_S`, then `runs`
/// times timed, and returns the median of the samples. With timestamps, a sample is the mean of
/// a submission of up to `runs / SAMPLES` runs back to back, and the warm-up and the samples are
/// submitted without waiting in between, so the GPU does not idle until the last sample ends;
/// without timestamps, each run is its own submission timed by the wall clock. `encode` records
/// one compute pass and must pass the given timestamp writes to it (`None` when the device has
/// no timestamps, or for the passes inside a sample).
pub fn time_passes(
    ctx: &GpuContext,
    warmup: usize,
    runs: usize,
    encode: impl FnMut(&mut wgpu::CommandEncoder, Option<wgpu::ComputePassTimestampWrites<'_>>) -> Result<()>,
) -> Result<Timing> {
    time_passes_at_least(ctx, warmup, runs, 0.0, encode)
}

/// [`time_passes`], timing at least `seconds` of runs: as many more than `runs` as the warm-up's
/// rate says fill them, at most [`MAX_TIMED_RUNS`]. For short kernels, whose few runs would time
/// mostly the gaps between passes, without a separate call to estimate them (each call warms up
/// for `WARM_UP_S`).
pub fn time_passes_at_least(
    ctx: &GpuContext,
    warmup: usize,
    runs: usize,
    seconds: f64,
    mut encode: impl FnMut(&mut wgpu::CommandEncoder, Option<wgpu::ComputePassTimestampWrites<'_>>) -> Result<()>,
) -> Result<Timing> {
    let device = &ctx.device;
    let queue = &ctx.queue;
    let wait_for = |submission: Option<wgpu::SubmissionIndex>| {
        device
            .poll(wgpu::PollType::Wait {
                submission_index: submission,
                timeout: None,
            })
            .map(|_| ())
            .map_err(|e| Error::ReadBack(e.to_string()))
    };
    let wait = || wait_for(None);
    let mut submit_untimed = |times: usize| -> Result<wgpu::SubmissionIndex> {
        let mut encoder = device.create_command_encoder(&Default::default());
        for _ in 0..times {
            encode(&mut encoder, None)?;
        }
        Ok(queue.submit([encoder.finish()]))
    };
    // The first runs build what the calls need; one more, waited for by the wall clock, sizes
    // the warm-up's submissions (an overestimate: it holds a submission's latency). The warm-up
    // keeps two submissions in flight, waiting for the older, until WARM_UP_S have passed; the
    // last is still running when the samples are submitted.
    submit_untimed(warmup.max(1))?;
    wait()?;
    let one = Instant::now();
    submit_untimed(1)?;
    wait()?;
    let estimate = one.elapsed().as_secs_f64().max(1e-6);
    let chunk = ((WARM_UP_SUBMISSION_S / estimate).ceil() as usize).clamp(1, WARM_UP_CHUNK);
    let warm_up = Instant::now();
    let mut in_flight = None;
    // Runs the warm-up has seen complete, for its rate: submissions overlap, so the time to the
    // last wait over the runs before it.
    let (mut completed, mut completed_at) = (0usize, 0.0);
    while warm_up.elapsed().as_secs_f64() < WARM_UP_S {
        let submitted = submit_untimed(chunk)?;
        if let Some(older) = in_flight.replace(submitted) {
            wait_for(Some(older))?;
            completed += chunk;
            completed_at = warm_up.elapsed().as_secs_f64();
        }
    }
    let per_run = match completed {
        0 => estimate,
        n => completed_at / n as f64,
    };
    let filling = (seconds / per_run).ceil().min(MAX_TIMED_RUNS as f64) as usize;
    let runs = runs.max(filling).max(1);
    if !ctx.caps.timestamps {
        wait()?;
        let mut samples = Vec::with_capacity(runs);
        for _ in 0..runs {
            let mut encoder = device.create_command_encoder(&Default::default());
            encode(&mut encoder, None)?;
            let start = Instant::now();
            queue.submit([encoder.finish()]);
            wait()?;
            samples.push(start.elapsed().as_secs_f64());
        }
        return Ok(Timing::from_samples(samples, Clock::WallClock));
    }
    // Each sample is one submission of several runs back to back, as an application submits
    // them (and as PyTorch's CUDA-event loops time its kernels), timed from the first pass's
    // start to the last pass's end and divided by the runs: waiting after every run lets the GPU
    // idle and drop its clocks, and a pass's own start timestamp may be taken while the previous
    // pass still runs (a top-of-pipe write), so per-pass durations of short kernels back to back
    // are unreliable. The span of one submission is neither within it; its first pass's start
    // may still be taken before the previous sample's last pass ends, now that the samples are
    // queued without waits, which would lengthen that sample by at most the overlap (session 50's
    // samples so taken were 2–3% shorter than the waited ones, not longer). The samples'
    // timestamps are read back once, after the last.
    let per_sample = runs.div_ceil(SAMPLES).max(1);
    let batches: Vec<usize> = (0..runs.div_ceil(per_sample))
        .map(|i| per_sample.min(runs - i * per_sample))
        .collect();
    let count = 2 * batches.len() as u32;
    let query_set = device.create_query_set(&wgpu::QuerySetDescriptor {
        label: Some("wgpu-flash-attn timer"),
        ty: wgpu::QueryType::Timestamp,
        count,
    });
    let resolved = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("wgpu-flash-attn timer"),
        size: 8 * count as u64,
        usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    for (sample, &batch) in batches.iter().enumerate() {
        let first_index = 2 * sample as u32;
        let mut encoder = device.create_command_encoder(&Default::default());
        for run in 0..batch {
            let (first, last) = (run == 0, run + 1 == batch);
            let writes = (first || last).then(|| wgpu::ComputePassTimestampWrites {
                query_set: &query_set,
                beginning_of_pass_write_index: first.then_some(first_index),
                end_of_pass_write_index: last.then_some(first_index + 1),
            });
            encode(&mut encoder, writes)?;
        }
        queue.submit([encoder.finish()]);
    }
    let mut encoder = device.create_command_encoder(&Default::default());
    encoder.resolve_query_set(&query_set, 0..count, &resolved, 0);
    queue.submit([encoder.finish()]);
    let bytes = pollster::block_on(read_back(device, queue, &[(&resolved, 0, 8 * count as u64)]))?;
    let ticks: Vec<u64> = bytemuck::pod_collect_to_vec(&bytes[0]);
    let period = queue.get_timestamp_period() as f64 * 1e-9;
    let samples = batches
        .iter()
        .enumerate()
        .map(|(i, &batch)| ticks[2 * i + 1].saturating_sub(ticks[2 * i]) as f64 * period / batch as f64)
        .collect();
    Ok(Timing::from_samples(samples, Clock::GpuTimestamps))
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
