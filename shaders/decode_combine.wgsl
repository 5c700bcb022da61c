// decode_combine.wgsl — merges the decode kernel's partial results (flash_decode.wgsl with more
// than one piece of the keys) by their LSEs into O and the final LSE:
//   lse = m + log Σ_s exp(lse_s − m),  m = max_s lse_s,   o = Σ_s exp(lse_s − lse) · o_s
// Pieces whose LSE is −∞ (they saw no key of the row) weigh 0; if all do, O = 0 and LSE = −∞. A
// piece whose LSE is NaN (it met an invalid cache index) makes the row NaN. With sinks
// (params.sinks, the tensor bound by head_terms_bound.wgsl), the head's sink is one more piece
// whose output is 0: it joins the max and the sum.
//
// What a workgroup owns: one query row of one head (grid: (seq_q, num_heads, batch)): it reduces
// the row's num_splits LSEs (at most MAX_SPLITS) to weights in workgroup memory, then each
// invocation sums the pieces' granules g, g + WG, ... of the row. WG = 64 is a multiple of every
// subgroup width and covers the 32 granules of a 128-element row in one pass; the data is small
// (splits × head_dim f32 per row), so no more parallelism is needed.

const WG: u32 = 64u;

@group(0) @binding(1) var<storage, read> o_partial: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> lse_partial: array<u32>;
@group(0) @binding(3) var<storage, read_write> o: array<Granule>;
@group(0) @binding(4) var<storage, read_write> lse: array<u32>;

var<workgroup> weights: array<f32, MAX_SPLITS>;
var<workgroup> reduced: array<f32, WG>;

// The workgroup's combination of `x` (max or sum), in every invocation. Uniform control flow.
fn reduce_workgroup(x: f32, li: u32, take_max: bool) -> f32 {
    reduced[li] = x;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        if (li < stride) {
            let other = reduced[li + stride];
            reduced[li] = select(reduced[li] + other, max(reduced[li], other), take_max);
        }
        workgroupBarrier();
    }
    let total = reduced[0];
    workgroupBarrier();
    return total;
}

@compute @workgroup_size(WG)
fn decode_combine(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let token = wg.x;
    let h = wg.y;
    let b = wg.z;
    let row = lse_index(dense_sequence(b), h, token);
    let splits = params.num_splits;
    let first_piece = row * splits;

    var m = LOWEST;
    var poisoned = 0.0;
    for (var s = li; s < splits; s += WG) {
        let bits = lse_partial[first_piece + s];
        // NaN tested on the bits: comparisons of NaN need not be honoured.
        if ((bits & 0x7fffffffu) > 0x7f800000u) {
            poisoned = 1.0;
        } else if (bits != LSE_EMPTY_BITS) {
            m = max(m, bitcast<f32>(bits));
        }
    }
    m = reduce_workgroup(m, li, true);
    poisoned = reduce_workgroup(poisoned, li, true);
    var sink = LOWEST;
    if (params.sinks != 0u) {
        sink = sink_log2(h) * LN_2;
        m = max(m, sink);
    }
    var sum = 0.0;
    for (var s = li; s < splits; s += WG) {
        let bits = lse_partial[first_piece + s];
        let w = select(0.0, exp(bitcast<f32>(bits) - m), bits != LSE_EMPTY_BITS && poisoned == 0.0);
        weights[s] = w;
        sum += w;
    }
    sum = reduce_workgroup(sum, li, false);
    if (params.sinks != 0u) {
        sum += exp(sink - m);
    }

    let granules = params.head_dim / 4u;
    for (var g = li; g < granules; g += WG) {
        var out = vec4<f32>(0.0);
        if (sum > 0.0) {
            for (var s = 0u; s < splits; s++) {
                let w = weights[s];
                if (w > 0.0) {
                    out += w * o_partial[(first_piece + s) * granules + g];
                }
            }
            out /= sum;
        }
        if (poisoned != 0.0) {
            out = vec4<f32>(nan_f32());
        }
        o[row_granule(params.o, b, token, h) + g] = pack_granule(out);
    }
    if (li == 0u && params.write_lse != 0u) {
        lse[row] = select(select(LSE_EMPTY_BITS, bitcast<u32>(m + log(sum)), sum > 0.0), NAN_BITS, poisoned != 0.0);
    }
}
