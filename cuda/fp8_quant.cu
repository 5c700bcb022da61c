// FP8 (e4m3) quantization for the FP8 forward (flash_fwd_wgmma.cu with FA_FP8): bf16/f16 Q, K or
// V in (any strides), e4m3 bytes and one f32 scale per block of rows out, in the layouts the FP8
// kernel's tensor maps read (src/cuda/plan/fp8.rs, Fp8Layout, which has the host's mirror of
// every step below, bit for bit):
//   Q8 [batch, heads, seq_q, dim_pad] and K8 [batch, kv_heads, seq_kv, dim_pad]: rows of dim_pad
//   (128 or 256) bytes, the columns past head_dim zero; optionally rotated by a Hadamard
//   transform first (below).
//   Vt8 [batch, kv_heads, dim_pad, kv_pad]: V transposed, one row per head_dim column (the P·V
//   wgmma takes 8-bit operands only K-major, so V's keys must be contiguous), the keys of every
//   32 permuted (fp8_slot) so that the softmax's probabilities, in accumulator registers, are
//   already the wgmma's A fragment; keys past seq_kv zero up to kv_pad (a multiple of 128).
// A block's scale is amax / 448 (448: e4m3's largest finite value; 1 for an all-zero block), and
// its values are rounded from x · (1 / scale): value ≈ scale · e4m3.
//
// Incoherent processing (FlashAttention-3): Q's and K's rows multiplied by a random ±1 diagonal
// and the normalized Walsh–Hadamard matrix, H = W·D / √dim_pad, orthogonal, so that
// (QH)(KH)ᵀ = QKᵀ while an outlier coordinate is spread over the whole row before it sets the
// block's scale. The signs come from a hash of (seed, column), the same for Q and K.
//
// Who owns what. A CTA (256 threads, 8 warps) owns one block of rows of one (batch, head): 64 query
// rows (one consumer warpgroup's rows in the FP8 kernel, so each has one scale) or 128 keys (a
// K/V tile of the kernel, or half of a 256-key one). A warp takes every 8th row; lane l holds columns [l·E, l·E + E) of it, E = dim_pad /
// 32 (4 or 8), so that the transform's first log2(E) butterfly stages stay in the lane and the
// other five are shuffles. Two passes over the block: its amax (reduced over the CTA), then the
// conversion, the transform recomputed rather than held (the block's second read hits L2). V's
// bytes are transposed through shared memory (dim_pad x 128 bytes) and written as whole rows; a
// lane's bytes land at their column XOR 4·lane, so that the 32 lanes storing one key's bytes
// (one column of 32 different rows) hit 32 different banks instead of one.
//
// mode: 1 computes each block's scale, writes it and quantizes with it; 2 only writes the scales
// (a per-tensor scale is their max, fp8_scales_max, then a mode-0 pass); 0 quantizes with the
// scales given.
#include "mma_ptx.cuh"
#include "sm90_ptx.cuh"

struct QuantParams {
    const u16* src;  // element (b, s, h, 0) at src + b·batch_stride + s·seq_stride + h·head_stride
    i64 batch_stride, seq_stride, head_stride;
    unsigned char* dst;
    float* scales;  // [batch, heads, blocks]
    int seq;
    int heads;
    int head_dim;
    int dim_pad;     // 128 or 256
    int block_rows;  // 64 (Q) or 128 (K, V)
    int row_pad;     // V: keys per transposed row (kv_pad); others: unused
    int transposed;  // 1: V's layout
    int mode;
    int hadamard;
    unsigned sign_seed;
    int bf16;
};
static_assert(sizeof(QuantParams) == 96, "QuantParams must match the Rust mirror (src/cuda/plan/fp8.rs)");

constexpr int THREADS = 256;
constexpr int WARPS = THREADS / 32;
constexpr float E4M3_MAX = 448.f;

// Column c's sign of the transform's diagonal: a 32-bit integer hash of (seed, c).
__device__ __forceinline__ float hadamard_sign(unsigned seed, int c) {
    unsigned h = (unsigned)c * 0x9E3779B1u ^ seed;
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    h *= 0xC2B2AE35u;
    h ^= h >> 16;
    return (h & 1u) ? -1.f : 1.f;
}

__device__ __forceinline__ float load_16(const QuantParams& p, const u16* at) {
    const u32 bits = __ldg(at);
    return (p.bf16 ? unpack2<true>(bits) : unpack2<false>(bits)).x;
}

// Row `row` of the block (a row past the sequence is zeros), transformed when asked: this lane's
// E values in x.
template <int E>
__device__ __forceinline__ void load_row(const QuantParams& p, int b, int h, int row, int lane, float (&x)[E]) {
    const u16* base = p.src + b * p.batch_stride + (i64)row * p.seq_stride + h * p.head_stride;
    const u16* at = base + lane * E;
    // A lane's E values in one 8- or 16-byte load where they are all inside the row and aligned
    // (contiguous rows of a head_dim that is a multiple of 8, as usual), else one at a time.
    if (row < p.seq && (lane + 1) * E <= p.head_dim && ((size_t)at & (2 * E - 1)) == 0) {
        u32 w[E / 2];
        if constexpr (E == 8) {
            const uint4 v = __ldg(reinterpret_cast<const uint4*>(at));
            w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
        } else {
            const uint2 v = __ldg(reinterpret_cast<const uint2*>(at));
            w[0] = v.x, w[1] = v.y;
        }
#pragma unroll
        for (int i = 0; i < E / 2; ++i) {
            const float2 f = p.bf16 ? unpack2<true>(w[i]) : unpack2<false>(w[i]);
            x[2 * i] = f.x;
            x[2 * i + 1] = f.y;
        }
    } else {
#pragma unroll
        for (int i = 0; i < E; ++i) {
            const int c = lane * E + i;
            x[i] = row < p.seq && c < p.head_dim ? load_16(p, base + c) : 0.f;
        }
    }
    if (!p.hadamard) return;
#pragma unroll
    for (int i = 0; i < E; ++i) x[i] *= hadamard_sign(p.sign_seed, lane * E + i);
    // Butterflies on index bits from the lowest: pairs (j, j + s) become (a + b, a - b).
#pragma unroll
    for (int s = 1; s < E; s <<= 1)
#pragma unroll
        for (int i = 0; i < E; ++i)
            if ((i & s) == 0) {
                const float a = x[i], c = x[i + s];
                x[i] = __fadd_rn(a, c);
                x[i + s] = __fsub_rn(a, c);
            }
#pragma unroll
    for (int m = 1; m < 32; m <<= 1)
#pragma unroll
        for (int i = 0; i < E; ++i) {
            const float other = __shfl_xor_sync(0xffffffffu, x[i], m);
            x[i] = (lane & m) ? __fsub_rn(other, x[i]) : __fadd_rn(x[i], other);
        }
    const float norm = E == 4 ? 0.088388347648318440550f : 0.0625f;  // 1 / sqrt(dim_pad)
#pragma unroll
    for (int i = 0; i < E; ++i) x[i] = __fmul_rn(x[i], norm);
}

// The column of key k (0..31) of each 32 in V's transposed rows. The P·V wgmma's 8-bit A
// fragment gives lane 4g + q, per k-step of 32 keys, A columns 4q..4q+3 (registers 0 and 1, rows
// g and g + 8) and 16 + 4q..16 + 4q + 3 (registers 2 and 3); the S accumulator gives that lane
// keys 2q, 2q + 1 (n8 slab 0), 8 + 2q, 9 + 2q (slab 1) and the same 16 keys on (slabs 2, 3).
// Packed in that order (pack_p in flash_fwd_wgmma.cu), A column 16·half + 4q + i holds key
// 16·half + 2q + (i & 1) + 8·(i >> 1): so key 16·half + r is stored at column
// 16·half + 4·((r % 8) / 2) + 2·(r / 8) + r % 2, and P·V sums the right products.
__device__ __forceinline__ int fp8_slot(int k) {
    const int base = k & ~15, rr = k & 15;
    return base + 4 * ((rr & 7) >> 1) + 2 * (rr >> 3) + (rr & 1);
}

template <int E>
__device__ __forceinline__ void quantize_block(const QuantParams& p, float* warp_max, unsigned char* vt) {
    const int blk = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row0 = blk * p.block_rows;
    const int blocks = (p.seq + p.block_rows - 1) / p.block_rows;
    float* scale_at = p.scales + ((i64)b * p.heads + h) * blocks + blk;
    float x[E];

    float scale;
    if (p.mode == 0) {
        scale = *scale_at;
    } else {
        float amax = 0.f;
        for (int r = warp; r < p.block_rows; r += WARPS) {
            load_row<E>(p, b, h, row0 + r, lane, x);
#pragma unroll
            for (int i = 0; i < E; ++i) amax = fmaxf(amax, fabsf(x[i]));
        }
#pragma unroll
        for (int m = 16; m > 0; m >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
        if (lane == 0) warp_max[warp] = amax;
        __syncthreads();
        amax = 0.f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) amax = fmaxf(amax, warp_max[w]);
        // Mode 2 keeps an all-zero block's 0, so that it cannot raise the tensor's max.
        scale = __fdiv_rn(amax, E4M3_MAX);
        if (p.mode == 2) {
            if (threadIdx.x == 0) *scale_at = scale;
            return;
        }
        if (scale == 0.f) scale = 1.f;
        if (threadIdx.x == 0) *scale_at = scale;
    }
    const float inv = __fdiv_rn(1.f, scale);

    for (int r = warp; r < p.block_rows; r += WARPS) {
        const int row = row0 + r;
        load_row<E>(p, b, h, row, lane, x);
        u32 w[E / 4];
#pragma unroll
        for (int i = 0; i < E / 4; ++i)
            w[i] = pack_e4m3x4(__fmul_rn(x[4 * i], inv), __fmul_rn(x[4 * i + 1], inv), __fmul_rn(x[4 * i + 2], inv),
                               __fmul_rn(x[4 * i + 3], inv));
        if (p.transposed) {
            const int slot = (r & ~31) + fp8_slot(r & 31);
#pragma unroll
            for (int i = 0; i < E; ++i) vt[(lane * E + i) * 128 + (slot ^ (4 * lane))] = (unsigned char)(w[i / 4] >> (8 * (i % 4)));
        } else if (row < p.seq) {
            unsigned char* out = p.dst + (((i64)b * p.heads + h) * p.seq + row) * p.dim_pad + lane * E;
            if constexpr (E == 8)
                *reinterpret_cast<uint2*>(out) = make_uint2(w[0], w[E / 4 - 1]);
            else
                *reinterpret_cast<u32*>(out) = w[0];
        }
    }
    if (!p.transposed) return;
    __syncthreads();
    // dim_pad rows of 128 bytes, 16 at a time, each 4-byte word from where the swizzle put it.
    unsigned char* out = p.dst + ((i64)b * p.heads + h) * p.dim_pad * (i64)p.row_pad + row0;
    for (int i = threadIdx.x; i < p.dim_pad * 8; i += THREADS) {
        const int d = i / 8, c = i % 8;
        const u32* row = reinterpret_cast<const u32*>(&vt[d * 128]);
        const int swz = d / E;  // the writing lane
        *reinterpret_cast<uint4*>(out + (i64)d * p.row_pad + 16 * c) =
            make_uint4(row[(4 * c) ^ swz], row[(4 * c + 1) ^ swz], row[(4 * c + 2) ^ swz], row[(4 * c + 3) ^ swz]);
    }
}

// grid (blocks, heads, batch), THREADS threads; one entry point per row width (dim_pad 128 or
// 256), so that each keeps its registers (one kernel holding both spilled).
#define QUANTIZE_ENTRY(NAME, E)                                                                      \
    extern "C" __global__ void __launch_bounds__(THREADS) NAME(const __grid_constant__ QuantParams p) { \
        __shared__ float warp_max[WARPS];                                                             \
        __shared__ __align__(16) unsigned char vt[32 * E * 128]; /* V's block transposed */           \
        quantize_block<E>(p, warp_max, vt);                                                           \
    }
QUANTIZE_ENTRY(fp8_quantize_128, 4)
QUANTIZE_ENTRY(fp8_quantize_256, 8)

// One CTA: every one of the n scales becomes their max (a per-tensor scale from per-block ones;
// 1 for an all-zero tensor).
extern "C" __global__ void __launch_bounds__(1024) fp8_scales_max(float* scales, int n) {
    __shared__ float warp_max[32];
    float m = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, scales[i]);
#pragma unroll
    for (int k = 16; k > 0; k >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, k));
    if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
    __syncthreads();
    m = 0.f;
    for (int w = 0; w < (int)(blockDim.x + 31) / 32; ++w) m = fmaxf(m, warp_max[w]);
    if (m == 0.f) m = 1.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) scales[i] = m;
}
