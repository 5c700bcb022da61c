//! Edge semantics (README, "Edge semantics") on every FMA-unit kernel the test device runs — the
//! tiled kernel's four variants, the naive baseline, the decode kernel, the backward — against
//! the float64 reference, outputs poisoned with NaN before each run:
//! * f16 data whose products leave f16's range (|q|, |k| ≈ 300: one product is 90,000 > 65,504);
//! * NaN and ±∞ in K and V at keys a row does not see (causal mask, window, past the keys of a
//!   row that sees none, a mask tensor): they must not reach that row through 0·∞ in P·V;
//! * soft-caps at both ends of the valid range (1e-38 … 2e38), where `cap·tanh(x / cap)` must
//!   give the reference's ≈ x for a cap far above every score.
//!
//! The cooperative-matrix kernel's versions run on the H200 (tests/hardening.rs, this file's
//! `cooperative_*`), the CUDA kernels' in tests/cuda_attention.rs.

mod common;

use common::{coop_engines, engine_with, gpu, seed_of, shape};
use half::f16;
use wgpu_flash_attn::batch::{AttentionMask, BatchIndex};
use wgpu_flash_attn::kernel::{BackwardChoice, DecodeChoice, TiledChoice, Variant};
use wgpu_flash_attn::plan::select_backward;
use wgpu_flash_attn::testing::backward_harness::BackwardWorkload;
use wgpu_flash_attn::testing::harness::{tolerance, Kernel, Workload};
use wgpu_flash_attn::testing::random_tensor;
use wgpu_flash_attn::{
    reference, AttentionProblem, BackwardProblem, DType, Element, FlashAttention, GpuContext, KernelChoice, Tensor,
};

/// The tiled variants the device runs for `dtype` (f16 tiles exist for f16 storage only), each as
/// a forced engine with its name.
fn tiled_engines(ctx: &GpuContext, dtype: DType) -> Vec<(String, FlashAttention)> {
    let probe = AttentionProblem::mha(1, 8, 1, 64, dtype);
    Variant::ALL
        .into_iter()
        .map(|v| {
            let choice = KernelChoice::Tiled(TiledChoice {
                variant: Some(v),
                plan: None,
            });
            (v.name().to_string(), engine_with(ctx, choice))
        })
        .filter(|(_, e)| e.select(&probe).is_ok())
        .collect()
}

/// The decode kernel in one piece and in several (the pieces merged by decode_combine.wgsl).
fn decode_engines(ctx: &GpuContext) -> Vec<(String, FlashAttention)> {
    [Some(1), Some(4)]
        .into_iter()
        .map(|splits| {
            let choice = KernelChoice::Decode(DecodeChoice {
                splits,
                ..DecodeChoice::default()
            });
            (format!("decode splits {splits:?}"), engine_with(ctx, choice))
        })
        .collect()
}

/// f16 inputs with |q|, |k| around 300 (one product up to ~1.4e6, past f16's 65,504) and a scale
/// that brings the scores back to about ±1, so that the softmax is not one-hot and a wrong score
/// shows in O. Also the literal q = k = 300 (every score 1: O is the mean of the visible V rows).
#[test]
fn f16_products_past_f16s_range_match_the_reference() {
    let Some(ctx) = gpu() else { return };
    let cases = [
        (shape(1, 40, 40, 2, 2, 64), true),
        (shape(2, 70, 130, 4, 2, 128), false),
        (shape(1, 3, 200, 8, 2, 64), true), // decode-shaped
    ];
    let mut engines = tiled_engines(ctx, DType::F16);
    assert!(
        engines.iter().any(|(n, _)| n.ends_with("f16")) || !ctx.caps.shader_f16,
        "a device with shader-f16 runs f16 tiles"
    );
    engines.extend(decode_engines(ctx));
    for (s, causal) in cases {
        for constant in [false, true] {
            let d = s.head_dim as f32;
            let scale = if constant {
                1.0 / (90_000.0 * d)
            } else {
                1.0 / (90_000.0 * d.sqrt())
            };
            let p = AttentionProblem::new(s, DType::F16)
                .with_causal(causal)
                .with_scale(scale);
            let label = format!("{s:?} causal {causal} constant {constant}");
            let big = |seed: u64, t: Tensor| -> Vec<f16> {
                if constant {
                    vec![f16::from_f32(300.0); p.required_len(t)]
                } else {
                    random_tensor::<f32>(seed, p.required_len(t))
                        .into_iter()
                        .map(|x| f16::from_f32(300.0 * x))
                        .collect()
                }
            };
            let q = big(seed_of(&label), Tensor::Q);
            let k = big(seed_of(&label) ^ 1, Tensor::K);
            let v = random_tensor::<f16>(seed_of(&label) ^ 2, p.required_len(Tensor::V));
            let work = Workload::with_inputs(ctx, &p, q, k, v).unwrap();
            for (name, engine) in &engines {
                if name.starts_with("decode") && s.seq_q > 16 {
                    continue;
                }
                let (out, lse) = work
                    .run(engine, Kernel::Flash)
                    .unwrap_or_else(|e| panic!("{label} {name}: {e}"));
                let check = work.check_all(&out, &lse).unwrap();
                assert!(check.passes(DType::F16), "{label} {name}: {check}");
            }
            if !causal || s.seq_q <= s.seq_kv {
                let (out, lse) = work.run(&engines[0].1, Kernel::Naive).unwrap();
                let check = work.check_all(&out, &lse).unwrap();
                assert!(check.passes(DType::F16), "{label} naive: {check}");
            }
        }
    }
}

/// Where NaN and ±∞ are planted in a case: (key, K/V head, in K, value).
type Plant = (usize, usize, bool, f32);

/// Problems with keys some rows do not see, and values planted at those keys.
fn hidden_key_cases() -> Vec<(&'static str, AttentionProblem, Vec<Plant>)> {
    let inf = f32::INFINITY;
    let nan = f32::NAN;
    vec![
        // Row i sees keys ≤ i: rows below 36 see none of the planted keys, which lie in the tile
        // that crosses their diagonal.
        (
            "causal",
            AttentionProblem::new(shape(1, 40, 40, 2, 2, 64), DType::F32).with_causal(true),
            vec![
                (39, 0, false, inf),
                (37, 0, false, nan),
                (38, 1, false, -inf),
                (36, 1, true, nan),
                (38, 0, true, inf),
            ],
        ),
        // Rows 0–29 see no key at all (causal, 50 rows on 20 keys); only row 49 sees key 19.
        (
            "rows_that_see_nothing",
            AttentionProblem::new(shape(1, 50, 20, 2, 1, 32), DType::F32).with_causal(true),
            vec![(19, 0, false, inf), (19, 0, true, nan)],
        ),
        // Row i sees keys ≥ i − 8: rows from 12 on see none of keys 0–3.
        (
            "window",
            AttentionProblem::new(shape(1, 40, 40, 2, 1, 64), DType::F32).with_window(Some(8), None),
            vec![
                (0, 0, false, inf),
                (1, 0, false, nan),
                (2, 0, true, nan),
                (3, 0, true, -inf),
            ],
        ),
        // Decode-shaped, causal: row i sees keys ≤ 47 + i, so rows 0 and 1 do not see key 49.
        (
            "decode_causal",
            AttentionProblem::new(shape(1, 3, 50, 4, 1, 64), DType::F32).with_causal(true),
            vec![(49, 0, false, inf), (48, 0, false, nan), (49, 0, true, nan)],
        ),
        // Decode-shaped with a window: rows see keys [i + 37, i + 47]; key 38 only from row 1 on.
        (
            "decode_window",
            AttentionProblem::new(shape(2, 3, 50, 4, 2, 64), DType::F32)
                .with_causal(true)
                .with_window(Some(10), None),
            vec![(37, 1, false, -inf), (38, 0, false, nan), (38, 1, true, inf)],
        ),
    ]
}

/// Inputs for `p` with `plants` written into K and V (every element of the key's row).
fn planted<T: Element>(p: &AttentionProblem, plants: &[Plant], seed: u64) -> (Vec<T>, Vec<T>, Vec<T>) {
    let q = random_tensor::<T>(seed, p.required_len(Tensor::Q));
    let mut k = random_tensor::<T>(seed ^ 1, p.required_len(Tensor::K));
    let mut v = random_tensor::<T>(seed ^ 2, p.required_len(Tensor::V));
    for b in 0..p.shape.batch {
        for &(key, kv_head, in_k, x) in plants {
            let (t, layout) = if in_k {
                (&mut k, &p.k_layout)
            } else {
                (&mut v, &p.v_layout)
            };
            for d in 0..p.shape.head_dim {
                t[layout.index(b, key, kv_head, d)] = T::from_f64(x as f64);
            }
        }
    }
    (q, k, v)
}

/// Checks the rows whose reference is finite (those that see no planted value) element by
/// element, within the dtype's bound on O (a NaN, an ∞ or a 0 where the reference has a random
/// value fails); returns how many rows it checked.
fn check_unplanted_rows<T: Element>(
    p: &AttentionProblem,
    want: &reference::ReferenceOutput,
    out: &[T],
    lse: &[f32],
    label: &str,
) -> usize {
    let s = p.shape;
    let tol = tolerance(p.dtype).out_max_abs;
    let mut checked = 0;
    for b in 0..s.batch {
        for h in 0..s.num_heads {
            for i in 0..s.seq_q {
                let row: Vec<usize> = (0..s.head_dim).map(|d| p.o_layout.index(b, i, h, d)).collect();
                let l = (b * s.num_heads + h) * s.seq_q + i;
                if row.iter().any(|&at| !want.out[at].is_finite()) || want.lse[l].is_nan() {
                    continue;
                }
                checked += 1;
                for &at in &row {
                    let (g, w) = (out[at].to_f64(), want.out[at]);
                    assert!(
                        (g - w).abs() <= tol,
                        "{label}: row (b {b}, h {h}, i {i}) O = {g}, want {w}"
                    );
                }
                let (g, w) = (lse[l] as f64, want.lse[l]);
                let lse_ok = if w == f64::NEG_INFINITY {
                    g == w
                } else {
                    (g - w).abs() <= 1e-2
                };
                assert!(lse_ok, "{label}: row (b {b}, h {h}, i {i}) LSE = {g}, want {w}");
            }
        }
    }
    checked
}

fn hidden_case<T: Element>(
    ctx: &GpuContext,
    engines: &[(String, FlashAttention)],
    name: &str,
    p: &AttentionProblem,
    plants: &[Plant],
) {
    let (q, k, v) = planted::<T>(p, plants, seed_of(name));
    let want = reference::attention(p, &q, &k, &v).unwrap();
    let work = Workload::with_inputs(ctx, p, q, k, v).unwrap();
    let mut runs: Vec<(String, Kernel, &FlashAttention)> = Vec::new();
    for (engine_name, engine) in engines {
        if engine_name.starts_with("decode") && p.shape.seq_q > 16 {
            continue;
        }
        runs.push((engine_name.clone(), Kernel::Flash, engine));
    }
    if p.window.is_none() {
        runs.push(("naive".into(), Kernel::Naive, &engines[0].1));
    }
    for (engine_name, kernel, engine) in runs {
        let label = format!("{name} {:?} {engine_name}", p.dtype);
        let (out, lse) = work.run(engine, kernel).unwrap_or_else(|e| panic!("{label}: {e}"));
        let checked = check_unplanted_rows(p, &want, &out, &lse, &label);
        assert!(
            checked >= p.shape.num_heads,
            "{label}: only {checked} rows do not see a planted key"
        );
    }
}

/// NaN and ±∞ in K and V at keys a row does not see leave that row as the reference has it,
/// rows that see no key at all included (O = 0, LSE −∞).
#[test]
fn nan_and_inf_at_hidden_keys_do_not_reach_the_rows_that_do_not_see_them() {
    let Some(ctx) = gpu() else { return };
    for dtype in [DType::F32, DType::F16] {
        let mut engines = tiled_engines(ctx, dtype);
        engines.extend(decode_engines(ctx));
        for (name, p, plants) in hidden_key_cases() {
            let p = AttentionProblem { dtype, ..p };
            match dtype {
                DType::F32 => hidden_case::<f32>(ctx, &engines, name, &p, &plants),
                _ => hidden_case::<f16>(ctx, &engines, name, &p, &plants),
            }
        }
    }
}

/// The same with a mask tensor hiding keys 5 and 6 from every row of head 0 (and key 6 from head
/// 1): ∞ in V and NaN in K there change nothing the rows see.
#[test]
fn nan_and_inf_behind_a_mask_tensor_do_not_reach_the_rows() {
    let Some(ctx) = gpu() else { return };
    let base = AttentionProblem::new(shape(1, 37, 45, 2, 2, 32), DType::F32);
    let p = base.with_mask(AttentionMask::dense(&base, false, true));
    let s = p.shape;
    let mut mask = vec![1u8; s.num_heads * s.seq_q * s.seq_kv];
    for i in 0..s.seq_q {
        mask[i * s.seq_kv + 5] = 0;
        mask[i * s.seq_kv + 6] = 0;
        mask[(s.seq_q + i) * s.seq_kv + 6] = 0;
    }
    let plants = [
        (5, 0, false, f32::INFINITY),
        (6, 0, true, f32::NAN),
        (6, 1, false, f32::NAN),
    ];
    let (q, k, v) = planted::<f32>(&p, &plants, 0xed6e);
    let index = BatchIndex {
        mask: Some(&mask),
        ..BatchIndex::default()
    };
    let want = reference::attention_indexed(&p, &q, &k, &v, &index).unwrap();
    for (name, engine) in tiled_engines(ctx, DType::F32) {
        let got = engine
            .forward_indexed_blocking(&p, &q, &k, &v, &index)
            .unwrap_or_else(|e| panic!("mask {name}: {e}"));
        let checked = check_unplanted_rows(&p, &want, &got.out, &got.lse, &format!("mask {name}"));
        assert_eq!(
            checked,
            s.num_heads * s.seq_q,
            "mask {name}: every row hides the planted keys"
        );
    }
}

/// Soft-caps across the range validation allows, `cap·log2 e` a normal f32: a cap of 1e-38 clips
/// every score to ±cap; caps of 1e4 … 2e38 lie far above every score, where cap·tanh(x / cap) is x
/// to f32's precision and x / cap is tiny or below f32's normal range. Forward on the tiled
/// variants and the decode kernel, and the backward.
#[test]
fn soft_caps_at_both_ends_of_the_range_match_the_reference() {
    let Some(ctx) = gpu() else { return };
    let mut engines = tiled_engines(ctx, DType::F32);
    engines.extend(decode_engines(ctx));
    for cap in [1e-38f32, 1e4, 1e30, 3e37, 2e38] {
        for (s, causal) in [(shape(1, 40, 70, 2, 1, 64), true), (shape(2, 3, 90, 4, 2, 64), false)] {
            let p = AttentionProblem::new(s, DType::F32)
                .with_causal(causal)
                .with_softcap(cap);
            let label = format!("cap {cap:e} {s:?}");
            let work = Workload::<f32>::random(ctx, &p, seed_of(&label)).unwrap();
            for (name, engine) in &engines {
                if name.starts_with("decode") && s.seq_q > 16 {
                    continue;
                }
                let (out, lse) = work
                    .run(engine, Kernel::Flash)
                    .unwrap_or_else(|e| panic!("{label} {name}: {e}"));
                let check = work.check_all(&out, &lse).unwrap();
                assert!(check.passes(DType::F32), "{label} {name}: {check}");
            }
            let problem = BackwardProblem::new(p);
            let config = select_backward(&problem, &ctx.caps, &BackwardChoice::default()).unwrap();
            let engine = FlashAttention::new(ctx);
            let work = BackwardWorkload::<f32>::random(ctx, problem, seed_of(&label)).unwrap();
            work.forward(&engine).unwrap();
            let grads = work
                .run(&engine, &config)
                .unwrap_or_else(|e| panic!("{label} backward: {e}"));
            let check = work.check_all(&grads).unwrap();
            assert!(check.passes(DType::F32), "{label} backward: {check}");
        }
    }
}

/// The soft-cap extremes on the cooperative-matrix kernel (f16; the H200). Its soft-cap runs on
/// raw scores (`soft_cap_raw`), whose cap/scale ratio is the one that leaves f32's range first.
#[test]
fn cooperative_soft_caps_at_both_ends_of_the_range_match_the_reference() {
    let Some(ctx) = gpu() else { return };
    for (name, engine) in coop_engines(ctx) {
        for cap in [1e-38f32, 1e4, 1e30, 3e37, 2e38] {
            let p = AttentionProblem::new(shape(1, 70, 90, 2, 1, 64), DType::F16)
                .with_causal(true)
                .with_softcap(cap);
            let label = format!("coop {name} cap {cap:e}");
            let work = Workload::<f16>::random(ctx, &p, seed_of(&label)).unwrap();
            let (out, lse) = work
                .run(&engine, Kernel::Flash)
                .unwrap_or_else(|e| panic!("{label}: {e}"));
            let check = work.check_all(&out, &lse).unwrap();
            assert!(check.passes(DType::F16), "{label}: {check}");
        }
    }
}

/// NaN and ±∞ in K at keys a row does not see, on the cooperative-matrix kernel (f16; the H200):
/// hidden scores are replaced, not multiplied, so the rows that see no planted key match the
/// reference. (In V the rule differs: README, "Edge semantics".)
#[test]
fn cooperative_nan_and_inf_in_k_at_hidden_keys() {
    let Some(ctx) = gpu() else { return };
    let p = AttentionProblem::new(shape(1, 40, 40, 2, 2, 64), DType::F16).with_causal(true);
    // Rows 0–35 of head 0 and 0–37 of head 1 see no planted key.
    let plants = [(36, 0, true, f32::NAN), (38, 1, true, f32::INFINITY)];
    let (q, k, v) = planted::<f16>(&p, &plants, 0xc0);
    let want = reference::attention(&p, &q, &k, &v).unwrap();
    let work = Workload::with_inputs(ctx, &p, q, k, v).unwrap();
    for (name, engine) in coop_engines(ctx) {
        let (out, lse) = work.run(&engine, Kernel::Flash).unwrap();
        let checked = check_unplanted_rows(&p, &want, &out, &lse, &format!("coop {name}"));
        assert!(checked >= 74, "coop {name}: {checked} rows checked");
    }
}
