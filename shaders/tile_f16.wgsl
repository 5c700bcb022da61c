// tile_f16.wgsl — the flash kernel's tiles held in workgroup memory as f16 (needs `shader-f16`):
// half the bytes of f32 tiles, so half the workgroup-memory traffic per multiply-add. Products are
// taken in f16 (exact for f16 inputs up to one rounding) and summed in f32, so accumulation error
// does not grow with head_dim or sequence length. Selected only for f16 storage, whose values an
// f16 tile holds exactly; P (in [0, 1]) is rounded to f16 for the second product.
// Needs `enable f16;`, which the library puts at the top of the module (directives must come first).

alias TileElem = f16;

fn to_tile4(v: vec4<f32>) -> vec4<TileElem> {
    return vec4<f16>(v);
}

fn mul_add4(acc: vec4<f32>, a: TileElem, b: vec4<TileElem>) -> vec4<f32> {
    return acc + vec4<f32>(a * b);
}
