//! Helpers shared by the tests, benchmarks and examples: seeded random tensors and error
//! statistics against a float64 reference. Public so that users can check their own setup the
//! same way.

use crate::problem::{AttentionProblem, Element, Tensor};

#[cfg(all(any(test, feature = "internals"), not(target_arch = "wasm32")))]
pub mod backward_harness;
#[cfg(all(any(test, feature = "internals"), not(target_arch = "wasm32")))]
pub mod harness;
#[cfg(any(test, feature = "internals"))]
pub mod shader;
#[cfg(all(any(test, feature = "internals"), not(target_arch = "wasm32")))]
pub mod timing;

/// The host's memory and swap in bytes, where the platform says (Linux: `/proc/meminfo`): the
/// bound past which the library refuses a host output (tests/hardening.rs skips below it).
pub fn host_memory_bytes() -> Option<u64> {
    crate::error::host_memory_bytes()
}

/// A small, fast, seedable generator (SplitMix64). Not cryptographic; reproducible on every
/// platform, which is all the tests need.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator whose sequence depends only on `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 uniformly distributed bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0), the tests' way of picking from a list: the next bits modulo
    /// `n` (the bias is far below anything a test draws enough samples to see).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Uniform in `[0, 1)`.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.uniform().max(f64::MIN_POSITIVE);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

/// A seed derived from a label (FNV-1a), so that each case or run has its own inputs and its
/// label reproduces them.
pub fn seed_of(label: &str) -> u64 {
    label.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// `len` standard-normal values rounded to `T`, from `seed`.
///
/// Generated in fixed chunks, each from its own seed, so the values depend only on `seed` and
/// `len`, while large tensors (the benchmarks use hundreds of MiB) fill on every core.
///
/// The same seed gives the same normals in every element type, so the f16 inputs of a test can
/// be compared with their f32 originals:
///
/// ```rust
/// use wgpu_flash_attn::testing::{random_tensor, seed_of, ErrorStats};
///
/// let seed = seed_of("my case"); // a label reproduces its inputs
/// let x: Vec<half::f16> = random_tensor(seed, 4096);
/// assert_eq!(x, random_tensor::<half::f16>(seed, 4096));
///
/// let exact: Vec<f32> = random_tensor(seed, 4096);
/// let stats = ErrorStats::from_pairs(x.iter().zip(&exact).map(|(a, b)| (a.to_f64(), *b as f64)));
/// assert_eq!(stats.count, 4096);
/// assert!(stats.within(1e-3, 1e-2), "f16 rounding: {stats}"); // relative error ≤ 2⁻¹¹
/// assert!(!stats.within(1e-5, 1e-2));
/// ```
pub fn random_tensor<T: Element>(seed: u64, len: usize) -> Vec<T> {
    const CHUNK: usize = 1 << 14;
    let mut out = vec![T::from_f64(0.0); len];
    let fill = |index: usize, chunk: &mut [T]| {
        let mut rng = Rng::new(seed ^ (index as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93));
        for x in chunk {
            *x = T::from_f64(rng.normal());
        }
    };
    let threads = if len > 4 * CHUNK {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        1
    };
    if threads <= 1 || cfg!(target_arch = "wasm32") {
        out.chunks_mut(CHUNK).enumerate().for_each(|(i, c)| fill(i, c));
    } else {
        let per_thread = len.div_ceil(threads).div_ceil(CHUNK) * CHUNK;
        std::thread::scope(|scope| {
            for (t, part) in out.chunks_mut(per_thread).enumerate() {
                let fill = &fill;
                scope.spawn(move || {
                    for (i, c) in part.chunks_mut(CHUNK).enumerate() {
                        fill(t * per_thread / CHUNK + i, c);
                    }
                });
            }
        });
    }
    out
}

/// Seeded Q, K and V for `problem`, each [`random_tensor`] of its required length (seeds `seed`,
/// `seed + 1`, `seed + 2`).
pub fn random_qkv<T: Element>(problem: &AttentionProblem, seed: u64) -> (Vec<T>, Vec<T>, Vec<T>) {
    (
        random_tensor(seed, problem.required_len(Tensor::Q)),
        random_tensor(seed.wrapping_add(1), problem.required_len(Tensor::K)),
        random_tensor(seed.wrapping_add(2), problem.required_len(Tensor::V)),
    )
}

/// [`random_tensor`]'s normal values with a fraction `rate` of them `magnitude` times larger:
/// FlashAttention-3's inputs for measuring FP8 quantization error with outliers.
pub fn outlier_tensor<T: Element>(seed: u64, len: usize, rate: f64, magnitude: f64) -> Vec<T> {
    let mut rng = Rng::new(seed ^ 0x0071_1e75);
    random_tensor::<f32>(seed, len)
        .into_iter()
        .map(|x| {
            T::from_f64(if rng.uniform() < rate {
                x as f64 * magnitude
            } else {
                x as f64
            })
        })
        .collect()
}

/// How far a result is from its reference. Build one with [`from_pairs`](Self::from_pairs), test
/// it with [`within`](Self::within); `Display` prints all of it for a failure message.
///
/// A GPU result against the float64 [`reference`](crate::reference::attention):
///
/// ```no_run
/// use wgpu_flash_attn::testing::{random_tensor, ErrorStats};
/// use wgpu_flash_attn::{reference, AttentionProblem, DType, FlashAttention, GpuContext, Tensor};
/// # fn main() -> wgpu_flash_attn::Result<()> {
/// let problem = AttentionProblem::mha(1, 300, 4, 64, DType::F32).with_causal(true);
/// let q: Vec<f32> = random_tensor(1, problem.required_len(Tensor::Q));
/// let k: Vec<f32> = random_tensor(2, problem.required_len(Tensor::K));
/// let v: Vec<f32> = random_tensor(3, problem.required_len(Tensor::V));
///
/// let ctx = pollster::block_on(GpuContext::new())?;
/// let got = FlashAttention::new(&ctx).forward_blocking(&problem, &q, &k, &v)?;
/// let want = reference::attention(&problem, &q, &k, &v)?;
/// let out = ErrorStats::from_pairs(got.out.iter().map(|&x| x as f64).zip(want.out.iter().copied()));
/// let lse = ErrorStats::from_pairs(got.lse.iter().map(|&x| x as f64).zip(want.lse.iter().copied()));
/// assert!(out.within(1e-5, 1e-4) && lse.within(1e-5, 1e-4), "O: {out}; LSE: {lse}");
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default)]
pub struct ErrorStats {
    /// ‖got − want‖₂ / ‖want‖₂ (NaN-free inputs only; see `non_finite`).
    pub rel_l2: f64,
    /// max |got − want|.
    pub max_abs: f64,
    /// Position (in the compared sequence) of the largest difference.
    pub worst_index: usize,
    /// Elements of `got` that are NaN or infinite where `want` is finite. Any of them fails.
    pub non_finite: usize,
    /// Pairs compared.
    pub count: usize,
}

impl ErrorStats {
    /// Compares pairs `(got, want)`. `want = ±∞` matches only the same infinity.
    pub fn from_pairs(pairs: impl IntoIterator<Item = (f64, f64)>) -> Self {
        let mut diff2 = 0.0;
        let mut ref2 = 0.0;
        let mut s = ErrorStats::default();
        for (i, (got, want)) in pairs.into_iter().enumerate() {
            s.count += 1;
            if want.is_infinite() {
                if got != want {
                    s.non_finite += 1;
                }
                continue;
            }
            if !got.is_finite() {
                s.non_finite += 1;
                continue;
            }
            let d = (got - want).abs();
            diff2 += d * d;
            ref2 += want * want;
            if d > s.max_abs {
                s.max_abs = d;
                s.worst_index = i;
            }
        }
        s.rel_l2 = if ref2 > 0.0 {
            (diff2 / ref2).sqrt()
        } else {
            diff2.sqrt()
        };
        s
    }

    /// True when every element is finite where it should be and both bounds hold.
    pub fn within(&self, rel_l2: f64, max_abs: f64) -> bool {
        self.non_finite == 0 && self.rel_l2 <= rel_l2 && self.max_abs <= max_abs
    }
}

impl std::fmt::Display for ErrorStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "rel L2 {:.2e}, max abs {:.2e} (at #{}), non-finite {} of {}",
            self.rel_l2, self.max_abs, self.worst_index, self.non_finite, self.count
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normals_have_unit_variance_and_seeds_differ() {
        let a: Vec<f32> = random_tensor(1, 20_000);
        let mean = a.iter().map(|&x| x as f64).sum::<f64>() / a.len() as f64;
        let var = a.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / a.len() as f64;
        assert!(mean.abs() < 0.03 && (var - 1.0).abs() < 0.05, "mean {mean} var {var}");
        let b: Vec<f32> = random_tensor(2, 16);
        assert_ne!(&a[..16], &b[..]);
        // A prefix does not depend on the length, whatever the threading.
        assert_eq!(random_tensor::<f32>(1, 16), a[..16]);
        let big: Vec<f32> = random_tensor(1, 200_000);
        assert_eq!(big[..20_000], a[..]);
    }

    #[test]
    fn stats_catch_nan_and_wrong_infinities() {
        let s = ErrorStats::from_pairs([(1.0, 1.0), (f64::NAN, 2.0)]);
        assert_eq!(s.non_finite, 1);
        assert!(!s.within(1.0, 1.0));
        let s = ErrorStats::from_pairs([(f64::NEG_INFINITY, f64::NEG_INFINITY), (2.0, 2.0)]);
        assert!(s.within(0.0, 0.0));
        let s = ErrorStats::from_pairs([(0.0, f64::NEG_INFINITY)]);
        assert_eq!(s.non_finite, 1);
        let s = ErrorStats::from_pairs([(1.1, 1.0), (2.0, 2.0)]);
        assert!((s.max_abs - 0.1).abs() < 1e-12 && s.worst_index == 0);
        assert!(!s.within(1e-3, 1.0));
    }
}
