//! Inputs and row checks for the edge-semantics tests (README, "Edge semantics"), shared by the
//! wgpu tests (through `common`) and tests/cuda_attention.rs (which includes this file alone:
//! it builds without the `internals` harness).
#![allow(dead_code)]

use wgpu_flash_attn::{AttentionProblem, Element};

/// Seeded inputs whose scores lie far from zero, for the extreme-logit tests. Each query row's
/// elements share one random sign (|q| ≥ 0.125) and K is positive, so a score is a sum of
/// same-signed exact f32 products (no cancellation: the kernels' f32 sums are within 4e-6 of the
/// float64 reference's, relatively). V is random. With `one_hot` false, every key of a
/// (sequence, K/V head) has the same random row (|k| ≥ 0.125), so a row's scores are all equal
/// (`scale·q·k`, of the row's sign): O is the mean of the V rows it sees and the LSE that score
/// plus ln(count). With `one_hot`, key j's elements are all j + 1, so the scores of a row step by
/// `scale·Σq` (at least 8·|scale| at head_dim 64) from key to key: the softmax is one-hot on the
/// first or the last key the row sees, O is that V row, the LSE that score. Key counts up to 256
/// are exact in f16 and bf16.
pub fn extreme_logit_inputs<T: Element>(p: &AttentionProblem, seed: u64, one_hot: bool) -> (Vec<T>, Vec<T>, Vec<T>) {
    use wgpu_flash_attn::testing::random_tensor;
    use wgpu_flash_attn::Tensor;
    let s = p.shape;
    let mut q = random_tensor::<T>(seed, p.required_len(Tensor::Q));
    let mut k = random_tensor::<T>(seed ^ 1, p.required_len(Tensor::K));
    let v = random_tensor::<T>(seed ^ 2, p.required_len(Tensor::V));
    for b in 0..s.batch {
        for h in 0..s.num_kv_heads {
            // Key 0's row is the shared one: written last.
            for j in (0..s.seq_kv).rev() {
                for d in 0..s.head_dim {
                    let x = if one_hot {
                        T::from_f64((j + 1) as f64)
                    } else {
                        T::from_f64(k[p.k_layout.index(b, 0, h, d)].to_f64().abs() + 0.125)
                    };
                    k[p.k_layout.index(b, j, h, d)] = x;
                }
            }
        }
        for h in 0..s.num_heads {
            for i in 0..s.seq_q {
                let sign = q[p.q_layout.index(b, i, h, 0)].to_f64().signum();
                for d in 0..s.head_dim {
                    let at = p.q_layout.index(b, i, h, d);
                    q[at] = T::from_f64(sign * (q[at].to_f64().abs() + 0.125));
                }
            }
        }
    }
    (q, k, v)
}

/// Seeded inputs with Q and K random times `magnitude` (V random): at 300, f16 products pass
/// f16's 65,504 and must be formed in f32.
pub fn large_inputs<T: Element>(p: &AttentionProblem, seed: u64, magnitude: f64) -> (Vec<T>, Vec<T>, Vec<T>) {
    use wgpu_flash_attn::testing::random_tensor;
    use wgpu_flash_attn::Tensor;
    let big = |seed, t| {
        random_tensor::<f32>(seed, p.required_len(t))
            .into_iter()
            .map(|x| T::from_f64(magnitude * x as f64))
            .collect()
    };
    (
        big(seed, Tensor::Q),
        big(seed ^ 1, Tensor::K),
        random_tensor::<T>(seed ^ 2, p.required_len(Tensor::V)),
    )
}

/// Compares O element by element within `tol.0` and the LSE within `tol.1` plus 1e-5 of |LSE|
/// (the extreme-logit LSEs are around 1e30, where an absolute bound means nothing; −∞ exactly). Rows that see no key must be exactly O = 0, LSE = −∞. Panics with the first
/// mismatch; returns how many rows saw no key.
pub fn assert_rows_match<T: Element>(
    p: &AttentionProblem,
    want: &wgpu_flash_attn::reference::ReferenceOutput,
    out: &[T],
    lse: &[f32],
    tol: (f64, f64),
    label: &str,
) -> usize {
    let s = p.shape;
    let mut empty = 0;
    for b in 0..s.batch {
        for h in 0..s.num_heads {
            for i in 0..s.seq_q {
                let l = (b * s.num_heads + h) * s.seq_q + i;
                let (g, w) = (lse[l] as f64, want.lse[l]);
                if w == f64::NEG_INFINITY {
                    empty += 1;
                    assert!(
                        g == w,
                        "{label}: (b {b}, h {h}, i {i}) sees no key: LSE = {g}, want -inf"
                    );
                } else {
                    assert!(
                        (g - w).abs() <= 1e-5 * w.abs() + tol.1,
                        "{label}: (b {b}, h {h}, i {i}) LSE = {g}, want {w}"
                    );
                }
                for d in 0..s.head_dim {
                    let at = p.o_layout.index(b, i, h, d);
                    let (g, w) = (out[at].to_f64(), want.out[at]);
                    let ok = if want.lse[l] == f64::NEG_INFINITY {
                        g == 0.0
                    } else {
                        (g - w).abs() <= tol.0
                    };
                    assert!(ok, "{label}: (b {b}, h {h}, i {i}, d {d}) O = {g}, want {w}");
                }
            }
        }
    }
    empty
}
