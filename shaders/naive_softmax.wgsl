// naive_softmax.wgsl — standard attention, pass 2 of 3: each row of the score matrix becomes
// probabilities in place, P = exp(S − max) / Σ exp(S − max), and its log-sum-exp is written out.
// Masked entries (past the causal diagonal) become exactly 0.
//
// What a workgroup owns: one score row (x = query row, y = head within this dispatch). What an
// invocation owns: every WG-th entry of the row; the max and the sum are combined by a tree
// reduction in workgroup memory.

const WG: u32 = 256u;

@group(0) @binding(1) var<storage, read_write> scores: array<f32>;
@group(0) @binding(2) var<storage, read_write> lse: array<u32>;

var<workgroup> partial: array<f32, WG>;

// Tree reduction of partial[0 .. WG); every invocation gets the result.
fn reduce_partial(li: u32, take_max: bool) -> f32 {
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        workgroupBarrier();
        if (li < stride) {
            let a = partial[li];
            let b = partial[li + stride];
            partial[li] = select(a + b, max(a, b), take_max);
        }
    }
    workgroupBarrier();
    let total = partial[0];
    workgroupBarrier();
    return total;
}

@compute @workgroup_size(WG)
fn naive_softmax(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = wg.x;
    let bh = params.bh_base + wg.y;
    let base = (wg.y * params.seq_q + i) * params.seq_kv;
    let seq = dense_sequence(bh / params.num_heads);

    var mx = LOWEST;
    for (var j = li; j < params.seq_kv; j += WG) {
        if (is_visible(seq, i, j)) {
            mx = max(mx, scores[base + j]);
        }
    }
    partial[li] = mx;
    let row_max = reduce_partial(li, true);

    var sum = 0.0;
    for (var j = li; j < params.seq_kv; j += WG) {
        if (is_visible(seq, i, j)) {
            sum += exp(scores[base + j] - row_max);
        }
    }
    partial[li] = sum;
    let row_sum = reduce_partial(li, false);

    let inv = select(0.0, 1.0 / row_sum, row_sum > 0.0);
    for (var j = li; j < params.seq_kv; j += WG) {
        var p = 0.0;
        if (is_visible(seq, i, j)) {
            p = exp(scores[base + j] - row_max) * inv;
        }
        scores[base + j] = p;
    }
    if (li == 0u && params.write_lse != 0u) {
        var bits = LSE_EMPTY_BITS;
        if (row_sum > 0.0) {
            bits = bitcast<u32>(row_max + log(row_sum));
        }
        lse[bh * params.seq_q + i] = bits;
    }
}
