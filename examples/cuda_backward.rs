//! Throughput of the CUDA backward (`cuda/flash_bwd_wgmma.cu` on Hopper, `cuda/flash_bwd_mma.cu`) at issue 18's shapes: batch 2, 16
//! heads, seq 8192, bf16, head_dim 128 and 64, causal and not; with the atomic dQ accumulation
//! and the deterministic one. TFLOP/s count FlashAttention's backward convention, 2.5 × the
//! forward's FLOPs (`BackwardProblem::flops`: `2.5 · 4·B·H·S²·D`, halved when causal), so the
//! numbers sit beside FlashAttention's and PyTorch's own benchmarks.
//!
//! ```text
//! cargo run --release --features cuda,internals --example cuda_backward -- \
//!     [--batch 2] [--heads 16] [--seqs 8192] [--head-dims 128,64] [--causal both|true|false] \
//!     [--reps 20] [--all-plans] [--no-det] [--softcap CAP] [--window LEFT,RIGHT] [--dropout P]
//! ```
//!
//! `--softcap`, `--window` (a side of -1 is unbounded) and `--dropout` time those variants (the
//! forward with the same dropout feeds the backward); their TFLOP/s count only the (query, key)
//! pairs the window leaves visible (`AttentionProblem::flops`).
//!
//! Each shape: Q, K, V, dO random; O and the LSE from the CUDA forward (timed too, for the
//! ratio); the backward timed with CUDA events around the call (preprocess, main, convert), the
//! median of `--reps` after three warm-up calls (NVRTC compiles or loads from the disk cache
//! before); then dQ of a few rows of the first and last (batch, head) checked against the float64
//! reference (`reference::attention_backward_dq_row`). `--all-plans` times every plan of the
//! head_dim this GPU runs (the wgmma one on Hopper) instead of the default one. The main
//! kernel's registers and local memory (spills) are printed with each row.

use half::bf16;
use wgpu_flash_attn::batch::Dropout;
use wgpu_flash_attn::cuda::cudarc::driver::CudaSlice;
use wgpu_flash_attn::cuda::plan::{runnable_backward_plans, CudaBackwardConfig};
use wgpu_flash_attn::cuda::{
    BackwardDeviceTensors, CudaAttention, CudaBackwardOptions, CudaBackwardPlan, CudaDevice, DeviceTensors,
};
use wgpu_flash_attn::testing::timing::cuda_median_ms;
use wgpu_flash_attn::testing::{random_tensor, ErrorStats};
use wgpu_flash_attn::{reference, AttentionProblem, BackwardProblem, DType, GradTensor, Result, Tensor};

struct Args {
    batch: usize,
    heads: usize,
    seqs: Vec<usize>,
    head_dims: Vec<usize>,
    causal: Vec<bool>,
    reps: usize,
    all_plans: bool,
    det: bool,
    softcap: Option<f32>,
    window: Option<(Option<usize>, Option<usize>)>,
    dropout: Option<f32>,
}

fn parse_args() -> Args {
    let mut a = Args {
        batch: 2,
        heads: 16,
        seqs: vec![8192],
        head_dims: vec![128, 64],
        causal: vec![false, true],
        reps: 20,
        all_plans: false,
        det: true,
        softcap: None,
        window: None,
        dropout: None,
    };
    let list = |s: String| -> Vec<usize> { s.split(',').map(|x| x.trim().parse().expect("a number")).collect() };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--batch" => a.batch = value().parse().expect("--batch N"),
            "--heads" => a.heads = value().parse().expect("--heads N"),
            "--seqs" => a.seqs = list(value()),
            "--head-dims" => a.head_dims = list(value()),
            "--causal" => {
                a.causal = match value().as_str() {
                    "both" => vec![false, true],
                    "true" => vec![true],
                    "false" => vec![false],
                    other => panic!("--causal both|true|false, not {other}"),
                }
            }
            "--reps" => a.reps = value().parse().expect("--reps N"),
            "--all-plans" => a.all_plans = true,
            "--no-det" => a.det = false,
            "--softcap" => a.softcap = Some(value().parse().expect("--softcap CAP")),
            "--dropout" => a.dropout = Some(value().parse().expect("--dropout P")),
            "--window" => {
                let side = |x: &str| -> Option<usize> {
                    let n: i64 = x.trim().parse().expect("--window LEFT,RIGHT");
                    usize::try_from(n).ok()
                };
                let v = value();
                let (l, r) = v.split_once(',').expect("--window LEFT,RIGHT");
                a.window = Some((side(l), side(r)));
            }
            "--help" | "-h" => {
                println!("see the header of examples/cuda_backward.rs");
                std::process::exit(0);
            }
            other => panic!("unknown flag {other} (--help)"),
        }
    }
    a
}

struct Buffers {
    q: Vec<bf16>,
    k: Vec<bf16>,
    v: Vec<bf16>,
    d_o: Vec<bf16>,
    dev: [CudaSlice<u16>; 5],
    lse: CudaSlice<f32>,
    grads: [CudaSlice<u16>; 3],
}

fn buffers(engine: &CudaAttention, p: &BackwardProblem) -> Result<Buffers> {
    let f = &p.forward;
    let stream = engine.device().stream();
    let q = random_tensor::<bf16>(1, f.required_len(Tensor::Q));
    let k = random_tensor::<bf16>(2, f.required_len(Tensor::K));
    let v = random_tensor::<bf16>(3, f.required_len(Tensor::V));
    let d_o = random_tensor::<bf16>(4, p.required_len(GradTensor::DO));
    let up = |x: &[bf16]| stream.clone_htod(bytemuck::cast_slice::<bf16, u16>(x));
    let dev = [
        up(&q)?,
        up(&k)?,
        up(&v)?,
        stream.alloc_zeros(f.required_len(Tensor::O))?,
        up(&d_o)?,
    ];
    let grads = [
        stream.alloc_zeros(p.required_len(GradTensor::DQ))?,
        stream.alloc_zeros(p.required_len(GradTensor::DK))?,
        stream.alloc_zeros(p.required_len(GradTensor::DV))?,
    ];
    Ok(Buffers {
        q,
        k,
        v,
        d_o,
        dev,
        lse: stream.alloc_zeros(f.lse_len())?,
        grads,
    })
}

fn forward(engine: &CudaAttention, p: &BackwardProblem, b: &mut Buffers) -> Result<String> {
    let [q, k, v, o, _] = &mut b.dev;
    let config = engine.forward_device(
        &p.forward,
        DeviceTensors {
            q: &*q,
            k: &*k,
            v: &*v,
            o,
            lse: Some(&mut b.lse),
        },
    )?;
    Ok(config.name())
}

fn backward(
    engine: &CudaAttention,
    p: &BackwardProblem,
    b: &mut Buffers,
    options: &CudaBackwardOptions,
) -> Result<CudaBackwardConfig> {
    let [q, k, v, o, d_o] = &b.dev;
    let [dq, dk, dv] = &mut b.grads;
    engine.backward_device(
        p,
        BackwardDeviceTensors {
            q,
            k,
            v,
            o,
            lse: &b.lse,
            d_o,
            dq,
            dk,
            dv,
        },
        options,
    )
}

/// dQ of rows of the first and last (batch, head) against float64, and whether it is within the
/// tests' bounds (relative L2 and max error at most 2e-2, the latter of the largest reference).
fn spot_check(engine: &CudaAttention, p: &BackwardProblem, b: &Buffers) -> Result<(ErrorStats, bool)> {
    let bits: Vec<u16> = engine.device().stream().clone_dtoh(&b.grads[0])?;
    let dq: &[bf16] = bytemuck::cast_slice(&bits);
    let s = p.forward.shape;
    let mut pairs = Vec::new();
    for (batch, head) in [(0, 0), (s.batch - 1, s.num_heads - 1)] {
        for i in [0, 1, s.seq_q / 3, s.seq_q / 2 + 7, s.seq_q - 1] {
            let want = reference::attention_backward_dq_row(p, &b.q, &b.k, &b.v, &b.d_o, batch, head, i)?;
            for (d, w) in want.iter().enumerate() {
                pairs.push((dq[p.dq_layout.index(batch, i, head, d)].to_f64(), *w));
            }
        }
    }
    let ref_max = pairs.iter().map(|x| x.1.abs()).fold(0.0, f64::max);
    let stats = ErrorStats::from_pairs(pairs);
    let ok = stats.within(2e-2, 2e-2 * ref_max);
    Ok((stats, ok))
}

fn main() -> Result<()> {
    let args = parse_args();
    let device = CudaDevice::new(0)?;
    println!(
        "{} (sm {}.{}, {} SMs), target {}",
        device.name(),
        device.compute_capability().0,
        device.compute_capability().1,
        device.sm_count(),
        device.arch()
    );
    let engine = CudaAttention::new(device.clone());
    let mut table = Vec::new();
    for &head_dim in &args.head_dims {
        for &seq in &args.seqs {
            for &causal in &args.causal {
                let mut f =
                    AttentionProblem::mha(args.batch, seq, args.heads, head_dim, DType::BF16).with_causal(causal);
                if let Some(cap) = args.softcap {
                    f = f.with_softcap(cap);
                }
                if let Some((left, right)) = args.window {
                    f = f.with_window(left, right);
                }
                if let Some(p) = args.dropout {
                    f = f.with_dropout(Dropout { p, seed: 17, offset: 0 });
                }
                let p = BackwardProblem::new(f);
                let mut b = buffers(&engine, &p)?;
                let fwd_kernel = forward(&engine, &p, &mut b)?;
                let fwd_ms = cuda_median_ms(&device, 3, args.reps, || forward(&engine, &p, &mut b).map(drop))?;
                let fwd_tflops = f.flops() / (fwd_ms * 1e-3) / 1e12;
                println!(
                    "fwd  d{head_dim} s{seq} b{} h{} causal={causal}: {fwd_kernel} {fwd_ms:.3} ms {fwd_tflops:.1} TFLOP/s",
                    args.batch, args.heads
                );
                let plans: Vec<Option<CudaBackwardPlan>> = if args.all_plans {
                    runnable_backward_plans(head_dim, device.is_hopper())
                        .map(Some)
                        .collect()
                } else {
                    vec![None]
                };
                let modes: &[bool] = if args.det { &[false, true] } else { &[false] };
                for plan in plans {
                    for &deterministic in modes {
                        let options = CudaBackwardOptions { deterministic, plan };
                        let config = backward(&engine, &p, &mut b, &options)?;
                        let info = engine.prepare_backward(&config)?;
                        let ms = cuda_median_ms(&device, 3, args.reps, || {
                            backward(&engine, &p, &mut b, &options).map(drop)
                        })?;
                        let tflops = p.flops() / (ms * 1e-3) / 1e12;
                        let (check, ok) = spot_check(&engine, &p, &b)?;
                        println!(
                            "bwd  d{head_dim} s{seq} b{} h{} causal={causal:<5} {:<48} {ms:>8.3} ms {tflops:>6.1} TFLOP/s \
                             (bwd/fwd time {:.2})  regs {} local {}  dQ check {} [{check}]",
                            args.batch,
                            args.heads,
                            config.name(),
                            ms / fwd_ms,
                            info.num_regs,
                            info.local_bytes,
                            if ok { "ok" } else { "FAILED" },
                        );
                        table.push((head_dim, seq, causal, deterministic, config.name(), ms, tflops, ok));
                    }
                }
            }
        }
    }
    println!("\n| head_dim | seq | causal | dQ | kernel | ms | TFLOP/s | check |");
    println!("|---|---|---|---|---|---|---|---|");
    for (d, s, c, det, name, ms, t, ok) in table {
        println!(
            "| {d} | {s} | {c} | {} | {name} | {ms:.3} | {t:.1} | {} |",
            if det { "deterministic" } else { "atomic" },
            if ok { "ok" } else { "FAILED" }
        );
    }
    Ok(())
}
