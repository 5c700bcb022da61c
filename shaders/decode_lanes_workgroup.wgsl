// decode_lanes_workgroup.wgsl — adds the decode kernel's per-lane partial dot products across the
// LANES invocations of a key group through workgroup memory: works on every adapter (browsers'
// WebGPU has no subgroups through wgpu), at the cost of two barriers per block of keys.

var<workgroup> lane_partials: array<f32, DOTS * WG>;

// Call from uniform control flow (it holds barriers).
fn add_across_lanes(partial: array<f32, DOTS>, li: u32) -> array<f32, DOTS> {
    // @unroll
    for (var i = 0u; i < DOTS; i++) {
        lane_partials[i * WG + li] = partial[i];
    }
    workgroupBarrier();
    let first_lane = li - li % LANES;
    var total: array<f32, DOTS>;
    // @unroll
    for (var i = 0u; i < DOTS; i++) {
        var sum = 0.0;
        for (var l = 0u; l < LANES; l++) {
            sum += lane_partials[i * WG + first_lane + l];
        }
        total[i] = sum;
    }
    // The next block overwrites lane_partials: everyone must have read it first.
    workgroupBarrier();
    return total;
}
