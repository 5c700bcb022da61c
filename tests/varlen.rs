//! Variable-length (packed) batches, forward and backward, against the float64 reference
//! (`reference::attention_indexed`, `attention_backward_indexed`: each sequence attended as a
//! problem of its own): seeded random batches of ragged lengths including 0 and 1, self- and
//! cross-attention, with and without per-sequence key counts, GQA 1/2/4, every dtype, causal and
//! not, packed and strided layouts; outputs poisoned with NaN before the kernels run. Rows past
//! the last sequence stay untouched; a packed batch of equal sequences gives exactly the batched
//! problem's result; offsets outside the tensors on the caller's buffers make exactly that
//! sequence NaN (or leave it unwritten), and on host slices are an error. Every prefill kernel
//! that can run here is checked (the tiled kernel on lavapipe, the cooperative-matrix kernel too
//! on the H200).

mod common;

use common::{below, gpu, shape, storage, submit_and_read};
use wgpu_flash_attn::batch::{BatchIndex, Varlen};
use wgpu_flash_attn::gpu::readback::read_back;
use wgpu_flash_attn::kernel::CoopChoice;
use wgpu_flash_attn::plan::policy::COOP_KERNEL_VERIFIED;
use wgpu_flash_attn::testing::harness::{nan_bytes, tolerance};
use wgpu_flash_attn::testing::{random_tensor, ErrorStats, Rng};
use wgpu_flash_attn::{
    reference, AttentionProblem, BackwardBuffers, BackwardProblem, DType, Element, Error, FlashAttention,
    ForwardBuffers, GpuContext, GradTensor, KernelChoice, Options, Tensor, TensorBuffer, TensorLayout,
};

/// A packed batch, its inputs and its index.
struct Case<T> {
    problem: AttentionProblem,
    q: Vec<T>,
    k: Vec<T>,
    v: Vec<T>,
    cu_q: Vec<u32>,
    cu_k: Vec<u32>,
    kv_lens: Option<Vec<u32>>,
}

/// Offsets of sequences of the given lengths, packed end to end.
fn offsets(lengths: &[usize]) -> Vec<u32> {
    let mut cu = vec![0u32];
    for &n in lengths {
        cu.push(cu.last().copied().unwrap_or(0) + n as u32);
    }
    cu
}

struct Dims {
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

impl<T: Element> Case<T> {
    /// Sequences of `lens_q` query and `lens_k` key rows; `tail` unused rows after the last of
    /// each; K/V rows of each head `row_pad` elements apart beyond the packed stride (0: packed).
    #[allow(clippy::too_many_arguments)]
    fn new(
        seed: u64,
        lens_q: &[usize],
        lens_k: &[usize],
        dims: Dims,
        dtype: DType,
        causal: bool,
        kv_lens: Option<Vec<u32>>,
        tail: usize,
        row_pad: usize,
    ) -> Self {
        let (cu_q, cu_k) = (offsets(lens_q), offsets(lens_k));
        // At least one row each: a packed tensor of no rows is refused like any empty dimension.
        let total_q = (cu_q[lens_q.len()] as usize + tail).max(1);
        let total_kv = (cu_k[lens_k.len()] as usize + tail).max(1);
        let max_q = lens_q.iter().copied().max().unwrap_or(1).max(1);
        let max_k = match &kv_lens {
            Some(l) => l.iter().copied().max().unwrap_or(1).max(1) as usize,
            None => lens_k.iter().copied().max().unwrap_or(1).max(1),
        };
        let mut problem = AttentionProblem::new(
            shape(lens_q.len(), max_q, max_k, dims.heads, dims.kv_heads, dims.head_dim),
            dtype,
        )
        .with_causal(causal)
        .with_kv_lengths(kv_lens.is_some())
        .with_varlen(Varlen { total_q, total_kv });
        if row_pad > 0 {
            for t in [Tensor::K, Tensor::V] {
                let l = *problem.layout(t);
                let seq_stride = l.seq_stride + row_pad;
                problem = problem.with_tensor_layout(t, TensorLayout { seq_stride, ..l });
            }
        }
        let n = |t| problem.required_len(t);
        Case {
            q: random_tensor(seed, n(Tensor::Q)),
            k: random_tensor(seed + 1, n(Tensor::K)),
            v: random_tensor(seed + 2, n(Tensor::V)),
            problem,
            cu_q,
            cu_k,
            kv_lens,
        }
    }

    fn index(&self) -> BatchIndex<'_> {
        BatchIndex {
            cu_seqlens_q: Some(&self.cu_q),
            cu_seqlens_k: Some(&self.cu_k),
            kv_lens: self.kv_lens.as_deref(),
            ..Default::default()
        }
    }

    /// Runs on the caller's buffers with O and the LSE poisoned; returns them.
    fn run(
        &self,
        ctx: &GpuContext,
        engine: &FlashAttention,
        cu_q: &[u32],
        cu_k: &[u32],
    ) -> wgpu_flash_attn::Result<(Vec<T>, Vec<f32>)> {
        let p = &self.problem;
        let storage = |label, bytes: &[u8]| storage(ctx, label, bytes);
        let q = storage("q", bytemuck::cast_slice(&self.q));
        let k = storage("k", bytemuck::cast_slice(&self.k));
        let v = storage("v", bytemuck::cast_slice(&self.v));
        let o = storage("o", &nan_bytes(p.dtype, p.required_len(Tensor::O)));
        let lse = storage("lse", &nan_bytes(DType::F32, p.lse_len()));
        let cu_q = storage("cu_seqlens_q", bytemuck::cast_slice(cu_q));
        let cu_k = storage("cu_seqlens_k", bytemuck::cast_slice(cu_k));
        let lens = self
            .kv_lens
            .as_ref()
            .map(|l| storage("kv_lens", bytemuck::cast_slice(l)));
        let buffers = ForwardBuffers {
            cu_seqlens_q: Some(TensorBuffer::new(&cu_q)),
            cu_seqlens_k: Some(TensorBuffer::new(&cu_k)),
            kv_lens: lens.as_ref().map(TensorBuffer::new),
            ..ForwardBuffers::new(
                TensorBuffer::new(&q),
                TensorBuffer::new(&k),
                TensorBuffer::new(&v),
                TensorBuffer::new(&o),
                Some(TensorBuffer::new(&lse)),
            )
        };
        let mut encoder = ctx.device.create_command_encoder(&Default::default());
        engine.encode_forward(&mut encoder, p, &buffers, None)?;
        submit_and_read(ctx, encoder, &o, &lse)
    }

    /// Element indices of O and the LSE that sequence `b` owns.
    fn rows_of(&self, b: usize) -> (Vec<usize>, Vec<usize>) {
        let p = &self.problem;
        let s = p.shape;
        let seq = self.index().sequence(p, b);
        let mut o = Vec::new();
        let mut l = Vec::new();
        for i in 0..seq.seq_q {
            for h in 0..s.num_heads {
                o.extend((0..s.head_dim).map(|d| p.o_layout.index(0, seq.q_first + i, h, d)));
                l.push(p.lse_index(b, &seq, h, i));
            }
        }
        (o, l)
    }

    /// Checks the sequences' rows against the reference and that nothing else was written.
    fn check(&self, ctx: &GpuContext, engine: &FlashAttention, label: &str) {
        let kernel = engine.select(&self.problem).unwrap_or_else(|e| panic!("{label}: {e}"));
        assert!(kernel.name().contains("_varlen"), "{label}: {}", kernel.name());
        let (out, lse) = self
            .run(ctx, engine, &self.cu_q, &self.cu_k)
            .unwrap_or_else(|e| panic!("{label}: {e}"));
        let want = reference::attention_indexed(&self.problem, &self.q, &self.k, &self.v, &self.index()).unwrap();
        let mut owned_o = vec![false; out.len()];
        let mut owned_l = vec![false; lse.len()];
        let mut pairs_o = Vec::new();
        let mut pairs_l = Vec::new();
        for b in 0..self.problem.shape.batch {
            let (o, l) = self.rows_of(b);
            for i in o {
                owned_o[i] = true;
                pairs_o.push((out[i].to_f64(), want.out[i]));
            }
            for i in l {
                owned_l[i] = true;
                pairs_l.push((lse[i] as f64, want.lse[i]));
            }
        }
        let o = ErrorStats::from_pairs(pairs_o);
        let l = ErrorStats::from_pairs(pairs_l);
        let tol = tolerance(self.problem.dtype);
        let name = kernel.name();
        assert!(o.within(tol.out_rel_l2, tol.out_max_abs), "{label} ({name}): O {o}");
        assert!(l.within(1e-5, tol.lse_max_abs), "{label} ({name}): LSE {l}");
        let untouched_o = out.iter().zip(&owned_o).all(|(x, &owned)| owned || x.to_f64().is_nan());
        let untouched_l = lse.iter().zip(&owned_l).all(|(x, &owned)| owned || x.is_nan());
        assert!(
            untouched_o && untouched_l,
            "{label} ({name}): wrote outside its sequences"
        );
    }
}

/// The prefill kernels that can run packed batches here, each as an engine forcing it: the tiled
/// kernel, and the cooperative-matrix kernel where the device has it (f16 only).
fn engines(ctx: &GpuContext) -> Vec<(&'static str, FlashAttention)> {
    let forced = |choice| {
        FlashAttention::with_options(
            ctx,
            Options {
                choice,
                ..Options::default()
            },
        )
    };
    let mut engines = vec![("tiled", forced(KernelChoice::Tiled(Default::default())))];
    if ctx.caps.cooperative_matrix_f16 && COOP_KERNEL_VERIFIED {
        engines.push(("coop", forced(KernelChoice::CooperativeMatrix(CoopChoice::default()))));
    } else {
        eprintln!("cooperative-matrix kernel not available here: only the tiled kernel is checked");
    }
    engines
}

fn ragged(rng: &mut Rng, batch: usize, max: usize) -> Vec<usize> {
    (0..batch)
        .map(|_| match below(rng, 5) {
            0 => 0,
            1 => 1,
            _ => 1 + below(rng, max),
        })
        .collect()
}

fn random_case<T: Element>(rng: &mut Rng, seed: u64, dtype: DType) -> (Case<T>, String) {
    let batch = 1 + below(rng, 5);
    let lens_q = ragged(rng, batch, 150);
    let self_attention = below(rng, 2) == 0;
    let lens_k = if self_attention {
        lens_q.clone()
    } else {
        ragged(rng, batch, 200)
    };
    let kv_heads = [1, 2, 4][below(rng, 3)];
    let group = [1, 2, 4][below(rng, 3)];
    let head_dim = [32, 64, 80, 128][below(rng, 4)];
    let causal = below(rng, 2) == 0;
    let kv_lens = (below(rng, 3) == 0).then(|| lens_k.iter().map(|&n| below(rng, n + 1) as u32).collect::<Vec<_>>());
    let tail = [0, 0, 5][below(rng, 3)];
    let row_pad = [0, 0, 8][below(rng, 3)];
    let dims = Dims {
        heads: kv_heads * group,
        kv_heads,
        head_dim,
    };
    let label = format!(
        "seed {seed}: q {lens_q:?} k {lens_k:?} lens {kv_lens:?} heads {}/{kv_heads} d{head_dim} {} causal {causal} tail {tail} pad {row_pad}",
        dims.heads,
        dtype.name()
    );
    let case = Case::new(seed, &lens_q, &lens_k, dims, dtype, causal, kv_lens, tail, row_pad);
    (case, label)
}

#[test]
fn packed_batches_match_the_reference() {
    let Some(ctx) = gpu() else { return };
    for (kernel, engine) in engines(ctx) {
        let mut rng = Rng::new(0x7a11e);
        for seed in 0..12u64 {
            let dtype = if kernel == "coop" {
                DType::F16
            } else {
                DType::ALL[seed as usize % 3]
            };
            match dtype {
                DType::F32 => {
                    let (case, label) = random_case::<f32>(&mut rng, seed, dtype);
                    case.check(ctx, &engine, &format!("{kernel} {label}"));
                }
                DType::F16 => {
                    let (case, label) = random_case::<half::f16>(&mut rng, seed, dtype);
                    case.check(ctx, &engine, &format!("{kernel} {label}"));
                }
                DType::BF16 => {
                    let (case, label) = random_case::<half::bf16>(&mut rng, seed, dtype);
                    case.check(ctx, &engine, &format!("{kernel} {label}"));
                }
            }
        }
    }
}

/// Sequences of equal length packed end to end are the batched problem: bit for bit the same
/// outputs, from the same arithmetic.
#[test]
fn equal_sequences_packed_are_the_batched_problem() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let (batch, seq, heads, head_dim) = (3, 70, 4, 64);
    let dense = AttentionProblem::new(shape(batch, seq, seq, heads, 2, head_dim), DType::F32).with_causal(true);
    let n = dense.required_len(Tensor::Q);
    let q: Vec<f32> = random_tensor(11, n);
    let k: Vec<f32> = random_tensor(12, dense.required_len(Tensor::K));
    let v: Vec<f32> = random_tensor(13, dense.required_len(Tensor::V));
    let packed = dense.with_varlen(Varlen {
        total_q: batch * seq,
        total_kv: batch * seq,
    });
    let cu = offsets(&[seq; 3]);
    let index = BatchIndex {
        cu_seqlens_q: Some(&cu),
        cu_seqlens_k: Some(&cu),
        ..Default::default()
    };
    let a = engine.forward_blocking(&dense, &q, &k, &v).unwrap();
    let b = engine.forward_indexed_blocking(&packed, &q, &k, &v, &index).unwrap();
    assert!(b.kernel.contains("_varlen"), "{}", b.kernel);
    assert_eq!(a.out, b.out);
    // [batch, heads, seq] against [heads, total]: the same rows, reordered.
    for bb in 0..batch {
        for h in 0..heads {
            for i in 0..seq {
                assert_eq!(a.lse[(bb * heads + h) * seq + i], b.lse[h * batch * seq + bb * seq + i]);
            }
        }
    }
}

/// Offsets on the caller's buffers are checked by the kernel: keys outside K/V make that
/// sequence NaN, query rows outside Q leave it unwritten; the other sequences are right. On host
/// slices the same offsets are an error before anything runs.
#[test]
fn offsets_outside_the_tensors_never_reach_memory() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let dims = Dims {
        heads: 2,
        kv_heads: 1,
        head_dim: 32,
    };
    let case = Case::<f32>::new(5, &[20, 30, 10], &[20, 30, 10], dims, DType::F32, true, None, 0, 0);
    let reference = reference::attention_indexed(&case.problem, &case.q, &case.k, &case.v, &case.index()).unwrap();
    let o_of = |b| case.rows_of(b).0;

    // Sequence 1's keys end past K: its rows NaN, the others right.
    let bad_k = [0u32, 20, 61, 60];
    let (out, _) = case.run(ctx, &engine, &case.cu_q, &bad_k).unwrap();
    assert!(o_of(1).iter().all(|&i| out[i].is_nan()), "sequence 1 not NaN");
    for b in [0, 2] {
        let got = o_of(b);
        let rows_ok = got.iter().all(|&i| (out[i] as f64 - reference.out[i]).abs() < 1e-4);
        // Sequence 2 reads keys 61..60: a falling range, so it is NaN too.
        assert_eq!(rows_ok, b == 0, "sequence {b}");
    }

    // Sequence 1 has more keys (32) than the problem's seq_kv (30), inside K/V: NaN (and cut to
    // seq_kv, so a tensor sized by it is never read past a row); sequence 0 right, sequence 2
    // (8 keys, not the reference's 10) finite.
    let long_k = [0u32, 20, 52, 60];
    let (out, _) = case.run(ctx, &engine, &case.cu_q, &long_k).unwrap();
    assert!(o_of(1).iter().all(|&i| out[i].is_nan()), "sequence 1 not NaN");
    assert!(o_of(0).iter().all(|&i| (out[i] as f64 - reference.out[i]).abs() < 1e-4));
    assert!(o_of(2).iter().all(|&i| out[i].is_finite()), "sequence 2 not finite");

    // Sequence 1's query rows fall: nothing of it is written (its rows stay poisoned).
    let bad_q = [0u32, 20, 10, 60];
    let (out, _) = case.run(ctx, &engine, &bad_q, &case.cu_k).unwrap();
    assert!(o_of(0).iter().all(|&i| (out[i] as f64 - reference.out[i]).abs() < 1e-4));

    // Host slices: an error naming the tensor, before anything runs.
    for (cu_q, cu_k, tensor) in [
        (&case.cu_q[..], &bad_k[..], "cu_seqlens_k"),
        (&bad_q[..], &case.cu_k[..], "cu_seqlens_q"),
        (&case.cu_q[..2], &case.cu_k[..], "cu_seqlens_q"),
    ] {
        let index = BatchIndex {
            cu_seqlens_q: Some(cu_q),
            cu_seqlens_k: Some(cu_k),
            ..Default::default()
        };
        match engine.forward_indexed_blocking(&case.problem, &case.q, &case.k, &case.v, &index) {
            Err(Error::InvalidBuffer { tensor: t, .. }) => assert_eq!(t, tensor),
            other => panic!("{tensor}: {:?}", other.map(|r| r.kernel)),
        }
    }
    // Without its index a packed problem is refused by name.
    let err = engine
        .forward_blocking(&case.problem, &case.q, &case.k, &case.v)
        .unwrap_err()
        .to_string();
    assert!(err.contains("cu_seqlens_q"), "{err}");
    // The merge reads [batch, num_heads, seq_q] rows: it refuses a packed batch rather than
    // misreading it, on the GPU and in the reference.
    let lse = vec![0.0f32; case.problem.lse_len()];
    let o = &case.q[..case.problem.required_len(Tensor::O)];
    let err = engine
        .merge_blocking(&case.problem, o, &lse, o, &lse)
        .unwrap_err()
        .to_string();
    assert!(err.contains("packed (varlen)"), "{err}");
    assert!(reference::merge_attention_states(&case.problem, o, &lse, o, &lse).is_err());
}

/// The backward pass of packed batches on the caller's buffers, gradients poisoned, against the
/// reference's per-sequence gradients; rows past the last sequence stay untouched.
#[test]
fn packed_backward_matches_the_reference() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let mut rng = Rng::new(0xbac4);
    for seed in 0..6u64 {
        let batch = 1 + below(&mut rng, 4);
        let lens_q = ragged(&mut rng, batch, 90);
        let lens_k = if seed % 2 == 0 {
            lens_q.clone()
        } else {
            ragged(&mut rng, batch, 110)
        };
        let kv_heads = [1, 2][below(&mut rng, 2)];
        let dims = Dims {
            heads: kv_heads * [1, 2][below(&mut rng, 2)],
            kv_heads,
            head_dim: [32, 64][below(&mut rng, 2)],
        };
        let causal = seed % 3 != 0;
        let label = format!("seed {seed}: q {lens_q:?} k {lens_k:?} causal {causal}");
        if seed % 2 == 0 {
            backward_case::<f32>(
                ctx,
                &engine,
                Case::new(seed, &lens_q, &lens_k, dims, DType::F32, causal, None, 3, 0),
                &label,
            );
        } else {
            backward_case::<half::f16>(
                ctx,
                &engine,
                Case::new(seed, &lens_q, &lens_k, dims, DType::F16, causal, None, 3, 0),
                &label,
            );
        }
    }
}

fn backward_case<T: Element>(ctx: &GpuContext, engine: &FlashAttention, case: Case<T>, label: &str) {
    let p = case.problem;
    let index = case.index();
    let fwd = engine
        .forward_indexed_blocking(&p, &case.q, &case.k, &case.v, &index)
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    let bp = BackwardProblem::new(p);
    let d_o: Vec<T> = random_tensor(99, bp.required_len(GradTensor::DO));
    let storage = |label, bytes: &[u8]| storage(ctx, label, bytes);
    let q = storage("q", bytemuck::cast_slice(&case.q));
    let k = storage("k", bytemuck::cast_slice(&case.k));
    let v = storage("v", bytemuck::cast_slice(&case.v));
    let o = storage("o", bytemuck::cast_slice(&fwd.out));
    let lse = storage("lse", bytemuck::cast_slice(&fwd.lse));
    let d_o_buf = storage("d_o", bytemuck::cast_slice(&d_o));
    let poisoned = |t: GradTensor| storage(t.name(), &nan_bytes(p.dtype, bp.required_len(t)));
    let (dq, dk, dv) = (
        poisoned(GradTensor::DQ),
        poisoned(GradTensor::DK),
        poisoned(GradTensor::DV),
    );
    let cu_q = storage("cu_seqlens_q", bytemuck::cast_slice(&case.cu_q));
    let cu_k = storage("cu_seqlens_k", bytemuck::cast_slice(&case.cu_k));
    let buffers = BackwardBuffers {
        q: TensorBuffer::new(&q),
        k: TensorBuffer::new(&k),
        v: TensorBuffer::new(&v),
        o: TensorBuffer::new(&o),
        lse: TensorBuffer::new(&lse),
        d_o: TensorBuffer::new(&d_o_buf),
        dq: TensorBuffer::new(&dq),
        dk: TensorBuffer::new(&dk),
        dv: TensorBuffer::new(&dv),
        delta: None,
        cu_seqlens_q: Some(TensorBuffer::new(&cu_q)),
        cu_seqlens_k: Some(TensorBuffer::new(&cu_k)),
        alibi_slopes: None,
        sinks: None,
        d_sinks: None,
        bias: None,
        mask: None,
        mask_blocks: None,
        d_bias: None,
    };
    let mut encoder = ctx.device.create_command_encoder(&Default::default());
    let config = engine.select_backward(bp).unwrap_or_else(|e| panic!("{label}: {e}"));
    let kernels = config.kernels();
    assert!(
        kernels.iter().all(|k| k.name().contains("_varlen")),
        "{label}: {kernels:?}"
    );
    engine
        .encode_backward_with(&mut encoder, bp, &buffers, &config, None)
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    ctx.queue.submit([encoder.finish()]);
    let bytes = pollster::block_on(read_back(
        &ctx.device,
        &ctx.queue,
        &[(&dq, 0, dq.size()), (&dk, 0, dk.size()), (&dv, 0, dv.size())],
    ))
    .unwrap();
    let want = reference::attention_backward_indexed(&bp, &case.q, &case.k, &case.v, &d_o, &index).unwrap();
    let s = p.shape;
    for (g, got, want) in [
        (GradTensor::DQ, &bytes[0], &want.dq),
        (GradTensor::DK, &bytes[1], &want.dk),
        (GradTensor::DV, &bytes[2], &want.dv),
    ] {
        let got: Vec<T> = bytemuck::pod_collect_to_vec(got);
        let (heads, cu) = match g {
            GradTensor::DQ => (s.num_heads, &case.cu_q),
            _ => (s.num_kv_heads, &case.cu_k),
        };
        let layout = bp.layout(g);
        let covered = cu[s.batch] as usize;
        let mut pairs = Vec::new();
        let mut untouched = true;
        let rows = (got.len() / (s.head_dim * heads)).max(covered);
        for row in 0..rows {
            for h in 0..heads {
                for d in 0..s.head_dim {
                    let i = layout.index(0, row, h, d);
                    if i >= got.len() {
                        continue;
                    }
                    if row < covered {
                        pairs.push((got[i].to_f64(), want[i]));
                    } else {
                        untouched &= got[i].to_f64().is_nan();
                    }
                }
            }
        }
        let stats = ErrorStats::from_pairs(pairs);
        let tol = match p.dtype {
            DType::F32 => (1e-4, 1e-3),
            _ => (2e-2, 5e-2),
        };
        assert!(stats.within(tol.0, tol.1), "{label} {}: {stats}", g.name());
        assert!(untouched, "{label} {}: wrote past the last sequence", g.name());
    }
}
