// storage_f16.wgsl — f16 tensors in memory: a granule is four halves packed in a vec2<u32>.
// Packing through u32 with unpack2x16float/pack2x16float works on every adapter, also those
// without `shader-f16` (browsers' software adapters), so f16 storage never depends on f16
// arithmetic being available.

alias Granule = vec2<u32>;

fn unpack_granule(g: Granule) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(g.x), unpack2x16float(g.y));
}

fn pack_granule(v: vec4<f32>) -> Granule {
    return vec2<u32>(pack2x16float(v.xy), pack2x16float(v.zw));
}
