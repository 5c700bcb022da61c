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
// Who owns what: one element of O per thread at a time, walked as element_walk.cuh says (no
// shared memory, no barrier: the work is bound by memory). The thread of element 0 of a row also
// writes the row's LSE.
//
// Two entry points, merge_f16 and merge_bf16: O's element type; the LSEs are f32.
#include "element_walk.cuh"

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

constexpr float MERGE_LOG2E = 1.4426950408889634f;

template <bool BF16>
__device__ __forceinline__ void merge(const MergeParams& p) {
    walk_elements(p.elements, p.seq_q, p.num_heads, p.head_dim, [&](const ElementAt& e) {
        const i64 r = (e.b * p.num_heads + e.h) * p.seq_q + e.s;
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
            merged = (e_a * load_element<BF16>(p.o_a + e.in(p.strides[0])) +
                      e_b * load_element<BF16>(p.o_b + e.in(p.strides[1]))) /
                     sum;
            lse = m + logf(sum);
        } else if (seen_a) {
            merged = load_element<BF16>(p.o_a + e.in(p.strides[0]));
            lse = la;
        } else if (seen_b) {
            merged = load_element<BF16>(p.o_b + e.in(p.strides[1]));
            lse = lb;
        }
        p.o[e.in(p.strides[2])] = round_element<BF16>(merged);
        if (e.d == 0 && p.lse != nullptr) p.lse[r] = lse;
    });
}

extern "C" __global__ void __launch_bounds__(ELEMENT_WALK_THREADS) merge_f16(const __grid_constant__ MergeParams p) {
    merge<false>(p);
}

extern "C" __global__ void __launch_bounds__(ELEMENT_WALK_THREADS) merge_bf16(const __grid_constant__ MergeParams p) {
    merge<true>(p);
}
