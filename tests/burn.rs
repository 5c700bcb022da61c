//! burn's attention on our kernels (feature `burn`): seeded random tensors on burn's wgpu device,
//! our op against burn's own naive attention (`attention_fallback`: burn tensor ops on the same
//! device and tensors) and against the float64 reference on the same rounded inputs; views read
//! in place; what the kernels refuse runs on burn's attention and says why. Outputs are filled
//! with NaN before our kernel runs (`poison_outputs`), so a kernel that writes nothing fails.
//!
//! burn's wgpu runtime comes up on the best adapter (lavapipe in CI); without one the tests print
//! why and pass, unless `FLASH_REQUIRE_GPU=1`, which CI sets.
#![cfg(feature = "burn")]

use std::sync::{Mutex, MutexGuard, OnceLock};

use burn_tensor::ops::{AttentionModuleOptions, CausalAlignment};
use burn_tensor::{Bool, DType, Device, Tensor, TensorData};
use wgpu_flash_attn::burn as fa;
use wgpu_flash_attn::testing::harness::tolerance;
use wgpu_flash_attn::testing::{random_tensor, seed_of, ErrorStats};
use wgpu_flash_attn::{reference, AttentionProblem, AttentionShape, Layout};

/// burn's wgpu device with our engine registered, once per test binary, and a lock that keeps
/// the tests apart (they count what ran on the one device); `None` (after saying why) where there
/// is no adapter and the GPU is not required.
fn device() -> Option<(Device, MutexGuard<'static, ()>)> {
    static SERIAL: Mutex<()> = Mutex::new(());
    let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    static DEVICE: OnceLock<Result<Device, String>> = OnceLock::new();
    let device = DEVICE.get_or_init(|| {
        fa::poison_outputs(true);
        fa::init(Device::wgpu_options()).map_err(|e| e.to_string())
    });
    match device {
        Ok(d) => Some((d.clone(), serial)),
        Err(e) => {
            if std::env::var("FLASH_REQUIRE_GPU").as_deref() == Ok("1") {
                panic!("FLASH_REQUIRE_GPU=1 but burn's wgpu runtime did not come up: {e}");
            }
            eprintln!("skipping: {e}");
            None
        }
    }
}

/// Seeded normals of `dims` (never all zero) as an f32 tensor on `device`, cast to `dtype`.
fn randn(label: &str, dims: [usize; 4], dtype: DType, device: &Device) -> Tensor<4> {
    let data: Vec<f32> = random_tensor(seed_of(label), dims.iter().product());
    Tensor::<4>::from_data(TensorData::new(data, dims), device).cast(dtype)
}

/// A tensor's values in row-major order of its logical shape, as f32 (exact for f16 and bf16).
fn values32(t: &Tensor<4>) -> Vec<f32> {
    t.clone().cast(DType::F32).into_data().try_to_vec::<f32>().unwrap()
}

/// [`values32`] as f64.
fn values(t: &Tensor<4>) -> Vec<f64> {
    values32(t).into_iter().map(f64::from).collect()
}

/// One attention call's shapes and options.
#[derive(Clone, Copy, Debug)]
struct Case {
    batch: usize,
    heads: usize,
    kv_heads: usize,
    seq_q: usize,
    seq_kv: usize,
    head_dim: usize,
    options: AttentionModuleOptions,
}

impl Case {
    fn new(batch: usize, heads: usize, kv_heads: usize, seq_q: usize, seq_kv: usize, head_dim: usize) -> Self {
        Case {
            batch,
            heads,
            kv_heads,
            seq_q,
            seq_kv,
            head_dim,
            options: AttentionModuleOptions::default(),
        }
    }

    fn causal(mut self) -> Self {
        self.options.is_causal = true;
        self
    }

    fn q_dims(&self) -> [usize; 4] {
        [self.batch, self.heads, self.seq_q, self.head_dim]
    }

    fn kv_dims(&self) -> [usize; 4] {
        [self.batch, self.kv_heads, self.seq_kv, self.head_dim]
    }

    /// The same call as one of our problems on f32, `[batch, heads, seq, head_dim]` contiguous
    /// (the reference's, on the inputs' values).
    fn problem(&self) -> AttentionProblem {
        let shape = AttentionShape {
            batch: self.batch,
            seq_q: self.seq_q,
            seq_kv: self.seq_kv,
            num_heads: self.heads,
            num_kv_heads: self.kv_heads,
            head_dim: self.head_dim,
        };
        let mut p = AttentionProblem::new(shape, wgpu_flash_attn::DType::F32)
            .with_layout(Layout::Bhsd)
            .with_causal(self.options.is_causal);
        if let Some(s) = self.options.scale {
            p = p.with_scale(s as f32);
        }
        if let Some(c) = self.options.softcap {
            p = p.with_softcap(c as f32);
        }
        p
    }
}

/// `got` against the float64 `want`, within the dtype's bounds (NaN fails).
fn assert_close(label: &str, dtype: DType, got: &[f64], want: &[f64]) {
    let t = tolerance(match dtype {
        DType::F32 => wgpu_flash_attn::DType::F32,
        DType::F16 => wgpu_flash_attn::DType::F16,
        DType::BF16 => wgpu_flash_attn::DType::BF16,
        other => panic!("no such case: {other:?}"),
    });
    assert_eq!(got.len(), want.len(), "{label}: lengths");
    let stats = ErrorStats::from_pairs(got.iter().copied().zip(want.iter().copied()));
    assert!(stats.within(t.out_rel_l2, t.out_max_abs), "{label}: {stats}");
}

/// Our op, burn's naive attention and the float64 reference on one case's tensors.
fn check(label: &str, case: Case, dtype: DType, [q, k, v]: [Tensor<4>; 3], device: &Device) {
    let before = fa::calls(device);
    let ours = fa::attention(q.clone(), k.clone(), v.clone(), None, None, case.options);
    let burns = burn_tensor::module::attention_fallback(q.clone(), k.clone(), v.clone(), None, None, case.options);
    assert_eq!(ours.dims(), case.q_dims(), "{label}: shape");
    assert_eq!(ours.dtype(), dtype, "{label}: dtype");
    let (ours, burns) = (values(&ours), values(&burns));
    let after = fa::calls(device);
    assert_eq!(after.flash, before.flash + 1, "{label}: our kernels ran it ({after:?})");
    let want = reference::attention(&case.problem(), &values32(&q), &values32(&k), &values32(&v))
        .unwrap()
        .out;
    assert_close(&format!("{label}: ours vs float64"), dtype, &ours, &want);
    assert_close(&format!("{label}: burn's naive vs float64"), dtype, &burns, &want);
    assert_close(&format!("{label}: ours vs burn's naive"), dtype, &ours, &burns.to_vec());
    eprintln!("{label}: ok ({after:?})");
}

fn cases() -> Vec<(&'static str, Case)> {
    vec![
        ("mha", Case::new(2, 4, 4, 37, 37, 64)),
        ("causal", Case::new(2, 4, 4, 37, 37, 64).causal()),
        // Bottom-right alignment: the last query sees every key; top-left is the same mask here.
        ("causal_kv_longer", Case::new(1, 4, 4, 17, 45, 32).causal()),
        ("causal_q_longer", Case::new(1, 2, 2, 45, 17, 32).causal()),
        ("gqa", Case::new(1, 8, 2, 33, 50, 64)),
        ("mqa_causal", Case::new(2, 4, 1, 20, 20, 128).causal()),
        (
            "scale_softcap",
            Case {
                options: AttentionModuleOptions {
                    scale: Some(0.3),
                    softcap: Some(2.0),
                    ..Default::default()
                },
                ..Case::new(1, 2, 2, 24, 40, 64)
            },
        ),
        (
            "square_top_left",
            Case {
                options: AttentionModuleOptions {
                    is_causal: true,
                    causal_alignment: CausalAlignment::TopLeft,
                    ..Default::default()
                },
                ..Case::new(1, 2, 2, 30, 30, 32)
            },
        ),
    ]
}

#[test]
fn f32_matches_burns_naive_attention_and_the_reference() {
    let Some((device, _serial)) = device() else { return };
    for (label, case) in cases() {
        let q = randn(&format!("{label} q"), case.q_dims(), DType::F32, &device);
        let k = randn(&format!("{label} k"), case.kv_dims(), DType::F32, &device);
        let v = randn(&format!("{label} v"), case.kv_dims(), DType::F32, &device);
        check(label, case, DType::F32, [q, k, v], &device);
    }
}

/// f16 and bf16 where burn's device has them (lavapipe has f16), on every other case.
#[test]
fn half_precision_matches_burns_naive_attention_and_the_reference() {
    let Some((device, _serial)) = device() else { return };
    for dtype in [DType::F16, DType::BF16] {
        if !device.supports_dtype(dtype) {
            eprintln!("skipping {dtype:?}: burn's device does not have it");
            continue;
        }
        for (label, case) in cases().into_iter().step_by(2) {
            let label = format!("{dtype:?} {label}");
            let q = randn(&format!("{label} q"), case.q_dims(), dtype, &device);
            let k = randn(&format!("{label} k"), case.kv_dims(), dtype, &device);
            let v = randn(&format!("{label} v"), case.kv_dims(), dtype, &device);
            check(&label, case, dtype, [q, k, v], &device);
        }
    }
}

/// Swapped dimensions, a slice and a broadcast K/V head: read at their strides (or copied on the
/// device first), never on the host.
#[test]
fn views_are_read_where_they_lie() {
    let Some((device, _serial)) = device() else { return };
    let case = Case::new(2, 4, 4, 24, 40, 64).causal();
    // Q produced [batch, seq, heads, head_dim], as a projection does, then swapped.
    let q = randn("views q", [2, 24, 4, 64], DType::F32, &device).swap_dims(1, 2);
    // K: heads 1..5 of a 6-head tensor stored [batch, heads, head_dim, seq] (a transposed
    // key cache): head_dim not contiguous, so copied to a contiguous tensor on the device first.
    let k = randn("views k", [2, 6, 64, 40], DType::F32, &device)
        .swap_dims(2, 3)
        .slice([0..2, 1..5, 0..40, 0..64]);
    // V: one head broadcast to four (stride 0).
    let v = randn("views v", [2, 1, 40, 64], DType::F32, &device).expand([2, 4, 40, 64]);
    check("views", case, DType::F32, [q, k, v], &device);
}

/// What the kernels do not run goes to burn's attention (the same values as burn's own call),
/// and `flash_attention` says why.
#[test]
fn what_the_kernels_refuse_runs_on_burns_attention() {
    let Some((device, _serial)) = device() else { return };
    let t = |label: &str, dims: [usize; 4]| randn(label, dims, DType::F32, &device);
    let top_left = AttentionModuleOptions {
        is_causal: true,
        causal_alignment: CausalAlignment::TopLeft,
        ..Default::default()
    };
    let plain = AttentionModuleOptions::default();
    let (q, kv) = ([1, 2, 16, 32], [1, 2, 24, 32]);
    let mask = Tensor::<4, Bool>::from_data(
        TensorData::new(
            (0..2 * 16 * 24).map(|i| i % 3 == 0).collect::<Vec<bool>>(),
            [1, 2, 16, 24],
        ),
        &device,
    );
    /// One call the kernels refuse: its shapes, a mask or not, its options, and words of the
    /// reason `flash_attention` gives (a mask is not an argument there).
    struct Refused {
        label: &'static str,
        dims: [[usize; 4]; 3],
        mask: bool,
        options: AttentionModuleOptions,
        why: &'static str,
    }
    let refused = [
        Refused {
            label: "top-left causal, seq_q ≠ seq_kv",
            dims: [q, kv, kv],
            mask: false,
            options: top_left,
            why: "top left",
        },
        Refused {
            label: "head_dim 12",
            dims: [[1, 2, 16, 12], [1, 2, 24, 12], [1, 2, 24, 12]],
            mask: false,
            options: plain,
            why: "head_dim 12",
        },
        Refused {
            label: "value head_dim 16",
            dims: [q, kv, [1, 2, 24, 16]],
            mask: false,
            options: plain,
            why: "value head_dim (16)",
        },
        Refused {
            label: "a mask",
            dims: [q, kv, kv],
            mask: true,
            options: plain,
            why: "",
        },
    ];
    for Refused {
        label,
        dims: [qd, kd, vd],
        mask: with_mask,
        options,
        why,
    } in refused
    {
        let (q, k, v) = (
            t(&format!("{label} q"), qd),
            t(&format!("{label} k"), kd),
            t(&format!("{label} v"), vd),
        );
        let mask = with_mask.then(|| mask.clone());
        if !with_mask {
            let err = fa::flash_attention(&q, &k, &v, options).unwrap_err().to_string();
            assert!(err.contains(why), "{label}: {err}");
        }
        let before = fa::calls(&device);
        let ours = fa::attention(q.clone(), k.clone(), v.clone(), mask.clone(), None, options);
        let burns = burn_tensor::module::attention(q, k, v, mask, None, options);
        assert_eq!(values(&ours), values(&burns), "{label}: burn's attention ran it");
        let after = fa::calls(&device);
        assert_eq!(
            (after.flash, after.burn),
            (before.flash, before.burn + 1),
            "{label}: counted as burn's"
        );
    }
}

/// Both routes of the output, checked: written where burn allocated it, or, where burn's
/// allocator put it in the same `wgpu::Buffer` as an input (wgpu forbids binding one buffer
/// read-only and writable in a dispatch), written to a buffer of ours and copied there on the
/// device. burn's default memory (`Adaptive`) slices small tensors from a shared pool (so a small
/// call is staged) and gives a tensor larger than any before pages of their own (in place).
#[test]
fn outputs_in_burns_buffer_or_staged() {
    let Some((device, _serial)) = device() else { return };
    let cases = [
        ("small (staged)", Case::new(1, 2, 2, 16, 16, 32), 1),
        ("large (in place)", Case::new(1, 8, 2, 4096, 64, 64).causal(), 0),
    ];
    for (label, case, staged) in cases {
        let q = randn(&format!("{label} q"), case.q_dims(), DType::F32, &device);
        let k = randn(&format!("{label} k"), case.kv_dims(), DType::F32, &device);
        let v = randn(&format!("{label} v"), case.kv_dims(), DType::F32, &device);
        let before = fa::calls(&device).staged;
        check(label, case, DType::F32, [q, k, v], &device);
        assert_eq!(fa::calls(&device).staged - before, staged, "{label}: the route");
    }
}
