// FlashAttention-3 style forward for Hopper (sm_90a): K/V tiles streamed by the tensor memory
// accelerator into a shared-memory ring guarded by mbarriers, a producer warpgroup that issues
// the copies, and consumer warpgroups that multiply on wgmma (bf16/f16 in, f32 accumulate).
//
// Shapes and parameters as flash_fwd_mma.cu (FwdParams in fwd_params.cuh): Q, O [batch, seq_q,
// num_heads, head_dim] at any strides, K, V [batch, seq_kv, num_kv_heads, head_dim], LSE [batch,
// num_heads, seq_q] f32. The host encodes one 4-D tensor map (head_dim, seq, heads, batch) per
// input with 64-column boxes and 128-byte swizzling (src/cuda/tma.rs) and passes them by value;
// layouts the copy engine cannot describe (strides that are not multiples of 16 bytes) run the
// mma.sync kernel instead (`wgmma_unavailable` in src/cuda/plan/wgmma.rs says why).
//
// Who owns what.
// * A CTA (a producer warpgroup and CONSUMERS = 2 or 3 consumer warpgroups, 384 or 512 threads,
//   one CTA per SM) owns BLOCK_M = 64 · CONSUMERS query rows of one (batch, head): grid = (q
//   tiles, num_heads, batch). It streams the K/V tiles those rows see, BLOCK_N keys at a time,
//   through STAGES shared-memory stages; every K/V tile loaded feeds all consumers, so a third
//   consumer cuts the K/V traffic per FLOP by a third.
// * Warpgroup 0 is the producer: one thread issues the bulk tensor copies (Q once, then K and V
//   of every tile, each landing on its own "full" mbarrier with the byte count announced), waiting
//   on a stage's "empty" mbarrier before refilling it. It needs almost no registers and gives
//   them up (setmaxnreg.dec to 24) to the consumers (setmaxnreg.inc to 240 with 2 consumers,
//   160 with 3): 128·24 + 256·240 = 64512, the 168 a thread the CTA holds; 128·24 + 384·160 =
//   64512 of 65536 at 128 each.
// * Warpgroups 1.. are consumers, 64 query rows each (wgmma's M). Each computes S = Q·Kᵀ
//   (64 x BLOCK_N, f32 in registers) with Q and K read by the tensor cores straight from shared
//   memory, the online softmax on S in registers (exp2, scale·log2 e folded in), and O += P·V
//   with P converted in registers to wgmma's A fragment (the S accumulator layout of two n8 slabs
//   is exactly the A layout of one k16 step) and V read from shared memory transposed.
// * A thread (warp w of its warpgroup, lane 4g + q) owns rows 16w + g and 16w + g + 8 of its
//   warpgroup's 64: for each, 2 of every 8 columns of S and O. Row max and sum are combined over
//   the 4 lanes of a quad with two shuffles.
//
// Variants. Run-time (FwdParams, as in flash_fwd_mma.cu): a sliding window's tiles left of
// every row's window are never copied (the producer and consumers count tiles from the first one
// the CTA's first row sees), and a head's sink joins each row's sum in the epilogue (join_sink).
// Compile-time (FA_SOFTCAP, FA_ALIBI, FA_BIAS; fwd_params.cuh), because each costs registers and
// instructions per score that the plain kernel must not carry: the soft-cap takes tanh of the
// scaled scores (one FMUL and one MUFU a score) and folds the cap into exp2's FFMA in place of the
// scale, and with two MUFU ops a score it moves the exp2s of one column tile in four to the FMA
// units (FA_EX2_FMA, ex2_fma); ALiBi adds one FFMA a score off the diagonal (alibi_linear: the row's share goes into its
// max and its exp2's FFMA once per tile), two on it. The bias: a 16-bit bias the copy engine can
// describe arrives with K (FA_BIAS_TMA: its BLOCK_M x BLOCK_N tile in each ring stage, a fourth
// tensor map, the producer's copies), and each consumer reads its rows' words with ldmatrix,
// whose fragment is the S accumulator's layout; otherwise it is read from global memory, one
// 32-bit load per column pair (8 bytes for f32). Either way the words are loaded right after
// S = Q·Kᵀ is issued where BLOCK_N / 4 more registers fit (BIAS_PREFETCH), so the loads overlap
// the tensor cores, and each value costs an unpack and an FFMA. FA_DROPOUT zeroes the dropped
// probabilities after the row sums (dropout.cuh: one generator draw per 8 of them, traded between
// the 4 lanes that read it).
//
// Overlap (FA_OVERLAP): inside a warpgroup, S(j) = Q·K(j)ᵀ and O += P(j-1)·V(j-1) are issued
// back to back, and the softmax of tile j is meant to run while the tensor cores finish
// P(j-1)·V(j-1); P is kept as packed 16-bit registers beside S for that. (ptxas 13.0 schedules
// the second wait before the softmax anyway, so on this toolkit it does not pay; see
// fence_softmax.) Ping-pong (FA_PINGPONG): the consumer warpgroups take turns issuing their GEMMs
// (a named barrier per consumer, 256 threads: the waiting warpgroup and the one handing over), so
// one's softmax runs while another's GEMMs occupy the tensor cores. Even without it the consumers
// interleave on their own, and H200 sweeps (BENCHMARKS.md) favour it only at head_dim 256.
//
// Persistent (FA_PERSISTENT): one CTA per SM, each running every gridDim.x-th work tile (q tile,
// head, batch) of the launch in turn (WorkGrid says how many there are). The producer loads the
// next tile's Q as soon as both consumers' last Q·Kᵀ of the current one has completed (the
// q_empty mbarrier) and its K/V as ring stages free up, so the next tile's loads run under the
// current tile's last P·V and epilogue instead of after a new CTA's launch. O then leaves from
// the registers (the Q region is the next tile's): a lane's 16 bytes of a row per store, after
// the quad trades pieces (store_row_from_quad), or with 192-key tiles and more a quad's 16 bytes
// per store. What it saves is a fixed cost per work tile: it shows where a CTA sees few K/V
// tiles. FA_PERSISTENT=2 (dynamic): after its first tile a block draws the next from a counter
// in global memory as it finishes one, the way the hardware deals out a plain launch's CTAs, for
// tiles of unequal lengths (causal); the producer announces each tile to the consumers in shared
// memory.
//
// Why these sizes. Registers per consumer thread: O is 64·head_dim/128 f32 (32 at head_dim 64,
// 64 at 128, 128 at 256), S 64·BLOCK_N/128 (64 at BLOCK_N 128), P half of S packed beside it (a
// quarter for FP8): with 2 consumers (240 registers) 16-bit head_dim 128 takes 128-192-key tiles,
// FP8 128 or 256 (FP8 above); at head_dim 256 O alone
// is 128, so tiles are 64 or 80 keys. With 3 consumers (160 registers) head_dim 64 with 128-key
// tiles fits (32 + 64 + 32 plus addresses; ptxas reports no spills), and each K/V tile then
// feeds 192 rows. A 16-bit bias tile held across the S wgmma is BLOCK_N / 4 more (32 at
// BLOCK_N 128): it is prefetched only where O + S (+ P) + it leave 56 registers for addresses
// and the terms' per-row state (BIAS_PREFETCH; ptxas then reports no spills). Shared memory:
// Q (BLOCK_M x head_dim) + STAGES · (K + V) (BLOCK_N x head_dim each), 16-bit, + 1 KiB for
// alignment: head_dim 128, 128 x 128, 2 stages =
// 32 + 2·64 = 160 KiB; head_dim 256, 128 x 80, 2 stages = 64 + 2·80 = 224 KiB; one CTA per SM,
// which the thread count at the register cap already implies. A staged bias adds its BLOCK_M x
// BLOCK_N 16-bit tile to each stage (head_dim 128, 128 x 128: 32 + 2·96 = 224 KiB).
//
// Shared-memory tiles are what the copy engine writes: per 64-column panel of head_dim, rows of
// 128 bytes with 16-byte chunk c of row r at chunk c ^ (r % 8) (128-byte swizzle), panels one
// after another; each panel starts 1024-byte aligned, as the swizzle and wgmma's descriptors
// (sm90_ptx.cuh) need.
//
// FP8 (FA_FP8, src/cuda/plan/fp8.rs): Q, K and V are e4m3 bytes written by cuda/fp8_quant.cu, with
// one f32 scale per 64 query rows (a consumer warpgroup's) and per 128 keys (a scale block; a K/V
// tile of 128 or 256 keys holds TILE_SCALES = 1 or 2 of them). S and O += P·V run on the e4m3
// wgmma (k32 steps, twice the bf16 rate), whose 8-bit operands must both be K-major, so V arrives
// transposed (Vt8: a row of keys per head_dim column) with the keys of every 32 in the order that
// makes P's packed accumulator registers the A fragment (fp8_slot in fp8_quant.cu). Tiles are the
// same bytes as the 16-bit kernel's: a 128-byte swizzle panel holds 128 columns (or keys). The
// scales enter where they cost nothing per score: Q's and K's multiply the exp2 factor of their
// block's columns; V's (a running reference v_ref, the largest seen, that O is kept in units of)
// shift P's exp2 by log2(256 · v_scale / v_ref), so P is stored as e4m3 in [0, 256] where its 3
// mantissa bits cover small probabilities too; the row sum takes the plain P back with one
// multiply per row and block, and O is multiplied by v_ref / 256 at the end. Only plain attention
// with windows, causal and GQA (no ALiBi, bias, soft-cap or P·V split) and no packed batch. At
// twice bf16's tensor rate the one exp2 a score on the special-function unit is what limits:
// FA_EX2_FMA moves a share of them to the FMA units, as for the soft-cap. 256-key tiles halve the
// per-tile bookkeeping and synchronization for the same scores; at head_dim 128 their S is 128
// registers, which beside O's 64 leave no room for overlap's P.
//
// Compile-time parameters (-D, set by src/cuda/plan/wgmma.rs): FA_HEAD_DIM (the tile's width),
// FA_VALID_DIM (the head_dim, when the tile pads it), FA_BLOCK_N,
// FA_STAGES, FA_CONSUMERS, FA_CAUSAL, FA_BF16, FA_OVERLAP, FA_PINGPONG, FA_PV_SPLIT (1: O += P·V
// as one N = 64 wgmma per head_dim panel instead of one N = head_dim wgmma), FA_ALIBI, FA_BIAS,
// FA_SOFTCAP (the score terms, above), FA_BIAS_TMA (the bias staged, above), FA_DROPOUT (above),
// FA_FP8 (e4m3 inputs, above; the output is still FA_BF16's type), FA_PERSISTENT (above),
// KERNEL_NAME.
#include "mma_ptx.cuh"
#include "fwd_params.cuh"
#include "sm90_ptx.cuh"
#include "wgmma_gen.cuh"

#ifndef KERNEL_NAME
#error "KERNEL_NAME must be defined (the kernel's config name)"
#endif

constexpr int HEAD_DIM = FA_HEAD_DIM;
constexpr int BLOCK_N = FA_BLOCK_N;
constexpr int STAGES = FA_STAGES;
constexpr bool CAUSAL = FA_CAUSAL != 0;
constexpr bool IS_BF16 = FA_BF16 != 0;
constexpr bool OVERLAP = FA_OVERLAP != 0;
constexpr bool PINGPONG = FA_PINGPONG != 0;
constexpr bool PV_SPLIT = FA_PV_SPLIT != 0;
#ifndef FA_FP8
#define FA_FP8 0
#endif
constexpr bool FP8 = FA_FP8 != 0;
#ifndef FA_PERSISTENT
#define FA_PERSISTENT 0
#endif
constexpr bool PERSISTENT = FA_PERSISTENT != 0;
constexpr bool DYNAMIC = FA_PERSISTENT == 2;  // tiles drawn from WorkGrid::next_tile
#ifndef FA_BIAS_TMA
#define FA_BIAS_TMA 0
#endif
constexpr bool BIAS_TMA = FA_BIAS_TMA != 0;  // the 16-bit bias's tiles arrive with K

constexpr int CONSUMERS = FA_CONSUMERS;
constexpr int WG_ROWS = 64;  // wgmma's M
constexpr int BLOCK_M = CONSUMERS * WG_ROWS;
constexpr int THREADS = 128 * (1 + CONSUMERS);
// The CTA holds 65536 / THREADS registers a thread (168 with 2 consumers, 128 with 3); the
// producer keeps 24 and the consumers share the rest, in multiples of 8.
constexpr int PRODUCER_REGS = 24;
constexpr int CONSUMER_REGS = CONSUMERS == 2 ? 240 : 160;
constexpr int PANEL_ELEMS = FP8 ? 128 : 64;  // columns of a 128-byte swizzle panel
constexpr int PANELS = HEAD_DIM / PANEL_ELEMS;  // panels per row of Q or K
// A padded head_dim (fwd_params.cuh, FA_VALID_DIM): the copy engine fills the columns past it with
// zeros, since the tensor maps are only head_dim wide; O's are not stored (in_head_dim).
constexpr u32 ROW_BYTES = 128;          // one panel row
constexpr u32 Q_PANEL_BYTES = BLOCK_M * ROW_BYTES;
constexpr u32 KV_PANEL_BYTES = BLOCK_N * ROW_BYTES;
constexpr u32 Q_BYTES = PANELS * Q_PANEL_BYTES;  // what the Q copies fill
// The Q region: the 16-bit O tile is staged there at the end, so with 1-byte Q it is twice Q.
constexpr u32 Q_REGION_BYTES = BLOCK_M * HEAD_DIM * 2;
constexpr u32 KV_BYTES = PANELS * KV_PANEL_BYTES;
// FP8's V tile, transposed: HEAD_DIM rows of BLOCK_N keys, in panels of 128 keys.
constexpr int VT_PANELS = BLOCK_N / 128;
// FP8's K and V scales are per 128 keys (FP8_KV_BLOCK): a tile of BLOCK_N keys spans TILE_SCALES
// of them, each SCALE_SLABS n8 column slabs of S wide. 16-bit kernels have one "block" of factor 1.
constexpr int TILE_SCALES = FP8 ? BLOCK_N / 128 : 1;
constexpr int SCALE_SLABS = BLOCK_N / 8 / TILE_SCALES;
constexpr u32 VT_PANEL_BYTES = HEAD_DIM * ROW_BYTES;
// A staged bias tile: BLOCK_M rows of BLOCK_N 16-bit values, in panels of 64 keys (128-byte rows,
// swizzled as Q and K are) that the producer copies one box each.
constexpr u32 BIAS_PANEL_BYTES = BLOCK_M * ROW_BYTES;
constexpr u32 BIAS_TILE_BYTES = BIAS_TMA ? BLOCK_N / 64 * BIAS_PANEL_BYTES : 0;
constexpr u32 STAGE_BYTES = 2 * KV_BYTES + BIAS_TILE_BYTES;  // K, V, then the bias tile
constexpr int S_REGS = BLOCK_N / 2;        // 64 x BLOCK_N f32 over 128 threads
constexpr int O_REGS = HEAD_DIM / 2;
constexpr int K_STEP = FP8 ? 32 : 16;     // wgmma's k: 32 bytes of a panel row either way
constexpr int K_STEPS = HEAD_DIM / K_STEP;  // k-steps of Q·Kᵀ
constexpr int PV_STEPS = BLOCK_N / K_STEP;  // k-steps of P·V
constexpr float LN2 = 0.6931471805599453f;
// Named barriers (0 is __syncthreads): the issue turn of each consumer (ping-pong: consumer c
// waits on BAR_TURN + c, then passes the turn to c + 1), then one per consumer for its epilogue.
constexpr int BAR_TURN = 1;
constexpr int BAR_EPILOGUE = BAR_TURN + CONSUMERS;

static_assert(HEAD_DIM % 64 == 0 && HEAD_DIM <= 256, "head_dim is whole 64-column panels, N <= 256");
// S is one wgmma of N = BLOCK_N (wgmma_gen.cuh has 64, 80, 96, 128, 176, 192, 256); P·V steps
// over it 16 keys at a time; a K/V panel of BLOCK_N rows stays 1024-byte aligned.
static_assert(BLOCK_N % 16 == 0 && BLOCK_N >= 64 && BLOCK_N <= 256, "BLOCK_N");
static_assert(STAGES >= 2 && STAGES <= 4, "a 2-4 stage ring");
static_assert(CONSUMERS == 2 || CONSUMERS == 3, "two or three consumer warpgroups");
// setmaxnreg moves registers within what the CTA was launched with (65536 / THREADS a thread,
// rounded down to 8), not the whole file: a budget above it waits in setmaxnreg.inc forever.
static_assert(PRODUCER_REGS * 128 + CONSUMER_REGS * 128 * CONSUMERS <= THREADS * (65536 / THREADS / 8 * 8),
              "the registers the CTA was launched with");
static_assert(Q_REGION_BYTES + STAGES * STAGE_BYTES + 1024 <= 227 * 1024, "shared memory");

// The K/V ring, as the producer and the consumers both count it: the it-th tile through the ring
// takes stage it % STAGES, on that stage's use it / STAGES, whose parity its mbarriers wait on.
// Both repeat every 2·STAGES tiles, so the count is kept below that (ring_advance) and cannot
// overflow however many work tiles a persistent block runs.
struct RingSlot {
    int stage;
    u32 parity;
};
__device__ __forceinline__ RingSlot ring_slot(int it) { return RingSlot{it % STAGES, (u32)((it / STAGES) & 1)}; }
// The count after a work tile of n K/V tiles.
__device__ __forceinline__ int ring_advance(int it, int n) { return (it + n) % (2 * STAGES); }
// FP8's 256-key tiles: S's 128 registers a thread beside O's 64 (head_dim 128), with no room for
// overlap's P (src/cuda/plan/fp8.rs refuses the rest).
static_assert(TILE_SCALES == 1 || (HEAD_DIM == 128 && !OVERLAP), "FP8's 256-key tiles");
static_assert(!BIAS_TMA || (HAS_BIAS && !FP8 && BLOCK_N % 64 == 0), "a staged bias: whole 64-key panels");
static_assert(!FP8 || (BLOCK_N % 128 == 0 && HEAD_DIM % 128 == 0 && !PV_SPLIT && !HAS_ALIBI && !HAS_BIAS && !HAS_SOFTCAP),
              "FP8: whole 128-byte panels, plain attention, no P·V split");

struct TmaMaps {
    TensorMap q, k, v;  // FP8: Q8, K8 and Vt8
};

// A persistent launch's work tiles (the grid a plain launch would have): WorkGrid in
// src/cuda/launch.rs.
struct WorkGrid {
    int* next_tile;  // dynamic launches' counter: 0 at launch, left at 0 (see next_work)
    int q_tiles, heads, batch;
};

// One work tile: BLOCK_M query rows of one (batch, head), and the K/V tiles they see.
struct WorkTile {
    int q_tile, head, batch, kv_head;
    int m0;          // the tile's first query row in its sequence
    SeqRows seq;
    int first_tile;  // K/V tile j of this work tile is at key (first_tile + j) · BLOCK_N
    int n_tiles;
    int map_batch;   // the tensor maps' batch and Q row of the tile's first row
    int q_row0;
};

// Work tile (q, head, batch) of a grid of q_tiles query tiles. Causal: the last query tiles see
// the most keys; they go first (in a plain launch, and among a head's tiles in a persistent one)
// so that the long tiles don't start last and leave the tail of the launch running alone.
__device__ __forceinline__ WorkTile work_tile(const FwdParams& p, int q, int head, int batch, int q_tiles) {
    WorkTile t;
    t.q_tile = CAUSAL ? q_tiles - 1 - q : q;
    t.head = head;
    t.batch = batch;
    t.kv_head = t.head / p.group_size;
    t.m0 = t.q_tile * BLOCK_M;
    t.seq = sequence_rows(p, t.batch);
    // The K/V tiles some row sees, from the one holding the first row's window edge.
    const int n_end = visible_keys_end<CAUSAL>(p, t.seq, t.m0, BLOCK_M);
    t.first_tile = keys_seen<CAUSAL>(p, t.seq, t.m0).x / BLOCK_N;
    const int end_tile = (n_end + BLOCK_N - 1) / BLOCK_N;
    t.n_tiles = end_tile > t.first_tile ? end_tile - t.first_tile : 0;
    // A packed batch is one batch of all sequences' rows for the tensor maps, and its copies
    // start at the sequence's first row (rows past it belong to the next sequence or are zero
    // past the tensor: masked, or computed and not stored).
    t.map_batch = p.cu_seqlens_q != nullptr ? 0 : t.batch;
    t.q_row0 = t.seq.q_first + t.m0;
    return t;
}

// A persistent block stores O straight from the accumulators (by then its Q region holds the
// next tile's Q). The accumulator layout gives each lane of a quad 4 bytes of every 16-byte chunk
// of a row (chunk c: columns 8c..8c+7, lane q's pair 8c + 2q, +1). One 4-byte store a chunk
// filled the memory-instruction queue at short sequences (ncu: lg_throttle), so the quad first
// trades pieces: two butterfly rounds of shuffles leave lane q the whole of chunk 4g + q of each
// group of four, one 16-byte store each (a quarter of the store instructions; head_dim 128 seq
// 1024, causal: 1.12× the 4-byte stores' rate). With 192-key tiles and more the wide stores
// measured slower at seq 8192 (0.92–0.97×), so those keep one 4-byte store a chunk (BENCHMARKS.md,
// session 42).
constexpr bool O_QUAD_STORES = BLOCK_N <= 176;
// `w[c]`: this lane's packed pair of chunk c of one row; q: the lane in its quad. Every lane of
// the warp runs the shuffles; `store` (the row is in the sequence) only guards the stores.
template <int CHUNKS>
__device__ __forceinline__ void store_row_from_quad(u16* row_out, const u32 (&w)[CHUNKS], int q, bool store) {
    static_assert(CHUNKS % 4 == 0, "groups of four chunks");
    constexpr unsigned FULL = 0xffffffffu;
    const bool odd = q & 1, hi = q & 2;
#pragma unroll
    for (int g = 0; g < CHUNKS / 4; ++g) {
        const u32* v = &w[4 * g];
        // Round 1 (lanes q, q ^ 2): keep the pair of chunks 2·hi, 2·hi + 1, send the other pair.
        const u32 a0 = hi ? v[2] : v[0], a1 = hi ? v[3] : v[1];
        const u32 s0 = __shfl_xor_sync(FULL, hi ? v[0] : v[2], 2);
        const u32 s1 = __shfl_xor_sync(FULL, hi ? v[1] : v[3], 2);
        // Round 2 (lanes q, q ^ 1): keep chunk q's pieces (from lanes q and q ^ 2), send the other.
        const u32 t0 = __shfl_xor_sync(FULL, odd ? a0 : a1, 1);  // from lane q ^ 1
        const u32 t1 = __shfl_xor_sync(FULL, odd ? s0 : s1, 1);  // from lane q ^ 3
        u32 x[4] = {odd ? a1 : a0, t0, odd ? s1 : s0, t1};         // from lanes q, q^1, q^2, q^3
        // In source-lane order: x[p ^ q] is lane p's piece.
        if (odd) {
            const u32 x0 = x[0], x2 = x[2];
            x[0] = x[1], x[1] = x0, x[2] = x[3], x[3] = x2;
        }
        if (hi) {
            const u32 x0 = x[0], x1 = x[1];
            x[0] = x[2], x[1] = x[3], x[2] = x0, x[3] = x1;
        }
        const int c = 4 * g + q;
        if (store && in_head_dim(c)) st_global_v4(row_out + 8 * c, x);
    }
}

// A staged bias tile's words for the warp whose 16 rows start at row `rows` of the tile at `tile`,
// four per ldmatrix, each handed to take(jn, r, word) (slab jn, row r: the word S accumulators
// 4·jn + 2·r, +1 hold): for an even chunk c (8 keys) the 8 x 8 matrices (rows g, chunk c),
// (g + 8, c), (g, c + 1), (g + 8, c + 1), lane L addressing row L % 8 + 8 · (L / 8 % 2) and chunk
// c + L / 16. The rows' swizzle is L % 8 (`rows` is a multiple of 8), so the 8 rows of a matrix
// fall in distinct 16-byte bank groups.
template <class Take>
__device__ __forceinline__ void for_staged_bias_words(u32 tile, int rows, int lane, Take&& take) {
    const int lr = rows + (lane & 7) + 8 * ((lane >> 3) & 1);
#pragma unroll
    for (int c = 0; c < BLOCK_N / 8; c += 2) {
        const int chunk = c + (lane >> 4);
        u32 w[4];
        ldmatrix_x4(w, tile + (chunk / 8) * BIAS_PANEL_BYTES + lr * ROW_BYTES + (((chunk % 8) ^ (lane & 7)) << 4));
        take(c, 0, w[0]), take(c, 1, w[1]), take(c + 1, 0, w[2]), take(c + 1, 1, w[3]);
    }
}

// FP8's scales (Fp8Layout in src/cuda/plan/fp8.rs): [batch, heads, q_blocks] per 64 query rows,
// [batch, kv_heads, kv_blocks] per 128 keys for K and for V (TILE_SCALES of them a tile).
struct Fp8Scales {
    const float* q;
    const float* k;
    const float* v;
    int q_blocks;
    int kv_blocks;
};

extern "C" __global__ void __launch_bounds__(THREADS, 1)
    KERNEL_NAME(const __grid_constant__ FwdParams p, const __grid_constant__ TmaMaps maps
#if FA_FP8
                , const __grid_constant__ Fp8Scales fp8
#endif
#if FA_BIAS_TMA
                , const __grid_constant__ TensorMap bias_map  // (keys, query rows, heads | 1, batch | 1)
#endif
#if FA_PERSISTENT
                , const __grid_constant__ WorkGrid work
#endif
    ) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    // q_full, then k_full[STAGES], v_full[STAGES], empty[STAGES], q_empty.
    __shared__ __align__(8) u64 bars[2 + 3 * STAGES];

    // The dynamic buffer's start is not promised to be 1024-byte aligned: round up (the host
    // asks for 1024 bytes more than the tiles need).
    const u32 s_q = (smem_addr(smem_raw) + 1023u) & ~1023u;
    const u32 s_kv = s_q + Q_REGION_BYTES;  // stage s: K at s_kv + s·STAGE_BYTES, V KV_BYTES later
    const u32 bar_q = smem_addr(&bars[0]);
    auto bar_k_full = [&](int s) { return bar_q + 8u * (1 + s); };
    auto bar_v_full = [&](int s) { return bar_q + 8u * (1 + STAGES + s); };
    auto bar_empty = [&](int s) { return bar_q + 8u * (1 + 2 * STAGES + s); };
    const u32 bar_q_empty = bar_q + 8u * (1 + 3 * STAGES);

    const int tid = threadIdx.x;
    const int wg = tid / 128;
    // The work tiles this CTA runs, w = first, first + step, ... below n_work: a plain launch's
    // own tile (the block's coordinates; the loops below end after one), a persistent one's every
    // gridDim.x-th or, dynamic, those it draws (next_work) (fewer than 2^30 tiles, so w stays in
    // range: persistent_grid in src/cuda/plan/wgmma.rs), in a plain grid's launch order, q tile
    // fastest: the blocks running at once share a few heads' K/V in L2. Causal launches too:
    // ordered q slowest, every round of gridDim.x tiles of one length, they measured slower still
    // (BENCHMARKS.md, session 40).
#if FA_PERSISTENT
    const int q_tiles = work.q_tiles, heads = work.heads;
    const int n_work = q_tiles * heads * work.batch;
    const int first = blockIdx.x, step = gridDim.x;
    auto tile_of = [&](int w) { return work_tile(p, w % q_tiles, w / q_tiles % heads, w / q_tiles / heads, q_tiles); };
    // The producer's next tile after w. Dynamic: the first gridDim.x tiles are the blocks' own,
    // the rest are drawn in turn, so a block that finishes early takes the next (the hardware's
    // way with a plain launch's CTAs). Every tile is followed by one draw, so the launch makes
    // n_work draws and the one that gets n_work - 1 is the last: its block puts the counter back
    // to 0 for the next launch on the stream.
    auto next_work = [&](int w) {
        if constexpr (DYNAMIC) {
            const int drawn = atomicAdd(work.next_tile, 1);
            if (drawn == n_work - 1) atomicExch(work.next_tile, 0);
            return (int)gridDim.x + drawn;
        } else {
            return w + step;
        }
    };
#else
    const int n_work = 1, first = 0, step = 1;
    auto tile_of = [&](int) { return work_tile(p, blockIdx.x, blockIdx.y, blockIdx.z, gridDim.x); };
    auto next_work = [&](int w) { return w + step; };
#endif
    // Dynamic launches: the producer names each tile it loads here before Q's arrival, -1 when
    // there are no more; the consumers read it once Q has landed.
    __shared__ int announced_tile;

    if (tid == 0) {
        mbar_init(bar_q, 1);
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(bar_k_full(s), 1);
            mbar_init(bar_v_full(s), 1);
            mbar_init(bar_empty(s), CONSUMERS * 4);  // one arrival per consumer warp
        }
        mbar_init(bar_q_empty, CONSUMERS * 4);
        mbar_fence_init();
    }
    __syncthreads();

    if (wg == 0) {
        // ---- producer ----
        regs_dealloc<PRODUCER_REGS>();
        if (tid == 0) {
            // The ring's position (K/V tiles issued before this work tile's, mod 2·STAGES), work
            // tiles run.
            int kv_done = 0, tiles_done = 0;
            for (int w = first; w < n_work; w = next_work(w)) {
                const WorkTile wt = tile_of(w);
                if (wt.m0 >= wt.seq.seq_q) continue;  // past this sequence's rows (packed batch)
                // The previous tile's Q is free once both consumers' last Q·Kᵀ has completed.
                if (PERSISTENT && tiles_done > 0) mbar_wait(bar_q_empty, (tiles_done - 1) & 1);
                if constexpr (DYNAMIC) announced_tile = w;
                mbar_arrive_expect_tx(bar_q, Q_BYTES);
#pragma unroll
                for (int pn = 0; pn < PANELS; ++pn)
                    tma_load_4d(s_q + pn * Q_PANEL_BYTES, &maps.q, pn * PANEL_ELEMS, wt.q_row0, wt.head, wt.map_batch,
                                bar_q);
                for (int j = 0; j < wt.n_tiles; ++j) {
                    const RingSlot slot = ring_slot(kv_done + j);
                    const int s = slot.stage;
                    // A use of stage s waits for the consumers' release of the use before it.
                    mbar_wait(bar_empty(s), slot.parity ^ 1);
                    const int n0 = (wt.first_tile + j) * BLOCK_N;
                    const u32 k_dst = s_kv + s * STAGE_BYTES;
                    mbar_arrive_expect_tx(bar_k_full(s), KV_BYTES + BIAS_TILE_BYTES);
#pragma unroll
                    for (int pn = 0; pn < PANELS; ++pn)
                        tma_load_4d(k_dst + pn * KV_PANEL_BYTES, &maps.k, pn * PANEL_ELEMS, wt.seq.kv_first + n0,
                                    wt.kv_head, wt.map_batch, bar_k_full(s));
#if FA_BIAS_TMA
                    // The bias counts rows and keys from the sequence's start; a broadcast dimension
                    // has extent 1 in its map.
#pragma unroll
                    for (int pn = 0; pn < BLOCK_N / 64; ++pn)
                        tma_load_4d(k_dst + 2 * KV_BYTES + pn * BIAS_PANEL_BYTES, &bias_map, n0 + 64 * pn, wt.m0,
                                    p.bias_head_stride != 0 ? wt.head : 0, p.bias_batch_stride != 0 ? wt.batch : 0,
                                    bar_k_full(s));
#endif
                    mbar_arrive_expect_tx(bar_v_full(s), KV_BYTES);
                    if constexpr (FP8) {
#pragma unroll
                        for (int pn = 0; pn < VT_PANELS; ++pn)
                            tma_load_4d(k_dst + KV_BYTES + pn * VT_PANEL_BYTES, &maps.v, n0 + 128 * pn, 0, wt.kv_head,
                                        wt.map_batch, bar_v_full(s));
                    } else {
#pragma unroll
                        for (int pn = 0; pn < PANELS; ++pn)
                            tma_load_4d(k_dst + KV_BYTES + pn * KV_PANEL_BYTES, &maps.v, pn * 64, wt.seq.kv_first + n0,
                                        wt.kv_head, wt.map_batch, bar_v_full(s));
                    }
                }
                kv_done = ring_advance(kv_done, wt.n_tiles);
                ++tiles_done;
                if constexpr (!PERSISTENT) break;
            }
            if constexpr (DYNAMIC) {
                // No more tiles: once the consumers are past the last Q, a phase of bar_q with
                // no copies tells them so.
                if (tiles_done > 0) mbar_wait(bar_q_empty, (tiles_done - 1) & 1);
                announced_tile = -1;
                mbar_arrive(bar_q);
            }
        }
        return;
    }

    // ---- consumers ----
    regs_alloc<CONSUMER_REGS>();
    const int cw = wg - 1;          // consumer 0 or 1
    const int t = tid - 128 * wg;   // thread in the warpgroup
    const int warp = t / 32;
    const int lane = t % 32;
    const int local_row = 16 * warp + lane / 4;  // this thread's rows: local_row and local_row + 8
    const u32 q_wg = s_q + cw * WG_ROWS * ROW_BYTES;  // this warpgroup's 64 rows of every Q panel

    // Descriptors of k-step 0 (stage 0); the others differ only in the start address, added in
    // 16-byte units (the field cannot overflow: shared addresses are below 2^18).
    const u64 q_desc = wgmma_desc(q_wg, 16, 1024);
    const u64 k_desc = wgmma_desc(s_kv, 16, 1024);
    // V: N-major 16-bit panels, or FP8's transposed V, K-major like K.
    const u64 v_desc = FP8 ? wgmma_desc(s_kv + KV_BYTES, 16, 1024)
                           : wgmma_desc(s_kv + KV_BYTES, PV_SPLIT ? 1024 : KV_PANEL_BYTES, 1024);
    auto desc_add = [](u64 d, u32 bytes) { return d + (u64)(bytes >> 4); };
    // The score terms' per-thread constants (score_units and the helpers in fwd_params.cuh):
    // terms go into x units (divided by fold) once here.
    const ScoreUnits units = score_units(p);

    // Consumer 0 issues first: the last consumer hands it the turn.
    if (PINGPONG && cw == CONSUMERS - 1) named_bar_arrive(BAR_TURN + 0, 2 * 128);

    // The ring's position (K/V tiles consumed before this work tile's, mod 2·STAGES), work tiles
    // run.
    int kv_done = 0, tiles_done = 0;
    for (int w_next = first;;) {
        // The tile: in a dynamic launch the one the producer announced with Q (which has then
        // landed), else the next of this block's.
        int w;
        if constexpr (DYNAMIC) {
            mbar_wait(bar_q, tiles_done & 1);
            w = announced_tile;
            if (w < 0) break;
        } else {
            if (w_next >= n_work) break;
            w = w_next;
            w_next += step;
        }
        const WorkTile wt = tile_of(w);
        if (wt.m0 >= wt.seq.seq_q) continue;  // as the producer (which never announces one)
        const int q_tile = wt.q_tile, head = wt.head, batch = wt.batch, kv_head = wt.kv_head;
        const int first_tile = wt.first_tile, n_tiles = wt.n_tiles;
        const SeqRows& seq = wt.seq;
        const int wg_m0 = wt.m0 + cw * WG_ROWS;
        const int row0 = wg_m0 + local_row;
        const float slope_log2 = alibi_slope_log2(p, head);
        const float sink = sink_log2(p, head);
        // Ring stage and phase of this work tile's K/V tile j.
        auto stage = [&](int j) { return ring_slot(kv_done + j).stage; };
        auto phase = [&](int j) { return ring_slot(kv_done + j).parity; };
        // Once every consumer warp has passed its last Q·Kᵀ of the tile, the producer may load the
        // next tile's Q (persistent launches).
        auto release_q = [&]() {
            if constexpr (PERSISTENT) {
                __syncwarp();
                if (lane == 0) mbar_arrive(bar_q_empty);
            }
        };

        float o[O_REGS];
        float s_acc[S_REGS];
        u32 pf[PV_STEPS][4];  // P of the previous tile as wgmma A fragments
        float row_max[2] = {NEG_INF, NEG_INF};  // running max of the log2-scaled scores
        float row_sum[2] = {0.f, 0.f};          // this thread's part of the running sum
#pragma unroll
        for (int i = 0; i < O_REGS; ++i) o[i] = 0.f;
#pragma unroll
        for (int i = 0; i < S_REGS; ++i) s_acc[i] = 0.f;

        auto issue_qk = [&](int s) {
            const u32 stage = s * STAGE_BYTES;
#pragma unroll
            for (int kk = 0; kk < K_STEPS; ++kk) {
                const u32 off = (kk % 4) * 32u;  // k-step inside a panel
                const u64 a = desc_add(q_desc, (kk / 4) * Q_PANEL_BYTES + off);
                const u64 b = desc_add(k_desc, stage + (kk / 4) * KV_PANEL_BYTES + off);
                if constexpr (FP8)
                    wgmma_ss_e4m3<BLOCK_N>(s_acc, a, b, kk > 0);
                else
                    wgmma_ss<BLOCK_N, IS_BF16>(s_acc, a, b, kk > 0);
            }
        };
        auto issue_pv = [&](int s) {
            const u32 stage = s * STAGE_BYTES;
#pragma unroll
            for (int kk = 0; kk < PV_STEPS; ++kk) {
                const u32 off = stage + kk * 16 * ROW_BYTES;  // 16 keys down
                if constexpr (FP8) {
                    // 32 keys along the transposed rows, 128 to a panel.
                    const u32 at = stage + (kk / 4) * VT_PANEL_BYTES + (kk % 4) * 32u;
                    wgmma_rs_e4m3<HEAD_DIM>(o, pf[kk], desc_add(v_desc, at), 1);
                } else if constexpr (PV_SPLIT) {
#pragma unroll
                    for (int pn = 0; pn < PANELS; ++pn)
                        wgmma_rs<64, IS_BF16>(*reinterpret_cast<float(*)[32]>(&o[32 * pn]), pf[kk],
                                              desc_add(v_desc, off + pn * KV_PANEL_BYTES), 1);
                } else {
                    wgmma_rs<HEAD_DIM, IS_BF16>(o, pf[kk], desc_add(v_desc, off), 1);
                }
            }
        };
        // P's registers are read by an in-flight wgmma until the wait that ends its group: the fence
        // after that wait keeps the compiler from reusing them for anything else earlier.
        auto fence_p = [&]() {
#pragma unroll
            for (int kk = 0; kk < PV_STEPS; ++kk) fence_regs(pf[kk]);
        };
        auto turn_begin = [&]() {
            if constexpr (PINGPONG) named_bar_sync(BAR_TURN + cw, 2 * 128);
        };
        auto turn_end = [&]() {
            if constexpr (PINGPONG) named_bar_arrive(BAR_TURN + (cw + 1) % CONSUMERS, 2 * 128);
        };
        auto release = [&](int s) {
            __syncwarp();
            if (lane == 0) mbar_arrive(bar_empty(s));
        };

        // FP8: this warpgroup's Q scale, the K and V scales of the tile in flight (loaded while its S
        // is computed, like the bias), and the V reference O is kept in units of (0 before any tile).
        float q_scale = 1.f, v_ref = 0.f;
        float k_scale[TILE_SCALES], v_scale[TILE_SCALES];
#pragma unroll
        for (int h = 0; h < TILE_SCALES; ++h) k_scale[h] = v_scale[h] = 1.f;
#if FA_FP8
        // The last tile's second warpgroup may hold only rows past seq_q (none stored): its block
        // is past the head's scales, so it reads the last one's.
        const int q_block = min(q_tile * CONSUMERS + cw, fp8.q_blocks - 1);
        q_scale = __ldg(fp8.q + ((i64)batch * p.num_heads + head) * fp8.q_blocks + q_block);
#endif
        auto load_scales = [&](int j) {
#if FA_FP8
            const i64 head_at = ((i64)batch * (p.num_heads / p.group_size) + kv_head) * fp8.kv_blocks;
#pragma unroll
            for (int h = 0; h < TILE_SCALES; ++h) {
                // A block past the last key (the second half of a tile that overruns seq_kv) has no
                // scale; its keys are masked, so any finite one will do: the last block's.
                const int block = min((first_tile + j) * TILE_SCALES + h, fp8.kv_blocks - 1);
                k_scale[h] = __ldg(fp8.k + head_at + block);
                v_scale[h] = __ldg(fp8.v + head_at + block);
            }
#endif
        };
        const float slope_x = slope_log2 / units.fold;
        const float bias_k = LOG2E_F / units.fold;
        const unsigned char* bias_at[2] = {nullptr, nullptr};
        bool bias_pairs[2] = {false, false};
        if constexpr (HAS_BIAS && !BIAS_TMA) {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                bias_at[r] = bias_row(p, batch, head, row0 + 8 * r);
                bias_pairs[r] = bias_pairs_ok(p, bias_at[r]);
            }
        }
        // A 16-bit bias tile's words (columns 8·jn + 2·(lane % 4) + {0, 1} of both rows): where
        // BLOCK_N / 4 more registers fit beside O, S (and P with overlap) with room for addresses,
        // they are loaded right after S(j) is issued, so that their latency hides behind the tensor
        // cores; otherwise (three consumers, the widest tiles) the softmax reads them as it adds them
        // (always so for an f32 bias, twice the registers).
        constexpr bool BIAS_PREFETCH =
            HAS_BIAS && O_REGS + S_REGS + (OVERLAP ? S_REGS / 2 : 0) + BLOCK_N / 4 <= CONSUMER_REGS - 56;
        u32 bias_w[BIAS_PREFETCH ? BLOCK_N / 8 : 1][2];
        // Tile j's staged bias (for_staged_bias_words reads this warp's rows of it).
        auto staged_bias = [&](int j) { return s_kv + stage(j) * STAGE_BYTES + 2 * KV_BYTES; };
        auto load_bias = [&](int j) {
            if constexpr (BIAS_PREFETCH && BIAS_TMA) {
                for_staged_bias_words(staged_bias(j), cw * WG_ROWS + 16 * warp, lane,
                                      [&](int jn, int r, u32 w) { bias_w[BIAS_PREFETCH ? jn : 0][r] = w; });
            } else if constexpr (BIAS_PREFETCH) {
                if (p.bias_dtype == 0) return;
                const int col0 = (first_tile + j) * BLOCK_N + 2 * (lane % 4);
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const int limit = bias_limit(seq, row0 + 8 * r, col0);
#pragma unroll
                    for (int jn = 0; jn < (BIAS_PREFETCH ? BLOCK_N / 8 : 1); ++jn)
                        bias_w[jn][r] = bias_pair16(bias_at[r] + 2 * (i64)col0, 8 * jn, limit, bias_pairs[r]);
                }
            }
        };

        // Online softmax of tile j in place: s_acc becomes P (f32), the running max and sum move on,
        // and alpha is what O (accumulated under the old max) must be multiplied by.
        auto softmax = [&](int j, float (&alpha)[2]) {
            const int n0 = (first_tile + j) * BLOCK_N;
            // Scores in x units (score_units): nothing to do for plain attention with a positive
            // scale, whose exp2(s·scale - max) is one FFMA per score. FP8's Q and K scales join the
            // factor, one per scale block of the tile (h: slab jn / SCALE_SLABS, register i / (4 ·
            // SCALE_SLABS)).
            ScoreUnits u[TILE_SCALES];
            float sc[TILE_SCALES];
#pragma unroll
            for (int h = 0; h < TILE_SCALES; ++h) {
                u[h] = FP8 ? scaled_units(units, q_scale * k_scale[h]) : units;
                sc[h] = u[h].fold;
            }
            if (HAS_SOFTCAP || units.pre != 1.f) {
#pragma unroll
                for (int i = 0; i < S_REGS; ++i) s_acc[i] = score_x(u[i / (4 * SCALE_SLABS)], s_acc[i]);
            }
            // The bias first: its prefetched words are free once added.
            if constexpr (HAS_BIAS) {
                const int col0 = n0 + 2 * (lane % 4);
                // The word of 16-bit values of slab jn, row r, into its two scores.
                auto add_bias16 = [&](int jn, int r, u32 w) {
                    const float2 b = bias_unpack16(w, p.bias_dtype);
                    s_acc[4 * jn + 2 * r] = fmaf(b.x, bias_k, s_acc[4 * jn + 2 * r]);
                    s_acc[4 * jn + 2 * r + 1] = fmaf(b.y, bias_k, s_acc[4 * jn + 2 * r + 1]);
                };
                if constexpr (BIAS_TMA && !BIAS_PREFETCH) {
                    // Each word added as it arrives.
                    for_staged_bias_words(staged_bias(j), cw * WG_ROWS + 16 * warp, lane, add_bias16);
                } else if (BIAS_TMA || p.bias_dtype != 0) {
#pragma unroll
                    for (int r = 0; r < 2; ++r) {
                        const int limit = bias_limit(seq, row0 + 8 * r, col0);
#pragma unroll
                        for (int jn = 0; jn < BLOCK_N / 8; ++jn) {
                            const u32 w = BIAS_PREFETCH ? bias_w[BIAS_PREFETCH ? jn : 0][r]
                                                        : bias_pair16(bias_at[r] + 2 * (i64)col0, 8 * jn, limit, bias_pairs[r]);
                            add_bias16(jn, r, w);
                        }
                    }
                } else {
#pragma unroll
                    for (int r = 0; r < 2; ++r) {
                        const int limit = bias_limit(seq, row0 + 8 * r, col0);
#pragma unroll
                        for (int jn = 0; jn < BLOCK_N / 8; ++jn) {
                            const float2 b = bias_pair32(bias_at[r] + 4 * (i64)col0, 8 * jn, limit, bias_pairs[r]);
                            s_acc[4 * jn + 2 * r] = fmaf(b.x, bias_k, s_acc[4 * jn + 2 * r]);
                            s_acc[4 * jn + 2 * r + 1] = fmaf(b.y, bias_k, s_acc[4 * jn + 2 * r + 1]);
                        }
                    }
                }
            }
            // ALiBi's per-row base (0 on the diagonal), added to the lane's max (before the quad's
            // max: each lane's base is its own) and to its exp2's FFMA.
            float base[2] = {0.f, 0.f};
            if constexpr (HAS_ALIBI) {
                // This lane's first column of the tile, and each of its rows' position relative to it.
                const int col0 = n0 + 2 * (lane % 4);
                const float rel[2] = {(float)(row0 + seq.causal_offset - col0), (float)(row0 + 8 + seq.causal_offset - col0)};
                float k[2];
                bool linear = true;
#pragma unroll
                for (int r = 0; r < 2; ++r)
                    linear &= alibi_linear(slope_x, slope_log2, rel[r], (float)(BLOCK_N - 7), CAUSAL, k[r], base[r]);
                if (__all_sync(0xffffffffu, linear)) {
#pragma unroll
                    for (int i = 0; i < S_REGS; ++i) {
                        const int r = (i >> 1) & 1, c = 8 * (i / 4) + (i & 1);
                        s_acc[i] = fmaf(k[r], (float)c, s_acc[i]);
                    }
                } else {
                    base[0] = base[1] = 0.f;
#pragma unroll
                    for (int i = 0; i < S_REGS; ++i) {
                        const int r = (i >> 1) & 1, c = 8 * (i / 4) + (i & 1);
                        s_acc[i] = alibi_x(s_acc[i], slope_x, rel[r], (float)c);
                    }
                }
            }
            // Mask where the tile runs past what the warpgroup's first row sees (end of the keys,
            // diagonal, window's right edge) or starts before what its last row sees (window's left
            // edge).
            const bool need_mask = n0 + BLOCK_N > keys_seen<CAUSAL>(p, seq, wg_m0).y ||
                                   n0 < keys_seen<CAUSAL>(p, seq, wg_m0 + WG_ROWS - 1).x;
            if (need_mask) {
                // Each row's visible keys relative to this lane's first column, so that every score
                // compares its compile-time offset. They are worked out here, in the rare masked
                // tiles, rather than held across the loop: beside FP8's 256-key tiles those registers
                // would spill.
                const int col0 = n0 + 2 * (lane % 4);
                const int row = computed_here(row0);
                int2 seen[2] = {keys_seen<CAUSAL>(p, seq, row), keys_seen<CAUSAL>(p, seq, row + 8)};
#pragma unroll
                for (int r = 0; r < 2; ++r) seen[r] = make_int2(seen[r].x - col0, seen[r].y - col0);
#pragma unroll
                for (int i = 0; i < S_REGS; ++i) {
                    const int c = 8 * (i / 4) + (i & 1);
                    const int2 keys = seen[(i >> 1) & 1];
                    if (c < keys.x || c >= keys.y) s_acc[i] = NEG_INF;
                }
            }
            // Both rows' maxima first (m_ref, base 2), then their exp2s: exp2(x·k + shift) is one FFMA
            // a score, with k = the score's block's fold and shift = base - m_ref.
            float m_ref[2], k[2][TILE_SCALES], shift[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                // The running max stays in base-2 logits (x·fold, plus ALiBi's base). Each scale
                // block's max goes to logits by its own fold (rounded as each of its scores would be:
                // fold > 0, so the max of the products is the product of the max), and with ALiBi by
                // the lane's own base (it depends on the lane's first column), before the quad's max.
                float mx = NEG_INF;
#pragma unroll
                for (int h = 0; h < TILE_SCALES; ++h) {
                    float mh = NEG_INF;  // this block's max in x units
#pragma unroll
                    for (int jn = h * SCALE_SLABS; jn < (h + 1) * SCALE_SLABS; ++jn)
                        mh = fmaxf(mh, fmaxf(s_acc[4 * jn + 2 * r], s_acc[4 * jn + 2 * r + 1]));
                    mx = fmaxf(mx, HAS_ALIBI ? fmaf(mh, sc[h], base[r]) : mh * sc[h]);
                }
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                mx = fmaxf(row_max[r], mx);
                // A row that has seen only masked keys keeps max -inf; subtract 0 instead so that
                // exp2(-inf - -inf) never makes a NaN. Its probabilities are all exp2(-inf) = 0.
                const float m_use = mx == NEG_INF ? 0.f : mx;
                alpha[r] = ex2(row_max[r] - m_use);
                row_max[r] = mx;
                m_ref[r] = m_use;
#pragma unroll
                for (int h = 0; h < TILE_SCALES; ++h) k[r][h] = sc[h];
                shift[r] = HAS_ALIBI ? base[r] - m_use : -m_use;
            }
            // Rows whose max is huge (is_huge_reference; rare, one vote a tile) take their logits
            // minus the max here instead: rounded exactly as the max was (an FMUL, or ALiBi's FFMA),
            // then the max subtracted, so 0 at the max itself; the FFMA below then adds nothing.
            if (__any_sync(0xffffffffu, is_huge_reference(m_ref[0]) || is_huge_reference(m_ref[1]))) {
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    if (!is_huge_reference(m_ref[r])) continue;
#pragma unroll
                    for (int jn = 0; jn < BLOCK_N / 8; ++jn)
#pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            float& x = s_acc[4 * jn + 2 * r + e];
                            const float f = sc[jn / SCALE_SLABS];
                            x = __fsub_rn(HAS_ALIBI ? fmaf(x, f, base[r]) : __fmul_rn(x, f), m_ref[r]);
                        }
#pragma unroll
                    for (int h = 0; h < TILE_SCALES; ++h) k[r][h] = 1.f;
                    shift[r] = 0.f;
                }
            }
            // FP8: P leaves the exp2 times 256 · v_scale / v_ref (e4m3 values up to 256, in the
            // units of the largest V scale so far: a larger one rescales O with alpha below); the
            // row sum takes the plain P back, block by block.
            float v_ratio = 1.f, p_unit[TILE_SCALES], p_shift[TILE_SCALES];
#pragma unroll
            for (int h = 0; h < TILE_SCALES; ++h) p_unit[h] = 1.f, p_shift[h] = 0.f;
            if constexpr (FP8) {
                float v_max = v_scale[0];
#pragma unroll
                for (int h = 1; h < TILE_SCALES; ++h) v_max = fmaxf(v_max, v_scale[h]);
                if (v_max > v_ref) {
                    v_ratio = v_ref / v_max;
                    v_ref = v_max;
                }
#pragma unroll
                for (int h = 0; h < TILE_SCALES; ++h) {
                    p_unit[h] = v_ref / (256.f * v_scale[h]);
                    p_shift[h] = -__log2f(p_unit[h]);
                }
            }
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                row_sum[r] *= alpha[r];
                alpha[r] *= v_ratio;  // O's own factor (1 but for FP8)
            }
            // The probabilities, a scale block at a time.
#pragma unroll
            for (int h = 0; h < TILE_SCALES; ++h) {
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const float shift_h = FP8 ? shift[r] + p_shift[h] : shift[r];
                    float sum = 0.f;
#pragma unroll
                    for (int jn = h * SCALE_SLABS; jn < (h + 1) * SCALE_SLABS; ++jn) {
                        const bool on_fma = jn % 4 < EX2_FMA_TILES;  // compile-time: the loop is unrolled
#pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            const float x = fmaf(s_acc[4 * jn + 2 * r + e], k[r][h], shift_h);
                            s_acc[4 * jn + 2 * r + e] = on_fma ? ex2_fma(x) : ex2(x);
                        }
                        sum += s_acc[4 * jn + 2 * r] + s_acc[4 * jn + 2 * r + 1];
                    }
                    row_sum[r] = fmaf(sum, p_unit[h], row_sum[r]);
                }
            }
            // Dropout (dropout.cuh): after the sums, which are the undropped softmax's.
            if constexpr (HAS_DROPOUT) drop_probabilities<BLOCK_N / 8>(p, s_acc, batch, head, row0, n0, lane);
        };
        // Once the running max settles (most tiles of a long row), alpha is exactly 1: skip the
        // multiplies when it is for every row of the warp.
        auto rescale_o = [&](const float (&alpha)[2]) {
            if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
                for (int i = 0; i < O_REGS; ++i) o[i] *= alpha[(i >> 1) & 1];
            }
        };
        // Pins the softmax's results before the wait on P·V in NVVM's order. ptxas 13.0 still
        // schedules that wait right after the one on S (seen in the SASS: WARPGROUP.DEPBAR.LE 1 then
        // .LE 0, the exp2s after both), so on this toolkit FA_OVERLAP overlaps nothing and costs
        // registers; the two consumers' interleaving (and FA_PINGPONG) is what hides the softmax.
        auto fence_softmax = [&](float (&alpha)[2]) {
            fence_regs(s_acc);
            fence_regs(alpha);
            fence_regs(row_max);
            fence_regs(row_sum);
        };
        // S accumulators of n8 slabs 2kk and 2kk+1 = the A fragment of k-step kk. FP8: slabs 4kk..4kk+3,
        // rows g (registers 0, 2) and g + 8 (1, 3), in the key order V's rows are stored in
        // (fp8_slot in fp8_quant.cu).
        auto pack_p = [&]() {
#pragma unroll
            for (int kk = 0; kk < PV_STEPS; ++kk) {
                if constexpr (FP8) {
                    const float* x = &s_acc[16 * kk];
                    pf[kk][0] = pack_e4m3x4(x[0], x[1], x[4], x[5]);
                    pf[kk][1] = pack_e4m3x4(x[2], x[3], x[6], x[7]);
                    pf[kk][2] = pack_e4m3x4(x[8], x[9], x[12], x[13]);
                    pf[kk][3] = pack_e4m3x4(x[10], x[11], x[14], x[15]);
                } else {
#pragma unroll
                    for (int x = 0; x < 4; ++x) pf[kk][x] = pack2<IS_BF16>(s_acc[8 * kk + 2 * x], s_acc[8 * kk + 2 * x + 1]);
                }
            }
        };

        if constexpr (!DYNAMIC) mbar_wait(bar_q, tiles_done & 1);
        if (n_tiles == 0) release_q();
        if (n_tiles > 0) {
            if constexpr (OVERLAP) {
                float alpha[2];
                mbar_wait(bar_k_full(stage(0)), phase(0));
                turn_begin();
                fence_regs(s_acc);
                wgmma_fence();
                issue_qk(stage(0));
                wgmma_commit();
                turn_end();
                load_bias(0);
                load_scales(0);
                wgmma_wait<0>();
                fence_regs(s_acc);
                if (n_tiles == 1) release_q();
                softmax(0, alpha);
                pack_p();
                for (int j = 1; j < n_tiles; ++j) {
                    const int s = stage(j), sp = stage(j - 1);
                    mbar_wait(bar_k_full(s), phase(j));
                    mbar_wait(bar_v_full(sp), phase(j - 1));
                    turn_begin();
                    fence_regs(s_acc);
                    fence_regs(o);
                    fence_p();
                    wgmma_fence();
                    issue_qk(s);
                    wgmma_commit();
                    issue_pv(sp);
                    wgmma_commit();
                    turn_end();
                    load_bias(j);
                    load_scales(j);
                    wgmma_wait<1>();  // S(j) is done; P(j-1)·V(j-1) may still run
                    fence_regs(s_acc);
                    if (j == n_tiles - 1) release_q();
                    softmax(j, alpha);
                    fence_softmax(alpha);
                    wgmma_wait<0>();
                    fence_regs(o);
                    fence_p();
                    release(sp);
                    rescale_o(alpha);
                    pack_p();
                }
                const int sl = stage(n_tiles - 1);
                mbar_wait(bar_v_full(sl), phase(n_tiles - 1));
                turn_begin();
                fence_regs(o);
                wgmma_fence();
                issue_pv(sl);
                wgmma_commit();
                turn_end();
                wgmma_wait<0>();
                fence_regs(o);
                fence_p();
                release(sl);
            } else {
                for (int j = 0; j < n_tiles; ++j) {
                    const int s = stage(j);
                    const u32 parity = phase(j);
                    float alpha[2];
                    mbar_wait(bar_k_full(s), parity);
                    turn_begin();
                    fence_regs(s_acc);
                    wgmma_fence();
                    issue_qk(s);
                    wgmma_commit();
                    turn_end();
                    load_bias(j);
                    load_scales(j);
                    wgmma_wait<0>();
                    fence_regs(s_acc);
                    if (j == n_tiles - 1) release_q();
                    softmax(j, alpha);
                    rescale_o(alpha);
                    pack_p();
                    // S is P now; zeros (which the next Q·Kᵀ ignores) let its registers go while P·V
                    // runs: FP8's 256-key tiles (O 64 + S 128 + P 32 at head_dim 128) spill without.
                    if constexpr (TILE_SCALES > 1) {
#pragma unroll
                        for (int i = 0; i < S_REGS; ++i) s_acc[i] = 0.f;
                    }
                    mbar_wait(bar_v_full(s), parity);
                    turn_begin();
                    fence_regs(o);
                    wgmma_fence();
                    issue_pv(s);
                    wgmma_commit();
                    turn_end();
                    wgmma_wait<0>();
                    fence_regs(o);
                    fence_p();
                    release(s);
                }
            }
        }

        // ---- epilogue ----
        // FP8's P units (softmax), dropout's factor for the kept probabilities.
        const float o_unit = (FP8 ? v_ref * (1.f / 256.f) : 1.f) * dropout_output_factor(p);
        float inv[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float sum = row_sum[r];
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            const RowTotal total = join_sink(p, sink, row_max[r], sum);
            // No visible key (and no sink): O = 0 and LSE = -inf, as the reference defines it.
            inv[r] = !seq.valid ? __int_as_float(0x7fc00000) : (total.sum > 0.f ? total.o_factor / total.sum * o_unit : 0.f);
            const int row = row0 + 8 * r;
            if (p.lse != nullptr && lane % 4 == 0 && row < seq.seq_q) {
                const float lse = total.sum > 0.f ? total.m * LN2 + logf(total.sum) : NEG_INF;
                p.lse[lse_index(p, seq, batch, head, row)] = seq.valid ? lse : __int_as_float(0x7fc00000);
            }
        }
        // This thread's pair of normalized O values in chunk jn of its row r (row0 + 8·r), packed.
        auto o_pair = [&](int jn, int r) {
            return pack2<IS_BF16>(o[4 * jn + 2 * r] * inv[r], o[4 * jn + 2 * r + 1] * inv[r]);
        };
        u16* out = p.o + batch * p.o_batch_stride + head * p.o_head_stride + (i64)seq.q_first * p.o_seq_stride;
        if constexpr (PERSISTENT && O_QUAD_STORES) {
            // The Q region holds the next tile's Q: store_row_from_quad.
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int row = row0 + 8 * r;
                u32 packed[HEAD_DIM / 8];
#pragma unroll
                for (int jn = 0; jn < HEAD_DIM / 8; ++jn)
                    packed[jn] = o_pair(jn, r);
                store_row_from_quad(out + (i64)row * p.o_seq_stride, packed, lane % 4, row < seq.seq_q);
            }
        } else if constexpr (PERSISTENT) {
            // 4-byte stores straight from the accumulators (O_QUAD_STORES says why).
#pragma unroll
            for (int jn = 0; jn < HEAD_DIM / 8; ++jn)
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const int row = row0 + 8 * r;
                    if (row < seq.seq_q && in_head_dim(jn)) {
                        *reinterpret_cast<u32*>(out + (i64)row * p.o_seq_stride + 8 * jn + 2 * (lane % 4)) = o_pair(jn, r);
                    }
                }
        } else {
            // This warpgroup's rows of the Q tile are free now (its last Q·Kᵀ has completed, and only
            // it reads them): stage O there in the same swizzled layout (conflict-free 4-byte
            // stores), then write whole 16-byte row chunks to global memory.
            named_bar_sync(BAR_EPILOGUE + cw, 128);
#pragma unroll
            for (int jn = 0; jn < HEAD_DIM / 8; ++jn)
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const int lr = local_row + 8 * r;
                    const u32 packed = o_pair(jn, r);
                    const u32 addr =
                        q_wg + (jn / 8) * Q_PANEL_BYTES + lr * ROW_BYTES + (((jn % 8) ^ (lr & 7)) << 4) + (lane % 4) * 4;
                    st_shared_u32(addr, packed);
                }
            named_bar_sync(BAR_EPILOGUE + cw, 128);
            constexpr int CHUNKS = HEAD_DIM / 8;  // 16-byte chunks per row
#pragma unroll
            for (int k = 0; k < WG_ROWS * CHUNKS / 128; ++k) {
                const int i = t + 128 * k;
                const int lr = i / CHUNKS;
                const int c = i % CHUNKS;
                const int row = wg_m0 + lr;
                if (row < seq.seq_q && in_head_dim(c)) {
                    u32 val[4];
                    ld_shared_v4(q_wg + (c / 8) * Q_PANEL_BYTES + lr * ROW_BYTES + (((c % 8) ^ (lr & 7)) << 4), val);
                    st_global_v4(out + (i64)row * p.o_seq_stride + c * 8, val);
                }
            }
        }
        kv_done = ring_advance(kv_done, n_tiles);
        ++tiles_done;
        if constexpr (!PERSISTENT) break;
    }
}
