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
    // A sliding window's sides (u32::MAX: unbounded) and the soft-cap in base 2 (cap · log2 e):
    // flash_decode.wgsl with WINDOW / SOFTCAP.
    window_left: u32,
    window_right: u32,
    softcap: f32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> params: Params;

// A score that stands for "masked": far below any real score, yet finite, so that differences of
// two masked scores stay finite (WGSL implementations need not honour infinities).
const NEG_BIG: f32 = -1.0e30;
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

// Sequence b of a batch of equal sequences: the problem's lengths, rows from 0.
fn dense_sequence(b: u32) -> Sequence {
    return Sequence(b, 0u, params.seq_q, 0u, params.seq_kv, params.causal_offset, true);
}

// Whether query row `row` may attend to key column `col` (bounds and bottom-right causal mask).
fn is_visible(seq: Sequence, row: u32, col: u32) -> bool {
    if (col >= seq.seq_kv) {
        return false;
    }
    return params.causal == 0u || i32(col) <= i32(row) + seq.causal_offset;
}

// The first key column that no query row before `rows_end` may see: the sequence's end, or under
// the causal mask the column after row rows_end − 1's diagonal, clamped to the keys (the keys
// before it are those is_visible allows row rows_end − 1).
fn visible_key_end(seq: Sequence, rows_end: u32) -> u32 {
    if (params.causal == 0u) {
        return seq.seq_kv;
    }
    return u32(clamp(i32(rows_end) + seq.causal_offset, 0, i32(seq.seq_kv)));
}

// Whether some query row from m0 on may not see some key of the tile [n0, n0 + cols): the tile
// runs past the keys, or under the causal mask past row m0's diagonal (the tile's most restricted
// row). Where it is false, a tile's scores need no mask.
fn key_tile_needs_mask(seq: Sequence, m0: u32, n0: u32, cols: u32) -> bool {
    return n0 + cols > visible_key_end(seq, m0 + 1u);
}

// Index of a row's log-sum-exp: [batch, num_heads, seq_q], or [num_heads, total_q] when packed.
fn lse_index(seq: Sequence, h: u32, row: u32) -> u32 {
    if (params.total_q != 0u) {
        return h * params.total_q + seq.q_first + row;
    }
    return (seq.b * params.num_heads + h) * params.seq_q + row;
}
