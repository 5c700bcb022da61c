// append_kv.wgsl — writes the new tokens' K and V rows into a K/V cache (contiguous, or paged
// through a page table), where the decode step that follows reads them (src/problem/cache.rs).
//
// New token t of sequence b lands at key position kv_len(b) − seq_q + t: the counts (kv_lens[b],
// or seq_kv for every sequence) already include the new tokens, as the attention call that
// follows expects. A position below 0 (a count smaller than seq_q) or a page past the pool is not
// written: the host checks both on its own slices; on the caller's buffers this keeps every write
// inside the cache.
//
// What a workgroup owns: one new token's row of one K/V head (grid: (seq_q, num_kv_heads,
// batch)); what an invocation owns: granule g, g + WG, ... of that row, in K and in V. The copy is
// bound by memory with no data shared, so no workgroup memory; WG = 64 covers a 256-element row.
//
// Bindings: params (common.wgsl's Params: q → the new K, o → the new V, both
// [batch, seq_q, num_kv_heads, head_dim] by their strides; k, v → the caches; page_size,
// pages_per_seq, num_pages as the decode kernel reads them), new_k, new_v (read), k_cache,
// v_cache (written), page_table, kv_lens (read; 16-byte placeholders when unused).

const WG: u32 = 64u;

@group(0) @binding(1) var<storage, read> new_k: array<Granule>;
@group(0) @binding(2) var<storage, read> new_v: array<Granule>;
@group(0) @binding(3) var<storage, read_write> k_cache: array<Granule>;
@group(0) @binding(4) var<storage, read_write> v_cache: array<Granule>;
@group(0) @binding(5) var<storage, read> page_table: array<u32>;
@group(0) @binding(6) var<storage, read> kv_lens: array<u32>;

@compute @workgroup_size(WG)
fn append_kv(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let t = wg.x;
    let kv_head = wg.y;
    let b = wg.z;
    let seq_len = select(params.seq_kv, kv_lens[b], KV_LENGTHS);
    let position = i32(seq_len) - i32(params.seq_q) + i32(t);
    if (position < 0 || u32(position) >= params.seq_kv) {
        return;
    }
    let key = u32(position);
    var cache_batch = b;
    var row = key;
    if (PAGED) {
        let page = page_table[b * params.pages_per_seq + key / params.page_size];
        if (page >= params.num_pages) {
            return;
        }
        cache_batch = page;
        row = key % params.page_size;
    }
    let granules = params.head_dim / 4u;
    let from_k = row_granule(params.q, b, t, kv_head);
    let from_v = row_granule(params.o, b, t, kv_head);
    let to_k = row_granule(params.k, cache_batch, row, kv_head);
    let to_v = row_granule(params.v, cache_batch, row, kv_head);
    for (var g = li; g < granules; g += WG) {
        k_cache[to_k + g] = new_k[from_k + g];
        v_cache[to_v + g] = new_v[from_v + g];
    }
}
