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
// What a workgroup owns: WG consecutive granules of one (batch, head)'s seq_q × head_dim/4 granules
// (grid: (x, num_heads, batch)); when the x dimension of the grid cannot cover them all, each
// invocation strides on by the grid's width. What an invocation owns: one granule at a time: it
// reads its row's two LSEs and one granule of each side and writes one granule of O, and the first
// granule's invocation writes the row's LSE. The merge is bound by memory, with no data shared
// between invocations, so no workgroup memory and no barrier; 64 is a multiple of every subgroup
// width (4 to 64) and far below every device's invocation limit, and adjacent invocations read
// adjacent granules of a row.

const WG: u32 = 64u;

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
    let h = wg.y;
    let b = wg.z;
    let granules_per_row = params.head_dim / 4u;
    let count = params.seq_q * granules_per_row;
    for (var item = wg.x * WG + li; item < count; item += groups.x * WG) {
        let row = item / granules_per_row;
        let g = item % granules_per_row;
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
}
