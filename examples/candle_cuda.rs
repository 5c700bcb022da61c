//! The candle drop-in's CUDA route against our direct call, for issue 20's bar: the route at
//! ≥ 95% of the direct call's TFLOP/s at head_dim 128, seq 8192, bf16 (FlashAttention's
//! benchmark shape: 16k tokens, hidden 2048, so batch 2 and 16 heads), causal and not.
//!
//! ```text
//! cargo run --release --features candle-cuda --example candle_cuda -- \
//!     [--batch 2] [--seq 8192] [--heads 16] [--head-dim 128] [--calls 10] [--reps 15]
//! ```
//!
//! Both sides run on candle's stream and read the same candle buffers: the direct call is
//! `CudaAttention::forward_device` into an output allocated once; the route is
//! `wgpu_flash_attn::candle::flash_attn` on the candle tensors, which allocates its output each
//! call as a candle op does. Timing: CUDA events around `--calls` back-to-back calls (so host
//! overhead that starves the GPU shows), per call, median of `--reps` rounds, the two sides
//! alternating. The route's output must equal the direct call's bit for bit (the same kernel on
//! the same inputs), and a few rows are checked against the float64 reference. Exit status 1
//! when the bar or a check fails.

use std::sync::Arc;

use candle_core::{DType, Device, Storage, Tensor};
use half::bf16;
use wgpu_flash_attn::cuda::cudarc::driver::sys::CUevent_flags;
use wgpu_flash_attn::cuda::cudarc::driver::{CudaSlice, CudaStream};
use wgpu_flash_attn::cuda::{CudaAttention, CudaDevice, DeviceTensors};
use wgpu_flash_attn::{reference, AttentionProblem, AttentionShape};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

struct Args {
    batch: usize,
    seq: usize,
    heads: usize,
    head_dim: usize,
    calls: usize,
    reps: usize,
}

fn args() -> Result<Args> {
    let mut a = Args {
        batch: 2,
        seq: 8192,
        heads: 16,
        head_dim: 128,
        calls: 10,
        reps: 15,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value: usize = it.next().ok_or(format!("{flag} needs a value"))?.parse()?;
        match flag.as_str() {
            "--batch" => a.batch = value,
            "--seq" => a.seq = value,
            "--heads" => a.heads = value,
            "--head-dim" => a.head_dim = value,
            "--calls" => a.calls = value.max(1),
            "--reps" => a.reps = value.max(1),
            other => return Err(format!("unknown flag {other}").into()),
        }
    }
    Ok(a)
}

/// Milliseconds per call of `f`, by CUDA events around `calls` calls on `stream`.
fn round(stream: &Arc<CudaStream>, calls: usize, f: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
    let ctx = stream.context();
    let start = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    let end = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    start.record(stream)?;
    for _ in 0..calls {
        f()?;
    }
    end.record(stream)?;
    end.synchronize()?;
    Ok(start.elapsed_ms(&end)? as f64 / calls as f64)
}

/// The buffer of a bf16 CUDA tensor, borrowed.
fn cuda_slice(s: &Storage) -> Result<&CudaSlice<bf16>> {
    match s {
        Storage::Cuda(c) => Ok(c.as_cuda_slice::<bf16>()?),
        _ => Err("not a CUDA tensor".into()),
    }
}

fn median(mut x: Vec<f64>) -> f64 {
    x.sort_by(|a, b| a.total_cmp(b));
    x[x.len() / 2]
}

fn main() -> Result<()> {
    let a = args()?;
    let dev = Device::new_cuda(0)?;
    let Device::Cuda(cuda) = &dev else {
        return Err("candle opened no CUDA device".into());
    };
    let stream = cuda.cuda_stream();
    let direct = CudaAttention::new(CudaDevice::from_stream(stream.clone())?);
    println!(
        "{} (sm {}.{}), candle's stream; batch {} seq {} heads {} head_dim {} bf16; {} calls × {} rounds",
        direct.device().name(),
        direct.device().compute_capability().0,
        direct.device().compute_capability().1,
        a.batch,
        a.seq,
        a.heads,
        a.head_dim,
        a.calls,
        a.reps
    );
    let dims = (a.batch, a.seq, a.heads, a.head_dim);
    let randn = |seed: u64| -> Result<Tensor> {
        dev.set_seed(seed)?;
        Ok(Tensor::randn(0f32, 1.0, dims, &dev)?.to_dtype(DType::BF16)?)
    };
    let (q, k, v) = (randn(1)?, randn(2)?, randn(3)?);
    let scale = 1.0 / (a.head_dim as f32).sqrt();
    let shape = AttentionShape {
        batch: a.batch,
        seq_q: a.seq,
        seq_kv: a.seq,
        num_heads: a.heads,
        num_kv_heads: a.heads,
        head_dim: a.head_dim,
    };
    let mut failed = false;
    println!(
        "| causal | kernel | direct TFLOP/s | candle route TFLOP/s | route / direct | same output | float64 rows |"
    );
    println!("|---|---|---|---|---|---|---|");
    for causal in [false, true] {
        let problem = AttentionProblem::new(shape, wgpu_flash_attn::DType::BF16)
            .with_scale(scale)
            .with_causal(causal);
        // The direct call reads candle's own buffers (q, k, v are contiguous from offset 0),
        // holding their read locks as a candle op does.
        let (qs, ks, vs) = (
            q.storage_and_layout().0,
            k.storage_and_layout().0,
            v.storage_and_layout().0,
        );
        let (dq, dk, dv) = (cuda_slice(&qs)?, cuda_slice(&ks)?, cuda_slice(&vs)?);
        let mut o = stream.alloc_zeros::<bf16>(q.elem_count())?;
        let mut kernel = String::new();
        let mut direct_call = || -> Result<()> {
            let config = direct.forward_device(
                &problem,
                DeviceTensors {
                    q: dq,
                    k: dk,
                    v: dv,
                    o: &mut o,
                    lse: None,
                },
            )?;
            kernel = config.name();
            Ok(())
        };
        let mut route_out = None;
        let mut route_call = || -> Result<()> {
            route_out = Some(wgpu_flash_attn::candle::flash_attn(&q, &k, &v, scale, causal)?);
            Ok(())
        };
        // Warm-up: NVRTC compiles (or loads from the disk cache), the allocator's pool fills.
        for _ in 0..3 {
            direct_call()?;
            route_call()?;
        }
        stream.synchronize()?;
        let (mut t_direct, mut t_route) = (Vec::new(), Vec::new());
        for _ in 0..a.reps {
            t_direct.push(round(&stream, a.calls, &mut direct_call)?);
            t_route.push(round(&stream, a.calls, &mut route_call)?);
        }
        let (t_direct, t_route) = (median(t_direct), median(t_route));
        let tflops = |ms: f64| problem.flops() / (ms * 1e-3) / 1e12;
        let ratio = t_direct / t_route;

        // Checks: the route's output is the direct call's, and a few rows are float64's.
        let route = route_out.ok_or("no route output")?.flatten_all()?.to_vec1::<bf16>()?;
        let direct_out = stream.clone_dtoh(&o)?;
        let same = route == direct_out;
        let host = |t: &Tensor| -> Result<Vec<bf16>> { Ok(t.flatten_all()?.to_vec1::<bf16>()?) };
        let (hq, hk, hv) = (host(&q)?, host(&k)?, host(&v)?);
        let mut worst: f64 = 0.0;
        for (b, h, i) in [
            (0, 0, 0),
            (0, a.heads / 2, a.seq / 2),
            (a.batch - 1, a.heads - 1, a.seq - 1),
        ] {
            let row = reference::attention_row(&problem, &hq, &hk, &hv, b, h, i)?;
            for (d, want) in row.out.iter().enumerate() {
                let got = route[problem.o_layout.index(b, i, h, d)].to_f64();
                worst = worst.max((got - want).abs());
            }
        }
        // bf16 output rounding (2⁻⁸ relative of values below ~4) with room for f32 accumulation.
        let rows_ok = worst < 4e-2;
        println!(
            "| {} | {kernel} | {:.1} | {:.1} | {ratio:.3} | {} | {} (max abs {worst:.1e}) |",
            if causal { "yes" } else { "no" },
            tflops(t_direct),
            tflops(t_route),
            if same { "yes" } else { "NO" },
            if rows_ok { "ok" } else { "WRONG" },
        );
        let bar = ratio >= 0.95;
        failed |= !(bar && same && rows_ok);
    }
    println!(
        "bar (the candle route at ≥ 95% of the direct call's TFLOP/s, outputs equal): {}",
        if failed { "FAIL" } else { "PASS" }
    );
    if failed {
        std::process::exit(1);
    }
    Ok(())
}
