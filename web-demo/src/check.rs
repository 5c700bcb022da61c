//! Is the flash result right? Compared with the float64 CPU reference (every row when that is
//! cheap, evenly spaced rows otherwise) and, element by element, with the naive kernel.

use serde::Serialize;
use wgpu_flash_attn::testing::ErrorStats;
use wgpu_flash_attn::{reference, AttentionOutput, AttentionProblem, DType, Element};

/// Multiply-adds the float64 reference may spend: about a tenth of a second of wasm. Problems
/// larger than this are checked on evenly spaced rows (never fewer than [`MIN_ROWS`]).
const REFERENCE_BUDGET: usize = 1 << 25;
const MIN_ROWS: usize = 32;

/// Error bounds against the float64 reference: the library's (`harness::tolerance`, which is not
/// built for wasm32 because it times with `std::time::Instant`).
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Tolerance {
    pub out_rel_l2: f64,
    pub out_max_abs: f64,
    pub lse_max_abs: f64,
}

impl Tolerance {
    pub fn of(dtype: DType) -> Self {
        // f32 accumulates in f32 with the GPU's exp2; f16/bf16 outputs are rounded to 2⁻¹¹ and
        // 2⁻⁸ relative. A kernel off by one key, row or mask position misses by far more.
        let (out_rel_l2, out_max_abs, lse_max_abs) = match dtype {
            DType::F32 => (1e-5, 1e-4, 1e-4),
            DType::F16 => (1e-2, 1.5e-2, 2e-3),
            DType::BF16 => (1e-2, 4e-2, 2e-3),
        };
        Tolerance {
            out_rel_l2,
            out_max_abs,
            lse_max_abs,
        }
    }
}

/// One comparison, as the page shows it.
#[derive(Serialize)]
pub struct Errors {
    pub rel_l2: f64,
    pub max_abs: f64,
    /// NaN or infinite where a finite value was expected (or the wrong infinity).
    pub non_finite: usize,
    pub count: usize,
}

impl From<ErrorStats> for Errors {
    fn from(s: ErrorStats) -> Self {
        Errors {
            rel_l2: s.rel_l2,
            max_abs: s.max_abs,
            non_finite: s.non_finite,
            count: s.count,
        }
    }
}

#[derive(Serialize)]
pub struct Check {
    /// Query rows (over batch × heads × seq_q) compared with the reference, and how many there are.
    pub reference_rows: usize,
    pub total_rows: usize,
    pub reference_ms: f64,
    pub flash_vs_reference: Errors,
    pub lse_vs_reference: Errors,
    pub naive_vs_reference: Option<Errors>,
    /// Every output element.
    pub flash_vs_naive: Option<Errors>,
    pub tolerance: Tolerance,
    pub pass: bool,
    /// What failed, in words; empty when `pass`.
    pub failures: Vec<String>,
}

impl Check {
    pub fn new<T: Element>(
        problem: &AttentionProblem,
        [q, k, v]: [&[T]; 3],
        flash: &AttentionOutput<T>,
        naive: Option<&AttentionOutput<T>>,
    ) -> wgpu_flash_attn::Result<Self> {
        let start = crate::now_ms();
        let s = problem.shape;
        let total_rows = s.batch * s.num_heads * s.seq_q;
        let rows = (REFERENCE_BUDGET / (s.seq_kv * s.head_dim))
            .max(MIN_ROWS)
            .min(total_rows);

        let (mut flash_pairs, mut naive_pairs, mut lse_pairs) = (Vec::new(), Vec::new(), Vec::new());
        for r in 0..rows {
            // Evenly spaced over the flattened (b, h, i) index, first and last row included.
            let flat = if rows == 1 {
                0
            } else {
                r * (total_rows - 1) / (rows - 1)
            };
            let (b, h, i) = (
                flat / (s.num_heads * s.seq_q),
                flat / s.seq_q % s.num_heads,
                flat % s.seq_q,
            );
            let want = reference::attention_row(problem, q, k, v, b, h, i)?;
            for (d, w) in want.out.iter().enumerate() {
                let at = problem.o_layout.index(b, i, h, d);
                flash_pairs.push((flash.out[at].to_f64(), *w));
                if let Some(n) = naive {
                    naive_pairs.push((n.out[at].to_f64(), *w));
                }
            }
            lse_pairs.push((f64::from(flash.lse[flat]), want.lse));
        }
        let compare_all = |n: &AttentionOutput<T>| {
            ErrorStats::from_pairs(flash.out.iter().zip(&n.out).map(|(f, n)| (f.to_f64(), n.to_f64())))
        };

        let tolerance = Tolerance::of(problem.dtype);
        let flash_vs_reference = ErrorStats::from_pairs(flash_pairs);
        let lse_vs_reference = ErrorStats::from_pairs(lse_pairs);
        let flash_vs_naive = naive.map(compare_all);
        let mut failures = Vec::new();
        if !flash_vs_reference.within(tolerance.out_rel_l2, tolerance.out_max_abs) {
            failures.push(format!(
                "flash output vs float64 reference: {flash_vs_reference} (bounds: rel L2 {:.0e}, max abs {:.0e})",
                tolerance.out_rel_l2, tolerance.out_max_abs
            ));
        }
        if !lse_vs_reference.within(f64::INFINITY, tolerance.lse_max_abs) {
            failures.push(format!(
                "flash LSE vs float64 reference: {lse_vs_reference} (bound: max abs {:.0e})",
                tolerance.lse_max_abs
            ));
        }
        // Two kernels that each meet the bound against the reference are within twice it of
        // each other.
        if let Some(e) = &flash_vs_naive {
            if !e.within(2.0 * tolerance.out_rel_l2, 2.0 * tolerance.out_max_abs) {
                failures.push(format!("flash vs naive kernel: {e}"));
            }
        }
        Ok(Check {
            reference_rows: rows,
            total_rows,
            reference_ms: crate::now_ms() - start,
            flash_vs_reference: flash_vs_reference.into(),
            lse_vs_reference: lse_vs_reference.into(),
            naive_vs_reference: naive.map(|_| ErrorStats::from_pairs(naive_pairs).into()),
            flash_vs_naive: flash_vs_naive.map(Errors::from),
            tolerance,
            pass: failures.is_empty(),
            failures,
        })
    }
}
