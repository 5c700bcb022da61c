// naive_scores.wgsl — standard attention, pass 1 of 3: the full score matrix
//   S[bh][i][j] = scale · q_i · k_j
// written to memory (seq_q × seq_kv f32 per head). This, naive_softmax.wgsl and naive_pv.wgsl are
// the textbook algorithm that FlashAttention avoids: the GPU baseline for tests and benchmarks.
//
// What a workgroup owns: a 16 × 16 block of S for one (batch, head) of this dispatch's batch of
// heads (z = bh − bh_base). What an invocation owns: one score. Q and K rows are staged through
// workgroup memory 16 head_dim columns at a time (the classic shared-memory tiled product):
// simple, and fast enough that the baseline is a fair one.

const TILE: u32 = 16u;

@group(0) @binding(1) var<storage, read> q: array<Granule>;
@group(0) @binding(2) var<storage, read> k: array<Granule>;
@group(0) @binding(3) var<storage, read_write> scores: array<f32>;

var<workgroup> q_tile: array<array<f32, TILE>, TILE>;
var<workgroup> k_tile: array<array<f32, TILE>, TILE>;

@compute @workgroup_size(TILE, TILE)
fn naive_scores(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let bh = params.bh_base + wg.z;
    let b = bh / params.num_heads;
    let h = bh % params.num_heads;
    let kv_h = h / params.group_size;
    let i = wg.y * TILE + lid.y;
    let j = wg.x * TILE + lid.x;
    var dot = 0.0;
    for (var d0 = 0u; d0 < params.head_dim; d0 += TILE) {
        // 64 invocations fetch the Q granules, the next 64 the K granules.
        let g = li % 64u;
        let row = g / 4u;
        let col = 4u * (g % 4u);
        if (li < 64u) {
            let r = wg.y * TILE + row;
            var x = vec4<f32>(0.0);
            if (r < params.seq_q && d0 + col < params.head_dim) {
                x = unpack_granule(q[row_granule(params.q, b, r, h) + (d0 + col) / 4u]);
            }
            for (var c = 0u; c < 4u; c++) { q_tile[row][col + c] = x[c]; }
        } else if (li < 128u) {
            let r = wg.x * TILE + row;
            var x = vec4<f32>(0.0);
            if (r < params.seq_kv && d0 + col < params.head_dim) {
                x = unpack_granule(k[row_granule(params.k, b, r, kv_h) + (d0 + col) / 4u]);
            }
            for (var c = 0u; c < 4u; c++) { k_tile[row][col + c] = x[c]; }
        }
        workgroupBarrier();
        for (var d = 0u; d < TILE; d++) {
            dot = fma(q_tile[lid.y][d], k_tile[lid.x][d], dot);
        }
        workgroupBarrier();
    }
    if (i < params.seq_q && j < params.seq_kv) {
        scores[(wg.z * params.seq_q + i) * params.seq_kv + j] = dot * params.scale;
    }
}
