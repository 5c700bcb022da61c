//! Flash attention against the naive (materialized-scores) kernel over sequence lengths, on the
//! best adapter. Criterion's throughput is in FLOPs (`4·B·H·Sq·Skv·D`, halved when causal), so its
//! "elem/s" column reads as FLOP/s. Times come from GPU timestamps when the device has them.
//!
//! ```text
//! cargo bench --bench attention                      # FlashAttention-paper shapes: batch·seq = 16k, 16 heads of 128
//! FLASH_BENCH_SMALL=1 cargo bench --bench attention  # small shapes (the default on CPU adapters)
//! ```

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use wgpu_flash_attn::testing::harness::{Kernel, Workload};
use wgpu_flash_attn::{AttentionProblem, DType, FlashAttention, GpuContext};

fn shapes(ctx: &GpuContext) -> Vec<AttentionProblem> {
    let small = std::env::var("FLASH_BENCH_SMALL").is_ok() || ctx.info.device_type == wgpu::DeviceType::Cpu;
    let (tokens, heads, head_dim, seqs): (usize, usize, usize, &[usize]) = if small {
        (512, 4, 64, &[128, 256, 512])
    } else {
        (16384, 16, 128, &[1024, 2048, 4096, 8192, 16384])
    };
    let mut out = Vec::new();
    for &seq in seqs {
        for causal in [false, true] {
            out.push(
                AttentionProblem::mha((tokens / seq).max(1), seq, heads, head_dim, DType::F32).with_causal(causal),
            );
        }
    }
    out
}

fn bench(c: &mut Criterion) {
    let ctx = match pollster::block_on(GpuContext::new()) {
        Ok(ctx) => ctx,
        Err(e) => {
            eprintln!("no GPU adapter, nothing to benchmark: {e}");
            return;
        }
    };
    let engine = FlashAttention::new(&ctx);
    let mut group = c.benchmark_group(format!("attention/{}", ctx.info.name));
    group.sample_size(10).warm_up_time(Duration::from_millis(500));
    for problem in shapes(&ctx) {
        let s = problem.shape;
        let id = format!(
            "{}/b{}_h{}_s{}_d{}{}",
            problem.dtype.name(),
            s.batch,
            s.num_heads,
            s.seq_q,
            s.head_dim,
            if problem.causal { "_causal" } else { "" }
        );
        let work = match Workload::<f32>::random(&ctx, &problem, 7) {
            Ok(w) => w,
            Err(e) => {
                eprintln!("{id}: {e}");
                continue;
            }
        };
        group.throughput(Throughput::Elements(problem.flops() as u64));
        for kernel in [Kernel::Flash, Kernel::Naive] {
            if kernel == Kernel::Naive && engine.naive_plan(&problem).is_err() {
                continue;
            }
            let name = match kernel {
                Kernel::Flash => engine.select(&problem).map(|c| c.name()).unwrap_or_default(),
                Kernel::Naive => "naive".into(),
            };
            group.bench_function(BenchmarkId::new(name, &id), |b| {
                b.iter_custom(|iters| {
                    // One warm-up run (pipelines are built on the first), then `iters` timed runs.
                    let t = work.time(&engine, kernel, 1, iters as usize).expect("GPU run failed");
                    Duration::from_secs_f64(t.median * iters as f64)
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
