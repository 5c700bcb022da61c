// granule_walk.wgsl — the walk of the element-wise kernels over one (batch, head)'s rows
// (merge.wgsl, grad_sum.wgsl): each kernel's entry point calls `walk_granules`, which calls the
// kernel's `visit_granule(b, h, row, g)` once for every granule g (four elements) of every row
// below params.seq_q, head_dim/4 granules a row.
//
// What a workgroup owns: WG consecutive granules of one (batch, head)'s seq_q × head_dim/4
// granules (grid: (x, num_heads, batch)); when the x dimension of the grid cannot cover them
// all, each invocation strides on by the grid's width. What an invocation owns: one granule at a
// time. The kernels are bound by memory with no data shared between invocations, so no
// workgroup memory and no barrier; 64 is a multiple of every subgroup width (4 to 64) and far
// below every device's invocation limit, and adjacent invocations touch adjacent granules of a
// row.

const WG: u32 = 64u;

fn walk_granules(wg: vec3<u32>, grid_width: u32, li: u32) {
    let h = wg.y;
    let b = wg.z;
    let granules_per_row = params.head_dim / 4u;
    let count = params.seq_q * granules_per_row;
    for (var item = wg.x * WG + li; item < count; item += grid_width * WG) {
        visit_granule(b, h, item / granules_per_row, item % granules_per_row);
    }
}
