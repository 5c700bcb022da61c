// flash_bwd_common.wgsl — what the backward kernels (flash_bwd_pre and the tiled and matrix
// gradient kernels) add to common.wgsl: the layouts of the gradient tensors and the natural softmax
// scale, in a second uniform block beside `params`; the dK/dV kernels' work items; the LSE in base 2.
//
// `params` (binding 0) describes the forward problem exactly as for flash_fwd — the strides of Q, K,
// V and O, the sizes, the causal offset, and `scale` = softmax scale · log2(e), because the
// backward kernels recompute P = exp2(scale · QKᵀ − LSE · log2 e) in base 2 like the forward.

// Mirrored by `GradParams` in src/wgsl/params.rs (same order, same sizes).
struct GradParams {
    d_o: TensorStrides,
    dq: TensorStrides,
    dk: TensorStrides,
    dv: TensorStrides,
    // The softmax scale itself: dQ = scale · dS K and dK = scale · dSᵀ Q.
    scale: f32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(1) var<uniform> grad: GradParams;

// The dK/dV kernels' work items (flash_bwd_dkdv.wgsl and the matrix kernels): one per query head
// of K/V head kv_head's group and query tile of BLOCK_M rows that sees their keys, the heads one
// after another, each over its tiles from first_tile on. The query head and first query row of
// item `it`:
fn item_head(kv_head: u32, it: u32, tiles_per_head: u32) -> u32 {
    return kv_head * params.group_size + it / tiles_per_head;
}

fn item_m0(it: u32, first_tile: u32, tiles_per_head: u32) -> u32 {
    return (first_tile + it % tiles_per_head) * BLOCK_M;
}

// The forward's log-sum-exp of a query row in base 2, from its bits. A row that saw no key has
// LSE = −∞; it gets a huge finite value instead, so that exp2(score − lse2) is exactly 0 and its
// gradients are zeros rather than NaN (WGSL implementations need not honour infinities).
fn lse2_of_bits(bits: u32) -> f32 {
    return select(bitcast<f32>(bits) * LOG2_E, -NEG_BIG, bits == LSE_EMPTY_BITS);
}
