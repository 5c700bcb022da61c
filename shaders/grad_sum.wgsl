// grad_sum.wgsl — sums the partial gradients of ring attention's blocks (src/runtime/ring.rs):
// with STORE false, `sums += parts` (one block's dQ, dK or dV, in the storage type, added into
// f32 sums, so that a gradient summed over many blocks is rounded to the storage type once); with
// STORE true, `parts = sums` (the sums written into the caller's gradient in the storage type).
//
// Bindings: params (binding 0, common.wgsl's Params with q → the parts' strides, o → the sums'
// strides; seq_q rows, num_heads heads, head_dim), parts (binding 1: granules of the storage
// type), sums (binding 2: f32, one vec4 per granule). Both are read_write so that one module
// serves either direction; the host binds the two to different buffers.
//
// The walk over the granules, and what a workgroup and an invocation own: granule_walk.wgsl. Per
// granule an invocation reads, adds and writes in place.

@group(0) @binding(1) var<storage, read_write> parts: array<Granule>;
@group(0) @binding(2) var<storage, read_write> sums: array<vec4<f32>>;

@compute @workgroup_size(WG)
fn grad_sum(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    walk_granules(wg, groups.x, li);
}

fn visit_granule(b: u32, h: u32, row: u32, g: u32) {
    let part = row_granule(params.q, b, row, h) + g;
    let sum = row_granule(params.o, b, row, h) + g;
    if (STORE) {
        parts[part] = pack_granule(sums[sum]);
    } else {
        sums[sum] = sums[sum] + unpack_granule(parts[part]);
    }
}
