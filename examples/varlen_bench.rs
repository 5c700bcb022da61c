//! The varlen prefill benchmark (lab tool, H200): issue 16's bar shape — 16 sequences of seeded
//! random lengths between 100 and 4,000 tokens packed end to end, causal, 16 heads of 128, f16 —
//! timed beside the dense kernel on the same number of tokens (16 equal sequences), as TFLOP/s
//! of each (the varlen call's FLOPs counted over its own sequences: no padding). The automatic
//! kernel choice runs both (the cooperative-matrix kernel where the device has it). With
//! `--features cuda`, the CUDA prefill kernels run the same pair on bf16.
//!
//! Correctness is the tests' (tests/varlen.rs, tests/cuda_attention.rs); here every output is
//! only checked to be finite.
//!
//! ```text
//! cargo run --release --features internals[,cuda] --example varlen_bench -- [--seqs 16] [--min 100]
//!     [--max 4000] [--heads 16] [--head-dim 128] [--runs 20] [--seed 1]
//! ```

use wgpu::util::DeviceExt;
use wgpu_flash_attn::batch::{BatchIndex, Varlen};
use wgpu_flash_attn::testing::timing::time_passes;
use wgpu_flash_attn::testing::{random_tensor, Rng};
use wgpu_flash_attn::{
    AttentionProblem, AttentionShape, DType, FlashAttention, ForwardBuffers, GpuContext, Tensor, TensorBuffer,
};

struct Args {
    seqs: usize,
    min: usize,
    max: usize,
    heads: usize,
    head_dim: usize,
    runs: usize,
    seed: u64,
}

fn parse() -> Args {
    let mut a = Args {
        seqs: 16,
        min: 100,
        max: 4000,
        heads: 16,
        head_dim: 128,
        runs: 20,
        seed: 1,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().and_then(|v| v.parse::<usize>().ok()).expect("a number");
        match flag.as_str() {
            "--seqs" => a.seqs = value(),
            "--min" => a.min = value(),
            "--max" => a.max = value(),
            "--heads" => a.heads = value(),
            "--head-dim" => a.head_dim = value(),
            "--runs" => a.runs = value(),
            "--seed" => a.seed = value() as u64,
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

/// The packed problem, its offsets, and the dense problem on the same number of tokens.
struct Pair {
    packed: AttentionProblem,
    cu: Vec<u32>,
    dense: AttentionProblem,
}

fn pair(a: &Args, dtype: DType) -> Pair {
    let mut rng = Rng::new(a.seed);
    let lengths: Vec<usize> = (0..a.seqs)
        .map(|_| a.min + (rng.next_u64() % (a.max - a.min + 1) as u64) as usize)
        .collect();
    let mut cu = vec![0u32];
    for &n in &lengths {
        cu.push(cu.last().copied().unwrap_or(0) + n as u32);
    }
    let total = cu[a.seqs] as usize;
    let longest = lengths.iter().copied().max().unwrap_or(1);
    let shape = |batch, seq| AttentionShape {
        batch,
        seq_q: seq,
        seq_kv: seq,
        num_heads: a.heads,
        num_kv_heads: a.heads,
        head_dim: a.head_dim,
    };
    let packed = AttentionProblem::new(shape(a.seqs, longest), dtype)
        .with_causal(true)
        .with_varlen(Varlen {
            total_q: total,
            total_kv: total,
        });
    let dense = AttentionProblem::new(shape(a.seqs, total / a.seqs), dtype).with_causal(true);
    eprintln!(
        "lengths {lengths:?}: {total} tokens; dense: {} x {}",
        a.seqs,
        total / a.seqs
    );
    Pair { packed, cu, dense }
}

fn index(cu: &[u32]) -> BatchIndex<'_> {
    BatchIndex {
        cu_seqlens_q: Some(cu),
        cu_seqlens_k: Some(cu),
        ..Default::default()
    }
}

fn wgpu_run(a: &Args, ctx: &GpuContext) -> wgpu_flash_attn::Result<()> {
    let engine = FlashAttention::new(ctx);
    let p = pair(a, DType::F16);
    let storage = |label: &str, bytes: &[u8], copy_src: bool| {
        let extra = if copy_src {
            wgpu::BufferUsages::COPY_SRC
        } else {
            wgpu::BufferUsages::empty()
        };
        ctx.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(label),
            contents: bytes,
            usage: wgpu::BufferUsages::STORAGE | extra,
        })
    };
    for (name, problem, cu) in [("varlen", &p.packed, Some(&p.cu)), ("dense", &p.dense, None)] {
        let n = problem.required_len(Tensor::Q);
        let x: Vec<half::f16> = random_tensor(a.seed, n);
        let (q, k, v) = (
            storage("q", bytemuck::cast_slice(&x), false),
            storage("k", bytemuck::cast_slice(&x), false),
            storage("v", bytemuck::cast_slice(&x), false),
        );
        let o = storage("o", &vec![0u8; 2 * n], true);
        let lse = storage("lse", &vec![0u8; 4 * problem.lse_len()], false);
        let cu_buf = cu.map(|cu| storage("cu_seqlens", bytemuck::cast_slice(cu), false));
        let buffers = ForwardBuffers {
            cu_seqlens_q: cu_buf.as_ref().map(TensorBuffer::new),
            cu_seqlens_k: cu_buf.as_ref().map(TensorBuffer::new),
            ..ForwardBuffers::new(
                TensorBuffer::new(&q),
                TensorBuffer::new(&k),
                TensorBuffer::new(&v),
                TensorBuffer::new(&o),
                Some(TensorBuffer::new(&lse)),
            )
        };
        let kernel = engine.select(problem)?.name();
        let timing = time_passes(ctx, 5, a.runs, |encoder, ts| {
            engine.encode_forward(encoder, problem, &buffers, ts).map(|_| ())
        })?;
        let out = pollster::block_on(wgpu_flash_attn::gpu::readback::read_back(
            &ctx.device,
            &ctx.queue,
            &[(&o, 0, o.size())],
        ))?;
        let out: Vec<half::f16> = bytemuck::pod_collect_to_vec(&out[0]);
        let finite = out.iter().all(|x| x.is_finite());
        let flops = match cu {
            Some(cu) => index(cu).flops(problem),
            None => problem.flops(),
        };
        println!(
            "wgpu {name:6} {:8.1} TFLOP/s  {:7.3} ms  finite {finite}  {kernel}",
            flops / timing.median / 1e12,
            timing.median * 1e3
        );
    }
    Ok(())
}

#[cfg(feature = "cuda")]
fn cuda_run(a: &Args) -> wgpu_flash_attn::Result<()> {
    use wgpu_flash_attn::cuda::cudarc::driver::sys::CUevent_flags;
    use wgpu_flash_attn::cuda::{CudaAttention, CudaDevice, DeviceBatchIndex, DeviceTensors};
    let engine = CudaAttention::new(CudaDevice::new(0)?);
    let dev = engine.device();
    let stream = dev.stream();
    let p = pair(a, DType::BF16);
    for (name, problem, cu) in [("varlen", &p.packed, Some(&p.cu)), ("dense", &p.dense, None)] {
        let n = problem.required_len(Tensor::Q);
        let x: Vec<half::bf16> = random_tensor(a.seed, n);
        let bits: &[u16] = bytemuck::cast_slice(&x);
        let (dq, dk, dv) = (
            stream.clone_htod(bits)?,
            stream.clone_htod(bits)?,
            stream.clone_htod(bits)?,
        );
        let mut d_o = stream.alloc_zeros::<u16>(n)?;
        let mut d_lse = stream.alloc_zeros::<f32>(problem.lse_len())?;
        let d_cu = cu.map(|cu| stream.clone_htod(cu)).transpose()?;
        let mut launch = || -> wgpu_flash_attn::Result<String> {
            let tensors = DeviceTensors {
                q: &dq,
                k: &dk,
                v: &dv,
                o: &mut d_o,
                lse: Some(&mut d_lse),
            };
            let config = match &d_cu {
                Some(d_cu) => engine.forward_indexed_device(
                    problem,
                    tensors,
                    DeviceBatchIndex {
                        cu_seqlens_q: Some(d_cu),
                        cu_seqlens_k: Some(d_cu),
                        ..Default::default()
                    },
                )?,
                None => engine.forward_device(problem, tensors)?,
            };
            Ok(config.name())
        };
        let mut kernel = String::new();
        for _ in 0..5 {
            kernel = launch()?;
        }
        stream.synchronize()?;
        let mut times = Vec::new();
        for _ in 0..a.runs {
            let start = dev.context().new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
            let end = dev.context().new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
            start.record(stream)?;
            launch()?;
            end.record(stream)?;
            end.synchronize()?;
            times.push(start.elapsed_ms(&end)? as f64 * 1e-3);
        }
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        let out: Vec<u16> = stream.clone_dtoh(&d_o)?;
        let finite = bytemuck::cast_slice::<u16, half::bf16>(&out)
            .iter()
            .all(|x| x.is_finite());
        let flops = match cu {
            Some(cu) => index(cu).flops(problem),
            None => problem.flops(),
        };
        println!(
            "cuda {name:6} {:8.1} TFLOP/s  {:7.3} ms  finite {finite}  {kernel}",
            flops / median / 1e12,
            median * 1e3
        );
    }
    Ok(())
}

fn main() -> wgpu_flash_attn::Result<()> {
    let a = parse();
    let ctx = pollster::block_on(GpuContext::new())?;
    eprintln!("device: {}", ctx.info.name);
    wgpu_run(&a, &ctx)?;
    #[cfg(feature = "cuda")]
    cuda_run(&a)?;
    Ok(())
}
