// flash_bwd_dkdv_coop_split.wgsl — attention backward on cooperative matrices: dK and dV of one K/V
// tile with the work of each 16 keys split between two subgroups, for devices whose fragment
// layout lets the element-wise step run in registers (REGISTER_GRADIENT; the host picks this file
// over flash_bwd_dkdv_coop.wgsl then).
//
//   Sᵀ = K Qᵀ,  Pᵀ = exp2(scale · Sᵀ − LSE · log2 e),  dV += Pᵀ dO        (the P subgroup)
//   dPᵀ = V dOᵀ,  dSᵀ = Pᵀ ∘ (dPᵀ − D),  dK += dSᵀ Q  (times the scale)     (the dS subgroup)
//
// Shared machinery (bindings 2–7, staging, the register route's positions) is in
// flash_bwd_coop.wgsl; this file adds 8 dk and 9 dv (written, arrays of granules).
//
// What a workgroup owns: BLOCK_N keys of one (sequence, K/V head) and their dK and dV rows, written
// once (no atomics); the grid, the loop over the query heads of a GQA group and over query tiles of
// BLOCK_M rows, and the tiles skipped under causal masking and windows are flash_bwd_dkdv.wgsl's.
// Each query tile's Q and dO rows (and their LSE and D) are staged in workgroup memory in turn,
// the next tile's loaded into registers during this tile's products.
//
// What a subgroup owns: 16 of the keys and one of two roles, for the whole kernel.
// * The P subgroup of key block b (subgroup b) holds K of its keys as HEAD_DIM_PAD / 16 A
//   fragments and their dV as as many f32 accumulators. Per query tile it forms Sᵀ against each
//   block of 16 queries, Pᵀ on the accumulators' registers (masked there), stores Pᵀ (f16; with a
//   soft-cap, Pᵀ times the cap's slope) for its partner, and after the tile's barrier adds Pᵀ dO
//   to dV.
// * The dS subgroup of key block b (subgroup KEY_BLOCKS + b) holds V as A fragments and dK as
//   accumulators. Per query tile it forms dPᵀ, and after the barrier loads its partner's Pᵀ as an A
//   operand, reads its components (laid out like the accumulator's, which the layout check
//   guarantees), forms dSᵀ on them and adds dSᵀ Q to dK. Its dS comes from the f16 Pᵀ, one
//   rounding more than the one-subgroup kernel's (relative 2⁻¹¹, below dS's own f16 rounding).
// Both roles do two products per query block, one before the barrier and one after.
//
// Why: the one-subgroup kernel keeps both accumulators (128 f32 registers per invocation at
// head_dim 128), so K and V must live in workgroup memory beside the query tile and only 32 keys
// share each staged tile. Split, a subgroup keeps one accumulator and one of K or V (96 registers
// at head_dim 128), K and V leave workgroup memory, and 64 keys share each tile: twice the products
// per staged byte and per barrier, the dQ kernel's shape. The price is Pᵀ passing through workgroup
// memory once (its f16 A operand, 512 bytes per 16 × 16 block) and one barrier per tile.
//
// The query-tile walk's staging and prefetch are written out here as in flash_bwd_dkdv_coop.wgsl
// (its work items are flash_bwd_common.wgsl's): shared through a function that takes the prefetch
// batch by pointer, this kernel lost what the prefetch gains on the H200 (BENCHMARKS.md, session 24).
//
// Sizes (the plan's block_m and block_n; its query groups are 2, the two roles): BLOCK_M a multiple
// of 32 (the exchange of Pᵀ is the shared f16 scratch, PROB_BLOCKS = M_BLOCKS / 2 per subgroup)
// and at most WORKGROUP_SIZE (one invocation per query row fetches its statistics), K and V staged
// through the query tile's rows min(BLOCK_M, BLOCK_N) at a time.

const KEY_BLOCKS: u32 = BLOCK_N / 16u;
const SUBGROUPS: u32 = 2u * KEY_BLOCKS;
const M_BLOCKS: u32 = BLOCK_M / 16u;
const SCORES_TRANSPOSED: bool = true;
// The exchange of Pᵀ: one f16 block per (key block, query block), KEY_BLOCKS · M_BLOCKS in all,
// which the shared scratch holds as SUBGROUPS · PROB_BLOCKS.
const PROB_BLOCKS: u32 = M_BLOCKS / 2u;
// One f32 window, which the subgroups take in turns (their positions, their outputs): with it a
// 64-row query tile fits beside 64 keys at head_dim 128.
const SCORE_WINDOWS: u32 = 1u;
// Whether one batch of staging copies holds a query tile's Q and dO, which is then prefetched.
const PREFETCH_QDO: bool = 2u * BLOCK_M * ROW_GRANULES <= STAGE_BATCH * WORKGROUP_SIZE;
// Rows of K and of V staged at a time, through the query tile's memory.
const KV_PASS_ROWS: u32 = min(BLOCK_M, BLOCK_N);
// One invocation per query row fetches its statistics (the host keeps plans so).
const_assert BLOCK_M <= WORKGROUP_SIZE;

// Staged rows: the query tile's Q, then its dO (at the start, KV_PASS_ROWS rows of K and of V).
const Q_ROW: u32 = 0u;
const DO_ROW: u32 = BLOCK_M;
var<workgroup> tiles: array<vec4<f16>, 2u * BLOCK_M * TILE_STRIDE>;
// LSE · log2 e (x) and D (y) of the query tile's rows.
var<workgroup> row_stats: array<vec2<f32>, BLOCK_M>;

@group(0) @binding(8) var<storage, read_write> dk: array<Granule>;
@group(0) @binding(9) var<storage, read_write> dv: array<Granule>;

// The query row whose statistics invocation `li` fetches for `tile`: none (a row past the
// sequence's end) for the invocations past BLOCK_M.
fn stats_row(tile: QueryTile, li: u32) -> u32 {
    return select(tile.hd.seq.seq_q, tile.m0 + li, li < BLOCK_M);
}

// Where Pᵀ of key block `b` and query block `j` is exchanged.
fn exchange_block(b: u32, j: u32) -> u32 {
    return (b * M_BLOCKS + j) * PROB_BLOCK;
}

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
    let block = sg % KEY_BLOCKS;
    let p_role = sg < KEY_BLOCKS;
    let my_keys = 16u * block;
    var positions = BlockPositions();
    for (var turn = 0u; turn < SUBGROUPS; turn++) {
        workgroupBarrier(); // the window is free
        if (sg == turn) {
            positions = block_positions(0u, lane);
        }
    }

    // K (the P subgroups) or V (the dS subgroups) of the subgroup's keys into fragments, staged
    // KV_PASS_ROWS keys at a time.
    let kv = Heads(seq, kv_head * params.group_size, kv_head);
    var kv_frag: array<coop_mat16x16<f16, A>, D_BLOCKS>;
    for (var first = 0u; first < BLOCK_N; first += KV_PASS_ROWS) {
        workgroupBarrier();
        stage_pair(SRC_K, SRC_V, kv, n0 + first, KV_PASS_ROWS, Q_ROW, li);
        workgroupBarrier();
        if ((my_keys >= first) & (my_keys < first + KV_PASS_ROWS)) {
            let at = select(KV_PASS_ROWS, 0u, p_role) + my_keys - first;
            // @unroll
            for (var d = 0u; d < D_BLOCKS; d++) {
                kv_frag[d] = coopLoadT<coop_mat16x16<f16, A>>(&tiles[at * TILE_STRIDE + 4u * d], TILE_STRIDE);
            }
        }
    }
    // dV (P subgroups) or the unscaled dK (dS subgroups).
    var acc: array<coop_mat16x16<f32, C>, D_BLOCKS>;
    // @unroll
    for (var d = 0u; d < D_BLOCKS; d++) {
        acc[d] = coop_mat16x16<f32, C>();
    }

    // The next tile's rows (PREFETCH_QDO) and the statistics of row li of it (every row has an
    // invocation: the host keeps BLOCK_M ≤ WORKGROUP_SIZE), loaded during this tile's products.
    let first = item_tile(seq, kv_head, 0u, num_items, first_tile, tiles_per_head);
    var next = StageBatch();
    if (PREFETCH_QDO) {
        next = fetch_query_tile(first, li);
    }
    var next_stats = fetch_row_stats(seq, first.hd.head, stats_row(first, li));
    for (var it = 0u; it < num_items; it++) {
        let tile = item_tile(seq, kv_head, it, num_items, first_tile, tiles_per_head);
        let hd = tile.hd;
        let m0 = tile.m0;
        // The previous tile's rows and exchange are no longer read (the first time: K and V).
        workgroupBarrier();
        if (PREFETCH_QDO) {
            store_batch(next, Q_ROW, BLOCK_M, 0u, li);
        } else {
            stage_pair(SRC_Q, SRC_DO, hd, m0, BLOCK_M, Q_ROW, li);
        }
        if (li < BLOCK_M) {
            row_stats[li] = row_stats_of(next_stats, m0 + li < seq.seq_q);
        }
        workgroupBarrier();
        let ahead = item_tile(seq, kv_head, it + 1u, num_items, first_tile, tiles_per_head);
        if (PREFETCH_QDO) {
            next = fetch_query_tile(ahead, li);
        }
        next_stats = fetch_row_stats(seq, ahead.hd.head, stats_row(ahead, li));
        let needs_mask = m0 + BLOCK_M > seq.seq_q || key_tile_needs_mask(seq, m0, BLOCK_M, n0, BLOCK_N);
        let alibi2 = alibi_slope2(hd.head);

        // ---- before the barrier: Sᵀ = K Qᵀ and Pᵀ (P), dPᵀ = V dOᵀ (dS), against every query block ----
        var scores = array<coop_mat16x16<f32, C>, M_BLOCKS>();
        let operand_row = select(DO_ROW, Q_ROW, p_role);
        // @unroll
        for (var d = 0u; d < D_BLOCKS; d++) {
            // @unroll
            for (var j = 0u; j < M_BLOCKS; j++) {
                // Qᵀ's (dOᵀ's) block: [head_dim][query], the staged rows read column-major.
                let b_frag = coopLoad<coop_mat16x16<f16, B>>(&tiles[(operand_row + 16u * j) * TILE_STRIDE + 4u * d], TILE_STRIDE);
                scores[j] = coopMultiplyAdd(kv_frag[d], b_frag, scores[j]);
            }
        }
        var probs = array<coop_mat16x16<f16, A>, M_BLOCKS>();
        if (p_role) {
            // @unroll
            for (var j = 0u; j < M_BLOCKS; j++) {
                var lse2 = array<f32, COOP_COMPONENTS>();
                // @unroll
                for (var i = 0u; i < COOP_COMPONENTS; i++) {
                    lse2[i] = row_stats[16u * j + component_query(positions, i)].x;
                }
                let block_probs = probs_in_registers(scores[j], positions, alibi2, m0 + 16u * j, n0 + my_keys, lse2, needs_mask, seq);
                probs[j] = operand_of(block_probs.p);
                // The partner's dSᵀ needs Pᵀ times the soft-cap's slope: that is what it gets.
                var exchanged = probs[j];
                if (SOFTCAP) {
                    var p_slope = array<f32, COOP_COMPONENTS>();
                    // @unroll
                    for (var i = 0u; i < COOP_COMPONENTS; i++) {
                        p_slope[i] = block_probs.p[i] * block_probs.slope[i];
                    }
                    exchanged = operand_of(p_slope);
                }
                coopStoreT(exchanged, &prob_scratch[exchange_block(block, j)], PROB_STRIDE);
            }
        }
        // Pᵀ is in the exchange.
        workgroupBarrier();

        // ---- after the barrier: dV += Pᵀ dO (P), dSᵀ and dK += dSᵀ Q (dS) ----
        if (!p_role) {
            // @unroll
            for (var j = 0u; j < M_BLOCKS; j++) {
                let p_h = coop_elements_a(coopLoadT<coop_mat16x16<f16, A>>(&prob_scratch[exchange_block(block, j)], PROB_STRIDE));
                // The exchanged Pᵀ already carries the soft-cap's slope.
                var exchanged = BlockProbs();
                var d = array<f32, COOP_COMPONENTS>();
                // @unroll
                for (var i = 0u; i < COOP_COMPONENTS; i++) {
                    exchanged.p[i] = f32(p_h[i]);
                    exchanged.slope[i] = 1.0;
                    d[i] = row_stats[16u * j + component_query(positions, i)].y;
                }
                probs[j] = gradient_operand(exchanged, scores[j], d);
            }
        }
        let out_row = select(Q_ROW, DO_ROW, p_role);
        // @unroll
        for (var j = 0u; j < M_BLOCKS; j++) {
            // @unroll
            for (var d = 0u; d < D_BLOCKS; d++) {
                let b_frag = coopLoadT<coop_mat16x16<f16, B>>(&tiles[(out_row + 16u * j) * TILE_STRIDE + 4u * d], TILE_STRIDE);
                acc[d] = coopMultiplyAdd(probs[j], b_frag, acc[d]);
            }
        }
    }

    // ---- epilogue: dV (P subgroups), dK = scale · Σ dSᵀ Q (dS subgroups), written once ----
    let key = n0 + my_keys + lane / 2u;
    let out_at = select(row_granule(grad.dk, seq.b, seq.kv_first + key, kv_head), row_granule(grad.dv, seq.b, seq.kv_first + key, kv_head), p_role);
    let scale = select(grad.scale, 1.0, p_role);
    for (var turn = 0u; turn < SUBGROUPS; turn++) {
        workgroupBarrier(); // the window is free
        if (sg == turn) {
            // @unroll
            for (var d = 0u; d < D_BLOCKS; d++) {
                let values = block_row_values(0u, lane, acc[d]);
                let g = 4u * d + 2u * (lane % 2u);
                if (key < seq.seq_kv) {
                    for (var c = 0u; c < 2u; c++) {
                        if (4u * (g + c) < params.head_dim) {
                            if (p_role) {
                                dv[out_at + g + c] = pack_granule(values[c]);
                            } else {
                                dk[out_at + g + c] = pack_granule(values[c] * scale);
                            }
                        }
                    }
                }
            }
        }
    }
}
