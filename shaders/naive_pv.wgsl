// naive_pv.wgsl — standard attention, pass 3 of 3: O = P V from the materialized probabilities.
//
// What a workgroup owns: 16 query rows × 64 head_dim columns of O for one (batch, head) of this
// dispatch. What an invocation owns: one granule (4 consecutive columns) of one row, since 16-bit
// outputs are stored four to a granule. P and V stream through workgroup memory 16 keys at a time.

const ROWS: u32 = 16u;
const KEYS: u32 = 16u;
const COL_GRANULES: u32 = 16u;

@group(0) @binding(1) var<storage, read> scores: array<f32>;
@group(0) @binding(2) var<storage, read> v: array<Granule>;
@group(0) @binding(3) var<storage, read_write> o: array<Granule>;

var<workgroup> p_tile: array<array<f32, KEYS>, ROWS>;
var<workgroup> v_tile: array<array<vec4<f32>, COL_GRANULES>, KEYS>;

@compute @workgroup_size(COL_GRANULES, ROWS)
fn naive_pv(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let bh = params.bh_base + wg.z;
    let b = bh / params.num_heads;
    let h = bh % params.num_heads;
    let kv_h = h / params.group_size;
    let i = wg.y * ROWS + lid.y;
    let dg = wg.x * COL_GRANULES + lid.x;
    let dim_granules = params.head_dim / 4u;
    var acc = vec4<f32>(0.0);
    for (var j0 = 0u; j0 < params.seq_kv; j0 += KEYS) {
        // Invocation (x, y) fetches P[row y][key j0 + x] and V[key j0 + y][granule x].
        let pi = wg.y * ROWS + lid.y;
        let pj = j0 + lid.x;
        var p = 0.0;
        if (pi < params.seq_q && pj < params.seq_kv) {
            p = scores[(wg.z * params.seq_q + pi) * params.seq_kv + pj];
        }
        p_tile[lid.y][lid.x] = p;
        let vj = j0 + lid.y;
        var x = vec4<f32>(0.0);
        if (vj < params.seq_kv && dg < dim_granules) {
            x = unpack_granule(v[row_granule(params.v, b, vj, kv_h) + dg]);
        }
        v_tile[lid.y][lid.x] = x;
        workgroupBarrier();
        for (var j = 0u; j < KEYS; j++) {
            // A masked key's P is 0 and adds nothing, not 0·V: a NaN or ±∞ in V there would
            // make 0·∞ = NaN of the row.
            let p = p_tile[lid.y][j];
            acc = select(fma(vec4<f32>(p), v_tile[j][lid.x], acc), acc, p == 0.0);
        }
        workgroupBarrier();
    }
    if (i < params.seq_q && dg < dim_granules) {
        o[row_granule(params.o, b, i, h) + dg] = pack_granule(acc);
    }
}
