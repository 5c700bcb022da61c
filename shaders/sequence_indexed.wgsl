// sequence_indexed.wgsl — sequence(b) read from the batch's index tensors (src/problem/varlen.rs,
// src/problem/cache.rs): with VARLEN the packed row offsets, with KV_LENGTHS each sequence's key
// count, at bindings INDEX_BINDING .. INDEX_BINDING + 2, right after the kernel's own (dense
// numbers: the cooperative-matrix kernel's SPIR-V is passed through, and wgpu's Vulkan backend
// numbers a layout's bindings densely). Tensors a configuration does not use are bound to a
// 16-byte placeholder.
//
// Entries a caller's device buffers may get wrong are checked here, not trusted: a sequence whose
// query rows fall outside Q is skipped (its rows cannot be located, so nothing is written), and
// one whose keys fall outside K/V or exceed seq_kv keeps its query rows but is marked invalid
// (the kernel writes them as NaN).

// [batch + 1] row offsets of the packed Q/O and K/V.
@group(0) @binding(INDEX_BINDING) var<storage, read> cu_seqlens_q: array<u32>;
@group(0) @binding(INDEX_BINDING + 1u) var<storage, read> cu_seqlens_k: array<u32>;
// [batch] key counts.
@group(0) @binding(INDEX_BINDING + 2u) var<storage, read> kv_lens: array<u32>;

fn sequence(b: u32) -> Sequence {
    var seq = dense_sequence(b);
    if (VARLEN) {
        let q_start = cu_seqlens_q[b];
        let q_end = cu_seqlens_q[b + 1u];
        if (q_end < q_start || q_end > params.total_q || q_end - q_start > params.seq_q) {
            // Nothing to locate: zero rows.
            seq.seq_q = 0u;
            seq.valid = false;
            return seq;
        }
        seq.q_first = q_start;
        seq.seq_q = q_end - q_start;
        let k_start = cu_seqlens_k[b];
        let k_end = cu_seqlens_k[b + 1u];
        if (k_end < k_start || k_end > params.total_kv) {
            seq.valid = false;
            seq.seq_kv = 0u;
        } else {
            seq.kv_first = k_start;
            seq.seq_kv = k_end - k_start;
        }
    }
    if (KV_LENGTHS) {
        let len = kv_lens[b];
        if (len > seq.seq_kv || len > params.seq_kv) {
            seq.valid = false;
        }
        seq.seq_kv = min(len, seq.seq_kv);
    }
    // More keys than the problem's seq_kv: invalid, and cut to seq_kv, so that no kernel reads a
    // row of a tensor sized by it (the score bias, the mask) past its end.
    if (seq.seq_kv > params.seq_kv) {
        seq.valid = false;
        seq.seq_kv = params.seq_kv;
    }
    seq.causal_offset = i32(seq.seq_kv) - i32(seq.seq_q);
    return seq;
}
