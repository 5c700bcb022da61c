//! Dropout on the CUDA prefill kernels (cuda/dropout.cuh), forced onto each (`mma.sync`
//! everywhere, wgmma on Hopper): the mask bit for bit against the host's (read from the output
//! through one-hot values), and seeded random problems with every score term against the float64
//! reference, which a kernel with another mask fails. Outputs are poisoned (NaN) before each run.
//! Needs a CUDA GPU: the tests skip without one (fail with `FLASH_REQUIRE_CUDA=1`).
#![cfg(feature = "cuda")]

#[path = "common/batches.rs"]
mod batches;
#[path = "common/cuda.rs"]
mod cuda_common;
#[path = "common/dropout_masks.rs"]
mod dropout_masks;

use batches::{shape, Batch};
use cuda_common::{bits, engine, forced_engine, prefill_plans, Half16};
use dropout_masks::{assert_keep_rate, forward_mask_check};
use half::{bf16, f16};
use wgpu_flash_attn::batch::{Alibi, BatchIndex, BiasLayout, BiasValues, Dropout, ScoreBias};
use wgpu_flash_attn::cuda::cudarc::driver::{CudaSlice, DevicePtr};
use wgpu_flash_attn::cuda::{CudaAttention, DeviceBatchIndex, DeviceBias, DeviceTensors};
use wgpu_flash_attn::testing::{random_tensor, seed_of, ErrorStats, Rng};
use wgpu_flash_attn::{reference, AttentionProblem, DType, Tensor};

fn dropout(p: f32) -> Dropout {
    Dropout {
        p,
        seed: 0x5eed_cafe,
        offset: 3 << 33,
    }
}

/// Engines forced onto each prefill kernel's default plan for `p` (`prefill_plans`).
fn forced_engines(engine: &CudaAttention, p: &AttentionProblem) -> Vec<(&'static str, CudaAttention)> {
    prefill_plans(engine, p)
        .into_iter()
        .map(|(name, plan, blocks)| (name, forced_engine(engine, Some(plan), blocks)))
        .collect()
}

/// One forward on device buffers, O and the LSE poisoned (NaN) first; the index tensors `index`
/// has are uploaded. Returns O, the LSE and the kernel that ran.
fn run<T: Half16>(
    engine: &CudaAttention,
    p: &AttentionProblem,
    (q, k, v): (&[T], &[T], &[T]),
    index: &BatchIndex<'_>,
) -> (Vec<T>, Vec<f32>, String) {
    let stream = engine.device().stream();
    let up = |x: &[u32]| stream.clone_htod(x).unwrap();
    let up_f32 = |x: &[f32]| stream.clone_htod(x).unwrap();
    let (dq, dk, dv) = (
        stream.clone_htod(&bits(q)).unwrap(),
        stream.clone_htod(&bits(k)).unwrap(),
        stream.clone_htod(&bits(v)).unwrap(),
    );
    let mut d_o = stream
        .clone_htod(&vec![T::NAN_BITS; p.required_len(Tensor::O)])
        .unwrap();
    let mut d_lse = stream.clone_htod(&vec![f32::NAN; p.lse_len()]).unwrap();
    let cu_q = index.cu_seqlens_q.map(up);
    let cu_k = index.cu_seqlens_k.map(up);
    let slopes = index.alibi_slopes.map(up_f32);
    let sinks = index.sinks.map(up_f32);
    let (bias32, bias16): (Option<CudaSlice<f32>>, Option<CudaSlice<u16>>) = match index.bias {
        Some(BiasValues::F32(b)) => (Some(up_f32(b)), None),
        Some(BiasValues::F16(b)) => (None, Some(stream.clone_htod(&bits(b)).unwrap())),
        Some(BiasValues::BF16(b)) => (None, Some(stream.clone_htod(&bits(b)).unwrap())),
        None => (None, None),
    };
    let bias = match (index.bias, &bias32, &bias16) {
        (Some(BiasValues::F32(_)), Some(b), _) => Some(DeviceBias::F32(b)),
        (Some(BiasValues::F16(_)), _, Some(b)) => Some(DeviceBias::F16(b)),
        (Some(BiasValues::BF16(_)), _, Some(b)) => Some(DeviceBias::BF16(b)),
        _ => None,
    };
    let device_index = DeviceBatchIndex {
        cu_seqlens_q: cu_q.as_ref().map(|x| x as &dyn DevicePtr<u32>),
        cu_seqlens_k: cu_k.as_ref().map(|x| x as &dyn DevicePtr<u32>),
        alibi_slopes: slopes.as_ref().map(|x| x as &dyn DevicePtr<f32>),
        sinks: sinks.as_ref().map(|x| x as &dyn DevicePtr<f32>),
        bias,
        ..DeviceBatchIndex::default()
    };
    let tensors = DeviceTensors {
        q: &dq,
        k: &dk,
        v: &dv,
        o: &mut d_o,
        lse: Some(&mut d_lse),
    };
    let config = engine
        .forward_indexed_device(p, tensors, device_index)
        .unwrap_or_else(|e| panic!("launch failed: {e}"));
    stream.synchronize().unwrap();
    let o: Vec<u16> = stream.clone_dtoh(&d_o).unwrap();
    let lse: Vec<f32> = stream.clone_dtoh(&d_lse).unwrap();
    (bytemuck::cast_slice::<u16, T>(&o).to_vec(), lse, config.name())
}

/// The kernel's mask, read from its output (`forward_mask_check`); the kernel must be a dropout
/// build. Returns (elements compared, kept).
fn mask_check<T: Half16>(engine: &CudaAttention, batch: &Batch, label: &str) -> (usize, usize) {
    let index = batch.index();
    let (compared, kept, kernel) = forward_mask_check::<T>(label, &batch.problem, &index, |q, k, v| {
        let (o, _, name) = run(engine, &batch.problem, (q, k, v), &index);
        (o, name)
    });
    assert!(kernel.ends_with("_dropout"), "{label}: ran {kernel}");
    (compared, kept)
}

/// Both kernels' masks are the host's, bit for bit, for p = 0.5 and 0.1: batches and heads, GQA,
/// every tile width (head_dim 64, 128, 256 and a padded 96), causal with more queries than keys,
/// a window, packed sequences of different lengths. Over all of it the keep rate is 1 − p within
/// five standard deviations.
#[test]
fn the_cuda_forward_drops_exactly_the_hosts_mask() {
    let Some(engine) = engine() else { return };
    for p in [0.5f32, 0.1] {
        let (mut compared, mut kept) = (0, 0);
        let batches = [
            Batch::dense(AttentionProblem::new(shape(2, 70, 150, 4, 2, 64), DType::BF16)),
            Batch::dense(AttentionProblem::new(shape(1, 130, 100, 2, 2, 128), DType::F16).with_causal(true)),
            Batch::dense(AttentionProblem::new(shape(1, 90, 90, 2, 1, 64), DType::BF16).with_window(Some(20), Some(5))),
            Batch::dense(AttentionProblem::new(shape(1, 40, 300, 2, 2, 256), DType::F16)),
            Batch::dense(AttentionProblem::new(shape(1, 33, 200, 3, 1, 96), DType::BF16).with_causal(true)),
            Batch::packed(&[(37, 80), (1, 5), (90, 64)], 2, 1, 64, DType::F16),
        ];
        for (n, mut batch) in batches.into_iter().enumerate() {
            batch.problem = batch.problem.with_dropout(dropout(p));
            for (name, forced) in forced_engines(engine, &batch.problem) {
                let label = format!("p {p}, problem {n}, {name}");
                let (c, k) = match batch.problem.dtype {
                    DType::BF16 => mask_check::<bf16>(&forced, &batch, &label),
                    _ => mask_check::<f16>(&forced, &batch, &label),
                };
                compared += c;
                kept += k;
            }
        }
        assert_keep_rate(&format!("p {p}"), &dropout(p), compared, kept);
    }
}

/// Seeded random problems with dropout on both kernels against the float64 reference: random
/// shapes (GQA, seq_q ≠ seq_kv, lengths no multiple of a tile), dtypes, head_dims (padded ones
/// too), causal masks, windows, soft-caps, ALiBi, sinks, biases and p. The bound is one a kernel
/// with another mask fails: the reference with another seed is checked to lie far outside it.
#[test]
fn seeded_random_dropout_problems_match_the_reference() {
    let Some(engine) = engine() else { return };
    let mut rng = Rng::new(seed_of("cuda dropout problems"));
    for case in 0..10 {
        let dtype = [DType::BF16, DType::F16][rng.below(2)];
        let head_dim = [64, 96, 128, 256][rng.below(4)];
        let kv_heads = 1 + rng.below(2);
        let heads = kv_heads * (1 + rng.below(3));
        let (seq_q, seq_kv) = (1 + rng.below(200), 1 + rng.below(300));
        let mut p = AttentionProblem::new(shape(1 + rng.below(2), seq_q, seq_kv, heads, kv_heads, head_dim), dtype)
            .with_causal(rng.below(2) == 1)
            .with_dropout(Dropout {
                p: [0.1, 0.3, 0.7][rng.below(3)],
                seed: rng.next_u64(),
                offset: rng.next_u64() >> 8,
            });
        if rng.below(3) == 0 {
            p = p.with_window(Some(rng.below(64)), (!p.causal).then(|| rng.below(64)));
        }
        if rng.below(3) == 0 {
            p = p.with_softcap([4.0, 300.0][rng.below(2)]);
        }
        if rng.below(3) == 0 {
            p.alibi = Some(Alibi::Geometric);
        }
        if rng.below(2) == 0 {
            p = p.with_sinks();
        }
        if rng.below(3) == 0 {
            let layout = BiasLayout::dense(&p, false, true);
            p = p.with_bias(ScoreBias {
                dtype: DType::F16,
                layout,
            });
        }
        let label = format!(
            "case {case}: {:?} {} causal {} window {:?} cap {:?} alibi {} sinks {} bias {} dropout {:?}",
            p.shape,
            dtype.name(),
            p.causal,
            p.window,
            p.softcap,
            p.alibi.is_some(),
            p.sinks,
            p.bias.is_some(),
            p.dropout
        );
        match dtype {
            DType::BF16 => check_random::<bf16>(engine, &p, &label),
            _ => check_random::<f16>(engine, &p, &label),
        }
    }
}

fn check_random<T: Half16>(engine: &CudaAttention, p: &AttentionProblem, label: &str) {
    let seed = seed_of(label);
    let (q, k, v): (Vec<T>, Vec<T>, Vec<T>) = (
        random_tensor(seed, p.required_len(Tensor::Q)),
        random_tensor(seed ^ 1, p.required_len(Tensor::K)),
        random_tensor(seed ^ 2, p.required_len(Tensor::V)),
    );
    let sinks: Vec<f32> = (0..p.shape.num_heads).map(|h| h as f32 * 0.5 - 1.0).collect();
    let bias: Vec<f16> = match p.bias {
        Some(b) => random_tensor(seed ^ 3, b.required_len(p).unwrap()),
        None => Vec::new(),
    };
    let index = BatchIndex {
        sinks: p.sinks.then_some(&sinks[..]),
        bias: p.bias.map(|_| BiasValues::F16(&bias)),
        ..BatchIndex::default()
    };
    let want = reference::attention_indexed(p, &q, &k, &v, &index).unwrap();
    let other_mask = AttentionProblem {
        dropout: p.dropout.map(|d| Dropout { seed: d.seed ^ 1, ..d }),
        ..*p
    };
    let other = reference::attention_indexed(&other_mask, &q, &k, &v, &index).unwrap();
    for (name, forced) in forced_engines(engine, p) {
        let (out, lse, kernel) = run(&forced, p, (&q, &k, &v), &index);
        assert!(kernel.contains("_dropout"), "{label} {name}: ran {kernel}");
        let got: Vec<f64> = out.iter().map(|x| x.to_f64()).collect();
        let o = ErrorStats::from_pairs(got.iter().copied().zip(want.out.iter().copied()));
        let l = ErrorStats::from_pairs(lse.iter().map(|&x| x as f64).zip(want.lse.iter().copied()));
        // bf16/f16 inputs, P rounded to 16 bits for the second product, f32 accumulation.
        assert!(
            o.within(1.5e-2, 6e-2) && l.within(1e-3, 1e-2),
            "{label} {name} ({kernel}): O {o}; LSE {l}"
        );
        let wrong = ErrorStats::from_pairs(got.iter().copied().zip(other.out.iter().copied()));
        assert!(
            wrong.rel_l2 > 0.05,
            "{label} {name}: another mask's output is as close: {wrong}"
        );
    }
}
