// FlashAttention-2 style backward on tensor cores through mma.sync.m16n8k16 (bf16/f16 in, f32
// accumulate), for sm_80 and newer (Hopper runs it too). Three entry points per config:
//
//   PREPROCESS_NAME  D = rowsum(dO ∘ O) per (batch, head, query row), the forward's LSE in base 2,
//                    and zeroes of the f32 dQ accumulator (and of the deterministic counters).
//   KERNEL_NAME      dK and dV of one K/V tile, and its part of dQ, added to the accumulator.
//   CONVERT_NAME     dQ = scale · accumulator, in the input dtype and the dQ layout.
//
// Shapes. Q, O, dO, dQ: [batch, seq_q, num_heads, head_dim] at any strides (BwdParams); K, V, dK,
// dV: [batch, seq_kv, num_kv_heads, head_dim]; query head h reads K/V head h / group_size. LSE:
// the forward's, [batch, num_heads, seq_q] f32, natural log. head_dim is innermost and contiguous
// in every tensor. Masks as in the forward (fwd_params.cuh, keys_seen): causal aligned
// bottom-right (row i sees keys j <= i + seq_kv - seq_q) and the sliding window around the same
// position. With a soft-cap (FA_SOFTCAP) the scores are capped as the forward caps them and dS
// takes the cap's derivative. With dropout (FA_DROPOUT) the forward's mask is drawn again
// (dropout.cuh, transposed_keep_bits): O = Z·V with Z = P dropped and scaled by 1/(1 − p), so
// dV = Zᵀ·dO and dS = P ∘ (dP dropped and scaled − D), D = rowsum(dO ∘ O) of the dropped O.
//
// Who owns what (main kernel).
// * A CTA owns BLOCK_N keys of one (batch, K/V head): grid = (kv tiles, num_kv_heads, batch). It
//   loads K_j and V_j into shared memory once, then walks every query head of its GQA group and,
//   for each, every query tile that sees one of its keys (bwd_aux.cuh, query_tiles_seeing;
//   tiles the masks hide whole are never loaded), streaming Q, dO,
//   the LSE and D through two shared-memory stages (cp.async: step t+1 lands while step t runs).
//   dK and dV of its keys stay in registers over the whole walk, so the group's sum needs no
//   reduction pass; they are written once at the end, dK times the scale.
// * A warp owns 16 keys (WARPS = BLOCK_N / 16). Per query tile it computes, transposed so that its
//   keys are the MMA's rows: Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (16 x BLOCK_M, f32 C-fragments),
//   Pᵀ = exp2(Sᵀ·scale·log2 e - LSE·log2 e) (masked keys 0), dSᵀ = Pᵀ ∘ (dPᵀ - D); then
//   dV += Pᵀ·dO and dK += dSᵀ·Q, whose A-fragments are Pᵀ's and dSᵀ's C-fragments packed to 16
//   bits (two adjacent n8 C-tiles are one k16 A-tile), with dO and Q read through ldmatrix.trans.
// * dQ += dS·K needs every warp's keys for one query row, so the warps store dSᵀ (16-bit) to
//   shared memory and split dQ's BLOCK_M x head_dim tile among themselves instead: a warp owns 16
//   query rows and head_dim / (WARPS / (BLOCK_M / 16)) columns, reads dS through ldmatrix.trans of
//   the stored dSᵀ and K through ldmatrix.trans, and adds its f32 fragment to the accumulator,
//   [batch, num_heads, seq_q_pad, head_dim] in global memory: atomicAdd (red.global.add.f32), or
//   in the deterministic build the ordered read-modify-write below.
// * A lane (4·g + t) owns, of every 16 x 8 C-fragment, rows g and g+8 and columns 2t, 2t+1.
//
// The deterministic build (FA_DETERMINISTIC=1). Float addition is not associative, so dQ is
// bit-reproducible only if every element receives its K/V tiles' parts in one fixed order. Here
// that order is descending, j = last(i), last(i) - 1, ..., 0, by construction: each (batch, head,
// query tile) has a counter in global memory, zeroed by the preprocess kernel. The CTA of K/V
// tile j, about to add its part of query tile i, waits (one thread spins on an acquire load, then
// __syncthreads) until the counter reads last(i) - j, where last(i) is the last K/V tile that
// contributes to tile i; it then adds with plain f32 loads and stores at L2, __threadfence,
// __syncthreads, and one thread increments the counter (red.release). The contributing K/V tiles
// of a query tile are a contiguous range first(i)..last(i) under every mask this kernel runs: a
// row sees one interval of keys, and the intervals of consecutive rows overlap or touch (both
// ends move right by at most one key a row), so their union is one interval; last(i) is the tile
// of the last key the tile's last row sees. So exactly j+1..last(i) have added when the counter
// reads last(i) - j.
// Why descending: a CTA walks its query tiles ascending from its first, and under the causal mask
// the first is the diagonal one, which no later K/V tile touches, so CTA j's step s (query tile
// first(j) + s) waits only for CTA j+1's step s - 1: the CTAs of a (K/V head, batch) run side by
// side one step apart. In ascending order CTA j's first step would wait for CTAs 0..j-1 to reach
// the diagonal, j steps each, and the causal backward took the non-causal time (session 14,
// BENCHMARKS.md). Without a mask both orders are a wavefront one step apart.
// Why this cannot deadlock: CTA (j, kv head, batch) only waits for CTAs (j', same kv head, same
// batch) with j' > j. The grid's fastest dimension numbers the K/V tiles from the last,
// blockIdx.x = kv_tiles - 1 - j, so those CTAs have lower linear block indices, and the hardware
// dispatches CTAs in increasing linear index (the same assumption FlashAttention-3's
// deterministic backward makes): when CTA j is resident, every CTA it can wait for has been
// dispatched, i.e. is resident or finished. By induction from the last tile (its target is 0: it
// never waits), every waited-for CTA is running and eventually adds and increments, so every wait
// ends. The CTA's own steps run in a fixed order (heads, then query tiles, ascending) in every
// CTA, so a CTA never waits on a counter that needs a later step of itself. Cost: each step adds
// two barriers and a spin; the non-deterministic build pays neither (and numbers its tiles from
// the first, so that the causal backward's longest CTAs start first).
//
// Why these sizes. Registers per thread at head_dim 128 with BLOCK_M = 64 (4 warps, BLOCK_N 64):
// dK and dV accumulators 2 · 16·128/32 = 128; Sᵀ (then dPᵀ, in the same registers) 16·64/32 = 32
// and Pᵀ (then dSᵀ) packed to 16 bits, 16; dQ in passes of 64 columns, 32, while those are dead.
// With addresses and fragments that is ptxas's 255 under __launch_bounds__(128, 2) (two CTAs per
// SM), with 4-36 bytes of spills in some head_dim 128 builds (the compile test in
// tests/cuda_backward.rs prints each). K and V are re-read from shared memory as A-fragments per
// query tile (keeping them would cost 64 more registers). head_dim 256 does not fit: dK and dV
// alone would be 256 registers per thread (the host refuses it, naming the
// supported head dims). Shared memory: K, V (BLOCK_N rows each), 2 stages of (Q, dO: BLOCK_M rows;
// LSE, D: BLOCK_M floats) and dSᵀ (BLOCK_N x BLOCK_M 16-bit), e.g. 16 + 16 + 2·(16 + 16 + 0.5) +
// 8 = 105 KiB at head_dim 128, 64 x 64. BLOCK_M >= 64 so that dSᵀ's rows have 8 chunks for the
// swizzle; src/cuda/plan/backward.rs lists the plans.
//
// Shared-memory tiles are swizzled and filled as in flash_fwd_mma.cu (mma_ptx.cuh: swz,
// cp_async_rows; bwd_params.cuh: TileAddr). The preprocess and convert kernels, the walk's first
// query tile and the deterministic turn-taking are bwd_aux.cuh's (shared with the wgmma kernel).
//
// A head_dim below a tile's width (64 or 128: any multiple of 8) runs in that width, as the
// forward does (fwd_params.cuh): Q, K, V and dO are loaded with zeros past FA_VALID_DIM, which add
// nothing to Sᵀ or dPᵀ, and the padded columns of dK, dV and dQ are computed but never stored.
//
// Compile-time parameters (-D, set by src/cuda/plan/backward.rs): FA_HEAD_DIM (the tile's width),
// FA_VALID_DIM (the head_dim, when the tile pads it), FA_BLOCK_M, FA_BLOCK_N, FA_CAUSAL, FA_BF16,
// FA_VEC_BYTES (16: rows of Q, K, V, dO 16-byte aligned; 8: only 8-byte aligned), FA_MIN_BLOCKS,
// FA_DETERMINISTIC, FA_SOFTCAP (0 none; 1, 2 the cap's forms), FA_DROPOUT (0 or 1),
// KERNEL_NAME, PREPROCESS_NAME, CONVERT_NAME. The window's sides are run-time (BwdParams).
#include "mma_ptx.cuh"
#include "fwd_params.cuh"
#include "bwd_params.cuh"

#ifndef KERNEL_NAME
#error "KERNEL_NAME must be defined (the kernel's config name)"
#endif
#ifndef PREPROCESS_NAME
#error "PREPROCESS_NAME must be defined"
#endif
#ifndef CONVERT_NAME
#error "CONVERT_NAME must be defined"
#endif

constexpr int HEAD_DIM = FA_HEAD_DIM;
constexpr int BLOCK_M = FA_BLOCK_M;  // query rows per step
constexpr int BLOCK_N = FA_BLOCK_N;  // keys per CTA
constexpr bool CAUSAL = FA_CAUSAL != 0;
constexpr bool IS_BF16 = FA_BF16 != 0;
constexpr bool DETERMINISTIC = FA_DETERMINISTIC != 0;
constexpr int VEC_BYTES = FA_VEC_BYTES;
constexpr int WARPS = BLOCK_N / 16;  // a warp owns 16 keys
constexpr int THREADS = WARPS * 32;
constexpr int ROW_BYTES = HEAD_DIM * 2;
constexpr int K_STEPS = HEAD_DIM / 16;   // k16 steps of Sᵀ and dPᵀ
constexpr int M_TILES = BLOCK_M / 8;     // n8 tiles of Sᵀ (query columns)
constexpr int M_STEPS = BLOCK_M / 16;    // k16 steps of dV and dK (over queries)
constexpr int D_TILES = HEAD_DIM / 8;    // n8 tiles of dK and dV
constexpr int N_STEPS = BLOCK_N / 16;    // k16 steps of dQ (over keys)
constexpr int DQ_ROW_GROUPS = BLOCK_M / 16;
constexpr int WARPS_PER_ROW_GROUP = WARPS / DQ_ROW_GROUPS;
constexpr int DQ_COLS = HEAD_DIM / WARPS_PER_ROW_GROUP;  // dQ columns per warp
constexpr int DQ_TILES = DQ_COLS / 8;
constexpr int DQ_PASSES = DQ_COLS > 64 ? DQ_COLS / 64 : 1;  // dQ columns in passes of <= 64
constexpr int PASS_TILES = DQ_TILES / DQ_PASSES;
constexpr int DS_ROW_BYTES = BLOCK_M * 2;  // dSᵀ: BLOCK_N rows (keys) of BLOCK_M 16-bit values
constexpr int QO_TILE_BYTES = BLOCK_M * ROW_BYTES;
constexpr int KV_TILE_BYTES = BLOCK_N * ROW_BYTES;
// One stage: Q, dO, LSE (base 2), D.
constexpr int STAGE_BYTES = 2 * QO_TILE_BYTES + 2 * BLOCK_M * 4;
constexpr int DQ_WARPGROUPS = 0;  // row-major dQ accumulator tiles (bwd_aux.cuh)

static_assert(HEAD_DIM % 64 == 0 && HEAD_DIM <= 256, "the swizzle needs a multiple of 8 chunks per row");
static_assert(BLOCK_N % 16 == 0 && WARPS >= 1 && WARPS <= 8, "a warp owns 16 keys, 1 to 8 warps");
static_assert(BLOCK_M % 64 == 0, "dSᵀ's rows need 8 chunks for the swizzle");
static_assert(WARPS % DQ_ROW_GROUPS == 0 && DQ_COLS % 16 == 0, "dQ's tile must split evenly among the warps");
static_assert(VEC_BYTES == 16 || VEC_BYTES == 8, "global rows are moved in 16- or 8-byte pieces");

#include "bwd_aux.cuh"

// ---- Main kernel: dK, dV of one K/V tile and its part of dQ --------------------------------
extern "C" __global__ void __launch_bounds__(THREADS, FA_MIN_BLOCKS) KERNEL_NAME(const __grid_constant__ BwdParams bp) {
    extern __shared__ __align__(128) unsigned char smem[];
    const FwdParams& p = bp.fwd;
    const int tid = threadIdx.x;
    const int warp = tid / 32;
    const int lane = tid % 32;
    // The fastest grid dimension; the deterministic build numbers the tiles from the last (its
    // order, in the opening comment, relies on it).
    const int kv_tile = DETERMINISTIC ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
    const int kv_head = blockIdx.y;
    const int batch = blockIdx.z;
    const int n0 = kv_tile * BLOCK_N;
    const SeqRows seq = sequence_rows(p, batch);

    // Query tiles that see a key of this tile (all of them without a mask).
    const int2 q_range = query_tiles_seeing(p, seq, n0);
    const int first_q = q_range.x;
    const int n_q = q_range.y;
    const int steps = n_q * p.group_size;  // (query head of the group, query tile) pairs

    const u16* k = p.k + batch * p.k_batch_stride + kv_head * p.k_head_stride + (i64)n0 * p.k_seq_stride;
    const u16* v = p.v + batch * p.v_batch_stride + kv_head * p.v_head_stride + (i64)n0 * p.v_seq_stride;

    const u32 s_k = smem_addr(smem);
    const u32 s_v = s_k + KV_TILE_BYTES;
    const u32 s_stage0 = s_v + KV_TILE_BYTES;  // stage s at s_stage0 + s·STAGE_BYTES: Q, dO, LSE, D
    const u32 s_ds = s_stage0 + 2 * STAGE_BYTES;
    constexpr u32 DO_OFF = QO_TILE_BYTES, LSE_OFF = 2 * QO_TILE_BYTES, D_OFF = 2 * QO_TILE_BYTES + BLOCK_M * 4;

    auto step_head = [&](int step) { return kv_head * p.group_size + step / n_q; };
    auto step_tile = [&](int step) { return first_q + step % n_q; };
    auto load_step = [&](int step, int stage) {
        const int h = step_head(step);
        const int m0 = step_tile(step) * BLOCK_M;
        const u32 s = s_stage0 + (u32)stage * STAGE_BYTES;
        const u16* q = p.q + batch * p.q_batch_stride + h * p.q_head_stride + (i64)m0 * p.q_seq_stride;
        const u16* d_o = bp.d_o + batch * bp.do_batch_stride + h * bp.do_head_stride + (i64)m0 * bp.do_seq_stride;
        cp_async_rows<BLOCK_M, ROW_BYTES, THREADS, VEC_BYTES, VALID_CHUNKS>(s, q, p.q_seq_stride, seq.seq_q - m0, tid);
        cp_async_rows<BLOCK_M, ROW_BYTES, THREADS, VEC_BYTES, VALID_CHUNKS>(s + DO_OFF, d_o, bp.do_seq_stride, seq.seq_q - m0, tid);
        // LSE and D: BLOCK_M floats each, padded in the workspace (16-byte chunks, no bounds).
        const i64 at = row_base(bp, batch, h) + m0;
        if (tid < BLOCK_M / 4) {
            cp_async_16(s + LSE_OFF + 16 * tid, bp.lse_log2 + at + 4 * tid, true);
        } else if (tid < BLOCK_M / 2) {
            const int c = tid - BLOCK_M / 4;
            cp_async_16(s + D_OFF + 16 * c, bp.d_rows + at + 4 * c, true);
        }
    };

    // Prologue: group 0 = K, V and step 0; group 1 = step 1 (either may be empty).
    cp_async_rows<BLOCK_N, ROW_BYTES, THREADS, VEC_BYTES, VALID_CHUNKS>(s_k, k, p.k_seq_stride, seq.seq_kv - n0, tid);
    cp_async_rows<BLOCK_N, ROW_BYTES, THREADS, VEC_BYTES, VALID_CHUNKS>(s_v, v, p.v_seq_stride, seq.seq_kv - n0, tid);
    if (steps > 0) load_step(0, 0);
    cp_async_commit();
    if (steps > 1) load_step(1, 1);
    cp_async_commit();

    float dk_acc[D_TILES][4];
    float dv_acc[D_TILES][4];
#pragma unroll
    for (int d = 0; d < D_TILES; ++d)
#pragma unroll
        for (int e = 0; e < 4; ++e) dk_acc[d][e] = dv_acc[d][e] = 0.f;

    // A-fragments of the warp's 16 K or V rows (as flash_fwd_mma.cu's Q): lanes 0-7 rows 0-7 of
    // chunk 2kk, 8-15 rows 8-15 of it, 16-31 the same rows of chunk 2kk+1.
    const TileAddr<ROW_BYTES> k_a(s_k, warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, lane >> 4);
    // B-fragments of Qᵀ / dOᵀ (rows = queries, non-transposed, as the forward's K): {b0, b1} of
    // query n-tile 2nn, then of 2nn+1.
    const TileAddr<ROW_BYTES> qt_b(s_stage0, (lane & 7) + (lane >> 4) * 8, (lane >> 3) & 1);
    // B-fragments of Q / dO with queries as k (ldmatrix.trans, as the forward's V): {b0, b1} of
    // d-tile 2dd, then of 2dd+1.
    const TileAddr<ROW_BYTES> q_b(s_stage0, (lane & 7) + ((lane >> 3) & 1) * 8, lane >> 4);
    // dQ: the warp's 16 rows (row group) and DQ_COLS columns (column group).
    const int rg = warp % DQ_ROW_GROUPS;
    const int cg = WARPS_PER_ROW_GROUP == 1 ? 0 : warp / DQ_ROW_GROUPS;
    // dS as A-fragments from the stored dSᵀ (ldmatrix.trans): lanes 0-7 keys 0-7 of query chunk
    // 2·rg, 8-15 keys 0-7 of chunk 2·rg+1, 16-23 keys 8-15 of chunk 2·rg, 24-31 keys 8-15 of 2·rg+1
    // -> a[0..3] (rows g / g+8 of dS, keys 2t.. / 8+2t..).
    const TileAddr<DS_ROW_BYTES> ds_a(s_ds, (lane & 7) + (lane >> 4) * 8, (lane >> 3) & 1, 2 * rg);
    // K with keys as k (ldmatrix.trans, q_b's lane pattern) from the warp's first column on.
    const TileAddr<ROW_BYTES> k_b(s_k, (lane & 7) + ((lane >> 3) & 1) * 8, lane >> 4, cg * (DQ_COLS / 8));

    const int g = lane / 4, t = lane % 4;
    const int key0 = n0 + warp * 16 + g;  // this lane's keys: key0 and key0 + 8
    const ScoreUnits units = backward_units(p);

    for (int it = 0; it < steps; ++it) {
        cp_async_wait<1>();  // every group but the newest is done: step `it` has landed
        __syncthreads();
        const int stage = it & 1;
        const u32 so = (u32)stage * STAGE_BYTES;
        const int h = step_head(it);
        const int q_tile = step_tile(it);
        const int m0 = q_tile * BLOCK_M;

        // Dropout's keep bits, drawn before Sᵀ's accumulators hold registers the generator would
        // spill.
        u32 keep[TRANSPOSED_KEEP_WORDS<M_TILES>];
        if constexpr (HAS_DROPOUT) transposed_keep_bits<M_TILES>(p, batch, h, m0, key0, lane, keep);

        // Sᵀ = K·Qᵀ: 16 keys x BLOCK_M queries per warp.
        float acc[M_TILES][4];
#pragma unroll
        for (int n = 0; n < M_TILES; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < K_STEPS; ++kk) {
            u32 a[4];
            ldmatrix_x4(a, k_a.at(kk, 0));
#pragma unroll
            for (int nn = 0; nn < M_TILES / 2; ++nn) {
                u32 b[4];
                ldmatrix_x4(b, qt_b.at(kk, nn * 16) + so);
                mma_16816<IS_BF16>(acc[2 * nn], a, b[0], b[1]);
                mma_16816<IS_BF16>(acc[2 * nn + 1], a, b[2], b[3]);
            }
        }

        // Pᵀ = exp2(S·scale·log2 e - LSE·log2 e) (bwd_aux.cuh: score_probability), keys the row
        // does not see set to 0 (in the tiles tile_needs_mask flags: past the keys, or cut by the
        // causal mask or the window; rows past seq_q have LSE +inf, so P = 0, and dO = 0). Pᵀ is
        // kept packed to 16 bits, as the A-fragments of dV += Pᵀ·dO (the C-fragments of n8 tiles
        // 2kk, 2kk+1 are the A-fragment of k-step kk), and dSᵀ is formed from the same rounded
        // values: dSᵀ is rounded to 16 bits for its own products anyway, and the f32 Pᵀ would cost
        // 16 more registers next to dPᵀ.
        const bool need_mask = tile_needs_mask(p, seq, m0, n0);
        const u32 s_lse = s_stage0 + so + LSE_OFF + 8 * t;
        const u32 s_d = s_stage0 + so + D_OFF + 8 * t;
        // pk: Pᵀ as dropout leaves it, for dV; pg: Pᵀ times the soft-cap's derivative, what dSᵀ
        // is formed from (pk itself without a cap or dropout). pg replaces pk once dV has read
        // it, so it costs no register beyond those dPᵀ's accumulation needs next.
        u32 pk[M_STEPS][4], pg[M_STEPS][4];
#pragma unroll
        for (int n = 0; n < M_TILES; ++n) {
            float lse[2];
            asm volatile("ld.shared.v2.f32 {%0,%1}, [%2];\n" : "=f"(lse[0]), "=f"(lse[1]) : "r"(s_lse + 32 * n));
            float cap_grad[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = key0 + 8 * (e >> 1);
                const int row = m0 + n * 8 + 2 * t + (e & 1);
                acc[n][e] = score_probability(p, units, seq, need_mask, row, key, acc[n][e], lse[e & 1], cap_grad[e]);
            }
#pragma unroll
            for (int r = 0; r < 2; ++r)
                pk[n / 2][(n & 1) * 2 + r] = pack2<IS_BF16>(dropped(p, keep, 4 * n + 2 * r, acc[n][2 * r]),
                                                            dropped(p, keep, 4 * n + 2 * r + 1, acc[n][2 * r + 1]));
            if constexpr (HAS_SOFTCAP || HAS_DROPOUT) {
                pg[n / 2][(n & 1) * 2] = pack2<IS_BF16>(acc[n][0] * cap_grad[0], acc[n][1] * cap_grad[1]);
                pg[n / 2][(n & 1) * 2 + 1] = pack2<IS_BF16>(acc[n][2] * cap_grad[2], acc[n][3] * cap_grad[3]);
            }
        }

        // dV += Pᵀ·dO: k runs over the tile's queries, dO read through ldmatrix.trans.
#pragma unroll
        for (int kk = 0; kk < M_STEPS; ++kk)
#pragma unroll
            for (int dd = 0; dd < D_TILES / 2; ++dd) {
                u32 b[4];
                ldmatrix_x4_trans(b, q_b.at(dd, kk * 16) + so + DO_OFF);
                mma_16816<IS_BF16>(dv_acc[2 * dd], pk[kk], b[0], b[1]);
                mma_16816<IS_BF16>(dv_acc[2 * dd + 1], pk[kk], b[2], b[3]);
            }

        if constexpr (HAS_SOFTCAP || HAS_DROPOUT) {
#pragma unroll
            for (int kk = 0; kk < M_STEPS; ++kk)
#pragma unroll
                for (int i = 0; i < 4; ++i) pk[kk][i] = pg[kk][i];
        }

        // dPᵀ = V·dOᵀ, into the same registers as Sᵀ.
#pragma unroll
        for (int n = 0; n < M_TILES; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < K_STEPS; ++kk) {
            u32 a[4];
            ldmatrix_x4(a, k_a.at(kk, 0) + KV_TILE_BYTES);  // V's tile follows K's
#pragma unroll
            for (int nn = 0; nn < M_TILES / 2; ++nn) {
                u32 b[4];
                ldmatrix_x4(b, qt_b.at(kk, nn * 16) + so + DO_OFF);
                mma_16816<IS_BF16>(acc[2 * nn], a, b[0], b[1]);
                mma_16816<IS_BF16>(acc[2 * nn + 1], a, b[2], b[3]);
            }
        }

        // dSᵀ = Pᵀ ∘ (dPᵀ - D) (without the scale; with a soft-cap, times its derivative), packed
        // over Pᵀ's registers, and stored to
        // shared memory for dQ: the lane's key rows warp·16 + g (+8), query columns 8n + 2t, +1 in
        // chunk n.
#pragma unroll
        for (int n = 0; n < M_TILES; ++n) {
            float d[2];
            asm volatile("ld.shared.v2.f32 {%0,%1}, [%2];\n" : "=f"(d[0]), "=f"(d[1]) : "r"(s_d + 32 * n));
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                u32& word = pk[n / 2][(n & 1) * 2 + r];
                const float2 pr = unpack2<IS_BF16>(word);
                const float dp0 = dropped(p, keep, 4 * n + 2 * r, acc[n][2 * r]);
                const float dp1 = dropped(p, keep, 4 * n + 2 * r + 1, acc[n][2 * r + 1]);
                word = pack2<IS_BF16>(pr.x * (dp0 - d[0]), pr.y * (dp1 - d[1]));
                st_shared_u32(s_ds + swz<DS_ROW_BYTES>(warp * 16 + g + 8 * r, n) + 4 * t, word);
            }
        }

        // dK += dSᵀ·Q.
#pragma unroll
        for (int kk = 0; kk < M_STEPS; ++kk)
#pragma unroll
            for (int dd = 0; dd < D_TILES / 2; ++dd) {
                u32 b[4];
                ldmatrix_x4_trans(b, q_b.at(dd, kk * 16) + so);
                mma_16816<IS_BF16>(dk_acc[2 * dd], pk[kk], b[0], b[1]);
                mma_16816<IS_BF16>(dk_acc[2 * dd + 1], pk[kk], b[2], b[3]);
            }

        __syncthreads();  // dSᵀ is complete, and every warp is done with this stage's Q and dO
        if (it + 2 < steps) load_step(it + 2, stage);
        cp_async_commit();  // possibly empty, so that wait_group<1> keeps counting steps

        // dQ(rows 16·rg.., columns cg·DQ_COLS..) = dS·K over the tile's keys, in passes of at most
        // 64 columns (32 registers beside dK and dV's 128), each added to the accumulator: rows
        // m0 + 16·rg + g (+8), columns cg·DQ_COLS + 8n + 2t (+1).
        float* dq_at = bp.dq_accum + (row_base(bp, batch, h) + m0 + 16 * rg + g) * HEAD_DIM + cg * DQ_COLS + 2 * t;
        unsigned* sem = DETERMINISTIC ? dq_turn_counter(bp, batch, h, q_tile) : nullptr;
        if constexpr (DETERMINISTIC) dq_wait_turn(p, sem, seq, m0, kv_tile, tid);
#pragma unroll
        for (int pass = 0; pass < DQ_PASSES; ++pass) {
            float dq[PASS_TILES][4];
#pragma unroll
            for (int n = 0; n < PASS_TILES; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < N_STEPS; ++kk) {
                u32 a[4];
                ldmatrix_x4_trans(a, ds_a.at(0, kk * 16));
#pragma unroll
                for (int dd = 0; dd < PASS_TILES / 2; ++dd) {
                    u32 b[4];
                    ldmatrix_x4_trans(b, k_b.at(pass * (PASS_TILES / 2) + dd, kk * 16));
                    mma_16816<IS_BF16>(dq[2 * dd], a, b[0], b[1]);
                    mma_16816<IS_BF16>(dq[2 * dd + 1], a, b[2], b[3]);
                }
            }
            float* at = dq_at + pass * PASS_TILES * 8;
#pragma unroll
            for (int n = 0; n < PASS_TILES; ++n) {
                if constexpr (DETERMINISTIC) {
                    const float2 lo = ld_cg_f32x2(at + 8 * n);
                    const float2 hi = ld_cg_f32x2(at + 8 * n + 8 * HEAD_DIM);
                    st_cg_f32x2(at + 8 * n, make_float2(lo.x + dq[n][0], lo.y + dq[n][1]));
                    st_cg_f32x2(at + 8 * n + 8 * HEAD_DIM, make_float2(hi.x + dq[n][2], hi.y + dq[n][3]));
                } else {
                    red_add_f32(at + 8 * n, dq[n][0]);
                    red_add_f32(at + 8 * n + 1, dq[n][1]);
                    red_add_f32(at + 8 * n + 8 * HEAD_DIM, dq[n][2]);
                    red_add_f32(at + 8 * n + 8 * HEAD_DIM + 1, dq[n][3]);
                }
            }
        }
        if constexpr (DETERMINISTIC) dq_pass_turn(sem, tid);
    }
    cp_async_wait<0>();

    // dK (times the scale) and dV of the warp's keys, summed over the group's heads: each lane
    // stores its column pairs as 32-bit words (offsets and strides are multiples of 4 elements).
    u16* dk = bp.dk + batch * bp.dk_batch_stride + kv_head * bp.dk_head_stride;
    u16* dv = bp.dv + batch * bp.dv_batch_stride + kv_head * bp.dv_head_stride;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int key = key0 + 8 * r;
        if (key >= seq.seq_kv) continue;
        u16* dk_row = dk + (i64)key * bp.dk_seq_stride + 2 * t;
        u16* dv_row = dv + (i64)key * bp.dv_seq_stride + 2 * t;
#pragma unroll
        for (int d = 0; d < D_TILES; ++d) {
            if (!in_head_dim(d)) continue;  // a padded tile's columns past the head_dim
            st_global_u32(dk_row + 8 * d, pack2<IS_BF16>(dk_acc[d][2 * r] * bp.scale, dk_acc[d][2 * r + 1] * bp.scale));
            st_global_u32(dv_row + 8 * d, pack2<IS_BF16>(dv_acc[d][2 * r], dv_acc[d][2 * r + 1]));
        }
    }
}
