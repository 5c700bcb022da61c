// storage_f32.wgsl — f32 tensors in memory: a granule is one vec4<f32>, read and written as is.

alias Granule = vec4<f32>;

fn unpack_granule(g: Granule) -> vec4<f32> {
    return g;
}

fn pack_granule(v: vec4<f32>) -> Granule {
    return v;
}
