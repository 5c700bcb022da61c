// huge_flags_bound.wgsl — the cooperative-matrix forward's exact pass as a second dispatch
// (flash_fwd_coop.wgsl, EXACT_PASS): one u32 per workgroup of the grid, in which the fast
// dispatch (EXACT_FLAGGED) stores whether some row of the workgroup met a huge reference and the
// rerun (EXACT_RERUN), the same grid dispatched right after it, reads it back. Every workgroup
// that gets past its sequence's rows stores its flag, so the buffer (engine scratch, reused by the
// next call) needs no clearing; the others return before reading one in either dispatch.

@group(0) @binding(HUGE_FLAGS_BINDING) var<storage, read_write> huge_flags: array<u32>;

// The workgroup's flag, in grid order. The host keeps the grid within one binding of flags
// (src/runtime/forward.rs), so the index fits.
fn huge_flag_index(wg: vec3<u32>, groups: vec3<u32>) -> u32 {
    return wg.x + groups.x * (wg.y + groups.y * wg.z);
}

// Stores the workgroup's verdict (`saw` is uniform over it; one invocation writes).
fn note_huge(wg: vec3<u32>, groups: vec3<u32>, li: u32, saw: bool) {
    if (li == 0u) {
        huge_flags[huge_flag_index(wg, groups)] = select(0u, 1u, saw);
    }
}

// Whether the fast dispatch flagged this workgroup, uniform over it: every invocation calls it,
// before Q is staged. One invocation reads the flag and hands it to the others through the K/V
// buffers' first granule, free until then (no workgroup memory of its own).
fn flagged(wg: vec3<u32>, groups: vec3<u32>, li: u32) -> bool {
    if (li == 0u) {
        kv_tile[0] = vec4<f16>(select(0.0h, 1.0h, huge_flags[huge_flag_index(wg, groups)] != 0u));
    }
    return workgroupUniformLoad(&kv_tile[0]).x != 0.0h;
}
