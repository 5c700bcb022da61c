//! Dropout on the attention probabilities, fused into the kernels as FlashAttention-1/2 do it:
//! each probability `P[i, j]` of the softmax is kept or dropped by a counter-based generator, so
//! the backward regenerates the forward's mask instead of storing it (`seq_q × seq_kv` bits would
//! break the O(seq) memory), and the host regenerates it too ([`Dropout::mask`]), for the float64
//! reference and for callers who want to see it.
//!
//! **What it computes.** With `Z[i, j] ∈ {0, 1}` the mask and `r = 1/(1 − p)`,
//! `O = (P ∘ Z · r) V`. The softmax itself is not dropped: its row sums, and so the LSE the
//! forward returns, are those of the undropped `P` (as FlashAttention-2's `softmax_lse`). The
//! backward (docs/backward.md, "Dropout") is `dV = (P ∘ Z · r)ᵀ dO`, `dP = (dO Vᵀ) ∘ Z · r`,
//! `dS = P ∘ (dP − D)` with `D = rowsum(dO ∘ O)` of that dropped-out `O`.
//!
//! **The generator** is Philox4x32-7 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
//! 3", SC 2011): Random123's Philox4x32 with [`PHILOX_ROUNDS`] = 7 rounds, the count
//! FlashAttention-2's dropout uses and the smallest the paper calls Crush-resistant (it passes
//! TestU01's BigCrush); cuRAND's default is 10, a safety margin that costs dropout 30% more
//! generator time. [`philox4x32`] passes Random123's known-answer vectors for 7 rounds
//! ([`philox4x32_rounds`] its vectors for 10 too). WGSL has no 32 × 32 → 64-bit
//! multiply, so the shader (shaders/dropout.wgsl) builds the high word from 16-bit halves; the
//! tests run both on the same inputs and compare every word.
//!
//! **Which draw decides which element.** One call of the generator yields four 32-bit words,
//! read as eight 16-bit numbers; they decide a block of 2 query rows × 4 keys:
//!
//! * key: `(k0, k1) = philox4x32([offset_lo, offset_hi, 0, 0], [seed_lo, seed_hi])[0..2]`, so
//!   a (seed, offset) pair names one mask, and any change of either gives an unrelated one
//!   (PyTorch's generator state is such a pair: a framework passes its seed and advances the
//!   offset per call);
//! * counter: `[col / 4, row / 2, head, batch]`, with `row` the query's and `col` the key's index
//!   within their sequence (a packed batch's sequence `batch`, counted from its first row), and
//!   `head` the query head;
//! * element `(row, col)` takes word `2·(row % 2) + (col % 4) / 2` of the output, its low 16 bits
//!   for an even `col` and its high 16 bits for an odd one; it is dropped when that number is
//!   below the threshold `t = round(p · 2¹⁶)`.
//!
//! Every input of the counter is a position of the problem, never of a tile, a workgroup or a
//! kernel: the tiled forward, the dQ kernel (which owns rows) and the dK/dV kernel (which owns
//! keys and reads its blocks transposed) draw the same bit for each element, whatever their tile
//! sizes, and so does the host. A problem run in parts (src/runtime/split.rs) gives each part's
//! kernels the part's first batch entry, head and row in the whole (`Params::part_*`), so that the
//! positions stay the whole problem's. A block is 2 rows × 4 keys because every tiled kernel's
//! invocation owns whole groups of 4 consecutive keys of 4 consecutive rows (`4·(tx + THREADS_X·c)`
//! and `ROWS_PER_THREAD`, a multiple of 4): each call's eight decisions are all used where they
//! are drawn, without exchange between invocations. The cooperative-matrix forward's invocations
//! hold their scores where the device's fragment layout puts them (two rows eight apart, pairs of
//! keys, on NVIDIA), so there each subgroup draws each block once and passes its words through
//! workgroup memory (`kept_components` in shaders/coop_registers.wgsl).
//!
//! **Why 16-bit thresholds.** The generator's cost per element is what dropout adds to a kernel:
//! a round is two 32 × 32 → 64-bit products, which WGSL builds from five 32-bit multiplies and
//! some shifts each (one 64-bit multiply where the device has 64-bit integers: `PhiloxMultiply`
//! in src/plan/dropout.rs), so one call of seven rounds is some 200 integer operations (an
//! estimate from the source, not a measurement). Four decisions per call (32-bit thresholds)
//! would cost about 50 of them per element, against the `2·head_dim` multiply-adds of the two
//! products (256 at head_dim 128): some 20%. Sixteen (FlashAttention-2's 8-bit thresholds) cost
//! half of eight, but round p to a multiple of 1/256 (0.1 becomes 0.1016). Eight round p to a
//! multiple of 2⁻¹⁶ (0.1 becomes 0.100006, far below anything a training run notices) at about 25
//! operations per element.
//!
//! **Exactness of p.** The probability of dropping is exactly `t / 2¹⁶` ([`Dropout::drop_probability`])
//! and the kept values are scaled by `2¹⁶ / (2¹⁶ − t)` ([`Dropout::scale`]), the reciprocal of the
//! exact keep probability, so that `E[O]` is the undropped output. A `p` below 2⁻¹⁷ rounds to
//! `t = 0`: no dropout at all (the problem then asks no kernel for it); a `p` that rounds to
//! `t = 2¹⁶` (above 1 − 2⁻¹⁷) would drop everything and is refused.

use crate::error::{invalid, Result};

/// Philox4x32's round multipliers (Random123's `PHILOX_M4x32_0`, `PHILOX_M4x32_1`).
pub const PHILOX_M: [u32; 2] = [0xD251_1F53, 0xCD9E_8D57];
/// Philox4x32's key increments (Random123's `PHILOX_W32_0`, `PHILOX_W32_1`: the golden ratio and
/// √3 − 1 in 32 bits).
pub const PHILOX_W: [u32; 2] = [0x9E37_79B9, 0xBB67_AE85];

/// The threshold's scale: the generator draws 16-bit numbers, and `p` is rounded to a multiple
/// of `1 / DROPOUT_RESOLUTION`.
pub const DROPOUT_RESOLUTION: u32 = 1 << 16;

/// The generator's rounds (shaders/dropout.wgsl and cuda/dropout.cuh have the same constant; their
/// tests compare every word with [`philox4x32`]).
pub const PHILOX_ROUNDS: u32 = 7;

/// The generator: Philox4x32 with [`PHILOX_ROUNDS`] rounds on `counter` under `key`. The same
/// function as `philox4x32` in shaders/dropout.wgsl and cuda/dropout.cuh.
pub fn philox4x32(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    philox4x32_rounds(PHILOX_ROUNDS, counter, key)
}

/// Random123's `philox4x32_R` with `rounds` rounds (at least 1): the key bumped by the Weyl
/// constants between rounds.
pub fn philox4x32_rounds(rounds: u32, counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let round = |x: [u32; 4], k: [u32; 2]| {
        let p0 = PHILOX_M[0] as u64 * x[0] as u64;
        let p1 = PHILOX_M[1] as u64 * x[2] as u64;
        [
            (p1 >> 32) as u32 ^ x[1] ^ k[0],
            p1 as u32,
            (p0 >> 32) as u32 ^ x[3] ^ k[1],
            p0 as u32,
        ]
    };
    let mut x = round(counter, key);
    let mut k = key;
    for _ in 1..rounds {
        k = [k[0].wrapping_add(PHILOX_W[0]), k[1].wrapping_add(PHILOX_W[1])];
        x = round(x, k);
    }
    x
}

/// Dropout on the attention probabilities ([`AttentionProblem::with_dropout`](super::AttentionProblem::with_dropout);
/// the module's documentation says how each element's bit is drawn). The backward must be given
/// the same description as its forward: it regenerates the mask from it.
///
/// ```rust
/// use wgpu_flash_attn::batch::Dropout;
/// use wgpu_flash_attn::{AttentionProblem, DType};
/// # fn main() -> wgpu_flash_attn::Result<()> {
/// let dropout = Dropout { p: 0.1, seed: 42, offset: 0 };
/// let problem = AttentionProblem::mha(2, 128, 8, 64, DType::F16).with_dropout(dropout);
/// problem.validate()?;
/// // p as the kernels apply it: a multiple of 2^-16, and the kept values' factor.
/// assert_eq!(dropout.threshold(), 6554);
/// assert!((dropout.drop_probability() - 0.1).abs() < 1e-5);
/// assert!((dropout.scale() - 1.0 / 0.9).abs() < 1e-4);
/// // The mask of batch entry 1, head 3, as the kernels draw it: [128 rows][128 keys].
/// let mask = dropout.mask(1, 3, 128, 128);
/// assert_eq!(mask[5 * 128 + 7], dropout.keeps(1, 3, 5, 7));
/// let kept = mask.iter().filter(|&&k| k).count() as f64 / mask.len() as f64;
/// assert!((kept - 0.9).abs() < 0.01);
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dropout {
    /// The probability of dropping each attention probability: `0 ≤ p < 1`, rounded to a
    /// multiple of 2⁻¹⁶ ([`threshold`](Self::threshold)); 0 is no dropout.
    pub p: f32,
    /// The generator's seed.
    pub seed: u64,
    /// A second 64-bit input beside the seed (PyTorch's Philox offset): calls with one seed and
    /// different offsets get unrelated masks.
    pub offset: u64,
}

impl Dropout {
    /// `round(p · 2¹⁶)`: an element is dropped when its 16-bit draw is below it. Meaningful for a
    /// valid `p` ([`AttentionProblem::validate`](super::AttentionProblem::validate)); 0 for NaN.
    pub fn threshold(&self) -> u32 {
        let t = (self.p as f64 * DROPOUT_RESOLUTION as f64).round();
        t.clamp(0.0, DROPOUT_RESOLUTION as f64) as u32
    }

    /// The exact probability that an element is dropped: `threshold / 2¹⁶`.
    pub fn drop_probability(&self) -> f64 {
        self.threshold() as f64 / DROPOUT_RESOLUTION as f64
    }

    /// The factor of the kept values: `1 / (1 − drop_probability)`, so that the expected output is
    /// the undropped one.
    pub fn scale(&self) -> f64 {
        DROPOUT_RESOLUTION as f64 / (DROPOUT_RESOLUTION - self.threshold().min(DROPOUT_RESOLUTION - 1)) as f64
    }

    /// Whether anything is dropped: a threshold above 0 (a `p` of at least 2⁻¹⁷).
    pub fn is_active(&self) -> bool {
        self.threshold() > 0
    }

    /// The generator's key for this (seed, offset): the first two words of `philox4x32` on
    /// `[offset_lo, offset_hi, 0, 0]` under `[seed_lo, seed_hi]`.
    pub fn key(&self) -> [u32; 2] {
        let split = |x: u64| [x as u32, (x >> 32) as u32];
        let [o0, o1] = split(self.offset);
        let w = philox4x32([o0, o1, 0, 0], split(self.seed));
        [w[0], w[1]]
    }

    /// The four words that decide rows `row & !1` and `row | 1`, keys `col & !3 ..= col | 3` of
    /// (`batch`, `head`).
    fn block(&self, key: [u32; 2], batch: usize, head: usize, row: usize, col: usize) -> [u32; 4] {
        // Validation keeps every index below 2³¹.
        philox4x32([(col / 4) as u32, (row / 2) as u32, head as u32, batch as u32], key)
    }

    /// Whether element `(row, col)` of one block's words is kept.
    fn decide(&self, words: [u32; 4], row: usize, col: usize) -> bool {
        let word = words[2 * (row % 2) + (col % 4) / 2];
        let draw = (word >> (16 * (col % 2))) & 0xffff;
        draw >= self.threshold()
    }

    /// Whether the probability of query row `row` for key `col` of query head `head` in batch
    /// entry (or packed sequence) `batch` is kept, rows and keys counted within the sequence.
    /// The generator takes 32-bit positions, as the kernels do: positions of a valid problem are
    /// below 2³¹, and one past 2³² draws the same as its remainder.
    pub fn keeps(&self, batch: usize, head: usize, row: usize, col: usize) -> bool {
        self.decide(self.block(self.key(), batch, head, row, col), row, col)
    }

    /// The keep mask of query head `head` of batch entry (or packed sequence) `batch` over its
    /// first `rows` query rows and `cols` keys: `rows · cols` values, row-major (`mask[i · cols +
    /// j]` for row `i`, key `j`), `true` where the probability is kept. Every element is drawn,
    /// masked or not; the kernels use those of the keys each row sees.
    pub fn mask(&self, batch: usize, head: usize, rows: usize, cols: usize) -> Vec<bool> {
        let key = self.key();
        let mut mask = vec![false; rows * cols];
        for row in (0..rows).step_by(2) {
            for col in (0..cols).step_by(4) {
                let words = self.block(key, batch, head, row, col);
                for i in row..(row + 2).min(rows) {
                    for j in col..(col + 4).min(cols) {
                        mask[i * cols + j] = self.decide(words, i, j);
                    }
                }
            }
        }
        mask
    }

    /// `0 ≤ p < 1`, and not so close to 1 that it rounds to 1.
    pub(crate) fn validate(&self) -> Result<()> {
        let p = self.p;
        if !(p.is_finite() && (0.0..1.0).contains(&p)) {
            return invalid!("dropout p {p} is not in [0, 1)");
        }
        if self.threshold() >= DROPOUT_RESOLUTION {
            return invalid!(
                "dropout p {p} rounds to 1 at the generator's resolution of 2^-16 (every probability \
                 dropped); p must be below 1 - 2^-17"
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random123's known answers for philox4x32 with 7 and 10 rounds (its tests/kat_vectors):
    /// the generator's, and the round function's at cuRAND's count.
    #[test]
    fn philox_matches_random123() {
        const PI: ([u32; 4], [u32; 2]) = (
            [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
            [0xa409_3822, 0x299f_31d0],
        );
        let inputs = [([0; 4], [0; 2]), ([u32::MAX; 4], [u32::MAX; 2]), PI];
        let seven = [
            [0x5f6f_b709, 0x0d89_3f64, 0x4f12_1f81, 0x4f73_0a48],
            [0x5207_ddc2, 0x4516_5e59, 0x4d8e_e751, 0x8c52_f662],
            [0x4dfc_caba, 0x190a_87f0, 0xc473_62ba, 0xb6b5_242a],
        ];
        let ten = [
            [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8],
            [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd],
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1],
        ];
        for (((counter, key), want7), want10) in inputs.into_iter().zip(seven).zip(ten) {
            assert_eq!(philox4x32(counter, key), want7, "{counter:x?} {key:x?}");
            assert_eq!(philox4x32_rounds(7, counter, key), want7);
            assert_eq!(philox4x32_rounds(10, counter, key), want10, "{counter:x?} {key:x?}");
        }
    }

    #[test]
    fn thresholds_round_p_to_sixteen_bits() {
        let d = |p| Dropout { p, seed: 0, offset: 0 };
        assert_eq!(d(0.0).threshold(), 0);
        assert!(!d(0.0).is_active());
        assert_eq!(d(0.5).threshold(), 32768);
        assert_eq!(d(0.5).scale(), 2.0);
        assert_eq!(d(0.1).threshold(), 6554);
        // Below 2^-17 rounds to nothing; at 2^-16 one draw in 65536 drops.
        assert!(!d(1.0 / 262144.0).is_active());
        assert_eq!(d(1.0 / 65536.0).threshold(), 1);
        d(0.999).validate().unwrap();
        for bad in [-0.1, 1.0, 1.5, f32::NAN, f32::INFINITY, 1.0 - 1e-7] {
            assert!(d(bad).validate().is_err(), "{bad}");
        }
    }

    /// The mask draws each block once; `keeps` draws each element alone: the same bits, for odd
    /// extents too. Neighbouring rows, heads, batches, seeds and offsets differ.
    #[test]
    fn masks_are_the_elements_and_every_key_component_matters() {
        let d = Dropout {
            p: 0.5,
            seed: 0x0123_4567_89ab_cdef,
            offset: 7,
        };
        let (rows, cols) = (7, 13);
        let mask = d.mask(2, 3, rows, cols);
        for i in 0..rows {
            for j in 0..cols {
                assert_eq!(mask[i * cols + j], d.keeps(2, 3, i, j), "({i}, {j})");
            }
        }
        let big = |d: Dropout, b, h| d.mask(b, h, 64, 64);
        let base = big(d, 2, 3);
        let differs = |other: Vec<bool>| base.iter().zip(&other).filter(|(a, b)| a != b).count() > 1000;
        assert!(differs(big(d, 1, 3)));
        assert!(differs(big(d, 2, 4)));
        assert!(differs(big(
            Dropout {
                seed: d.seed ^ 1 << 40,
                ..d
            },
            2,
            3
        )));
        assert!(differs(big(Dropout { offset: 8, ..d }, 2, 3)));
        assert!(differs(big(
            Dropout {
                offset: 7 | 1 << 33,
                ..d
            },
            2,
            3
        )));
        // Rows and keys are not interchangeable, and shifted blocks are not copies.
        let transposed: Vec<bool> = (0..64 * 64).map(|e| base[(e % 64) * 64 + e / 64]).collect();
        assert!(differs(transposed));
        let shifted: Vec<bool> = (0..64 * 64).map(|e| base[(e + 4) % (64 * 64)]).collect();
        assert!(differs(shifted));
    }

    /// The keep rate is 1 − t/2¹⁶ within a few standard deviations, over many blocks.
    #[test]
    fn keep_rates_follow_p() {
        for p in [0.1f32, 0.5, 0.9] {
            let d = Dropout { p, seed: 11, offset: 3 };
            let n = 256 * 256 * 4;
            let kept = (0..4)
                .map(|h| d.mask(0, h, 256, 256).iter().filter(|&&k| k).count())
                .sum::<usize>();
            let q = 1.0 - d.drop_probability();
            let sd = (q * (1.0 - q) / n as f64).sqrt();
            let rate = kept as f64 / n as f64;
            assert!((rate - q).abs() < 5.0 * sd, "p {p}: kept {rate}, want {q} ± {sd}");
        }
    }
}
