// storage_bf16.wgsl — bf16 tensors in memory: a granule is four bfloat16 values packed in a
// vec2<u32>. WGSL has no bf16 type, but a bf16 is the upper half of an f32: reading one costs a
// shift or a mask, writing one a round-to-nearest-even on the dropped half.

alias Granule = vec2<u32>;

fn bf16_pair_to_f32(w: u32) -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(w << 16u), bitcast<f32>(w & 0xffff0000u));
}

// Round an f32 to the nearest bf16 (ties to even) and return its 16 bits; NaN stays NaN.
fn f32_to_bf16_bits(x: f32) -> u32 {
    let bits = bitcast<u32>(x);
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
        return (bits >> 16u) | 0x40u;
    }
    return (bits + 0x7fffu + ((bits >> 16u) & 1u)) >> 16u;
}

fn unpack_granule(g: Granule) -> vec4<f32> {
    return vec4<f32>(bf16_pair_to_f32(g.x), bf16_pair_to_f32(g.y));
}

fn pack_granule(v: vec4<f32>) -> Granule {
    return vec2<u32>(
        f32_to_bf16_bits(v.x) | (f32_to_bf16_bits(v.y) << 16u),
        f32_to_bf16_bits(v.z) | (f32_to_bf16_bits(v.w) << 16u),
    );
}
