// reduce_subgroup.wgsl — combines per-invocation partial row values across the THREADS_X invocations
// that share a row with subgroup shuffles: no workgroup memory, no barrier.
//
// The THREADS_X invocations of a row have consecutive local indices starting at a multiple of
// THREADS_X, and the host selects this variant only when the adapter's smallest subgroup holds at
// least THREADS_X invocations (both powers of two), so a row never straddles two subgroups and the
// butterfly below stays inside it. The subgroup size itself is read off the adapter at run time:
// 32 on NVIDIA, 32 or 64 on AMD, 8 to 32 on Intel, 8 on lavapipe.

fn reduce_rows(partial: array<f32, ROWS_PER_THREAD>, tx: u32, row0: u32, take_max: bool) -> array<f32, ROWS_PER_THREAD> {
    var total = partial;
    for (var lane_mask = 1u; lane_mask < THREADS_X; lane_mask <<= 1u) {
        for (var i = 0u; i < ROWS_PER_THREAD; i++) {
            let other = subgroupShuffleXor(total[i], lane_mask);
            total[i] = select(total[i] + other, max(total[i], other), take_max);
        }
    }
    return total;
}
