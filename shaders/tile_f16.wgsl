// tile_f16.wgsl — the flash kernel's tiles held in workgroup memory as f16 (needs `shader-f16`):
// half the bytes of f32 tiles, so half the workgroup-memory traffic per multiply-add. The operands
// widen to f32 before they multiply: a product of two f16 values is exact in f32, where in f16 it
// would round and overflow past 65,504 (q = k = 300 is already a score of 90,000 per term), and
// the sums are f32, so accumulation error does not grow with head_dim or sequence length. Selected
// only for f16 storage, whose values an f16 tile holds exactly; P (in [0, 1]) is rounded to f16
// for the second product. The forward and the backward (flash_bwd_stage.wgsl) share mul_add4.
// Needs `enable f16;`, which the library puts at the top of the module (directives must come first).

alias TileElem = f16;

fn to_tile4(v: vec4<f32>) -> vec4<TileElem> {
    return vec4<f16>(v);
}

// acc + a·b, the f16 operands widened to f32 first.
fn mul_add4(acc: vec4<f32>, a: TileElem, b: vec4<TileElem>) -> vec4<f32> {
    return fma(vec4<f32>(f32(a)), vec4<f32>(b), acc);
}
