// The backward kernels' parameter block, and the small pieces they share with nothing else yet:
// ldmatrix addresses in swizzled tiles of any row width (swz, mma_ptx.cuh), 16-bit unpacking,
// and the global-memory operations of the deterministic dQ accumulation. Needs mma_ptx.cuh and
// fwd_params.cuh first.
#pragma once

// Mirrors `BwdParams` in src/cuda/plan/params.rs (#[repr(C)], 456 bytes; both sides assert the
// size). The forward's block comes first, so sequence_rows, keys_seen and lse_index read it as the
// forward kernels do: there q, k, v and o are the forward's inputs and output (read here), and
// `lse` is the forward's log-sum-exp (natural log, [batch, num_heads, seq_q], read here).
// Strides are in elements; the pointers already include each tensor's offset.
struct BwdParams {
    FwdParams fwd;
    const u16* d_o;
    u16* dq;
    u16* dk;
    u16* dv;
    i64 do_batch_stride, do_seq_stride, do_head_stride;
    i64 dq_batch_stride, dq_seq_stride, dq_head_stride;
    i64 dk_batch_stride, dk_seq_stride, dk_head_stride;
    i64 dv_batch_stride, dv_seq_stride, dv_head_stride;
    // Workspace, [batch, num_heads, seq_q_pad (, head_dim)] with seq_q_pad = q_tiles · BLOCK_M, so
    // that a query tile reads whole tiles without bounds checks: dQ accumulated in f32 (not yet
    // times the scale), D = rowsum(dO ∘ O), the LSE in base 2 (+inf for a row that sees no key
    // and for padding rows, so that their P is exp2(-inf) = 0).
    float* dq_accum;
    float* d_rows;
    float* lse_log2;
    // Deterministic builds: [batch, num_heads, q_tiles] counters, how many K/V tiles have added
    // their part of that dQ tile (zeroed by the preprocess kernel); null otherwise.
    unsigned* semaphores;
    int seq_q_pad;
    int q_tiles;
    int num_kv_heads;
    int kv_tiles;
    float scale;  // the softmax scale: dK's and dQ's factor
    int pad_;
};
static_assert(sizeof(BwdParams) == 456, "BwdParams must match the Rust mirror");

// The ldmatrix addresses of one lane in a swizzled tile: row `row + extra_rows`, chunk
// c0 + 2k + c. Only the low 3 bits of the chunk meet the XOR, so each of the four base[b] holds
// chunk c0 + 2b + c's address and k's higher bits add whole 128-byte blocks: the rest folds into
// immediates of the unrolled loops (flash_fwd_mma.cu's FragAddr, for any row width, with a
// run-time first chunk c0 so that a warp's column group never indexes base[] at run time, which
// would put it in local memory).
template <int ROW_BYTES>
struct TileAddr {
    u32 base[4];
    __device__ __forceinline__ TileAddr(u32 tile, int row, int c, int c0 = 0) {
#pragma unroll
        for (int b = 0; b < 4; ++b) {
            const int chunk = c0 + 2 * b + c;
            base[b] = tile + (u32)(row * ROW_BYTES + ((chunk & ~7) << 4) + (((chunk & 7) ^ (row & 7)) << 4));
        }
    }
    // k must be a compile-time constant after unrolling; extra_rows a multiple of 8.
    __device__ __forceinline__ u32 at(int k, int extra_rows) const {
        return base[k & 3] + (u32)((k >> 2) * 128 + extra_rows * ROW_BYTES);
    }
};

__device__ __forceinline__ void st_global_u32(void* p, u32 v) {
    asm volatile("st.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

// dQ's atomic accumulation: a reduction (no value returned).
__device__ __forceinline__ void red_add_f32(float* p, float v) {
    asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(p), "f"(v) : "memory");
}

// The deterministic dQ accumulation's memory operations. The accumulator is read and written at
// L2 (.cg): L1 is not coherent between SMs, and the previous K/V tile's CTA wrote these values on
// another SM.
__device__ __forceinline__ float2 ld_cg_f32x2(const float* p) {
    float2 v;
    asm volatile("ld.global.cg.v2.f32 {%0,%1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void st_cg_f32x2(float* p, float2 v) {
    asm volatile("st.global.cg.v2.f32 [%0], {%1,%2};\n" ::"l"(p), "f"(v.x), "f"(v.y) : "memory");
}
// The counter as the waiting thread sees it: an acquire load (sm_70+), so that what the CTA reads
// after the barrier that follows is at least what the counter's writer wrote before its release.
__device__ __forceinline__ unsigned ld_acquire_u32(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void red_release_add_u32(unsigned* p, unsigned v) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
