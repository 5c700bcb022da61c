//! The decode benchmark (lab tool, H200): the decode kernel on issue 16's bar shapes — one or a
//! few new tokens, 32 query heads over 8 K/V heads, head_dim 128, caches of 32,768 and 131,072
//! keys — checked against the float64 reference on sampled rows, then timed (GPU timestamps,
//! both dispatches of a split call) as K/V bytes read per second. With `--sweep`, every plan of a
//! grid and split counts around the rule's, to tune `DECODE_PLANS` and the rule.
//!
//! With `--lanes`, the lane kernel (FMA units) also runs beside the automatic choice; with
//! `--coop-sweep`, every cooperative-matrix plan of a grid (and `--coop-splits N,...` forces
//! its split counts).
//!
//! With `--read-probe MB`, no attention: a plain WGSL kernel reads MB megabytes (vec4<u32> loads,
//! four in flight per invocation) at several grid sizes, whole-grid strided or one chunk per
//! workgroup as a decode piece reads its keys, in modules with and without wgpu's bounds checks:
//! the rate at which this device's storage buffers can be read through wgpu at all, the ceiling
//! of any decode kernel here.
//!
//! With `--paged 16,256`, the same shapes also run over a paged cache of each page size (a
//! shuffled page table into a pool of the same keys), timed beside the contiguous cache in the
//! same run and checked equal to it.
//!
//! ```text
//! cargo run --release --features internals --example decode_bench -- [--sweep] [--dtype f16|bf16|f32]
//!     [--batch 1,8] [--kv 32768,131072] [--q 1,4] [--runs 50] [--paged 16,256] [--json FILE]
//!     [--layout bshd|bhsd] [--splits 57,1] [--lanes] [--coop-sweep] [--coop-splits 33,66]
//!     [--read-probe 1024]
//! ```

use std::io::Write;

use wgpu::util::DeviceExt;
use wgpu_flash_attn::batch::PagedKv;
use wgpu_flash_attn::kernel::{CoopDecodePlan, DecodeChoice, DecodePlan, ForwardKernel};
use wgpu_flash_attn::testing::harness::{Kernel, Workload};
use wgpu_flash_attn::testing::timing::{time_passes, time_passes_at_least, Timing};
use wgpu_flash_attn::testing::{random_tensor, seed_of};
use wgpu_flash_attn::{
    AttentionProblem, AttentionShape, DType, Element, FlashAttention, ForwardBuffers, GpuContext, KernelChoice, Layout,
    Options, Tensor, TensorBuffer,
};

/// At least this long timed (`time_passes` keeps the GPU busy for its own warm-up before).
const TIMED_S: f64 = 0.1;

struct Args {
    sweep: bool,
    dtype: DType,
    batches: Vec<usize>,
    kv_lens: Vec<usize>,
    q_lens: Vec<usize>,
    runs: usize,
    paged: Vec<usize>,
    /// `--splits 57,1`: runs of the automatic plan at these forced split counts, beside the
    /// automatic split.
    splits: Vec<u32>,
    json: Option<String>,
    /// `--layout bhsd`: every tensor head-major (each K/V head's cache one contiguous run, as
    /// PyTorch's tensors in torch_decode.py); the default BSHD keeps a key's heads together.
    layout: Layout,
    lanes: bool,
    coop_sweep: bool,
    coop_splits: Vec<u32>,
    read_probe_mb: Option<usize>,
}

fn parse() -> Args {
    let mut args = Args {
        sweep: false,
        dtype: DType::F16,
        batches: vec![1, 8],
        kv_lens: vec![32768, 131072],
        q_lens: vec![1, 4],
        runs: 50,
        paged: Vec::new(),
        splits: Vec::new(),
        json: None,
        layout: Layout::Bshd,
        lanes: false,
        coop_sweep: false,
        coop_splits: Vec::new(),
        read_probe_mb: None,
    };
    let list = |s: String| {
        s.split(',')
            .map(|x| x.parse().expect("a number"))
            .collect::<Vec<usize>>()
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--sweep" => args.sweep = true,
            "--dtype" => {
                args.dtype = match value().as_str() {
                    "f32" => DType::F32,
                    "bf16" => DType::BF16,
                    _ => DType::F16,
                }
            }
            "--batch" => args.batches = list(value()),
            "--kv" => args.kv_lens = list(value()),
            "--q" => args.q_lens = list(value()),
            "--runs" => args.runs = value().parse().expect("a number"),
            "--json" => args.json = Some(value()),
            "--paged" => args.paged = list(value()),
            "--splits" => args.splits = list(value()).into_iter().map(|x| x as u32).collect(),
            "--lanes" => args.lanes = true,
            "--read-probe" => args.read_probe_mb = Some(value().parse().expect("megabytes")),
            "--coop-sweep" => args.coop_sweep = true,
            "--coop-splits" => args.coop_splits = list(value()).into_iter().map(|x| x as u32).collect(),
            "--layout" => {
                args.layout = match value().as_str() {
                    "bshd" => Layout::Bshd,
                    "bhsd" => Layout::Bhsd,
                    other => panic!("--layout: bshd or bhsd, not {other}"),
                }
            }
            other => panic!("unknown flag {other}"),
        }
    }
    assert!(
        args.paged.is_empty() || args.layout == Layout::Bshd,
        "--paged builds its pools from a BSHD cache: leave --layout at bshd"
    );
    args
}

/// The plans `--sweep` tries (rows follow the problem).
fn sweep_plans() -> Vec<DecodePlan> {
    let mut plans = Vec::new();
    for lanes_per_key in [8, 16, 32] {
        for keys_per_step in [2, 4, 8] {
            for workgroup_size in [64, 128, 256] {
                plans.push(DecodePlan {
                    lanes_per_key,
                    rows: 8,
                    keys_per_step,
                    workgroup_size,
                });
            }
        }
    }
    plans
}

/// The cooperative-matrix plans `--coop-sweep` tries.
fn coop_sweep_plans() -> Vec<CoopDecodePlan> {
    let mut plans = Vec::new();
    for subgroups in [2, 4, 8] {
        for block_n in [16, 32] {
            plans.push(CoopDecodePlan { subgroups, block_n });
        }
    }
    plans
}

/// The automatic plan at `splits` pieces (at least 1).
fn forced_splits(splits: u32) -> KernelChoice {
    KernelChoice::Decode(DecodeChoice {
        splits: Some(splits.max(1)),
        ..DecodeChoice::default()
    })
}

fn run<T: Element>(ctx: &GpuContext, args: &Args, out: &mut Option<std::fs::File>) -> bool {
    let mut ok = true;
    for &batch in &args.batches {
        for &seq_kv in &args.kv_lens {
            for &seq_q in &args.q_lens {
                let problem = AttentionProblem::new(
                    AttentionShape {
                        batch,
                        seq_q,
                        seq_kv,
                        num_heads: 32,
                        num_kv_heads: 8,
                        head_dim: 128,
                    },
                    args.dtype,
                )
                .with_causal(true)
                .with_layout(args.layout);
                let label = format!("decode_b{batch}_q{seq_q}_kv{seq_kv}");
                let work = match Workload::<T>::random(ctx, &problem, seed_of(&label)) {
                    Ok(w) => w,
                    Err(e) => {
                        println!("{label}: {e}");
                        continue;
                    }
                };
                let kv_bytes = 2.0 * (batch * seq_kv * 8 * 128 * args.dtype.size_bytes()) as f64;
                let mut choices = vec![KernelChoice::Auto];
                choices.extend(args.splits.iter().map(|&n| forced_splits(n)));
                if args.lanes {
                    choices.push(KernelChoice::Decode(DecodeChoice {
                        cooperative_matrix: Some(false),
                        ..DecodeChoice::default()
                    }));
                }
                if args.coop_sweep {
                    for plan in coop_sweep_plans() {
                        let splits: Vec<Option<u32>> = match args.coop_splits.is_empty() {
                            true => vec![None],
                            false => args.coop_splits.iter().map(|&n| Some(n.max(1))).collect(),
                        };
                        for splits in splits {
                            choices.push(KernelChoice::Decode(DecodeChoice {
                                coop_plan: Some(plan),
                                splits,
                                ..DecodeChoice::default()
                            }));
                        }
                    }
                }
                if args.sweep {
                    let auto = FlashAttention::new(ctx).select(&problem).ok();
                    let auto_splits = match auto {
                        Some(ForwardKernel::Decode { split, .. }) => split.splits,
                        _ => 1,
                    };
                    for plan in sweep_plans() {
                        choices.push(KernelChoice::Decode(DecodeChoice {
                            plan: Some(plan.with_rows_for((4 * seq_q) as u32)),
                            cooperative_matrix: Some(false),
                            ..DecodeChoice::default()
                        }));
                    }
                    for splits in [1, auto_splits / 2, auto_splits * 2, 132, 264] {
                        choices.push(forced_splits(splits));
                    }
                }
                for &page_size in &args.paged {
                    if let Err(e) = paged_run::<T>(ctx, &problem, page_size, kv_bytes, &label, args.runs, out) {
                        ok = false;
                        println!("{label} paged {page_size}: {e}");
                    }
                }
                for choice in choices {
                    let engine = FlashAttention::with_options(
                        ctx,
                        Options {
                            choice,
                            ..Options::default()
                        },
                    );
                    let kernel = match engine.select(&problem) {
                        Ok(k) => k,
                        Err(e) => {
                            println!("{label} {choice:?}: {e}");
                            continue;
                        }
                    };
                    let result = work.run(&engine, Kernel::Flash).and_then(|(o, lse)| {
                        let check = work.check_rows(&o, &lse, 64)?;
                        // Short kernels: time at least TIMED_S of runs.
                        let timing = work.time_at_least(&engine, Kernel::Flash, 5, args.runs, TIMED_S)?;
                        Ok((check, timing))
                    });
                    match result {
                        Ok((check, timing)) => {
                            let pass = check.passes(args.dtype);
                            ok &= pass;
                            let tbps = kv_bytes / timing.median / 1e12;
                            println!(
                                "{label} {:<48} {:>8.1} us {:>6.2} TB/s  check {} rel {:.1e}",
                                kernel.name(),
                                timing.median * 1e6,
                                tbps,
                                if pass { "PASS" } else { "FAIL" },
                                check.out.rel_l2
                            );
                            if let Some(f) = out.as_mut() {
                                let _ = writeln!(
                                    f,
                                    "{{\"shape\":\"{label}\",\"dtype\":\"{}\",\"kernel\":\"{}\",\"us\":{:.2},\"tbps\":{tbps:.3},\"pass\":{pass},\"auto\":{}}}",
                                    args.dtype.name(),
                                    kernel.name(),
                                    timing.median * 1e6,
                                    matches!(choice, KernelChoice::Auto)
                                );
                            }
                        }
                        Err(e) => {
                            ok = false;
                            println!("{label} {}: {e}", kernel.name());
                        }
                    }
                }
            }
        }
    }
    ok
}

/// Times `problem` over a contiguous cache and over a paged one of `page_size` holding the same
/// keys (a shuffled page table into a pool of exactly the pages needed), in the same run; checks
/// that both give the same output; prints both and their ratio.
fn paged_run<T: Element>(
    ctx: &GpuContext,
    problem: &AttentionProblem,
    page_size: usize,
    kv_bytes: f64,
    label: &str,
    runs: usize,
    out: &mut Option<std::fs::File>,
) -> wgpu_flash_attn::Result<()> {
    let s = problem.shape;
    let pages_per_seq = s.seq_kv.div_ceil(page_size);
    let num_pages = s.batch * pages_per_seq;
    let paged = problem.with_paged_kv(
        PagedKv {
            page_size,
            num_pages,
            pages_per_seq,
        },
        Layout::Bshd,
    );
    let seed = seed_of(label);
    let q: Vec<T> = random_tensor(seed, problem.required_len(Tensor::Q));
    let k: Vec<T> = random_tensor(seed + 1, problem.required_len(Tensor::K));
    let v: Vec<T> = random_tensor(seed + 2, problem.required_len(Tensor::V));
    // Page i of the pool holds logical page table[i]'s keys: a fixed shuffle.
    let mut table: Vec<u32> = (0..num_pages as u32).collect();
    let mut x = seed | 1;
    for i in (1..table.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        table.swap(i, (x % (i as u64 + 1)) as usize);
    }
    let row = s.num_kv_heads * s.head_dim;
    let pool = |dense: &[T]| {
        let mut pool = vec![dense[0]; paged.required_len(Tensor::K)];
        for b in 0..s.batch {
            for j in 0..s.seq_kv {
                let page = table[b * pages_per_seq + j / page_size] as usize;
                let at = (page * page_size + j % page_size) * row;
                let from = (b * s.seq_kv + j) * row;
                pool[at..at + row].copy_from_slice(&dense[from..from + row]);
            }
        }
        pool
    };
    let (k_pool, v_pool) = (pool(&k), pool(&v));
    let device = &ctx.device;
    let buffer = |bytes: &[u8]| {
        device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: None,
            contents: bytes,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
        })
    };
    let (qb, kb, vb, kpb, vpb, tb) = (
        buffer(bytemuck::cast_slice(&q)),
        buffer(bytemuck::cast_slice(&k)),
        buffer(bytemuck::cast_slice(&v)),
        buffer(bytemuck::cast_slice(&k_pool)),
        buffer(bytemuck::cast_slice(&v_pool)),
        buffer(bytemuck::cast_slice(&table)),
    );
    let o_bytes = (problem.required_len(Tensor::O) * problem.dtype.size_bytes()) as u64;
    let (oc, op) = (buffer(&vec![0; o_bytes as usize]), buffer(&vec![0; o_bytes as usize]));
    let engine = FlashAttention::new(ctx);
    let contiguous = ForwardBuffers::new(
        TensorBuffer::new(&qb),
        TensorBuffer::new(&kb),
        TensorBuffer::new(&vb),
        TensorBuffer::new(&oc),
        None,
    );
    let paged_buffers = ForwardBuffers {
        page_table: Some(TensorBuffer::new(&tb)),
        ..ForwardBuffers::new(
            TensorBuffer::new(&qb),
            TensorBuffer::new(&kpb),
            TensorBuffer::new(&vpb),
            TensorBuffer::new(&op),
            None,
        )
    };
    let time = |p: &AttentionProblem, b: &ForwardBuffers<'_>| -> wgpu_flash_attn::Result<Timing> {
        let mut run = |encoder: &mut wgpu::CommandEncoder, ts: Option<wgpu::ComputePassTimestampWrites<'_>>| {
            engine.encode_forward(encoder, p, b, ts).map(|_| ())
        };
        time_passes_at_least(ctx, 5, runs, TIMED_S, &mut run)
    };
    let t_contiguous = time(problem, &contiguous)?;
    let t_paged = time(&paged, &paged_buffers)?;
    let got = pollster::block_on(wgpu_flash_attn::gpu::readback::read_back(
        device,
        &ctx.queue,
        &[(&oc, 0, o_bytes), (&op, 0, o_bytes)],
    ))?;
    let (a, b): (Vec<T>, Vec<T>) = (
        bytemuck::pod_collect_to_vec(&got[0]),
        bytemuck::pod_collect_to_vec(&got[1]),
    );
    let diff = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x.to_f64() - y.to_f64()).abs())
        .fold(0.0, f64::max);
    let same = diff <= 1e-6 && a.iter().all(|x| x.to_f64().is_finite());
    let (tc, tp) = (kv_bytes / t_contiguous.median / 1e12, kv_bytes / t_paged.median / 1e12);
    println!(
        "{label} paged {page_size:>4}: {:>8.1} us {tp:>6.2} TB/s  contiguous {:>8.1} us {tc:>6.2} TB/s  paged/contiguous {:.3}  same output: {same} (max diff {diff:.1e})",
        t_paged.median * 1e6,
        t_contiguous.median * 1e6,
        tp / tc
    );
    if let Some(f) = out.as_mut() {
        let _ = writeln!(
            f,
            "{{\"shape\":\"{label}\",\"page_size\":{page_size},\"paged_us\":{:.2},\"paged_tbps\":{tp:.3},\"contiguous_us\":{:.2},\"contiguous_tbps\":{tc:.3},\"same\":{same}}}",
            t_paged.median * 1e6,
            t_contiguous.median * 1e6
        );
    }
    if same {
        Ok(())
    } else {
        Err(wgpu_flash_attn::Error::ReadBack(format!(
            "paged output differs from contiguous by {diff}"
        )))
    }
}

fn main() -> std::process::ExitCode {
    let args = parse();
    let ctx = match pollster::block_on(GpuContext::new()) {
        Ok(ctx) => ctx,
        Err(e) => {
            eprintln!("no device: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    println!("# {} ({:?})", ctx.info.name, ctx.info.backend);
    if let Some(mb) = args.read_probe_mb {
        return match read_probe(&ctx, mb) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("read probe: {e}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    let mut out = args.json.as_ref().map(|p| std::fs::File::create(p).expect("json file"));
    let ok = match args.dtype {
        DType::F32 => run::<f32>(&ctx, &args, &mut out),
        DType::F16 => run::<half::f16>(&ctx, &args, &mut out),
        DType::BF16 => run::<half::bf16>(&ctx, &args, &mut out),
    };
    if ok {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}

/// The read probe's kernel: each invocation XORs vec4<u32> granules of `src` into a register,
/// four loads in flight, and writes one word (so the loads cannot be dropped). `CHUNKED`: each
/// workgroup reads its own contiguous chunk (as a decode piece reads its keys); else the whole
/// grid strides over the buffer.
const READ_PROBE: &str = r#"
@group(0) @binding(0) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;

@compute @workgroup_size(256)
fn probe(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
         @builtin(local_invocation_index) li: u32) {
    let total = arrayLength(&src);
    var first = wg.x * 256u + li;
    var stride = groups.x * 256u;
    var end = total;
    if (CHUNKED) {
        let chunk = total / groups.x;
        first = wg.x * chunk + li;
        stride = 256u;
        end = (wg.x + 1u) * chunk;
    }
    var a = vec4<u32>(0u);
    var b = vec4<u32>(0u);
    var c = vec4<u32>(0u);
    var d = vec4<u32>(0u);
    var i = first;
    for (; i + 3u * stride < end; i += 4u * stride) {
        a ^= src[i];
        b ^= src[i + stride];
        c ^= src[i + 2u * stride];
        d ^= src[i + 3u * stride];
    }
    for (; i < end; i += stride) {
        a ^= src[i];
    }
    let x = a ^ b ^ c ^ d;
    dst[wg.x * 256u + li] = x.x ^ x.y ^ x.z ^ x.w;
}
"#;

/// Times READ_PROBE over `mb` megabytes at several grids, both access patterns, with and
/// without wgpu's bounds checks; prints TB/s read.
fn read_probe(ctx: &GpuContext, mb: usize) -> wgpu_flash_attn::Result<()> {
    let device = &ctx.device;
    let bytes = (mb as u64) << 20;
    let src = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("read probe src"),
        size: bytes,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let max_groups = 8448u32;
    let dst = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("read probe dst"),
        size: max_groups as u64 * 256 * 4,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    });
    for chunked in [false, true] {
        for checked in [false, true] {
            let source = format!("const CHUNKED: bool = {chunked};\n{READ_PROBE}");
            let desc = wgpu::ShaderModuleDescriptor {
                label: Some("read probe"),
                source: wgpu::ShaderSource::Wgsl(source.into()),
            };
            let module = match checked {
                true => device.create_shader_module(desc),
                // SAFETY: every index the probe forms is below arrayLength(&src) or the size of dst.
                false => unsafe { device.create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked()) },
            };
            let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some("read probe"),
                layout: None,
                module: &module,
                entry_point: Some("probe"),
                compilation_options: Default::default(),
                cache: None,
            });
            let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("read probe"),
                layout: &pipeline.get_bind_group_layout(0),
                entries: &[
                    wgpu::BindGroupEntry {
                        binding: 0,
                        resource: src.as_entire_binding(),
                    },
                    wgpu::BindGroupEntry {
                        binding: 1,
                        resource: dst.as_entire_binding(),
                    },
                ],
            });
            for groups in [132u32, 264, 528, 1056, 2112, 8448] {
                let timing = time_passes(ctx, 20, 50, |encoder, timestamps| {
                    let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                        label: Some("read probe"),
                        timestamp_writes: timestamps,
                    });
                    pass.set_pipeline(&pipeline);
                    pass.set_bind_group(0, &group, &[]);
                    pass.dispatch_workgroups(groups, 1, 1);
                    Ok(())
                })?;
                println!(
                    "read_probe {:>5} MB {:<7} {:<9} {groups:>5} workgroups {:>8.1} us {:>6.2} TB/s",
                    mb,
                    if chunked { "chunked" } else { "strided" },
                    if checked { "checked" } else { "unchecked" },
                    timing.median * 1e6,
                    bytes as f64 / timing.median / 1e12
                );
            }
        }
    }
    Ok(())
}
