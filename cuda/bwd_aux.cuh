// What both backward main kernels (flash_bwd_mma.cu, flash_bwd_wgmma.cu) share: the workspace's
// addressing, the preprocess and convert kernels around them, the walk over the query tiles that
// see a K/V tile, and the deterministic build's turn-taking on dQ.
//
// The including kernel defines, before this header: HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, IS_BF16,
// DETERMINISTIC (constexpr), DQ_WARPGROUPS (0 when the dQ accumulator tile is row-major, else the
// wgmma kernel's warpgroup count: the tile is in its registers' order, dq_tile_index), and the
// PREPROCESS_NAME and CONVERT_NAME macros. Needs mma_ptx.cuh, fwd_params.cuh, bwd_params.cuh.
#pragma once

constexpr int AUX_THREADS = 128;

// Row (b, h)'s first element in the [batch, num_heads, seq_q_pad] workspace.
__device__ __forceinline__ i64 row_base(const BwdParams& bp, int b, int h) {
    return ((i64)b * bp.fwd.num_heads + h) * bp.seq_q_pad;
}

// Where element (r, c) of a query tile's dQ lies in its BLOCK_M x HEAD_DIM f32 accumulator tile.
// Row-major for the mma.sync kernel. The wgmma kernel keeps the tile in the order its consumer
// threads hold it, so that they store it to shared memory as conflict-free float4s and the tile
// is one contiguous block for the writer's bulk reduction: consumer warpgroup w owns columns [w·DQ_COLS, (w+1)·DQ_COLS), thread t of it (warp t / 32, lane 4g + q)
// holds accumulator register 4j + e = row 16·(t / 32) + g + 8·(e / 2), column 8j + 2q + (e & 1)
// of them (wgmma_gen.cuh), and register 4j + e of consumer thread T = 128w + t is element
// 4·(j·128·DQ_WARPGROUPS + T) + e.
__device__ __forceinline__ int dq_tile_index(int r, int c) {
    if constexpr (DQ_WARPGROUPS == 0) {
        return r * HEAD_DIM + c;
    } else {
        constexpr int DQ_COLS = HEAD_DIM / (DQ_WARPGROUPS > 0 ? DQ_WARPGROUPS : 1);
        const int w = c / DQ_COLS, cc = c % DQ_COLS;
        const int thread = 128 * w + 32 * (r / 16) + 4 * (r % 8) + (cc % 8) / 2;
        const int e = 2 * ((r % 16) / 8) + (c & 1);
        return 4 * ((cc / 8) * (128 * DQ_WARPGROUPS) + thread) + e;
    }
}

// The query tiles a K/V tile's CTA walks: [first, first + count), every tile with a row that sees
// one of the keys [n0, n0 + BLOCK_N) (keys_seen: the causal mask and the sliding window). A row's
// visible keys [begin, end) only move right as the row grows, so the rows that see the tile are
// those from the first whose end passes n0 to the last whose begin is left of the tile's end,
// and each of them sees one of its keys. count is 0 when no row does (or the tile has no keys).
__device__ __forceinline__ int2 query_tiles_seeing(const FwdParams& p, const SeqRows& seq, int n0) {
    const i64 n1 = n0 + BLOCK_N < seq.seq_kv ? n0 + BLOCK_N : seq.seq_kv;
    i64 first_row = 0, last_row = seq.seq_q - 1;
    // Position pos = row + causal_offset: end > n0 needs pos >= n0 (causal) or pos >= n0 - right.
    if (CAUSAL) {
        first_row = (i64)n0 - seq.causal_offset;
    } else if (p.window_right >= 0) {
        first_row = (i64)n0 - p.window_right - seq.causal_offset;
    }
    // begin < n1 needs pos - left <= n1 - 1.
    if (p.window_left >= 0) {
        const i64 last = n1 - 1 + p.window_left - seq.causal_offset;
        if (last < last_row) last_row = last;
    }
    if (first_row < 0) first_row = 0;
    if (n0 >= n1 || first_row > last_row) return make_int2(0, 0);
    const int first = (int)(first_row / BLOCK_M);
    return make_int2(first, (int)(last_row / BLOCK_M) + 1 - first);
}

// Whether a tile of BLOCK_M rows from m0 and BLOCK_N keys from n0 has a (row, key) pair the mask
// hides: keys past the sequence, or a row whose visible keys do not cover the whole tile (the
// last row's begin is the largest, the first row's end the smallest).
__device__ __forceinline__ bool tile_needs_mask(const FwdParams& p, const SeqRows& seq, int m0, int n0) {
    return n0 + BLOCK_N > seq.seq_kv || keys_seen<CAUSAL>(p, seq, m0).y < n0 + BLOCK_N ||
           keys_seen<CAUSAL>(p, seq, m0 + BLOCK_M - 1).x > n0;
}

// Whether query row `row` sees key `key` (for the tiles tile_needs_mask flags).
__device__ __forceinline__ bool row_sees_key(const FwdParams& p, const SeqRows& seq, int row, int key) {
    const int2 seen = keys_seen<CAUSAL>(p, seq, row);
    return key >= seen.x && key < seen.y;
}

// The units of the backward's scores (fwd_params.cuh's ScoreUnits): with a soft-cap the
// forward's, x = tanh(s·pre) and logit = x·fold; without, x is the raw score and fold the scale
// in base 2, of either sign (no row max is taken here, so fold need not be positive).
__device__ __forceinline__ ScoreUnits backward_units(const FwdParams& p) {
    return HAS_SOFTCAP ? score_units(p) : ScoreUnits{1.f, p.scale_log2};
}

// Pᵀ's element of raw score s at (row, key): exp2 of its base-2 logit minus the row's base-2 LSE,
// 0 where the mask hides the key (checked only in tiles that need_mask). cap_grad is what dS
// takes through the soft-cap, d(cap·tanh(y))/d(cap·y) = 1 − tanh², computed before the mask so
// that it stays finite (1 without a cap).
__device__ __forceinline__ float score_probability(const FwdParams& p, const ScoreUnits& u, const SeqRows& seq,
                                                   bool need_mask, int row, int key, float s, float lse2,
                                                   float& cap_grad) {
    const float x = HAS_SOFTCAP ? score_x(u, s) : s;
    cap_grad = HAS_SOFTCAP ? fmaf(-x, x, 1.f) : 1.f;
    float exponent = fmaf(x, u.fold, -lse2);
    // The exponent, not x: fold may be negative.
    if (need_mask && !row_sees_key(p, seq, row, key)) exponent = NEG_INF;
    return ex2(exponent);
}

// The deterministic build's order (flash_bwd_mma.cu's opening comment): the CTA of K/V tile
// kv_tile adds its part of the query tile at row m0 after the K/V tiles kv_tile + 1 ..
// last(tile) have, where last is the last K/V tile the tile's rows see. The calling thread spins
// on the tile's counter until then (an acquire: what those tiles added is visible after it).
__device__ __forceinline__ void dq_await_turn(const FwdParams& p, const unsigned* sem, const SeqRows& seq, int m0,
                                              int kv_tile) {
    // The tile's last row sees the rightmost key any of its rows sees (and some key: the
    // sequence's last row sees key seq_kv - 1, and ends only grow).
    const int last_row = m0 + BLOCK_M < seq.seq_q ? m0 + BLOCK_M - 1 : seq.seq_q - 1;
    const int last = (keys_seen<CAUSAL>(p, seq, last_row).y - 1) / BLOCK_N;
    while (ld_acquire_u32(sem) < (unsigned)(last - kv_tile)) {
    }
}
// The whole CTA waits: one thread spins, the barrier after it holds the others.
__device__ __forceinline__ void dq_wait_turn(const FwdParams& p, const unsigned* sem, const SeqRows& seq, int m0,
                                             int kv_tile, int tid) {
    if (tid == 0) dq_await_turn(p, sem, seq, m0, kv_tile);
    __syncthreads();
}
// ... and hands the turn on once every thread's adds are visible.
__device__ __forceinline__ void dq_pass_turn(unsigned* sem, int tid) {
    __threadfence();
    __syncthreads();
    if (tid == 0) red_release_add_u32(sem, 1u);
}

// The counter of (batch, head, query tile).
__device__ __forceinline__ unsigned* dq_turn_counter(const BwdParams& bp, int batch, int head, int q_tile) {
    return bp.semaphores + ((i64)batch * bp.fwd.num_heads + head) * bp.q_tiles + q_tile;
}


// ---- Preprocess: D, the LSE in base 2, zeroed accumulator and counters ---------------------
// One CTA per (query tile, head, batch), four warps; a warp takes a row at a time, each lane two
// adjacent columns per 64.
extern "C" __global__ void __launch_bounds__(AUX_THREADS) PREPROCESS_NAME(const __grid_constant__ BwdParams bp) {
    const FwdParams& p = bp.fwd;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int q_tile = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
    const int m0 = q_tile * BLOCK_M;
    const SeqRows seq = sequence_rows(p, batch);
    const i64 base = row_base(bp, batch, head);
    for (int r = warp; r < BLOCK_M; r += AUX_THREADS / 32) {
        const int row = m0 + r;
        float d = 0.f;
        if (row < seq.seq_q) {
            const u16* o = p.o + batch * p.o_batch_stride + head * p.o_head_stride + (i64)row * p.o_seq_stride;
            const u16* d_o = bp.d_o + batch * bp.do_batch_stride + head * bp.do_head_stride + (i64)row * bp.do_seq_stride;
#pragma unroll
            for (int s = 0; s < HEAD_DIM / 64; ++s) {
                const int c = 2 * lane + 64 * s;
                if (FA_VALID_DIM != FA_HEAD_DIM && c >= FA_VALID_DIM) continue;  // past a padded row's end
                const float2 x = unpack2<IS_BF16>(*reinterpret_cast<const u32*>(o + c));
                const float2 y = unpack2<IS_BF16>(*reinterpret_cast<const u32*>(d_o + c));
                d = fmaf(x.x, y.x, fmaf(x.y, y.y, d));
            }
        }
#pragma unroll
        for (int m = 16; m >= 1; m /= 2) d += __shfl_xor_sync(0xffffffffu, d, m);
        if (lane == 0) {
            // A row that saw no key has LSE -inf and O = 0: its P must be 0, not exp2(s + inf).
            float lse2 = __int_as_float(0x7f800000);
            if (row < seq.seq_q) {
                const float lse = p.lse[lse_index(p, seq, batch, head, row)];
                if (lse != NEG_INF) lse2 = lse * LOG2E_F;
            }
            bp.d_rows[base + row] = d;
            bp.lse_log2[base + row] = lse2;
        }
    }
    // Zeroing is layout-blind: the tile is contiguous in either order.
    float4* acc = reinterpret_cast<float4*>(bp.dq_accum + (base + m0) * HEAD_DIM);
    for (int i = tid; i < BLOCK_M * HEAD_DIM / 4; i += AUX_THREADS) acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (DETERMINISTIC && tid == 0) *dq_turn_counter(bp, batch, head, q_tile) = 0u;
}

// ---- Convert: dQ = scale · accumulator, in the input dtype ---------------------------------
// One CTA per (query tile, head, batch); consecutive threads take consecutive column pairs of a
// row (the scale is applied here, once per element, rather than in every K/V tile's adds).
extern "C" __global__ void __launch_bounds__(AUX_THREADS) CONVERT_NAME(const __grid_constant__ BwdParams bp) {
    const FwdParams& p = bp.fwd;
    const int q_tile = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
    const int m0 = q_tile * BLOCK_M;
    const SeqRows seq = sequence_rows(p, batch);
    const float* acc = bp.dq_accum + (row_base(bp, batch, head) + m0) * HEAD_DIM;
    u16* dq = bp.dq + batch * bp.dq_batch_stride + head * bp.dq_head_stride;
    constexpr int PAIRS = HEAD_DIM / 2;
    for (int i = threadIdx.x; i < BLOCK_M * PAIRS; i += AUX_THREADS) {
        const int r = i / PAIRS;
        const int c = 2 * (i % PAIRS);
        const int row = m0 + r;
        if (row >= seq.seq_q) break;  // rows only grow with i
        if (FA_VALID_DIM != FA_HEAD_DIM && c >= FA_VALID_DIM) continue;  // a padded tile's columns
        const float2 x = *reinterpret_cast<const float2*>(acc + dq_tile_index(r, c));
        st_global_u32(dq + (i64)row * bp.dq_seq_stride + c, pack2<IS_BF16>(x.x * bp.scale, x.y * bp.scale));
    }
}
