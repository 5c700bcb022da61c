// decode_lanes_subgroup.wgsl — adds the decode kernel's per-lane partial dot products across the
// LANES invocations of a key group with subgroup shuffles: no workgroup memory, no barrier.
//
// A key group's lanes have consecutive local indices starting at a multiple of LANES, and the
// host selects this piece only where the adapter's smallest subgroup holds at least LANES
// invocations (both powers of two), so the butterfly never leaves the subgroup.

fn add_across_lanes(partial: array<f32, DOTS>, li: u32) -> array<f32, DOTS> {
    var total = partial;
    for (var lane_mask = 1u; lane_mask < LANES; lane_mask <<= 1u) {
        // @unroll
        for (var i = 0u; i < DOTS; i++) {
            total[i] += subgroupShuffleXor(total[i], lane_mask);
        }
    }
    return total;
}
