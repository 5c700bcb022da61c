//! A serving loop over a paged K/V cache: a batch of sequences of different lengths, one new token
//! each per step (random weights: the new token's Q, K and V are random), each step recorded as
//! the append of the new K/V into the cache's pages and the attention over the cache, one
//! submission. At chosen steps the output is checked against the float64 reference over a host
//! copy of the cache; at the end it prints tokens/s and the cache bytes read per second.
//! Public API only.
//!
//! ```text
//! cargo run --release --example decode_loop -- [--batch 4] [--heads 32] [--kv-heads 8]
//!     [--head-dim 128] [--page-size 16] [--prompt 1000] [--steps 64] [--check-every 16]
//! ```
//! Defaults are small on a CPU adapter (lavapipe): 3 sequences, 8 heads over 2, head_dim 64,
//! prompts up to 200 tokens, 12 steps.

use std::time::Instant;

use wgpu::util::DeviceExt;
use wgpu_flash_attn::batch::{AppendBuffers, BatchIndex, PagedKv};
use wgpu_flash_attn::testing::{random_tensor, ErrorStats, Rng};
use wgpu_flash_attn::{
    reference, AttentionProblem, AttentionShape, DType, FlashAttention, ForwardBuffers, GpuContext, Layout, Tensor,
    TensorBuffer,
};

type Elem = half::f16;

struct Args {
    batch: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    page_size: usize,
    prompt: usize,
    steps: usize,
    check_every: usize,
}

fn parse(cpu: bool) -> Args {
    let mut a = if cpu {
        Args {
            batch: 3,
            heads: 8,
            kv_heads: 2,
            head_dim: 64,
            page_size: 16,
            prompt: 200,
            steps: 12,
            check_every: 4,
        }
    } else {
        Args {
            batch: 4,
            heads: 32,
            kv_heads: 8,
            head_dim: 128,
            page_size: 16,
            prompt: 1000,
            steps: 64,
            check_every: 16,
        }
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value: usize = it.next().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
            eprintln!("{flag} needs a number");
            std::process::exit(2)
        });
        match flag.as_str() {
            "--batch" => a.batch = value,
            "--heads" => a.heads = value,
            "--kv-heads" => a.kv_heads = value,
            "--head-dim" => a.head_dim = value,
            "--page-size" => a.page_size = value,
            "--prompt" => a.prompt = value,
            "--steps" => a.steps = value,
            "--check-every" => a.check_every = value.max(1),
            other => {
                eprintln!("unknown flag {other}");
                std::process::exit(2)
            }
        }
    }
    a
}

fn main() -> wgpu_flash_attn::Result<()> {
    let ctx = pollster::block_on(GpuContext::new())?;
    let a = parse(ctx.info.device_type == wgpu::DeviceType::Cpu);
    let mut rng = Rng::new(7);
    // Prompt lengths spread over [prompt/4, prompt]; the pool holds every sequence's final length.
    let mut lens: Vec<u32> = (0..a.batch)
        .map(|_| (a.prompt / 4 + (rng.next_u64() as usize) % (a.prompt - a.prompt / 4 + 1)) as u32)
        .collect();
    let max_len = a.prompt + a.steps;
    let pages_per_seq = max_len.div_ceil(a.page_size);
    let pages = PagedKv {
        page_size: a.page_size,
        num_pages: a.batch * pages_per_seq,
        pages_per_seq,
    };
    let shape = AttentionShape {
        batch: a.batch,
        seq_q: 1,
        seq_kv: pages_per_seq * a.page_size,
        num_heads: a.heads,
        num_kv_heads: a.kv_heads,
        head_dim: a.head_dim,
    };
    let problem = AttentionProblem::new(shape, DType::F16)
        .with_causal(true)
        .with_paged_kv(pages, Layout::Bshd)
        .with_kv_lengths(true);
    problem.validate()?;
    // Pages handed out in a shuffled order, as an allocator that reuses freed pages would.
    let mut table: Vec<u32> = (0..pages.num_pages as u32).collect();
    for i in (1..table.len()).rev() {
        table.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    // The cache on the host (for the reference) and on the device; the prompts' K/V are random.
    let mut k_pool: Vec<Elem> = random_tensor(1, problem.required_len(Tensor::K));
    let mut v_pool: Vec<Elem> = random_tensor(2, problem.required_len(Tensor::V));
    let device = &ctx.device;
    let storage = |bytes: &[u8]| {
        device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: None,
            contents: bytes,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
        })
    };
    let (k_buf, v_buf) = (
        storage(bytemuck::cast_slice(&k_pool)),
        storage(bytemuck::cast_slice(&v_pool)),
    );
    let table_buf = storage(bytemuck::cast_slice(&table));
    let row = a.kv_heads * a.head_dim;
    let token_len = a.batch * row;
    let q_len = problem.required_len(Tensor::Q);
    let (new_k_buf, new_v_buf) = (storage(&vec![0; token_len * 2]), storage(&vec![0; token_len * 2]));
    let q_buf = storage(&vec![0; q_len * 2]);
    let lens_buf = storage(&vec![0; a.batch * 4]);
    let o_buf = storage(&vec![0; problem.required_len(Tensor::O) * 2]);
    let lse_buf = storage(&vec![0; problem.lse_len() * 4]);
    let engine = FlashAttention::new(&ctx);
    println!(
        "# {} — {} sequences of {:?} tokens, {} heads over {}, head_dim {}, pages of {}",
        ctx.info.name, a.batch, lens, a.heads, a.kv_heads, a.head_dim, a.page_size
    );

    let (mut seconds, mut timed_steps, mut bytes_read) = (0.0, 0usize, 0.0);
    for step in 0..a.steps {
        for l in &mut lens {
            *l += 1;
        }
        let seed = 100 + step as u64 * 3;
        let new_k: Vec<Elem> = random_tensor(seed, token_len);
        let new_v: Vec<Elem> = random_tensor(seed + 1, token_len);
        let q: Vec<Elem> = random_tensor(seed + 2, q_len);
        for b in 0..a.batch {
            let key = lens[b] as usize - 1;
            let at = (table[b * pages_per_seq + key / a.page_size] as usize * a.page_size + key % a.page_size) * row;
            k_pool[at..at + row].copy_from_slice(&new_k[b * row..(b + 1) * row]);
            v_pool[at..at + row].copy_from_slice(&new_v[b * row..(b + 1) * row]);
        }
        ctx.queue.write_buffer(&new_k_buf, 0, bytemuck::cast_slice(&new_k));
        ctx.queue.write_buffer(&new_v_buf, 0, bytemuck::cast_slice(&new_v));
        ctx.queue.write_buffer(&q_buf, 0, bytemuck::cast_slice(&q));
        ctx.queue.write_buffer(&lens_buf, 0, bytemuck::cast_slice(&lens));

        let start = Instant::now();
        let mut encoder = device.create_command_encoder(&Default::default());
        let cache_index = (Some(TensorBuffer::new(&table_buf)), Some(TensorBuffer::new(&lens_buf)));
        let append = AppendBuffers {
            new_k: TensorBuffer::new(&new_k_buf),
            new_v: TensorBuffer::new(&new_v_buf),
            k_cache: TensorBuffer::new(&k_buf),
            v_cache: TensorBuffer::new(&v_buf),
            page_table: cache_index.0,
            kv_lens: cache_index.1,
        };
        let attend = ForwardBuffers {
            page_table: cache_index.0,
            kv_lens: cache_index.1,
            ..ForwardBuffers::new(
                TensorBuffer::new(&q_buf),
                TensorBuffer::new(&k_buf),
                TensorBuffer::new(&v_buf),
                TensorBuffer::new(&o_buf),
                Some(TensorBuffer::new(&lse_buf)),
            )
        };
        // The serving step: append this step's K/V, then attend over the cache, one submission.
        let kernel = engine.encode_append_and_forward(&mut encoder, &problem, &append, &attend, None)?;
        ctx.queue.submit([encoder.finish()]);
        device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| wgpu_flash_attn::Error::ReadBack(e.to_string()))?;
        if step > 0 {
            // The first step builds the pipelines.
            seconds += start.elapsed().as_secs_f64();
            timed_steps += 1;
            bytes_read += lens.iter().map(|&l| (2 * l as usize * row * 2) as f64).sum::<f64>();
        }

        if (step + 1) % a.check_every == 0 || step + 1 == a.steps {
            let out = read::<Elem>(&ctx, &o_buf)?;
            let lse = read::<f32>(&ctx, &lse_buf)?;
            let index = BatchIndex {
                page_table: Some(&table),
                kv_lens: Some(&lens),
                ..Default::default()
            };
            let want = reference::attention_indexed(&problem, &q, &k_pool, &v_pool, &index)?;
            let o = ErrorStats::from_pairs(out.iter().map(|x| x.to_f64()).zip(want.out.iter().copied()));
            let l = ErrorStats::from_pairs(lse.iter().map(|&x| x as f64).zip(want.lse.iter().copied()));
            let pass = o.within(1e-2, 1.5e-2) && l.within(1e-5, 2e-3);
            println!(
                "step {:>4}: {} lengths {:?}  O {o}  LSE max abs {:.1e}  {}",
                step + 1,
                kernel.name(),
                lens,
                l.max_abs,
                if pass { "PASS" } else { "FAIL" }
            );
            if !pass {
                std::process::exit(1);
            }
        }
    }
    if timed_steps > 0 {
        println!(
            "{timed_steps} steps in {:.3} s (wall clock, submit to completion): {:.0} tokens/s, {:.1} GB/s of K/V read",
            seconds,
            (timed_steps * a.batch) as f64 / seconds,
            bytes_read / seconds / 1e9
        );
    }
    Ok(())
}

fn read<T: bytemuck::Pod>(ctx: &GpuContext, buffer: &wgpu::Buffer) -> wgpu_flash_attn::Result<Vec<T>> {
    let staging = ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: buffer.size(),
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut encoder = ctx.device.create_command_encoder(&Default::default());
    encoder.copy_buffer_to_buffer(buffer, 0, &staging, 0, buffer.size());
    ctx.queue.submit([encoder.finish()]);
    let slice = staging.slice(..);
    slice.map_async(wgpu::MapMode::Read, |_| {});
    ctx.device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| wgpu_flash_attn::Error::ReadBack(e.to_string()))?;
    let view = slice
        .get_mapped_range()
        .map_err(|e| wgpu_flash_attn::Error::ReadBack(format!("{e:?}")))?;
    Ok(bytemuck::pod_collect_to_vec(&view))
}
