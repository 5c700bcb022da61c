// dropout.wgsl — dropout on the attention probabilities: the generator of the tiled forward
// (flash_fwd.wgsl), the cooperative-matrix forward (flash_fwd_coop.wgsl) and the gradient kernels
// (flash_bwd_dq.wgsl, flash_bwd_dkdv.wgsl); the tiled kernels' keep masks are dropout_rows.wgsl.
// The host's twin is src/problem/dropout.rs, whose header says how each element's bit is drawn;
// in short:
//
//   words = philox4x32([col / 4, row / 2, head, batch], key),   key from (seed, offset)
//   element (row, col) reads the 16 bits (col % 2) of word 2·(row % 2) + (col % 4) / 2 of words,
//   and is dropped when they are below params.dropout_threshold = round(p · 2^16).
//
// Rows and keys count from their sequence's start, heads are query heads, all in the caller's
// problem (a part of a split problem adds its origin, params.part_*): the bit of an element
// depends on nothing a kernel or a split chooses (tile sizes, which side it owns, parts), so the
// backward's kernels regenerate exactly the forward's mask, and the host its copy.
//
// The kernels compile this in only with DROPOUT = true (the generated constant before this file):
// without it the branches fold away and the kernel is the one it was. The run-time values (key,
// threshold, factor) are in `params`.

const PHILOX_M0: u32 = 0xD2511F53u;
const PHILOX_M1: u32 = 0xCD9E8D57u;
const PHILOX_W0: u32 = 0x9E3779B9u;
const PHILOX_W1: u32 = 0xBB67AE85u;

// One round of Philox4x32 (Random123's philox4x32round). mul_wide, the 32 × 32 → 64-bit product,
// is generated before this file in one of two forms (mul_wide_halves.wgsl, mul_wide_u64.wgsl).
fn philox_round(x: vec4<u32>, k: vec2<u32>) -> vec4<u32> {
    let p0 = mul_wide(PHILOX_M0, x.x);
    let p1 = mul_wide(PHILOX_M1, x.z);
    return vec4<u32>(p1.y ^ x.y ^ k.x, p1.x, p0.y ^ x.w ^ k.y, p0.x);
}

// The generator's rounds (src/problem/dropout.rs PHILOX_ROUNDS: FlashAttention-2's count).
const PHILOX_ROUNDS: u32 = 7u;

// Philox4x32-7: the key bumped by the Weyl constants between rounds.
fn philox4x32(counter: vec4<u32>, key: vec2<u32>) -> vec4<u32> {
    var x = philox_round(counter, key);
    var k = key;
    for (var round = 1u; round < PHILOX_ROUNDS; round++) {
        k += vec2<u32>(PHILOX_W0, PHILOX_W1);
        x = philox_round(x, k);
    }
    return x;
}

// The generator's four words for the block of query head `head` of batch entry (or packed
// sequence) `b` that holds (row, col), all of the dispatch's problem: word 2·(row % 2) +
// (col % 4) / 2 decides (row, col & ~1) in its low 16 bits and (row, col | 1) in its high ones. A
// part's first row is even (src/runtime/split.rs), so its row pairs are the whole's.
fn dropout_words(b: u32, head: u32, row: u32, col: u32) -> vec4<u32> {
    return philox4x32(
        vec4<u32>(col / 4u, (params.part_row + row) / 2u, params.part_head + head, params.part_batch + b),
        vec2<u32>(params.dropout_key0, params.dropout_key1),
    );
}

// Whether 16-bit draws keep their elements.
fn draws_keep(draws: vec4<u32>) -> vec4<bool> {
    return draws >= vec4<u32>(params.dropout_threshold);
}

// The keep decisions of one block: query rows row & ~1 (`first`) and row | 1 (`second`), four keys
// from col & ~3 each.
struct DropoutBlock {
    first: vec4<bool>,
    second: vec4<bool>,
}

// The keep decisions of the block that holds (row, col) (dropout_words).
fn dropout_block(b: u32, head: u32, row: u32, col: u32) -> DropoutBlock {
    let w = dropout_words(b, head, row, col);
    let first = vec4<u32>(w.x & 0xffffu, w.x >> 16u, w.y & 0xffffu, w.y >> 16u);
    let second = vec4<u32>(w.z & 0xffffu, w.z >> 16u, w.w & 0xffffu, w.w >> 16u);
    return DropoutBlock(draws_keep(first), draws_keep(second));
}

// Which of the four keys of `block` (dropout_block of the same row) query row `row` keeps.
fn block_row_keeps(block: DropoutBlock, row: u32) -> vec4<bool> {
    return select(block.first, block.second, (row & 1u) == 1u);
}
