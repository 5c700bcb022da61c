// dropout.cuh — dropout on the prefill kernels' probabilities (flash_fwd_mma.cu,
// flash_fwd_wgmma.cu), drawn bit for bit as shaders/dropout.wgsl and the host's
// src/problem/dropout.rs draw it (that file's header has the whole statement); in short:
//
//   words = philox4x32([col / 4, row / 2, head, batch], key),   key from (seed, offset)
//   element (row, col) reads the 16 bits (col % 2) of word 2·(row % 2) + (col % 4) / 2,
//   and is dropped when they are below the threshold round(p · 2^16).
//
// Rows and keys count from their sequence's start, heads are query heads, batch is the batch
// entry (or the packed sequence): nothing a kernel chooses (tiles, plans) changes a bit, so the
// host's mask is the kernels' and the backward can draw it again.
//
// Who draws what. Both kernels hold P in the m16n8 accumulator layout: lane 4g + q has, of every
// 8-column tile jn, columns 2q and 2q + 1 of rows g and g + 8, and a column pair of one row is
// exactly one word of a block (its two 16-bit halves). The four lanes g in {2h, 2h + 1}, q in
// {2c, 2c + 1} read the same blocks, one word each (word k = 2·(g % 2) + q % 2, the lane's index
// in its four). Each would draw every block it reads: four draws of each. Instead each of the
// four draws one block of a set of four (tiles jn, jn + 1 times rows g, g + 8; lane k the set's
// block k) and they trade words with three shuffles, a 4 × 4 transpose (in round d lane k sends
// its block's word k ^ d to lane k ^ d): one draw per 8 probabilities instead of per 2. A draw is
// seven rounds of two 32 × 32 → 64-bit products (mul.hi and mul.lo) and four XORs.
//
// The backward kernels (flash_bwd_mma.cu, flash_bwd_wgmma.cu) hold Pᵀ, keys as the rows, and draw
// the same bits for it (transposed_keep_bits, below).
//
// The kept values' factor 1/(1 − p) is not applied here: O's epilogue takes it with the row's
// 1/sum (dropout_output_factor), one multiply per output element instead of per probability.
// The row sums, and the LSE, are the undropped softmax's (the reference's definition).
#pragma once

// -DFA_DROPOUT=1 compiles dropout in (src/cuda/plan: ScoreTerms::dropout); without it the plain
// kernel holds none of this.
#ifndef FA_DROPOUT
#define FA_DROPOUT 0
#endif
constexpr bool HAS_DROPOUT = FA_DROPOUT != 0;

// Philox4x32's round multipliers and key increments (Random123; src/problem/dropout.rs PHILOX_M,
// PHILOX_W).
constexpr u32 PHILOX_M0 = 0xD2511F53u;
constexpr u32 PHILOX_M1 = 0xCD9E8D57u;
constexpr u32 PHILOX_W0 = 0x9E3779B9u;
constexpr u32 PHILOX_W1 = 0xBB67AE85u;

// The generator's rounds (src/problem/dropout.rs PHILOX_ROUNDS: FlashAttention-2's count).
constexpr int PHILOX_ROUNDS = 7;

// Philox4x32-7 (Random123's philox4x32_R with R = PHILOX_ROUNDS): the key bumped by the Weyl
// constants after each round.
__device__ __forceinline__ uint4 philox4x32(uint4 x, u32 key0, u32 key1) {
#pragma unroll
    for (int round = 0; round < PHILOX_ROUNDS; ++round) {
        const u32 hi0 = __umulhi(PHILOX_M0, x.x);
        const u32 hi1 = __umulhi(PHILOX_M1, x.z);
        x = make_uint4(hi1 ^ x.y ^ key0, PHILOX_M1 * x.z, hi0 ^ x.w ^ key1, PHILOX_M0 * x.x);
        key0 += PHILOX_W0;
        key1 += PHILOX_W1;
    }
    return x;
}

// Swaps a and b where `swap` holds: two selects, no branch.
__device__ __forceinline__ void swap_if(bool swap, u32& a, u32& b) {
    const u32 a0 = a;
    a = swap ? b : a;
    b = swap ? a0 : b;
}

// w[i] := w[i ^ k] for a lane's own k in 0..4 (registers cannot be indexed at run time).
__device__ __forceinline__ void permute_by(int k, u32 (&w)[4]) {
    swap_if(k & 1, w[0], w[1]);
    swap_if(k & 1, w[2], w[3]);
    swap_if(k & 2, w[0], w[2]);
    swap_if(k & 2, w[1], w[3]);
}

// Zeroes the dropped probabilities of one 16-row m-tile of P in place: s[4·jn + 2·r + e] is row
// row_g + 8·r, column col0 + 8·jn + 2·(lane % 4) + e of sequence `batch`'s query head `head`
// (row_g = the lane's first row, lane / 4 below the m-tile's first; col0 = the tile's first key, a
// multiple of 8). Every lane of the warp must call it (shuffles).
template <int N8>
__device__ __forceinline__ void drop_probabilities(const FwdParams& p, float (&s)[4 * N8], int batch, int head,
                                                   int row_g, int col0, int lane) {
    static_assert(N8 % 2 == 0, "blocks are drawn in sets of two 8-column tiles");
    const int q = lane & 3;
    const int k = (q & 1) | ((lane >> 1) & 2);  // the word this lane reads of every block: 2·(g % 2) + q % 2
    // The block this lane draws of each set: rows row_g + 8·(k % 2) (their pair is the same for
    // g and g ^ 1), tile jn + k / 2.
    const u32 row_pair = (u32)(row_g + 8 * (k & 1)) >> 1;
    const u32 threshold_high = p.dropout_threshold << 16;
#pragma unroll
    for (int set = 0; set < N8 / 2; ++set) {
        const u32 col_quad = (u32)(col0 + 8 * (2 * set + (k >> 1))) / 4 + (q >> 1);
        const uint4 drawn = philox4x32(make_uint4(col_quad, row_pair, (u32)head, (u32)batch), p.dropout_key0,
                                          p.dropout_key1);
        // mine[d]: word k ^ d of the drawn block (what lane k ^ d reads of it).
        u32 mine[4] = {drawn.x, drawn.y, drawn.z, drawn.w};
        permute_by(k, mine);
        // got[d]: word k of the block lane k ^ d drew, i.e. of the set's block k ^ d.
        u32 got[4];
        got[0] = mine[0];
#pragma unroll
        for (int d = 1; d < 4; ++d) got[d] = __shfl_xor_sync(0xffffffffu, mine[d], (d & 1) | ((d & 2) << 1));
        permute_by(k, got);  // got[i]: word k of the set's block i
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int at = 4 * (2 * set + (i >> 1)) + 2 * (i & 1);
            // The low half is at least the threshold iff the word shifted up is at least it shifted
            // up; the high half iff the word is.
            if ((got[i] << 16) < threshold_high) s[at] = 0.f;
            if (got[i] < threshold_high) s[at + 1] = 0.f;
        }
    }
}

// What O's epilogue multiplies a row by besides 1/sum: the kept probabilities' 1/(1 − p), or 1.
__device__ __forceinline__ float dropout_output_factor(const FwdParams& p) {
    return HAS_DROPOUT ? p.dropout_scale : 1.f;
}

// ---- The backward's transposed probabilities ----
//
// Both backward kernels hold Pᵀ in the accumulator layout with keys as the rows: lane 4g + t has
// keys key0 and key0 + 8 (key0 = its warp's first key + g) and, of every 8-query chunk n, queries
// m0 + 8n + 2t and + 1; s[4n + e] is query m0 + 8n + 2t + (e & 1), key key0 + 8·(e >> 1). A
// lane's query pair is one block's row pair, and its key is one column of a block whose four
// keys are those of the lanes g = 4a .. 4a + 3 of its t: those four lanes read the same blocks,
// each the two halves of its key's column (word (key % 4) / 2 for the even query, that + 2 for
// the odd one, half key % 2). Of two chunks (n, n + 1) they need four blocks, block i the one of
// chunk n + i / 2 and key half i % 2 (key0's quad, or key0 + 8's); lane k = g % 4 draws block k
// and the four trade, as in the forward, in a 4 × 4 transpose of three shuffles (lane masks 4,
// 8, 12), the 32 bits each needs of each block: one draw per 8 probabilities, as the forward.

// 32-bit words of keep bits for a lane's 4·M8 probabilities of Pᵀ.
template <int M8>
constexpr int TRANSPOSED_KEEP_WORDS = (4 * M8 + 31) / 32;

// The two halves lane k (k = key % 4) reads of a block's words, as one word: the even query's in
// the low half, the odd query's in the high.
__device__ __forceinline__ u32 column_halves(const uint4& w, int k) {
    const u32 even = (k >> 1) ? w.y : w.x;
    const u32 odd = (k >> 1) ? w.w : w.z;
    return (k & 1) ? __byte_perm(even, odd, 0x7632) : __byte_perm(even, odd, 0x5410);
}

// Bit 4n + e of `bits` (word (4n + e) / 32): whether s[4n + e] of this lane's Pᵀ tile is kept, for
// query head `head` of sequence `batch`, the tile's queries from m0. Every lane of the warp must
// call it (shuffles).
template <int M8>
__device__ __forceinline__ void transposed_keep_bits(const FwdParams& p, int batch, int head, int m0, int key0,
                                                     int lane, u32 (&bits)[TRANSPOSED_KEEP_WORDS<M8>]) {
    static_assert(M8 % 2 == 0, "blocks are drawn for two 8-query chunks at a time");
    const int t = lane & 3;
    const int k = (lane >> 2) & 3;  // g % 4: this lane's key within its quad, and the block it draws
    const u32 threshold = p.dropout_threshold;
#pragma unroll
    for (int w = 0; w < TRANSPOSED_KEEP_WORDS<M8>; ++w) bits[w] = 0;
    // One set at a time: unrolled, the compiler interleaves the sets' generators, whose state
    // spills beside the backward's dK and dV accumulators.
#pragma unroll 1
    for (int set = 0; set < M8 / 2; ++set) {
        const u32 col_quad = (u32)(key0 + 8 * (k & 1)) / 4;
        const u32 row_pair = (u32)(m0 + 8 * (2 * set + (k >> 1)) + 2 * t) / 2;
        const uint4 drawn = philox4x32(make_uint4(col_quad, row_pair, (u32)head, (u32)batch), p.dropout_key0,
                                          p.dropout_key1);
        // mine[d]: what lane k ^ d reads of the drawn block.
        u32 mine[4] = {column_halves(drawn, 0), column_halves(drawn, 1), column_halves(drawn, 2),
                       column_halves(drawn, 3)};
        permute_by(k, mine);
        u32 got[4];  // got[d]: this lane's halves of block k ^ d
        got[0] = mine[0];
#pragma unroll
        for (int d = 1; d < 4; ++d) got[d] = __shfl_xor_sync(0xffffffffu, mine[d], d << 2);
        permute_by(k, got);  // got[i]: this lane's halves of block i
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int n = 2 * set + (i >> 1);
#pragma unroll
            for (int parity = 0; parity < 2; ++parity) {
                const int e = 4 * n + 2 * (i & 1) + parity;
                const u32 draw = parity ? got[i] >> 16 : got[i] & 0xffffu;
                bits[e / 32] |= (u32)(draw >= threshold) << (e % 32);
            }
        }
    }
}

// x (an element of Pᵀ, or of dPᵀ: both pass through the same mask) as dropout leaves it: times
// 1/(1 − p) where element e of the lane's tile is kept (transposed_keep_bits' bits), 0 where it
// is dropped; x itself in a kernel without dropout.
__device__ __forceinline__ float dropped(const FwdParams& p, const u32* bits, int e, float x) {
    if constexpr (!HAS_DROPOUT) return x;
    return (bits[e / 32] >> (e % 32)) & 1u ? x * p.dropout_scale : 0.f;
}
