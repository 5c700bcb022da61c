//! Ring attention with logical ranks on one device: a sequence sharded over `--ranks` ranks
//! (zig-zag or contiguous), run as the ring runs it — one forward call per (query chunk, key
//! chunk) block, each query chunk's partial results merged by their LSEs in ring order — and
//! timed beside one forward call of the whole problem, in the same process on the same device.
//! Prints each rank's share of the attended (query, key) pairs (the balance a ring of devices
//! would see), both times, and the ring's result against the float64 reference on sampled rows;
//! with `--backward`, the ring's gradients against one backward call's, and both timed.
//!
//! With `--cuda` (built with `--features internals,cuda`; bf16 or f16), the same on the CUDA
//! engine: `CudaAttention::ring_forward_device` / `ring_backward_device` beside one
//! `forward_device` / `backward_device` call, timed with CUDA events (medians of `--runs`).
//!
//! One device cannot show a ring's speed-up: the figure here is the cost of cutting the problem
//! into blocks and merging them (what each device of a ring pays on its own share), not a
//! multi-GPU scaling efficiency (docs/context-parallel.md).
//!
//! ```text
//! cargo run --release --features internals --example ring -- [--ranks 4] [--contiguous]
//!     [--seq 1024] [--batch 1] [--heads 8] [--kv-heads heads] [--head-dim 64] [--dtype f32|f16|bf16]
//!     [--causal] [--backward] [--runs 5] [--check-rows 8] [--cuda]
//! ```

use wgpu_flash_attn::reference;
use wgpu_flash_attn::ring::{Ring, ShardLayout};
use wgpu_flash_attn::testing::timing::time_submission;
use wgpu_flash_attn::testing::{random_tensor, ErrorStats};
use wgpu_flash_attn::{
    AttentionProblem, AttentionShape, BackwardBuffers, BackwardInputs, BackwardProblem, DType, Element, FlashAttention,
    ForwardBuffers, GpuContext, Tensor, TensorBuffer,
};

struct Args {
    ranks: usize,
    layout: ShardLayout,
    seq: usize,
    batch: usize,
    heads: usize,
    kv_heads: Option<usize>,
    head_dim: usize,
    dtype: DType,
    causal: bool,
    backward: bool,
    runs: usize,
    check_rows: usize,
    cuda: bool,
}

fn parse() -> Args {
    let mut a = Args {
        ranks: 4,
        layout: ShardLayout::ZigZag,
        seq: 1024,
        batch: 1,
        heads: 8,
        kv_heads: None,
        head_dim: 64,
        dtype: DType::F32,
        causal: false,
        backward: false,
        runs: 5,
        check_rows: 8,
        cuda: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut text = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--ranks" => a.ranks = text().parse().expect("a number"),
            "--contiguous" => a.layout = ShardLayout::Contiguous,
            "--seq" => a.seq = text().parse().expect("a number"),
            "--batch" => a.batch = text().parse().expect("a number"),
            "--heads" => a.heads = text().parse().expect("a number"),
            "--kv-heads" => a.kv_heads = Some(text().parse().expect("a number")),
            "--head-dim" => a.head_dim = text().parse().expect("a number"),
            "--dtype" => {
                a.dtype = match text().as_str() {
                    "f32" => DType::F32,
                    "f16" => DType::F16,
                    "bf16" => DType::BF16,
                    other => panic!("unknown dtype {other}"),
                }
            }
            "--causal" => a.causal = true,
            "--backward" => a.backward = true,
            "--runs" => a.runs = text().parse().expect("a number"),
            "--check-rows" => a.check_rows = text().parse().expect("a number"),
            "--cuda" => a.cuda = true,
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

fn main() {
    let a = parse();
    if a.cuda {
        #[cfg(feature = "cuda")]
        match a.dtype {
            DType::F16 => cuda::run::<half::f16>(&a),
            DType::BF16 => cuda::run::<half::bf16>(&a),
            DType::F32 => panic!("the CUDA engine runs bf16 or f16"),
        }
        #[cfg(not(feature = "cuda"))]
        panic!("--cuda needs the example built with --features internals,cuda");
        #[cfg(feature = "cuda")]
        return;
    }
    let ctx = pollster::block_on(GpuContext::new()).unwrap_or_else(|e| panic!("no device: {e}"));
    println!("device: {} ({:?})", ctx.info.name, ctx.info.backend);
    match a.dtype {
        DType::F32 => run::<f32>(&ctx, &a),
        DType::F16 => run::<half::f16>(&ctx, &a),
        DType::BF16 => run::<half::bf16>(&ctx, &a),
    }
}

fn run<T: Element>(ctx: &GpuContext, a: &Args) {
    let (ring, problem) = ring_and_problem(a);
    let attn = FlashAttention::new(ctx);

    report_shares(a, &ring);

    let q: Vec<T> = random_tensor(1, problem.required_len(Tensor::Q));
    let k: Vec<T> = random_tensor(2, problem.required_len(Tensor::K));
    let v: Vec<T> = random_tensor(3, problem.required_len(Tensor::V));
    let out = attn
        .ring_forward_blocking(&problem, &ring, &q, &k, &v)
        .unwrap_or_else(|e| panic!("{e}"));
    println!("kernel: {}", out.kernel);

    report_rows(a, &problem, [&q, &k, &v], &out.out);

    // Device buffers, then both paths timed by the wall clock from the submission of `runs`
    // recordings to its completion (the ring records several passes; timestamps bracket one).
    let upload = |label, data: &[T]| {
        wgpu::util::DeviceExt::create_buffer_init(
            &ctx.device,
            &wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents: bytemuck::cast_slice(data),
                usage: wgpu::BufferUsages::STORAGE,
            },
        )
    };
    let (qb, kb, vb) = (upload("q", &q), upload("k", &k), upload("v", &v));
    let output = |label, bytes: usize| {
        ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: bytes as u64,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        })
    };
    let ob = output("o", problem.required_len(Tensor::O) * a.dtype.size_bytes());
    let lb = output("lse", 4 * problem.lse_len());
    let buffers = ForwardBuffers::new(
        TensorBuffer::new(&qb),
        TensorBuffer::new(&kb),
        TensorBuffer::new(&vb),
        TensorBuffer::new(&ob),
        Some(TensorBuffer::new(&lb)),
    );
    let time = |record_one: &dyn Fn(&mut wgpu::CommandEncoder)| -> f64 {
        let timed = time_submission(ctx, 1, a.runs, |encoder| {
            record_one(encoder);
            Ok(())
        });
        timed.unwrap_or_else(|e| panic!("{e}")).complete
    };
    let one = time(&|e| {
        attn.encode_forward(e, &problem, &buffers, None)
            .unwrap_or_else(|err| panic!("{err}"));
    });
    let snap = |b: &wgpu::Buffer| -> Vec<u8> {
        let size = b.size();
        pollster::block_on(wgpu_flash_attn::gpu::readback::read_back(
            &ctx.device,
            &ctx.queue,
            &[(b, 0, size)],
        ))
        .unwrap()
        .remove(0)
    };
    let (lse_one, o_one) = (snap(&lb), snap(&ob));
    let d_o0: Vec<T> = random_tensor(4, problem.required_len(Tensor::O));
    let dob0 = upload("d_o", &d_o0);
    let g0 = |label, t: Tensor| output(label, problem.required_len(t) * a.dtype.size_bytes());
    let (dq0, dk0, dv0) = (g0("dq", Tensor::Q), g0("dk", Tensor::K), g0("dv", Tensor::V));
    let grads0 = BackwardBuffers::new(
        TensorBuffer::new(&qb),
        TensorBuffer::new(&kb),
        TensorBuffer::new(&vb),
        TensorBuffer::new(&ob),
        TensorBuffer::new(&lb),
        TensorBuffer::new(&dob0),
        TensorBuffer::new(&dq0),
        TensorBuffer::new(&dk0),
        TensorBuffer::new(&dv0),
    );
    let bwd = |label: &str| {
        let t = time(&|e| {
            attn.encode_backward(e, problem, &grads0, None)
                .unwrap_or_else(|err| panic!("{err}"));
        });
        println!("DIAG one-call backward {label}: {:.3} ms", t * 1e3);
    };
    bwd("after one-call forward");
    let ringed = time(&|e| {
        attn.encode_ring_forward(e, &problem, &ring, &buffers)
            .unwrap_or_else(|err| panic!("{err}"));
    });
    let (lse_ring, o_ring) = (snap(&lb), snap(&ob));
    let lse_a: Vec<f32> = bytemuck::pod_collect_to_vec(&lse_one);
    let lse_b: Vec<f32> = bytemuck::pod_collect_to_vec(&lse_ring);
    let worst = lse_a
        .iter()
        .zip(&lse_b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    let nonfinite = lse_b.iter().filter(|x| !x.is_finite()).count();
    println!(
        "DIAG lse one vs ring: max diff {worst:e}, ring non-finite {nonfinite} of {}; o bytes equal {}",
        lse_b.len(),
        o_one == o_ring
    );
    println!("DIAG lse one sample {:?} ring {:?}", &lse_a[..4], &lse_b[..4]);
    bwd("after ring forward");
    let o_a: Vec<u16> = bytemuck::pod_collect_to_vec(&o_one);
    let o_b: Vec<u16> = bytemuck::pod_collect_to_vec(&o_ring);
    let diff_bits = o_a.iter().zip(&o_b).filter(|(x, y)| x != y).count();
    println!("DIAG o elements differing {diff_bits} of {}", o_a.len());
    // Restore the one-call forward's O and LSE, time again.
    ctx.queue.write_buffer(&lb, 0, &lse_one);
    ctx.queue.write_buffer(&ob, 0, &o_one);
    bwd("after restoring one-call O only and LSE");
    ctx.queue.write_buffer(&lb, 0, &lse_ring);
    bwd("ring LSE, one-call O");
    ctx.queue.write_buffer(&lb, 0, &lse_one);
    ctx.queue.write_buffer(&ob, 0, &o_ring);
    bwd("one-call LSE, ring O");
    report_times(a, "forward", problem.flops(), one, ringed);
    if !a.backward {
        return;
    }

    // The backward: the ring's gradients against one call's, then both timed on the device.
    let d_o: Vec<T> = random_tensor(4, problem.required_len(Tensor::O));
    let inputs = BackwardInputs {
        q: &q,
        k: &k,
        v: &v,
        o: &out.out,
        lse: &out.lse,
        d_o: &d_o,
    };
    let ring_grads = attn
        .ring_backward_blocking(problem, &ring, &inputs)
        .unwrap_or_else(|e| panic!("{e}"));
    let one_grads = attn
        .backward_blocking(problem, &inputs)
        .unwrap_or_else(|e| panic!("{e}"));
    report_gradients(
        [&ring_grads.dq, &ring_grads.dk, &ring_grads.dv],
        [&one_grads.dq, &one_grads.dk, &one_grads.dv],
    );
    let dob = upload("d_o", &d_o);
    let grad = |label, t: Tensor| output(label, problem.required_len(t) * a.dtype.size_bytes());
    let (dq, dk, dv) = (grad("dq", Tensor::Q), grad("dk", Tensor::K), grad("dv", Tensor::V));
    let grads = BackwardBuffers::new(
        TensorBuffer::new(&qb),
        TensorBuffer::new(&kb),
        TensorBuffer::new(&vb),
        TensorBuffer::new(&ob),
        TensorBuffer::new(&lb),
        TensorBuffer::new(&dob),
        TensorBuffer::new(&dq),
        TensorBuffer::new(&dk),
        TensorBuffer::new(&dv),
    );
    let one = time(&|e| {
        attn.encode_backward(e, problem, &grads, None)
            .unwrap_or_else(|err| panic!("{err}"));
    });
    let ringed = time(&|e| {
        attn.encode_ring_backward(e, problem, &ring, &grads)
            .unwrap_or_else(|err| panic!("{err}"));
    });
    report_times(a, "backward", BackwardProblem::new(problem).flops(), one, ringed);
}

/// The ring and the whole problem the arguments ask for.
fn ring_and_problem(a: &Args) -> (Ring, AttentionProblem) {
    let ring = Ring::new(a.ranks, a.layout).unwrap_or_else(|e| panic!("{e}"));
    let shape = AttentionShape {
        batch: a.batch,
        seq_q: a.seq,
        seq_kv: a.seq,
        num_heads: a.heads,
        num_kv_heads: a.kv_heads.unwrap_or(a.heads),
        head_dim: a.head_dim,
    };
    (ring, AttentionProblem::new(shape, a.dtype).with_causal(a.causal))
}

/// Prints each rank's share of the attended (query, key) pairs, from the schedule alone.
fn report_shares(a: &Args, ring: &Ring) {
    let pairs = |rank: usize| -> u64 {
        (0..a.ranks)
            .flat_map(|step| ring.blocks(rank, step, a.causal))
            .map(|b| {
                let (q, k) = (
                    ring.chunk_rows(a.seq, b.q_chunk).len() as u64,
                    ring.chunk_rows(a.seq, b.kv_chunk).len() as u64,
                );
                match b.mask {
                    wgpu_flash_attn::ring::BlockMask::Full => q * k,
                    wgpu_flash_attn::ring::BlockMask::Causal => q * (q + 1) / 2,
                }
            })
            .sum()
    };
    let shares: Vec<u64> = (0..a.ranks).map(pairs).collect();
    let most = *shares.iter().max().unwrap_or(&1) as f64;
    let mean = shares.iter().sum::<u64>() as f64 / a.ranks as f64;
    println!(
        "ring: {} ranks, {:?}, {} chunks; (query, key) pairs per rank and head {:?}; balance (mean / most) {:.3}",
        a.ranks,
        a.layout,
        ring.chunks(),
        shares,
        mean / most
    );
}

/// Prints the largest difference between `out` and the float64 reference on sampled rows.
fn report_rows<T: Element>(a: &Args, problem: &AttentionProblem, [q, k, v]: [&[T]; 3], out: &[T]) {
    let rows = a.check_rows.min(a.seq);
    let mut worst = 0f64;
    for n in 0..rows {
        // Rows spread over the sequence, heads and batch entries: early and late chunks alike.
        let (i, h, b) = (n * a.seq / rows.max(1), n % a.heads, n % a.batch);
        let want = reference::attention_row(problem, q, k, v, b, h, i).unwrap_or_else(|e| panic!("{e}"));
        for (d, w) in want.out.iter().enumerate() {
            let got = out[problem.o_layout.index(b, i, h, d)].to_f64();
            worst = worst.max((got - w).abs());
        }
    }
    if rows > 0 {
        println!("max |ring − float64| over {rows} sampled rows: {worst:.3e}");
    }
}

/// Prints how far the ring's dQ, dK and dV are from one call's.
fn report_gradients<T: Element>(ring: [&[T]; 3], one: [&[T]; 3]) {
    for ((name, x), y) in ["dQ", "dK", "dV"].into_iter().zip(ring).zip(one) {
        let err = ErrorStats::from_pairs(x.iter().map(|g| g.to_f64()).zip(y.iter().map(|g| g.to_f64())));
        println!("{name}: ring against one call {err}");
    }
}

/// Prints a forward's or backward's time on one call and on the ring.
fn report_times(a: &Args, what: &str, flops: f64, one: f64, ringed: f64) {
    println!(
        "{what}: one call {:.3} ms ({:.4} TFLOP/s); ring of {} logical ranks {:.3} ms ({:.4} TFLOP/s), {:.2}x the one call",
        one * 1e3,
        flops / one / 1e12,
        a.ranks,
        ringed * 1e3,
        flops / ringed / 1e12,
        ringed / one
    );
}

#[cfg(feature = "cuda")]
mod cuda {
    //! The ring on the CUDA engine, timed beside one call with CUDA events.
    use wgpu_flash_attn::cuda::{BackwardDeviceTensors, CudaAttention, CudaBackwardOptions, CudaDevice, DeviceTensors};
    use wgpu_flash_attn::testing::random_tensor;
    use wgpu_flash_attn::testing::timing::cuda_median_ms;
    use wgpu_flash_attn::{BackwardInputs, BackwardProblem, Element, Tensor};

    use super::{report_gradients, report_rows, report_shares, report_times, ring_and_problem, Args};

    pub fn run<T: Element>(a: &Args) {
        let (ring, problem) = ring_and_problem(a);
        let device = CudaDevice::new(0).unwrap_or_else(|e| panic!("no CUDA device: {e}"));
        println!("device: {} (CUDA)", device.name());
        let engine = CudaAttention::new(device.clone());
        report_shares(a, &ring);

        let q: Vec<T> = random_tensor(1, problem.required_len(Tensor::Q));
        let k: Vec<T> = random_tensor(2, problem.required_len(Tensor::K));
        let v: Vec<T> = random_tensor(3, problem.required_len(Tensor::V));
        let out = engine
            .ring_forward(&problem, &ring, &q, &k, &v)
            .unwrap_or_else(|e| panic!("{e}"));
        println!("kernel: {}", out.kernel);
        report_rows(a, &problem, [&q, &k, &v], &out.out);

        let stream = device.stream();
        let bits = |x: &[T]| {
            stream
                .clone_htod(bytemuck::cast_slice::<T, u16>(x))
                .unwrap_or_else(|e| panic!("{e}"))
        };
        let (dq_in, dk_in, dv_in) = (bits(&q), bits(&k), bits(&v));
        let zeros = |n: usize| stream.alloc_zeros::<u16>(n).unwrap_or_else(|e| panic!("{e}"));
        let mut o = zeros(problem.required_len(Tensor::O));
        let mut lse = stream
            .alloc_zeros::<f32>(problem.lse_len())
            .unwrap_or_else(|e| panic!("{e}"));
        let runs = a.runs.max(1);
        let mut forward = |ringed: bool| {
            cuda_median_ms(&device, 2, runs, || {
                let t = DeviceTensors {
                    q: &dq_in,
                    k: &dk_in,
                    v: &dv_in,
                    o: &mut o,
                    lse: Some(&mut lse),
                };
                if ringed {
                    engine.ring_forward_device(&problem, &ring, t).map(|_| ())
                } else {
                    engine.forward_device(&problem, t).map(|_| ())
                }
            })
            .unwrap_or_else(|e| panic!("{e}"))
                / 1e3
        };
        let (one, ringed) = (forward(false), forward(true));
        report_times(a, "forward", problem.flops(), one, ringed);
        if !a.backward {
            return;
        }

        let d_o: Vec<T> = random_tensor(4, problem.required_len(Tensor::O));
        let inputs = BackwardInputs {
            q: &q,
            k: &k,
            v: &v,
            o: &out.out,
            lse: &out.lse,
            d_o: &d_o,
        };
        let options = CudaBackwardOptions::default();
        let ring_grads = engine
            .ring_backward(problem, &ring, &inputs, &options)
            .unwrap_or_else(|e| panic!("{e}"));
        let one_grads = engine
            .backward(problem, &inputs, &options)
            .unwrap_or_else(|e| panic!("{e}"));
        println!("backward kernels: {}", one_grads.config.name());
        report_gradients(
            [&ring_grads.dq, &ring_grads.dk, &ring_grads.dv],
            [&one_grads.dq, &one_grads.dk, &one_grads.dv],
        );
        let d_do = bits(&d_o);
        let (mut dq, mut dk, mut dv) = (
            zeros(problem.required_len(Tensor::Q)),
            zeros(problem.required_len(Tensor::K)),
            zeros(problem.required_len(Tensor::V)),
        );
        let mut backward = |ringed: bool| {
            cuda_median_ms(&device, 2, runs, || {
                let t = BackwardDeviceTensors {
                    q: &dq_in,
                    k: &dk_in,
                    v: &dv_in,
                    o: &o,
                    lse: &lse,
                    d_o: &d_do,
                    dq: &mut dq,
                    dk: &mut dk,
                    dv: &mut dv,
                };
                if ringed {
                    engine.ring_backward_device(problem, &ring, t, &options).map(|_| ())
                } else {
                    engine.backward_device(problem, t, &options).map(|_| ())
                }
            })
            .unwrap_or_else(|e| panic!("{e}"))
                / 1e3
        };
        let (one, ringed) = (backward(false), backward(true));
        report_times(a, "backward", BackwardProblem::new(problem).flops(), one, ringed);
    }
}
