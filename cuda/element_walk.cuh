// element_walk.cuh — the walk over a [batch, seq, num_heads, head_dim] tensor shared by the
// element-wise kernels (merge.cu, grad_sum.cu): the CUDA twin of shaders/granule_walk.wgsl.
//
// A thread owns one element at a time, the elements numbered with head_dim fastest (the order of
// the usual sequence-major layouts, so a warp's loads and stores are contiguous there); a CTA of
// ELEMENT_WALK_THREADS threads (8 warps, enough to hide the loads' latency at full occupancy)
// owns that many consecutive elements and strides on by the grid's width (the host caps the
// grid, so a huge tensor still launches). One element per thread, not a vector: any strides and
// head_dim the layouts allow stay legal, and these kernels move their tensors once, small beside
// the attention around them.
#pragma once
#include "mma_ptx.cuh"

constexpr int ELEMENT_WALK_THREADS = 256;

// Where element (b, s, h, d) lies in a tensor of these element strides (batch, seq, head).
struct ElementAt {
    i64 b, s, h, d;
    __device__ __forceinline__ i64 in(const i64 (&strides)[3]) const {
        return b * strides[0] + s * strides[1] + h * strides[2] + d;
    }
};

// Calls visit(ElementAt) for this thread's elements of the first `elements` of
// [batch, seq, num_heads, head_dim].
template <class Visit>
__device__ __forceinline__ void walk_elements(i64 elements, int seq, int num_heads, int head_dim, Visit visit) {
    // blockDim, not the constant: a launch of another width still visits every element once.
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < elements; i += stride) {
        const i64 row = i / head_dim;
        const i64 seq_row = row / num_heads;
        visit(ElementAt{seq_row / seq, seq_row % seq, row % num_heads, i % head_dim});
    }
}

// A 16-bit element (f16, or bf16 with BF16) to f32, and f32 rounded to one.
template <bool BF16>
__device__ __forceinline__ float load_element(const u16* p) {
    return unpack2<BF16>((u32)*p).x;
}

template <bool BF16>
__device__ __forceinline__ u16 round_element(float x) {
    return (u16)(pack2<BF16>(x, 0.f) & 0xffffu);
}
