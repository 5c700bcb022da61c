//! Shared by the dropout tests of both engines (tests/dropout.rs through tests/common/mod.rs;
//! tests/cuda_dropout.rs includes this file alone): a forward's keep mask read off its outputs, a
//! kernel's mask compared with the host's, and the keep rate over all that was compared.
#![allow(dead_code)]

use wgpu_flash_attn::batch::{BatchIndex, Dropout};
use wgpu_flash_attn::testing::{random_tensor, seed_of};
use wgpu_flash_attn::{AttentionProblem, Element, Tensor};

/// A forward's mask, read from its outputs and compared with the host's over every visible
/// element: V's key j is the unit vector e_(j − window·head_dim) for the keys of one window of
/// head_dim keys (zero for the others), so output column x of row i is P_ij·Z_ij/(1 − p) for key
/// j = window·head_dim + x, positive exactly where kept (Q and K small, so no P underflows; the
/// one-hot values are exact in every element type). `forward(q, k, v)` runs the problem (packed
/// by `index`) and returns O and its kernel's name; one run per window of keys. Returns (elements
/// compared, kept, the kernel's name).
pub fn forward_mask_check<T: Element>(
    label: &str,
    problem: &AttentionProblem,
    index: &BatchIndex<'_>,
    mut forward: impl FnMut(&[T], &[T], &[T]) -> (Vec<T>, String),
) -> (usize, usize, String) {
    let p = problem;
    let s = p.shape;
    let d = s.head_dim;
    let seed = seed_of(label);
    let small = |seed, n| -> Vec<T> {
        random_tensor::<f32>(seed, n)
            .iter()
            .map(|x| T::from_f64(0.3 * *x as f64))
            .collect()
    };
    let (q, k) = (
        small(seed, p.required_len(Tensor::Q)),
        small(seed + 1, p.required_len(Tensor::K)),
    );
    let mut outs = Vec::new();
    let mut kernel = String::new();
    for w in 0..s.seq_kv.div_ceil(d) {
        let mut v = vec![T::from_f64(0.0); p.required_len(Tensor::V)];
        for b in 0..s.batch {
            let rows = index.sequence(p, b);
            for j in (w * d..(w + 1) * d).filter(|&j| j < rows.seq_kv) {
                for g in 0..s.num_kv_heads {
                    v[p.v_layout.index(b, rows.kv_first + j, g, j - w * d)] = T::from_f64(1.0);
                }
            }
        }
        let (o, name) = forward(&q, &k, &v);
        outs.push(o);
        kernel = name;
    }
    let label = format!("{label} ({kernel})");
    let (compared, kept) = compare_masks(&label, p, index, 0..s.num_heads, |b, h, i, j| {
        let rows = index.sequence(p, b);
        let x = outs[j / d][p.o_layout.index(b, rows.q_first + i, h, j % d)].to_f64();
        assert!(x.is_finite() && x >= 0.0, "{label}: O = {x} at ({b}, {h}, {i}, {j})");
        Some(x > 0.0)
    });
    (compared, kept, kernel)
}

/// Compares a kernel's mask, `kernel(b, h, i, j)` (`None` where it cannot be read: a key the row
/// does not see), with the host's over every visible element of every sequence and head; returns
/// (elements compared, kept). Panics with the first mismatches.
pub fn compare_masks(
    label: &str,
    problem: &AttentionProblem,
    index: &BatchIndex<'_>,
    heads: std::ops::Range<usize>,
    mut kernel: impl FnMut(usize, usize, usize, usize) -> Option<bool>,
) -> (usize, usize) {
    let d = problem.dropout.unwrap();
    let (mut compared, mut kept, mut wrong) = (0, 0, Vec::new());
    for b in 0..problem.shape.batch {
        let rows = index.sequence(problem, b);
        for h in heads.clone() {
            let mask = d.mask(b, h, rows.seq_q, rows.seq_kv);
            for i in 0..rows.seq_q {
                for j in problem.visible_keys(i, rows.seq_q, rows.seq_kv) {
                    let Some(got) = kernel(b, h, i, j) else { continue };
                    let want = mask[i * rows.seq_kv + j];
                    compared += 1;
                    kept += want as usize;
                    if got != want {
                        wrong.push(format!("(b {b}, h {h}, i {i}, j {j}): kernel {got}, host {want}"));
                    }
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{label}: {} of {compared} bits differ, first {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(6)]
    );
    (compared, kept)
}

/// Whether `kept` of `compared` elements is `1 − p` of `dropout` within five standard deviations.
pub fn assert_keep_rate(label: &str, dropout: &Dropout, compared: usize, kept: usize) {
    let q = 1.0 - dropout.drop_probability();
    let rate = kept as f64 / compared as f64;
    let sd = (q * (1.0 - q) / compared as f64).sqrt();
    assert!(
        (rate - q).abs() < 5.0 * sd,
        "{label}: kept {rate} of {compared}, want {q} ± {sd}"
    );
}
