//! The switches of selection policy, on one screen: each says what automatic selection does and
//! the evidence for it (measurements are in BENCHMARKS.md and docs/perf-history.md).

/// Output accumulators an invocation may hold before a plan is considered too register-hungry
/// (when another plan fits).
pub const MAX_ACCUMULATORS: u32 = 64;

/// Whether automatic selection prefers f16 tiles for f16 storage. Not on the evidence so far: on
/// the H200 the best f16-tile kernel ran well below the best f32 one (the f16 products need
/// conversions back to f32 for the sums); see docs/perf-history.md, "Tile-plan sweep".
pub const F16_TILES_BY_DEFAULT: bool = false;

/// Whether the cooperative-matrix kernel has been seen to match the float64 reference on a device
/// that offers it: yes, on the H200 (driver 580), once its workgroup variables were all sized to
/// multiples of 16 bytes (flash_fwd_coop.wgsl says why). Kept as a switch so that a device found
/// to compute it wrong can be taken out of selection in one place.
pub const COOP_KERNEL_VERIFIED: bool = true;

/// Whether automatic selection takes the cooperative-matrix kernel where it can run (f16 data, a
/// device with 16 × 16 f16 matrices and 32-wide subgroups): yes, it is the fastest kernel on the
/// H200 for f16 data by far (BENCHMARKS.md).
pub const COOP_BY_DEFAULT: bool = true;

/// Whether automatic selection takes the cooperative-matrix dK/dV kernel, and the dQ kernel
/// (src/plan/backward/coop.rs, `COOP_BACKWARD_FEATURES`), where they run; a pass without keeps its
/// tiled kernel. Each only once it has matched the float64 reference on a device that offers
/// them and beaten the tiled kernel of its pass there. Both have, on the H200 (tests/wgpu_backward.rs;
/// examples/backward.rs --passes, f16, b2 seq 8192, same call): dK/dV 48 ms against 91 (head_dim
/// 128) and 34 against 98 (64), dQ 12.7 against 71 and 15 against 76 (BENCHMARKS.md).
/// `BackwardChoice::cooperative_matrix` forces both, or neither.
pub const COOP_DKDV_BY_DEFAULT: bool = true;
pub const COOP_DQ_BY_DEFAULT: bool = true;

/// Whether automatic selection takes the decode kernel (src/plan/decode.rs) for problems with few
/// query rows per K/V head (below).
pub const DECODE_BY_DEFAULT: bool = true;

/// Whether automatic selection takes the cooperative-matrix decode kernel
/// (shaders/flash_decode_coop.wgsl) where it runs (f16 data, head_dim a multiple of 16 up to 128,
/// a device with 16 × 16 f16 matrices and 32-wide subgroups) and the problem has at least
/// [`COOP_DECODE_MIN_ROWS`] query rows per K/V head; else the lane kernel. It has matched the
/// float64 reference on the H200 (tests/decode.rs, decode_cache.rs, head_terms.rs), and with four
/// new tokens over GQA 4 (16 rows) read the cache 2.2–3.5× faster than the lane kernel in the
/// same call (0.85 against 0.39 TB/s at batch 1, 1.83 against 0.53 at batch 8, 1.46 against
/// 0.47 at 131,072 keys; BENCHMARKS.md), where the lane kernel's FMA work per key grows with the
/// rows. With one token (4 rows) the lane kernel was faster (2.64 against 1.85 TB/s at batch 8).
pub const COOP_DECODE_BY_DEFAULT: bool = true;

/// The fewest query rows per K/V head (query heads per K/V head × new tokens) for which automatic
/// selection takes the cooperative-matrix decode kernel: past the lane kernel's largest row
/// block (8 rows), which would read the cache once per block.
pub const COOP_DECODE_MIN_ROWS: u32 = 9;

/// The decode kernel takes problems with at most this many new tokens per
/// sequence (one for plain decoding, a few for speculative decoding)...
pub const DECODE_MAX_QUERIES: usize = 16;

/// ... and at most this many query rows per K/V head (query heads per K/V head × new tokens):
/// each block of a workgroup's rows reads the K/V again, so beyond a few blocks a prefill tile,
/// which reads them once per 64 or more rows, wins.
pub const DECODE_MAX_ROWS: usize = 64;

/// A split of the keys has at least this many, so the partial outputs (one f32 row per query row
/// and split) stay a small fraction of the K/V bytes a split reads (rows / keys of it).
pub const DECODE_MIN_KEYS_PER_SPLIT: u64 = 256;

/// At most this many splits: the combine kernel holds one weight per split in workgroup memory.
pub const DECODE_MAX_SPLITS: u32 = 256;

/// Workgroups of each decode kernel a large discrete GPU runs at once, as the split rule
/// (`split_count`, src/plan/decode.rs) counts them: the lane kernel (its first plan: 128
/// invocations) two per SM of an H200's 132, the matrix kernel (256 invocations) one. Each kernel
/// was fastest there at the split count that fills one wave of these slots (BENCHMARKS.md,
/// session 21). wgpu reports no count of compute units, so every GPU is counted as this one.
pub const DECODE_LANE_SLOTS: u64 = 264;
/// See [`DECODE_LANE_SLOTS`].
pub const DECODE_COOP_SLOTS: u64 = 132;
/// The split rule takes the fewest pieces whose wave efficiency is within this fraction of the
/// best: at 0.85 it took 29 pieces at batch 1 where 32 fill the H200's slots.
pub const DECODE_SPLIT_EFFICIENCY: f64 = 0.95;

/// Whether the lane decode kernel loads K and V 16 bytes at a time where their layout allows
/// (16-bit elements, offsets and strides in multiples of 8): half the loads of 8-byte granules,
/// for a kernel bound by its instructions per key.
pub const DECODE_WIDE_LOADS: bool = true;
