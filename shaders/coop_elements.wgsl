// coop_elements.wgsl — an invocation's own components of a cooperative matrix, for the kernels
// that work on their fragments in registers (coop_registers.wgsl, flash_bwd_coop.wgsl).
//
// The element access is SPIR-V's (OpCompositeExtract/Insert on cooperative matrices), which WGSL
// cannot spell: these functions are placeholders whose bodies src/spirv/elements.rs fills. Which
// row and column component i holds is the device's choice (src/caps/register_layout.rs); the
// host compiles COOP_COMPONENTS and the row slots in, the kernels measure the rest at their start.

fn coop_elements_c(m: coop_mat16x16<f32, C>) -> array<f32, COOP_COMPONENTS> {
    return array<f32, COOP_COMPONENTS>();
}

fn coop_from_elements_c(x: array<f32, COOP_COMPONENTS>) -> coop_mat16x16<f32, C> {
    return coop_mat16x16<f32, C>();
}

fn coop_from_elements_a(x: array<f16, COOP_COMPONENTS>) -> coop_mat16x16<f16, A> {
    return coop_mat16x16<f16, A>();
}

fn coop_elements_a(m: coop_mat16x16<f16, A>) -> array<f16, COOP_COMPONENTS> {
    return array<f16, COOP_COMPONENTS>();
}
