// huge_flags_unbound.wgsl — the exact pass in the kernel (EXACT_PASS is EXACT_IN_KERNEL): no
// flags to store or read (see huge_flags_bound.wgsl).

fn note_huge(wg: vec3<u32>, groups: vec3<u32>, li: u32, saw: bool) {}

fn flagged(wg: vec3<u32>, groups: vec3<u32>, li: u32) -> bool {
    return true;
}
