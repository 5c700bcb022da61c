// common.wgsl — the per-dispatch parameters and index arithmetic every attention kernel shares.
//
// WGSL has no #include: the library builds each kernel's source by concatenating a generated block of
// `const` tile sizes, this file, a storage codec (storage_*.wgsl), for the flash kernel a tile type
// (tile_*.wgsl) and a row reduction (reduce_*.wgsl), and the kernel itself. Module-scope
// declarations may come in any order in WGSL, so the pieces can refer to each other freely.
//
// Tensors are bound as arrays of *granules*: four consecutive elements of the innermost (head_dim)
// dimension — a vec4<f32> for f32 storage, a vec2<u32> holding four 16-bit values for f16 and bf16.
// The host checks that every offset and stride is a multiple of four elements, so a row of
// head_dim elements (a multiple of 8) is a whole number of aligned granules.

// Offset and strides of one [batch, seq, heads, head_dim] tensor, in granules, relative to the
// start of its binding. Mirrored by `TensorStrides` in src/wgsl/params.rs.
struct TensorStrides {
    offset: u32,
    batch: u32,
    seq: u32,
    head: u32,
}

// Mirrored by `Params` in src/wgsl/params.rs (same order, same sizes).
struct Params {
    q: TensorStrides,
    k: TensorStrides,
    v: TensorStrides,
    o: TensorStrides,
    seq_q: u32,
    seq_kv: u32,
    head_dim: u32,
    num_heads: u32,
    // Query heads per K/V head (GQA/MQA): query head h reads K/V head h / group_size.
    group_size: u32,
    // 1 for causal attention, aligned to the bottom-right corner.
    causal: u32,
    // seq_kv - seq_q: with causal, query row i sees key columns j <= i + causal_offset.
    causal_offset: i32,
    // softmax scale · log2(e) for the flash kernel (which works in base 2), the plain softmax scale
    // for the naive one.
    scale: f32,
    // Query tiles per (batch, head): the flash kernel's grid is (num_q_tiles, num_heads, batch).
    num_q_tiles: u32,
    // 0 when the caller did not ask for the log-sum-exp.
    write_lse: u32,
    // First (batch · num_heads + head) index of this dispatch: the naive kernel processes the
    // score matrices a few heads at a time.
    bh_base: u32,
    // The decode kernel's split of the keys (flash_decode.wgsl, decode_combine.wgsl): pieces per
    // K/V head, and keys per piece.
    num_splits: u32,
    keys_per_split: u32,
    // A paged K/V cache (flash_decode.wgsl with PAGED): tokens per page, columns of the page table,
    // pages in the pool.
    page_size: u32,
    pages_per_seq: u32,
    num_pages: u32,
    // Rows of the packed Q/O and K/V of a variable-length batch (sequence.wgsl); 0 otherwise.
    total_q: u32,
    total_kv: u32,
    // A sliding window's sides (u32::MAX: unbounded) and the soft-cap in base 2 (cap · log2 e;
    // 0: none), read by keys_seen and soft_cap below.
    window_left: u32,
    window_right: u32,
    softcap: f32,
    // ALiBi's slopes: 0 none, 1 the geometric ones for num_heads, 2 the alibi_slopes tensor; 1
    // when the sinks tensor joins every row's denominator (head_terms_*.wgsl).
    alibi: u32,
    sinks: u32,
    // The batch size, for kernels that loop over it (flash_bwd_sinks.wgsl).
    batch: u32,
    // Where the score bias's elements lie, in elements, not granules (score_bias_bound.wgsl).
    bias: TensorStrides,
    // Dropout (dropout.wgsl): the generator's key, derived on the host from the seed and offset;
    // the threshold below which a 16-bit draw drops its element; the kept values' 1/(1 − p).
    dropout_key0: u32,
    dropout_key1: u32,
    dropout_threshold: u32,
    dropout_scale: f32,
    // Where this dispatch's problem starts in the caller's, for a problem run in parts
    // (src/runtime/split.rs): its first batch entry, query head and query row. Dropout's generator
    // counts positions from the caller's origin, so that a part draws the whole's mask.
    part_batch: u32,
    part_head: u32,
    part_row: u32,
    part_pad: u32,
    // Where the mask's bytes lie, in bytes, as the bias's elements (mask_bound.wgsl).
    mask: TensorStrides,
    // The mask's block summary (mask_blocks_bound.wgsl).
    blocks: MaskBlocksParams,
}

// The key of the description a block summary must have been computed for, and the strides of its
// states in words: between summarized batch entries and heads (0 when the mask broadcasts) and
// rows of blocks. Mirrored by `MaskBlocksParams` in src/wgsl/params.rs.
struct MaskBlocksParams {
    key: u32,
    batch: u32,
    head: u32,
    row: u32,
}

@group(0) @binding(0) var<uniform> params: Params;

// A score that stands for "masked": far below any real score, yet finite, so that differences of
// two masked scores stay finite (WGSL implementations need not honour infinities). The backward
// reads an empty row's LSE as -NEG_BIG.
const NEG_BIG: f32 = -1.0e30;
// The lowest finite f32, below every finite score: the tiled and naive forwards start a row's max
// here and give masked scores this value, so that a row whose real scores all lie below NEG_BIG
// (a huge negative scale, huge opposite q and k) still gets the reference's answer. Masked minus
// a real max may overflow to −∞ there, whose exp2 is the 0 it should be.
const LOWEST: f32 = -3.4028234e38;
const LOG2_E: f32 = 1.4426950408889634;
const LN_2: f32 = 0.6931471805599453;
// Bit pattern of -infinity: the LSE of a row that sees no key (the host reads it as f32).
const LSE_EMPTY_BITS: u32 = 0xff800000u;
// A quiet NaN's bits: what a kernel writes for rows it cannot compute (an invalid cache index).
const NAN_BITS: u32 = 0x7fc00000u;

// A NaN as a value. Not a constant expression: WGSL compilers refuse a NaN they fold at compile
// time (Chrome's Tint: "value nan cannot be represented as 'f32'"), so the bits pass through a
// uniform first.
fn nan_f32() -> f32 {
    return bitcast<f32>(NAN_BITS | (params.seq_q & 0u));
}

// Granule index of element (b, s, h, 0) of a tensor.
fn row_granule(t: TensorStrides, b: u32, s: u32, h: u32) -> u32 {
    return t.offset + b * t.batch + s * t.seq + h * t.head;
}

// Where one sequence of the batch lies: its first rows in the tensors and its lengths. A kernel
// finds it with `sequence(b)` (sequence_dense.wgsl, sequence_indexed.wgsl); the host's mirror is
// `SequenceRows` in src/problem/varlen.rs. Rows are counted from the sequence's start: query row
// i of the sequence is row q_first + i of Q and O (within batch b's slice, whose stride is 0 for a
// packed batch), key j is row kv_first + j of K and V.
struct Sequence {
    b: u32,
    q_first: u32,
    seq_q: u32,
    kv_first: u32,
    seq_kv: u32,
    // seq_kv − seq_q: with causal, query row i sees key columns j <= i + causal_offset.
    causal_offset: i32,
    // false when the index tensors place the sequence outside its tensors: the kernel writes its
    // rows as NaN (q_first and seq_q still name real rows) rather than read out of range.
    valid: bool,
}

// A score bias for four key columns (score_bias_*.wgsl): the values in base 2, and which keys it
// hides (−∞).
struct ScoreBias {
    value: vec4<f32>,
    hidden: vec4<bool>,
}

struct ScoreBiasElement {
    value: f32,
    hidden: bool,
}

// Sequence b of a batch of equal sequences: the problem's lengths, rows from 0.
fn dense_sequence(b: u32) -> Sequence {
    return Sequence(b, 0u, params.seq_q, 0u, params.seq_kv, params.causal_offset, true);
}

// A window side of u32::MAX is unbounded (the host's `Window` side `None`).
const UNBOUNDED: u32 = 0xffffffffu;

// The keys [begin, end) of a sequence of `seq_kv` keys that the query at key position `position`
// (its row plus the sequence's causal offset: aligned to the end of the keys) sees: all of them,
// cut by the causal mask at its diagonal and by the sliding window around it. Mirrors
// AttentionProblem::visible_keys (src/problem/mod.rs). Written with `&`, not `&&`: it runs inside
// unrolled loops, and Chrome's shader compiler hangs on many short-circuit branches there.
fn keys_seen(position: i32, seq_kv: u32) -> vec2<u32> {
    var end = i32(seq_kv);
    var begin = 0;
    if (params.causal != 0u) {
        end = min(end, position + 1);
    }
    if (params.window_left != UNBOUNDED) {
        begin = max(begin, position - i32(min(params.window_left, 0x3fffffffu)));
    }
    if ((params.window_right != UNBOUNDED) & (params.causal == 0u)) {
        end = min(end, position + i32(min(params.window_right, 0x3fffffffu)) + 1);
    }
    let e = u32(clamp(end, 0, i32(seq_kv)));
    return vec2<u32>(min(u32(clamp(begin, 0, i32(seq_kv))), e), e);
}

// The keys [begin, end) query row `row` of a sequence sees.
fn visible_keys(seq: Sequence, row: u32) -> vec2<u32> {
    return keys_seen(i32(row) + seq.causal_offset, seq.seq_kv);
}

// Whether query row `row` may attend to key column `col` (bounds, causal mask, window).
fn is_visible(seq: Sequence, row: u32, col: u32) -> bool {
    let keys = visible_keys(seq, row);
    return (col >= keys.x) & (col < keys.y);
}

// Which of four key columns lie in a row's visible keys [keys.x, keys.y) (visible_keys): a score
// vector's mask, in the kernels that hold four keys a vector.
fn within_keys(cols: vec4<u32>, keys: vec2<u32>) -> vec4<bool> {
    return (cols >= vec4<u32>(keys.x)) & (cols < vec4<u32>(keys.y));
}

// The first key column that no query row before `rows_end` may see (rows_end ≥ 1): the end of
// what row rows_end − 1 sees, the largest of the rows'.
fn visible_key_end(seq: Sequence, rows_end: u32) -> u32 {
    return visible_keys(seq, rows_end - 1u).y;
}

// The first key column query row `row` or any later row may see: a window's left edge, else 0.
fn visible_key_begin(seq: Sequence, row: u32) -> u32 {
    return visible_keys(seq, row).x;
}

// Whether some query row of [m0, m0 + rows) may not see some key of the tile [n0, n0 + cols): the
// tile runs past what the first row sees (the end of the keys, its diagonal, its window's right
// edge) or starts before what the last row sees (its window's left edge). Where it is false, a
// tile's scores need no mask.
fn key_tile_needs_mask(seq: Sequence, m0: u32, rows: u32, n0: u32, cols: u32) -> bool {
    return (n0 + cols > visible_keys(seq, m0).y) | (n0 < visible_keys(seq, m0 + rows - 1u).x);
}

// The query rows [start, end) of a sequence that see some key of [n0, n0 + cols): the backward's
// dK/dV kernel visits only their tiles.
fn rows_seeing(seq: Sequence, n0: u32, cols: u32) -> vec2<u32> {
    var start = 0;
    var end = i32(seq.seq_q);
    // A row sees past n0 once its diagonal (or its window's right edge) reaches it.
    if (params.causal != 0u) {
        start = i32(n0) - seq.causal_offset;
    } else if (params.window_right != UNBOUNDED) {
        start = i32(n0) - seq.causal_offset - i32(min(params.window_right, 0x3fffffffu));
    }
    // A row sees before n0 + cols until its window's left edge passes it.
    if (params.window_left != UNBOUNDED) {
        end = min(end, i32(n0 + cols) + i32(min(params.window_left, 0x3fffffffu)) - seq.causal_offset);
    }
    let e = u32(clamp(end, 0, i32(seq.seq_q)));
    return vec2<u32>(min(u32(clamp(start, 0, i32(seq.seq_q))), e), e);
}

// A score vector in base 2 (scale · log2 e applied) soft-capped: cap·tanh(x / cap), with
// params.softcap the cap in base 2 (cap · log2 e; 0 for none), so that the cap applies to the
// natural-log score as the reference defines it.
fn soft_cap(x: vec4<f32>) -> vec4<f32> {
    if (params.softcap == 0.0) {
        return x;
    }
    return cap_times_tanh(x, x * (1.0 / params.softcap), params.softcap); // a uniform reciprocal
}

// cap·tanh(y) of y = x / cap. Where |y| is below 1/16, tanh's series y − y³/3 + 2y⁵/15 (relative
// error below 4e-9) is taken as x times 1 − y²/3 + 2y⁴/15, without the cap: tanh_by_exp2's
// absolute error times a cap far above the scores would swamp them, and y falls below f32's
// normal range (flushed to 0) for caps near 1e38, where cap·tanh(x / cap) is x. The branch not
// taken may be ∞ or NaN (a cap over a tiny scale, in soft_cap_raw): select discards it.
fn cap_times_tanh(x: vec4<f32>, y: vec4<f32>, cap: f32) -> vec4<f32> {
    let y2 = y * y;
    let series = x * fma(y2, fma(y2, vec4<f32>(2.0 / 15.0), vec4<f32>(-1.0 / 3.0)), vec4<f32>(1.0));
    return select(cap * tanh_by_exp2(y), series, abs(y) < vec4<f32>(0.0625));
}

// tanh(x) = 1 − 2 / (1 + e^2x): one exp2 and one reciprocal, where the H200's Vulkan driver spent
// more on WGSL's tanh (BENCHMARKS.md, soft-cap). Absolute error about 1e-7 (the cancellation
// near 0 is in absolute terms, which is what the cap multiplies); exp2 overflowing to ∞ or
// reaching 0 gives the limits ±1 exactly.
fn tanh_by_exp2(x: vec4<f32>) -> vec4<f32> {
    return 1.0 - 2.0 / (1.0 + exp2(x * (2.0 * LOG2_E)));
}

// d soft_cap(x) / dx at a capped value y: 1 − (y / cap)², as tanh' = 1 − tanh² (1 without a cap).
fn soft_cap_slope(y: vec4<f32>) -> vec4<f32> {
    if (params.softcap == 0.0) {
        return vec4<f32>(1.0);
    }
    let t = y / params.softcap;
    return 1.0 - t * t;
}

// Index of a row's log-sum-exp: [batch, num_heads, seq_q], or [num_heads, total_q] when packed.
fn lse_index(seq: Sequence, h: u32, row: u32) -> u32 {
    if (params.total_q != 0u) {
        return h * params.total_q + seq.q_first + row;
    }
    return (seq.b * params.num_heads + h) * params.seq_q + row;
}
