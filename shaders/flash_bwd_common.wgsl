// flash_bwd_common.wgsl — what the three backward kernels (flash_bwd_pre, flash_bwd_dkdv,
// flash_bwd_dq) add to common.wgsl: the layouts of the gradient tensors and the natural softmax
// scale, in a second uniform block beside `params`.
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
