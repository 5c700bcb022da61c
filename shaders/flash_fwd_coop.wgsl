// flash_fwd_coop.wgsl — exact attention forward on the GPU's matrix units (tensor cores), through
// wgpu's cooperative matrices: QKᵀ and PV as 16×16×16 f16 products with f32 accumulators, the
// online softmax in f32 on the invocations.
//
// Bindings as flash_fwd.wgsl: 0 params, 1 q, 2 k, 3 v (here arrays of vec4<f16>, the 8-byte
// granules every kernel indexes), 4 o (f16 granules), 5 the LSE bits.
//
// What a workgroup owns: one tile of BLOCK_M query rows of one (batch, head), like the register
// kernel (same grid, same longest-first order, same causal tile skipping). It streams K/V in tiles
// of BLOCK_N keys through workgroup memory: every invocation copies whole granules (coalesced
// 8-byte loads, 8-byte stores), and all subgroups then read their fragments from the one copy, so
// the taller the query tile, the less often K and V cross from L2 (128 or 256 rows on the H200).
// With one K/V buffer (KV_BUFFERS = 1) a tile costs two workgroup barriers ("the previous tile is
// no longer read", "this tile is staged"); with two, one (the next tile is copied into the other
// buffer after this one's products). With PREFETCH_KV the next tile's granules are loaded into
// registers before this tile's products, so their latency is not waited for at a barrier.
//
// What a subgroup owns: 16 query rows. It holds their Q as HEAD_DIM_PAD/16 cooperative A
// fragments (loaded once) and their output as HEAD_DIM_PAD/16 f32 accumulator fragments for the
// whole kernel, and 16 rows of scores (f32) and of P (f16) in workgroup memory — the only way to
// reach single elements of a cooperative matrix. Those rows are the subgroup's alone, so between
// its product, its softmax and its next product only the subgroup synchronises
// (subgroupBarrier, made to cover workgroup memory in src/spirv_coherence.rs).
//
// What an invocation owns in the softmax: half a score row (two invocations per row, 32 per
// subgroup, a size the host checks), read once into registers as vec4s. It applies scale and
// mask, keeps the running max and sum, and writes its half of P.
//
// Why rescaling is rare: the output lives in accumulator fragments, which cannot be scaled row by
// row, so rescaling means a round trip through workgroup memory. Following FlashAttention-4, a
// row's reference max m_used only moves when a tile's max exceeds it by more than
// RESCALE_THRESHOLD (log2 units); until then P = exp2(s − m_used) ≤ 2^8, which f16 holds, and O and
// l stay consistent because both use the same m_used. The result is exact either way. The decision
// is the subgroup's (subgroupAny): cooperative operations need control flow that is uniform over
// the subgroup, which the Vulkan spec asks and the host's SPIR-V build relies on.
//
// Why the sizes: 16 × 16 × 16 f16 → f32 is the configuration NVIDIA and AMD expose. Staged rows
// are padded by one 16-byte pair of granules, so that the eight 16-byte rows a fragment load reads
// at once start in different banks (a row is HEAD_DIM_PAD/2 + 4 words, ≡ 4 mod 8); score rows by
// one vec4, so that the 16-byte reads of 8 consecutive rows by 8 invocations hit different banks.
// Q is staged once through the K/V buffers, 2·KV_BUFFERS·BLOCK_N rows at a time. Tile sizes and
// the streaming options come from the host's plans, fitted to the workgroup memory (48 KiB on
// NVIDIA) and measured (COOP_PLANS in src/select.rs).

const SUBGROUP: u32 = 32u;
const SUBGROUPS: u32 = BLOCK_M / 16u;
const WORKGROUP_SIZE: u32 = SUBGROUPS * SUBGROUP;
const D_BLOCKS: u32 = HEAD_DIM_PAD / 16u;
const N_BLOCKS: u32 = BLOCK_N / 16u;
// Granules (vec4<f16>) per row of Q, K or V, and per staged row in workgroup memory.
const ROW_GRANULES: u32 = HEAD_DIM_PAD / 4u;
const TILE_STRIDE: u32 = ROW_GRANULES + 2u;
// Granules of one K/V tile (K rows, then V rows), and how many each invocation copies.
const KV_GRANULES: u32 = 2u * BLOCK_N * ROW_GRANULES;
const KV_COPIES: u32 = (KV_GRANULES + WORKGROUP_SIZE - 1u) / WORKGROUP_SIZE;
// Query rows staged at a time to load Q's fragments: as many as the K/V tile's memory holds.
// (Rows staged past BLOCK_M in the last pass are never loaded.)
const Q_PASS_ROWS: u32 = min(BLOCK_M, 2u * KV_BUFFERS * BLOCK_N);
const Q_PASSES: u32 = (BLOCK_M + Q_PASS_ROWS - 1u) / Q_PASS_ROWS;
// vec4s per row of a subgroup's scores (f32) and of its P (f16).
const S_STRIDE: u32 = BLOCK_N / 4u + 1u;
const P_STRIDE: u32 = BLOCK_N / 4u + 2u;
// vec4s of a score row each of its two invocations handles.
const HALF_VECS: u32 = BLOCK_N / 8u;
const RESCALE_THRESHOLD: f32 = 8.0;

// KV_BUFFERS buffers of KV_TILE_VECS: rows 0..BLOCK_N the tile's K, rows BLOCK_N..2·BLOCK_N its V.
// Q passes through at the start.
const KV_TILE_VECS: u32 = 2u * BLOCK_N * TILE_STRIDE;
var<workgroup> kv_tile: array<vec4<f16>, KV_BUFFERS * KV_TILE_VECS>;
// Per subgroup: 16 rows of scores (also a 16 × 16 window of the output when it is rescaled or
// written out) and 16 rows of P.
var<workgroup> scores: array<vec4<f32>, SUBGROUPS * 16u * S_STRIDE>;
var<workgroup> probs: array<vec4<f16>, SUBGROUPS * 16u * P_STRIDE>;
// Every workgroup variable is a multiple of 16 bytes: NVIDIA's driver lays them out in an order of
// its own, and cooperative loads and stores need 16-byte-aligned addresses (a 4-byte variable
// once shifted every array after it and the products silently read shifted rows; BENCHMARKS.md).

@group(0) @binding(1) var<storage, read> q: array<vec4<f16>>;
@group(0) @binding(2) var<storage, read> k: array<vec4<f16>>;
@group(0) @binding(3) var<storage, read> v: array<vec4<f16>>;
@group(0) @binding(4) var<storage, read_write> o: array<Granule>;
@group(0) @binding(5) var<storage, read_write> lse: array<u32>;

// Granule `g` of the K/V tile whose first key is `n0` (granules of K rows first, then of V rows);
// zero past the sequence, past head_dim and past the tile.
fn kv_granule(g: u32, b: u32, h: u32, n0: u32) -> vec4<f16> {
    let staged_row = g / ROW_GRANULES;
    let c = g % ROW_GRANULES;
    let is_v = staged_row >= BLOCK_N;
    let key = n0 + staged_row - select(0u, BLOCK_N, is_v);
    if (g >= KV_GRANULES || key >= params.seq_kv || 4u * c >= params.head_dim) {
        return vec4<f16>(0.0);
    }
    if (is_v) {
        return v[row_granule(params.v, b, key, h) + c];
    }
    return k[row_granule(params.k, b, key, h) + c];
}

// Where granule `g` of a K/V tile goes in kv_tile, from the buffer's first vec4 `base`.
fn kv_slot(base: u32, g: u32) -> u32 {
    return base + (g / ROW_GRANULES) * TILE_STRIDE + g % ROW_GRANULES;
}

// This invocation's share of the K/V tile at key n0, loaded into registers.
fn load_kv_tile(regs: ptr<function, array<vec4<f16>, KV_COPIES>>, li: u32, b: u32, h: u32, n0: u32) {
    // @unroll
    for (var i = 0u; i < KV_COPIES; i++) {
        (*regs)[i] = kv_granule(li + i * WORKGROUP_SIZE, b, h, n0);
    }
}

// ... and stored into the buffer at `base`.
fn store_kv_tile(regs: ptr<function, array<vec4<f16>, KV_COPIES>>, li: u32, base: u32) {
    // @unroll
    for (var i = 0u; i < KV_COPIES; i++) {
        let g = li + i * WORKGROUP_SIZE;
        if (g < KV_GRANULES) {
            kv_tile[kv_slot(base, g)] = (*regs)[i];
        }
    }
}

// This invocation's share of the K/V tile at key n0, copied straight into the buffer at `base`.
fn copy_kv_tile(li: u32, b: u32, h: u32, n0: u32, base: u32) {
    // @unroll
    for (var i = 0u; i < KV_COPIES; i++) {
        let g = li + i * WORKGROUP_SIZE;
        if (g < KV_GRANULES) {
            kv_tile[kv_slot(base, g)] = kv_granule(g, b, h, n0);
        }
    }
}

@compute @workgroup_size(WORKGROUP_SIZE)
fn flash_fwd_coop(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let head = wg.y;
    let b = wg.z;
    let kv_head = head / params.group_size;
    let m0 = (params.num_q_tiles - 1u - wg.x) * BLOCK_M;
    // Subgroups as consecutive runs of 32 local invocations: what NVIDIA's driver does, not
    // what Vulkan promises (subgroup_id / subgroup_invocation_id would not assume it; not yet
    // measured on the H200, so not yet changed).
    let sg = li / SUBGROUP;
    let lane = li % SUBGROUP;
    // This invocation's row within its subgroup's 16, and which half of the score columns.
    let r = lane % 16u;
    let half_n = lane / 16u;
    let row = m0 + sg * 16u + r;
    let my_scores = sg * 16u * S_STRIDE;
    let my_probs = sg * 16u * P_STRIDE;

    var kv_end = params.seq_kv;
    if (params.causal != 0u) {
        kv_end = u32(clamp(i32(m0 + BLOCK_M) + params.causal_offset, 0, i32(params.seq_kv)));
    }
    let num_kv_tiles = (kv_end + BLOCK_N - 1u) / BLOCK_N;
    // The first key column this row may not see (sequence end or causal diagonal).
    var row_kv_end = params.seq_kv;
    if (params.causal != 0u) {
        row_kv_end = u32(clamp(i32(row) + params.causal_offset + 1, 0, i32(params.seq_kv)));
    }

    // Q fragments, once, staged through the K/V tile's memory, Q_PASS_ROWS rows at a time.
    var q_frag: array<coop_mat16x16<f16, A>, D_BLOCKS>;
    for (var q_pass = 0u; q_pass < Q_PASSES; q_pass++) {
        let first = q_pass * Q_PASS_ROWS;
        workgroupBarrier(); // the previous pass's rows are loaded
        for (var g = li; g < Q_PASS_ROWS * ROW_GRANULES; g += WORKGROUP_SIZE) {
            let q_row = m0 + first + g / ROW_GRANULES;
            let c = g % ROW_GRANULES;
            var x = vec4<f16>(0.0);
            if (q_row < params.seq_q && 4u * c < params.head_dim) {
                x = q[row_granule(params.q, b, q_row, head) + c];
            }
            kv_tile[(g / ROW_GRANULES) * TILE_STRIDE + c] = x;
        }
        workgroupBarrier();
        if (sg * 16u / Q_PASS_ROWS == q_pass) { // uniform over the subgroup
            // @unroll
            for (var d = 0u; d < D_BLOCKS; d++) {
                q_frag[d] = coopLoadT<coop_mat16x16<f16, A>>(&kv_tile[(sg * 16u - first) * TILE_STRIDE + 4u * d], TILE_STRIDE);
            }
        }
    }

    var o_frag: array<coop_mat16x16<f32, C>, D_BLOCKS>;
    // @unroll
    for (var d = 0u; d < D_BLOCKS; d++) {
        o_frag[d] = coop_mat16x16<f32, C>();
    }
    var m_used = NEG_BIG; // this row's reference max (same in both invocations of the row)
    var l_part = 0.0; // sum of exp2(s − m_used) over this invocation's columns

    // K/V tiles: KV_BUFFERS == 1 frees the one buffer, fills it and waits (two barriers a
    // tile); KV_BUFFERS == 2 fills the other buffer with the next tile after computing this one
    // (one barrier a tile, and the copy overlaps other subgroups' products). With PREFETCH_KV the
    // granules of the next tile are loaded into registers before this tile's products.
    var next_kv: array<vec4<f16>, KV_COPIES>;
    if (KV_BUFFERS == 2u) {
        workgroupBarrier(); // Q's fragments are loaded
        copy_kv_tile(li, b, kv_head, 0u, 0u);
        workgroupBarrier();
    } else if (PREFETCH_KV) {
        load_kv_tile(&next_kv, li, b, kv_head, 0u);
    }
    for (var t = 0u; t < num_kv_tiles; t++) {
        let n0 = t * BLOCK_N;
        let k_base = (t % KV_BUFFERS) * KV_TILE_VECS;
        let v_base = k_base + BLOCK_N * TILE_STRIDE;
        let has_next = t + 1u < num_kv_tiles;
        if (KV_BUFFERS == 1u) {
            workgroupBarrier(); // no subgroup reads the previous tile (or Q) any more
            if (PREFETCH_KV) {
                store_kv_tile(&next_kv, li, 0u);
            } else {
                copy_kv_tile(li, b, kv_head, n0, 0u);
            }
            workgroupBarrier(); // this tile staged
        }
        if (PREFETCH_KV && has_next) {
            load_kv_tile(&next_kv, li, b, kv_head, n0 + BLOCK_N);
        }

        // ---- S = Q Kᵀ into this subgroup's score rows ----
        // head_dim blocks outside, key blocks inside: N_BLOCKS independent accumulators keep
        // the matrix units busy instead of one chain of dependent multiply-adds. Kᵀ is a
        // column-major B: its element (d, n) is K row n, column d.
        var s_frag: array<coop_mat16x16<f32, C>, N_BLOCKS>;
        // @unroll
        for (var j = 0u; j < N_BLOCKS; j++) {
            s_frag[j] = coop_mat16x16<f32, C>();
        }
        // @unroll
        for (var d = 0u; d < D_BLOCKS; d++) {
            // @unroll
            for (var j = 0u; j < N_BLOCKS; j++) {
                let k_frag = coopLoad<coop_mat16x16<f16, B>>(&kv_tile[k_base + 16u * j * TILE_STRIDE + 4u * d], TILE_STRIDE);
                s_frag[j] = coopMultiplyAdd(q_frag[d], k_frag, s_frag[j]);
            }
        }
        // @unroll
        for (var j = 0u; j < N_BLOCKS; j++) {
            coopStoreT(s_frag[j], &scores[my_scores + 4u * j], S_STRIDE);
        }
        subgroupBarrier(); // the scores visible to the subgroup's invocations

        // ---- online softmax on this invocation's half row, held in registers ----
        // The scale is applied as the scores are read, not written back.
        let needs_mask = n0 + BLOCK_N > params.seq_kv
            || (params.causal != 0u && i32(n0 + BLOCK_N) > i32(m0) + params.causal_offset + 1);
        let first_col = n0 + half_n * 4u * HALF_VECS;
        let my_row = my_scores + r * S_STRIDE + half_n * HALF_VECS;
        var x: array<vec4<f32>, HALF_VECS>;
        var tile_max = NEG_BIG;
        // @unroll
        for (var i = 0u; i < HALF_VECS; i++) {
            x[i] = scores[my_row + i] * params.scale;
            if (needs_mask) {
                let cols = vec4<u32>(first_col + 4u * i) + vec4<u32>(0u, 1u, 2u, 3u);
                x[i] = select(vec4<f32>(NEG_BIG), x[i], cols < vec4<u32>(row_kv_end));
            }
            tile_max = max(tile_max, max(max(x[i].x, x[i].y), max(x[i].z, x[i].w)));
        }
        tile_max = max(tile_max, subgroupShuffleXor(tile_max, 16u));
        // Move the reference max only when the tile's max is far above it (or on the first tile,
        // when the output is still zero and moving it costs nothing).
        var m_new = m_used;
        if (tile_max > m_used + RESCALE_THRESHOLD || t == 0u) {
            m_new = max(m_used, tile_max);
        }
        let alpha = exp2(m_used - m_new);
        let moved = t > 0u && m_new != m_used;
        m_used = m_new;
        l_part *= alpha;
        // @unroll
        for (var i = 0u; i < HALF_VECS; i++) {
            // Masked scores give exactly 0, also while the row has seen no key (m_used = NEG_BIG).
            let p = select(vec4<f32>(0.0), exp2(x[i] - m_used), x[i] > vec4<f32>(NEG_BIG));
            l_part += p.x + p.y + p.z + p.w;
            probs[my_probs + r * P_STRIDE + half_n * HALF_VECS + i] = vec4<f16>(p);
        }

        // ---- rare: rescale the output rows whose reference max moved ----
        if (subgroupAny(moved)) {
            // @unroll
            for (var d = 0u; d < D_BLOCKS; d++) {
                subgroupBarrier(); // the score window is free (softmax reads, previous fragment)
                coopStoreT(o_frag[d], &scores[my_scores], S_STRIDE);
                subgroupBarrier();
                let at = my_scores + r * S_STRIDE + 2u * half_n;
                scores[at] *= alpha;
                scores[at + 1u] *= alpha;
                subgroupBarrier();
                o_frag[d] = coopLoadT<coop_mat16x16<f32, C>>(&scores[my_scores], S_STRIDE);
            }
        }
        subgroupBarrier(); // P visible to the subgroup's cooperative loads

        // ---- O += P V ----
        // @unroll
        for (var j = 0u; j < N_BLOCKS; j++) {
            let p_frag = coopLoadT<coop_mat16x16<f16, A>>(&probs[my_probs + 4u * j], P_STRIDE);
            // @unroll
            for (var d = 0u; d < D_BLOCKS; d++) {
                let v_frag = coopLoadT<coop_mat16x16<f16, B>>(&kv_tile[v_base + 16u * j * TILE_STRIDE + 4u * d], TILE_STRIDE);
                o_frag[d] = coopMultiplyAdd(p_frag, v_frag, o_frag[d]);
            }
        }

        if (KV_BUFFERS == 2u) {
            // The other buffer was last read by the previous tile's products, which every
            // subgroup finished before the previous iteration's closing barrier.
            let other = ((t + 1u) % 2u) * KV_TILE_VECS;
            if (has_next) {
                if (PREFETCH_KV) {
                    store_kv_tile(&next_kv, li, other);
                } else {
                    copy_kv_tile(li, b, kv_head, n0 + BLOCK_N, other);
                }
            }
            workgroupBarrier(); // the next tile staged; this one no longer read
        }
    }

    // ---- epilogue: O / l through the subgroup's score rows, 16 columns at a time; LSE ----
    let l = l_part + subgroupShuffleXor(l_part, 16u);
    let inv_l = select(0.0, 1.0 / l, l > 0.0);
    let out_row = row_granule(params.o, b, row, head);
    // @unroll
    for (var d = 0u; d < D_BLOCKS; d++) {
        subgroupBarrier();
        coopStoreT(o_frag[d], &scores[my_scores], S_STRIDE);
        subgroupBarrier();
        // Each invocation writes two granules (8 columns) of its row.
        for (var g = 0u; g < 2u; g++) {
            let col = 16u * d + 8u * half_n + 4u * g;
            if (row < params.seq_q && col < params.head_dim) {
                o[out_row + col / 4u] = pack_granule(scores[my_scores + r * S_STRIDE + 2u * half_n + g] * inv_l);
            }
        }
    }
    if (half_n == 0u && row < params.seq_q && params.write_lse != 0u) {
        var bits = LSE_EMPTY_BITS;
        if (l > 0.0) {
            bits = bitcast<u32>((m_used + log2(l)) * 0.6931471805599453);
        }
        lse[lse_index(b, head, row)] = bits;
    }
}
