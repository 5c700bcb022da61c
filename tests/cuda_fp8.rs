//! FP8 attention on Hopper (`cuda/fp8_quant.cu`, `cuda/flash_fwd_wgmma.cu` with `FA_FP8`) on
//! seeded random problems: the quantizer bit for bit against its host mirror (per-block and
//! per-tensor scales, with and without the Hadamard rotation, strided bf16/f16 inputs, ragged
//! lengths); the FP8 forward, O poisoned with NaN first, against the float64 reference on the
//! dequantized inputs (what the kernel was given: only its own arithmetic and P's e4m3 rounding
//! differ) and on the original ones; the rotation's gain on inputs with outliers; refusals.
//!
//! Needs a Hopper GPU with its driver and NVRTC; without them each GPU test prints why and
//! passes, unless `FLASH_REQUIRE_CUDA=1` makes it fail.
#![cfg(all(feature = "cuda", feature = "internals"))]

#[path = "common/cuda.rs"]
mod cuda_common;

use cuda_common::{bits, engine, forced_engine, Half16};
use half::{bf16, f16};
use wgpu_flash_attn::cuda::plan::fp8::{dequantize_host, fp8_plans, quantize_host, Fp8Layout};
use wgpu_flash_attn::cuda::{CudaAttention, Fp8Quantization};
use wgpu_flash_attn::testing::{outlier_tensor, random_tensor, ErrorStats, Rng};
use wgpu_flash_attn::{reference, AttentionProblem, AttentionShape, DType, Element, Error, Layout, Tensor};

fn hopper() -> Option<&'static CudaAttention> {
    let e = engine()?;
    if !e.device().is_hopper() {
        eprintln!("skipping FP8 tests: {} is not a Hopper GPU", e.device().name());
        return None;
    }
    Some(e)
}

/// A random problem: ragged lengths, GQA, head_dim a multiple of 8 up to 256, causal or a window
/// at times, BSHD or BHSD.
fn random_problem(rng: &mut Rng, dtype: DType) -> AttentionProblem {
    let pick = |rng: &mut Rng, xs: &[usize]| xs[(rng.next_u64() % xs.len() as u64) as usize];
    let kv_heads = pick(rng, &[1, 2]);
    let shape = AttentionShape {
        batch: pick(rng, &[1, 2]),
        seq_q: 1 + (rng.next_u64() % 300) as usize,
        seq_kv: 1 + (rng.next_u64() % 400) as usize,
        num_heads: kv_heads * pick(rng, &[1, 2, 4]),
        num_kv_heads: kv_heads,
        head_dim: pick(rng, &[64, 96, 128, 192, 256]),
    };
    let order = if rng.next_u64().is_multiple_of(2) {
        Layout::Bshd
    } else {
        Layout::Bhsd
    };
    let mut p = AttentionProblem::new(shape, dtype).with_layout(order);
    match rng.next_u64() % 4 {
        0 => p = p.with_causal(true),
        1 => {
            p = p.with_window(
                Some(1 + (rng.next_u64() % 100) as usize),
                Some((rng.next_u64() % 50) as usize),
            )
        }
        _ => {}
    }
    p
}

fn quantizations(i: u64) -> Fp8Quantization {
    match i % 4 {
        0 => Fp8Quantization::per_block(),
        1 => Fp8Quantization::per_tensor(),
        2 => Fp8Quantization::per_block().with_hadamard(0x1234_5678 ^ i as u32),
        _ => Fp8Quantization::per_tensor().with_hadamard(99),
    }
}

struct Run<T> {
    q: Vec<T>,
    k: Vec<T>,
    v: Vec<T>,
    out: Vec<T>,
    lse: Vec<f32>,
    host: [wgpu_flash_attn::cuda::plan::fp8::QuantizedHost; 3],
}

/// Quantizes on the device and runs the FP8 forward with `plan` (O and the LSE poisoned first).
fn run<T: Half16>(
    e: &CudaAttention,
    p: &AttentionProblem,
    seed: u64,
    quant: Fp8Quantization,
    plan: Option<wgpu_flash_attn::cuda::Fp8Plan>,
    inputs: Option<[Vec<T>; 3]>,
) -> Run<T> {
    let [q, k, v] = inputs.unwrap_or_else(|| {
        [
            random_tensor::<T>(seed, p.required_len(Tensor::Q)),
            random_tensor::<T>(seed ^ 0x5555, p.required_len(Tensor::K)),
            random_tensor::<T>(seed ^ 0xaaaa, p.required_len(Tensor::V)),
        ]
    });
    let s = e.device().stream();
    let (dq, dk, dv) = (
        s.clone_htod(&bits(&q)).unwrap(),
        s.clone_htod(&bits(&k)).unwrap(),
        s.clone_htod(&bits(&v)).unwrap(),
    );
    let x = e.quantize_fp8(p, &dq, &dk, &dv, quant).unwrap();
    let mut o = s.clone_htod(&vec![T::NAN_BITS; p.required_len(Tensor::O)]).unwrap();
    let mut lse = s.clone_htod(&vec![f32::NAN; p.lse_len()]).unwrap();
    e.forward_fp8_device(p, &x, &mut o, Some(&mut lse), plan).unwrap();
    let out: Vec<u16> = s.clone_dtoh(&o).unwrap();
    Run {
        host: x.to_host(e).unwrap(),
        out: bytemuck::cast_slice::<u16, T>(&out).to_vec(),
        lse: s.clone_dtoh(&lse).unwrap(),
        q,
        k,
        v,
    }
}

/// The float64 reference over what the kernel was given: the dequantized (and, rotated, still
/// rotated) tensors, every row dim_pad wide (V zero-padded), BSHD.
fn reference_on_quantized(
    p: &AttentionProblem,
    host: &[wgpu_flash_attn::cuda::plan::fp8::QuantizedHost; 3],
) -> reference::ReferenceOutput {
    let l = Fp8Layout::of(p).unwrap();
    let q = dequantize_host(p, Tensor::Q, &host[0]).unwrap();
    let k = dequantize_host(p, Tensor::K, &host[1]).unwrap();
    let v_narrow = dequantize_host(p, Tensor::V, &host[2]).unwrap();
    let mut v = vec![0f32; v_narrow.len() / l.head_dim * l.dim_pad];
    for (r, row) in v_narrow.chunks(l.head_dim).enumerate() {
        v[r * l.dim_pad..r * l.dim_pad + l.head_dim].copy_from_slice(row);
    }
    let mut r = *p;
    r.shape.head_dim = l.dim_pad;
    r.dtype = DType::F32;
    let r = r.with_layout(Layout::Bshd).with_scale(p.softmax_scale());
    reference::attention(&r, &q, &k, &v).unwrap()
}

/// Every (got, want) pair of O: got at the problem's O layout, want from `want_at(b, row, h, c)`.
fn o_pairs(p: &AttentionProblem, out: &[f64], want_at: impl Fn(usize, usize, usize, usize) -> f64) -> Vec<(f64, f64)> {
    let s = &p.shape;
    let mut v = Vec::new();
    for b in 0..s.batch {
        for i in 0..s.seq_q {
            for h in 0..s.num_heads {
                for c in 0..s.head_dim {
                    v.push((out[p.o_layout.index(b, i, h, c)], want_at(b, i, h, c)));
                }
            }
        }
    }
    v
}

/// One case of the quantizer test: the device's bytes and scales against the host mirror's.
fn check_quantizer<T: Half16>(e: &CudaAttention, p: &AttentionProblem, seed: u64, quant: Fp8Quantization) {
    let r = run::<T>(e, p, seed, quant, None, None);
    for (t, x, got) in [
        (Tensor::Q, &r.q, &r.host[0]),
        (Tensor::K, &r.k, &r.host[1]),
        (Tensor::V, &r.v, &r.host[2]),
    ] {
        let want = quantize_host(p, t, x, quant).unwrap();
        assert_eq!(got.scales, want.scales, "case {seed} {t:?} scales ({p:?}, {quant:?})");
        let diff = got.bytes.iter().zip(&want.bytes).filter(|(a, b)| a != b).count();
        assert_eq!(
            diff,
            0,
            "case {seed} {t:?}: {diff} of {} bytes differ ({p:?}, {quant:?})",
            want.bytes.len()
        );
    }
}

#[test]
fn fp8_quantizer_matches_its_host_mirror_bit_for_bit() {
    let Some(e) = hopper() else { return };
    let mut rng = Rng::new(0xf8f8);
    for i in 0..12u64 {
        let quant = quantizations(i);
        if i % 2 == 0 {
            check_quantizer::<bf16>(e, &random_problem(&mut rng, DType::BF16), i, quant);
        } else {
            check_quantizer::<f16>(e, &random_problem(&mut rng, DType::F16), i, quant);
        }
    }
}

fn to_f64<T: Element>(x: &[T]) -> Vec<f64> {
    x.iter().map(|v| v.to_f64()).collect()
}

#[test]
fn fp8_forward_matches_the_reference_on_its_inputs_and_the_originals() {
    let Some(e) = hopper() else { return };
    let mut rng = Rng::new(0xa77e);
    for i in 0..16u64 {
        let dtype = if i % 2 == 0 { DType::BF16 } else { DType::F16 };
        let p = random_problem(&mut rng, dtype);
        let quant = quantizations(i);
        let plans = fp8_plans(p.shape.head_dim);
        let plan = plans[(i as usize) % plans.len()];
        let (out, lse, host, original) = if dtype == DType::BF16 {
            let r = run::<bf16>(e, &p, 100 + i, quant, Some(plan), None);
            let orig = reference::attention(&p, &r.q, &r.k, &r.v).unwrap();
            (to_f64(&r.out), r.lse, r.host, orig)
        } else {
            let r = run::<f16>(e, &p, 100 + i, quant, Some(plan), None);
            let orig = reference::attention(&p, &r.q, &r.k, &r.v).unwrap();
            (to_f64(&r.out), r.lse, r.host, orig)
        };
        let l = Fp8Layout::of(&p).unwrap();
        let own = reference_on_quantized(&p, &host);
        // The quantized inputs' reference is BSHD with dim_pad columns; the originals' is at the
        // problem's own O layout.
        let own_at = |b, i, h, c| own.out[((b * p.shape.seq_q + i) * p.shape.num_heads + h) * l.dim_pad + c];
        let vs_own = ErrorStats::from_pairs(o_pairs(&p, &out, own_at));
        let lse_own = ErrorStats::from_pairs(lse.iter().zip(&own.lse).map(|(&g, &w)| (g as f64, w)));
        let vs_orig = ErrorStats::from_pairs(o_pairs(&p, &out, |b, i, h, c| {
            original.out[p.o_layout.index(b, i, h, c)]
        }));
        eprintln!(
            "case {i} {:?} causal {} window {:?} {quant:?} {plan:?}: vs its inputs {vs_own}; LSE {lse_own}; \
             vs the originals {vs_orig}",
            p.shape, p.causal, p.window
        );
        // P in e4m3 has 3 mantissa bits (rounding error up to 2^-4 a probability); a wrong
        // scale, layout or key order is off by far more. The LSE comes from the f32 P.
        assert!(vs_own.within(0.06, 0.2), "case {i}: O against its inputs: {vs_own}");
        assert!(
            lse_own.within(1e-4, 2e-3),
            "case {i}: LSE against its inputs: {lse_own}"
        );
        assert!(
            vs_orig.within(0.12, 0.5),
            "case {i}: O against the original inputs: {vs_orig}"
        );
    }
}

/// Every plan (at head_dim 64, 128 and 256) on keys whose 128-key blocks differ in magnitude by
/// batch, K/V head and block, so that each block's K and V scales do (V's up to 30-fold, K's
/// 4-fold, mild enough that every block keeps a share of the probabilities, and the larger V
/// block first in some tiles, second in others): a 256-key tile holds two scale blocks, and with
/// 600 keys (quantized to 640) the last tile runs past the quantized keys. Each run against the
/// float64 reference on its inputs (O and the LSE), and against the same reference with two
/// blocks' scales swapped, which must fall outside the bound: what a tile that took a
/// neighbour's scales would give. Persistent plans run on 3 blocks, each taking several work
/// tiles in turn.
#[test]
fn every_plan_takes_each_key_blocks_own_scales() {
    let Some(base) = hopper() else { return };
    let three_blocks = forced_engine(base, None, Some(3));
    let k_magnitudes = [1.0, 2.0, 0.5, 1.5, 0.7];
    let v_magnitudes = [6.0, 0.2, 3.0, 0.5, 1.0];
    for head_dim in [64, 128, 256] {
        for (i, plan) in fp8_plans(head_dim).into_iter().enumerate() {
            let e = if plan.persistent { &three_blocks } else { base };
            let shape = AttentionShape {
                batch: 2,
                seq_q: 200,
                seq_kv: 600,
                num_heads: 4,
                num_kv_heads: 2,
                head_dim,
            };
            let mut p = AttentionProblem::new(shape, DType::BF16);
            match i % 3 {
                1 => p = p.with_causal(true),
                2 => p = p.with_window(Some(300), Some(40)),
                _ => {}
            }
            let blocky = |seed: u64, tensor: Tensor, magnitudes: &[f64; 5]| {
                let layout = p.layout(tensor);
                let mut x = random_tensor::<bf16>(seed, p.required_len(tensor));
                for b in 0..shape.batch {
                    for key in 0..shape.seq_kv {
                        for h in 0..shape.num_kv_heads {
                            let m = magnitudes[(key / 128 + h + 2 * b) % magnitudes.len()];
                            for c in 0..head_dim {
                                let at = layout.index(b, key, h, c);
                                x[at] = bf16::from_f64(x[at].to_f64() * m);
                            }
                        }
                    }
                }
                x
            };
            let q = random_tensor::<bf16>(3 + i as u64, p.required_len(Tensor::Q));
            let k = blocky(5 + i as u64, Tensor::K, &k_magnitudes);
            let v = blocky(7 + i as u64, Tensor::V, &v_magnitudes);
            let r = run::<bf16>(e, &p, 0, Fp8Quantization::per_block(), Some(plan), Some([q, k, v]));
            let out = to_f64(&r.out);
            let l = Fp8Layout::of(&p).unwrap();
            let versus = |host: &[wgpu_flash_attn::cuda::plan::fp8::QuantizedHost; 3]| {
                let want = reference_on_quantized(&p, host);
                let at = |b, i, h, c| want.out[((b * shape.seq_q + i) * shape.num_heads + h) * l.dim_pad + c];
                let lse = ErrorStats::from_pairs(r.lse.iter().zip(&want.lse).map(|(&g, &w)| (g as f64, w)));
                (ErrorStats::from_pairs(o_pairs(&p, &out, at)), lse)
            };
            let (own, lse) = versus(&r.host);
            // Blocks 0 and 1 of every K/V head trade their scales.
            let mut swapped = r.host.clone();
            for t in &mut swapped[1..] {
                for head in t.scales.chunks_mut(l.kv_blocks()) {
                    head.swap(0, 1);
                }
            }
            let (wrong, _) = versus(&swapped);
            let case = format!("head_dim {head_dim} {plan:?} causal {} window {:?}", p.causal, p.window);
            eprintln!("{case}: {own}; LSE {lse}; scales swapped: {wrong}");
            // The random test's bounds, O's absolute part widened by V's largest magnitude (O's
            // values, and P's e4m3 rounding of them, grow with V's).
            let within = |x: &ErrorStats| x.within(0.06, 0.2 * v_magnitudes.iter().cloned().fold(0.0, f64::max));
            assert!(within(&own), "{case}: O against its inputs: {own}");
            // The LSE's absolute part widened by K's largest magnitude: the scores, and the FP8
            // tensor cores' rounding of their sums, grow with K's.
            let k_max = k_magnitudes.iter().cloned().fold(0.0, f64::max);
            assert!(lse.within(1e-4, 2e-3 * k_max), "{case}: LSE against its inputs: {lse}");
            assert!(
                !within(&wrong),
                "{case}: the bound cannot tell a neighbour's scales: {wrong}"
            );
        }
    }
}

/// Q and K from N(0, 1) with 0.1% of their entries `magnitude` times larger (FlashAttention-3's
/// accuracy experiment), V plain.
fn outlier_inputs<T: Element>(p: &AttentionProblem, seed: u64, magnitude: f64) -> [Vec<T>; 3] {
    [
        outlier_tensor(seed, p.required_len(Tensor::Q), 1e-3, magnitude),
        outlier_tensor(seed ^ 1, p.required_len(Tensor::K), 1e-3, magnitude),
        random_tensor(seed ^ 7, p.required_len(Tensor::V)),
    ]
}

#[test]
fn the_hadamard_rotation_lowers_the_error_on_inputs_with_outliers() {
    let Some(e) = hopper() else { return };
    // Outliers 10 times the rest: where the H200's accuracy experiment (BENCHMARKS.md) saw the
    // rotation's largest gain (1.7x against per-block scales alone); from 100 times on it gains
    // nothing, the outliers' own scores dominate.
    let p = AttentionProblem::mha(1, 512, 4, 128, DType::BF16);
    let inputs = outlier_inputs::<bf16>(&p, 5, 10.0);
    let want = reference::attention(&p, &inputs[0], &inputs[1], &inputs[2]).unwrap();
    let rmse = |quant| {
        let r = run::<bf16>(e, &p, 0, quant, None, Some(inputs.clone()));
        let n = want.out.len() as f64;
        (r.out
            .iter()
            .zip(&want.out)
            .map(|(g, w)| (g.to_f64() - w).powi(2))
            .sum::<f64>()
            / n)
            .sqrt()
    };
    let plain = rmse(Fp8Quantization::per_block());
    let rotated = rmse(Fp8Quantization::per_block().with_hadamard(3));
    let per_tensor = rmse(Fp8Quantization::per_tensor());
    eprintln!(
        "RMSE with outliers: per-tensor {per_tensor:.3e}, per-block {plain:.3e}, per-block + Hadamard {rotated:.3e}"
    );
    assert!(
        rotated < 0.8 * plain,
        "the rotation did not help: {rotated:.3e} vs {plain:.3e}"
    );
    assert!(
        rotated < 0.8 * per_tensor,
        "{rotated:.3e} vs per-tensor {per_tensor:.3e}"
    );
}

#[test]
fn fp8_refusals_name_the_reason() {
    let p = AttentionProblem::mha(1, 64, 2, 128, DType::BF16);
    let check = |p: AttentionProblem, want: &str| {
        let e = wgpu_flash_attn::cuda::plan::validate_for_fp8(&p).unwrap_err();
        assert!(e.to_string().contains(want), "{e}");
    };
    check(p.with_softcap(30.0), "FP8");
    check(p.with_geometric_alibi(), "FP8");
    let mut f32p = p;
    f32p.dtype = DType::F32;
    assert!(matches!(
        wgpu_flash_attn::cuda::plan::validate_for_fp8(&f32p),
        Err(Error::Unavailable { .. })
    ));
    let mut odd = p;
    odd.shape.head_dim = 100;
    check(odd.with_layout(Layout::Bshd), "head_dim 100");
    // Tensors quantized for one problem are refused for another.
    let Some(e) = hopper() else { return };
    let s = e.device().stream();
    let x = random_tensor::<bf16>(1, p.required_len(Tensor::Q));
    let d = s.clone_htod(&bits(&x)).unwrap();
    let t = e.quantize_fp8(&p, &d, &d, &d, Fp8Quantization::per_block()).unwrap();
    let other = p.with_causal(true);
    let longer = AttentionProblem::mha(1, 128, 2, 128, DType::BF16);
    let mut o = s.alloc_zeros::<u16>(longer.required_len(Tensor::O)).unwrap();
    assert!(e.forward_fp8_device(&longer, &t, &mut o, None, None).is_err());
    // Same shapes, causal: the layout matches, so it runs.
    e.forward_fp8_device(&other, &t, &mut o, None, None).unwrap();
}

/// Every FP8 config (each plan at head_dim 64, 128 and 256, causal or not, bf16 and f16 out) and
/// the quantizer compile for sm_90a without spills. Needs NVRTC, not a GPU.
#[test]
fn fp8_kernels_compile_with_nvrtc_without_spills() {
    use wgpu_flash_attn::cuda::nvrtc::{compile_cubin, resource_report, CompileJob};
    use wgpu_flash_attn::cuda::Fp8Config;
    if !cuda_common::nvrtc_present() {
        return;
    }
    let mut jobs = vec![CompileJob::fp8_quantize("sm_90a")];
    for head_dim in [64, 128, 256] {
        for plan in fp8_plans(head_dim) {
            for causal in [false, true] {
                for out in [DType::BF16, DType::F16] {
                    jobs.push(CompileJob::fp8_forward(
                        &Fp8Config::new(out, head_dim, plan, causal).unwrap(),
                        "sm_90a",
                    ));
                }
            }
        }
    }
    let mut unreported = 0;
    for job in &jobs {
        let (cubin, log) = compile_cubin(job).unwrap_or_else(|e| panic!("{}: {e}", job.kernel));
        assert!(!cubin.is_empty());
        let report = resource_report(&log);
        eprintln!("{}: {report}", job.kernel);
        // One "N bytes stack frame, S bytes spill stores, ..." line per entry point: all S zero.
        // NVRTC 13 may hand back a program it compiled before (in an earlier process) without
        // ptxas's report; such a job is counted, not checked.
        let spills: Vec<&str> = report.split("; ").filter(|l| l.contains("spill stores")).collect();
        if spills.is_empty() {
            unreported += 1;
            continue;
        }
        assert!(
            spills.iter().all(|l| l.contains(" 0 bytes spill stores")),
            "{}: {report}",
            job.kernel
        );
    }
    eprintln!("{} jobs, {unreported} without a ptxas report", jobs.len());
}
