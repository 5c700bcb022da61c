// Split-KV flash decoding: a few query rows per sequence (one new token, or a few for speculative
// decoding) against a long K/V cache, on tensor cores through mma.sync, for sm_80 and newer.
// Two entry points: KERNEL_NAME (the pieces) and COMBINE_NAME (merges the pieces by their LSEs).
//
// Shapes and parameters as flash_fwd_mma.cu (FwdParams in fwd_params.cuh): Q, O [batch, seq_q,
// num_heads, head_dim] at any strides, K, V [batch, seq_kv, num_kv_heads, head_dim], LSE [batch,
// num_heads, seq_q] f32, natural log, -inf (and O = 0) for a row that sees no key. head_dim is
// any multiple of 8 up to 256. With more than one split the pieces go to f32 scratch: partial O
// [batch, num_heads, seq_q, splits, head_dim], each divided by its own sum, and partial LSE
// [batch, num_heads, seq_q, splits], -inf for a piece that saw no key of the row.
//
// Who owns what.
// * A CTA owns ROWS = 16 packed query rows of one K/V head of one sequence and one piece of its
//   keys: grid = (splits, num_kv_heads × row_blocks, batch). Packed row r of a K/V head is query
//   head kv_head·group_size + r / seq_q, new token r % seq_q (GQA packing): the query heads that
//   share a K/V head, times the new tokens, read each K/V row once. The piece is keys
//   [split·keys_per_split, (split + 1)·keys_per_split) ∩ [0, seq_kv), cut further at the last
//   key the CTA's latest token sees when causal (bottom-right: token i sees keys
//   j <= i + seq_kv - seq_q).
// * A warp owns every WARPS-th step of STEP = 8·TILES keys of the piece. It loads all TILES n8
//   key tiles of K and V of a step into registers before it uses any (the bytes in flight that a
//   memory-bound kernel lives on), computes S = Q·Kᵀ for its 16 rows on mma.m16n8k16, runs the
//   online softmax (base 2, scale·log2 e folded in) and adds P·V on mma.m16n8k8.
// * A lane 4g + t owns rows g and g + 8 and, of every row it touches, the 16-byte chunks 4j + t
//   (j < ROUNDS): it loads K and V row g of each key tile at those chunks, reads Q rows g, g + 8
//   at those chunks from shared memory, and accumulates O rows g, g + 8 at those chunks. This
//   works because the MMAs only need a consistent order of the reduced dimension, not memory
//   order: a chunk's four registers are the B fragments (b0, b1) of two k16 steps of Q·Kᵀ, with
//   Q's A fragments built from the same chunk; for P·V, each V register (two dims of one key
//   row) is one lane's share of an 8x8 matrix [key][dim pair], which movmatrix transposes into
//   exactly the m16n8k8 B fragment [key pair][dim], and the resulting O accumulators land on the
//   dims of the chunk the lane loaded. So every global access is a whole 16-byte chunk (or two
//   8-byte halves when a tensor is only 8-byte aligned), four lanes read 64 contiguous bytes of
//   a row, and no shared memory sits between the loads and the MMAs.
// * At the end the warps' (max, sum, O) per row go through shared memory (reusing Q's space) and
//   all threads merge them per (row, chunk), then write O and the LSE, or the piece's
//   normalized partial O and its LSE.
//
// Why these sizes. Decoding reads every K/V byte once and computes little with it, so the aim is
// bytes in flight, not FLOPs: 16 rows are mma's M (rows a problem lacks are zero Q rows, nearly
// free on tensor cores, where the FMA units would spend an instruction per row and key); the
// registers a lane holds are O (ROWS·head_dim/32 = 8·ROUNDS·4 f32: 64 at head_dim 128, 128 at
// 256) plus a step's K and V (8·ROUNDS·TILES 32-bit registers), so TILES = 8 / ROUNDS keeps a
// step at 8 KiB per warp (16 keys at head_dim 128, 8 at 256) and the total under the 255 that
// __launch_bounds__(THREADS, 2) allows. Four warps and several CTAs per SM keep tens of KiB in
// flight per SM. Shared memory: Q (16 rows) during the loop, then every warp's O rows in f32 for
// the merge (33 KiB at head_dim 128 with 4 warps); src/cuda/plan/decode.rs computes it.
//
// ALiBi (FA_ALIBI = 1, fwd_params.cuh's switch): each row's slope (its query head's, in log2
// units) is read once; a score then costs one FFMA more, -slope·|i + offset - key| with the
// sequence's own causal offset, so positions align to each sequence's end as the mask does.
//
// Masking never relies on a sentinel: masked scores are -inf, scores are clamped to finite values
// first (a huge scale cannot overflow into inf - inf), and a row has seen a key exactly when its
// running max is finite, so any finite scale works, negative included.
//
// Tuning knobs (plan fields in src/cuda/plan/decode.rs, all in the config's name):
// * FA_STAGES = 0: a warp loads a step's K and V into registers, then computes (nothing in flight
//   while it computes). FA_STAGES = S >= 2: software pipelining through shared memory. Each warp
//   owns a ring of S stages; before computing step i it issues step i + S - 1 with cp.async
//   (16 bytes, .cg, zero-fill past the piece's end) into the stage step i - 1 used, so S - 1
//   steps are always in flight. A lane copies exactly the chunks it later reads itself (layout
//   [K/V][tile][round][lane] of 16 bytes: conflict-free), so cp.async.wait_group alone orders
//   them: no __syncwarp, no barrier. The K and V registers are read from shared memory next to
//   the MMA that uses them, so a step's K and V no longer occupy 8·ROUNDS·TILES registers: more
//   CTAs per SM fit. The first S - 1 steps are issued before Q is loaded.
// * FA_MIN_BLOCKS: __launch_bounds__' CTAs per SM (caps registers at 65536 / (THREADS·min)).
// * FA_FUSED = 1: no combine launch. With more than one split every CTA writes its piece, then
//   (fence, atomic add on a per-(sequence, K/V head, row block) counter in global memory) the
//   last CTA of those rows merges all pieces and writes O and the LSE, and resets the counter to
//   0 for the next launch. The counters (DecodeParams::counters) are zeroed once when the engine
//   allocates them; every launch leaves them at 0.
//
// A K/V cache (src/problem/cache.rs), compiled in only where asked (FA_PAGED, FA_LENS; the
// plain kernel is unchanged):
// * FA_PAGED = 1: K and V are pools of pages [num_pages, page_size, num_kv_heads, head_dim] (the
//   layout's batch stride is the page stride); key j of sequence b is row j % page_size of page
//   page_table[b · pages_per_seq + j / page_size]. Each lane looks its key row's page up once
//   per key tile (8 keys, one broadcast load for the warp), before the K and V chunks of that row
//   (cp.async stages: each 16-byte chunk is addressed through its row's page).
// * FA_LENS = 1: sequence b has kv_lens[b] <= seq_kv keys; pieces past it are empty (LSE -inf,
//   as any empty piece), and the causal mask aligns to the sequence's own end: token i sees keys
//   j <= i + kv_lens[b] - seq_q.
// * Bad indices never read out of bounds and never pass silently: a page entry >= num_pages is
//   clamped to page 0 for the address, a kv_lens[b] > seq_kv reads no key at all, and the CTA that
//   met either writes NaN for all its rows (O and LSE, or its pieces, which make the combine's
//   result NaN). Every row whose keys include a bad page, and every row of a sequence whose count
//   is too large, comes out NaN; a page entry no row reaches (past the count or the causal
//   diagonal) is never read and does no harm. The host path checks the index first
//   (BatchIndex::validate).
//
// The module's third entry point, APPEND_NAME, writes new tokens' K/V rows into the cache the
// decode kernel then reads (the serving step's first half; see the kernel at the end).
//
// Compile-time parameters (-D, set by src/cuda/plan/decode.rs): FA_HEAD_DIM, FA_WARPS, FA_TILES,
// FA_CAUSAL, FA_BF16, FA_VEC_BYTES (16 or 8), FA_MIN_BLOCKS, FA_STAGES, FA_FUSED, FA_PAGED,
// FA_LENS, FA_ALIBI, KERNEL_NAME, COMBINE_NAME, APPEND_NAME.
#include "mma_ptx.cuh"
#include "fwd_params.cuh"

#ifndef KERNEL_NAME
#error "KERNEL_NAME must be defined (the kernel's config name)"
#endif
#ifndef COMBINE_NAME
#error "COMBINE_NAME must be defined (the combine kernel's name)"
#endif
#ifndef APPEND_NAME
#error "APPEND_NAME must be defined (the append kernel's name)"
#endif

constexpr int HEAD_DIM = FA_HEAD_DIM;
constexpr int WARPS = FA_WARPS;
constexpr int TILES = FA_TILES;
constexpr bool CAUSAL = FA_CAUSAL != 0;
constexpr bool IS_BF16 = FA_BF16 != 0;
constexpr int VEC_BYTES = FA_VEC_BYTES;
constexpr int STAGES = FA_STAGES;
constexpr bool FUSED = FA_FUSED != 0;
#ifndef FA_PAGED
#define FA_PAGED 0
#endif
#ifndef FA_LENS
#define FA_LENS 0
#endif
constexpr bool PAGED = FA_PAGED != 0;
constexpr bool LENS = FA_LENS != 0;
constexpr bool CHECKED = PAGED || LENS;  // indices read from device memory: NaN on a bad one
constexpr int THREADS = WARPS * 32;
constexpr int ROWS = 16;                  // mma's M: packed query rows per CTA
constexpr int CHUNKS = HEAD_DIM / 8;      // 16-byte chunks of a row
constexpr int ROUNDS = (CHUNKS + 3) / 4;  // chunks per lane: lane t of a quad owns 4j + t
constexpr int STEP = 8 * TILES;           // keys a warp loads per step
// Q rows in shared memory, 64·ROUNDS bytes padded to an odd multiple of 64: the 8 lanes of a
// quarter warp read rows g and g + 1 at the same chunks, which then fall on different banks.
constexpr int Q_ROW_BYTES = (ROUNDS | 1) * 64;
// A warp's O rows in f32 for the merge, one float more than the chunks: lanes (g, t) store row g,
// float 8t + k, and an odd row stride spreads the 32 lanes over all banks.
constexpr int O_ROW_FLOATS = ROUNDS * 32 + 1;
constexpr int Q_BYTES = ROWS * Q_ROW_BYTES;
// One pipeline stage of one warp: K then V, TILES key tiles, ROUNDS chunks, 32 lanes × 16 bytes.
constexpr int KV_SLOT_BYTES = 32 * 16;
constexpr int KV_STAGE_BYTES = 2 * TILES * ROUNDS * KV_SLOT_BYTES;
constexpr float LN2 = 0.6931471805599453f;
constexpr float LOG2E = 1.4426950408889634f;
constexpr float F32_MAX = 3.402823466e38f;
constexpr u32 FULL_MASK = 0xffffffffu;

static_assert(HEAD_DIM % 8 == 0 && HEAD_DIM >= 8 && HEAD_DIM <= 256, "head_dim: a multiple of 8 up to 256");
static_assert(WARPS >= 1 && WARPS <= 8, "1 to 8 warps");
static_assert(TILES >= 1 && TILES <= 4, "1 to 4 key tiles per step");
static_assert(VEC_BYTES == 16 || VEC_BYTES == 8, "global rows are moved in 16- or 8-byte pieces");
static_assert(STAGES == 0 || (STAGES >= 2 && STAGES <= 6), "0 (register loads) or 2 to 6 cp.async stages");

// Mirrors `DecodeParams` in src/cuda/plan/params.rs (#[repr(C)], 344 bytes; both sides assert the
// size): the forward parameters, then the split's scratch and sizes, then the cache's index.
struct DecodeParams {
    FwdParams fwd;
    float* part_o;          // [batch, num_heads, seq_q, splits, head_dim]; unused with one split
    float* part_lse;        // [batch, num_heads, seq_q, splits]
    int splits;             // pieces of the keys; 1: write O and the LSE directly
    int keys_per_split;
    int rows_per_kv_head;   // group_size · seq_q
    int row_blocks;         // ceil(rows_per_kv_head / ROWS)
    unsigned* counters;     // FUSED: [batch, num_kv_heads · row_blocks], 0 between launches
    const u32* page_table;  // PAGED: [batch, pages_per_seq] page numbers
    const u32* kv_lens;     // LENS: [batch] key counts
    int page_size;          // PAGED: key rows per page
    int num_pages;          // PAGED: pages in each of the K and V pools
    int pages_per_seq;      // PAGED: columns of the page table
    int cache_pad;
};
static_assert(sizeof(DecodeParams) == 344, "DecodeParams must match the Rust mirror");

// --- helpers only this kernel uses ----------------------------------------------------------

// K and V are read once, so they bypass L1 (no_allocate) and ask L2 to fetch 256 bytes around
// each access (a whole head_dim-128 row). Read-only for the kernel's lifetime: the .nc path.
__device__ __forceinline__ void ld_stream_v4(const void* p, u32 r[4]) {
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "l"(p));
}
__device__ __forceinline__ void ld_stream_v2(const void* p, u32& a, u32& b) {
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {%0,%1}, [%2];\n" : "=r"(a), "=r"(b) : "l"(p));
}
// Eight 16-bit elements, 16-byte aligned (VEC_BYTES 16) or two 8-byte aligned halves.
__device__ __forceinline__ void load_chunk(const u16* p, u32 r[4]) {
    if (VEC_BYTES == 16) {
        ld_stream_v4(p, r);
    } else {
        ld_stream_v2(p, r[0], r[1]);
        ld_stream_v2(p + 4, r[2], r[3]);
    }
}
__device__ __forceinline__ void store_chunk(u16* p, const u32 r[4]) {
    if (VEC_BYTES == 16) {
        st_global_v4(p, r);
    } else {
        st_global_v2(p, r[0], r[1]);
        st_global_v2(p + 4, r[2], r[3]);
    }
}
// Programmatic dependent launch (sm_90 and newer; no-ops before): the host launches the combine
// so that it may start while the decode kernel still runs (launch_overlapping_previous in
// src/cuda/launch.rs). The decode kernel lets it launch once all its CTAs have started; the
// combine's CTAs then wait for the decode kernel to complete and its writes to be visible
// before they read a piece. Only the launch latency overlaps.
__device__ __forceinline__ void allow_dependent_launch() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_previous_grid() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
// The pieces other CTAs wrote (of this launch: the fused combine; of the decode kernel still
// running when the combine launched: the combine): through L2, never a stale L1 line.
__device__ __forceinline__ void ld_cg_v4f(const float* p, float v[4]) {
    asm volatile("ld.global.cg.v4.f32 {%0,%1,%2,%3}, [%4];\n" : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3]) : "l"(p));
}
__device__ __forceinline__ float ld_cg_f(const float* p) {
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];\n" : "=f"(v) : "l"(p));
    return v;
}
// __threadfence(): orders this thread's writes before its later ones for every thread of the GPU.
__device__ __forceinline__ void fence_gpu() { asm volatile("membar.gl;\n" ::: "memory"); }
__device__ __forceinline__ u32 atomic_add_u32(unsigned* p, u32 v) {
    u32 old;
    asm volatile("atom.global.add.u32 %0, [%1], %2;\n" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}
__device__ __forceinline__ void st_global_u32(unsigned* p, u32 v) {
    asm volatile("st.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
// Transposes an 8x8 matrix of 16-bit values held one row pair per lane (lane 4g + t: row g,
// columns 2t, 2t + 1) into the same layout.
__device__ __forceinline__ u32 movmatrix_trans(u32 a) {
    u32 d;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(d) : "r"(a));
    return d;
}
// D = A·B + D with A 16x8 (a0: row g, k 2t..2t+1; a1: row g + 8), B 8x8 (b0: k 2t..2t+1 of
// column g), C as mma_16816.
template <bool BF16>
__device__ __forceinline__ void mma_1688(float c[4], u32 a0, u32 a1, u32 b0) {
    if (BF16) {
        asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a0), "r"(a1), "r"(b0));
    } else {
        asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a0), "r"(a1), "r"(b0));
    }
}

// A u32 of an index tensor (page table, key counts): read-only for the kernel's lifetime.
__device__ __forceinline__ u32 ld_index(const u32* p) {
    u32 v;
    asm("ld.global.nc.u32 %0, [%1];\n" : "=r"(v) : "l"(p));
    return v;
}

// Element offsets of key row `key` (>= 0, below the sequence's count) in K and V from the CTA's
// k_base / v_base. Paged: through the page table row `pt` of the sequence; a page number past
// the pool reads page 0 instead and sets `bad`.
__device__ __forceinline__ void key_offsets(const DecodeParams& dp, const u32* pt, int key, i64& k_off, i64& v_off,
                                            bool& bad) {
    const FwdParams& p = dp.fwd;
    if constexpr (PAGED) {
        const u32 col = (u32)key / (u32)dp.page_size;
        const u32 in_page = (u32)key - col * (u32)dp.page_size;
        u32 page = ld_index(pt + col);
        if (page >= (u32)dp.num_pages) {
            bad = true;
            page = 0;
        }
        k_off = (i64)page * p.k_batch_stride + (i64)in_page * p.k_seq_stride;
        v_off = (i64)page * p.v_batch_stride + (i64)in_page * p.v_seq_stride;
    } else {
        k_off = (i64)key * p.k_seq_stride;
        v_off = (i64)key * p.v_seq_stride;
    }
}

// Pipelined path: lane `lane` copies its chunks of step `n` (keys n + 8·tile + g, chunks 4j + t)
// into the stage at `stage` (a 32-bit shared address), zeros for keys at or past `n_end` and
// chunks past head_dim. A step wholly past the end copies nothing (the caller still commits its
// empty group, so that wait_group counts stay uniform).
__device__ __forceinline__ void issue_step(u32 stage, const DecodeParams& dp, const u32* pt, const u16* k_base,
                                           const u16* v_base, int n, int n_end, int g, int t, int lane, bool& bad) {
    if (n >= n_end) return;
#pragma unroll
    for (int tl = 0; tl < TILES; ++tl) {
        const int key = n + tl * 8 + g;
        const bool key_ok = key < n_end;
        const int row = key_ok ? key : n;  // any valid row: src-size 0 reads nothing
        i64 k_off, v_off;
        key_offsets(dp, pt, row, k_off, v_off, bad);
        const u16* kp = k_base + k_off;
        const u16* vp = v_base + v_off;
#pragma unroll
        for (int j = 0; j < ROUNDS; ++j) {
            const int c = 4 * j + t;
            const bool ok = key_ok && c < CHUNKS;
            const int cc = c < CHUNKS ? c : 0;
            const u32 dk = stage + (u32)(((0 * TILES + tl) * ROUNDS + j) * KV_SLOT_BYTES + lane * 16);
            const u32 dv = stage + (u32)(((1 * TILES + tl) * ROUNDS + j) * KV_SLOT_BYTES + lane * 16);
            if (VEC_BYTES == 16) {
                cp_async_16(dk, kp + cc * 8, ok);
                cp_async_16(dv, vp + cc * 8, ok);
            } else {
                cp_async_8(dk, kp + cc * 8, ok);
                cp_async_8(dk + 8, kp + cc * 8 + 4, ok);
                cp_async_8(dv, vp + cc * 8, ok);
                cp_async_8(dv + 8, vp + cc * 8 + 4, ok);
            }
        }
    }
}

// Query head and new token of packed row `pr` of K/V head `kv_head`.
__device__ __forceinline__ int row_head(const FwdParams& p, int kv_head, int pr) {
    return kv_head * p.group_size + pr / p.seq_q;
}

extern "C" __global__ void __launch_bounds__(THREADS, FA_MIN_BLOCKS) KERNEL_NAME(const __grid_constant__ DecodeParams dp) {
    extern __shared__ __align__(16) unsigned char smem[];
    const FwdParams& p = dp.fwd;
    const int tid = threadIdx.x;
    const int warp = tid / 32;
    const int lane = tid % 32;
    const int g = lane / 4;
    const int t = lane % 4;
    const int split = blockIdx.x;
    const int kv_head = blockIdx.y / dp.row_blocks;
    const int row0 = (blockIdx.y % dp.row_blocks) * ROWS;  // first packed row of the CTA
    const int batch = blockIdx.z;
    const int rows_left = dp.rows_per_kv_head - row0;
    allow_dependent_launch();
    const int rows_here = rows_left < ROWS ? rows_left : ROWS;

    // The CTA's earliest and latest new token: causal masking only touches steps past the first
    // one's diagonal, and no key past the last one's diagonal is loaded.
    int tok_min = p.seq_q;
    int tok_max = -1;
    for (int r = 0; r < rows_here; ++r) {
        const int tok = (row0 + r) % p.seq_q;
        tok_min = tok < tok_min ? tok : tok_min;
        tok_max = tok > tok_max ? tok : tok_max;
    }
    // The sequence's keys and causal alignment; with lengths, its own count (none at all when the
    // count is bad: the CTA then writes NaN).
    bool bad = false;  // this lane met a bad cache index
    int seq_len = p.seq_kv;
    int causal_off = p.causal_offset;
    if constexpr (LENS) {
        const u32 len = ld_index(dp.kv_lens + batch);
        if (len > (u32)p.seq_kv) {
            bad = true;
            seq_len = 0;
        } else {
            seq_len = (int)len;
        }
        causal_off = seq_len - p.seq_q;
    }
    const u32* pt = PAGED ? dp.page_table + (i64)batch * dp.pages_per_seq : nullptr;
    const i64 key_begin = (i64)split * dp.keys_per_split;
    i64 key_limit = key_begin + dp.keys_per_split;
    if (key_limit > seq_len) key_limit = seq_len;
    if (CAUSAL && (i64)tok_max + causal_off + 1 < key_limit) key_limit = (i64)tok_max + causal_off + 1;
    const int n_begin = (int)key_begin;
    const int n_end = key_limit > key_begin ? (int)key_limit : n_begin;

    // Paged: the pools have no batch dimension; key_offsets adds each row's page.
    const u16* k_base = p.k + (PAGED ? 0 : batch * p.k_batch_stride) + kv_head * p.k_head_stride;
    const u16* v_base = p.v + (PAGED ? 0 : batch * p.v_batch_stride) + kv_head * p.v_head_stride;
    const u32 s_q = smem_addr(smem);
    // Pipelined: this warp's ring of STAGES stages after Q; its first STAGES - 1 steps go out
    // before Q is even loaded.
    const u32 ring = s_q + (u32)Q_BYTES + (u32)(warp * STAGES * KV_STAGE_BYTES);
    if constexpr (STAGES > 0) {
#pragma unroll
        for (int st = 0; st < STAGES - 1; ++st) {
            issue_step(ring + (u32)(st * KV_STAGE_BYTES), dp, pt, k_base, v_base,
                       n_begin + warp * STEP + st * WARPS * STEP, n_end, g, t, lane, bad);
            cp_async_commit();
        }
    }

    // Q rows into shared memory, zero for rows the problem lacks and chunks past head_dim.
    for (int i = tid; i < ROWS * ROUNDS * 4; i += THREADS) {
        const int r = i / (ROUNDS * 4);
        const int c = i % (ROUNDS * 4);
        u32 v[4] = {0u, 0u, 0u, 0u};
        if (r < rows_here && c < CHUNKS) {
            const int pr = row0 + r;
            const u16* src = p.q + batch * p.q_batch_stride + row_head(p, kv_head, pr) * p.q_head_stride +
                             (i64)(pr % p.seq_q) * p.q_seq_stride + c * 8;
            load_chunk(src, v);
        }
        st_shared_v4(s_q + (u32)(r * Q_ROW_BYTES + c * 16), v);
    }
    __syncthreads();

    const int tok_lo = (row0 + g) % p.seq_q;  // token of row g (rows past the problem's: unused)
    const int tok_hi = (row0 + g + 8) % p.seq_q;
    // ALiBi's slopes of rows g and g + 8 (0 for rows past the problem's, never written), and each
    // row's position as a float: key j's term is -slope·|position - j|.
    float slope_lo = 0.f, slope_hi = 0.f;
    if constexpr (HAS_ALIBI) {
        if (g < rows_here) slope_lo = alibi_slope_log2(p, row_head(p, kv_head, row0 + g));
        if (g + 8 < rows_here) slope_hi = alibi_slope_log2(p, row_head(p, kv_head, row0 + g + 8));
    }
    const float pos_lo = (float)((i64)tok_lo + causal_off);
    const float pos_hi = (float)((i64)tok_hi + causal_off);

    // o[j][i]: rows g (elements 0, 1) and g + 8 (2, 3), dims 8·(4j + t) + 2i + {0, 1}.
    float o[ROUNDS][4][4];
#pragma unroll
    for (int j = 0; j < ROUNDS; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) o[j][i][0] = o[j][i][1] = o[j][i][2] = o[j][i][3] = 0.f;
    float row_max[2] = {NEG_INF, NEG_INF};  // running max of the log2-scaled scores, rows g, g + 8
    float row_sum[2] = {0.f, 0.f};          // this lane's part of the running sum

    int read_stage = 0;                // pipelined: the stage of step n0
    int write_stage = STAGES - 1;      // pipelined: the stage step n0 + (STAGES - 1) goes to
    for (int n0 = n_begin + warp * STEP; n0 < n_end; n0 += WARPS * STEP) {
        // Register path: every load of the step first, K and V row (n0 + 8·tile + g), chunks
        // 4j + t. Pipelined path: issue step n0 + STAGES - 1 into the stage step n0 - 1 used
        // (read into registers and consumed by the MMAs last iteration), then wait for step n0.
        u32 kr[TILES][ROUNDS][4];
        u32 vr[TILES][ROUNDS][4];
        u32 stage = 0;
        if constexpr (STAGES > 0) {
            issue_step(ring + (u32)(write_stage * KV_STAGE_BYTES), dp, pt, k_base, v_base,
                       n0 + (STAGES - 1) * WARPS * STEP, n_end, g, t, lane, bad);
            cp_async_commit();
            cp_async_wait<STAGES - 1>();
            stage = ring + (u32)(read_stage * KV_STAGE_BYTES);
            read_stage = read_stage + 1 == STAGES ? 0 : read_stage + 1;
            write_stage = write_stage + 1 == STAGES ? 0 : write_stage + 1;
        }
#pragma unroll
        for (int tl = 0; tl < TILES && STAGES == 0; ++tl) {
            const int key = n0 + tl * 8 + g;
            i64 k_off = 0, v_off = 0;
            if (!PAGED || key < n_end) key_offsets(dp, pt, key, k_off, v_off, bad);
            const u16* kp = k_base + k_off;
            const u16* vp = v_base + v_off;
#pragma unroll
            for (int j = 0; j < ROUNDS; ++j) {
                const int c = 4 * j + t;
                kr[tl][j][0] = kr[tl][j][1] = kr[tl][j][2] = kr[tl][j][3] = 0u;
                vr[tl][j][0] = vr[tl][j][1] = vr[tl][j][2] = vr[tl][j][3] = 0u;
                if (key < n_end && c < CHUNKS) {
                    load_chunk(kp + c * 8, kr[tl][j]);
                    load_chunk(vp + c * 8, vr[tl][j]);
                }
            }
        }

        // S = Q·Kᵀ: chunk j's registers 0, 1 are the B fragment of one k16 step, 2, 3 of the next;
        // Q's A fragment of each takes the same registers of rows g and g + 8.
        float s[TILES][4];
#pragma unroll
        for (int tl = 0; tl < TILES; ++tl) s[tl][0] = s[tl][1] = s[tl][2] = s[tl][3] = 0.f;
#pragma unroll
        for (int j = 0; j < ROUNDS; ++j) {
            u32 qa[4];
            u32 qb[4];
            ld_shared_v4(s_q + (u32)(g * Q_ROW_BYTES + (4 * j + t) * 16), qa);
            ld_shared_v4(s_q + (u32)((g + 8) * Q_ROW_BYTES + (4 * j + t) * 16), qb);
            const u32 a_lo[4] = {qa[0], qb[0], qa[1], qb[1]};
            const u32 a_hi[4] = {qa[2], qb[2], qa[3], qb[3]};
#pragma unroll
            for (int tl = 0; tl < TILES; ++tl) {
                if constexpr (STAGES > 0)
                    ld_shared_v4(stage + (u32)(((0 * TILES + tl) * ROUNDS + j) * KV_SLOT_BYTES + lane * 16), kr[tl][j]);
                mma_16816<IS_BF16>(s[tl], a_lo, kr[tl][j][0], kr[tl][j][1]);
                mma_16816<IS_BF16>(s[tl], a_hi, kr[tl][j][2], kr[tl][j][3]);
            }
        }

        // Into the log2 domain, clamped finite, then masked: s[tl][e] is row g (e < 2) or g + 8,
        // key n0 + 8·tl + 2t + (e & 1).
        const bool need_mask =
            n0 + STEP > n_end || (CAUSAL && (i64)n0 + STEP - 1 > (i64)tok_min + causal_off);
#pragma unroll
        for (int tl = 0; tl < TILES; ++tl)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float x = s[tl][e] * p.scale_log2;
                if constexpr (HAS_ALIBI) {
                    const float key = (float)(n0 + tl * 8 + 2 * t + (e & 1));
                    x = fmaf(-(e < 2 ? slope_lo : slope_hi), fabsf((e < 2 ? pos_lo : pos_hi) - key), x);
                }
                x = fminf(fmaxf(x, -F32_MAX), F32_MAX);
                if (need_mask) {
                    const int key = n0 + tl * 8 + 2 * t + (e & 1);
                    const int tok = e < 2 ? tok_lo : tok_hi;
                    if (key >= n_end || (CAUSAL && (i64)key > (i64)tok + causal_off)) x = NEG_INF;
                }
                s[tl][e] = x;
            }

        // Online softmax per row (r = 0: row g, elements 0, 1; r = 1: row g + 8, elements 2, 3).
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float mx = row_max[r];
#pragma unroll
            for (int tl = 0; tl < TILES; ++tl) mx = fmaxf(mx, fmaxf(s[tl][2 * r], s[tl][2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 2));
            // No key seen yet: subtract 0, so exp2(-inf - -inf) never makes a NaN; every p is 0.
            const float m_use = mx == NEG_INF ? 0.f : mx;
            const float alpha = ex2(row_max[r] - m_use);
            row_max[r] = mx;
            float sum = 0.f;
#pragma unroll
            for (int tl = 0; tl < TILES; ++tl) {
                s[tl][2 * r] = ex2(s[tl][2 * r] - m_use);
                s[tl][2 * r + 1] = ex2(s[tl][2 * r + 1] - m_use);
                sum += s[tl][2 * r] + s[tl][2 * r + 1];
            }
            row_sum[r] = row_sum[r] * alpha + sum;
#pragma unroll
            for (int j = 0; j < ROUNDS; ++j)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    o[j][i][2 * r] *= alpha;
                    o[j][i][2 * r + 1] *= alpha;
                }
        }

        // O += P·V per key tile: P's S accumulators are the m16n8k8 A fragment as they stand;
        // V register i of chunk j, transposed, is the B fragment of dims 8·(4j + ·) + 2i + {0, 1}.
#pragma unroll
        for (int tl = 0; tl < TILES; ++tl) {
            const u32 p_lo = pack2<IS_BF16>(s[tl][0], s[tl][1]);
            const u32 p_hi = pack2<IS_BF16>(s[tl][2], s[tl][3]);
#pragma unroll
            for (int j = 0; j < ROUNDS; ++j) {
                if constexpr (STAGES > 0)
                    ld_shared_v4(stage + (u32)(((1 * TILES + tl) * ROUNDS + j) * KV_SLOT_BYTES + lane * 16), vr[tl][j]);
#pragma unroll
                for (int i = 0; i < 4; ++i) mma_1688<IS_BF16>(o[j][i], p_lo, p_hi, movmatrix_trans(vr[tl][j][i]));
            }
        }
    }
    // Every step issued was consumed; no copy may still be landing where the merge writes.
    if constexpr (STAGES > 0) cp_async_wait<0>();

    // Merge the warps. Each lane's sums cover its columns: add the quad's.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        row_sum[r] += __shfl_xor_sync(FULL_MASK, row_sum[r], 1);
        row_sum[r] += __shfl_xor_sync(FULL_MASK, row_sum[r], 2);
    }
    // Every warp is done with Q: its space holds the warps' O rows now. With a cache index, the
    // same barrier tells every thread whether any lane met a bad one.
    bool cta_bad = false;
    if constexpr (CHECKED) {
        cta_bad = __syncthreads_or(bad ? 1 : 0) != 0;
    } else {
        __syncthreads();
    }
    float* s_o = reinterpret_cast<float*>(smem);      // [WARPS][ROWS][O_ROW_FLOATS]
    float* s_max = s_o + WARPS * ROWS * O_ROW_FLOATS;  // [WARPS][ROWS]
    float* s_sum = s_max + WARPS * ROWS;               // [WARPS][ROWS]
    if (t == 0) {
        s_max[warp * ROWS + g] = row_max[0];
        s_max[warp * ROWS + g + 8] = row_max[1];
        s_sum[warp * ROWS + g] = row_sum[0];
        s_sum[warp * ROWS + g + 8] = row_sum[1];
    }
#pragma unroll
    for (int j = 0; j < ROUNDS; ++j)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float* dst = s_o + (warp * ROWS + g + 8 * r) * O_ROW_FLOATS + (4 * j + t) * 8;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                dst[2 * i] = o[j][i][2 * r];
                dst[2 * i + 1] = o[j][i][2 * r + 1];
            }
        }
    __syncthreads();

    // One (row, chunk) per thread: rescale each warp's part to the common max, add, normalize.
    for (int item = tid; item < ROWS * CHUNKS; item += THREADS) {
        const int r = item / CHUNKS;
        const int c = item % CHUNKS;
        if (r >= rows_here) continue;
        float mx = NEG_INF;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) mx = fmaxf(mx, s_max[w * ROWS + r]);
        const float m_use = mx == NEG_INF ? 0.f : mx;
        float sum = 0.f;
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int w = 0; w < WARPS; ++w) {
            const float f = ex2(s_max[w * ROWS + r] - m_use);
            sum += f * s_sum[w * ROWS + r];
            const float* src = s_o + (w * ROWS + r) * O_ROW_FLOATS + c * 8;
#pragma unroll
            for (int k = 0; k < 8; ++k) acc[k] += f * src[k];
        }
        // A row has seen a key iff its max is finite; then the max's own term makes sum >= 1.
        float inv = sum > 0.f ? 1.f / sum : 0.f;
        float lse = sum > 0.f ? mx * LN2 + logf(sum) : NEG_INF;
        if (CHECKED && cta_bad) {  // a bad cache index: NaN rows (or pieces, which the combine spreads)
            inv = __int_as_float(0x7fc00000);
            lse = inv;
        }
        const int pr = row0 + r;
        const int head = row_head(p, kv_head, pr);
        const int tok = pr % p.seq_q;
        if (dp.splits == 1) {
            u32 packed[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) packed[k] = pack2<IS_BF16>(acc[2 * k] * inv, acc[2 * k + 1] * inv);
            store_chunk(p.o + batch * p.o_batch_stride + head * p.o_head_stride + (i64)tok * p.o_seq_stride + c * 8,
                        packed);
            if (c == 0 && p.lse != nullptr) p.lse[((i64)batch * p.num_heads + head) * p.seq_q + tok] = lse;
        } else {
            const i64 piece = (((i64)batch * p.num_heads + head) * p.seq_q + tok) * dp.splits + split;
            float* dst = dp.part_o + piece * HEAD_DIM + c * 8;
#pragma unroll
            for (int k = 0; k < 8; ++k) dst[k] = acc[k] * inv;
            if (c == 0) dp.part_lse[piece] = lse;
        }
    }

    // Fused combine: the last CTA of these rows to finish merges every piece. Each thread's
    // piece writes are fenced before the barrier, the barrier before the count, so that the CTA
    // that counts last sees every piece; it fences again before reading them (through L2).
    if constexpr (FUSED) {
        if (dp.splits == 1) return;
        __shared__ int s_last;
        fence_gpu();
        __syncthreads();
        if (tid == 0) {
            unsigned* counter = dp.counters + ((i64)blockIdx.z * gridDim.y + blockIdx.y);
            const u32 before = atomic_add_u32(counter, 1u);
            const bool last = before == (u32)dp.splits - 1;
            // Nobody else touches the counter again in this launch: back to 0 for the next one.
            if (last) st_global_u32(counter, 0u);
            s_last = last ? 1 : 0;
        }
        __syncthreads();
        if (s_last == 0) return;
        fence_gpu();
        for (int item = tid; item < rows_here * CHUNKS; item += THREADS) {
            const int r = item / CHUNKS;
            const int c = item % CHUNKS;
            const int pr = row0 + r;
            const int head = row_head(p, kv_head, pr);
            const int tok = pr % p.seq_q;
            const i64 first = (((i64)batch * p.num_heads + head) * p.seq_q + tok) * dp.splits;
            const float* lse = dp.part_lse + first;
            float mx = NEG_INF;
#pragma unroll 8
            for (int sp = 0; sp < dp.splits; ++sp) mx = fmaxf(mx, ld_cg_f(lse + sp));
            const float m_use = mx == NEG_INF ? 0.f : mx;
            float sum = 0.f;
            float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll 8
            for (int sp = 0; sp < dp.splits; ++sp) {
                const float w = ex2((ld_cg_f(lse + sp) - m_use) * LOG2E);  // an empty piece: 0
                sum += w;
                float v[8];
                const float* src = dp.part_o + (first + sp) * HEAD_DIM + c * 8;
                ld_cg_v4f(src, v);
                ld_cg_v4f(src + 4, v + 4);
#pragma unroll
                for (int k = 0; k < 8; ++k) acc[k] += w * v[k];
            }
            const float inv = sum > 0.f ? 1.f / sum : 0.f;
            u32 packed[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) packed[k] = pack2<IS_BF16>(acc[2 * k] * inv, acc[2 * k + 1] * inv);
            store_chunk(p.o + batch * p.o_batch_stride + head * p.o_head_stride + (i64)tok * p.o_seq_stride + c * 8,
                        packed);
            if (c == 0 && p.lse != nullptr) {
                // A NaN piece (bad cache index) makes the sum NaN: the LSE too, not -inf.
                const bool seen = sum > 0.f || (CHECKED && sum != sum);
                p.lse[((i64)batch * p.num_heads + head) * p.seq_q + tok] = seen ? mx + logf(sum) : NEG_INF;
            }
        }
    }
}

// The combine: one CTA of COMBINE_THREADS per (new token, query head, sequence), grid = (seq_q,
// num_heads, batch). Piece s weighs exp(lse_s - max) / sum; all pieces empty: O = 0, LSE = -inf.
// The combine reads little (the pieces' f32 rows) and is bound by memory latency, so it is laid
// out to wait for memory once:
// * Thread t owns chunk t % CHUNKS of the row and the pieces t / CHUNKS + k·PIECE_LANES. A piece's
//   weight is needed only to add it, not to load it: every thread first issues the loads of its
//   first COMBINE_BATCH pieces (64 pieces at head_dim 128, 32 at 256) while it stages LSE t in
//   shared memory. Rows of more pieces take one more round per batch.
// * After one barrier every warp reduces the staged LSEs to their max and the sum of the weights
//   itself (shared-memory reads and shuffles); LSEs past the staged COMBINE_THREADS come from L2.
// * The threads' sums meet in shared memory; thread c < CHUNKS adds them and writes chunk c.
constexpr int COMBINE_THREADS = 256;
constexpr int PIECE_LANES = COMBINE_THREADS / CHUNKS;  // head_dim <= 256: at least 8
constexpr int COMBINE_BATCH = 4;

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(FULL_MASK, x, o));
    return x;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(FULL_MASK, x, o);
    return x;
}

extern "C" __global__ void __launch_bounds__(COMBINE_THREADS) COMBINE_NAME(const __grid_constant__ DecodeParams dp) {
    __shared__ float s_lse[COMBINE_THREADS];
    __shared__ float4 s_acc[PIECE_LANES * CHUNKS][2];
    const FwdParams& p = dp.fwd;
    const int t = threadIdx.x;
    const int lane = t & 31;
    const int tok = blockIdx.x;
    const int head = blockIdx.y;
    const int batch = blockIdx.z;
    const int splits = dp.splits;
    const i64 first = (((i64)batch * p.num_heads + head) * p.seq_q + tok) * splits;
    const float* lse = dp.part_lse + first;
    const int piece_lane = t / CHUNKS;
    const int c = t % CHUNKS;
    const bool adds = piece_lane < PIECE_LANES;
    auto piece_lse = [&](int s) { return s < COMBINE_THREADS ? s_lse[s] : ld_cg_f(lse + s); };
    // Past the last piece a thread loads the last one again (and never adds it): no branch
    // between the loads.
    float v[COMBINE_BATCH][8];
    auto load_batch = [&](int s0) {
#pragma unroll
        for (int u = 0; u < COMBINE_BATCH; ++u) {
            const float* src = dp.part_o + (first + min(s0 + u * PIECE_LANES, splits - 1)) * HEAD_DIM + c * 8;
            ld_cg_v4f(src, v[u]);
            ld_cg_v4f(src + 4, v[u] + 4);
        }
    };
    wait_for_previous_grid();
    if (t < splits) s_lse[t] = ld_cg_f(lse + t);
    if (adds) load_batch(piece_lane);
    __syncthreads();

    // fmaxf drops a NaN LSE (a bad cache index); its weight below is NaN, and so the sum.
    float mx = NEG_INF;
    for (int s = lane; s < splits; s += 32) mx = fmaxf(mx, piece_lse(s));
    mx = warp_max(mx);
    const float m_use = mx == NEG_INF ? 0.f : mx;
    float sum = 0.f;
    for (int s = lane; s < splits; s += 32) sum += ex2((piece_lse(s) - m_use) * LOG2E);  // empty piece: 0
    sum = warp_sum(sum);

    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (adds) {
        for (int s0 = piece_lane; s0 < splits; s0 += COMBINE_BATCH * PIECE_LANES) {
            if (s0 != piece_lane) load_batch(s0);
#pragma unroll
            for (int u = 0; u < COMBINE_BATCH; ++u) {
                const int s = s0 + u * PIECE_LANES;
                if (s < splits) {
                    const float w = ex2((piece_lse(s) - m_use) * LOG2E);
#pragma unroll
                    for (int k = 0; k < 8; ++k) acc[k] += w * v[u][k];
                }
            }
        }
        s_acc[t][0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
        s_acc[t][1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
    }
    __syncthreads();
    if (t >= CHUNKS) return;
    for (int l = 1; l < PIECE_LANES; ++l) {
        const float4 a = s_acc[l * CHUNKS + t][0];
        const float4 b = s_acc[l * CHUNKS + t][1];
        acc[0] += a.x, acc[1] += a.y, acc[2] += a.z, acc[3] += a.w;
        acc[4] += b.x, acc[5] += b.y, acc[6] += b.z, acc[7] += b.w;
    }
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    u32 packed[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) packed[k] = pack2<IS_BF16>(acc[2 * k] * inv, acc[2 * k + 1] * inv);
    store_chunk(p.o + batch * p.o_batch_stride + head * p.o_head_stride + (i64)tok * p.o_seq_stride + c * 8, packed);
    if (c == 0 && p.lse != nullptr) {
        // A NaN piece (bad cache index) makes the sum NaN: the LSE too, not -inf.
        const bool seen = sum > 0.f || (CHECKED && sum != sum);
        p.lse[((i64)batch * p.num_heads + head) * p.seq_q + tok] = seen ? mx + logf(sum) : NEG_INF;
    }
}

// The append: new token t of sequence b lands at key position kv_len(b) - seq_q + t of the cache
// (kv_len: kv_lens[b] with FA_LENS, else seq_kv; the counts already include the new tokens, as
// the decode call that follows expects), through the page table with FA_PAGED — the rules of
// shaders/append_kv.wgsl: a position below 0 (a count smaller than seq_q) or a page past the pool
// is not written, so that every write stays inside the cache whatever the caller's index holds.
// One warp per (new token, K/V head, sequence), grid = (seq_q, num_kv_heads, batch); lane x copies
// elements x, x + 32, ... of the K row and of the V row: a copy bound by memory, with nothing
// shared. Parameter block as the decode kernel's, with fwd.q / fwd.o the new K / V rows (by their
// strides) and fwd.k / fwd.v the caches, written here (their pointers are const for the decode
// kernel, which only reads them).
extern "C" __global__ void __launch_bounds__(32) APPEND_NAME(const __grid_constant__ DecodeParams dp) {
    const FwdParams& p = dp.fwd;
    const int t = blockIdx.x;
    const int kv_head = blockIdx.y;
    const int b = blockIdx.z;
    const i64 len = LENS ? (i64)dp.kv_lens[b] : (i64)p.seq_kv;
    const i64 pos = len - p.seq_q + t;
    if (pos < 0 || pos >= p.seq_kv) return;
    i64 cache_batch = b;
    i64 row = pos;
    if (PAGED) {
        const u32 page = dp.page_table[(i64)b * dp.pages_per_seq + pos / dp.page_size];
        if (page >= (u32)dp.num_pages) return;
        cache_batch = page;
        row = pos % dp.page_size;
    }
    const u16* new_k = p.q + b * p.q_batch_stride + t * p.q_seq_stride + kv_head * p.q_head_stride;
    const u16* new_v = p.o + b * p.o_batch_stride + t * p.o_seq_stride + kv_head * p.o_head_stride;
    u16* k_row = const_cast<u16*>(p.k) + cache_batch * p.k_batch_stride + row * p.k_seq_stride + kv_head * p.k_head_stride;
    u16* v_row = const_cast<u16*>(p.v) + cache_batch * p.v_batch_stride + row * p.v_seq_stride + kv_head * p.v_head_stride;
    for (int d = threadIdx.x; d < HEAD_DIM; d += 32) {
        k_row[d] = new_k[d];
        v_row[d] = new_v[d];
    }
}
