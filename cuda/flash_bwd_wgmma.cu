// FlashAttention backward main kernel for Hopper (sm_90a): the five products of a step on the
// warpgroup tensor-core instruction (wgmma) with warp specialization, FlashAttention-3's data
// flow. The preprocess and convert kernels and the deterministic order are bwd_aux.cuh's, shared
// with the mma.sync kernel (flash_bwd_mma.cu), whose opening comment has the shapes, the causal
// walk and the deterministic build's ordering argument; this kernel changes who computes what,
// not the order.
//
// Who owns what.
// * A CTA owns BLOCK_N = 128 keys of one (batch, K/V head) and walks the query tiles (BLOCK_M = 64
//   rows) of every query head of its GQA group that see one of them, as the mma.sync kernel does:
//   K and V stay in shared memory for the whole walk, Q, dO, the LSE and D arrive per step, dK and
//   dV stay in registers until the end. Three warpgroups:
// * The producer (warpgroup 0, its registers given to the others): warps 0-1 load K, V and then
//   each step's Q, dO, LSE and D with cp.async into a two-stage ring (mbarriers: a stage is
//   "full" when its copies have landed, "empty" when both consumers are done with it); warp 2's
//   first thread is the dQ writer: it adds each step's finished dQ tile from shared memory to the
//   f32 accumulator in global memory with one bulk reduction of the copy engine (in the
//   deterministic build after waiting its turn, bwd_aux.cuh), so neither the adds nor the wait
//   hold up the tensor cores. Warp 3 has nothing to do.
// * Consumer warpgroup c (1 + c) owns keys 64c .. 64c + 63 (wgmma's M is 64). Per step, transposed
//   so that its keys are the instruction's rows:
//     Sᵀ  = K_c·Qᵀ   and dPᵀ = V_c·dOᵀ   (64 x 64, both operands from shared memory, K-major),
//     Pᵀ  = exp2(Sᵀ·scale·log2 e − LSE·log2 e),   dSᵀ = Pᵀ ∘ (dPᵀ − D),
//     dV += Pᵀ·dO and dK += dSᵀ·Q          (64 x head_dim, A = Pᵀ / dSᵀ straight from the
//                                            accumulator registers, B N-major from shared memory),
//   and stores dSᵀ (16-bit) to shared memory. dQ = dS·K over all 128 keys needs both consumers'
//   dSᵀ, so the consumers split dQ's columns instead: consumer c computes dQ[:, c·DQ_COLS ..] with
//   A = the stored dSᵀ (M-major) and B = K (N-major), and stores its f32 fragment to the dQ tile
//   in shared memory in the registers' order (bwd_aux.cuh: dq_tile_index; the global tile uses
//   the same order, so the writer's reduction is one contiguous block).
// * A consumer thread (warp w of its warpgroup, lane 4g + q) holds, of every 64-row accumulator,
//   rows 16w + g and + 8 and, per 8 columns, columns 2q and 2q + 1 (wgmma_gen.cuh). For Sᵀ that is
//   2 keys x 16 queries: the LSE and D it needs are 16 floats of the stage, and its packed Pᵀ and
//   dSᵀ are exactly the A fragments of the next products (as in the forward's P·V).
//
// Why these sizes. Registers per consumer thread at head_dim 128: dK and dV 2 · 64 (64 x 128 f32
// over 128 threads each), Sᵀ and dPᵀ 2 · 32, Pᵀ and dSᵀ packed 2 · 16, dQ 32 (after Sᵀ and dPᵀ
// die): ~210 live, under the 232 setmaxnreg gives each consumer (the producer keeps 32, which
// its loader loops need to run without spills). head_dim 256 would need 256 for dK and dV alone
// (refused; FlashAttention-3 swaps the products' operands there). BLOCK_M = 64: the N of Sᵀ and the width of one 128-byte dSᵀ row. Shared memory at
// head_dim 128: K and V 2 · 32 KiB, two stages of Q + dO (2 · 16 KiB) + LSE and D, two dSᵀ
// buffers of 16 KiB (a consumer writes the next step's while the other may still read this
// one's for dQ) and the f32 dQ tile, 32 KiB: 194 KiB, one CTA per SM.
//
// Shared-memory tiles are in wgmma's operand layout (cp_async_panels: 64-column panels of
// 128-byte rows, 128-byte swizzle); every panel starts 1024-byte aligned. cp.async and st.shared
// write through the ordinary proxy, wgmma and the bulk reduction read through the asynchronous
// one: the dSᵀ and dQ writers fence (fence_proxy_async_shared) before they signal, the consumers
// after they wait for a stage (the cp.async writers are not there when the copies land).
//
// A head_dim below the tile's width is padded as in flash_bwd_mma.cu (FA_VALID_DIM).
//
// Compile-time parameters (-D, src/cuda/plan/backward.rs): FA_HEAD_DIM (64 or 128), FA_VALID_DIM,
// FA_BLOCK_M (64), FA_BLOCK_N (128), FA_CAUSAL, FA_BF16, FA_VEC_BYTES, FA_DETERMINISTIC,
// KERNEL_NAME, PREPROCESS_NAME, CONVERT_NAME, FA_SOFTCAP (the soft-cap's form) and FA_DROPOUT,
// both as in the mma.sync kernel.
#include "mma_ptx.cuh"
#include "sm90_ptx.cuh"
#include "wgmma_gen.cuh"
#include "fwd_params.cuh"
#include "bwd_params.cuh"

#ifndef KERNEL_NAME
#error "KERNEL_NAME must be defined (the kernel's config name)"
#endif

constexpr int HEAD_DIM = FA_HEAD_DIM;
constexpr int BLOCK_M = FA_BLOCK_M;  // query rows per step
constexpr int BLOCK_N = FA_BLOCK_N;  // keys per CTA
constexpr bool CAUSAL = FA_CAUSAL != 0;
constexpr bool IS_BF16 = FA_BF16 != 0;
constexpr bool DETERMINISTIC = FA_DETERMINISTIC != 0;
constexpr int VEC_BYTES = FA_VEC_BYTES;
constexpr int CONSUMERS = BLOCK_N / 64;
constexpr int DQ_WARPGROUPS = CONSUMERS;  // dQ tiles in the consumers' registers' order (bwd_aux.cuh)
constexpr int CONSUMER_THREADS = 128 * CONSUMERS;
constexpr int THREADS = 128 + CONSUMER_THREADS;
// Loader threads: producer warps 0-1. Their loops are unrolled 4 times: fully unrolled they
// need more than the producer's registers, not unrolled two warps issue a head_dim 128 step's
// copies more slowly than the consumers use them.
constexpr int LOADERS = 64;
constexpr int LOAD_UNROLL = 4;
constexpr int WRITER = 64;     // the dQ writer: warp 2's first thread
constexpr int PRODUCER_REGS = 32;
constexpr int CONSUMER_REGS = 232;
// Registers per thread at launch (__launch_bounds__(THREADS, 1): the file over THREADS, in
// ptxas's steps of 8). setmaxnreg.inc waits until the pool holds what it asks for, and the pool
// is what the producer's setmaxnreg.dec gave back: an ask beyond that never returns.
constexpr int LAUNCH_REGS = 65536 / THREADS / 8 * 8;
constexpr int PANELS = HEAD_DIM / 64;
constexpr u32 ROW_BYTES = 128;  // one panel row: 64 16-bit values
constexpr u32 QO_PANEL_BYTES = BLOCK_M * ROW_BYTES;
constexpr u32 KV_PANEL_BYTES = BLOCK_N * ROW_BYTES;
constexpr u32 QO_BYTES = PANELS * QO_PANEL_BYTES;
constexpr u32 KV_BYTES = PANELS * KV_PANEL_BYTES;
// One stage: Q, dO, LSE (base 2), D; rounded up so that the next stage's panels stay aligned.
constexpr u32 DO_OFF = QO_BYTES, LSE_OFF = 2 * QO_BYTES, D_OFF = 2 * QO_BYTES + BLOCK_M * 4;
constexpr u32 STAGE_BYTES = (2 * QO_BYTES + 2 * BLOCK_M * 4 + 1023) / 1024 * 1024;
constexpr u32 DS_BYTES = BLOCK_N * BLOCK_M * 2;  // dSᵀ: BLOCK_N rows of 64 queries
constexpr u32 DQ_BYTES = BLOCK_M * HEAD_DIM * 4;  // the f32 dQ tile
constexpr int K_STEPS = HEAD_DIM / 16;  // k16 steps of Sᵀ and dPᵀ (over head_dim)
constexpr int M_STEPS = BLOCK_M / 16;   // k16 steps of dV and dK (over queries)
constexpr int N_STEPS = BLOCK_N / 16;   // k16 steps of dQ (over keys)
constexpr int S_REGS = BLOCK_M / 2;     // Sᵀ, dPᵀ: 64 x BLOCK_M over 128 threads
constexpr int KV_REGS = HEAD_DIM / 2;   // dK, dV: 64 x HEAD_DIM
constexpr int DQ_COLS = HEAD_DIM / CONSUMERS;
constexpr int DQ_REGS = DQ_COLS / 2;    // dQ: 64 x DQ_COLS

static_assert(HEAD_DIM == 64 || HEAD_DIM == 128, "dK and dV of 64 keys fit the registers up to 128");
static_assert(BLOCK_M == 64, "Sᵀ's N and one 128-byte dSᵀ row");
static_assert(CONSUMERS == 2, "two consumer warpgroups of 64 keys");
static_assert(DQ_COLS == 32 || DQ_COLS == 64, "wgmma_ss_mn has N = 32 and 64");
static_assert((CONSUMER_REGS - LAUNCH_REGS) * CONSUMER_THREADS <= (LAUNCH_REGS - PRODUCER_REGS) * 128,
              "the consumers ask for more registers than the producer frees: setmaxnreg.inc would hang");
static_assert(2 * KV_BYTES + 2 * STAGE_BYTES + 2 * DS_BYTES + DQ_BYTES + 1024 <= 227 * 1024, "shared memory");

#include "bwd_aux.cuh"

__device__ __forceinline__ u64 desc_add(u64 d, u32 bytes) { return d + (u64)(bytes >> 4); }

extern "C" __global__ void __launch_bounds__(THREADS, 1) KERNEL_NAME(const __grid_constant__ BwdParams bp) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    // full[2], empty[2], dq_full, dq_empty.
    __shared__ __align__(8) u64 bars[6];
    const FwdParams& p = bp.fwd;
    const int tid = threadIdx.x;
    // The warpgroup from lane 0 (CUTLASS's canonical_warp_group_idx): a shuffle's result is
    // warp-uniform to ptxas, so the wgmma descriptors built from it stay on the uniform datapath
    // instead of being moved there (R2UR) before every wgmma. Every lane reaches this line.
    const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);
    // The fastest grid dimension; the deterministic build numbers the tiles from the last.
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
    auto step_head = [&](int step) { return kv_head * p.group_size + step / n_q; };
    auto step_tile = [&](int step) { return first_q + step % n_q; };

    // The dynamic buffer's start is not promised to be 1024-byte aligned: round up (the host
    // asks for 1024 bytes more).
    const u32 s_k = (smem_addr(smem_raw) + 1023u) & ~1023u;
    const u32 s_v = s_k + KV_BYTES;
    const u32 s_stage0 = s_v + KV_BYTES;          // stage s at s_stage0 + s·STAGE_BYTES
    const u32 s_ds0 = s_stage0 + 2 * STAGE_BYTES;  // dSᵀ buffer b at s_ds0 + b·DS_BYTES
    const u32 s_dq = s_ds0 + 2 * DS_BYTES;
    const u32 bar_full0 = smem_addr(&bars[0]), bar_empty0 = smem_addr(&bars[2]);
    const u32 bar_dq_full = smem_addr(&bars[4]), bar_dq_empty = smem_addr(&bars[5]);

    if (tid == 0) {
        for (int s = 0; s < 2; ++s) {
            mbar_init(bar_full0 + 8 * s, LOADERS);
            mbar_init(bar_empty0 + 8 * s, CONSUMER_THREADS);
        }
        mbar_init(bar_dq_full, CONSUMER_THREADS);
        mbar_init(bar_dq_empty, 1);
        mbar_fence_init();
    }
    __syncthreads();

    if (wg == 0) {
        // ---- producer ----
        regs_dealloc<PRODUCER_REGS>();
        if (tid < LOADERS) {
            auto load_step = [&](int step, int stage) {
                const int h = step_head(step);
                const int m0 = step_tile(step) * BLOCK_M;
                const u32 s = s_stage0 + (u32)stage * STAGE_BYTES;
                const u16* q = p.q + batch * p.q_batch_stride + h * p.q_head_stride + (i64)m0 * p.q_seq_stride;
                const u16* d_o =
                    bp.d_o + batch * bp.do_batch_stride + h * bp.do_head_stride + (i64)m0 * bp.do_seq_stride;
                cp_async_panels<BLOCK_M, HEAD_DIM, LOADERS, VEC_BYTES, LOAD_UNROLL, VALID_CHUNKS>(s, q, p.q_seq_stride, seq.seq_q - m0, tid);
                cp_async_panels<BLOCK_M, HEAD_DIM, LOADERS, VEC_BYTES, LOAD_UNROLL, VALID_CHUNKS>(s + DO_OFF, d_o, bp.do_seq_stride,
                                                                       seq.seq_q - m0, tid);
                // LSE and D: BLOCK_M floats each, padded in the workspace (16-byte chunks, no bounds).
                const i64 at = row_base(bp, batch, h) + m0;
                if (tid < BLOCK_M / 4) {
                    cp_async_16(s + LSE_OFF + 16 * tid, bp.lse_log2 + at + 4 * tid, true);
                } else if (tid < BLOCK_M / 2) {
                    const int c = tid - BLOCK_M / 4;
                    cp_async_16(s + D_OFF + 16 * c, bp.d_rows + at + 4 * c, true);
                }
            };
            // Each loader's copies of step t (step 0's with K and V) arrive on the stage's "full"
            // barrier when they land, without the loader waiting: it goes on to step t + 1 as
            // soon as that stage is empty.
            const u16* k = p.k + batch * p.k_batch_stride + kv_head * p.k_head_stride + (i64)n0 * p.k_seq_stride;
            const u16* v = p.v + batch * p.v_batch_stride + kv_head * p.v_head_stride + (i64)n0 * p.v_seq_stride;
            cp_async_panels<BLOCK_N, HEAD_DIM, LOADERS, VEC_BYTES, LOAD_UNROLL, VALID_CHUNKS>(s_k, k, p.k_seq_stride, seq.seq_kv - n0, tid);
            cp_async_panels<BLOCK_N, HEAD_DIM, LOADERS, VEC_BYTES, LOAD_UNROLL, VALID_CHUNKS>(s_v, v, p.v_seq_stride, seq.seq_kv - n0, tid);
            for (int it = 0; it < steps; ++it) {
                const int stage = it & 1;
                // Use it / 2 of the stage waits for the consumers' release of use it / 2 - 1.
                mbar_wait(bar_empty0 + 8 * stage, ((it >> 1) & 1) ^ 1);
                load_step(it, stage);
                cp_async_mbar_arrive(bar_full0 + 8 * stage);
            }
            cp_async_commit();
            cp_async_wait<0>();  // nothing in flight at exit (K and V's copies when no step sees them)
        } else if (tid == WRITER) {
            for (int it = 0; it < steps; ++it) {
                const int h = step_head(it);
                const int q_tile = step_tile(it);
                mbar_wait(bar_dq_full, it & 1);
                float* dq_tile = bp.dq_accum + (row_base(bp, batch, h) + (i64)q_tile * BLOCK_M) * HEAD_DIM;
                if constexpr (DETERMINISTIC) {
                    unsigned* sem = dq_turn_counter(bp, batch, h, q_tile);
                    dq_await_turn(p, sem, seq, q_tile * BLOCK_M, kv_tile);
                    bulk_reduce_add_f32(dq_tile, s_dq, DQ_BYTES);
                    bulk_commit();
                    bulk_wait_done();  // the adds are performed before the turn passes on
                    fence_proxy_async_global();
                    red_release_add_u32(sem, 1u);
                } else {
                    bulk_reduce_add_f32(dq_tile, s_dq, DQ_BYTES);
                    bulk_commit();
                    bulk_wait_read();
                }
                mbar_arrive(bar_dq_empty);
            }
            bulk_wait_done();
        }
        return;
    }

    // ---- consumers ----
    regs_alloc<CONSUMER_REGS>();
    const int cw = wg - 1;          // consumer 0 or 1: keys 64·cw ..
    const int ct = tid - 128;       // thread among the consumers: the dQ tile's thread index
    const int warp = (ct % 128) / 32;
    const int lane = tid % 32;
    const int g = lane / 4, q4 = lane % 4;

    // Descriptors at k-step 0 of stage 0 (wgmma_desc in sm90_ptx.cuh; steps add to the start).
    // K-major (k = head_dim): a k16 step is 32 bytes along a row, panels KV/QO_PANEL_BYTES apart.
    const u32 k_wg = s_k + (u32)cw * 64 * ROW_BYTES;  // this consumer's 64 keys of each panel
    const u64 k_desc = wgmma_desc(k_wg, 16, 1024);
    const u64 v_desc = wgmma_desc(k_wg + KV_BYTES, 16, 1024);
    const u64 q_desc = wgmma_desc(s_stage0, 16, 1024);  // Q, and dO at + DO_OFF
    // N-major (k = queries or keys): a k16 step is 16 rows (2048 bytes); along N the instruction
    // crosses panels LBO apart. Q and dO as dK's and dV's B (n = head_dim).
    const u64 qn_desc = wgmma_desc(s_stage0, QO_PANEL_BYTES, 1024);
    // dSᵀ as dQ's A, M-major (m = 64 queries: one panel); K as its B, N-major, from this
    // consumer's first dQ column (a 64-byte offset inside the row when DQ_COLS is 32: the
    // swizzle is applied to the address, as for the K-major steps).
    const u64 ds_desc = wgmma_desc(s_ds0, 1024, 1024);
    const u32 dq_col0 = (u32)cw * DQ_COLS;
    const u64 kn_desc = wgmma_desc(s_k + (dq_col0 / 64) * KV_PANEL_BYTES + (dq_col0 % 64) * 2, KV_PANEL_BYTES, 1024);

    float dk[KV_REGS], dv[KV_REGS];
#pragma unroll
    for (int i = 0; i < KV_REGS; ++i) dk[i] = dv[i] = 0.f;

    const int key_local = 64 * cw + 16 * warp + g;  // this thread's keys: key_local and + 8
    const int key0 = n0 + key_local;
    const ScoreUnits units = backward_units(p);

    for (int it = 0; it < steps; ++it) {
        const int stage = it & 1;
        const u32 so = (u32)stage * STAGE_BYTES;
        const u32 s_ds = s_ds0 + (u32)stage * DS_BYTES;
        const int m0 = step_tile(it) * BLOCK_M;
        const int h = step_head(it);  // the query head (dropout's mask is per query head)
        mbar_wait(bar_full0 + 8 * stage, (it >> 1) & 1);
        // The copies wrote through the ordinary proxy and landed asynchronously, so their
        // writers could not fence: the reader orders what the barrier made visible before wgmma.
        fence_proxy_async_shared();

        // Sᵀ = K_c·Qᵀ, then dPᵀ = V_c·dOᵀ: two groups, so that Pᵀ is formed while dPᵀ runs.
        float s[S_REGS], dp[S_REGS];
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < K_STEPS; ++kk) {
            const u32 off = (kk / 4) * KV_PANEL_BYTES + (kk % 4) * 32;
            const u32 q_off = so + (kk / 4) * QO_PANEL_BYTES + (kk % 4) * 32;
            wgmma_ss<BLOCK_M, IS_BF16>(s, desc_add(k_desc, off), desc_add(q_desc, q_off), kk > 0);
        }
        wgmma_commit();
#pragma unroll
        for (int kk = 0; kk < K_STEPS; ++kk) {
            const u32 off = (kk / 4) * KV_PANEL_BYTES + (kk % 4) * 32;
            const u32 q_off = so + DO_OFF + (kk / 4) * QO_PANEL_BYTES + (kk % 4) * 32;
            wgmma_ss<BLOCK_M, IS_BF16>(dp, desc_add(v_desc, off), desc_add(q_desc, q_off), kk > 0);
        }
        wgmma_commit();
        // Dropout's keep bits need neither product: drawn while the tensor cores run them.
        u32 keep[TRANSPOSED_KEEP_WORDS<BLOCK_M / 8>];
        if constexpr (HAS_DROPOUT) transposed_keep_bits<BLOCK_M / 8>(p, batch, h, m0, key0, lane, keep);
        wgmma_wait<1>();
        fence_regs(s);

        // Pᵀ, keys a row does not see set to 0 first (as in the mma.sync kernel; rows past seq_q
        // have LSE +inf, so P = 0), packed to 16 bits: slabs 2kk and 2kk + 1 of the accumulator are
        // the A fragment of k-step kk of dV += Pᵀ·dO.
        const bool need_mask = tile_needs_mask(p, seq, m0, n0);
        const u32 s_lse = s_stage0 + so + LSE_OFF + 8 * q4;
        const u32 s_d = s_stage0 + so + D_OFF + 8 * q4;
        // pk: Pᵀ as dropout leaves it, dV's A operand; with a soft-cap or dropout pg, Pᵀ times the
        // cap's derivative, is what dSᵀ is formed from (each word of pg dies as dSᵀ's is made).
        u32 pk[M_STEPS][4], pg[M_STEPS][4];
        // One copy of the loop with the mask and one without, under one branch a tile: with the
        // flag a run-time value ptxas kept a branch per element pair around the window's arithmetic.
        auto probabilities = [&](bool masked) {
#pragma unroll
            for (int j = 0; j < BLOCK_M / 8; ++j) {
                float lse[2];
                asm volatile("ld.shared.v2.f32 {%0,%1}, [%2];\n" : "=f"(lse[0]), "=f"(lse[1]) : "r"(s_lse + 32 * j));
                float cap_grad[4];
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int key = key0 + 8 * (e >> 1);
                    const int row = m0 + 8 * j + 2 * q4 + (e & 1);
                    s[4 * j + e] = score_probability(p, units, seq, masked, row, key, s[4 * j + e], lse[e & 1], cap_grad[e]);
                }
#pragma unroll
                for (int r = 0; r < 2; ++r)
                    pk[j / 2][(j & 1) * 2 + r] = pack2<IS_BF16>(dropped(p, keep, 4 * j + 2 * r, s[4 * j + 2 * r]),
                                                                dropped(p, keep, 4 * j + 2 * r + 1, s[4 * j + 2 * r + 1]));
                if constexpr (HAS_SOFTCAP || HAS_DROPOUT) {
                    pg[j / 2][(j & 1) * 2] = pack2<IS_BF16>(s[4 * j] * cap_grad[0], s[4 * j + 1] * cap_grad[1]);
                    pg[j / 2][(j & 1) * 2 + 1] = pack2<IS_BF16>(s[4 * j + 2] * cap_grad[2], s[4 * j + 3] * cap_grad[3]);
                }
            }
        };
        if (need_mask)
            probabilities(true);
        else
            probabilities(false);

        // dV += Pᵀ·dO.
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < M_STEPS; ++kk)
            wgmma_rs<HEAD_DIM, IS_BF16>(dv, pk[kk], desc_add(qn_desc, so + DO_OFF + kk * 16 * ROW_BYTES), 1);
        wgmma_commit();
        wgmma_wait<1>();  // dPᵀ is done; dV may still run
        fence_regs(dp);

        // dSᵀ = Pᵀ ∘ (dPᵀ − D) (without the scale; with a soft-cap, times its derivative) from
        // the rounded Pᵀ, as the mma.sync kernel; stored for dQ: key row key_local (+8), query
        // chunk j, the thread's column pair.
        u32 ds[M_STEPS][4];
#pragma unroll
        for (int j = 0; j < BLOCK_M / 8; ++j) {
            float d[2];
            asm volatile("ld.shared.v2.f32 {%0,%1}, [%2];\n" : "=f"(d[0]), "=f"(d[1]) : "r"(s_d + 32 * j));
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const float2 pr = unpack2<IS_BF16>(HAS_SOFTCAP || HAS_DROPOUT ? pg[j / 2][(j & 1) * 2 + r]
                                                                              : pk[j / 2][(j & 1) * 2 + r]);
                const float dp0 = dropped(p, keep, 4 * j + 2 * r, dp[4 * j + 2 * r]);
                const float dp1 = dropped(p, keep, 4 * j + 2 * r + 1, dp[4 * j + 2 * r + 1]);
                const u32 word = pack2<IS_BF16>(pr.x * (dp0 - d[0]), pr.y * (dp1 - d[1]));
                ds[j / 2][(j & 1) * 2 + r] = word;
                st_shared_u32(s_ds + swz<ROW_BYTES>(key_local + 8 * r, j) + 4 * q4, word);
            }
        }
        fence_proxy_async_shared();  // the dSᵀ stores, before wgmma reads them

        // dK += dSᵀ·Q.
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < M_STEPS; ++kk)
            wgmma_rs<HEAD_DIM, IS_BF16>(dk, ds[kk], desc_add(qn_desc, so + kk * 16 * ROW_BYTES), 1);
        wgmma_commit();

        // Both consumers' dSᵀ are stored (and, a step earlier, both read the other buffer).
        named_bar_sync(1, CONSUMER_THREADS);

        // dQ[:, dq_col0 ..] = dS·K over the tile's keys.
        float dq[DQ_REGS];
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < N_STEPS; ++kk)
            wgmma_ss_mn<DQ_COLS, IS_BF16>(dq, desc_add(ds_desc, stage * DS_BYTES + kk * 16 * ROW_BYTES),
                                          desc_add(kn_desc, kk * 16 * ROW_BYTES), kk > 0);
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(dq);
        fence_regs(dk);
        fence_regs(dv);
#pragma unroll
        for (int kk = 0; kk < M_STEPS; ++kk) {
            fence_regs(pk[kk]);
            fence_regs(ds[kk]);
        }
        mbar_arrive(bar_empty0 + 8 * stage);  // this thread's wgmmas no longer read the stage

        // The dQ tile to shared memory once the writer has read the previous one: float4 j of
        // this thread at 16·(j·CONSUMER_THREADS + ct), consecutive threads consecutive 16 bytes.
        mbar_wait(bar_dq_empty, (it & 1) ^ 1);
#pragma unroll
        for (int j = 0; j < DQ_REGS / 4; ++j)
            st_shared_v4(s_dq + 16 * (j * CONSUMER_THREADS + ct), dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]);
        fence_proxy_async_shared();  // before the copy engine reads them
        mbar_arrive(bar_dq_full);
    }

    // dK (times the scale) and dV of the thread's keys, summed over the group's heads: column
    // pairs as 32-bit words.
    u16* dk_out = bp.dk + batch * bp.dk_batch_stride + kv_head * bp.dk_head_stride;
    u16* dv_out = bp.dv + batch * bp.dv_batch_stride + kv_head * bp.dv_head_stride;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int key = key0 + 8 * r;
        if (key >= seq.seq_kv) continue;
        u16* dk_row = dk_out + (i64)key * bp.dk_seq_stride + 2 * q4;
        u16* dv_row = dv_out + (i64)key * bp.dv_seq_stride + 2 * q4;
#pragma unroll
        for (int j = 0; j < HEAD_DIM / 8; ++j) {
            if (!in_head_dim(j)) continue;  // a padded tile's columns past the head_dim
            st_global_u32(dk_row + 8 * j, pack2<IS_BF16>(dk[4 * j + 2 * r] * bp.scale, dk[4 * j + 2 * r + 1] * bp.scale));
            st_global_u32(dv_row + 8 * j, pack2<IS_BF16>(dv[4 * j + 2 * r], dv[4 * j + 2 * r + 1]));
        }
    }
}
