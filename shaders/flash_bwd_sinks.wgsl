// flash_bwd_sinks.wgsl — the gradient of the attention sinks (src/problem/head_terms.rs):
//
//   dL/ds_h = −Σ_{b, i} P_sink(b, h, i) · D(b, h, i),   P_sink = exp(s_h − LSE),   D = rowsum(dO ∘ O)
//
// from the forward's LSE (which includes the sink) and D, which flash_bwd_pre.wgsl has written
// (same layout as the LSE). Bindings: 0 params, 1 the LSE bits, 2 delta, 3 the [num_heads] sink
// logits, 4 the [num_heads] gradient (written), and for a packed batch the index tensors from 5
// (sequence_indexed.wgsl).
//
// What a workgroup owns: one query head (grid x), every row of it over the batch; invocation li
// sums rows li, li + WG, ... of each sequence, and the workgroup adds the WG partial sums as a
// tree in workgroup memory, so the result does not depend on timing (deterministic). The work is
// batch · seq_q exponentials per head, negligible beside the gradient kernels; WG = 256 is the
// largest workgroup WebGPU guarantees.

const WG: u32 = 256u;

@group(0) @binding(1) var<storage, read> lse: array<u32>;
@group(0) @binding(2) var<storage, read> delta: array<f32>;
@group(0) @binding(3) var<storage, read> sinks: array<f32>;
@group(0) @binding(4) var<storage, read_write> d_sinks: array<f32>;

var<workgroup> partial: array<f32, WG>;

@compute @workgroup_size(WG)
fn flash_bwd_sinks(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let h = wg.x;
    let sink = sinks[h];
    var sum = 0.0;
    for (var b = 0u; b < params.batch; b++) {
        let seq = sequence(b);
        for (var i = li; i < seq.seq_q; i += WG) {
            let at = lse_index(seq, h, i);
            // A row's LSE includes its sink, so it is finite (NaN for a sequence the forward could
            // not compute, which then shows in the gradient).
            sum += exp(sink - bitcast<f32>(lse[at])) * delta[at];
        }
    }
    partial[li] = sum;
    for (var half = WG / 2u; half > 0u; half /= 2u) {
        workgroupBarrier();
        if (li < half) {
            partial[li] += partial[li + half];
        }
    }
    if (li == 0u) {
        d_sinks[h] = -partial[0];
    }
}
