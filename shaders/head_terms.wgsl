// head_terms.wgsl — ALiBi's position bias and attention sinks (src/problem/head_terms.rs), for
// the kernels that implement them (the tiled forward and the backward's gradient kernels). The
// slopes' mode (params.alibi) and the sinks (params.sinks) are run-time values; where a slope or
// a sink comes from a tensor, the kernel is built with head_terms_bound.wgsl, which binds them,
// else with head_terms_unbound.wgsl. Both define alibi_slope(h) and sink_log2(h).

// Query head h's geometric ALiBi slope for params.num_heads heads (Alibi::geometric_slope): with
// p the largest power of two ≤ num_heads, 2^(−8(h+1)/p) for h < p, else 2^(−4(2(h−p)+1)/p).
fn geometric_slope(h: u32) -> f32 {
    let p = 1u << firstLeadingBit(max(params.num_heads, 1u));
    if (h < p) {
        return exp2(-8.0 * f32(h + 1u) / f32(p));
    }
    return exp2(-4.0 * f32(2u * (h - p) + 1u) / f32(p));
}

// What ALiBi adds to four scores in base 2 (the kernels' scores are scale · log2 e · q·k): the
// query at key position `position` (its row plus the sequence's causal offset) against key
// columns `cols`, −slope · |position − col| · log2 e. Exact in f32 for positions below 2^24.
fn alibi_bias(h: u32, position: i32, cols: vec4<u32>) -> vec4<f32> {
    let slope = alibi_slope(h) * LOG2_E;
    return -slope * abs(vec4<f32>(f32(position)) - vec4<f32>(cols));
}

// Whether the scores need alibi_bias at all (uniform: a branch the plain problem skips).
fn has_alibi() -> bool {
    return params.alibi != 0u;
}
