// Inline-PTX helpers for Hopper-only (sm_90a) kernels: wgmma shared-memory descriptors and
// synchronization, mbarriers, bulk tensor copies (TMA), register reallocation and named barriers.
// The wgmma instructions themselves are generated (wgmma_gen.cuh). Needs mma_ptx.cuh first (u32,
// u64 types and smem_addr).
#pragma once

typedef unsigned long long u64;

// --- wgmma shared-memory matrix descriptors -------------------------------------------------
// A 64-bit descriptor tells the tensor cores where an operand tile lies in shared memory and how
// it is laid out (PTX ISA, "Matrix Descriptor Format"):
//   bits  0-13  start address >> 4
//   bits 16-29  leading-dimension byte offset >> 4
//   bits 32-45  stride-dimension byte offset >> 4
//   bits 49-51  base offset (0: every swizzle atom starts 1024-byte aligned)
//   bits 62-63  swizzle mode, 1 = 128-byte
// Our tiles are what the copy engine writes with 128-byte swizzling: "panels" of 64 16-bit
// columns, each row of a panel 128 bytes, row r's 16-byte chunk c stored at chunk c ^ (r % 8).
// * K-major (Q and K for S = Q·Kᵀ, k = head_dim): 8-row groups are 1024 bytes apart (SBO); one
//   k16 step spans 32 bytes of a row, inside one panel, so the leading offset is unused (1 by
//   convention). Step k within a panel by adding 32·k bytes to the start address: the hardware
//   applies the XOR on address bits, which stay aligned because panels are 1024-byte aligned.
// * N-major (V for O = P·V, k = keys, n = head_dim): a k16 step is 16 rows (2 groups of 8,
//   SBO = 1024 apart); along n the instruction crosses panels, LBO bytes apart.
__device__ __forceinline__ u64 wgmma_desc(u32 smem_address, u32 lbo_bytes, u32 sbo_bytes) {
    u64 d = 0;
    d |= (u64)((smem_address & 0x3FFFF) >> 4);
    d |= (u64)((lbo_bytes & 0x3FFFF) >> 4) << 16;
    d |= (u64)((sbo_bytes & 0x3FFFF) >> 4) << 32;
    d |= (u64)1 << 62;  // 128-byte swizzle
    return d;
}

// Orders this thread's register accesses before the wgmma that follows (accumulators it wrote,
// A fragments), and is required before the first wgmma of a group.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N of this warpgroup's committed wgmma groups are still in flight.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving reads or writes of an accumulator register across a wgmma
// issue or wait (it does not know the asynchronous instruction is still using the register).
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_regs(u32 (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}
// v, as a value the compiler must take as made here: what is derived from it inside a loop or
// branch is computed there instead of hoisted out and held in registers across the whole loop.
__device__ __forceinline__ int computed_here(int v) {
    asm volatile("" : "+r"(v));
    return v;
}

// --- mbarriers ------------------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initializations visible to the copy engine and the other threads (with a barrier).
__device__ __forceinline__ void mbar_fence_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival that also announces `bytes` more of transactions (the copies' payload) for the
// current phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Spins until the phase of parity `parity` has completed. A fresh barrier is in phase 0, so
// waiting for parity 1 returns at once: a producer waits on "empty" barriers with the flipped
// parity and its first pass through the ring does not block.
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    u32 done;
    do {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}

// One arrival on `bar` when every cp.async this thread issued before has landed (asynchronous:
// the thread goes on); it counts as one of the arrivals the barrier was initialized with.
__device__ __forceinline__ void cp_async_mbar_arrive(u32 bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// --- bulk tensor copies (TMA) ---------------------------------------------------------------
// The host's CUtensorMap (cuTensorMapEncodeTiled), 128 opaque bytes, 64-byte aligned; the kernel
// takes it by value as a __grid_constant__ parameter and hands the copy engine its address.
struct __align__(64) TensorMap {
    u64 opaque[16];
};

// Copies the box at coordinates (c0 innermost .. c3) of `map` into shared memory at `dst`;
// completion adds the box's bytes to `bar`'s transaction count. Out-of-range rows arrive as zeros.
__device__ __forceinline__ void tma_load_4d(u32 dst, const TensorMap* map, int c0, int c1, int c2, int c3, u32 bar) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
        "%5}], [%6];\n" ::"r"(dst),
        "l"((u64)map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
        : "memory");
}

// --- warp specialization ----------------------------------------------------------------------
// Register reallocation between warpgroups (the whole warpgroup executes it).
template <int REGS>
__device__ __forceinline__ void regs_dealloc() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
}
template <int REGS>
__device__ __forceinline__ void regs_alloc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
}

// Named barriers: `threads` threads (a multiple of 32) meet at barrier `id` (0 is
// __syncthreads'). arrive signals without waiting.
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// --- proxies --------------------------------------------------------------------------------
// Orders this thread's ordinary shared-memory accesses (st.shared, and cp.async's writes once
// waited for) before later asynchronous-proxy accesses (wgmma's operand reads, the copy engine):
// the two proxies see shared memory through different paths.
__device__ __forceinline__ void fence_proxy_async_shared() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Orders this thread's completed asynchronous-proxy writes to global memory (a bulk reduction
// waited for) before its later ordinary accesses, such as a release that publishes them.
__device__ __forceinline__ void fence_proxy_async_global() {
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

// --- bulk reductions (the copy engine adds shared memory into global memory) ------------------
// `bytes` (a multiple of 16; both addresses 16-byte aligned) of f32 at `src` in shared memory
// added element-wise to `dst`, asynchronously; tracked by this thread's bulk groups.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, u32 src, u32 bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src),
                 "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Until this thread's bulk groups have finished reading their shared-memory sources...
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
// ... or finished altogether, their writes performed.
__device__ __forceinline__ void bulk_wait_done() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// --- FP8 (e4m3) -------------------------------------------------------------------------------
// Four f32 as e4m3 bytes in one word, a's in the low byte: round to nearest even, magnitudes past
// the largest finite value (448) saturated to it, NaN kept (the `satfinite` conversion).
__device__ __forceinline__ u32 pack_e4m3x4(float a, float b, float c, float d) {
    unsigned short lo, hi;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(lo) : "f"(b), "f"(a));
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(hi) : "f"(d), "f"(c));
    return (u32)lo | ((u32)hi << 16);
}
