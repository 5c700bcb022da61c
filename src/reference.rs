//! Float64 CPU reference attention: plain loops, max-subtracted softmax, the causal mask as an
//! `if`. Obviously right rather than fast; the tests, benchmarks and example check the GPU
//! kernels against it.
//!
//! It reads the kernel's inputs as stored (already rounded to the problem's dtype), so the only
//! difference from a kernel's output is the kernel's own arithmetic.

use crate::problem::{AttentionProblem, Element, Tensor};
use crate::Result;

/// One query row's reference result.
#[derive(Clone, Debug)]
pub struct ReferenceRow {
    /// `head_dim` output values.
    pub out: Vec<f64>,
    /// Natural-log log-sum-exp of the scaled scores; −∞ when the row sees no key.
    pub lse: f64,
}

/// Reference output of a whole problem.
#[derive(Clone, Debug)]
pub struct ReferenceOutput {
    /// Laid out like the problem's `o_layout` (length `problem.required_len(Tensor::O)`;
    /// elements no output maps to are 0).
    pub out: Vec<f64>,
    /// `[batch, num_heads, seq_q]`.
    pub lse: Vec<f64>,
}

/// The whole problem in float64. Costs `O(B·H·Sq·Skv·D)` on one CPU core: keep it to small
/// problems, and use [`attention_row`] to spot-check large ones.
pub fn attention<T: Element>(problem: &AttentionProblem, q: &[T], k: &[T], v: &[T]) -> Result<ReferenceOutput> {
    check_inputs(problem, q, k, v)?;
    let s = problem.shape;
    let mut out = vec![0.0; problem.required_len(Tensor::O)];
    let mut lse = vec![0.0; problem.lse_len()];
    for b in 0..s.batch {
        for h in 0..s.num_heads {
            for i in 0..s.seq_q {
                let row = row_unchecked(problem, q, k, v, b, h, i);
                for (d, x) in row.out.iter().enumerate() {
                    out[problem.o_layout.index(b, i, h, d)] = *x;
                }
                lse[(b * s.num_heads + h) * s.seq_q + i] = row.lse;
            }
        }
    }
    Ok(ReferenceOutput { out, lse })
}

/// The reference result of query row `i` of head `h` in batch `b`.
pub fn attention_row<T: Element>(
    problem: &AttentionProblem,
    q: &[T],
    k: &[T],
    v: &[T],
    b: usize,
    h: usize,
    i: usize,
) -> Result<ReferenceRow> {
    check_inputs(problem, q, k, v)?;
    let s = problem.shape;
    if b >= s.batch || h >= s.num_heads || i >= s.seq_q {
        return crate::error::invalid!("reference row (b {b}, h {h}, i {i}) is outside the problem");
    }
    Ok(row_unchecked(problem, q, k, v, b, h, i))
}

fn check_inputs<T: Element>(problem: &AttentionProblem, q: &[T], k: &[T], v: &[T]) -> Result<()> {
    problem.validate()?;
    for (tensor, data) in [(Tensor::Q, q.len()), (Tensor::K, k.len()), (Tensor::V, v.len())] {
        let need = problem.required_len(tensor);
        if data < need {
            return Err(crate::Error::InvalidBuffer {
                tensor: tensor.name(),
                message: format!("holds {data} elements, the problem needs {need}"),
            });
        }
    }
    Ok(())
}

fn row_unchecked<T: Element>(
    problem: &AttentionProblem,
    q: &[T],
    k: &[T],
    v: &[T],
    b: usize,
    h: usize,
    i: usize,
) -> ReferenceRow {
    let s = problem.shape;
    let d = s.head_dim;
    let kv_head = h / problem.group_size();
    let scale = problem.softmax_scale() as f64;
    // Bottom-right aligned causal mask: keys 0 ..= i + seq_kv - seq_q are visible.
    let visible = if problem.causal {
        (i as i64 + problem.causal_offset() + 1).clamp(0, s.seq_kv as i64) as usize
    } else {
        s.seq_kv
    };
    if visible == 0 {
        return ReferenceRow {
            out: vec![0.0; d],
            lse: f64::NEG_INFINITY,
        };
    }
    let qi: Vec<f64> = (0..d).map(|x| q[problem.q_layout.index(b, i, h, x)].to_f64()).collect();
    let scores: Vec<f64> = (0..visible)
        .map(|j| {
            let kj = problem.k_layout.index(b, j, kv_head, 0);
            scale * (0..d).map(|x| qi[x] * k[kj + x].to_f64()).sum::<f64>()
        })
        .collect();
    let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
    let sum: f64 = weights.iter().sum();
    let mut out = vec![0.0; d];
    for (j, w) in weights.iter().enumerate() {
        let vj = problem.v_layout.index(b, j, kv_head, 0);
        for (x, o) in out.iter_mut().enumerate() {
            *o += w * v[vj + x].to_f64();
        }
    }
    for o in &mut out {
        *o /= sum;
    }
    ReferenceRow {
        out,
        lse: max + sum.ln(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::{AttentionShape, DType};

    #[test]
    fn uniform_scores_average_the_values() {
        // Identical keys give identical scores, so every row is the mean of the visible values
        // and its LSE is log(count) + score.
        let p = AttentionProblem::new(
            AttentionShape {
                batch: 1,
                seq_q: 3,
                seq_kv: 4,
                num_heads: 1,
                num_kv_heads: 1,
                head_dim: 8,
            },
            DType::F32,
        )
        .with_causal(true);
        let q = vec![1.0f32; 3 * 8];
        let k = vec![0.5f32; 4 * 8];
        let v: Vec<f32> = (0..4 * 8).map(|x| (x / 8) as f32).collect();
        let r = attention(&p, &q, &k, &v).unwrap();
        let score = 0.5 * 8.0 * p.softmax_scale() as f64;
        for i in 0..3 {
            // seq_kv - seq_q = 1: row i sees keys 0..=i+1.
            let count = i + 2;
            let mean = (0..count).sum::<usize>() as f64 / count as f64;
            assert!((r.out[i * 8] - mean).abs() < 1e-12);
            assert!((r.lse[i] - (score + (count as f64).ln())).abs() < 1e-12);
        }
    }

    #[test]
    fn rows_that_see_no_key_are_zero_with_lse_minus_infinity() {
        let p = AttentionProblem::new(
            AttentionShape {
                batch: 1,
                seq_q: 3,
                seq_kv: 1,
                num_heads: 1,
                num_kv_heads: 1,
                head_dim: 8,
            },
            DType::F32,
        )
        .with_causal(true);
        let r = attention(&p, &[1.0f32; 24], &[1.0f32; 8], &[2.0f32; 8]).unwrap();
        assert_eq!(r.lse[0], f64::NEG_INFINITY);
        assert_eq!(r.lse[1], f64::NEG_INFINITY);
        assert!(r.lse[2].is_finite());
        assert!(r.out[..16].iter().all(|&x| x == 0.0));
        assert!((r.out[16] - 2.0).abs() < 1e-12);
    }
}
