// The forward kernels' parameter block and the causal key range, shared by every forward kernel
// (flash_fwd_mma.cu, flash_fwd_wgmma.cu). Needs mma_ptx.cuh first (u16, i64).
#pragma once

// Mirrors `FwdParams` in src/cuda/plan/params.rs (#[repr(C)], 256 bytes; both sides assert the
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
    // ALiBi (src/problem/head_terms.rs): alibi_mode 0 none, 1 the geometric slopes, 2 the
    // [num_heads] f32 slopes at alibi_slopes; sinks: [num_heads] f32 logits, or null.
    const float* alibi_slopes;
    const float* sinks;
    // The score bias (src/problem/score_bias.rs): its element (b, h, i, j) at bias + b·batch +
    // h·head + i·row + j elements (offset included; a stride of 0 broadcasts), of bias_dtype (0
    // f32, 1 f16, 2 bf16); null for none.
    const void* bias;
    i64 bias_batch_stride, bias_head_stride, bias_row_stride;
    int alibi_mode;
    int bias_dtype;
};
static_assert(sizeof(FwdParams) == 256, "FwdParams must match the Rust mirror");

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

// A scaled score (base 2) soft-capped: cap·tanh(x / cap), nothing without a cap. Where |x / cap|
// is below 1/16, tanh's series y − y³/3 + 2y⁵/15 (relative error below 4e-9) is taken as x times
// 1 − y²/3 + 2y⁴/15, without the cap: tanh.approx's error times a cap far above the scores would
// swamp them, and x / cap falls below f32's normal range (flushed to 0) for caps near 1e38,
// where cap·tanh(x / cap) is x. shaders/common.wgsl's soft_cap is the same.
__device__ __forceinline__ float soft_cap(const FwdParams& p, float x) {
    if (!(p.softcap_log2 > 0.f)) return x;
    const float y = x * p.softcap_inv_log2;
    const float y2 = y * y;
    const float series = x * fmaf(y2, fmaf(y2, 2.f / 15.f, -1.f / 3.f), 1.f);
    return fabsf(y) < 0.0625f ? series : p.softcap_log2 * tanh_approx(y);
}

// ---- ALiBi, the score bias and sinks (the forward kernels' per-score and per-row terms) ----

// Whether scores get ALiBi's or the bias's terms at all: a uniform branch plain attention skips.
__device__ __forceinline__ bool has_score_terms(const FwdParams& p) {
    return p.alibi_mode != 0 || p.bias != nullptr;
}

// Query head h's ALiBi slope times log2 e (0 without ALiBi). The geometric slopes for n heads,
// with q the largest power of two <= n: 2^(-8(h+1)/q) for h < q, else 2^(-4(2(h-q)+1)/q)
// (Alibi::geometric_slope).
__device__ __forceinline__ float alibi_slope_log2(const FwdParams& p, int h) {
    constexpr float LOG2E_F = 1.4426950408889634f;
    if (p.alibi_mode == 2) return p.alibi_slopes[h] * LOG2E_F;
    if (p.alibi_mode != 1) return 0.f;
    const int q = 1 << (31 - __clz(p.num_heads));
    const float e = h < q ? -8.f * (float)(h + 1) / (float)q : -4.f * (float)(2 * (h - q) + 1) / (float)q;
    return exp2f(e) * LOG2E_F;
}

// An f16 value from its bits (the kernels include no CUDA headers).
__device__ __forceinline__ float f16_bits_to_float(unsigned short bits) {
    float f;
    asm("{ .reg .b16 h; mov.b16 h, %1; cvt.f32.f16 %0, h; }" : "=f"(f) : "h"(bits));
    return f;
}

// ALiBi's base-2 term, -slope·|position - key|, for a key c columns right of a column col0, from
// rel = row + causal_offset - col0 (a float worked out once per row and tile: converting every
// score's column would cost as much as its exp2).
__device__ __forceinline__ float alibi_term(float slope_log2, float rel, float c) {
    return -slope_log2 * fabsf(rel - c);
}

// The bias's base-2 term for query `row` (within sequence `s`, batch entry b, head h) against key
// `col`: its value times log2 e, or -inf where it hides the key; 0 without a bias, and for rows
// past the sequence's queries or keys past its end (the kernels mask or drop those).
__device__ __forceinline__ float bias_term(const FwdParams& p, const SeqRows& s, int b, int h, int row, int col) {
    if (p.bias == nullptr || row >= s.seq_q || col >= s.seq_kv) return 0.f;
    const i64 e = b * p.bias_batch_stride + h * p.bias_head_stride + (i64)row * p.bias_row_stride + col;
    float x;
    if (p.bias_dtype == 0) {
        x = __ldg(static_cast<const float*>(p.bias) + e);
    } else {
        const unsigned short bits = __ldg(static_cast<const unsigned short*>(p.bias) + e);
        x = p.bias_dtype == 1 ? f16_bits_to_float(bits) : __uint_as_float((unsigned)bits << 16);
    }
    return x == NEG_INF ? NEG_INF : x * 1.4426950408889634f;
}

// A row's final softmax state with head h's sink joining its sum: from the row's max m (base 2;
// -inf for a row that saw no key) and sum, m' = max(m, sink), sum' = sum·f + 2^(sink - m'), and
// what its output (accumulated under m) is multiplied by, f = 2^(m - m'). Without sinks, (m, sum, 1).
struct RowTotal {
    float m, sum, o_factor;
};

__device__ __forceinline__ RowTotal join_sink(const FwdParams& p, int h, float m, float sum) {
    if (p.sinks == nullptr) return RowTotal{m, sum, 1.f};
    const float sink = p.sinks[h] * 1.4426950408889634f;
    const float m_new = fmaxf(m, sink);
    const float f = m == NEG_INF ? 0.f : exp2f(m - m_new);
    return RowTotal{m_new, sum * f + exp2f(sink - m_new), f};
}
