// The forward kernels' parameter block and the causal key range, shared by every forward kernel
// (flash_fwd_mma.cu, flash_fwd_wgmma.cu). Needs mma_ptx.cuh first (u16, i64).
#pragma once

// Mirrors `FwdParams` in src/cuda/plan/params.rs (#[repr(C)], 160 bytes; both sides assert the
// size).
// Strides are in elements; the pointers already include each tensor's offset.
struct FwdParams {
    const u16* q;
    const u16* k;
    const u16* v;
    u16* o;
    float* lse;  // null: not written
    i64 q_batch_stride, q_seq_stride, q_head_stride;
    i64 k_batch_stride, k_seq_stride, k_head_stride;
    i64 v_batch_stride, v_seq_stride, v_head_stride;
    i64 o_batch_stride, o_seq_stride, o_head_stride;
    int seq_q;
    int seq_kv;
    int num_heads;
    int group_size;     // query heads per K/V head
    int causal_offset;  // seq_kv - seq_q: row i sees keys j <= i + causal_offset
    float scale_log2;   // softmax scale * log2(e): scores go straight to exp2
};
static_assert(sizeof(FwdParams) == 160, "FwdParams must match the Rust mirror");

// One past the last key that query rows [m0, m0 + rows) can see: all keys, or (causal, aligned
// bottom-right) up to the last row's diagonal; 0 when no row sees any key. Key tiles at or past
// it are never loaded.
template <bool CAUSAL>
__device__ __forceinline__ int visible_keys_end(const FwdParams& p, int m0, int rows) {
    if (!CAUSAL) return p.seq_kv;
    const i64 limit = (i64)m0 + rows + p.causal_offset;
    return (int)(limit < 0 ? 0 : (limit < p.seq_kv ? limit : p.seq_kv));
}
