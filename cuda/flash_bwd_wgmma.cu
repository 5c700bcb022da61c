// FlashAttention backward main kernel for Hopper (sm_90a): the five products of a step on the
// warpgroup tensor-core instruction (wgmma), FlashAttention-3's data flow. The preprocess and
// convert kernels and the deterministic turn-taking are bwd_aux.cuh's, shared with the mma.sync
// kernel (flash_bwd_mma.cu), whose opening comment has the shapes, the causal walk and the
// deterministic build's ordering argument; this kernel changes who computes what, not the order.
//
// Who owns what.
// * A CTA owns BLOCK_N = 64 · WARPGROUPS keys of one (batch, K/V head) and walks the query tiles
//   (BLOCK_M = 64 rows) of every query head of its GQA group that see one of them, as the mma.sync
//   kernel does: K and V in shared memory for the whole walk, Q, dO, the LSE and D through two
//   cp.async stages, dK and dV in registers until the end.
// * Warpgroup w owns keys 64w .. 64w + 63 of the tile (wgmma's M is 64). Per step it computes,
//   transposed so that its keys are the instruction's rows:
//     Sᵀ  = K_w·Qᵀ   and dPᵀ = V_w·dOᵀ   (64 x 64, both operands from shared memory, K-major),
//     Pᵀ  = exp2(Sᵀ·scale·log2 e − LSE·log2 e),   dSᵀ = Pᵀ ∘ (dPᵀ − D),
//     dV += Pᵀ·dO and dK += dSᵀ·Q          (64 x head_dim, A = Pᵀ / dSᵀ straight from the
//                                            accumulator registers, B N-major from shared memory),
//   and stores dSᵀ (16-bit) to shared memory. Then dQ = dS·K over all BLOCK_N keys needs both
//   warpgroups' dSᵀ, so the warpgroups split dQ's columns instead: warpgroup w computes
//   dQ[:, w·DQ_COLS ..] with A = the stored dSᵀ (M-major) and B = K (N-major), and adds its f32
//   fragment to the workspace with 16-byte vector reductions, the tile kept in the registers'
//   order (bwd_aux.cuh: dq_tile_index) so that a warp's adds are 512 contiguous bytes.
// * A thread (warp w' of its warpgroup, lane 4g + q) holds, of every 64-row accumulator, rows
//   16w' + g and + 8 and, per 8 columns, columns 2q and 2q + 1 (wgmma_gen.cuh). For Sᵀ that is
//   2 keys x 16 queries: the LSE and D it needs are 16 floats of the stage, and its packed Pᵀ and
//   dSᵀ are exactly the A fragments of the next products (as in the forward's P·V).
//
// Why these sizes. Registers per thread at head_dim 128: dK and dV 2 · 64 (64 x 128 f32 over
// 128 threads each), Sᵀ and dPᵀ 2 · 32, Pᵀ and dSᵀ packed 2 · 16, dQ 32 (after Sᵀ and dPᵀ die):
// at most ~210 live, under the 255 of one 256-thread CTA per SM. head_dim 256 would need 256 for
// dK and dV alone (refused; FlashAttention-3 swaps the products' operands there). BLOCK_M = 64:
// the N of Sᵀ and the width of one 128-byte dSᵀ row. Shared memory at head_dim 128: K and V
// 2 · 32 KiB, two stages of Q + dO (2 · 16 KiB) + LSE, D, dSᵀ 16 KiB: 146 KiB, one CTA per SM.
//
// Shared-memory tiles are in wgmma's operand layout (cp_async_panels: 64-column panels of
// 128-byte rows, 128-byte swizzle); every panel starts 1024-byte aligned.
//
// Compile-time parameters (-D, src/cuda/plan/backward.rs): FA_HEAD_DIM (64 or 128), FA_BLOCK_M
// (64), FA_BLOCK_N (128), FA_CAUSAL, FA_BF16, FA_VEC_BYTES, FA_DETERMINISTIC, KERNEL_NAME,
// PREPROCESS_NAME, CONVERT_NAME.
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
constexpr int WARPGROUPS = BLOCK_N / 64;
constexpr int DQ_WARPGROUPS = WARPGROUPS;  // dQ tiles in the registers' order (bwd_aux.cuh)
constexpr int THREADS = WARPGROUPS * 128;
constexpr int PANELS = HEAD_DIM / 64;
constexpr u32 ROW_BYTES = 128;  // one panel row: 64 16-bit values
constexpr u32 QO_PANEL_BYTES = BLOCK_M * ROW_BYTES;
constexpr u32 KV_PANEL_BYTES = BLOCK_N * ROW_BYTES;
constexpr u32 QO_BYTES = PANELS * QO_PANEL_BYTES;
constexpr u32 KV_BYTES = PANELS * KV_PANEL_BYTES;
// One stage: Q, dO, LSE (base 2), D; rounded up so that the next stage's panels stay aligned.
constexpr u32 DO_OFF = QO_BYTES, LSE_OFF = 2 * QO_BYTES, D_OFF = 2 * QO_BYTES + BLOCK_M * 4;
constexpr u32 STAGE_BYTES = (2 * QO_BYTES + 2 * BLOCK_M * 4 + 1023) / 1024 * 1024;
constexpr int K_STEPS = HEAD_DIM / 16;  // k16 steps of Sᵀ and dPᵀ (over head_dim)
constexpr int M_STEPS = BLOCK_M / 16;   // k16 steps of dV and dK (over queries)
constexpr int N_STEPS = BLOCK_N / 16;   // k16 steps of dQ (over keys)
constexpr int S_REGS = BLOCK_M / 2;     // Sᵀ, dPᵀ: 64 x BLOCK_M over 128 threads
constexpr int KV_REGS = HEAD_DIM / 2;   // dK, dV: 64 x HEAD_DIM
constexpr int DQ_COLS = HEAD_DIM / WARPGROUPS;
constexpr int DQ_REGS = DQ_COLS / 2;    // dQ: 64 x DQ_COLS

static_assert(HEAD_DIM == 64 || HEAD_DIM == 128, "dK and dV of 64 keys fit the registers up to 128");
static_assert(BLOCK_M == 64, "Sᵀ's N and one 128-byte dSᵀ row");
static_assert(WARPGROUPS == 2, "two warpgroups of 64 keys");
static_assert(DQ_COLS == 32 || DQ_COLS == 64, "wgmma_ss_mn has N = 32 and 64");

#include "bwd_aux.cuh"

__device__ __forceinline__ u64 desc_add(u64 d, u32 bytes) { return d + (u64)(bytes >> 4); }

extern "C" __global__ void __launch_bounds__(THREADS, 1) KERNEL_NAME(const __grid_constant__ BwdParams bp) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const FwdParams& p = bp.fwd;
    const int tid = threadIdx.x;
    const int wg = tid / 128;
    const int warp = (tid % 128) / 32;
    const int lane = tid % 32;
    const int g = lane / 4, q4 = lane % 4;
    // The fastest grid dimension; the deterministic build numbers the tiles from the last.
    const int kv_tile = DETERMINISTIC ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
    const int kv_head = blockIdx.y;
    const int batch = blockIdx.z;
    const int n0 = kv_tile * BLOCK_N;
    const SeqRows seq = sequence_rows(p, batch);

    const int first_q = first_query_tile(seq, n0, bp.q_tiles);
    const int n_q = bp.q_tiles - first_q;
    const int steps = n_q * p.group_size;  // (query head of the group, query tile) pairs

    const u16* k = p.k + batch * p.k_batch_stride + kv_head * p.k_head_stride + (i64)n0 * p.k_seq_stride;
    const u16* v = p.v + batch * p.v_batch_stride + kv_head * p.v_head_stride + (i64)n0 * p.v_seq_stride;

    // The dynamic buffer's start is not promised to be 1024-byte aligned: round up (the host
    // asks for 1024 bytes more).
    const u32 s_k = (smem_addr(smem_raw) + 1023u) & ~1023u;
    const u32 s_v = s_k + KV_BYTES;
    const u32 s_stage0 = s_v + KV_BYTES;  // stage s at s_stage0 + s·STAGE_BYTES
    const u32 s_ds = s_stage0 + 2 * STAGE_BYTES;  // dSᵀ: BLOCK_N rows (keys) of 64 queries

    auto step_head = [&](int step) { return kv_head * p.group_size + step / n_q; };
    auto step_tile = [&](int step) { return first_q + step % n_q; };
    auto load_step = [&](int step, int stage) {
        const int h = step_head(step);
        const int m0 = step_tile(step) * BLOCK_M;
        const u32 s = s_stage0 + (u32)stage * STAGE_BYTES;
        const u16* q = p.q + batch * p.q_batch_stride + h * p.q_head_stride + (i64)m0 * p.q_seq_stride;
        const u16* d_o = bp.d_o + batch * bp.do_batch_stride + h * bp.do_head_stride + (i64)m0 * bp.do_seq_stride;
        cp_async_panels<BLOCK_M, HEAD_DIM, THREADS, VEC_BYTES>(s, q, p.q_seq_stride, seq.seq_q - m0, tid);
        cp_async_panels<BLOCK_M, HEAD_DIM, THREADS, VEC_BYTES>(s + DO_OFF, d_o, bp.do_seq_stride, seq.seq_q - m0, tid);
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
    cp_async_panels<BLOCK_N, HEAD_DIM, THREADS, VEC_BYTES>(s_k, k, p.k_seq_stride, seq.seq_kv - n0, tid);
    cp_async_panels<BLOCK_N, HEAD_DIM, THREADS, VEC_BYTES>(s_v, v, p.v_seq_stride, seq.seq_kv - n0, tid);
    if (steps > 0) load_step(0, 0);
    cp_async_commit();
    if (steps > 1) load_step(1, 1);
    cp_async_commit();

    // Descriptors at k-step 0 of stage 0 (wgmma_desc in sm90_ptx.cuh; steps add to the start).
    // K-major (k = head_dim): a k16 step is 32 bytes along a row, panels KV/QO_PANEL_BYTES apart.
    const u32 k_wg = s_k + (u32)wg * 64 * ROW_BYTES;  // this warpgroup's 64 keys of each panel
    const u64 k_desc = wgmma_desc(k_wg, 16, 1024);
    const u64 v_desc = wgmma_desc(k_wg + KV_BYTES, 16, 1024);
    const u64 q_desc = wgmma_desc(s_stage0, 16, 1024);  // Q, and dO at + DO_OFF
    // N-major (k = queries or keys): a k16 step is 16 rows (2048 bytes); along N the instruction
    // crosses panels LBO apart. Q and dO as dK's and dV's B (n = head_dim).
    const u64 qn_desc = wgmma_desc(s_stage0, QO_PANEL_BYTES, 1024);
    // dSᵀ as dQ's A, M-major (m = 64 queries: one panel); K as its B, N-major, from this
    // warpgroup's first dQ column (a 64-byte offset inside the row when DQ_COLS is 32: the
    // swizzle is applied to the address, as for the K-major steps).
    const u64 ds_desc = wgmma_desc(s_ds, 1024, 1024);
    const u32 dq_col0 = (u32)wg * DQ_COLS;
    const u64 kn_desc = wgmma_desc(s_k + (dq_col0 / 64) * KV_PANEL_BYTES + (dq_col0 % 64) * 2, KV_PANEL_BYTES, 1024);

    float dk[KV_REGS], dv[KV_REGS];
#pragma unroll
    for (int i = 0; i < KV_REGS; ++i) dk[i] = dv[i] = 0.f;

    const int key_local = 64 * wg + 16 * warp + g;  // this thread's keys: key_local and + 8
    const int key0 = n0 + key_local;

    for (int it = 0; it < steps; ++it) {
        cp_async_wait<1>();  // every group but the newest is done: step `it` has landed
        fence_proxy_async_shared();
        __syncthreads();
        const int stage = it & 1;
        const u32 so = (u32)stage * STAGE_BYTES;
        const int h = step_head(it);
        const int q_tile = step_tile(it);
        const int m0 = q_tile * BLOCK_M;

        // Sᵀ = K_w·Qᵀ, then dPᵀ = V_w·dOᵀ: two groups, so that Pᵀ is formed while dPᵀ runs.
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
        wgmma_wait<1>();
        fence_regs(s);

        // Pᵀ, keys a row does not see set to 0 first (as in the mma.sync kernel; rows past seq_q
        // have LSE +inf, so P = 0), packed to 16 bits: slabs 2kk and 2kk + 1 of the accumulator are
        // the A fragment of k-step kk of dV += Pᵀ·dO.
        const bool need_mask =
            n0 + BLOCK_N > seq.seq_kv || (CAUSAL && n0 + BLOCK_N - 1 > m0 + seq.causal_offset);
        const u32 s_lse = s_stage0 + so + LSE_OFF + 8 * q4;
        const u32 s_d = s_stage0 + so + D_OFF + 8 * q4;
        u32 pk[M_STEPS][4];
#pragma unroll
        for (int j = 0; j < BLOCK_M / 8; ++j) {
            float lse[2];
            asm volatile("ld.shared.v2.f32 {%0,%1}, [%2];\n" : "=f"(lse[0]), "=f"(lse[1]) : "r"(s_lse + 32 * j));
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float x = s[4 * j + e];
                if (need_mask) {
                    const int key = key0 + 8 * (e >> 1);
                    const int row = m0 + 8 * j + 2 * q4 + (e & 1);
                    if (key >= seq.seq_kv || (CAUSAL && key > row + seq.causal_offset)) x = NEG_INF;
                }
                s[4 * j + e] = ex2(fmaf(x, p.scale_log2, -lse[e & 1]));
            }
            pk[j / 2][(j & 1) * 2] = pack2<IS_BF16>(s[4 * j], s[4 * j + 1]);
            pk[j / 2][(j & 1) * 2 + 1] = pack2<IS_BF16>(s[4 * j + 2], s[4 * j + 3]);
        }

        // dV += Pᵀ·dO.
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < M_STEPS; ++kk)
            wgmma_rs<HEAD_DIM, IS_BF16>(dv, pk[kk], desc_add(qn_desc, so + DO_OFF + kk * 16 * ROW_BYTES), 1);
        wgmma_commit();
        wgmma_wait<1>();  // dPᵀ is done; dV may still run
        fence_regs(dp);

        // dSᵀ = Pᵀ ∘ (dPᵀ − D) (without the scale) from the rounded Pᵀ, as the mma.sync kernel;
        // stored for dQ: key row key_local (+8), query chunk j, the thread's column pair.
        u32 ds[M_STEPS][4];
#pragma unroll
        for (int j = 0; j < BLOCK_M / 8; ++j) {
            float d[2];
            asm volatile("ld.shared.v2.f32 {%0,%1}, [%2];\n" : "=f"(d[0]), "=f"(d[1]) : "r"(s_d + 32 * j));
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const float2 pr = unpack2<IS_BF16>(pk[j / 2][(j & 1) * 2 + r]);
                const u32 word = pack2<IS_BF16>(pr.x * (dp[4 * j + 2 * r] - d[0]), pr.y * (dp[4 * j + 2 * r + 1] - d[1]));
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

        __syncthreads();  // both warpgroups' dSᵀ are stored

        // dQ[:, dq_col0 ..] = dS·K over the tile's keys.
        float dq[DQ_REGS];
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < N_STEPS; ++kk)
            wgmma_ss_mn<DQ_COLS, IS_BF16>(dq, desc_add(ds_desc, kk * 16 * ROW_BYTES),
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

        float* dq_tile = bp.dq_accum + (row_base(bp, batch, h) + m0) * HEAD_DIM;
        unsigned* sem = DETERMINISTIC ? dq_turn_counter(bp, batch, h, q_tile) : nullptr;
        if constexpr (DETERMINISTIC) dq_wait_turn(sem, seq, m0, kv_tile, tid);
#pragma unroll
        for (int j = 0; j < DQ_REGS / 4; ++j) {
            float* at = dq_tile + 4 * (j * THREADS + tid);
            if constexpr (DETERMINISTIC) {
                const float4 a = ld_cg_f32x4(at);
                st_cg_f32x4(at, make_float4(a.x + dq[4 * j], a.y + dq[4 * j + 1], a.z + dq[4 * j + 2], a.w + dq[4 * j + 3]));
            } else {
                red_add_f32x4(at, dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]);
            }
        }
        if constexpr (DETERMINISTIC) dq_pass_turn(sem, tid);

        __syncthreads();  // every warpgroup is done with this stage and with dSᵀ
        if (it + 2 < steps) load_step(it + 2, stage);
        cp_async_commit();  // possibly empty, so that wait_group<1> keeps counting steps
    }
    cp_async_wait<0>();

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
            st_global_u32(dk_row + 8 * j, pack2<IS_BF16>(dk[4 * j + 2 * r] * bp.scale, dk[4 * j + 2 * r + 1] * bp.scale));
            st_global_u32(dv_row + 8 * j, pack2<IS_BF16>(dv[4 * j + 2 * r], dv[4 * j + 2 * r + 1]));
        }
    }
}
