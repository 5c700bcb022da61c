// head_terms.wgsl — ALiBi's position bias and attention sinks (src/problem/head_terms.rs), for
// the kernels that implement them (the forward kernels, the backward's gradient kernels). The
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
    return alibi_bias_at(alibi_slope(h) * LOG2_E, vec4<i32>(position), cols);
}

// alibi_bias at a head's slope · log2 e `slope2` (worked out once per head) for four queries at
// key positions `positions` against keys `cols`, pair by pair.
fn alibi_bias_at(slope2: f32, positions: vec4<i32>, cols: vec4<u32>) -> vec4<f32> {
    return -slope2 * abs(vec4<f32>(positions) - vec4<f32>(cols));
}

// Whether the scores need alibi_bias at all (uniform: a branch the plain problem skips).
fn has_alibi() -> bool {
    return params.alibi != 0u;
}

// A row's final softmax state, with its head's sink joining the sum (the forward kernels'
// epilogues): the row's output (accumulated under max m) is multiplied by o_factor / l.
struct RowTotal {
    m: f32,
    l: f32,
    o_factor: f32,
}

// Row state m (its max or reference max, base 2; LOWEST or −∞ for a row that saw no key) and sum
// l under it, joined by head h's sink: m' = max(m, sink), l' = l·f + exp2(sink − m'), o_factor f
// = exp2(m − m'). Without sinks, (m, l, 1).
fn join_sink(h: u32, m: f32, l: f32) -> RowTotal {
    if (params.sinks == 0u) {
        return RowTotal(m, l, 1.0);
    }
    let sink = sink_log2(h);
    let m_new = max(m, sink);
    let o_factor = select(exp2(m - m_new), 0.0, m <= LOWEST);
    return RowTotal(m_new, l * o_factor + exp2(sink - m_new), o_factor);
}
