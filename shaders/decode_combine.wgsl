// decode_combine.wgsl — merges the decode kernel's partial results (flash_decode.wgsl with more
// than one piece of the keys) by their LSEs into O and the final LSE:
//   lse = m + log Σ_s exp(lse_s − m),  m = max_s lse_s,   o = Σ_s exp(lse_s − lse) · o_s
// Pieces whose LSE is −∞ (they saw no key of the row) weigh 0; if all do, O = 0 and LSE = −∞. A
// piece whose LSE is NaN (it met an invalid cache index) makes the row NaN. With sinks
// (params.sinks, the tensor bound by head_terms_bound.wgsl), the head's sink is one more piece
// whose output is 0: it joins the max and the sum.
//
// What a workgroup owns: one query row of one head (grid: (seq_q, num_heads, batch)): it reduces
// the row's num_splits LSEs (at most MAX_SPLITS) to weights in workgroup memory, then sums the
// pieces' outputs. An invocation owns one granule g of the row (head_dim / 4 of them, at most 64)
// and one lane of the pieces, l: it adds pieces l, l + piece_lanes, ... of granule g, two pieces a
// step, and the lanes' sums meet in workgroup memory. The pieces are spread over lanes because
// each piece is a dependent load: one invocation walking 57 pieces of a row in turn waits out 57
// memory latencies, which at batch 1 is most of a decode step. WG = 256 gives 8 lanes at head_dim
// 128 and 4 at 256, and is WebGPU's default invocation limit.

const WG: u32 = 256u;

@group(0) @binding(1) var<storage, read> o_partial: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> lse_partial: array<u32>;
@group(0) @binding(3) var<storage, read_write> o: array<Granule>;
@group(0) @binding(4) var<storage, read_write> lse: array<u32>;

var<workgroup> weights: array<f32, MAX_SPLITS>;
var<workgroup> reduced: array<f32, WG>;
var<workgroup> lane_sums: array<vec4<f32>, WG>;

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

// A piece's output times its weight, exactly 0 for a weight of 0.
fn weighted(w: f32, x: vec4<f32>) -> vec4<f32> {
    return select(vec4<f32>(0.0), w * x, w > 0.0);
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
    let piece_lanes = WG / granules;
    let g = li % granules;
    let lane = li / granules;
    var out = vec4<f32>(0.0);
    if (sum > 0.0 && lane < piece_lanes) {
        // Two pieces a step, both loads issued before either is used. A piece of weight 0 (it
        // saw no key of the row) adds nothing, whatever its scratch holds.
        var s = lane;
        for (; s + piece_lanes < splits; s += 2u * piece_lanes) {
            let a = o_partial[(first_piece + s) * granules + g];
            let c = o_partial[(first_piece + s + piece_lanes) * granules + g];
            out += weighted(weights[s], a) + weighted(weights[s + piece_lanes], c);
        }
        if (s < splits) {
            out += weighted(weights[s], o_partial[(first_piece + s) * granules + g]);
        }
    }
    lane_sums[li] = out;
    workgroupBarrier();
    if (lane == 0u) {
        for (var l = 1u; l < piece_lanes; l++) {
            out += lane_sums[l * granules + g];
        }
        out = select(vec4<f32>(0.0), out / sum, sum > 0.0);
        if (poisoned != 0.0) {
            out = vec4<f32>(nan_f32());
        }
        o[row_granule(params.o, b, token, h) + g] = pack_granule(out);
    }
    if (li == 0u && params.write_lse != 0u) {
        lse[row] = select(select(LSE_EMPTY_BITS, bitcast<u32>(m + log(sum)), sum > 0.0), NAN_BITS, poisoned != 0.0);
    }
}
