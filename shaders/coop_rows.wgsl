// coop_rows.wgsl — scaling the rows of an output held in accumulator fragments, shared by the
// cooperative-matrix kernels that rescale O as their running max moves (flash_fwd_coop.wgsl,
// flash_decode_coop.wgsl). The including kernel defines D_BLOCKS, the fragments of a row block.

// O *= the row factors in `factors`, component-wise.
fn scale_rows(o: ptr<function, array<coop_mat16x16<f32, C>, D_BLOCKS>>, factors: coop_mat16x16<f32, C>) {
    // @unroll
    for (var d = 0u; d < D_BLOCKS; d++) {
        (*o)[d] = componentwise_product((*o)[d], factors);
    }
}

// Component-wise product of two accumulator matrices. WGSL has no operator for it, so the kernel
// writes `a - b`, which naga emits as OpFSub, and src/spirv/coherence.rs turns every OpFSub on
// cooperative matrices into OpFMul (component-wise for cooperative matrices): this is the only
// matrix subtraction in the kernel (a test checks every configuration). The kernel is only ever
// built through that pass; any other translation of this file would compute a subtraction.
fn componentwise_product(a: coop_mat16x16<f32, C>, b: coop_mat16x16<f32, C>) -> coop_mat16x16<f32, C> {
    return a - b;
}
