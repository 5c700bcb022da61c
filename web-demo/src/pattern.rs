//! One head's attention pattern, for the page to draw. The flash kernel never forms the
//! probabilities; they are recomputed here from Q, K and the LSE it returned,
//! `p_ij = exp(scale·q_i·k_j − lse_i)`, so a wrong LSE shows as rows that do not sum to 1.

use serde::Serialize;
use wgpu_flash_attn::{AttentionProblem, Element};

/// At most this many rows and columns are drawn: every query row and key up to this length,
/// evenly spaced rows and blocks of keys beyond it.
const MAX_CELLS: usize = 128;

#[derive(Serialize)]
pub struct Pattern {
    /// Batch 0's query head `head` (clamped to the problem's heads).
    pub head: usize,
    /// Query index of each drawn row.
    pub rows: Vec<usize>,
    /// Keys summed in each column: a cell is the attention mass `Σ p_ij` of its block of keys,
    /// so each drawn row still sums to 1.
    pub keys_per_column: usize,
    pub columns: usize,
    /// `rows.len() × columns`, row-major; −1 where the causal mask hides every key of the cell.
    pub mass: Vec<f32>,
    /// Largest `|Σ_j p_ij − 1|` over the drawn rows that see a key.
    pub max_row_sum_error: f64,
}

impl Pattern {
    pub fn new<T: Element>(problem: &AttentionProblem, q: &[T], k: &[T], lse: &[f32], head: usize) -> Self {
        let s = problem.shape;
        let head = head.min(s.num_heads - 1);
        let kv_head = head / problem.group_size();
        let scale = f64::from(problem.softmax_scale());
        let drawn = s.seq_q.min(MAX_CELLS);
        let rows: Vec<usize> = (0..drawn).map(|r| r * s.seq_q / drawn).collect();
        let keys_per_column = s.seq_kv.div_ceil(MAX_CELLS);
        let columns = s.seq_kv.div_ceil(keys_per_column);

        let mut mass = vec![-1.0f32; rows.len() * columns];
        let mut max_row_sum_error = 0.0f64;
        for (cells, &i) in mass.chunks_mut(columns).zip(&rows) {
            // The library's bottom-right aligned causal mask: query i sees keys 0 ..= i + seq_kv − seq_q.
            let visible = if problem.causal {
                (i as i64 + problem.causal_offset() + 1).clamp(0, s.seq_kv as i64) as usize
            } else {
                s.seq_kv
            };
            let lse_i = f64::from(lse[head * s.seq_q + i]);
            let q_i: Vec<f64> = (0..s.head_dim)
                .map(|d| q[problem.q_layout.index(0, i, head, d)].to_f64())
                .collect();
            let mut sum = 0.0;
            for j in 0..visible {
                let k_j = problem.k_layout.index(0, j, kv_head, 0);
                let score = scale
                    * q_i
                        .iter()
                        .enumerate()
                        .map(|(d, x)| x * k[k_j + d].to_f64())
                        .sum::<f64>();
                let p = (score - lse_i).exp();
                let cell = &mut cells[j / keys_per_column];
                *cell = cell.max(0.0) + p as f32;
                sum += p;
            }
            if visible > 0 {
                let error = (sum - 1.0).abs();
                // A NaN (from a NaN LSE) must stick, and `f64::max` would drop it.
                max_row_sum_error = if error.is_nan() || max_row_sum_error.is_nan() {
                    f64::NAN
                } else {
                    max_row_sum_error.max(error)
                };
            }
        }
        Pattern {
            head,
            rows,
            keys_per_column,
            columns,
            mass,
            max_row_sum_error,
        }
    }
}
