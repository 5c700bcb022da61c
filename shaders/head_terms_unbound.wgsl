// head_terms_unbound.wgsl — no per-head tensors (see head_terms.wgsl): ALiBi's slopes, if any,
// are the geometric ones, and there are no sinks (the host builds the bound variant for them).

fn alibi_slope(h: u32) -> f32 {
    return select(0.0, geometric_slope(h), params.alibi == 1u);
}

fn sink_log2(h: u32) -> f32 {
    return 0.0;
}
