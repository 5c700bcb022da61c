// grad_sum.cu — ring attention's gradient sums on the CUDA engine, the twin of
// shaders/grad_sum.wgsl: each block's dQ, dK or dV (16-bit, the problem's dtype) added into f32
// sums of the whole gradient (`grad_sum_add_*`), and, once every block is in, the sums rounded
// into the caller's gradient at its layout (`grad_sum_store_*`). Summing in f32 keeps a
// gradient's error that of one rounding however many blocks the ring adds into it.
//
// Who owns what: one element per thread at a time, walked as element_walk.cuh says (no shared
// memory, no barrier: the work is bound by memory). Each element is read and written by one
// thread, so the sums need no atomics; blocks are added one launch after another on one stream.
//
// Four entry points: add or store, for f16 or bf16 gradients.
#include "element_walk.cuh"

struct GradSumParams {
    u16* parts;   // a block's gradient (add: read) or the caller's gradient (store: written)
    float* sums;  // the f32 sums (add: read and written; store: read)
    // Element strides of parts and sums: batch, seq (row), head.
    i64 strides[2][3];
    i64 elements;  // batch · seq · num_heads · head_dim
    int seq, num_heads, head_dim, pad;
};
static_assert(sizeof(GradSumParams) == 88, "GradSumParams must match the Rust mirror (src/cuda/grad_sum.rs)");

template <bool BF16>
__device__ __forceinline__ void add(const GradSumParams& p) {
    walk_elements(p.elements, p.seq, p.num_heads, p.head_dim, [&](const ElementAt& e) {
        p.sums[e.in(p.strides[1])] += load_element<BF16>(p.parts + e.in(p.strides[0]));
    });
}

template <bool BF16>
__device__ __forceinline__ void store(const GradSumParams& p) {
    walk_elements(p.elements, p.seq, p.num_heads, p.head_dim, [&](const ElementAt& e) {
        p.parts[e.in(p.strides[0])] = round_element<BF16>(p.sums[e.in(p.strides[1])]);
    });
}

extern "C" __global__ void __launch_bounds__(ELEMENT_WALK_THREADS) grad_sum_add_f16(const __grid_constant__ GradSumParams p) {
    add<false>(p);
}

extern "C" __global__ void __launch_bounds__(ELEMENT_WALK_THREADS) grad_sum_add_bf16(const __grid_constant__ GradSumParams p) {
    add<true>(p);
}

extern "C" __global__ void __launch_bounds__(ELEMENT_WALK_THREADS) grad_sum_store_f16(const __grid_constant__ GradSumParams p) {
    store<false>(p);
}

extern "C" __global__ void __launch_bounds__(ELEMENT_WALK_THREADS) grad_sum_store_bf16(const __grid_constant__ GradSumParams p) {
    store<true>(p);
}
