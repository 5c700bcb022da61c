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
// What a workgroup owns: WG consecutive granules of one (batch, head)'s seq_q × head_dim/4
// granules (grid: (x, num_heads, batch)); when the x dimension of the grid cannot cover them
// all, each invocation strides on by the grid's width. What an invocation owns: one granule at
// a time, read, added and written in place, with no data shared between invocations: bound by
// memory, so no workgroup memory and no barrier; 64 is a multiple of every subgroup width (4 to
// 64), and adjacent invocations touch adjacent granules of a row (merge.wgsl's reasons).

const WG: u32 = 64u;

@group(0) @binding(1) var<storage, read_write> parts: array<Granule>;
@group(0) @binding(2) var<storage, read_write> sums: array<vec4<f32>>;

@compute @workgroup_size(WG)
fn grad_sum(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let h = wg.y;
    let b = wg.z;
    let granules_per_row = params.head_dim / 4u;
    let count = params.seq_q * granules_per_row;
    for (var item = wg.x * WG + li; item < count; item += groups.x * WG) {
        let row = item / granules_per_row;
        let g = item % granules_per_row;
        let part = row_granule(params.q, b, row, h) + g;
        let sum = row_granule(params.o, b, row, h) + g;
        if (STORE) {
            parts[part] = pack_granule(sums[sum]);
        } else {
            sums[sum] = sums[sum] + unpack_granule(parts[part]);
        }
    }
}
