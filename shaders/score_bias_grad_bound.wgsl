// score_bias_grad_bound.wgsl — the dQ kernel writes the score bias's gradient as it goes
// (GradKernel::writes_d_bias): for a bias with one (batch entry, head) per slice of d(bias) —
// neither broadcast, or broadcast over a dimension of size 1 — each element of d(bias) is
// P ∘ (dP − D) of exactly one dQ tile, which the dQ kernel forms anyway (dS before the soft-cap's
// slope), so it stores it instead of a fourth kernel recomputing it (flash_bwd_dbias.wgsl, for
// the broadcast biases). d_bias (written, f32) is dense [batch, num_heads, seq_q, seq_kv] from the
// start of its binding, as BackwardProblem::d_bias_layout says; binding 9, which the dQ kernel
// leaves free (the dK/dV kernel's dv).

@group(0) @binding(9) var<storage, read_write> d_bias: array<f32>;

const WRITES_D_BIAS: bool = true;

// Element (row, 0) of the slice of sequence `seq`, head `head`.
fn d_bias_row(seq: Sequence, head: u32, row: u32) -> u32 {
    return ((seq.b * params.num_heads + head) * params.seq_q + row) * params.seq_kv;
}

// P ∘ (dP − D) of query row `row` against key columns `cols` of a tile the kernel visits (0 where
// its masks, or the ends of a shorter sequence, hide an element: P is 0 there). Elements past
// the gradient's own rows and columns do not exist.
fn store_d_bias(seq: Sequence, head: u32, row: u32, cols: vec4<u32>, dz: vec4<f32>) {
    if (row < params.seq_q) {
        let first = d_bias_row(seq, head, row);
        for (var j = 0u; j < 4u; j++) {
            if (cols[j] < params.seq_kv) {
                d_bias[first + cols[j]] = dz[j];
            }
        }
    }
}

// Columns [begin, end) of the query rows [m0, m0 + BLOCK_M) that the kernel does not visit: 0 (no
// query of the pair sees those keys), or NaN for a sequence the index tensors place outside its
// tensors (as the kernel writes its dQ rows). The workgroup's invocations share the elements.
fn fill_d_bias(seq: Sequence, head: u32, m0: u32, begin: u32, end: u32, li: u32) {
    let rows = min(BLOCK_M, params.seq_q - min(m0, params.seq_q));
    let width = end - min(begin, end);
    let value = select(nan_f32(), 0.0, seq.valid);
    for (var e = li; e < rows * width; e += WORKGROUP_SIZE) {
        d_bias[d_bias_row(seq, head, m0 + e / width) + begin + e % width] = value;
    }
}
