// head_terms_bound.wgsl — the per-head tensors at bindings HEAD_BINDING and HEAD_BINDING + 1,
// after the kernel's own and its index tensors' (see head_terms.wgsl). A tensor the problem does
// not use is bound to a 16-byte placeholder and never read. A kernel that never calls sink_log2
// (the backward's gradient kernels: the LSE includes the sinks) has no sinks binding at all.

// [num_heads] ALiBi slopes (params.alibi == 2) and sink logits (params.sinks == 1), f32.
@group(0) @binding(HEAD_BINDING) var<storage, read> alibi_slopes: array<f32>;
@group(0) @binding(HEAD_BINDING + 1u) var<storage, read> sinks: array<f32>;

// Query head h's ALiBi slope (0 without ALiBi).
fn alibi_slope(h: u32) -> f32 {
    if (params.alibi == 2u) {
        return alibi_slopes[h];
    }
    return select(0.0, geometric_slope(h), params.alibi == 1u);
}

// Query head h's sink logit in base 2.
fn sink_log2(h: u32) -> f32 {
    return sinks[h] * LOG2_E;
}
