// Inline-PTX helpers for the mma.sync (sm_80+) attention kernels: shared-memory addresses,
// cp.async (and swizzled tiles filled by it), ldmatrix, the m16n8k16 tensor-core MMA, f32 -> 16-bit packing and exp2.
//
// No CUDA header is included anywhere: NVRTC sees only these files (self-contained, so a
// machine with the driver and libnvrtc but no toolkit headers compiles them), and bf16/f16 are
// handled as raw 16-bit patterns that only the tensor cores and the cvt instructions interpret.
#pragma once

typedef unsigned int u32;
typedef unsigned short u16;
typedef long long i64;

// No <math.h> here, so no INFINITY macro.
#define NEG_INF (-__int_as_float(0x7f800000))

// 32-bit shared-state-space address of a generic pointer into shared memory, the form that
// cp.async, ldmatrix and ld.shared take.
__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// --- cp.async: global -> shared without passing through registers --------------------------
// `valid == false` reads nothing and writes zeros (src-size 0): rows past the end of a sequence
// become zero K/V rows, so P·V never multiplies a masked (zero) probability by garbage that
// could be NaN.
__device__ __forceinline__ void cp_async_16(u32 dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
// For tensors whose offsets/strides are multiples of 4 elements but not 8 (8-byte aligned rows).
__device__ __forceinline__ void cp_async_8(u32 dst, const void* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 8 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// One 16-byte chunk: in one piece, or (rows only 8-byte aligned) two.
template <int VEC_BYTES>
__device__ __forceinline__ void cp_async_chunk(u32 dst, const u16* src, bool valid) {
    static_assert(VEC_BYTES == 16 || VEC_BYTES == 8, "global rows are moved in 16- or 8-byte pieces");
    if (VEC_BYTES == 16) {
        cp_async_16(dst, src, valid);
    } else {
        cp_async_8(dst, src, valid);
        cp_async_8(dst + 8, src + 4, valid);
    }
}

// --- Swizzled shared-memory tiles of 16-bit rows, filled by cp.async ----------------------------
// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of ROW_BYTES-byte rows: chunk c of
// row r is stored at chunk c ^ (r & 7), so that ldmatrix's 8 rows of one logical chunk land in 8
// different bank groups. ROW_BYTES must be a multiple of 128 (8 chunks), so the XOR stays inside
// the row.
template <int ROW_BYTES>
__device__ __forceinline__ u32 swz(int row, int chunk) {
    static_assert(ROW_BYTES % 128 == 0, "the swizzle needs a multiple of 8 chunks per row");
    return (u32)(row * ROW_BYTES + ((chunk ^ (row & 7)) << 4));
}

// Copies ROWS rows of ROW_BYTES bytes, row r at `g + r * row_stride` (in elements), into a
// swizzled tile; rows at or past `rows_valid`, and chunks at or past VALID_CHUNKS (a head_dim
// padded to the tile's width), are zero-filled (cp.async with src-size 0). All THREADS threads
// of the block take part, consecutive threads taking consecutive chunks of a row so that a warp
// reads whole rows (coalesced); VEC_BYTES 16 moves a chunk in one cp.async, 8 (rows only 8-byte
// aligned) in two.
template <int ROWS, int ROW_BYTES, int THREADS, int VEC_BYTES, int VALID_CHUNKS = ROW_BYTES / 16>
__device__ __forceinline__ void cp_async_rows(u32 tile, const u16* g, i64 row_stride, int rows_valid, int tid) {
    constexpr int CHUNKS = ROW_BYTES / 16;
    static_assert(VALID_CHUNKS >= 1 && VALID_CHUNKS <= CHUNKS, "the valid part of a row is within it");
    constexpr int TOTAL = ROWS * CHUNKS;
#pragma unroll
    for (int j = 0; j < (TOTAL + THREADS - 1) / THREADS; ++j) {
        const int i = tid + j * THREADS;
        if (TOTAL % THREADS != 0 && i >= TOTAL) break;
        const int row = i / CHUNKS;
        const int chunk = i % CHUNKS;
        const bool valid = row < rows_valid && (VALID_CHUNKS == CHUNKS || chunk < VALID_CHUNKS);
        // An invalid piece reads nothing, but the address must still be a legal one: row 0, and
        // chunk 0 for a chunk past the head_dim.
        const u16* src = g + (valid ? (i64)row * row_stride : 0) + (VALID_CHUNKS == CHUNKS || valid ? chunk * 8 : 0);
        cp_async_chunk<VEC_BYTES>(tile + swz<ROW_BYTES>(row, chunk), src, valid);
    }
}

// The same for the layout of Hopper's tensor-core operands (flash_bwd_wgmma.cu): rows of
// HEAD_DIM 16-bit values cut into 64-column panels, one after another, each ROWS rows of 128
// bytes with chunk c of row r at chunk c ^ (r & 7) (the 128-byte swizzle of wgmma's descriptors
// and of the copy engine); chunks at or past VALID_CHUNKS zero-filled, as above. UNROLL = 1 keeps
// a loader thread's registers few (a producer warp with little of the register file) at the
// price of the address arithmetic in the loop.
template <int ROWS, int HEAD_DIM, int THREADS, int VEC_BYTES, int UNROLL = 64, int VALID_CHUNKS = HEAD_DIM / 8>
__device__ __forceinline__ void cp_async_panels(u32 tile, const u16* g, i64 row_stride, int rows_valid, int tid) {
    constexpr int CHUNKS = HEAD_DIM / 8;
    constexpr int TOTAL = ROWS * CHUNKS;
    static_assert(HEAD_DIM % 64 == 0, "whole 64-column panels");
    static_assert(VALID_CHUNKS >= 1 && VALID_CHUNKS <= CHUNKS, "the valid part of a row is within it");
#pragma unroll UNROLL
    for (int j = 0; j < (TOTAL + THREADS - 1) / THREADS; ++j) {
        const int i = tid + j * THREADS;
        if (TOTAL % THREADS != 0 && i >= TOTAL) break;
        const int row = i / CHUNKS;
        const int chunk = i % CHUNKS;
        const bool valid = row < rows_valid && (VALID_CHUNKS == CHUNKS || chunk < VALID_CHUNKS);
        const u16* src = g + (valid ? (i64)row * row_stride : 0) + (VALID_CHUNKS == CHUNKS || valid ? chunk * 8 : 0);
        const u32 dst = tile + (u32)((chunk / 8) * ROWS * 128) + swz<128>(row, chunk % 8);
        cp_async_chunk<VEC_BYTES>(dst, src, valid);
    }
}

// --- ldmatrix: four 8x8 b16 matrices, one row address per lane (lanes 8i..8i+7: matrix i) ---
__device__ __forceinline__ void ldmatrix_x4(u32 r[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(u32 r[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// --- D = A·B + D, A 16x16 row-major, B 16x8 column-major, f32 accumulators -----------------
// Fragment ownership (lane = 4·g + t): c[0], c[1] are row g, columns 2t, 2t+1; c[2], c[3] are
// row g+8. A: a[0] = row g, k 2t..2t+1; a[1] = row g+8; a[2] = row g, k 8+2t..; a[3] = row g+8,
// k 8+2t... B: b0 = k 2t..2t+1 of column g, b1 = k 8+2t.. of column g.
template <bool BF16>
__device__ __forceinline__ void mma_16816(float c[4], const u32 a[4], u32 b0, u32 b1) {
    if (BF16) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

// Two f32 -> one register of two 16-bit values, `lo` in the low half (the lower column index,
// as the MMA fragments and memory order expect). Round to nearest even.
template <bool BF16>
__device__ __forceinline__ u32 pack2(float lo, float hi) {
    u32 r;
    if (BF16) {
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    } else {
        asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    }
    return r;
}

// pack2's inverse: the two 16-bit values of one word (the lower column in the low half) as f32.
template <bool BF16>
__device__ __forceinline__ float2 unpack2(u32 v) {
    if (BF16) return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
    float lo, hi;
    asm("{ .reg .b16 l, h; mov.b32 {l, h}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, h; }" : "=f"(lo), "=f"(hi) : "r"(v));
    return make_float2(lo, hi);
}

// 2^x on the special-function unit; ex2(-inf) = +0, which the masked scores rely on.
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ void ld_shared_v4(u32 addr, u32 v[4]) {
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
                 : "r"(addr)
                 : "memory");
}
__device__ __forceinline__ void st_shared_u32(u32 addr, u32 v) {
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void st_shared_v4(u32 addr, const u32 v[4]) {
    asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3])
                 : "memory");
}
__device__ __forceinline__ void st_shared_v4(u32 addr, float a, float b, float c, float d) {
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}
__device__ __forceinline__ void st_global_v4(void* p, const u32 v[4]) {
    asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};\n" ::"l"(p), "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3]));
}
__device__ __forceinline__ void st_global_v2(void* p, u32 a, u32 b) {
    asm volatile("st.global.v2.u32 [%0], {%1,%2};\n" ::"l"(p), "r"(a), "r"(b));
}
