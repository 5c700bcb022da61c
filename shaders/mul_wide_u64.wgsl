// mul_wide_u64.wgsl — the 32 × 32 → 64-bit product of dropout's generator (dropout.wgsl) as one
// 64-bit multiply, for devices with 64-bit integers (wgpu's SHADER_INT64; src/plan/dropout.rs).
// One 64-bit multiply in the shader, where mul_wide_halves.wgsl, the form for every device, takes
// five 32-bit ones and the carries' shifts and adds.

// (low, high) words of a · b.
fn mul_wide(a: u32, b: u32) -> vec2<u32> {
    let p = u64(a) * u64(b);
    return vec2<u32>(u32(p), u32(p >> 32u));
}

