// flash_bwd_pre.wgsl — backward preprocessing: D = rowsum(dO ∘ O), one f32 per query row.
//
//   D[b, h, i] = Σ_d dO[b, i, h, d] · O[b, i, h, d]      ([batch, num_heads, seq_q], f32)
//
// D is Σ_j P_ij dP_ij, the term the softmax Jacobian subtracts: dS = P ∘ (dP − D). Both gradient
// kernels need it for every query row they meet, and the dK/dV kernel meets each row once per K/V
// tile, so it is computed once here rather than recomputed there.
//
// Bindings: 0 params, 1 grad (flash_bwd_common.wgsl), 2 o, 3 d_o (read, arrays of granules),
// 4 delta (written, f32).
//
// What a workgroup owns: BLOCK_M query rows of one (batch, head); the grid is
// (ceil(seq_q / BLOCK_M), num_heads, batch).
// What an invocation owns: the workgroup is THREADS_Y × THREADS_X; invocation (ty, tx) takes
// ROWS_PER_THREAD consecutive rows and, in each, the granules tx, tx + THREADS_X, … of the row, so
// that the THREADS_X invocations of a row read consecutive 16-byte words. Their partial dot
// products are summed by reduce_rows() (reduce_workgroup.wgsl or reduce_subgroup.wgsl: this is
// where the backward's workgroup and subgroup variants differ).
//
// Why these sizes: the kernel reads 2 · seq_q · head_dim elements and does one multiply-add per
// element; it is bound by memory bandwidth and costs about 1% of the gradient kernels. A few rows
// per invocation and a row split over THREADS_X invocations keep every load coalesced while
// the reduction stays within one subgroup (THREADS_X ≤ the smallest subgroup size for the
// subgroup variant).

const WORKGROUP_SIZE: u32 = THREADS_X * THREADS_Y;
const ROWS_PER_THREAD: u32 = BLOCK_M / THREADS_Y;

@group(0) @binding(2) var<storage, read> o: array<Granule>;
@group(0) @binding(3) var<storage, read> d_o: array<Granule>;
@group(0) @binding(4) var<storage, read_write> delta: array<f32>;

@compute @workgroup_size(WORKGROUP_SIZE)
fn flash_bwd_pre(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let head = wg.y;
    let seq = sequence(wg.z);
    let m0 = wg.x * BLOCK_M;
    let tx = li % THREADS_X;
    let row0 = (li / THREADS_X) * ROWS_PER_THREAD;
    let granules = params.head_dim / 4u;

    var partial: array<f32, ROWS_PER_THREAD>;
    for (var i = 0u; i < ROWS_PER_THREAD; i++) {
        let row = m0 + row0 + i;
        var sum = 0.0;
        if (row < seq.seq_q) {
            let o_row = row_granule(params.o, seq.b, seq.q_first + row, head);
            let do_row = row_granule(grad.d_o, seq.b, seq.q_first + row, head);
            for (var g = tx; g < granules; g += THREADS_X) {
                sum += dot(unpack_granule(o[o_row + g]), unpack_granule(d_o[do_row + g]));
            }
        }
        partial[i] = sum;
    }
    let total = reduce_rows(partial, tx, row0, false);
    if (tx == 0u) {
        for (var i = 0u; i < ROWS_PER_THREAD; i++) {
            let row = m0 + row0 + i;
            if (row < seq.seq_q) {
                delta[lse_index(seq, head, row)] = total[i];
            }
        }
    }
}
