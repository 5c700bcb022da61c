//! The candle drop-in (feature `candle`): each function on seeded random tensors against candle's
//! own naive attention (`softmax(q·kᵀ·scale + mask)·v` in candle ops, f32, on the CPU) and against
//! the float64 reference on the same rounded inputs, O and LSE; views read in place or copied;
//! every bad call a candle error with the reason, never a panic.
//!
//! CPU tensors run on the wgpu engine (lavapipe in CI; without an adapter the tests print why and
//! pass, unless `FLASH_REQUIRE_GPU=1`, which CI sets). With `candle-cuda` the `cuda_*` tests run
//! the same cases on CUDA tensors (on the H200; without a CUDA device they print why and pass,
//! unless `FLASH_REQUIRE_CUDA=1`).
#![cfg(feature = "candle")]

use candle_core::{DType, Device, IndexOp, Tensor, D};
use wgpu_flash_attn::batch::{BatchIndex, Varlen};
use wgpu_flash_attn::candle as fa;
use wgpu_flash_attn::testing::harness::tolerance;
use wgpu_flash_attn::testing::{random_tensor, seed_of, ErrorStats};
use wgpu_flash_attn::{reference, AttentionProblem, AttentionShape};

/// The wgpu engine's device is there, or the test should pass quietly (see the file's doc).
fn wgpu_ready() -> bool {
    match fa::wgpu_engine() {
        Ok(engine) => {
            let info = &engine.context().info;
            eprintln!("wgpu device: {} ({:?})", info.name, info.backend);
            true
        }
        Err(e) => {
            if std::env::var("FLASH_REQUIRE_GPU").as_deref() == Ok("1") {
                panic!("FLASH_REQUIRE_GPU=1 but the candle route has no device: {e}");
            }
            eprintln!("skipping: {e}");
            false
        }
    }
}

fn ours(dtype: DType) -> wgpu_flash_attn::DType {
    match dtype {
        DType::F32 => wgpu_flash_attn::DType::F32,
        DType::F16 => wgpu_flash_attn::DType::F16,
        DType::BF16 => wgpu_flash_attn::DType::BF16,
        other => panic!("no such case: {other:?}"),
    }
}

/// Seeded normals of `dims`, rounded to `dtype`, on `device`.
fn randn(label: &str, dims: &[usize], dtype: DType, device: &Device) -> Tensor {
    let n = dims.iter().product();
    let data: Vec<f32> = random_tensor(seed_of(label), n);
    Tensor::from_vec(data, dims, &Device::Cpu)
        .and_then(|t| t.to_dtype(dtype))
        .and_then(|t| t.to_device(device))
        .unwrap()
}

/// A tensor's values in row-major order, as f32 (exact for every f16 and bf16).
fn values(t: &Tensor) -> Vec<f32> {
    t.to_device(&Device::Cpu)
        .and_then(|t| t.to_dtype(DType::F32))
        .and_then(|t| t.flatten_all())
        .and_then(|t| t.to_vec1())
        .unwrap()
}

/// Which keys query `i` of a sequence of `seq_q` queries and `seq_kv` keys sees: FlashAttention's
/// definition, written out (position `p = i + seq_kv − seq_q`; causal `j ≤ p`; window
/// `p − left ≤ j ≤ p + right`).
#[derive(Clone, Copy, Debug, Default)]
struct Mask {
    causal: bool,
    left: Option<usize>,
    right: Option<usize>,
}

impl Mask {
    fn sees(&self, i: usize, j: usize, seq_q: usize, seq_kv: usize) -> bool {
        let (p, j) = (i as i64 + seq_kv as i64 - seq_q as i64, j as i64);
        !(self.causal && j > p)
            && self.left.is_none_or(|l| j >= p - l as i64)
            && self.right.is_none_or(|r| j <= p + r as i64)
    }
}

/// candle's naive attention in f32 on the CPU: O `[batch, seq_q, heads, head_dim]` and the LSE
/// `[batch, heads, seq_q]`. Rows that see no key give 0 and −∞, as FlashAttention's. `alibi`:
/// one slope per head, `−slope·|p − j|` added after the soft-cap (FlashAttention's order).
fn naive(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f64,
    mask: Mask,
    softcap: Option<f64>,
    alibi: Option<&[f32]>,
) -> (Tensor, Tensor) {
    let f32 = |t: &Tensor| {
        t.to_device(&Device::Cpu)?
            .to_dtype(DType::F32)?
            .transpose(1, 2)?
            .contiguous()
    };
    let (q, k, v) = (f32(q).unwrap(), f32(k).unwrap(), f32(v).unwrap());
    let (b, h, sq, d) = q.dims4().unwrap();
    let (_, hk, skv, _) = k.dims4().unwrap();
    // Query head h reads K/V head h / (h / hk).
    let repeat = |t: &Tensor| t.unsqueeze(2)?.expand((b, hk, h / hk, skv, d))?.reshape((b, h, skv, d));
    let (k, v) = (repeat(&k).unwrap(), repeat(&v).unwrap());
    let mut s = (q.matmul(&k.t().unwrap()).unwrap() * scale).unwrap();
    if let Some(cap) = softcap {
        s = ((s / cap).unwrap().tanh().unwrap() * cap).unwrap();
    }
    if let Some(slopes) = alibi {
        let distance: Vec<f32> = (0..sq * skv)
            .map(|x| (x / skv + skv) as f32 - (sq + x % skv) as f32)
            .map(f32::abs)
            .collect();
        let distance = Tensor::from_vec(distance, (1, 1, sq, skv), &Device::Cpu).unwrap();
        let slopes = Tensor::from_vec(slopes.to_vec(), (1, h, 1, 1), &Device::Cpu).unwrap();
        s = s.broadcast_sub(&distance.broadcast_mul(&slopes).unwrap()).unwrap();
    }
    let seen: Vec<f32> = (0..sq * skv)
        .map(|x| mask.sees(x / skv, x % skv, sq, skv) as u8 as f32)
        .collect();
    let seen = Tensor::from_vec(seen, (sq, skv), &Device::Cpu).unwrap();
    // Unseen scores sink far below every seen one; multiplying by `seen` zeroes them even in a
    // row that sees nothing.
    let sunk = s
        .broadcast_add(&((seen.clone() - 1.0).unwrap() * 1e30).unwrap())
        .unwrap();
    let max = sunk.max_keepdim(D::Minus1).unwrap();
    let e = sunk
        .broadcast_sub(&max)
        .unwrap()
        .exp()
        .unwrap()
        .broadcast_mul(&seen)
        .unwrap();
    let sum = e.sum_keepdim(D::Minus1).unwrap();
    let p = e.broadcast_div(&sum.clamp(1e-30, f32::MAX).unwrap()).unwrap();
    let out = p.matmul(&v).unwrap().transpose(1, 2).unwrap();
    let lse = (max + sum.log().unwrap()).unwrap().squeeze(D::Minus1).unwrap();
    (out, lse)
}

/// A result against what it should be, each a list of values: rel L2 and max abs within the
/// dtype's bounds (O) and max abs (LSE), NaN failing, −∞ matching only −∞.
fn assert_close(label: &str, dtype: DType, got: (&[f32], &[f32]), want: (&[f64], &[f64])) {
    let t = tolerance(ours(dtype));
    let pairs = |g: &[f32], w: &[f64]| {
        assert_eq!(g.len(), w.len(), "{label}: lengths");
        ErrorStats::from_pairs(g.iter().map(|&x| x as f64).zip(w.iter().copied()))
    };
    let (o, lse) = (pairs(got.0, want.0), pairs(got.1, want.1));
    assert!(
        o.within(t.out_rel_l2, t.out_max_abs) && lse.within(f64::INFINITY, t.lse_max_abs),
        "{label}: O {o}; LSE {lse}"
    );
}

fn f64s(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&x| x as f64).collect()
}

/// One dense case: sizes, mask, soft-cap, ALiBi.
#[derive(Clone, Copy, Debug)]
struct Case {
    batch: usize,
    seq_q: usize,
    seq_kv: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    mask: Mask,
    softcap: Option<f32>,
    /// ALiBi with [`slopes`] (one per head).
    alibi: bool,
}

/// ALiBi slopes for `heads` query heads: halving from 0.5, each head's bias tangibly different
/// over the tests' few dozen keys (2^−(h+1); the paper's geometric slopes for 8 heads).
fn slopes(heads: usize) -> Vec<f32> {
    (0..heads).map(|h| 0.5f32.powi(h as i32 + 1)).collect()
}

impl Case {
    const fn new(batch: usize, seq_q: usize, seq_kv: usize, heads: usize, kv_heads: usize, head_dim: usize) -> Self {
        Case {
            batch,
            seq_q,
            seq_kv,
            heads,
            kv_heads,
            head_dim,
            mask: Mask {
                causal: false,
                left: None,
                right: None,
            },
            softcap: None,
            alibi: false,
        }
    }

    fn causal(self) -> Self {
        Case {
            mask: Mask {
                causal: true,
                ..self.mask
            },
            ..self
        }
    }

    fn inputs(&self, label: &str, dtype: DType, device: &Device) -> [Tensor; 3] {
        let q = [self.batch, self.seq_q, self.heads, self.head_dim];
        let kv = [self.batch, self.seq_kv, self.kv_heads, self.head_dim];
        [
            randn(&format!("{label} q"), &q, dtype, device),
            randn(&format!("{label} k"), &kv, dtype, device),
            randn(&format!("{label} v"), &kv, dtype, device),
        ]
    }

    fn scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }

    /// The float64 reference on the inputs' rounded values (contiguous f32 copies).
    fn reference(&self, [q, k, v]: &[Tensor; 3]) -> (Vec<f64>, Vec<f64>) {
        let shape = AttentionShape {
            batch: self.batch,
            seq_q: self.seq_q,
            seq_kv: self.seq_kv,
            num_heads: self.heads,
            num_kv_heads: self.kv_heads,
            head_dim: self.head_dim,
        };
        let mut p = AttentionProblem::new(shape, wgpu_flash_attn::DType::F32)
            .with_causal(self.mask.causal)
            .with_scale(self.scale());
        if self.mask.left.is_some() || self.mask.right.is_some() {
            p = p.with_window(self.mask.left, self.mask.right);
        }
        if let Some(cap) = self.softcap {
            p = p.with_softcap(cap);
        }
        let slopes = slopes(self.heads);
        let mut index = BatchIndex::default();
        if self.alibi {
            p = p.with_alibi_slopes();
            index.alibi_slopes = Some(&slopes);
        }
        let r = reference::attention_indexed(&p, &values(q), &values(k), &values(v), &index).unwrap();
        (r.out, r.lse)
    }

    /// Runs the case through `call` (O and LSE) and checks both against the reference and
    /// candle's naive attention; returns O.
    fn check(
        &self,
        label: &str,
        dtype: DType,
        device: &Device,
        call: impl Fn(&[Tensor; 3]) -> (Tensor, Tensor),
    ) -> Tensor {
        let x = self.inputs(label, dtype, device);
        let (out, lse) = call(&x);
        assert_eq!(out.dims(), x[0].dims(), "{label}: O's shape");
        assert_eq!(out.dtype(), dtype, "{label}: O's dtype");
        assert!(out.device().same_device(device), "{label}: O's device");
        assert_eq!(
            lse.dims(),
            &[self.batch, self.heads, self.seq_q],
            "{label}: LSE's shape"
        );
        let got = (values(&out), values(&lse));
        let want = self.reference(&x);
        assert_close(
            &format!("{label} vs float64"),
            dtype,
            (&got.0, &got.1),
            (&want.0, &want.1),
        );
        let softcap = self.softcap.map(f64::from);
        let alibi = self.alibi.then(|| slopes(self.heads));
        let (n_out, n_lse) = naive(
            &x[0],
            &x[1],
            &x[2],
            self.scale() as f64,
            self.mask,
            softcap,
            alibi.as_deref(),
        );
        let (n_out, n_lse) = (values(&n_out), values(&n_lse));
        // candle's naive attention is right (to f32 rounding), and the drop-in matches it.
        assert_close(
            &format!("{label}: naive vs float64"),
            DType::F32,
            (&n_out, &n_lse),
            (&want.0, &want.1),
        );
        assert_close(
            &format!("{label} vs candle's naive"),
            dtype,
            (&got.0, &got.1),
            (&f64s(&n_out), &f64s(&n_lse)),
        );
        out
    }
}

const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// Dense shapes: odd lengths, seq_q ≠ seq_kv both ways (seq_q > seq_kv causal leaves rows that
/// see no key), GQA and MQA, head_dim 64 and 128.
const CASES: [Case; 4] = [
    Case::new(2, 37, 37, 4, 4, 64),
    Case::new(1, 20, 45, 8, 2, 64),
    Case::new(2, 45, 20, 4, 1, 64),
    Case::new(1, 17, 33, 2, 2, 128),
];

fn flash_attn_on(device: &Device, dtypes: &[DType]) {
    for &dtype in dtypes {
        for case in CASES {
            for case in [case, case.causal()] {
                let label = format!("flash_attn {dtype:?} {case:?}");
                let out = case.check(&label, dtype, device, |[q, k, v]| {
                    fa::flash_attn_lse(q, k, v, case.scale(), case.mask.causal).unwrap()
                });
                // The plain call is the same computation.
                let [q, k, v] = case.inputs(&label, dtype, device);
                let plain = fa::flash_attn(&q, &k, &v, case.scale(), case.mask.causal).unwrap();
                assert_eq!(values(&plain), values(&out), "{label}: flash_attn and flash_attn_lse");
            }
        }
    }
}

#[test]
fn flash_attn_matches_candle_and_float64() {
    if wgpu_ready() {
        flash_attn_on(&Device::Cpu, &DTYPES);
    }
}

/// Windows as candle-flash-attn reads them: both sides, one side, `(None, Some(0))` = causal,
/// sides past the keys = none; and the soft-cap.
fn windows_on(device: &Device, dtypes: &[DType]) {
    let base = Case::new(2, 40, 52, 4, 2, 64);
    for &dtype in dtypes {
        for (left, right) in [(Some(5), Some(3)), (Some(4), None), (None, Some(2)), (Some(0), Some(0))] {
            let case = Case {
                mask: Mask {
                    causal: false,
                    left,
                    right,
                },
                ..base
            };
            let label = format!("flash_attn_windowed {dtype:?} ({left:?}, {right:?})");
            case.check(&label, dtype, device, |[q, k, v]| {
                let lse = fa::flash_attn_windowed_lse(q, k, v, case.scale(), left, right).unwrap();
                let plain = fa::flash_attn_windowed(q, k, v, case.scale(), left, right).unwrap();
                assert_eq!(values(&plain), values(&lse.0), "{label}: with and without the LSE");
                lse
            });
        }
        let [q, k, v] = base.inputs("windows as masks", dtype, device);
        let s = base.scale();
        let same = |a: Tensor, b: Tensor, what: &str| assert_eq!(values(&a), values(&b), "{dtype:?}: {what}");
        same(
            fa::flash_attn_windowed(&q, &k, &v, s, None, Some(0)).unwrap(),
            fa::flash_attn(&q, &k, &v, s, true).unwrap(),
            "(None, Some(0)) is causal",
        );
        same(
            fa::flash_attn_windowed(&q, &k, &v, s, Some(1000), Some(53)).unwrap(),
            fa::flash_attn(&q, &k, &v, s, false).unwrap(),
            "sides past the keys are no window",
        );
        for (left, right, cap) in [(Some(8), None, 5.0f32), (None, None, 2.0)] {
            let case = Case {
                mask: Mask {
                    causal: false,
                    left,
                    right,
                },
                softcap: Some(cap),
                ..base
            };
            let label = format!("softcap {cap} {dtype:?} ({left:?}, {right:?})");
            case.check(&label, dtype, device, |[q, k, v]| {
                let out = fa::flash_attn_alibi_windowed_softcap(q, k, v, None, case.scale(), left, right, cap).unwrap();
                // There is no LSE twin with a soft-cap: the reference's LSE stands in for it.
                let lse = case.reference(&[q.clone(), k.clone(), v.clone()]).1;
                let lse: Vec<f32> = lse.iter().map(|&x| x as f32).collect();
                (
                    out,
                    Tensor::from_vec(lse, (case.batch, case.heads, case.seq_q), &Device::Cpu).unwrap(),
                )
            });
        }
        // candle-flash-attn's 0.0 is no soft-cap.
        same(
            fa::flash_attn_alibi_windowed_softcap(&q, &k, &v, None, s, None, None, 0.0).unwrap(),
            fa::flash_attn(&q, &k, &v, s, false).unwrap(),
            "softcap 0.0 is none",
        );
    }
}

#[test]
fn windows_and_softcaps_match_candle_and_float64() {
    if wgpu_ready() {
        windows_on(&Device::Cpu, &DTYPES);
    }
}

/// ALiBi through every `*alibi*` function: with and without the causal mask, a window, a
/// soft-cap; slopes on the tensors' device or on the CPU, in f32 or f64.
fn alibi_on(device: &Device, dtypes: &[DType]) {
    let base = Case {
        alibi: true,
        ..Case::new(2, 40, 52, 4, 2, 64)
    };
    // There is no LSE twin with ALiBi: the reference's LSE stands in for it, and O is checked.
    let reference_lse = |case: &Case, x: &[Tensor; 3]| {
        let lse: Vec<f32> = case.reference(x).1.iter().map(|&x| x as f32).collect();
        Tensor::from_vec(lse, (case.batch, case.heads, case.seq_q), &Device::Cpu).unwrap()
    };
    for &dtype in dtypes {
        let on_device = Tensor::new(slopes(base.heads).as_slice(), device).unwrap();
        let on_cpu_f64 = on_device.to_device(&Device::Cpu).unwrap().to_dtype(DType::F64).unwrap();
        for (case, slopes) in [(base, &on_device), (base.causal(), &on_cpu_f64)] {
            let label = format!("flash_attn_alibi {dtype:?} causal {}", case.mask.causal);
            case.check(&label, dtype, device, |x| {
                let [q, k, v] = x;
                let out = fa::flash_attn_alibi(q, k, v, slopes, case.scale(), case.mask.causal).unwrap();
                (out, reference_lse(&case, x))
            });
        }
        let (left, right) = (Some(8), Some(2));
        let windowed = Case {
            mask: Mask {
                causal: false,
                left,
                right,
            },
            ..base
        };
        let label = format!("flash_attn_alibi_windowed {dtype:?}");
        windowed.check(&label, dtype, device, |x| {
            let [q, k, v] = x;
            let out = fa::flash_attn_alibi_windowed(q, k, v, &on_device, windowed.scale(), left, right).unwrap();
            (out, reference_lse(&windowed, x))
        });
        let capped = Case {
            softcap: Some(5.0),
            ..windowed
        };
        let label = format!("flash_attn_alibi_windowed_softcap {dtype:?}");
        let s = capped.scale();
        capped.check(&label, dtype, device, |x| {
            let [q, k, v] = x;
            let out = fa::flash_attn_alibi_windowed_softcap(q, k, v, Some(&on_device), s, left, right, 5.0).unwrap();
            (out, reference_lse(&capped, x))
        });
        let [q, k, v] = base.inputs("alibi without a cap", dtype, device);
        assert_eq!(
            values(&fa::flash_attn_alibi_windowed_softcap(&q, &k, &v, Some(&on_device), s, left, right, 0.0).unwrap()),
            values(&fa::flash_attn_alibi_windowed(&q, &k, &v, &on_device, s, left, right).unwrap()),
            "{dtype:?}: softcap 0.0 with slopes is flash_attn_alibi_windowed"
        );
    }
}

#[test]
fn alibi_matches_candle_and_float64() {
    if wgpu_ready() {
        alibi_on(&Device::Cpu, &DTYPES);
    }
}

/// A packed batch: ragged lengths, a sequence of no queries and one of no keys (its rows give 0
/// and LSE −∞), GQA, causal aligned to each sequence's end, a window; with and without ALiBi
/// (positions within each sequence).
fn varlen_on(device: &Device, dtypes: &[DType]) {
    let cu_q: [u32; 5] = [0, 5, 5, 30, 47];
    let cu_k: [u32; 5] = [0, 9, 20, 20, 60];
    let (heads, kv_heads, head_dim) = (4, 2, 64);
    let (total_q, total_kv) = (47, 60);
    let (max_q, max_k) = (25, 40);
    let scale = 0.125;
    for &dtype in dtypes {
        let causal = Mask {
            causal: true,
            ..Mask::default()
        };
        let window = Mask {
            causal: false,
            left: Some(6),
            right: Some(1),
        };
        let slopes = slopes(heads);
        for (mask, alibi) in [
            (Mask::default(), false),
            (causal, false),
            (window, false),
            (causal, true),
            (window, true),
        ] {
            let label = format!("varlen {dtype:?} {mask:?} alibi {alibi}");
            let q = randn(&format!("{label} q"), &[total_q, heads, head_dim], dtype, device);
            let k = randn(&format!("{label} k"), &[total_kv, kv_heads, head_dim], dtype, device);
            let v = randn(&format!("{label} v"), &[total_kv, kv_heads, head_dim], dtype, device);
            let seqlens = |cu: &[u32]| Tensor::new(cu, device).unwrap();
            let (sq, sk) = (seqlens(&cu_q), seqlens(&cu_k));
            let (left, right) = if mask.causal {
                (None, Some(0))
            } else {
                (mask.left, mask.right)
            };
            let (out, lse) =
                fa::flash_attn_varlen_windowed_lse(&q, &k, &v, &sq, &sk, max_q, max_k, scale, left, right).unwrap();
            assert_eq!(
                (out.dims(), lse.dims()),
                (q.dims(), &[heads, total_q][..]),
                "{label}: shapes"
            );
            let plain = if mask.causal || mask.left.is_none() {
                fa::flash_attn_varlen(&q, &k, &v, &sq, &sk, max_q, max_k, scale, mask.causal).unwrap()
            } else {
                fa::flash_attn_varlen_windowed(&q, &k, &v, &sq, &sk, max_q, max_k, scale, left, right).unwrap()
            };
            assert_eq!(values(&plain), values(&out), "{label}: with and without the LSE");
            let (mut got_o, mut got_lse) = (values(&out), values(&lse));
            if alibi {
                let t = Tensor::new(slopes.as_slice(), device).unwrap();
                let out = if mask.causal {
                    fa::flash_attn_varlen_alibi(&q, &k, &v, &t, &sq, &sk, max_q, max_k, scale, true).unwrap()
                } else {
                    fa::flash_attn_varlen_alibi_windowed(&q, &k, &v, &t, &sq, &sk, max_q, max_k, scale, left, right)
                        .unwrap()
                };
                let capless = fa::flash_attn_varlen_alibi_windowed_softcap(
                    &q,
                    &k,
                    &v,
                    Some(&t),
                    &sq,
                    &sk,
                    max_q,
                    max_k,
                    scale,
                    left,
                    right,
                    0.0,
                )
                .unwrap();
                assert_eq!(values(&capless), values(&out), "{label}: softcap 0.0 with slopes");
                got_o = values(&out);
                // No LSE twin with ALiBi: the reference's LSE stands in for it below.
                got_lse.clear();
            }

            // float64: the packed problem.
            let shape = AttentionShape {
                batch: 4,
                seq_q: max_q,
                seq_kv: max_k,
                num_heads: heads,
                num_kv_heads: kv_heads,
                head_dim,
            };
            let mut p = AttentionProblem::new(shape, wgpu_flash_attn::DType::F32)
                .with_causal(mask.causal)
                .with_scale(scale)
                .with_varlen(Varlen { total_q, total_kv });
            if mask.left.is_some() {
                p = p.with_window(mask.left, mask.right);
            }
            if alibi {
                p = p.with_alibi_slopes();
            }
            let index = BatchIndex {
                cu_seqlens_q: Some(&cu_q),
                cu_seqlens_k: Some(&cu_k),
                alibi_slopes: alibi.then_some(&slopes[..]),
                ..Default::default()
            };
            let want = reference::attention_indexed(&p, &values(&q), &values(&k), &values(&v), &index).unwrap();
            if alibi {
                got_lse = want.lse.iter().map(|&x| x as f32).collect();
            }
            assert_close(
                &format!("{label} vs float64"),
                dtype,
                (&got_o, &got_lse),
                (&want.out, &want.lse),
            );

            // candle's naive attention, one sequence at a time.
            let mut n_out = vec![0.0; got_o.len()];
            let mut n_lse = vec![f64::NEG_INFINITY; got_lse.len()];
            for b in 0..4 {
                let (q0, q1) = (cu_q[b] as usize, cu_q[b + 1] as usize);
                let (k0, k1) = (cu_k[b] as usize, cu_k[b + 1] as usize);
                if q1 == q0 {
                    continue;
                }
                if k1 == k0 {
                    // No keys: 0 and −∞ (already so).
                    continue;
                }
                let one = |t: &Tensor, a: usize, z: usize| t.i(a..z).unwrap().unsqueeze(0).unwrap();
                let (o, l) = naive(
                    &one(&q, q0, q1),
                    &one(&k, k0, k1),
                    &one(&v, k0, k1),
                    scale as f64,
                    mask,
                    None,
                    alibi.then_some(&slopes[..]),
                );
                let row = heads * head_dim;
                for (i, x) in values(&o).into_iter().enumerate() {
                    n_out[q0 * row + i] = x as f64;
                }
                let l = values(&l);
                for h in 0..heads {
                    for i in 0..q1 - q0 {
                        n_lse[h * total_q + q0 + i] = l[h * (q1 - q0) + i] as f64;
                    }
                }
            }
            assert_close(
                &format!("{label} vs candle's naive"),
                dtype,
                (&got_o, &got_lse),
                (&n_out, &n_lse),
            );
        }
    }
}

#[test]
fn varlen_matches_candle_and_float64() {
    if wgpu_ready() {
        varlen_on(&Device::Cpu, &DTYPES);
    }
}

/// Views the kernels read in place (a transposed `[batch, heads, seq, dim]` tensor, K and V cut
/// out of a fused QKV projection) and views copied first (the head dimension strided, a start
/// off the 4-element grid) give what the contiguous tensors give.
fn views_on(device: &Device, dtype: DType) {
    let case = Case::new(2, 24, 24, 4, 4, 64).causal();
    let [q, k, v] = case.inputs("views", dtype, device);
    let s = case.scale();
    let want = values(&fa::flash_attn(&q, &k, &v, s, true).unwrap());
    let check = |label: &str, q: &Tensor, k: &Tensor, v: &Tensor| {
        assert_eq!(
            (q.dims(), k.dims(), v.dims()),
            (&[2, 24, 4, 64][..], &[2, 24, 4, 64][..], &[2, 24, 4, 64][..])
        );
        assert_eq!(
            values(q),
            values(&case.inputs("views", dtype, device)[0]),
            "{label}: q's values"
        );
        let got = values(&fa::flash_attn(q, k, v, s, true).unwrap());
        assert_eq!(got, want, "{dtype:?} {label}");
    };
    // [batch, heads, seq, dim] in memory.
    let bhsd = |t: &Tensor| {
        t.transpose(1, 2)
            .unwrap()
            .contiguous()
            .unwrap()
            .transpose(1, 2)
            .unwrap()
    };
    let q_t = bhsd(&q);
    assert!(!q_t.is_contiguous());
    check("q transposed from [b, h, s, d]", &q_t, &k, &v);
    // [batch, seq, 3·heads, dim]: q, k, v side by side per row.
    let qkv = Tensor::cat(&[&q, &k, &v], 2).unwrap();
    let part = |i: usize| qkv.narrow(2, 4 * i, 4).unwrap();
    assert_eq!(part(1).layout().start_offset(), 4 * 64);
    check("q, k, v cut from a fused QKV", &part(0), &part(1), &part(2));
    // Copied first: the head dimension strided ...
    let strided = q
        .transpose(2, 3)
        .unwrap()
        .contiguous()
        .unwrap()
        .transpose(2, 3)
        .unwrap();
    assert_eq!(strided.stride()[3], 4);
    check("q with a strided head_dim", &strided, &k, &v);
    // ... and a start 2 elements in.
    let flat = Tensor::cat(
        &[&Tensor::zeros(2, dtype, device).unwrap(), &q.flatten_all().unwrap()],
        0,
    )
    .unwrap();
    let shifted = flat.narrow(0, 2, q.elem_count()).unwrap().reshape(q.dims()).unwrap();
    assert_eq!(shifted.layout().start_offset(), 2);
    check("q starting off the grid", &shifted, &k, &v);
}

#[test]
fn views_are_read_in_place_or_copied() {
    if wgpu_ready() {
        for dtype in DTYPES {
            views_on(&Device::Cpu, dtype);
        }
    }
}

/// `f` failed with a candle error whose message says all of `what`.
fn refused<T: std::fmt::Debug>(result: candle_core::Result<T>, what: &[&str]) {
    let e = result.expect_err("a bad call must be an error").to_string();
    assert!(what.iter().all(|w| e.contains(w)), "expected {what:?} in: {e}");
}

#[test]
fn bad_calls_are_candle_errors() {
    if !wgpu_ready() {
        return;
    }
    let dev = Device::Cpu;
    let t = |dims: &[usize], dtype| randn("bad", dims, dtype, &dev);
    let (q, kv) = (t(&[1, 8, 4, 64], DType::F32), t(&[1, 8, 2, 64], DType::F32));
    // Shapes, types and sizes: ours or the library's message, never a panic.
    refused(
        fa::flash_attn(&t(&[8, 4, 64], DType::F32), &kv, &kv, 1.0, false),
        &["flash_attn", "rank 4"],
    );
    refused(
        fa::flash_attn(&q, &t(&[1, 8, 2, 64], DType::BF16), &kv, 1.0, false),
        &["q is F32 but k is BF16"],
    );
    refused(
        fa::flash_attn(&q, &kv, &t(&[1, 9, 2, 64], DType::F32), 1.0, false),
        &["same shape"],
    );
    let q64 = t(&[1, 8, 4, 64], DType::F64);
    refused(fa::flash_attn(&q64, &q64, &q64, 1.0, false), &["F64"]);
    let odd = t(&[1, 8, 4, 12], DType::F32);
    refused(
        fa::flash_attn(&odd, &odd, &odd, 1.0, false),
        &["head_dim 12 is not supported"],
    );
    refused(
        fa::flash_attn(
            &t(&[1, 8, 6, 64], DType::F32),
            &t(&[1, 8, 4, 64], DType::F32),
            &t(&[1, 8, 4, 64], DType::F32),
            1.0,
            false,
        ),
        &["num_kv_heads"],
    );
    refused(fa::flash_attn(&q, &kv, &kv, f32::NAN, false), &["scale"]);
    refused(
        fa::flash_attn_alibi_windowed_softcap(&q, &kv, &kv, None, 1.0, None, None, -1.0),
        &["soft-cap"],
    );
    // ALiBi slopes: one per query head.
    let slopes = Tensor::ones(4, DType::F32, &dev).unwrap();
    assert!(fa::flash_attn_alibi(&q, &kv, &kv, &slopes, 1.0, true).is_ok());
    refused(
        fa::flash_attn_alibi(&q, &kv, &kv, &Tensor::ones(3, DType::F32, &dev).unwrap(), 1.0, true),
        &["flash_attn_alibi:", "alibi_slopes holds 3 slopes for 4 query heads"],
    );
    refused(
        fa::flash_attn_alibi_windowed(&q, &kv, &kv, &slopes.reshape((1, 4)).unwrap(), 1.0, None, None),
        &["flash_attn_alibi_windowed:", "[num_heads]", "[1, 4]"],
    );
    // Packed batches: the offsets' type, shape and values, the longest sequence.
    let (pq, pkv) = (t(&[10, 4, 64], DType::F32), t(&[12, 2, 64], DType::F32));
    let cu = |x: &[u32]| Tensor::new(x, &dev).unwrap();
    let (good_q, good_k) = (cu(&[0, 4, 10]), cu(&[0, 5, 12]));
    let varlen = |sq: &Tensor, sk: &Tensor, max_q, max_k| {
        fa::flash_attn_varlen(&pq, &pkv, &pkv, sq, sk, max_q, max_k, 1.0, true)
    };
    assert!(varlen(&good_q, &good_k, 6, 7).is_ok());
    refused(
        varlen(&good_q.to_dtype(DType::I64).unwrap(), &good_k, 6, 7),
        &["seqlens_q is I64", "u32"],
    );
    refused(
        varlen(&good_q, &cu(&[0, 12]), 6, 12),
        &["seqlens_q has 3 offsets and seqlens_k 2"],
    );
    refused(varlen(&cu(&[0, 6, 4]), &good_k, 6, 7), &["cu_seqlens_q"]);
    refused(varlen(&good_q, &cu(&[0, 5, 13]), 6, 7), &["cu_seqlens_k"]);
    refused(varlen(&good_q, &good_k, 5, 7), &["cu_seqlens_q"]);
    refused(varlen(&cu(&[0]), &cu(&[0]), 6, 7), &["[batch + 1]"]);
    refused(
        fa::flash_attn_varlen_alibi(
            &pq,
            &pkv,
            &pkv,
            &slopes.i(..2).unwrap(),
            &good_q,
            &good_k,
            6,
            7,
            1.0,
            true,
        ),
        &["flash_attn_varlen_alibi:", "alibi_slopes holds 2 slopes"],
    );
    refused(
        fa::flash_attn_varlen(&q, &kv, &kv, &good_q, &good_k, 6, 7, 1.0, true),
        &["rank 3"],
    );
    // Gradients through the op are candle's "backward not supported", not a panic.
    let var = candle_core::Var::from_tensor(&q).unwrap();
    let out = fa::flash_attn(var.as_tensor(), &kv, &kv, 1.0, false).unwrap();
    refused(out.sum_all().unwrap().backward(), &["wgpu-flash-attn"]);
}

/// The same cases on CUDA tensors (feature `candle-cuda`, run on the H200): f16 and bf16, on
/// candle's stream.
#[cfg(feature = "candle-cuda")]
mod cuda {
    use super::*;

    fn device() -> Option<Device> {
        match Device::new_cuda(0) {
            Ok(d) => Some(d),
            Err(e) => {
                if std::env::var("FLASH_REQUIRE_CUDA").as_deref() == Ok("1") {
                    panic!("FLASH_REQUIRE_CUDA=1 but candle has no CUDA device: {e}");
                }
                eprintln!("skipping the CUDA route: {e}");
                None
            }
        }
    }

    const CUDA_DTYPES: [DType; 2] = [DType::F16, DType::BF16];

    #[test]
    fn cuda_flash_attn_matches_candle_and_float64() {
        if let Some(dev) = device() {
            // CASES has head_dim 64 and 128 (the wgmma kernel's widths; others run padded on mma.sync).
            flash_attn_on(&dev, &CUDA_DTYPES);
        }
    }

    #[test]
    fn cuda_windows_and_softcaps_match_candle_and_float64() {
        if let Some(dev) = device() {
            windows_on(&dev, &CUDA_DTYPES);
        }
    }

    #[test]
    fn cuda_alibi_matches_candle_and_float64() {
        if let Some(dev) = device() {
            alibi_on(&dev, &CUDA_DTYPES);
        }
    }

    #[test]
    fn cuda_varlen_matches_candle_and_float64() {
        if let Some(dev) = device() {
            varlen_on(&dev, &CUDA_DTYPES);
        }
    }

    #[test]
    fn cuda_views_are_read_in_place_or_copied() {
        if let Some(dev) = device() {
            for dtype in CUDA_DTYPES {
                views_on(&dev, dtype);
            }
        }
    }

    /// Output memory the allocator hands back from a tensor of NaNs: a row the kernel failed to
    /// write would read NaN, which fails every comparison.
    #[test]
    fn cuda_outputs_are_written_over_poison() {
        let Some(dev) = device() else { return };
        let case = Case::new(2, 64, 64, 8, 2, 128).causal();
        for dtype in CUDA_DTYPES {
            let n = case.batch * case.seq_q * case.heads * case.head_dim;
            drop(Tensor::full(f32::NAN, n, &dev).unwrap().to_dtype(dtype).unwrap());
            case.check(&format!("poisoned {dtype:?}"), dtype, &dev, |[q, k, v]| {
                fa::flash_attn_lse(q, k, v, case.scale(), true).unwrap()
            });
        }
    }

    /// f32 CUDA tensors are refused by name (the CUDA kernels are 16-bit); f32 runs on CPU
    /// tensors.
    #[test]
    fn cuda_refuses_f32() {
        let Some(dev) = device() else { return };
        let q = randn("f32 on cuda", &[1, 8, 4, 64], DType::F32, &dev);
        refused(fa::flash_attn(&q, &q, &q, 1.0, false), &["CUDA tensors are F32"]);
    }
}
