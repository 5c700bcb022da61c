// mul_wide_halves.wgsl — the 32 × 32 → 64-bit product of dropout's generator (dropout.wgsl) in
// 32-bit arithmetic, for devices without 64-bit integers (src/plan/dropout.rs; mul_wide_u64.wgsl
// is the other form, and gives the same bits).
//
// WGSL has no such multiply: the high word is built from 16-bit halves, a = a_hi·2^16 + a_lo,
// each partial product below 2^32, and the carries of the middle terms collected in `cross` and
// `cross2` (each at most (2^16 − 1)² + 2^16 − 1 < 2^32). With b a constant, its halves fold at
// compile time: five multiplies and a few shifts in all.

// (low, high) words of a · b.
fn mul_wide(a: u32, b: u32) -> vec2<u32> {
    let a_lo = a & 0xffffu;
    let a_hi = a >> 16u;
    let b_lo = b & 0xffffu;
    let b_hi = b >> 16u;
    let lo_lo = a_lo * b_lo;
    let cross = a_hi * b_lo + (lo_lo >> 16u);
    let cross2 = a_lo * b_hi + (cross & 0xffffu);
    return vec2<u32>(a * b, a_hi * b_hi + (cross >> 16u) + (cross2 >> 16u));
}

