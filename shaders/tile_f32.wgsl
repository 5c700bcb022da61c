// tile_f32.wgsl — the flash kernel's Q/K/V/P tiles held in workgroup memory as f32, multiplied and
// accumulated in f32. The variant that runs everywhere and matches the f64 reference to ~1e-6.

alias TileElem = f32;

fn to_tile4(v: vec4<f32>) -> vec4<TileElem> {
    return v;
}

// acc + a·b, one fused multiply-add per lane.
fn mul_add4(acc: vec4<f32>, a: TileElem, b: vec4<TileElem>) -> vec4<f32> {
    return fma(vec4<f32>(a), b, acc);
}
