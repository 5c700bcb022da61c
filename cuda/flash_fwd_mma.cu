// FlashAttention-2 forward on tensor cores through mma.sync.m16n8k16 (bf16/f16 in, f32
// accumulate), for sm_80 and newer. On Hopper flash_fwd_wgmma.cu (TMA, wgmma, warp
// specialization) runs instead, and this kernel is the fallback for layouts TMA cannot describe.
//
// Shapes. Q, O: [batch, seq_q, num_heads, head_dim] at any strides (FwdParams); K, V:
// [batch, seq_kv, num_kv_heads, head_dim]; query head h reads K/V head h / group_size. LSE:
// [batch, num_heads, seq_q] f32, natural log, -inf for a row that sees no key. head_dim is
// innermost and contiguous in every tensor.
//
// Who owns what.
// * A block owns BLOCK_M query rows of one (batch, head): grid = (q tiles, num_heads, batch).
//   It streams the visible K/V rows in tiles of BLOCK_N through shared memory, two stages deep
//   (cp.async for tile j+1 lands while tile j is multiplied), and writes its O rows once.
// * A warp owns 16 or 32 query rows (M_TILES = 1 or 2 m16 MMA row blocks), so BLOCK_M =
//   16 * M_TILES * warps. It computes its rows' S = Q·Kᵀ for a K/V tile in registers, does the
//   online softmax on it in registers, and feeds P straight from the S accumulators into the
//   second MMA (the f32 C-fragment of two adjacent n8 tiles is exactly the A-fragment of one k16
//   step, after packing to 16 bits). Each K or V fragment read from shared memory feeds all of
//   the warp's row tiles, so 32 rows per warp halve the shared-memory reads per FLOP.
// * A lane (4·g + t) owns, of every 16-row fragment, rows g and g+8: two softmax rows, whose
//   max and sum are combined over the 4 lanes of a quad with two shuffles.
//
// Variants. Run-time FwdParams: a window skips the tiles wholly left of its first row's edge; a
// head's sink joins each row's sum at the end (join_sink). Compile-time (FA_SOFTCAP, FA_ALIBI,
// FA_BIAS, shared with flash_fwd_wgmma.cu through fwd_params.cuh), so that the plain kernel holds
// none of their code or registers: the scaled scores are soft-capped (tanh.approx), then get
// ALiBi's term (one FFMA a score off the diagonal, the row's share added to its max and exp2
// argument: alibi_linear) and the bias's (one 32-bit load per column pair of a 16-bit bias, 8-byte
// for f32; read after Q·Kᵀ, as registers at the 255 cap leave no room to hold a tile across the
// MMAs) before the mask. FA_DROPOUT zeroes the dropped probabilities after the row sums
// (dropout.cuh: one generator draw per 8 of them, traded between the 4 lanes that read it).
//
// Why these sizes. Registers per thread, head_dim 128, BLOCK_N 64, 16 rows per warp: O
// accumulators 16·128/32 = 64, S 16·64/32 = 32, Q fragments kept in registers 16·128·2/4/32 =
// 32: ~250 with addresses (ptxas), under the 255 that __launch_bounds__(128, 2) allows, so two
// blocks of 4 warps share an SM and one block's softmax overlaps the other's MMAs. With 32 rows
// per warp O and S double, so Q stays in shared memory and is re-read per tile (Q_IN_REGS = 0),
// as it also does at head_dim 256, where O alone is 128 registers and BLOCK_N drops to 32.
// Shared memory: Q tile + 2 stages of (K, V) tiles, e.g. 16 + 2·(16 + 16) = 80 KiB at head_dim
// 128 with 64 x 64 tiles (the Rust side opts in at launch). src/cuda/plan/mma.rs lists the plans
// and why the defaults; BENCHMARKS.md has what the H200 measured.
//
// Shared-memory tiles are rows of head_dim 16-bit values split into 16-byte chunks, with chunk c
// of row r stored at chunk c ^ (r & 7): ldmatrix reads 8 rows of the same logical chunk, which
// the XOR spreads over all 32 banks (unswizzled, rows 128/256/512 bytes apart would hit the same
// banks 8 times over). The tile's width is a multiple of 64, so the XOR stays inside the row. A
// head_dim between the widths (any multiple of 8, FA_VALID_DIM) runs in the next width's tiles:
// its chunks past the head_dim are loaded as zeros (nothing added to Q·Kᵀ, zeros in P·V's
// padded columns) and never stored — the price is the padding's share of the MMAs.
//
// Compile-time parameters (-D, set by src/cuda/plan/mma.rs): FA_HEAD_DIM (the tile's width),
// FA_VALID_DIM (the head_dim, when the tile pads it), FA_BLOCK_M,
// FA_BLOCK_N, FA_WARPS, FA_CAUSAL, FA_BF16, FA_Q_IN_REGS, FA_VEC_BYTES (16: rows 16-byte aligned;
// 8: only 8-byte aligned), FA_MIN_BLOCKS (blocks per SM promised to the register allocator),
// FA_ALIBI, FA_BIAS, FA_SOFTCAP (the score terms, above), FA_DROPOUT (above), KERNEL_NAME.
#include "mma_ptx.cuh"
#include "fwd_params.cuh"

#ifndef KERNEL_NAME
#error "KERNEL_NAME must be defined (the kernel's config name)"
#endif

constexpr int HEAD_DIM = FA_HEAD_DIM;
constexpr int BLOCK_M = FA_BLOCK_M;
constexpr int BLOCK_N = FA_BLOCK_N;
constexpr bool CAUSAL = FA_CAUSAL != 0;
constexpr bool IS_BF16 = FA_BF16 != 0;
constexpr bool Q_IN_REGS = FA_Q_IN_REGS != 0;
constexpr int VEC_BYTES = FA_VEC_BYTES;
constexpr int WARPS = FA_WARPS;
constexpr int THREADS = WARPS * 32;
constexpr int M_TILES = BLOCK_M / (16 * WARPS);  // 16-row MMA tiles per warp: 1 or 2
constexpr int WARP_ROWS = 16 * M_TILES;
constexpr int CHUNKS = HEAD_DIM / 8;  // 16-byte chunks per row
constexpr int ROW_BYTES = HEAD_DIM * 2;
constexpr int Q_TILE_BYTES = BLOCK_M * ROW_BYTES;
constexpr int KV_TILE_BYTES = BLOCK_N * ROW_BYTES;
constexpr int K_STEPS = HEAD_DIM / 16;   // k16 steps of Q·Kᵀ
constexpr int N_TILES = BLOCK_N / 8;     // n8 tiles of S
constexpr int D_TILES = HEAD_DIM / 8;    // n8 tiles of O
constexpr float LN2 = 0.6931471805599453f;

static_assert(HEAD_DIM % 64 == 0 && HEAD_DIM <= 256, "the swizzle needs a multiple of 8 chunks per row");
static_assert(WARPS >= 1 && WARPS <= 8 && (M_TILES == 1 || M_TILES == 2) && BLOCK_M == WARP_ROWS * WARPS,
              "a warp owns 16 or 32 query rows");
static_assert(BLOCK_N % 16 == 0, "P·V steps over the key tile 16 at a time");
static_assert(VEC_BYTES == 16 || VEC_BYTES == 8, "global rows are moved in 16- or 8-byte pieces");

// The ldmatrix addresses of one lane: rows `row + 8i` and chunks `2k + c` for all k. The XOR of
// the swizzle (swz, mma_ptx.cuh) touches only the low 3 bits of the chunk, so
//     swz(row + 8i, 2k + c) = row·ROW_BYTES + 8i·ROW_BYTES + 128·(k / 4) + (((2·(k % 4) + c) ^ (row & 7)) << 4)
// and only the last term varies per lane: four registers hold it for every k, and the rest
// folds into immediates of the unrolled loops. (Written out because ptxas does not find it: with
// plain swz() calls it kept more address registers; this form saved 5 registers at head_dim
// 128 and removed the 128 x 64 four-warp plan's spills.)
struct FragAddr {
    u32 base[4];
    __device__ __forceinline__ FragAddr(u32 tile, int row, int c) {
#pragma unroll
        for (int b = 0; b < 4; ++b) base[b] = tile + (u32)(row * ROW_BYTES + (((2 * b + c) ^ (row & 7)) << 4));
    }
    // Chunk pair k (chunk 2k + c) of row `row + extra_rows`; extra_rows must be a multiple of 8.
    __device__ __forceinline__ u32 at(int k, int extra_rows) const {
        return base[k & 3] + (u32)((k >> 2) * 128 + extra_rows * ROW_BYTES);
    }
};

extern "C" __global__ void __launch_bounds__(THREADS, FA_MIN_BLOCKS) KERNEL_NAME(const FwdParams p) {
    extern __shared__ __align__(128) unsigned char smem[];
    const int tid = threadIdx.x;
    const int warp = tid / 32;
    const int lane = tid % 32;

    // Causal: the last query tiles see the most keys; launch them first so the long blocks
    // don't start last and leave the tail of the grid running alone.
    const int q_tile = CAUSAL ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
    const int head = blockIdx.y;
    const int batch = blockIdx.z;
    const int kv_head = head / p.group_size;
    const int m0 = q_tile * BLOCK_M;
    const SeqRows seq = sequence_rows(p, batch);
    if (m0 >= seq.seq_q) return;  // past this sequence's rows (a shorter one of a packed batch)

    // Keys this tile can see: all, or (causal, bottom-right aligned) up to its last row's
    // diagonal. Tiles entirely right of the diagonal are never loaded.
    // And with a window, from the first row's left edge: tiles wholly left of it are never loaded.
    const int n_end = visible_keys_end<CAUSAL>(p, seq, m0, BLOCK_M);
    const int first_tile = keys_seen<CAUSAL>(p, seq, m0).x / BLOCK_N;
    const int end_tile = (n_end + BLOCK_N - 1) / BLOCK_N;
    const int n_tiles = end_tile > first_tile ? end_tile - first_tile : 0;

    const u16* q =
        p.q + batch * p.q_batch_stride + head * p.q_head_stride + ((i64)seq.q_first + m0) * p.q_seq_stride;
    const u16* k = p.k + batch * p.k_batch_stride + kv_head * p.k_head_stride + (i64)seq.kv_first * p.k_seq_stride;
    const u16* v = p.v + batch * p.v_batch_stride + kv_head * p.v_head_stride + (i64)seq.kv_first * p.v_seq_stride;

    const u32 s_q = smem_addr(smem);
    const u32 s_kv = s_q + Q_TILE_BYTES;  // stage s: K at s_kv + 2s·KV_TILE_BYTES, V after it
    auto stage_k = [&](int s) { return s_kv + (u32)(2 * s) * KV_TILE_BYTES; };
    auto stage_v = [&](int s) { return s_kv + (u32)(2 * s + 1) * KV_TILE_BYTES; };
    auto load_kv = [&](int tile, int s) {  // tile: counted from first_tile
        const int n0 = (first_tile + tile) * BLOCK_N;
        cp_async_rows<BLOCK_N, ROW_BYTES, THREADS, VEC_BYTES, VALID_CHUNKS>(stage_k(s), k + (i64)n0 * p.k_seq_stride, p.k_seq_stride, seq.seq_kv - n0, tid);
        cp_async_rows<BLOCK_N, ROW_BYTES, THREADS, VEC_BYTES, VALID_CHUNKS>(stage_v(s), v + (i64)n0 * p.v_seq_stride, p.v_seq_stride, seq.seq_kv - n0, tid);
    };

    // Prologue: group 0 = Q and K/V tile 0, group 1 = K/V tile 1 (either may be empty).
    cp_async_rows<BLOCK_M, ROW_BYTES, THREADS, VEC_BYTES, VALID_CHUNKS>(s_q, q, p.q_seq_stride, seq.seq_q - m0, tid);
    if (n_tiles > 0) load_kv(0, 0);
    cp_async_commit();
    if (n_tiles > 1) load_kv(1, 1);
    cp_async_commit();

    float o_acc[M_TILES][D_TILES][4];
    float row_max[M_TILES][2];  // running max of the log2-scaled scores
    float row_sum[M_TILES][2];  // this lane's part of the running sum
#pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt) {
#pragma unroll
        for (int d = 0; d < D_TILES; ++d) o_acc[mt][d][0] = o_acc[mt][d][1] = o_acc[mt][d][2] = o_acc[mt][d][3] = 0.f;
        row_max[mt][0] = row_max[mt][1] = NEG_INF;
        row_sum[mt][0] = row_sum[mt][1] = 0.f;
    }

    // The warp's Q rows as A-fragments: lanes 0-7 address rows 0-7 of k-chunk 2kk, lanes 8-15
    // rows 8-15 of it, lanes 16-31 the same rows of chunk 2kk+1 (a[0..3] order); m-tile mt
    // starts 16 rows further down.
    const int q_frag_row = warp * WARP_ROWS + (lane & 7) + ((lane >> 3) & 1) * 8;
    const int q_frag_chunk = lane >> 4;
    u32 q_frag[Q_IN_REGS ? M_TILES : 1][Q_IN_REGS ? K_STEPS : 1][4];

    // K (non-transposed, rows = keys) B-fragments of two n8 tiles per ldmatrix.x4: lanes 0-7
    // rows 0-7 chunk 2kk, 8-15 rows 0-7 chunk 2kk+1, 16-23 rows 8-15 chunk 2kk, 24-31 rows 8-15
    // chunk 2kk+1 -> {b0, b1} of n-tile 2nn, then of 2nn+1.
    const int k_frag_row = (lane & 7) + (lane >> 4) * 8;
    const int k_frag_chunk = (lane >> 3) & 1;
    // V (transposed on load, rows = keys) B-fragments of two d8 tiles: lanes 0-7 keys 0-7 of
    // chunk 2dd, 8-15 keys 8-15 of it, 16-31 the same keys of chunk 2dd+1.
    const int v_frag_row = (lane & 7) + ((lane >> 3) & 1) * 8;
    const int v_frag_chunk = lane >> 4;
    const FragAddr q_addr(s_q, q_frag_row, q_frag_chunk);
    // Stage offsets are added to these: stage s's K tile is 2s·KV_TILE_BYTES past stage 0's.
    const FragAddr k_addr(stage_k(0), k_frag_row, k_frag_chunk);
    const FragAddr v_addr(stage_v(0), v_frag_row, v_frag_chunk);

    // This lane's rows: row0 + 16·mt and row0 + 16·mt + 8.
    const int row0 = m0 + warp * WARP_ROWS + lane / 4;
    const float slope_log2 = alibi_slope_log2(p, head);
    const float sink = sink_log2(p, head);
    // Scores go to base-2 logits here (fold 1): s·scale, capped with the variant's cap.
    const float cap_pre = HAS_SOFTCAP ? p.scale_log2 * p.softcap_inv_log2 : 0.f;
    // The bias's rows (row0 + 16·mt + 8·half), located once.
    const unsigned char* bias_at[HAS_BIAS ? M_TILES : 1][2];
    bool bias_pairs[HAS_BIAS ? M_TILES : 1][2];
    if constexpr (HAS_BIAS) {
#pragma unroll
        for (int mt = 0; mt < (HAS_BIAS ? M_TILES : 1); ++mt)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                bias_at[mt][half] = bias_row(p, batch, head, row0 + 16 * mt + 8 * half);
                bias_pairs[mt][half] = bias_pairs_ok(p, bias_at[mt][half]);
            }
    }

    for (int it = 0; it < n_tiles; ++it) {
        cp_async_wait<1>();  // every group but the newest is done: tile `it` has landed
        __syncthreads();
        const int stage = it & 1;
        const int n0 = (first_tile + it) * BLOCK_N;
        if (Q_IN_REGS && it == 0) {
#pragma unroll
            for (int mt = 0; mt < (Q_IN_REGS ? M_TILES : 0); ++mt)
#pragma unroll
                for (int kk = 0; kk < K_STEPS; ++kk)
                    ldmatrix_x4(q_frag[mt][kk], q_addr.at(kk, 16 * mt));
        }

        // S = Q·Kᵀ (WARP_ROWS x BLOCK_N per warp, f32). Each K fragment read from shared
        // memory feeds all M_TILES row tiles: with 32 rows a warp reads K and V half as often
        // per FLOP as with 16.
        float s[M_TILES][N_TILES][4];
#pragma unroll
        for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
            for (int n = 0; n < N_TILES; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.f;
        const u32 k_stage = (u32)(2 * stage) * KV_TILE_BYTES;
#pragma unroll
        for (int kk = 0; kk < K_STEPS; ++kk) {
            u32 a[M_TILES][4];
#pragma unroll
            for (int mt = 0; mt < M_TILES; ++mt) {
                if constexpr (Q_IN_REGS) {
#pragma unroll
                    for (int x = 0; x < 4; ++x) a[mt][x] = q_frag[Q_IN_REGS ? mt : 0][Q_IN_REGS ? kk : 0][x];
                } else {
                    ldmatrix_x4(a[mt], q_addr.at(kk, 16 * mt));
                }
            }
#pragma unroll
            for (int nn = 0; nn < N_TILES / 2; ++nn) {
                u32 b[4];
                ldmatrix_x4(b, k_addr.at(kk, nn * 16) + k_stage);
#pragma unroll
                for (int mt = 0; mt < M_TILES; ++mt) {
                    mma_16816<IS_BF16>(s[mt][2 * nn], a[mt], b[0], b[1]);
                    mma_16816<IS_BF16>(s[mt][2 * nn + 1], a[mt], b[2], b[3]);
                }
            }
        }

        // Scale into the log2 domain (scale·log2 e folded into one multiply; a max taken after
        // scaling stays right for a negative scale), cap with the variant's soft-cap, add its
        // ALiBi and bias terms, then mask where this tile needs it: past the end of the keys, or
        // right of some row's diagonal.
#pragma unroll
        for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
            for (int n = 0; n < N_TILES; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    s[mt][n][e] = HAS_SOFTCAP ? p.softcap_log2 * tanh_approx(s[mt][n][e] * cap_pre)
                                              : s[mt][n][e] * p.scale_log2;
        // The bias: one 32-bit load per column pair of a 16-bit bias (an 8-byte one for f32).
        if constexpr (HAS_BIAS) {
            const int col0 = n0 + (lane % 4) * 2;
#pragma unroll
            for (int mt = 0; mt < (HAS_BIAS ? M_TILES : 1); ++mt)
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    const int limit = bias_limit(seq, row0 + 16 * mt + 8 * half, col0);
                    const unsigned char* at = bias_at[mt][half];
                    const bool pairs = bias_pairs[mt][half];
                    if (p.bias_dtype != 0) {
#pragma unroll
                        for (int n = 0; n < N_TILES; ++n) {
                            const float2 b = bias_unpack16(bias_pair16(at + 2 * (i64)col0, 8 * n, limit, pairs), p.bias_dtype);
                            s[mt][n][2 * half] = fmaf(b.x, LOG2E_F, s[mt][n][2 * half]);
                            s[mt][n][2 * half + 1] = fmaf(b.y, LOG2E_F, s[mt][n][2 * half + 1]);
                        }
                    } else {
#pragma unroll
                        for (int n = 0; n < N_TILES; ++n) {
                            const float2 b = bias_pair32(at + 4 * (i64)col0, 8 * n, limit, pairs);
                            s[mt][n][2 * half] = fmaf(b.x, LOG2E_F, s[mt][n][2 * half]);
                            s[mt][n][2 * half + 1] = fmaf(b.y, LOG2E_F, s[mt][n][2 * half + 1]);
                        }
                    }
                }
        }
        // ALiBi's per-row base (alibi_linear; 0 on the diagonal), added to the lane's max (before
        // the quad's max: each lane's base is its own) and to its exp2's argument.
        float base[HAS_ALIBI ? M_TILES : 1][2];
        if constexpr (HAS_ALIBI) {
            // This lane's first column of the tile; each row's position relative to it.
            const int col0 = n0 + (lane % 4) * 2;
            float rel[M_TILES][2], k[M_TILES][2];
            bool linear = true;
#pragma unroll
            for (int mt = 0; mt < (HAS_ALIBI ? M_TILES : 1); ++mt)
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    rel[mt][half] = (float)(row0 + 16 * mt + 8 * half + seq.causal_offset - col0);
                    linear &= alibi_linear(slope_log2, slope_log2, rel[mt][half], (float)(BLOCK_N - 7), CAUSAL,
                                           k[mt][half], base[mt][half]);
                }
            if (__all_sync(0xffffffffu, linear)) {
#pragma unroll
                for (int mt = 0; mt < (HAS_ALIBI ? M_TILES : 1); ++mt)
#pragma unroll
                    for (int n = 0; n < N_TILES; ++n)
#pragma unroll
                        for (int e = 0; e < 4; ++e)
                            s[mt][n][e] = fmaf(k[mt][e >> 1], (float)(n * 8 + (e & 1)), s[mt][n][e]);
            } else {
#pragma unroll
                for (int mt = 0; mt < (HAS_ALIBI ? M_TILES : 1); ++mt) {
                    base[mt][0] = base[mt][1] = 0.f;
#pragma unroll
                    for (int n = 0; n < N_TILES; ++n)
#pragma unroll
                        for (int e = 0; e < 4; ++e)
                            s[mt][n][e] = alibi_x(s[mt][n][e], slope_log2, rel[mt][e >> 1], (float)(n * 8 + (e & 1)));
                }
            }
        }
        // A tile needs a mask where it runs past what the first row sees or starts before what
        // the last row sees (a window's left edge).
        const bool need_mask = n0 + BLOCK_N > keys_seen<CAUSAL>(p, seq, m0).y ||
                               n0 < keys_seen<CAUSAL>(p, seq, m0 + BLOCK_M - 1).x;
        if (need_mask) {
#pragma unroll
            for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
                for (int n = 0; n < N_TILES; ++n)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int col = n0 + n * 8 + (lane % 4) * 2 + (e & 1);
                        const int row = row0 + 16 * mt + (e >> 1) * 8;
                        const int2 seen = keys_seen<CAUSAL>(p, seq, row);
                        const bool hidden = col < seen.x || col >= seen.y;
                        if (hidden) s[mt][n][e] = NEG_INF;
                    }
        }

        // Online softmax, per owned row (m-tile mt, half r: elements 2r, 2r+1 of every n8 tile).
#pragma unroll
        for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                // With ALiBi the lane's max is taken first and shifted by its own base before the
                // quad's max: the base depends on the lane's first column, so the 4 lanes' scores
                // are in different units until it is added.
                float mx = HAS_ALIBI ? NEG_INF : row_max[mt][r];
#pragma unroll
                for (int n = 0; n < N_TILES; ++n) mx = fmaxf(mx, fmaxf(s[mt][n][2 * r], s[mt][n][2 * r + 1]));
                if constexpr (HAS_ALIBI) mx = fmaxf(row_max[mt][r], mx + base[HAS_ALIBI ? mt : 0][r]);
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                // A row that has seen only masked keys keeps max -inf; subtract 0 instead so that
                // exp2(-inf - -inf) never makes a NaN. Its probabilities are all exp2(-inf) = 0.
                const float m_use = mx == NEG_INF ? 0.f : mx;
                const float alpha = ex2(row_max[mt][r] - m_use);  // rescales the old sum and O
                row_max[mt][r] = mx;
                // The logit as the max saw it (with ALiBi's base added first), minus the max: 0 at
                // the max itself however large it is (fwd_params.cuh, is_huge_reference).
                const float b = HAS_ALIBI ? base[HAS_ALIBI ? mt : 0][r] : 0.f;
                float sum = 0.f;
#pragma unroll
                for (int n = 0; n < N_TILES; ++n) {
                    s[mt][n][2 * r] = ex2(HAS_ALIBI ? (s[mt][n][2 * r] + b) - m_use : s[mt][n][2 * r] - m_use);
                    s[mt][n][2 * r + 1] = ex2(HAS_ALIBI ? (s[mt][n][2 * r + 1] + b) - m_use : s[mt][n][2 * r + 1] - m_use);
                    sum += s[mt][n][2 * r] + s[mt][n][2 * r + 1];
                }
                // The sum stays per lane until the end (alpha is equal on the 4 lanes of a quad).
                row_sum[mt][r] = row_sum[mt][r] * alpha + sum;
#pragma unroll
                for (int d = 0; d < D_TILES; ++d) {
                    o_acc[mt][d][2 * r] *= alpha;
                    o_acc[mt][d][2 * r + 1] *= alpha;
                }
            }

        // Dropout (dropout.cuh): after the sums, which are the undropped softmax's.
        if constexpr (HAS_DROPOUT) {
#pragma unroll
            for (int mt = 0; mt < M_TILES; ++mt)
                drop_probabilities<N_TILES>(p, reinterpret_cast<float(&)[4 * N_TILES]>(s[mt]), batch, head,
                                            row0 + 16 * mt, n0, lane);
        }

        // O += P·V: the S accumulators of n8 tiles 2kk and 2kk+1 are the A-fragment of k-step kk.
        const u32 v_stage = (u32)(2 * stage) * KV_TILE_BYTES;
#pragma unroll
        for (int kk = 0; kk < BLOCK_N / 16; ++kk) {
            u32 a[M_TILES][4];
#pragma unroll
            for (int mt = 0; mt < M_TILES; ++mt) {
                a[mt][0] = pack2<IS_BF16>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                a[mt][1] = pack2<IS_BF16>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                a[mt][2] = pack2<IS_BF16>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                a[mt][3] = pack2<IS_BF16>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
            }
#pragma unroll
            for (int dd = 0; dd < D_TILES / 2; ++dd) {
                u32 b[4];
                ldmatrix_x4_trans(b, v_addr.at(dd, kk * 16) + v_stage);
#pragma unroll
                for (int mt = 0; mt < M_TILES; ++mt) {
                    mma_16816<IS_BF16>(o_acc[mt][2 * dd], a[mt], b[0], b[1]);
                    mma_16816<IS_BF16>(o_acc[mt][2 * dd + 1], a[mt], b[2], b[3]);
                }
            }
        }

        __syncthreads();  // every warp is done with this stage: refill it with tile it + 2
        if (it + 2 < n_tiles) load_kv(it + 2, stage);
        cp_async_commit();  // possibly empty, so that wait_group<1> keeps counting tiles
    }

    // Epilogue. Q's shared tile is free now: each warp stages its own rows of O there
    // (swizzled, conflict-free) and writes them out as whole 16-byte row chunks.
    cp_async_wait<0>();
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float sum = row_sum[mt][r];
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            const RowTotal total = join_sink(p, sink, row_max[mt][r], sum);
            // No visible key (and no sink): O = 0 and LSE = -inf, as the reference defines it.
            const float inv = !seq.valid ? __int_as_float(0x7fc00000)
                                         : (total.sum > 0.f ? total.o_factor * dropout_output_factor(p) / total.sum : 0.f);
            const int local_row = warp * WARP_ROWS + 16 * mt + lane / 4 + r * 8;
#pragma unroll
            for (int d = 0; d < D_TILES; ++d) {
                const u32 packed = pack2<IS_BF16>(o_acc[mt][d][2 * r] * inv, o_acc[mt][d][2 * r + 1] * inv);
                st_shared_u32(s_q + swz<ROW_BYTES>(local_row, d) + (lane % 4) * 4, packed);
            }
            const int row = row0 + 16 * mt + r * 8;
            if (p.lse != nullptr && lane % 4 == 0 && row < seq.seq_q) {
                const float lse = total.sum > 0.f ? total.m * LN2 + logf(total.sum) : NEG_INF;
                p.lse[lse_index(p, seq, batch, head, row)] = seq.valid ? lse : __int_as_float(0x7fc00000);
            }
        }
    __syncwarp();
    u16* o = p.o + batch * p.o_batch_stride + head * p.o_head_stride + (i64)seq.q_first * p.o_seq_stride;
#pragma unroll
    for (int j = 0; j < WARP_ROWS * CHUNKS / 32; ++j) {
        const int i = lane + 32 * j;
        const int local_row = warp * WARP_ROWS + i / CHUNKS;
        const int chunk = i % CHUNKS;
        const int row = m0 + local_row;
        if (row < seq.seq_q && in_head_dim(chunk)) {
            u32 val[4];
            ld_shared_v4(s_q + swz<ROW_BYTES>(local_row, chunk), val);
            u16* dst = o + (i64)row * p.o_seq_stride + chunk * 8;
            if (VEC_BYTES == 16) {
                st_global_v4(dst, val);
            } else {
                st_global_v2(dst, val[0], val[1]);
                st_global_v2(dst + 4, val[2], val[3]);
            }
        }
    }
}
