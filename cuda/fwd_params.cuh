// The forward kernels' parameter block and the causal key range, shared by every forward kernel
// (flash_fwd_mma.cu, flash_fwd_wgmma.cu). Needs mma_ptx.cuh first (u16, i64).
#pragma once

// Mirrors `FwdParams` in src/cuda/plan/params.rs (#[repr(C)], 200 bytes; both sides assert the
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
    // A packed (varlen) batch (src/problem/varlen.rs): the [batch + 1] row offsets of Q/O and of
    // K/V (null for a batch of equal sequences, whose seq_q/seq_kv above are every sequence's;
    // packed, they are the longest's and the batch strides are 0), and the packed rows.
    const unsigned* cu_seqlens_q;
    const unsigned* cu_seqlens_k;
    int total_q;
    int total_kv;
    // A sliding window's sides in keys (-1: unbounded) and the soft-cap in base 2 (cap · log2 e;
    // 0: none) with its reciprocal (a multiply per score where a division would cost several
    // instructions).
    int window_left;
    int window_right;
    float softcap_log2;
    float softcap_inv_log2;
};
static_assert(sizeof(FwdParams) == 200, "FwdParams must match the Rust mirror");

// Where one sequence's rows are: its first row of Q/O and of K/V and its lengths. Offsets a
// caller's device buffers may get wrong are checked, never trusted: query rows outside Q make a
// sequence of no rows (nothing can be written), keys outside K/V or longer than seq_kv keep its
// rows but mark it invalid (written as NaN).
struct SeqRows {
    int q_first;
    int seq_q;
    int kv_first;
    int seq_kv;
    int causal_offset;  // seq_kv - seq_q: row i sees keys j <= i + causal_offset
    bool valid;
};

__device__ __forceinline__ SeqRows sequence_rows(const FwdParams& p, int b) {
    SeqRows s{0, p.seq_q, 0, p.seq_kv, p.causal_offset, true};
    if (p.cu_seqlens_q == nullptr) return s;
    const unsigned q0 = p.cu_seqlens_q[b], q1 = p.cu_seqlens_q[b + 1];
    if (q1 < q0 || q1 > (unsigned)p.total_q || q1 - q0 > (unsigned)p.seq_q) {
        s.seq_q = 0;
        s.valid = false;
        return s;
    }
    s.q_first = (int)q0;
    s.seq_q = (int)(q1 - q0);
    const unsigned k0 = p.cu_seqlens_k[b], k1 = p.cu_seqlens_k[b + 1];
    if (k1 < k0 || k1 > (unsigned)p.total_kv || k1 - k0 > (unsigned)p.seq_kv) {
        s.seq_kv = 0;
        s.valid = false;
    } else {
        s.kv_first = (int)k0;
        s.seq_kv = (int)(k1 - k0);
    }
    s.causal_offset = s.seq_kv - s.seq_q;
    return s;
}

// Index of row `row` of sequence `b`'s head `head` in the LSE: [batch, num_heads, seq_q], or
// [num_heads, total_q] when packed.
__device__ __forceinline__ i64 lse_index(const FwdParams& p, const SeqRows& s, int b, int head, int row) {
    if (p.cu_seqlens_q != nullptr) return (i64)head * p.total_q + s.q_first + row;
    return ((i64)b * p.num_heads + head) * p.seq_q + row;
}

// The keys [begin, end) query row `row` of a sequence sees: all of them, cut by the causal mask at
// its diagonal (aligned bottom-right) and by the sliding window around its position. Mirrors
// keys_seen in shaders/common.wgsl and AttentionProblem::visible_keys.
template <bool CAUSAL>
__device__ __forceinline__ int2 keys_seen(const FwdParams& p, const SeqRows& s, int row) {
    const i64 pos = (i64)row + s.causal_offset;
    i64 begin = 0;
    i64 end = s.seq_kv;
    if (CAUSAL && pos + 1 < end) end = pos + 1;
    if (p.window_left >= 0 && pos - p.window_left > begin) begin = pos - p.window_left;
    if (!CAUSAL && p.window_right >= 0 && pos + p.window_right + 1 < end) end = pos + p.window_right + 1;
    if (end < 0) end = 0;
    if (begin > end) begin = end;
    return make_int2((int)begin, (int)end);
}

// One past the last key that query rows [m0, m0 + rows) can see (the last row's end; 0 when no
// row sees any key). Key tiles at or past it are never loaded.
template <bool CAUSAL>
__device__ __forceinline__ int visible_keys_end(const FwdParams& p, const SeqRows& s, int m0, int rows) {
    return keys_seen<CAUSAL>(p, s, m0 + rows - 1).y;
}

// tanh on the special-function unit (sm_75+): one instruction where tanhf is a dozen, relative
// error below 2^-10.9 (PTX ISA), which the 16-bit inputs' own rounding dwarfs; FlashAttention
// caps its scores with it too.
__device__ __forceinline__ float tanh_approx(float x) {
    float y;
    asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// A scaled score (base 2) soft-capped: cap·tanh(x / cap), nothing without a cap.
__device__ __forceinline__ float soft_cap(const FwdParams& p, float x) {
    return p.softcap_log2 > 0.f ? p.softcap_log2 * tanh_approx(x * p.softcap_inv_log2) : x;
}
