// flash_bwd_dkdv_coop.wgsl — attention backward on cooperative matrices (tensor cores): dK and dV
// of one K/V tile, the products of flash_bwd_dkdv.wgsl on 16 × 16 × 16 f16 fragments, with the
// element-wise step through workgroup memory (devices whose fragment layout is not known; where it
// is, flash_bwd_dkdv_coop_split.wgsl runs instead).
//
//   Sᵀ = K Qᵀ,  dPᵀ = V dOᵀ,  Pᵀ = exp2(scale · Sᵀ − LSE · log2 e),  dSᵀ = Pᵀ ∘ (dPᵀ − D),
//   dV += Pᵀ dO,  dK += dSᵀ Q  (times the softmax scale at the end)
//
// Shared machinery (bindings 2–7, staging, the element-wise step) is in flash_bwd_coop.wgsl; this
// file adds 8 dk and 9 dv (written, arrays of granules).
//
// What a workgroup owns: BLOCK_N keys of one (sequence, K/V head) and their dK and dV rows, written
// once (no atomics): the grid, the loop over the query heads of a GQA group and over query tiles of
// BLOCK_M rows, and the tiles skipped under causal masking and windows are flash_bwd_dkdv.wgsl's.
// K and V of its keys are staged once, for the whole kernel; each query tile's Q and dO rows, and
// their LSE and D, are staged in turn (the next tile's Q and dO prefetched into registers during
// this tile's products where one batch of copies holds them: PREFETCH_QDO).
//
// What a subgroup owns: 16 of the keys and, of each query tile, the blocks of 16 queries of its
// query group (QUERY_GROUPS subgroups share each 16 keys, taking the tile's blocks in turn); its
// partial dK and dV of those keys as 2 · HEAD_DIM_PAD / 16 f32 accumulator fragments for the whole
// kernel, added to its group partners' through workgroup memory at the end. Per query tile it
// forms Sᵀ and dPᵀ of its keys against its J_BLOCKS query blocks (K and V fragments loaded once per
// head_dim block and used for each), then per query block Pᵀ and dSᵀ (flash_bwd_coop.wgsl's
// block_gradient, through workgroup memory) and the two output products.
//
// Why the sizes: the accumulators take 128 f32 registers per invocation at head_dim 128 (as
// FlashAttention-2's dK/dV kernel), the score fragments 16 per query block, so query tiles stay
// small (32 rows). K and V live in workgroup memory rather than in registers, beside the tile's Q
// and dO: 2 · (BLOCK_N + BLOCK_M) rows of head_dim, which 48 KiB holds at 32 keys and 32 queries
// for head_dim 128 and at 64 keys and 32 queries for head_dim 64. Query groups give each query
// tile more invocations to stage it and more subgroups to hide each other's waits, for one f32 and
// two f16 blocks per subgroup: two at head_dim 128 (the plans: src/plan/backward/coop.rs).

// KEY_BLOCKS blocks of 16 keys, each owned by QUERY_GROUPS subgroups (a host constant) that take
// the query tile's blocks of 16 queries in turn (J_BLOCKS each) and add their partial dK and dV
// at the end.
const KEY_BLOCKS: u32 = BLOCK_N / 16u;
const SUBGROUPS: u32 = KEY_BLOCKS * QUERY_GROUPS;
const M_BLOCKS: u32 = BLOCK_M / 16u;
const J_BLOCKS: u32 = M_BLOCKS / QUERY_GROUPS;
// Sᵀ is keys × queries; stored column-major it is [query][key] like the dQ kernel's S.
const SCORES_TRANSPOSED: bool = true;
// P (block 0) and dS (block 1).
const PROB_BLOCKS: u32 = 2u;
const SCORE_WINDOWS: u32 = SUBGROUPS;
// Whether one batch of staging copies holds a query tile's Q and dO (head_dim 64 with the shipped
// plan), which is then prefetched.
const PREFETCH_QDO: bool = 2u * BLOCK_M * ROW_GRANULES <= STAGE_BATCH * WORKGROUP_SIZE;

// Staged rows: the tile's K, its V, then the query tile's Q and dO.
const K_ROW: u32 = 0u;
const V_ROW: u32 = BLOCK_N;
const Q_ROW: u32 = 2u * BLOCK_N;
const DO_ROW: u32 = 2u * BLOCK_N + BLOCK_M;
var<workgroup> tiles: array<vec4<f16>, 2u * (BLOCK_N + BLOCK_M) * TILE_STRIDE>;
// LSE · log2 e (x) and D (y) of the query tile's rows.
var<workgroup> row_stats: array<vec2<f32>, BLOCK_M>;

@group(0) @binding(8) var<storage, read_write> dk: array<Granule>;
@group(0) @binding(9) var<storage, read_write> dv: array<Granule>;

@compute @workgroup_size(WORKGROUP_SIZE)
fn flash_bwd_dkdv(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let kv_head = wg.y;
    let seq = sequence(wg.z);
    let n0 = wg.x * BLOCK_N;
    let sg = li / SUBGROUP;
    let lane = li % SUBGROUP;
    if (n0 >= seq.seq_kv) {
        return; // past this sequence's keys (a shorter sequence of a packed batch)
    }
    // Query rows that see any of these keys, in tiles; one work item per (query head of the
    // group, query tile).
    let rows = rows_seeing(seq, n0, BLOCK_N);
    let first_tile = rows.x / BLOCK_M;
    let tiles_per_head = (rows.y + BLOCK_M - 1u) / BLOCK_M - first_tile;
    let num_items = params.group_size * tiles_per_head;

    let kv = Heads(seq, kv_head * params.group_size, kv_head);
    stage_pair(SRC_K, SRC_V, kv, n0, BLOCK_N, K_ROW, li);

    var dk_acc: array<coop_mat16x16<f32, C>, D_BLOCKS>;
    var dv_acc: array<coop_mat16x16<f32, C>, D_BLOCKS>;
    // @unroll
    for (var d = 0u; d < D_BLOCKS; d++) {
        dk_acc[d] = coop_mat16x16<f32, C>();
        dv_acc[d] = coop_mat16x16<f32, C>();
    }
    let my_keys = 16u * (sg % KEY_BLOCKS);
    let group = sg / KEY_BLOCKS;

    // With PREFETCH_QDO the next query tile's Q and dO are loaded into registers before this
    // tile's products, so their latency is not waited for at a barrier.
    var next = StageBatch();
    if (PREFETCH_QDO) {
        next = fetch_query_tile(item_tile(seq, kv_head, 0u, num_items, first_tile, tiles_per_head), li);
    }
    for (var it = 0u; it < num_items; it++) {
        let tile = item_tile(seq, kv_head, it, num_items, first_tile, tiles_per_head);
        let hd = tile.hd;
        let m0 = tile.m0;
        // The previous tile's rows are no longer read (and, the first time, K and V are staged).
        workgroupBarrier();
        if (PREFETCH_QDO) {
            store_batch(next, Q_ROW, BLOCK_M, 0u, li);
        } else {
            stage_pair(SRC_Q, SRC_DO, hd, m0, BLOCK_M, Q_ROW, li);
        }
        for (var i = li; i < BLOCK_M; i += WORKGROUP_SIZE) {
            row_stats[i] = query_row_stats(seq, hd.head, m0 + i);
        }
        workgroupBarrier();
        if (PREFETCH_QDO) {
            next = fetch_query_tile(item_tile(seq, kv_head, it + 1u, num_items, first_tile, tiles_per_head), li);
        }
        let needs_mask = m0 + BLOCK_M > seq.seq_q || key_tile_needs_mask(seq, m0, BLOCK_M, n0, BLOCK_N);
        let alibi2 = alibi_slope2(hd.head);

        // ---- Sᵀ = K Qᵀ and dPᵀ = V dOᵀ of the subgroup's keys against its query blocks ----
        var s_frag = array<coop_mat16x16<f32, C>, J_BLOCKS>();
        var dp_frag = array<coop_mat16x16<f32, C>, J_BLOCKS>();
        // @unroll
        for (var d = 0u; d < D_BLOCKS; d++) {
            let k_frag = coopLoadT<coop_mat16x16<f16, A>>(&tiles[(K_ROW + my_keys) * TILE_STRIDE + 4u * d], TILE_STRIDE);
            let v_frag = coopLoadT<coop_mat16x16<f16, A>>(&tiles[(V_ROW + my_keys) * TILE_STRIDE + 4u * d], TILE_STRIDE);
            // @unroll
            for (var jj = 0u; jj < J_BLOCKS; jj++) {
                let j = group + QUERY_GROUPS * jj;
                // Qᵀ's block: [head_dim][query], the staged rows read column-major.
                let q_frag = coopLoad<coop_mat16x16<f16, B>>(&tiles[(Q_ROW + 16u * j) * TILE_STRIDE + 4u * d], TILE_STRIDE);
                s_frag[jj] = coopMultiplyAdd(k_frag, q_frag, s_frag[jj]);
                let do_frag = coopLoad<coop_mat16x16<f16, B>>(&tiles[(DO_ROW + 16u * j) * TILE_STRIDE + 4u * d], TILE_STRIDE);
                dp_frag[jj] = coopMultiplyAdd(v_frag, do_frag, dp_frag[jj]);
            }
        }

        // ---- per query block: Pᵀ and dSᵀ, then dV += Pᵀ dO and dK += dSᵀ Q ----
        // @unroll
        for (var jj = 0u; jj < J_BLOCKS; jj++) {
            let j = group + QUERY_GROUPS * jj;
            let row = 16u * j + lane / 2u;
            let stats = row_stats[row];
            block_gradient(sg, lane, s_frag[jj], dp_frag[jj], alibi2, m0 + row, n0 + my_keys, stats.x, stats.y, needs_mask, seq);
            // The blocks are [query][key]: read column-major they are Pᵀ and dSᵀ.
            let p_frag = coopLoad<coop_mat16x16<f16, A>>(&prob_scratch[prob_block(sg, 0u)], PROB_STRIDE);
            let ds_frag = coopLoad<coop_mat16x16<f16, A>>(&prob_scratch[prob_block(sg, 1u)], PROB_STRIDE);
            // @unroll
            for (var d = 0u; d < D_BLOCKS; d++) {
                let do_frag = coopLoadT<coop_mat16x16<f16, B>>(&tiles[(DO_ROW + 16u * j) * TILE_STRIDE + 4u * d], TILE_STRIDE);
                dv_acc[d] = coopMultiplyAdd(p_frag, do_frag, dv_acc[d]);
                let q_frag = coopLoadT<coop_mat16x16<f16, B>>(&tiles[(Q_ROW + 16u * j) * TILE_STRIDE + 4u * d], TILE_STRIDE);
                dk_acc[d] = coopMultiplyAdd(ds_frag, q_frag, dk_acc[d]);
            }
            // Every read of this block's P and dS is done before the next block writes them.
            subgroupBarrier();
        }
    }

    // ---- epilogue: dK = scale · Σ dSᵀ Q, dV = Σ Pᵀ dO, the query groups' parts added, written once
    // by the first group ----
    let key = n0 + my_keys + lane / 2u;
    let dk_at = row_granule(grad.dk, seq.b, seq.kv_first + key, kv_head);
    let dv_at = row_granule(grad.dv, seq.b, seq.kv_first + key, kv_head);
    let mine = (lane / 2u) * SCORE_STRIDE + 2u * (lane % 2u);
    // @unroll
    for (var d = 0u; d < D_BLOCKS; d++) {
        let g = 4u * d + 2u * (lane % 2u);
        // dK's block, then dV's, through every subgroup's window.
        for (var out = 0u; out < 2u; out++) {
            workgroupBarrier();
            if (out == 0u) {
                coopStoreT(dk_acc[d], &score_scratch[sg * SCORE_BLOCK], SCORE_STRIDE);
            } else {
                coopStoreT(dv_acc[d], &score_scratch[sg * SCORE_BLOCK], SCORE_STRIDE);
            }
            workgroupBarrier();
            if ((group == 0u) & (key < seq.seq_kv)) {
                var sum = array<vec4<f32>, 2>(vec4<f32>(0.0), vec4<f32>(0.0));
                for (var q_group = 0u; q_group < QUERY_GROUPS; q_group++) {
                    let at = (sg + q_group * KEY_BLOCKS) * SCORE_BLOCK + mine;
                    sum[0] += score_scratch[at];
                    sum[1] += score_scratch[at + 1u];
                }
                for (var c = 0u; c < 2u; c++) {
                    if (4u * (g + c) < params.head_dim) {
                        if (out == 0u) {
                            dk[dk_at + g + c] = pack_granule(sum[c] * grad.scale);
                        } else {
                            dv[dv_at + g + c] = pack_granule(sum[c]);
                        }
                    }
                }
            }
        }
    }
}
