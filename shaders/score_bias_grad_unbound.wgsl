// score_bias_grad_unbound.wgsl — the gradient kernels write no d(bias) (see
// score_bias_grad_bound.wgsl): WRITES_D_BIAS is false and the calls compile away.

const WRITES_D_BIAS: bool = false;

fn store_d_bias(seq: Sequence, head: u32, row: u32, cols: vec4<u32>, dz: vec4<f32>) {}

fn fill_d_bias(seq: Sequence, head: u32, m0: u32, begin: u32, end: u32, li: u32) {}
