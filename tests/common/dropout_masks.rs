//! Shared by the dropout tests of both engines (tests/dropout.rs through tests/common/mod.rs;
//! tests/cuda_dropout.rs includes this file alone): a kernel's keep mask compared with the host's,
//! and the keep rate over all that was compared.
#![allow(dead_code)]

use wgpu_flash_attn::batch::{BatchIndex, Dropout};
use wgpu_flash_attn::AttentionProblem;

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
