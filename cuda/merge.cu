// merge.cu — merges two partial attention results of the same query rows over disjoint key sets
// by their LSEs: the CUDA engine's twin of shaders/merge.wgsl (cascade / shared-prefix attention,
// ring attention's blocks, results from different devices; the float64 definition is
// reference::merge_attention_states):
//   lse = m + log(exp(lse_a - m) + exp(lse_b - m)),  m = max(lse_a, lse_b)
//   o   = (e_a·o_a + e_b·o_b) / (e_a + e_b),         e_x = exp(lse_x - m)
// A side whose LSE is -inf (it saw no key) has weight 0 and its O is not read; both -inf give
// o = 0 and lse = -inf, as the forward writes a row that sees no key. A NaN LSE beside a seen side
// makes the row NaN; beside an empty side it passes through with its own O (the float64
// reference's max drops it instead: a NaN LSE is garbage in, never silently finite out).
//
// Who owns what. The work is bound by memory, with nothing shared between threads: no shared
// memory, no barrier. A thread owns one element of O at a time, the elements numbered through
// [batch, seq_q, num_heads, head_dim] with head_dim fastest (the order of the usual O layout, so a
// warp's loads and stores are contiguous there); a CTA of 256 threads (8 warps, enough to hide
// the loads' latency at full occupancy) owns 256 consecutive elements and strides on by the
// grid's width (the host caps the grid, so a huge O still launches). The thread of element 0 of
// a row also writes the row's LSE. One element per thread, not a vector: any strides and
// head_dim the layouts allow stay legal, and the merge reads and writes O once, small beside the
// attention that made it.
//
// Two entry points, merge_f16 and merge_bf16: O's element type; the LSEs are f32.
#include "mma_ptx.cuh"

struct MergeParams {
    const u16* o_a;
    const u16* o_b;
    u16* o;
    const float* lse_a;
    const float* lse_b;
    float* lse;  // null: not written
    // Element strides of o_a, o_b and o: batch, seq (row), head.
    i64 strides[3][3];
    i64 elements;  // batch · seq_q · num_heads · head_dim
    int num_heads, seq_q, head_dim, pad;
};
static_assert(sizeof(MergeParams) == 144, "MergeParams must match the Rust mirror (src/cuda/merge.rs)");

constexpr int MERGE_THREADS = 256;
constexpr float MERGE_LOG2E = 1.4426950408889634f;

template <bool BF16>
__device__ __forceinline__ float load_element(const u16* p) {
    return unpack2<BF16>((u32)*p).x;
}

template <bool BF16>
__device__ __forceinline__ u16 round_element(float x) {
    return (u16)(pack2<BF16>(x, 0.f) & 0xffffu);
}

template <bool BF16>
__device__ __forceinline__ void merge(const MergeParams& p) {
    const i64 stride = (i64)gridDim.x * MERGE_THREADS;
    for (i64 i = (i64)blockIdx.x * MERGE_THREADS + threadIdx.x; i < p.elements; i += stride) {
        const int d = (int)(i % p.head_dim);
        const i64 rest = i / p.head_dim;
        const int h = (int)(rest % p.num_heads);
        const i64 rest2 = rest / p.num_heads;
        const int s = (int)(rest2 % p.seq_q);
        const i64 b = rest2 / p.seq_q;
        const i64 r = (b * p.num_heads + h) * p.seq_q + s;
        auto at = [&](int t) { return b * p.strides[t][0] + s * p.strides[t][1] + h * p.strides[t][2] + d; };
        const float la = p.lse_a[r];
        const float lb = p.lse_b[r];
        const bool seen_a = la != NEG_INF;
        const bool seen_b = lb != NEG_INF;
        float merged = 0.f;
        float lse = NEG_INF;
        if (seen_a && seen_b) {
            // fmaxf would drop a NaN; the comparison keeps it, and with it the NaN row.
            const float m = la > lb ? la : lb;
            const float e_a = ex2((la - m) * MERGE_LOG2E);
            const float e_b = ex2((lb - m) * MERGE_LOG2E);
            const float sum = e_a + e_b;
            merged = (e_a * load_element<BF16>(p.o_a + at(0)) + e_b * load_element<BF16>(p.o_b + at(1))) / sum;
            lse = m + logf(sum);
        } else if (seen_a) {
            merged = load_element<BF16>(p.o_a + at(0));
            lse = la;
        } else if (seen_b) {
            merged = load_element<BF16>(p.o_b + at(1));
            lse = lb;
        }
        p.o[at(2)] = round_element<BF16>(merged);
        if (d == 0 && p.lse != nullptr) p.lse[r] = lse;
    }
}

extern "C" __global__ void __launch_bounds__(MERGE_THREADS) merge_f16(const __grid_constant__ MergeParams p) {
    merge<false>(p);
}

extern "C" __global__ void __launch_bounds__(MERGE_THREADS) merge_bf16(const __grid_constant__ MergeParams p) {
    merge<true>(p);
}
