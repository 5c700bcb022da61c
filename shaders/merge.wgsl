// merge.wgsl — merges two partial attention results of the same query rows over disjoint key sets
// (cascade / shared-prefix attention, split-KV decode, results from different devices):
//   lse = m + log(exp(lse_a − m) + exp(lse_b − m)),  m = max(lse_a, lse_b)
//   o   = exp(lse_a − lse)·o_a + exp(lse_b − lse)·o_b            (written as e_a/s·o_a + e_b/s·o_b)
// A side whose LSE is −∞ (it saw no key) has weight 0 and its O is not read; both −∞ give o = 0
// and lse = −∞, as the forward writes a row that sees no key.
//
// Bindings: params (binding 0, common.wgsl's Params with q → o_a, k → o_b, o → o; seq_q,
// num_heads, head_dim, write_lse as the forward's), o_a, lse_a, o_b, lse_b (read), o, lse
// (written; the host refuses a written tensor that shares a buffer with a read one, so nothing is
// merged in place). O tensors are [batch, seq_q, num_heads, head_dim] by the strides in params,
// in granules of four elements; the LSEs are [batch, num_heads, seq_q] f32, read and written as
// bits, because WGSL implementations need not honour infinities.
//
// The walk over the granules, and what a workgroup and an invocation own: granule_walk.wgsl. Per
// granule an invocation reads its row's two LSEs and one granule of each side and writes one
// granule of O; the first granule's invocation also writes the row's LSE.

@group(0) @binding(1) var<storage, read> o_a: array<Granule>;
@group(0) @binding(2) var<storage, read> lse_a: array<u32>;
@group(0) @binding(3) var<storage, read> o_b: array<Granule>;
@group(0) @binding(4) var<storage, read> lse_b: array<u32>;
@group(0) @binding(5) var<storage, read_write> o: array<Granule>;
@group(0) @binding(6) var<storage, read_write> lse: array<u32>;

@compute @workgroup_size(WG)
fn merge(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    walk_granules(wg, groups.x, li);
}

fn visit_granule(b: u32, h: u32, row: u32, g: u32) {
    let r = lse_index(dense_sequence(b), h, row);
    let bits_a = lse_a[r];
    let bits_b = lse_b[r];
    let seen_a = bits_a != LSE_EMPTY_BITS;
    let seen_b = bits_b != LSE_EMPTY_BITS;
    let la = bitcast<f32>(bits_a);
    let lb = bitcast<f32>(bits_b);

    var merged = vec4<f32>(0.0);
    var lse_bits = LSE_EMPTY_BITS;
    if (seen_a && seen_b) {
        let m = max(la, lb);
        let e_a = exp(la - m);
        let e_b = exp(lb - m);
        let sum = e_a + e_b;
        let inv = 1.0 / sum;
        let x_a = unpack_granule(o_a[row_granule(params.q, b, row, h) + g]);
        let x_b = unpack_granule(o_b[row_granule(params.k, b, row, h) + g]);
        merged = (e_a * inv) * x_a + (e_b * inv) * x_b;
        lse_bits = bitcast<u32>(m + log(sum));
    } else if (seen_a) {
        merged = unpack_granule(o_a[row_granule(params.q, b, row, h) + g]);
        lse_bits = bits_a;
    } else if (seen_b) {
        merged = unpack_granule(o_b[row_granule(params.k, b, row, h) + g]);
        lse_bits = bits_b;
    }
    o[row_granule(params.o, b, row, h) + g] = pack_granule(merged);
    if (g == 0u && params.write_lse != 0u) {
        lse[r] = lse_bits;
    }
}
