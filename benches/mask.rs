//! A block-sparse mask against dense attention (issue 17): a document mask — four documents of
//! equal length, each query seeing the keys of its own document, one `[seq, seq]` byte mask
//! shared by the batch and heads — run without a mask (as automatic selection runs it, and on the
//! tiled kernel, which is the one that takes masks), with the mask read element by element (no
//! summary), and with its block summary (the kernels skip the three quarters of the key tiles it
//! hides). The summary's own cost, once per mask, is timed too. Also backward: dense against the
//! summarized mask (both on the tiled gradient kernels).
//!
//! Every variant's throughput is the dense problem's FLOPs (`4·B·H·S²·D`), so criterion's
//! "elem/s" compares times directly: the summarized mask should run near 4× the dense tiled
//! rate (a quarter of the tiles), the unsummarized one below it (every tile, plus the mask's
//! reads).
//!
//! ```text
//! cargo bench --features internals --bench mask                      # b1 h16 s8192 d128 f16 (GPU)
//! FLASH_BENCH_SMALL=1 cargo bench --features internals --bench mask  # small (the default on CPU adapters)
//! ```

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use wgpu_flash_attn::batch::{AttentionMask, MaskBlocks};
use wgpu_flash_attn::problem::backward::GradTensor;
use wgpu_flash_attn::testing::harness::Workload;
use wgpu_flash_attn::testing::random_tensor;
use wgpu_flash_attn::testing::timing::time_passes;
use wgpu_flash_attn::{
    AttentionProblem, BackwardBuffers, BackwardProblem, DType, FlashAttention, ForwardBuffers, GpuContext,
    KernelChoice, Options, Tensor, TensorBuffer,
};

/// Documents per sequence.
const DOCUMENTS: usize = 4;

fn storage(ctx: &GpuContext, label: &str, bytes: &[u8]) -> wgpu::Buffer {
    use wgpu::util::DeviceExt;
    ctx.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: Some(label),
        contents: bytes,
        usage: wgpu::BufferUsages::STORAGE,
    })
}

fn empty(ctx: &GpuContext, label: &str, bytes: u64) -> wgpu::Buffer {
    ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size: bytes,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    })
}

fn bench(c: &mut Criterion) {
    let ctx = match pollster::block_on(GpuContext::new()) {
        Ok(ctx) => ctx,
        Err(e) => {
            eprintln!("no GPU adapter, nothing to benchmark: {e}");
            return;
        }
    };
    let small = std::env::var("FLASH_BENCH_SMALL").is_ok() || ctx.info.device_type == wgpu::DeviceType::Cpu;
    let (heads, seq, head_dim, dtype) = if small {
        (4, 512, 64, DType::F32)
    } else {
        (16, 8192, 128, DType::F16)
    };
    let dense = AttentionProblem::mha(1, seq, heads, head_dim, dtype);
    let masked = dense.with_mask(AttentionMask::dense(&dense, false, false));
    let summarized = masked.with_mask_blocks();
    let doc = seq / DOCUMENTS;
    let mask: Vec<u8> = (0..seq * seq)
        .map(|e| ((e / seq) / doc == (e % seq) / doc) as u8)
        .collect();
    let mask_buf = storage(&ctx, "mask", &mask);
    let summary = MaskBlocks::of(&summarized).expect("a summary");
    let blocks_buf = empty(&ctx, "mask_blocks", summary.size_bytes());
    let engine = FlashAttention::new(&ctx);
    let mut encoder = ctx.device.create_command_encoder(&Default::default());
    engine
        .encode_mask_blocks(
            &mut encoder,
            &summarized,
            TensorBuffer::new(&mask_buf),
            TensorBuffer::new(&blocks_buf),
            None,
        )
        .expect("summary");
    ctx.queue.submit([encoder.finish()]);

    let id = format!("{}/b1_h{heads}_s{seq}_d{head_dim}_docs{DOCUMENTS}", dtype.name());
    let mut group = c.benchmark_group(format!("mask/{}", ctx.info.name));
    group.sample_size(10).warm_up_time(Duration::from_millis(500));
    group.throughput(Throughput::Elements(dense.flops() as u64));
    macro_rules! timed {
        ($name:expr, $encode:expr) => {
            group.bench_function(BenchmarkId::new($name, &id), |b| {
                b.iter_custom(|iters| {
                    let t = time_passes(&ctx, 1, iters as usize, $encode).expect("GPU run failed");
                    Duration::from_secs_f64(t.median * iters as f64)
                })
            });
        };
    }
    fn forward<T: wgpu_flash_attn::Element>(
        c: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
        ctx: &GpuContext,
        id: &str,
        problems: [(&str, &FlashAttention, AttentionProblem); 4],
        mask: &wgpu::Buffer,
        blocks: &wgpu::Buffer,
    ) {
        let work = Workload::<T>::random(ctx, &problems[0].2, 7).expect("inputs");
        for (name, engine, problem) in problems {
            let buffers = ForwardBuffers {
                mask: problem.mask.map(|_| TensorBuffer::new(mask)),
                mask_blocks: problem.mask_blocks.then(|| TensorBuffer::new(blocks)),
                ..work.buffers()
            };
            let kernel = engine.select(&problem).map(|k| k.name()).unwrap_or_default();
            c.bench_function(BenchmarkId::new(format!("fwd_{name}/{kernel}"), id), |b| {
                b.iter_custom(|iters| {
                    let t = time_passes(ctx, 1, iters as usize, |encoder, ts| {
                        engine.encode_forward(encoder, &problem, &buffers, ts).map(|_| ())
                    })
                    .expect("GPU run failed");
                    Duration::from_secs_f64(t.median * iters as f64)
                })
            });
        }
    }
    // Masks run on the tiled kernel alone: the dense problem on it too, for the like-for-like
    // ratio, and as automatic selection runs it (the cooperative-matrix kernel for f16 where the
    // device has one), for what a mask costs against the fastest dense kernel.
    let tiled = FlashAttention::with_options(
        &ctx,
        Options {
            choice: KernelChoice::Tiled(Default::default()),
            ..Default::default()
        },
    );
    let problems = [
        ("dense", &engine, dense),
        ("dense_tiled", &tiled, dense),
        ("mask", &engine, masked),
        ("mask_blocks", &engine, summarized),
    ];
    match dtype {
        DType::F16 => forward::<half::f16>(&mut group, &ctx, &id, problems, &mask_buf, &blocks_buf),
        _ => forward::<f32>(&mut group, &ctx, &id, problems, &mask_buf, &blocks_buf),
    }

    // The summary itself: once per mask.
    timed!("summary", |encoder, ts| {
        engine
            .encode_mask_blocks(
                encoder,
                &summarized,
                TensorBuffer::new(&mask_buf),
                TensorBuffer::new(&blocks_buf),
                ts,
            )
            .map(|_| ())
    });

    // The backward, dense against the summarized mask (f32 inputs on either size: the backward
    // selects f32 tiles anyway).
    let es = dtype.size_bytes() as u64;
    let input = |t: Tensor, seed| -> wgpu::Buffer {
        let n = dense.required_len(t);
        let bytes: Vec<u8> = match dtype {
            DType::F16 => bytemuck::cast_slice(&random_tensor::<half::f16>(seed, n)).to_vec(),
            _ => bytemuck::cast_slice(&random_tensor::<f32>(seed, n)).to_vec(),
        };
        storage(&ctx, t.name(), &bytes)
    };
    let (q, k, v, o) = (
        input(Tensor::Q, 1),
        input(Tensor::K, 2),
        input(Tensor::V, 3),
        input(Tensor::O, 4),
    );
    let lse = storage(&ctx, "lse", &vec![0u8; 4 * dense.lse_len()]);
    let bp = BackwardProblem::new(dense);
    let d_o = input(Tensor::O, 5);
    let grad = |t: GradTensor| empty(&ctx, t.name(), es * bp.required_len(t) as u64);
    let (dq, dk, dv) = (grad(GradTensor::DQ), grad(GradTensor::DK), grad(GradTensor::DV));
    let delta = empty(&ctx, "delta", 4 * dense.lse_len() as u64);
    for (name, problem) in [("dense", dense), ("mask_blocks", summarized)] {
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
            cu_seqlens_q: None,
            cu_seqlens_k: None,
            alibi_slopes: None,
            sinks: None,
            d_sinks: None,
            bias: None,
            mask: problem.mask.map(|_| TensorBuffer::new(&mask_buf)),
            mask_blocks: problem.mask_blocks.then(|| TensorBuffer::new(&blocks_buf)),
            d_bias: None,
        };
        let bp = BackwardProblem::new(problem);
        timed!(format!("bwd_{name}"), |encoder, ts| {
            engine.encode_backward(encoder, bp, &buffers, ts).map(|_| ())
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
