//! Float64 CPU reference attention: plain loops, max-subtracted softmax, the causal mask as an
//! `if`. Obviously right rather than fast; the tests, benchmarks and example check the GPU
//! kernels against it.
//!
//! It reads the kernel's inputs as stored (already rounded to the problem's dtype), so the only
//! difference from a kernel's output is the kernel's own arithmetic.

use crate::error::Result;
use crate::error::{check_holds, host_output};
use crate::problem::backward::{BackwardProblem, GradTensor};
use crate::problem::index::BatchIndex;
use crate::problem::mask::score_terms;
use crate::problem::score_bias::BiasValues;
use crate::problem::{Alibi, AttentionProblem, Element, SequenceRows, Tensor};

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
/// problems, and use [`attention_row`] to spot-check large ones. `q`, `k`, `v` are laid out as the
/// problem says; the problem's validation error, or [`Error::InvalidBuffer`](crate::error::Error::InvalidBuffer)
/// for a slice shorter than its tensor's `required_len`.
///
/// ```rust
/// use wgpu_flash_attn::{reference, AttentionProblem, DType};
/// # fn main() -> wgpu_flash_attn::Result<()> {
/// // One head of 8, two positions, causal. With K all zero every visible key scores the same, so
/// // each output row is the mean of the V rows it sees and its LSE is ln(how many it sees).
/// let problem = AttentionProblem::mha(1, 2, 1, 8, DType::F32).with_causal(true);
/// let q: Vec<f32> = (0..16).map(|x| x as f32).collect();
/// let k = vec![0.0f32; 16];
/// let v: Vec<f32> = (0..16).map(|x| if x < 8 { 0.0 } else { 2.0 }).collect(); // rows 0 and 2
///
/// let r = reference::attention(&problem, &q, &k, &v)?;
/// assert_eq!(r.out[..8], [0.0; 8]); // query 0 sees key 0 only
/// assert!(r.out[8..].iter().all(|&x| (x - 1.0).abs() < 1e-12)); // query 1: mean of 0 and 2
/// assert!(r.lse[0].abs() < 1e-12 && (r.lse[1] - 2f64.ln()).abs() < 1e-12);
///
/// // One row alone, as the tests spot-check large problems:
/// let row = reference::attention_row(&problem, &q, &k, &v, 0, 0, 1)?;
/// assert_eq!(row.out, r.out[8..]);
/// # Ok(()) }
/// ```
pub fn attention<T: Element>(problem: &AttentionProblem, q: &[T], k: &[T], v: &[T]) -> Result<ReferenceOutput> {
    attention_indexed(problem, q, k, v, &BatchIndex::default())
}

/// [`attention`] for a problem whose keys are paged or have per-sequence counts
/// ([`AttentionProblem::with_paged_kv`], [`AttentionProblem::with_kv_lengths`]): `index` holds
/// the page table and the counts, checked against the problem ([`BatchIndex::validate`]). Paged
/// attention is defined as dense attention over each sequence's keys gathered from their pages,
/// with the causal mask aligned to each sequence's own end; a sequence of no keys gives O = 0
/// and LSE = −∞.
pub fn attention_indexed<T: Element>(
    problem: &AttentionProblem,
    q: &[T],
    k: &[T],
    v: &[T],
    index: &BatchIndex<'_>,
) -> Result<ReferenceOutput> {
    check_inputs(problem, q, k, v)?;
    let s = problem.shape;
    index.validate(problem)?;
    let mut out = host_output("o", problem.required_len(Tensor::O), 0.0)?;
    let mut lse = host_output("lse", problem.lse_len(), 0.0)?;
    for b in 0..s.batch {
        let keys = SequenceKeys::of(problem, index, b);
        let rows = keys.rows;
        for h in 0..s.num_heads {
            for i in 0..rows.seq_q {
                let row = row_unchecked(problem, q, k, v, b, h, i, &keys);
                for (d, x) in row.out.iter().enumerate() {
                    out[problem.o_layout.index(b, rows.q_first + i, h, d)] = *x;
                }
                lse[problem.lse_index(b, &rows, h, i)] = row.lse;
            }
        }
    }
    Ok(ReferenceOutput { out, lse })
}

/// The reference result of query row `i` of head `h` in batch `b`, computed alone (it costs
/// `O(Skv·D)`); errors as [`attention`], and [`Error::InvalidProblem`](crate::error::Error::InvalidProblem)
/// for a row outside the problem.
pub fn attention_row<T: Element>(
    problem: &AttentionProblem,
    q: &[T],
    k: &[T],
    v: &[T],
    b: usize,
    h: usize,
    i: usize,
) -> Result<ReferenceRow> {
    attention_row_indexed(problem, q, k, v, &BatchIndex::default(), [b, h, i])
}

/// [`attention_row`] with the call's index tensors (as [`attention_indexed`]); `at` is
/// `[b, h, i]`, the row within its sequence.
pub fn attention_row_indexed<T: Element>(
    problem: &AttentionProblem,
    q: &[T],
    k: &[T],
    v: &[T],
    index: &BatchIndex<'_>,
    at: [usize; 3],
) -> Result<ReferenceRow> {
    let mut rows = attention_rows_indexed(problem, q, k, v, index, &[at])?;
    Ok(rows.remove(0))
}

/// [`attention_row_indexed`] for several rows, checking the inputs and the index once (a large
/// bias's values are checked in full).
pub fn attention_rows_indexed<T: Element>(
    problem: &AttentionProblem,
    q: &[T],
    k: &[T],
    v: &[T],
    index: &BatchIndex<'_>,
    rows: &[[usize; 3]],
) -> Result<Vec<ReferenceRow>> {
    check_inputs(problem, q, k, v)?;
    index.validate(problem)?;
    let s = problem.shape;
    rows.iter()
        .map(|&[b, h, i]| {
            if b >= s.batch || h >= s.num_heads {
                return crate::error::invalid!("reference row (b {b}, h {h}, i {i}) is outside the problem");
            }
            let keys = SequenceKeys::of(problem, index, b);
            if i >= keys.rows.seq_q {
                return crate::error::invalid!("reference row (b {b}, h {h}, i {i}) is outside the problem");
            }
            Ok(row_unchecked(problem, q, k, v, b, h, i, &keys))
        })
        .collect()
}

/// Where one sequence's rows are: its rows and lengths, and the pages its keys lie in; and the
/// call's per-head terms.
struct SequenceKeys<'a> {
    rows: SequenceRows,
    /// The sequence's row of the page table and the page size, when paged.
    pages: Option<(&'a [u32], usize)>,
    index: BatchIndex<'a>,
}

/// Query head `h`'s ALiBi slope (0 without ALiBi) and sink logit, from the problem and the
/// call's validated tensors (src/problem/head_terms.rs).
pub(crate) fn head_terms(problem: &AttentionProblem, index: &BatchIndex<'_>, h: usize) -> (f64, Option<f64>) {
    let slope = match problem.alibi {
        None => 0.0,
        Some(Alibi::Geometric) => Alibi::geometric_slope(h, problem.shape.num_heads),
        Some(Alibi::PerHead) => index.alibi_slopes.map_or(0.0, |s| s[h] as f64),
    };
    let sink = index.sinks.filter(|_| problem.sinks).map(|s| s[h] as f64);
    (slope, sink)
}

impl<'a> SequenceKeys<'a> {
    /// Sequence `b`'s rows; `index` has been validated against the problem.
    fn of(problem: &AttentionProblem, index: &BatchIndex<'a>, b: usize) -> Self {
        let pages = problem
            .kv_cache
            .paged
            .zip(index.page_table)
            .map(|(p, table)| (&table[b * p.pages_per_seq..(b + 1) * p.pages_per_seq], p.page_size));
        SequenceKeys {
            rows: index.sequence(problem, b),
            pages,
            index: *index,
        }
    }

    /// `(batch or page, row)` of key `j` in the K/V tensors.
    fn locate(&self, b: usize, j: usize) -> (usize, usize) {
        match self.pages {
            Some((table, page_size)) => (table[j / page_size] as usize, j % page_size),
            None => (b, self.rows.kv_first + j),
        }
    }
}

fn check_inputs<T: Element>(problem: &AttentionProblem, q: &[T], k: &[T], v: &[T]) -> Result<()> {
    problem.validate()?;
    check_holds(
        [(Tensor::Q, q.len()), (Tensor::K, k.len()), (Tensor::V, v.len())]
            .map(|(t, len)| (t.name(), len, problem.required_len(t))),
    )
}

#[allow(clippy::too_many_arguments)]
fn row_unchecked<T: Element>(
    problem: &AttentionProblem,
    q: &[T],
    k: &[T],
    v: &[T],
    b: usize,
    h: usize,
    i: usize,
    keys: &SequenceKeys<'_>,
) -> ReferenceRow {
    let s = problem.shape;
    let d = s.head_dim;
    let kv_head = h / problem.group_size();
    let scale = problem.softmax_scale() as f64;
    let rows = &keys.rows;
    let (slope, sink) = head_terms(problem, &keys.index, h);
    // The bottom-right aligned causal mask and the window, over this sequence's keys.
    let visible = problem.visible_keys(i, rows.seq_q, rows.seq_kv);
    if visible.is_empty() {
        return ReferenceRow {
            out: vec![0.0; d],
            lse: sink.unwrap_or(f64::NEG_INFINITY),
        };
    }
    let position = i as f64 + rows.seq_kv as f64 - rows.seq_q as f64;
    let qi: Vec<f64> = (0..d)
        .map(|x| q[problem.q_layout.index(b, rows.q_first + i, h, x)].to_f64())
        .collect();
    let cap = problem.softcap.map(f64::from);
    let scores: Vec<f64> = visible
        .clone()
        .map(|j| {
            let (kb, kr) = keys.locate(b, j);
            let kj = problem.k_layout.index(kb, kr, kv_head, 0);
            let score = scale * (0..d).map(|x| qi[x] * k[kj + x].to_f64()).sum::<f64>();
            let capped = cap.map_or(score, |cap| cap * (score / cap).tanh());
            let terms = score_terms(problem, keys.index.bias, keys.index.mask, b, h, i, j);
            if terms == f64::NEG_INFINITY {
                // A key the mask or a −∞ bias hides: its product is not read (a NaN in K there
                // would make the row's max and sum NaN).
                return f64::NEG_INFINITY;
            }
            capped - slope * (position - j as f64).abs() + terms
        })
        .collect();
    let max = scores.iter().cloned().chain(sink).fold(f64::NEG_INFINITY, f64::max);
    if max == f64::NEG_INFINITY {
        // Every visible key hidden by a −∞ bias or the mask, and no sink: as a row that sees no
        // key.
        return ReferenceRow {
            out: vec![0.0; d],
            lse: f64::NEG_INFINITY,
        };
    }
    let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
    let sum: f64 = weights.iter().sum::<f64>() + sink.map_or(0.0, |s| (s - max).exp());
    // Dropout zeroes the dropped weights and scales the kept ones in the output only: the sum,
    // and the LSE, are the undropped softmax's.
    let kept = dropout_factors(problem, b, h, i, visible.clone());
    let mut out = vec![0.0; d];
    for ((j, w), z) in visible.zip(&weights).zip(kept) {
        if *w == 0.0 {
            // A key of weight 0 (hidden by a −∞ bias or the mask, or underflowed) adds nothing:
            // 0·∞ would make its NaN or ±∞ values the row's (README, "NaN and ±∞ inputs").
            continue;
        }
        let w = w * z;
        let (vb, vr) = keys.locate(b, j);
        let vj = problem.v_layout.index(vb, vr, kv_head, 0);
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

/// What dropout multiplies the probabilities of query row `i` of head `h` in batch entry (or
/// sequence) `b` by, for the keys `keys`: 0 where the mask drops one, `1/(1 − p)` where it keeps
/// one ([`Dropout::mask`](crate::problem::Dropout::mask)), 1 without dropout.
fn dropout_factors(problem: &AttentionProblem, b: usize, h: usize, i: usize, keys: std::ops::Range<usize>) -> Vec<f64> {
    match problem.active_dropout() {
        None => vec![1.0; keys.len()],
        Some(dropout) => {
            let scale = dropout.scale();
            keys.map(|j| if dropout.keeps(b, h, i, j) { scale } else { 0.0 })
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::{AttentionShape, DType};

    /// Paged keys are the dense keys gathered from their pages, and a sequence's own count is
    /// the dense problem over its first keys, the causal mask aligned to its end.
    #[test]
    fn paged_and_counted_keys_mean_the_gathered_dense_keys() {
        use crate::problem::cache::PagedKv;
        use crate::problem::Layout;
        let shape = AttentionShape {
            batch: 2,
            seq_q: 3,
            seq_kv: 40,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 8,
        };
        let dense = AttentionProblem::new(shape, DType::F32).with_causal(true);
        let n = |t| dense.required_len(t);
        let q: Vec<f32> = crate::testing::random_tensor(1, n(Tensor::Q));
        let k: Vec<f32> = crate::testing::random_tensor(2, n(Tensor::K));
        let v: Vec<f32> = crate::testing::random_tensor(3, n(Tensor::V));
        // Three pages of 16 per sequence, scattered over a pool of 7 in reverse-interleaved order.
        let pages = PagedKv {
            page_size: 16,
            num_pages: 7,
            pages_per_seq: 3,
        };
        let table: Vec<u32> = vec![5, 0, 3, 6, 2, 4];
        let paged = dense.with_paged_kv(pages, Layout::Bshd).with_kv_lengths(true);
        let row = 2 * 8; // kv_heads · head_dim
        let mut k_pool = vec![f32::NAN; paged.required_len(Tensor::K)];
        let mut v_pool = k_pool.clone();
        for b in 0..2 {
            for j in 0..40 {
                let at = (table[b * 3 + j / 16] as usize * 16 + j % 16) * row;
                let from = (b * 40 + j) * row;
                k_pool[at..at + row].copy_from_slice(&k[from..from + row]);
                v_pool[at..at + row].copy_from_slice(&v[from..from + row]);
            }
        }
        let lens = [40u32, 17];
        let index = BatchIndex {
            page_table: Some(&table),
            kv_lens: Some(&lens),
            ..Default::default()
        };
        let got = attention_indexed(&paged, &q, &k_pool, &v_pool, &index).unwrap();
        for b in 0..2 {
            let mut one = dense;
            one.shape.batch = 1;
            one.shape.seq_kv = lens[b] as usize;
            let one = one.with_layout(Layout::Bshd);
            let take = |x: &[f32], len: usize| x[b * len..(b + 1) * len].to_vec();
            let qb = take(&q, 3 * 4 * 8);
            let kb: Vec<f32> = k[b * 40 * row..][..lens[b] as usize * row].to_vec();
            let vb: Vec<f32> = v[b * 40 * row..][..lens[b] as usize * row].to_vec();
            let want = attention(&one, &qb, &kb, &vb).unwrap();
            assert_eq!(got.out[b * 96..(b + 1) * 96], want.out[..], "sequence {b}");
            assert_eq!(got.lse[b * 12..(b + 1) * 12], want.lse[..], "sequence {b}");
        }
        // The index must match the problem: missing, surplus, out-of-pool or too-long entries.
        let missing = BatchIndex {
            page_table: None,
            kv_lens: Some(&lens),
            ..Default::default()
        };
        assert!(attention_indexed(&paged, &q, &k_pool, &v_pool, &missing).is_err());
        let bad_page = [5u32, 0, 3, 6, 2, 7];
        let index = BatchIndex {
            page_table: Some(&bad_page),
            kv_lens: Some(&lens),
            ..Default::default()
        };
        assert!(attention_indexed(&paged, &q, &k_pool, &v_pool, &index)
            .unwrap_err()
            .to_string()
            .contains("page 7"));
        let long = [41u32, 1];
        let index = BatchIndex {
            page_table: Some(&table),
            kv_lens: Some(&long),
            ..Default::default()
        };
        assert!(attention_indexed(&paged, &q, &k_pool, &v_pool, &index).is_err());
        assert!(
            attention(&paged, &q, &k_pool, &v_pool).is_err(),
            "a paged problem needs its index"
        );
    }

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

    /// A mask means a −∞ bias where it is 0 (any other byte shows the key); with a bias too, the
    /// union is hidden and the bias added elsewhere; an all-visible mask is no mask; the
    /// gradients agree the same way.
    #[test]
    fn a_mask_hides_what_a_minus_infinity_bias_hides() {
        use crate::problem::backward::BackwardProblem;
        use crate::problem::mask::AttentionMask;
        use crate::problem::score_bias::{BiasLayout, ScoreBias};
        let shape = AttentionShape {
            batch: 2,
            seq_q: 5,
            seq_kv: 7,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 8,
        };
        let plain = AttentionProblem::new(shape, DType::F32).with_sinks();
        let n = |t| plain.required_len(t);
        let q: Vec<f32> = crate::testing::random_tensor(1, n(Tensor::Q));
        let k: Vec<f32> = crate::testing::random_tensor(2, n(Tensor::K));
        let v: Vec<f32> = crate::testing::random_tensor(3, n(Tensor::V));
        let sinks = [0.5f32, -1.0, 2.0, 0.0];
        // Per head, shared by the batch; row 1 of head 2 hidden whole.
        let mask = AttentionMask::dense(&plain, false, true);
        let mut rng = crate::testing::Rng::new(9);
        let mut bytes: Vec<u8> = (0..4 * 5 * 7)
            .map(|_| [0u8, 1, 7, 255][(rng.next_u64() % 4) as usize])
            .collect();
        bytes[(2 * 5 + 1) * 7..(2 * 5 + 2) * 7].fill(0);
        let as_bias: Vec<f32> = bytes
            .iter()
            .map(|&m| if m == 0 { f32::NEG_INFINITY } else { 0.0 })
            .collect();
        let bias = ScoreBias {
            dtype: DType::F32,
            layout: BiasLayout::dense(&plain, false, true),
        };
        let masked = plain.with_mask(mask);
        let biased = plain.with_bias(bias);
        let with_mask = BatchIndex {
            mask: Some(&bytes),
            sinks: Some(&sinks),
            ..Default::default()
        };
        let with_bias = BatchIndex {
            bias: Some(crate::problem::score_bias::BiasValues::F32(&as_bias)),
            sinks: Some(&sinks),
            ..Default::default()
        };
        let m = attention_indexed(&masked, &q, &k, &v, &with_mask).unwrap();
        let b = attention_indexed(&biased, &q, &k, &v, &with_bias).unwrap();
        assert_eq!(m.out, b.out);
        assert_eq!(m.lse, b.lse);
        // The hidden row: O = 0, the sink alone in the LSE.
        for batch in 0..2 {
            let row = (batch * 4 + 2) * 5 + 1;
            assert_eq!(m.lse[row], 2.0, "batch {batch}");
            assert!((0..8).all(|x| m.out[masked.o_layout.index(batch, 1, 2, x)] == 0.0));
        }
        let bm = BackwardProblem::new(masked);
        let d_o: Vec<f32> = crate::testing::random_tensor(4, n(Tensor::O));
        let gm = attention_backward_indexed(&bm, &q, &k, &v, &d_o, &with_mask).unwrap();
        let gb = attention_backward_indexed(&BackwardProblem::new(biased), &q, &k, &v, &d_o, &with_bias).unwrap();
        assert_eq!((gm.dq, gm.dk, gm.dv), (gb.dq, gb.dk, gb.dv));

        // Mask and bias together: the mask's zeros hidden, the bias added to the rest.
        let values: Vec<f32> = (0..4 * 5 * 7).map(|x| (x % 5) as f32 * 0.3 - 0.6).collect();
        let both = masked.with_bias(bias);
        let together = BatchIndex {
            bias: Some(crate::problem::score_bias::BiasValues::F32(&values)),
            ..with_mask
        };
        let merged: Vec<f32> = values.iter().zip(&as_bias).map(|(&x, &hidden)| x + hidden).collect();
        let merged_index = BatchIndex {
            bias: Some(crate::problem::score_bias::BiasValues::F32(&merged)),
            ..with_bias
        };
        let t = attention_indexed(&both, &q, &k, &v, &together).unwrap();
        let u = attention_indexed(&biased, &q, &k, &v, &merged_index).unwrap();
        assert_eq!((t.out, t.lse), (u.out, u.lse));

        // A mask that hides nothing is no mask.
        let ones = vec![1u8; 4 * 5 * 7];
        let open = BatchIndex {
            mask: Some(&ones),
            sinks: Some(&sinks),
            ..Default::default()
        };
        let o = attention_indexed(&masked, &q, &k, &v, &open).unwrap();
        let sinks_only = BatchIndex {
            sinks: Some(&sinks),
            ..Default::default()
        };
        let p = attention_indexed(&plain, &q, &k, &v, &sinks_only).unwrap();
        assert_eq!((o.out, o.lse), (p.out, p.lse));
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

// ------------------------------------------------------------------------------------- merge

/// Two partial attention results of the same query rows over disjoint key sets, merged into the
/// result over their union, in float64: for each row `r` of `[batch, num_heads, seq_q]`,
/// `lse = m + ln(exp(lse_a − m) + exp(lse_b − m))` with `m = max(lse_a, lse_b)`, and each of its
/// `head_dim` outputs `o = exp(lse_a − lse)·o_a + exp(lse_b − lse)·o_b`.
///
/// A side whose LSE is −∞ (a row that saw no key of that set) has weight 0 and its O is not
/// read; both −∞ give `o = 0`, `lse = −∞`, as the forward writes a row that sees no key. The
/// merge is exact, commutative (bit for bit, here and in [`merge_attention_states_host`]) and
/// associative up to rounding: cascade (shared-prefix) attention, split-KV decode and results
/// from different devices combine in any order. LSE values are finite or −∞.
///
/// `o_a`, `o_b` are laid out as the problem's `o_layout` says, `lse_a`, `lse_b` are f32
/// `[batch, num_heads, seq_q]` as the forward writes them; only `batch`, `num_heads`, `seq_q`,
/// `head_dim`, the dtype and `o_layout` of `problem` matter. Errors: the problem's validation
/// error, [`Error::DTypeMismatch`](crate::error::Error::DTypeMismatch), or
/// [`Error::InvalidBuffer`](crate::error::Error::InvalidBuffer) for a slice shorter than its tensor.
///
/// ```rust
/// use wgpu_flash_attn::{reference, AttentionProblem, DType};
/// # fn main() -> wgpu_flash_attn::Result<()> {
/// let problem = AttentionProblem::mha(1, 1, 1, 8, DType::F32); // one row of 8
/// let (o_a, o_b) = (vec![1.0f32; 8], vec![4.0f32; 8]);
/// // Side b's keys carry twice side a's softmax mass: weights 1/3 and 2/3.
/// let (lse_a, lse_b) = ([0.0f32], [2f32.ln()]);
/// let r = reference::merge_attention_states(&problem, &o_a, &lse_a, &o_b, &lse_b)?;
/// assert!((r.out[0] - 3.0).abs() < 1e-6 && (r.lse[0] - 3f64.ln()).abs() < 1e-6);
/// # Ok(()) }
/// ```
pub fn merge_attention_states<T: Element>(
    problem: &AttentionProblem,
    o_a: &[T],
    lse_a: &[f32],
    o_b: &[T],
    lse_b: &[f32],
) -> Result<ReferenceOutput> {
    crate::problem::check_merge_inputs(problem, o_a, lse_a, o_b, lse_b)?;
    let s = problem.shape;
    let mut out = host_output("o", problem.required_len(Tensor::O), 0.0)?;
    let mut lse = host_output("lse", problem.lse_len(), f64::NEG_INFINITY)?;
    for b in 0..s.batch {
        for h in 0..s.num_heads {
            for i in 0..s.seq_q {
                let r = (b * s.num_heads + h) * s.seq_q + i;
                let (la, lb) = (lse_a[r] as f64, lse_b[r] as f64);
                let m = la.max(lb);
                if m == f64::NEG_INFINITY {
                    continue; // no key on either side: o = 0, lse = −∞
                }
                let l = m + ((la - m).exp() + (lb - m).exp()).ln();
                lse[r] = l;
                for d in 0..s.head_dim {
                    let at = problem.o_layout.index(b, i, h, d);
                    let mut o = 0.0;
                    // A side with LSE −∞ is skipped, not multiplied by 0: its O is not read.
                    if la != f64::NEG_INFINITY {
                        o += (la - l).exp() * o_a[at].to_f64();
                    }
                    if lb != f64::NEG_INFINITY {
                        o += (lb - l).exp() * o_b[at].to_f64();
                    }
                    out[at] = o;
                }
            }
        }
    }
    Ok(ReferenceOutput { out, lse })
}

/// A merged result on the host: O in the problem's dtype and `o_layout` (elements the layout
/// skips are 0), the LSE f32 `[batch, num_heads, seq_q]`.
#[derive(Clone, Debug, PartialEq)]
pub struct MergedStates<T> {
    /// Laid out as the problem's `o_layout` says (`problem.required_len(Tensor::O)` elements).
    pub out: Vec<T>,
    /// `[batch, num_heads, seq_q]`, natural log; −∞ for rows neither side saw a key for.
    pub lse: Vec<f32>,
}

/// [`merge_attention_states`] on the host without a GPU, returned in the inputs' types: computed
/// in float64 and rounded once, so it is the reference's result rounded, commutative bit for bit,
/// and as exact as the storage type allows. On a GPU, `FlashAttention::merge` (host slices) and
/// `FlashAttention::encode_merge` (the caller's buffers) compute the same in f32. Errors as
/// [`merge_attention_states`].
pub fn merge_attention_states_host<T: Element>(
    problem: &AttentionProblem,
    o_a: &[T],
    lse_a: &[f32],
    o_b: &[T],
    lse_b: &[f32],
) -> Result<MergedStates<T>> {
    let r = merge_attention_states(problem, o_a, lse_a, o_b, lse_b)?;
    Ok(MergedStates {
        out: r.out.into_iter().map(T::from_f64).collect(),
        lse: r.lse.into_iter().map(|x| x as f32).collect(),
    })
}

// ---------------------------------------------------------------------------------- backward

/// Reference gradients of a whole problem.
#[derive(Clone, Debug)]
pub struct ReferenceGrads {
    /// Laid out as the problem's `dq_layout` says (elements no gradient maps to are 0).
    pub dq: Vec<f64>,
    /// Laid out as `dk_layout` says; summed over the query heads that share each K/V head.
    pub dk: Vec<f64>,
    /// Laid out as `dv_layout` says; summed likewise.
    pub dv: Vec<f64>,
    /// `[num_heads]` `dL/ds_h` of the sink logits (src/problem/head_terms.rs); empty without
    /// sinks.
    pub d_sinks: Vec<f64>,
    /// `dL/d(bias)` of the score bias, laid out as the problem's
    /// [`d_bias_layout`](BackwardProblem::d_bias_layout) says (summed over the dimensions the bias
    /// broadcasts); empty unless the problem asks for it
    /// ([`with_bias_grad`](BackwardProblem::with_bias_grad)).
    pub d_bias: Vec<f64>,
}

/// The gradients of a loss `L` with respect to Q, K and V, given `d_o = dL/dO` (laid out as
/// `problem.d_o_layout` says), in float64 by the analytic formulas, row by row:
///
/// `P = softmax(scale·QKᵀ)` (recomputed here, not read from a forward), `dV = Pᵀ·dO`,
/// `dP = dO·Vᵀ`, `dS = P ∘ (dP − rowsum(P ∘ dP))`, `dQ = scale·dS·K`, `dK = scale·dSᵀ·Q`; with
/// sinks, P includes the sink's column (which has no value row) and `dL/ds_h` sums
/// `−P_sink · rowsum(P ∘ dP)` over the head's rows. ALiBi's bias is a constant of the scores: it
/// changes P, not the chain rule. The score bias is added to the logits after the cap, so its
/// gradient is `P ∘ (dP − rowsum(P ∘ dP))` without the cap's slope, summed over the batch entries
/// and heads it broadcasts to (when the problem asks for it). With dropout (mask `Z` of
/// [`Dropout::mask`](crate::problem::Dropout::mask), `r = 1/(1 − p)`), the forward is
/// `O = (P ∘ Z·r)·V`: `dV = (P ∘ Z·r)ᵀ·dO` and `dP = (dO·Vᵀ) ∘ Z·r`, the rest unchanged
/// (`rowsum(P ∘ dP)` is still `rowsum(dO ∘ O)`, and the bias's gradient takes this dP).
///
/// A query row that sees no key (causal, `seq_q > seq_kv`) has a constant zero output, so its
/// gradients are zero. Costs `O(B·H·Sq·Skv·D)` on one core, like [`attention`]; use
/// [`attention_backward_dq_row`] to spot-check large problems.
pub fn attention_backward<T: Element>(
    problem: &BackwardProblem,
    q: &[T],
    k: &[T],
    v: &[T],
    d_o: &[T],
) -> Result<ReferenceGrads> {
    attention_backward_indexed(problem, q, k, v, d_o, &BatchIndex::default())
}

/// [`attention_backward`] for a packed batch ([`AttentionProblem::with_varlen`]): each
/// sequence's gradients as if it were a problem of its own; rows past the last sequence are 0.
pub fn attention_backward_indexed<T: Element>(
    problem: &BackwardProblem,
    q: &[T],
    k: &[T],
    v: &[T],
    d_o: &[T],
    index: &BatchIndex<'_>,
) -> Result<ReferenceGrads> {
    check_backward_inputs(problem, q, k, v, d_o)?;
    let f = &problem.forward;
    index.validate(f)?;
    let s = f.shape;
    let mut grads = ReferenceGrads {
        dq: host_output("dq", problem.required_len(GradTensor::DQ), 0.0)?,
        dk: host_output("dk", problem.required_len(GradTensor::DK), 0.0)?,
        dv: host_output("dv", problem.required_len(GradTensor::DV), 0.0)?,
        d_sinks: vec![0.0; if f.sinks { s.num_heads } else { 0 }],
        d_bias: host_output("d_bias", problem.d_bias_len(), 0.0)?,
    };
    let d_bias_layout = problem.d_bias_layout();
    for b in 0..s.batch {
        let rows = index.sequence(f, b);
        for h in 0..s.num_heads {
            let terms = head_terms(f, index, h);
            for i in 0..rows.seq_q {
                let row = backward_row(problem, q, k, v, d_o, b, &rows, h, i, terms, (index.bias, index.mask));
                if f.sinks {
                    grads.d_sinks[h] += row.d_sink;
                }
                if let Some(l) = d_bias_layout {
                    let at = l.offset + b * l.batch_stride + h * l.head_stride + i * l.row_stride + row.first_key;
                    for (g, d) in grads.d_bias[at..].iter_mut().zip(&row.d_logits) {
                        *g += d;
                    }
                }
                let kv_head = h / f.group_size();
                for (x, g) in row.dq.iter().enumerate() {
                    grads.dq[problem.dq_layout.index(b, rows.q_first + i, h, x)] = *g;
                }
                for (j, (dk_j, dv_j)) in row.dk.iter().zip(&row.dv).enumerate() {
                    let key = rows.kv_first + row.first_key + j;
                    for x in 0..s.head_dim {
                        grads.dk[problem.dk_layout.index(b, key, kv_head, x)] += dk_j[x];
                        grads.dv[problem.dv_layout.index(b, key, kv_head, x)] += dv_j[x];
                    }
                }
            }
        }
    }
    Ok(grads)
}

/// The reference dQ of query row `i` of head `h` in batch `b` (`head_dim` values).
#[allow(clippy::too_many_arguments)]
pub fn attention_backward_dq_row<T: Element>(
    problem: &BackwardProblem,
    q: &[T],
    k: &[T],
    v: &[T],
    d_o: &[T],
    b: usize,
    h: usize,
    i: usize,
) -> Result<Vec<f64>> {
    attention_backward_row_indexed(problem, q, k, v, d_o, &BatchIndex::default(), b, h, i).map(|r| r.dq)
}

/// One query row's reference gradients ([`attention_backward_row_indexed`]).
#[derive(Clone, Debug)]
pub struct ReferenceGradRow {
    /// `head_dim` values of dQ.
    pub dq: Vec<f64>,
    /// `dL/dz` of the row's logits, one per key of its sequence (0 for keys it does not see):
    /// the row's term of the score bias's gradient.
    pub d_logits: Vec<f64>,
}

/// The reference gradients of query row `i` of head `h` in batch entry `b`, with the per-head and
/// bias tensors (and a packed batch's offsets) `index` gives: a spot check of large problems.
#[allow(clippy::too_many_arguments)]
pub fn attention_backward_row_indexed<T: Element>(
    problem: &BackwardProblem,
    q: &[T],
    k: &[T],
    v: &[T],
    d_o: &[T],
    index: &BatchIndex<'_>,
    b: usize,
    h: usize,
    i: usize,
) -> Result<ReferenceGradRow> {
    check_backward_inputs(problem, q, k, v, d_o)?;
    let f = &problem.forward;
    index.validate(f)?;
    let s = f.shape;
    let outside = || crate::error::invalid!("reference row (b {b}, h {h}, i {i}) is outside the problem");
    if b >= s.batch || h >= s.num_heads {
        return outside();
    }
    let rows = index.sequence(f, b);
    if i >= rows.seq_q {
        return outside();
    }
    let terms = head_terms(f, index, h);
    let row = backward_row(problem, q, k, v, d_o, b, &rows, h, i, terms, (index.bias, index.mask));
    let mut d_logits = vec![0.0; rows.seq_kv];
    d_logits[row.first_key..row.first_key + row.d_logits.len()].copy_from_slice(&row.d_logits);
    Ok(ReferenceGradRow { dq: row.dq, d_logits })
}

fn check_backward_inputs<T: Element>(problem: &BackwardProblem, q: &[T], k: &[T], v: &[T], d_o: &[T]) -> Result<()> {
    // The gradients are defined here for K/V at their layouts (no pages, no counts).
    let f = &problem.forward;
    if !f.kv_cache.is_plain() {
        return crate::error::invalid!("the backward reference does not cover a K/V cache (pages or key counts)");
    }
    problem.validate()?;
    check_inputs(&problem.forward, q, k, v)?;
    check_holds([(GradTensor::DO.name(), d_o.len(), problem.required_len(GradTensor::DO))])
}

/// What one query row contributes: its dQ row, and its terms of the dK and dV rows of the keys
/// it sees (`dk[j]`, `dv[j]` for the `j`-th of them).
struct BackwardRow {
    dq: Vec<f64>,
    /// The first key the row sees: `dk[j]` and `dv[j]` belong to key `first_key + j`.
    first_key: usize,
    dk: Vec<Vec<f64>>,
    dv: Vec<Vec<f64>>,
    /// The row's term of its head's sink gradient (0 without sinks).
    d_sink: f64,
    /// `dL/dz` of the logits `z` of the keys it sees (`first_key + j`), after the cap: the score
    /// bias's gradient at the row.
    d_logits: Vec<f64>,
}

#[allow(clippy::too_many_arguments)]
fn backward_row<T: Element>(
    problem: &BackwardProblem,
    q: &[T],
    k: &[T],
    v: &[T],
    d_o: &[T],
    b: usize,
    rows: &SequenceRows,
    h: usize,
    i: usize,
    (alibi_slope, sink): (f64, Option<f64>),
    (bias, mask): (Option<BiasValues<'_>>, Option<&[u8]>),
) -> BackwardRow {
    let f = &problem.forward;
    let d = f.shape.head_dim;
    let kv_head = h / f.group_size();
    let scale = f.softmax_scale() as f64;
    let visible = f.visible_keys(i, rows.seq_q, rows.seq_kv);
    let (qi_row, kv0) = (rows.q_first + i, rows.kv_first);
    let qi: Vec<f64> = (0..d).map(|x| q[f.q_layout.index(b, qi_row, h, x)].to_f64()).collect();
    let doi: Vec<f64> = (0..d)
        .map(|x| d_o[problem.d_o_layout.index(b, qi_row, h, x)].to_f64())
        .collect();
    let key = |j: usize| -> Vec<f64> {
        (0..d)
            .map(|x| k[f.k_layout.index(b, kv0 + j, kv_head, x)].to_f64())
            .collect()
    };
    let value = |j: usize| -> Vec<f64> {
        (0..d)
            .map(|x| v[f.v_layout.index(b, kv0 + j, kv_head, x)].to_f64())
            .collect()
    };
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();

    let keys: Vec<Vec<f64>> = visible.clone().map(key).collect();
    let values: Vec<Vec<f64>> = visible.clone().map(value).collect();
    // y = cap·tanh(x / cap) of x = scale·q·k with a soft-cap: its slope dy/dx = 1 − (y / cap)²
    // carries dS back from the capped scores to the products.
    let cap = f.softcap.map(f64::from);
    let capped: Vec<f64> = keys
        .iter()
        .map(|kj| {
            let x = scale * dot(&qi, kj);
            cap.map_or(x, |cap| cap * (x / cap).tanh())
        })
        .collect();
    let slope = |y: f64| cap.map_or(1.0, |cap| 1.0 - (y / cap) * (y / cap));
    let position = i as f64 + rows.seq_kv as f64 - rows.seq_q as f64;
    let scores: Vec<f64> = capped
        .iter()
        .zip(visible.clone())
        .map(|(y, j)| match score_terms(f, bias, mask, b, h, i, j) {
            f64::NEG_INFINITY => f64::NEG_INFINITY, // hidden: its product is not read
            terms => y - alibi_slope * (position - j as f64).abs() + terms,
        })
        .collect();
    // A row whose keys a −∞ bias or the mask all hides, without a sink, has no gradient (as one
    // without keys).
    let max = scores
        .iter()
        .cloned()
        .chain(sink)
        .fold(f64::NEG_INFINITY, f64::max)
        .max(f64::MIN);
    let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
    let sink_weight = sink.map_or(0.0, |s| (s - max).exp());
    let sum: f64 = weights.iter().sum::<f64>() + sink_weight;
    let p: Vec<f64> = weights.iter().map(|w| if sum > 0.0 { w / sum } else { 0.0 }).collect();
    // Dropout: O = (P ∘ Z·r) V, so the gradient reaching P is dP = (dO·vⱼ) Zⱼ r, and dV takes the
    // dropped-out P (factors 1 without dropout).
    let kept = dropout_factors(f, b, h, i, visible.clone());
    let dp: Vec<f64> = values.iter().zip(&kept).map(|(vj, z)| dot(&doi, vj) * z).collect();
    // rowsum(P ∘ dP) = dO · O (the sink's column has dP = 0).
    let delta: f64 = p.iter().zip(&dp).map(|(p, dp)| p * dp).sum();
    // dL/dz of the logits, then dS through the cap's slope.
    let d_logits: Vec<f64> = p.iter().zip(&dp).map(|(p, dp)| p * (dp - delta)).collect();
    let ds: Vec<f64> = d_logits.iter().zip(&capped).map(|(dz, y)| dz * slope(*y)).collect();
    // A row that sees no key has sum = e^{s − s} = 1 and delta 0: no gradient.
    let d_sink = if sum > 0.0 { -(sink_weight / sum) * delta } else { 0.0 };

    let mut dq = vec![0.0; d];
    for (dsj, kj) in ds.iter().zip(&keys) {
        for x in 0..d {
            dq[x] += scale * dsj * kj[x];
        }
    }
    BackwardRow {
        dq,
        first_key: visible.start,
        dk: ds
            .iter()
            .map(|dsj| qi.iter().map(|qx| scale * dsj * qx).collect())
            .collect(),
        dv: p
            .iter()
            .zip(&kept)
            .map(|(pj, z)| doi.iter().map(|g| pj * z * g).collect())
            .collect(),
        d_sink,
        d_logits,
    }
}

#[cfg(test)]
mod backward_tests {
    use super::*;
    use crate::problem::{AttentionProblem, AttentionShape, DType, Layout, Tensor};
    use crate::testing::Rng;

    /// f64 in the reference's `Element` interface, so that finite differences are taken in full
    /// precision through the forward reference itself.
    #[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
    #[repr(transparent)]
    struct F64(f64);

    impl Element for F64 {
        const DTYPE: DType = DType::F32;
        fn to_f64(self) -> f64 {
            self.0
        }
        fn from_f64(v: f64) -> Self {
            F64(v)
        }
    }

    fn random(rng: &mut Rng, n: usize) -> Vec<F64> {
        (0..n).map(|_| F64(rng.normal())).collect()
    }

    /// L = Σ dO ∘ O over the output elements, O from the forward reference.
    fn loss(p: &BackwardProblem, index: &BatchIndex<'_>, [q, k, v, d_o]: [&[F64]; 4]) -> f64 {
        let f = &p.forward;
        let s = f.shape;
        let out = attention_indexed(f, q, k, v, index).unwrap().out;
        let mut l = 0.0;
        for b in 0..s.batch {
            for i in 0..s.seq_q {
                for h in 0..s.num_heads {
                    for x in 0..s.head_dim {
                        l += d_o[p.d_o_layout.index(b, i, h, x)].0 * out[f.o_layout.index(b, i, h, x)];
                    }
                }
            }
        }
        l
    }

    /// The analytic gradient against central differences of the forward reference, for every
    /// element of Q, K and V: catches a wrong formula, scale, GQA sum, mask or layout in the
    /// reference itself, so that it cannot be wrong the same way as a kernel.
    fn check_against_finite_differences(p: BackwardProblem, seed: u64) {
        let f = &p.forward;
        let mut rng = Rng::new(seed);
        let heads = f.shape.num_heads;
        let slopes: Vec<f32> = (0..heads).map(|_| 0.1 + 0.4 * rng.uniform() as f32).collect();
        let sinks: Vec<f32> = (0..heads).map(|_| rng.normal() as f32).collect();
        let mut q = random(&mut rng, f.required_len(Tensor::Q));
        let mut k = random(&mut rng, f.required_len(Tensor::K));
        let mut v = random(&mut rng, f.required_len(Tensor::V));
        let d_o = random(&mut rng, p.required_len(GradTensor::DO));
        let index = head_index(f, &slopes, &sinks);
        let grads = attention_backward_indexed(&p, &q, &k, &v, &d_o, &index).unwrap();
        // Each sink against a central difference taken in f32 steps (the tensor's type).
        for h in 0..if f.sinks { heads } else { 0 } {
            let at = |by: f32| {
                let mut nudged = sinks.clone();
                nudged[h] += by;
                (
                    nudged[h] as f64,
                    loss(&p, &head_index(f, &slopes, &nudged), [&q, &k, &v, &d_o]),
                )
            };
            let ((s_up, up), (s_down, down)) = (at(1e-3), at(-1e-3));
            let fd = (up - down) / (s_up - s_down);
            let an = grads.d_sinks[h];
            assert!(
                (fd - an).abs() / (1.0 + an.abs()) < 1e-5,
                "d_sinks[{h}]: analytic {an}, finite difference {fd}"
            );
        }
        let h = 1e-5;
        let mut worst = 0.0f64;
        for (name, which) in [("q", 0), ("k", 1), ("v", 2)] {
            let (tensor, layout, want) = match which {
                0 => (Tensor::Q, p.dq_layout, &grads.dq),
                1 => (Tensor::K, p.dk_layout, &grads.dk),
                _ => (Tensor::V, p.dv_layout, &grads.dv),
            };
            let (seq, heads) = f.extent(tensor);
            for b in 0..f.shape.batch {
                for s in 0..seq {
                    for hh in 0..heads {
                        for x in 0..f.shape.head_dim {
                            let at = f.layout(tensor).index(b, s, hh, x);
                            let nudge = |q: &mut Vec<F64>, k: &mut Vec<F64>, v: &mut Vec<F64>, by: f64| {
                                let t = match which {
                                    0 => q,
                                    1 => k,
                                    _ => v,
                                };
                                t[at].0 += by;
                            };
                            nudge(&mut q, &mut k, &mut v, h);
                            let up = loss(&p, &index, [&q, &k, &v, &d_o]);
                            nudge(&mut q, &mut k, &mut v, -2.0 * h);
                            let down = loss(&p, &index, [&q, &k, &v, &d_o]);
                            nudge(&mut q, &mut k, &mut v, h);
                            let fd = (up - down) / (2.0 * h);
                            let an = want[layout.index(b, s, hh, x)];
                            let err = (fd - an).abs() / (1.0 + an.abs());
                            worst = worst.max(err);
                            assert!(
                                err < 1e-7,
                                "d{name}[b{b} s{s} h{hh} d{x}]: analytic {an}, finite difference {fd}"
                            );
                        }
                    }
                }
            }
        }
        assert!(worst > 0.0 || f.shape.seq_kv == 0);
    }

    /// The per-head tensors `f` asks for, from `slopes` and `sinks`.
    fn head_index<'a>(f: &AttentionProblem, slopes: &'a [f32], sinks: &'a [f32]) -> BatchIndex<'a> {
        BatchIndex {
            alibi_slopes: f.has_alibi_tensor().then_some(slopes),
            sinks: f.sinks.then_some(sinks),
            ..BatchIndex::default()
        }
    }

    fn shape(batch: usize, seq_q: usize, seq_kv: usize, heads: usize, kv_heads: usize, d: usize) -> AttentionShape {
        AttentionShape {
            batch,
            seq_q,
            seq_kv,
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim: d,
        }
    }

    #[test]
    fn gradients_match_finite_differences() {
        // GQA (2 query heads per K/V head), causal with seq_q < seq_kv.
        let p = AttentionProblem::new(shape(1, 3, 5, 4, 2, 8), DType::F32).with_causal(true);
        check_against_finite_differences(p.into(), 1);
        // seq_q > seq_kv, causal: the first rows see no key.
        let p = AttentionProblem::new(shape(2, 4, 2, 2, 1, 8), DType::F32).with_causal(true);
        check_against_finite_differences(p.into(), 2);
        // Not causal, custom scale, [b, h, s, d] inputs and gradients in yet another layout.
        let f = AttentionProblem::new(shape(2, 3, 4, 2, 2, 8), DType::F32)
            .with_scale(0.7)
            .with_layout(Layout::Bhsd);
        let p = BackwardProblem::new(f)
            .with_grad_layout(GradTensor::DQ, padded_layout(&f, Tensor::Q))
            .with_grad_layout(GradTensor::DK, padded_layout(&f, Tensor::K));
        check_against_finite_differences(p, 3);
        // A sliding window (left 1, right 2) and a soft-cap, not causal; then causal with a window.
        let p = AttentionProblem::new(shape(1, 4, 6, 2, 1, 8), DType::F32)
            .with_window(Some(1), Some(2))
            .with_softcap(0.8);
        check_against_finite_differences(p.into(), 4);
        let p = AttentionProblem::new(shape(2, 5, 5, 2, 2, 8), DType::F32)
            .with_causal(true)
            .with_window(Some(2), None)
            .with_softcap(1.5);
        check_against_finite_differences(p.into(), 5);
        // ALiBi (per-head slopes, then geometric) with sinks, GQA, causal with seq_q > seq_kv
        // (rows that see only the sink), a window and a cap.
        let p = AttentionProblem::new(shape(1, 5, 3, 4, 2, 8), DType::F32)
            .with_causal(true)
            .with_alibi_slopes()
            .with_sinks();
        check_against_finite_differences(p.into(), 6);
        let p = AttentionProblem::new(shape(2, 4, 6, 3, 3, 8), DType::F32)
            .with_window(Some(2), Some(1))
            .with_softcap(2.0)
            .with_geometric_alibi()
            .with_sinks();
        check_against_finite_differences(p.into(), 7);
        // Dropout (p = 0.3): plain with GQA and causal; then with sinks, ALiBi, a window and a cap.
        let dropout = crate::problem::Dropout {
            p: 0.3,
            seed: 5,
            offset: 9,
        };
        let p = AttentionProblem::new(shape(2, 5, 6, 4, 2, 8), DType::F32)
            .with_causal(true)
            .with_dropout(dropout);
        check_against_finite_differences(p.into(), 8);
        let p = AttentionProblem::new(shape(1, 5, 7, 2, 1, 8), DType::F32)
            .with_window(Some(3), Some(1))
            .with_softcap(2.0)
            .with_alibi_slopes()
            .with_sinks()
            .with_dropout(dropout);
        check_against_finite_differences(p.into(), 9);
    }

    /// Dropout in the forward reference: LSE untouched, the output a mix of the kept values scaled
    /// by 1/(1 − p) (with V one-hot per key, each output column is one key's kept weight, so the
    /// mask can be read off the output).
    #[test]
    fn dropout_keeps_the_lse_and_drops_the_masked_weights() {
        let (seq_q, seq_kv) = (6, 8);
        let plain = AttentionProblem::new(shape(2, seq_q, seq_kv, 2, 1, seq_kv), DType::F32).with_causal(true);
        let dropout = crate::problem::Dropout {
            p: 0.5,
            seed: 3,
            offset: 1,
        };
        let p = plain.with_dropout(dropout);
        let mut rng = Rng::new(4);
        let q = random(&mut rng, p.required_len(Tensor::Q));
        let k = random(&mut rng, p.required_len(Tensor::K));
        // V of key j is the unit vector e_j: output column j is key j's weight in the row.
        let v: Vec<F64> = (0..p.required_len(Tensor::V))
            .map(|e| F64(f64::from(e % seq_kv == e / seq_kv % seq_kv)))
            .collect();
        let (with, without) = (
            attention(&p, &q, &k, &v).unwrap(),
            attention(&plain, &q, &k, &v).unwrap(),
        );
        assert_eq!(with.lse, without.lse);
        for b in 0..2 {
            for h in 0..2 {
                let mask = dropout.mask(b, h, seq_q, seq_kv);
                for i in 0..seq_q {
                    for j in 0..seq_kv {
                        let at = p.o_layout.index(b, i, h, j);
                        let want = if mask[i * seq_kv + j] {
                            2.0 * without.out[at]
                        } else {
                            0.0
                        };
                        assert!((with.out[at] - want).abs() < 1e-15, "b{b} h{h} ({i}, {j})");
                    }
                }
            }
        }
    }

    /// The reference's `dL/d(bias)` against central differences of the forward reference, for
    /// every bias element the problem reads (each one summed over the batch entries and heads it
    /// broadcasts to): catches a missing `D` term, the cap's slope applied where it does not
    /// belong, a sum over the wrong dimensions. The bias is f32 (a normal spread of 1), with
    /// every `hidden`-th element −∞, whose gradient must be exactly 0; the other per-head
    /// tensors as the problem asks.
    fn check_bias_gradient(
        f: AttentionProblem,
        layout: crate::problem::score_bias::BiasLayout,
        hidden: usize,
        seed: u64,
    ) {
        use crate::problem::score_bias::ScoreBias;
        let f = f.with_bias(ScoreBias {
            dtype: DType::F32,
            layout,
        });
        let p = BackwardProblem::new(f).with_bias_grad(true);
        let mut rng = Rng::new(seed);
        let heads = f.shape.num_heads;
        let slopes: Vec<f32> = (0..heads).map(|_| 0.1 + 0.4 * rng.uniform() as f32).collect();
        let sinks: Vec<f32> = (0..heads).map(|_| rng.normal() as f32).collect();
        let q = random(&mut rng, f.required_len(Tensor::Q));
        let k = random(&mut rng, f.required_len(Tensor::K));
        let v = random(&mut rng, f.required_len(Tensor::V));
        let d_o = random(&mut rng, p.required_len(GradTensor::DO));
        let len = f.bias.unwrap().required_len(&f).unwrap();
        let mut bias: Vec<f32> = (0..len)
            .map(|e| {
                let x = rng.normal() as f32;
                if hidden > 0 && e % hidden == 1 {
                    f32::NEG_INFINITY
                } else {
                    x
                }
            })
            .collect();
        fn with_bias<'a>(index: BatchIndex<'a>, bias: &'a [f32]) -> BatchIndex<'a> {
            BatchIndex {
                bias: Some(BiasValues::F32(bias)),
                ..index
            }
        }
        let terms = head_index(&f, &slopes, &sinks);
        let grads = attention_backward_indexed(&p, &q, &k, &v, &d_o, &with_bias(terms, &bias)).unwrap();
        let d = p.d_bias_layout().unwrap();
        let (nb, nh) = p.d_bias_extent().unwrap();
        assert_eq!(grads.d_bias.len(), nb * nh * f.shape.seq_q * f.shape.seq_kv);
        let s = f.shape;
        let mut nonzero = 0;
        for b in 0..nb {
            for h in 0..nh {
                for i in 0..s.seq_q {
                    for j in 0..s.seq_kv {
                        let at = layout.offset
                            + b * layout.batch_stride
                            + h * layout.head_stride
                            + i * layout.row_stride
                            + j;
                        let an = grads.d_bias[d.offset + b * d.batch_stride + h * d.head_stride + i * d.row_stride + j];
                        if bias[at] == f32::NEG_INFINITY {
                            assert_eq!(an, 0.0, "d_bias[b{b} h{h} i{i} j{j}] of a hidden key");
                            continue;
                        }
                        let original = bias[at];
                        let mut at_step = |by: f32| {
                            bias[at] = original + by;
                            let x = bias[at] as f64;
                            let l = loss(&p, &with_bias(terms, &bias), [&q, &k, &v, &d_o]);
                            bias[at] = original;
                            (x, l)
                        };
                        let ((x_up, up), (x_down, down)) = (at_step(1e-3), at_step(-1e-3));
                        let fd = (up - down) / (x_up - x_down);
                        assert!(
                            (fd - an).abs() / (1.0 + an.abs()) < 1e-5,
                            "d_bias[b{b} h{h} i{i} j{j}]: analytic {an}, finite difference {fd}"
                        );
                        nonzero += (an != 0.0) as usize;
                    }
                }
            }
        }
        assert!(nonzero > 0, "every gradient is 0: the check checked nothing");
    }

    #[test]
    fn bias_gradient_matches_finite_differences() {
        use crate::problem::score_bias::BiasLayout;
        // Per batch entry and head, rows padded, an offset; GQA, causal with seq_q < seq_kv.
        let f = AttentionProblem::new(shape(2, 3, 5, 4, 2, 8), DType::F32).with_causal(true);
        let padded = BiasLayout {
            offset: 2,
            row_stride: 7,
            head_stride: 3 * 7,
            batch_stride: 4 * 3 * 7 + 1,
        };
        check_bias_gradient(f, padded, 0, 11);
        // Broadcast over the batch (T5's relative position bias), with a soft-cap and a window;
        // −∞ entries.
        let f = AttentionProblem::new(shape(2, 4, 6, 2, 1, 8), DType::F32)
            .with_window(Some(1), Some(2))
            .with_softcap(0.8);
        check_bias_gradient(f, BiasLayout::dense(&f, false, true), 5, 12);
        // Broadcast over the heads, ALiBi slopes and sinks, causal with seq_q > seq_kv (rows that
        // see only the sink).
        let f = AttentionProblem::new(shape(2, 5, 3, 3, 3, 8), DType::F32)
            .with_causal(true)
            .with_alibi_slopes()
            .with_sinks();
        check_bias_gradient(f, BiasLayout::dense(&f, true, false), 0, 13);
        // One bias for everything, geometric ALiBi, a cap, −∞ entries: some rows hidden whole.
        let f = AttentionProblem::new(shape(2, 4, 4, 2, 2, 8), DType::F32)
            .with_softcap(2.0)
            .with_geometric_alibi();
        check_bias_gradient(f, BiasLayout::dense(&f, false, false), 3, 14);
    }

    /// With dropout the bias's gradient is `P ∘ (dP − D)` with the dropped-out `dP = (dO·Vᵀ) ∘ Z·r`
    /// (a dropped key still has a gradient, `−P·D`, through the row's softmax): the reference's
    /// against central differences, per batch entry and head and broadcast, with the variants.
    #[test]
    fn bias_gradient_with_dropout_matches_finite_differences() {
        use crate::problem::score_bias::BiasLayout;
        let dropout = crate::problem::Dropout {
            p: 0.4,
            seed: 21,
            offset: 3,
        };
        let f = AttentionProblem::new(shape(2, 5, 6, 4, 2, 8), DType::F32)
            .with_causal(true)
            .with_dropout(dropout);
        check_bias_gradient(f, BiasLayout::dense(&f, true, true), 4, 15);
        let f = AttentionProblem::new(shape(2, 4, 7, 2, 1, 8), DType::F32)
            .with_window(Some(2), Some(1))
            .with_softcap(1.5)
            .with_alibi_slopes()
            .with_sinks()
            .with_dropout(dropout);
        check_bias_gradient(f, BiasLayout::dense(&f, false, true), 0, 16);
        check_bias_gradient(f, BiasLayout::dense(&f, false, false), 5, 17);
    }

    /// A `[batch, seq, heads, head_dim]` layout with 4 unused elements after each row and 8
    /// before the tensor.
    fn padded_layout(f: &AttentionProblem, t: Tensor) -> crate::problem::TensorLayout {
        let (seq, heads) = f.extent(t);
        let d = f.shape.head_dim;
        crate::problem::TensorLayout {
            offset: 8,
            batch_stride: seq * heads * (d + 4),
            seq_stride: heads * (d + 4),
            head_stride: d + 4,
        }
    }

    #[test]
    fn rows_that_see_no_key_have_zero_gradients_and_the_rest_sum_over_the_group() {
        let p: BackwardProblem = AttentionProblem::new(shape(1, 3, 1, 2, 1, 8), DType::F32)
            .with_causal(true)
            .into();
        let mut rng = Rng::new(7);
        let q = random(&mut rng, 3 * 2 * 8);
        let k = random(&mut rng, 8);
        let v = random(&mut rng, 8);
        let d_o = random(&mut rng, 3 * 2 * 8);
        let g = attention_backward(&p, &q, &k, &v, &d_o).unwrap();
        // Rows 0 and 1 of both heads see nothing; row 2 sees the single key, whose softmax weight
        // is 1 whatever the score: dQ = dK = 0 and dV = the sum of the two heads' dO rows.
        assert!(g.dq.iter().all(|&x| x == 0.0));
        assert!(g.dk.iter().all(|&x| x == 0.0));
        for x in 0..8 {
            let want = d_o[p.d_o_layout.index(0, 2, 0, x)].0 + d_o[p.d_o_layout.index(0, 2, 1, x)].0;
            assert!((g.dv[x] - want).abs() < 1e-12);
        }
    }
}
