// The forward kernels' parameter block, the causal key range, the score terms and dropout
// (dropout.cuh), shared by every forward kernel (flash_fwd_mma.cu, flash_fwd_wgmma.cu). Needs
// mma_ptx.cuh first (u16, u32, i64).
#pragma once

// Mirrors `FwdParams` in src/cuda/plan/params.rs (#[repr(C)], 272 bytes; both sides assert the
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
    // Dropout (src/problem/dropout.rs, dropout.cuh): the generator's key, the 16-bit threshold
    // below which a probability is dropped, and the kept ones' factor 1/(1 - p). Read only by
    // kernels compiled with FA_DROPOUT.
    u32 dropout_key0;
    u32 dropout_key1;
    u32 dropout_threshold;
    float dropout_scale;
};
static_assert(sizeof(FwdParams) == 272, "FwdParams must match the Rust mirror");

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

// ---- Score-term variants: ALiBi, the score bias, the soft-cap ----
//
// Compile-time switches (-DFA_ALIBI, -DFA_BIAS: 0 or 1; -DFA_SOFTCAP: 0, 1 tanh, 2 tanh with its
// series for caps far above the scores, the cap's CapForm in src/problem/softcap.rs; set by
// src/cuda/plan from the problem's ScoreTerms), so that the plain kernel holds none of their code or registers and
// a variant only its own terms'. The host launches a config only for a problem with exactly its
// terms (CudaKernelConfig::check_terms), so the run-time values below are set whenever a switch
// is on; their own modes (slopes geometric or per head, the bias's dtype and strides, the cap)
// stay run-time. Kernels that define none of them (flash_decode.cu) get the plain defaults.
#ifndef FA_ALIBI
#define FA_ALIBI 0
#endif
#ifndef FA_BIAS
#define FA_BIAS 0
#endif
#ifndef FA_SOFTCAP
#define FA_SOFTCAP 0
#endif
constexpr bool HAS_ALIBI = FA_ALIBI != 0;
constexpr bool HAS_BIAS = FA_BIAS != 0;
constexpr bool HAS_SOFTCAP = FA_SOFTCAP != 0;
constexpr bool CAP_SERIES = FA_SOFTCAP == 2;
constexpr float LOG2E_F = 1.4426950408889634f;

// A head_dim between the prefill kernels' tile widths (64, 128, 256) runs in the next width's
// tiles, FA_HEAD_DIM, whose chunks past the head_dim, FA_VALID_DIM, are zeros in shared memory and
// never stored (src/cuda/plan/support.rs, tile_head_dim).
#ifndef FA_VALID_DIM
#define FA_VALID_DIM FA_HEAD_DIM
#endif
static_assert(FA_VALID_DIM % 8 == 0 && FA_VALID_DIM >= 8 && FA_VALID_DIM <= FA_HEAD_DIM, "the head_dim fits its tile");
constexpr int VALID_CHUNKS = FA_VALID_DIM / 8;  // the head_dim's 16-byte chunks of a tile's row

// Whether 16-byte chunk c of a tile's row holds head_dim columns: always, unless the tile pads.
__device__ __forceinline__ bool in_head_dim(int c) {
    return FA_VALID_DIM == FA_HEAD_DIM || c < VALID_CHUNKS;
}

// Of every 4 n8 column tiles of S, how many take their exp2 on the FMA units (ex2_fma) instead
// of the special-function unit, whose one ex2 (and one tanh with a soft-cap) per score can limit
// the softmax: FlashAttention-4's relief of the MUFU.
#ifndef FA_EX2_FMA
#define FA_EX2_FMA 0
#endif
constexpr int EX2_FMA_TILES = FA_EX2_FMA;

// 2^x for x <= 0 (a logit minus its row's max) without the special-function unit: the integer
// nearest x from one FADD of 1.5·2^23 (its low mantissa bits), 2^f of the rest f in [-0.5, 0.5]
// by a degree-3 polynomial (relative error 7.5e-5, below half an f16 ulp), the integer added to
// the exponent bits. Below -126 it is 0 (as ex2.approx.ftz flushes), and a NaN stays NaN.
__device__ __forceinline__ float ex2_fma(float x) {
    const float r = __fadd_rn(x, 12582912.f);
    const float f = __fsub_rn(x, __fsub_rn(r, 12582912.f));
    float y = fmaf(fmaf(fmaf(0.05517143f, f, 0.24261081f), f, 0.69326097f), f, 0.99992812f);
    y = __int_as_float(__float_as_int(y) + (__float_as_int(r) << 23));
    return x >= -126.f ? y : (x != x ? x : 0.f);
}

// tanh on the special-function unit (sm_75+): one instruction where tanhf is a dozen, relative
// error below 2^-10.9 (PTX ISA), which the 16-bit inputs' own rounding dwarfs; FlashAttention
// caps its scores with it too.
__device__ __forceinline__ float tanh_approx(float x) {
    float y;
    asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// How a raw score s (Q·K) reaches its base-2 logit: x = tanh(s·pre) with a cap, else s·pre, and
// logit = x·fold with fold > 0, so that the row max of x, times fold, is the max of the logits and
// exp2(x·fold - max) is one FFMA. With a positive scale and no cap pre = 1 (x is s itself: no
// pass over the scores at all); with a cap fold is cap·log2 e (cap·tanh(s·scale / cap)); a
// negative or zero scale multiplies first (fold 1). ALiBi's and the bias's terms are added to x,
// so they are divided by fold once per CTA, not per score.
struct ScoreUnits {
    float pre;
    float fold;
};

__device__ __forceinline__ ScoreUnits score_units(const FwdParams& p) {
    if (HAS_SOFTCAP) return ScoreUnits{p.scale_log2 * p.softcap_inv_log2, p.softcap_log2};
    if (p.scale_log2 > 0.f) return ScoreUnits{1.f, p.scale_log2};
    return ScoreUnits{p.scale_log2, 1.f};
}

// The units of scores that arrive divided by f > 0 (FP8's raw e4m3 products, f = the Q and K
// blocks' scales): f joins fold when the scores need no pass of their own, else pre.
__device__ __forceinline__ ScoreUnits scaled_units(const ScoreUnits& u, float f) {
    return u.pre == 1.f ? ScoreUnits{1.f, u.fold * f} : ScoreUnits{u.pre * f, u.fold};
}

// A raw score in the units of `u` (the pass over the scores that plain attention with a positive
// scale skips: callers test u.pre != 1 first when there is no cap). With a cap far above the
// scores (CAP_SERIES), where |y| = |s·pre| is below 1/16 tanh's series y − y³/3 + 2y⁵/15
// (relative error below 4e-9) replaces tanh.approx, whose error near 0 times such a cap would
// swamp the scores (and y may be subnormal: flushed). shaders/common.wgsl's soft-cap is the same.
__device__ __forceinline__ float score_x(const ScoreUnits& u, float s) {
    if (!HAS_SOFTCAP) return s * u.pre;
    const float y = s * u.pre;
    if (!CAP_SERIES) return tanh_approx(y);
    const float y2 = y * y;
    return fabsf(y) < 0.0625f ? y * fmaf(y2, fmaf(y2, 2.f / 15.f, -1.f / 3.f), 1.f) : tanh_approx(y);
}

// Whether a row's base-2 max m is so large that exp2(x·fold − m) cannot be one FFMA: the fused
// product is exact, so at the max's own score exp2 would see the rounding error of m = x·fold,
// up to half an ulp of m — at least 1 from 2^24 on, enough past 2^31 to make exp2 0 or ∞ (a row
// of equal scores at scale 1e29 came out with LSE −∞). Such rows (a huge scale, huge opposite q
// and k) round the logit first and subtract m after, as the max was computed: exactly 0 there.
// The threshold matches shaders/flash_fwd_coop.wgsl's HUGE_REFERENCE.
__device__ __forceinline__ bool is_huge_reference(float m) {
    return fabsf(m) >= 16777216.f;
}

// ---- ALiBi, the score bias and sinks (the forward kernels' per-score and per-row terms) ----

// Query head h's ALiBi slope times log2 e (0 without ALiBi). The geometric slopes for n heads,
// with q the largest power of two <= n: 2^(-8(h+1)/q) for h < q, else 2^(-4(2(h-q)+1)/q)
// (Alibi::geometric_slope).
__device__ __forceinline__ float alibi_slope_log2(const FwdParams& p, int h) {
    if (!HAS_ALIBI) return 0.f;
    if (p.alibi_mode == 2) return p.alibi_slopes[h] * LOG2E_F;
    if (p.alibi_mode != 1) return 0.f;
    const int q = 1 << (31 - __clz(p.num_heads));
    const float e = h < q ? -8.f * (float)(h + 1) / (float)q : -4.f * (float)(2 * (h - q) + 1) / (float)q;
    return exp2f(e) * LOG2E_F;
}

// ALiBi's term of one row over one tile, -slope·|rel - c| for the thread's columns c (compile-time
// offsets 0..c_max from its first column col0; rel = position - col0, a float worked out once
// per row and tile). Where all of them lie on one side of the position (left: every key of a
// causal row, whose visible keys never pass it) the term is linear in c: k·c + base, with
// k = ±slope in x units (one FFMA per score, c an immediate) and base = ∓slope·rel, which is
// added once per row to its max and to the exp2's FFMA. Returns false on the diagonal, where the
// caller uses the |·| form (alibi_x).
__device__ __forceinline__ bool alibi_linear(float slope_x, float slope_log2, float rel, float c_max, bool left_only,
                                             float& k, float& base) {
    if (left_only || rel >= c_max) {
        k = slope_x;
        base = -slope_log2 * rel;
        return true;
    }
    k = -slope_x;
    base = slope_log2 * rel;
    return rel <= 0.f;
}

// ALiBi's term in x units for a score on the diagonal: two FP32 ops (FADD, FFMA with |·|).
__device__ __forceinline__ float alibi_x(float x, float slope_x, float rel, float c) {
    return fmaf(-slope_x, fabsf(rel - c), x);
}

// The bias's row: element (b, h, row, 0) as a byte pointer (offset included; rows past the
// sequence's queries read nothing: see bias_limit).
__device__ __forceinline__ const unsigned char* bias_row(const FwdParams& p, int b, int h, int row) {
    const i64 e = b * p.bias_batch_stride + h * p.bias_head_stride + (i64)row * p.bias_row_stride;
    return static_cast<const unsigned char*>(p.bias) + e * (p.bias_dtype == 0 ? 4 : 2);
}

// How many keys of a bias row are left from column col0 (0 for a row past the sequence's
// queries): offsets c with c < limit are read, the rest count as 0 (the mask hides those keys).
__device__ __forceinline__ int bias_limit(const SeqRows& s, int row, int col0) {
    return row < s.seq_q ? s.seq_kv - col0 : 0;
}

// Two adjacent 16-bit bias values (offsets c, c + 1 from `at`, c even) as one word, c's in the
// low half: one 32-bit load where the row's address allows (`pairs`: it is 4-byte aligned, which
// an even column keeps), two 16-bit loads otherwise; 0 for offsets at or past `limit`.
__device__ __forceinline__ u32 bias_pair16(const unsigned char* at, int c, int limit, bool pairs) {
    const unsigned short* e = reinterpret_cast<const unsigned short*>(at) + c;
    if (c + 1 < limit) {
        if (pairs) return __ldg(reinterpret_cast<const unsigned int*>(e));
        return (u32)__ldg(e) | ((u32)__ldg(e + 1) << 16);
    }
    return c < limit ? (u32)__ldg(e) : 0u;
}

// The two f32 values of a word of bias_pair16: f16 (bias_dtype 1) or bf16 (2).
__device__ __forceinline__ float2 bias_unpack16(u32 v, int dtype) {
    return dtype == 2 ? unpack2<true>(v) : unpack2<false>(v);
}

// Two adjacent f32 bias values (offsets c, c + 1, c even): one 8-byte load where the row is
// 8-byte aligned (`pairs`), else two; 0 past `limit`.
__device__ __forceinline__ float2 bias_pair32(const unsigned char* at, int c, int limit, bool pairs) {
    const float* e = reinterpret_cast<const float*>(at) + c;
    if (c + 1 < limit) {
        if (pairs) return __ldg(reinterpret_cast<const float2*>(e));
        return make_float2(__ldg(e), __ldg(e + 1));
    }
    return make_float2(c < limit ? __ldg(e) : 0.f, 0.f);
}

// Whether a bias row's loads may go two columns at a time (an aligned address for the pair).
__device__ __forceinline__ bool bias_pairs_ok(const FwdParams& p, const unsigned char* row) {
    return ((size_t)row & (p.bias_dtype == 0 ? 7 : 3)) == 0;
}

// Query head h's sink times log2 e (0 without sinks). The kernels read it where a work tile
// starts, so that the load's latency hides under the tile's products instead of stalling the
// epilogue (a persistent CTA's next tile waits on that epilogue).
__device__ __forceinline__ float sink_log2(const FwdParams& p, int h) {
    return p.sinks == nullptr ? 0.f : __ldg(p.sinks + h) * LOG2E_F;
}

// A row's final softmax state with its head's sink joining its sum: from the row's max m (base 2;
// -inf for a row that saw no key) and sum, m' = max(m, sink), sum' = sum·f + 2^(sink - m'), and
// what its output (accumulated under m) is multiplied by, f = 2^(m - m'). Without sinks, (m, sum, 1).
struct RowTotal {
    float m, sum, o_factor;
};

// `sink` is sink_log2 of the row's head.
__device__ __forceinline__ RowTotal join_sink(const FwdParams& p, float sink, float m, float sum) {
    if (p.sinks == nullptr) return RowTotal{m, sum, 1.f};
    const float m_new = fmaxf(m, sink);
    const float f = m == NEG_INF ? 0.f : exp2f(m - m_new);
    return RowTotal{m_new, sum * f + exp2f(sink - m_new), f};
}

#include "dropout.cuh"
