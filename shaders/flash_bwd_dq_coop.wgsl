// flash_bwd_dq_coop.wgsl — attention backward on cooperative matrices (tensor cores): dQ of one
// query tile, the products of flash_bwd_dq.wgsl on 16 × 16 × 16 f16 fragments.
//
//   S = Q Kᵀ,  dP = dO Vᵀ,  P = exp2(scale · S − LSE · log2 e),  dS = P ∘ (dP − D),
//   dQ += dS K  (times the softmax scale at the end)
//
// Shared machinery (bindings 2–7, staging, the element-wise step) is in flash_bwd_coop.wgsl; this
// file adds 8 dq (written, array of granules).
//
// What a workgroup owns: BLOCK_M query rows of one (sequence, head) and their dQ rows, written once
// (deterministic, no atomics): the grid (longest rows first under causal masking) and the key
// tiles it visits are flash_bwd_dq.wgsl's. It streams K and V in tiles of BLOCK_N keys through
// workgroup memory, as the forward (flash_fwd_coop.wgsl) does; Q and dO pass through the same
// memory at the start, BLOCK_N rows of each at a time.
//
// What a subgroup owns: 16 query rows: their Q and dO as HEAD_DIM_PAD / 16 A fragments each
// (loaded once) and their dQ as HEAD_DIM_PAD / 16 f32 accumulators, for the whole kernel; the
// invocations' rows' LSE and D in registers. Per block of 16 keys it forms S and dP, dS
// (flash_bwd_coop.wgsl's element-wise step, in registers where the layout allows it) and
// dQ += dS K.
//
// Why the sizes: Q, dO and dQ take 32 + 32 + 64 registers per invocation at head_dim 128, the
// forward's Q and O plus dO. The K/V tile and the subgroups' scratch blocks share 48 KiB: 32 keys
// beside 128 query rows at head_dim 128 (each K/V tile read by 128 rows, as in the forward), 64
// keys beside 128 rows at head_dim 64 (the plans: src/plan/backward/coop.rs).

const SUBGROUPS: u32 = BLOCK_M / 16u;
const N_BLOCKS: u32 = BLOCK_N / 16u;
const SCORES_TRANSPOSED: bool = false;
// dS only, and only on the workgroup-memory route, whose step takes a window per subgroup; the
// register route's subgroups take turns at one window (its positions, its output), which leaves
// room for 64-key tiles at head_dim 128.
const PROB_BLOCKS: u32 = select(1u, 0u, REGISTER_GRADIENT);
const SCORE_WINDOWS: u32 = select(SUBGROUPS, 1u, REGISTER_GRADIENT);
// Whether one batch of staging copies holds a whole K/V tile (8 granules per invocation for both
// shipped plans), which is then prefetched.
const PREFETCH_KV: bool = 2u * BLOCK_N * ROW_GRANULES <= STAGE_BATCH * WORKGROUP_SIZE;

// Staged rows: the K/V tile's K, then its V; at the start, BLOCK_N rows of Q and of dO at a time
// in their places.
const K_ROW: u32 = 0u;
const V_ROW: u32 = BLOCK_N;
var<workgroup> tiles: array<vec4<f16>, 2u * BLOCK_N * TILE_STRIDE>;

@group(0) @binding(8) var<storage, read_write> dq: array<Granule>;

@compute @workgroup_size(WORKGROUP_SIZE)
fn flash_bwd_dq(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let head = wg.y;
    let seq = sequence(wg.z);
    let hd = Heads(seq, head, head / params.group_size);
    let m0 = (params.num_q_tiles - 1u - wg.x) * BLOCK_M;
    let sg = li / SUBGROUP;
    let lane = li % SUBGROUP;
    if (m0 >= seq.seq_q) {
        return; // past this sequence's rows (a shorter sequence of a packed batch)
    }
    // Keys this tile can see: all, or under causal masking those up to its last row's diagonal,
    // and with a window from its first row's left edge.
    let kv_end = visible_key_end(seq, m0 + BLOCK_M);
    let first_kv_tile = visible_key_begin(seq, m0) / BLOCK_N;
    let num_kv_tiles = (kv_end + BLOCK_N - 1u) / BLOCK_N;

    var q_frag: array<coop_mat16x16<f16, A>, D_BLOCKS>;
    var do_frag: array<coop_mat16x16<f16, A>, D_BLOCKS>;
    for (var first = 0u; first < BLOCK_M; first += BLOCK_N) {
        workgroupBarrier();
        stage_pair(SRC_Q, SRC_DO, hd, m0 + first, BLOCK_N, K_ROW, li);
        workgroupBarrier();
        if ((16u * sg >= first) & (16u * sg < first + BLOCK_N)) {
            // @unroll
            for (var d = 0u; d < D_BLOCKS; d++) {
                let at = (16u * sg - first) * TILE_STRIDE + 4u * d;
                q_frag[d] = coopLoadT<coop_mat16x16<f16, A>>(&tiles[K_ROW * TILE_STRIDE + at], TILE_STRIDE);
                do_frag[d] = coopLoadT<coop_mat16x16<f16, A>>(&tiles[V_ROW * TILE_STRIDE + at], TILE_STRIDE);
            }
        }
    }
    let alibi2 = alibi_slope2(head);
    // This invocation's row of its subgroup's blocks; rows past the end get a P of 0.
    let row = m0 + 16u * sg + lane / 2u;
    let own_stats = query_row_stats(seq, head, row);
    let lse2 = own_stats.x;
    let d_row = own_stats.y;

    // The register route's rows: each component's query row's LSE · log2 e and D, the same for
    // every block of the kernel (read per row slot, then spread over the components).
    var positions = BlockPositions();
    var lse2_of_component = array<f32, COOP_COMPONENTS>();
    var d_of_component = array<f32, COOP_COMPONENTS>();
    for (var turn = 0u; REGISTER_GRADIENT && turn < SUBGROUPS / SCORE_WINDOWS; turn++) {
        workgroupBarrier(); // the window is free
        if (sg / SCORE_WINDOWS == turn) {
            positions = block_positions(sg % SCORE_WINDOWS, lane);
        }
    }
    if (REGISTER_GRADIENT) {
        var slot_stats = array<vec2<f32>, ROW_SLOTS>();
        // @unroll
        for (var i = 0u; i < COOP_COMPONENTS; i++) {
            let slot_row = m0 + 16u * sg + component_query(positions, i);
            slot_stats[(COMPONENT_SLOT_BITS >> (2u * i)) & 3u] = query_row_stats(seq, head, slot_row);
        }
        // @unroll
        for (var i = 0u; i < COOP_COMPONENTS; i++) {
            let stats = slot_stats[(COMPONENT_SLOT_BITS >> (2u * i)) & 3u];
            lse2_of_component[i] = stats.x;
            d_of_component[i] = stats.y;
        }
    }

    var dq_acc: array<coop_mat16x16<f32, C>, D_BLOCKS>;
    // @unroll
    for (var d = 0u; d < D_BLOCKS; d++) {
        dq_acc[d] = coop_mat16x16<f32, C>();
    }

    // With PREFETCH_KV the next tile's granules are loaded into registers before this tile's
    // products, so their latency is not waited for at a barrier.
    var next = StageBatch();
    if (PREFETCH_KV && first_kv_tile < num_kv_tiles) {
        next = fetch_batch(SRC_K, SRC_V, hd, first_kv_tile * BLOCK_N, BLOCK_N, 0u, li, true);
    }
    for (var t = first_kv_tile; t < num_kv_tiles; t++) {
        let n0 = t * BLOCK_N;
        // The previous tile (or Q and dO) is no longer read.
        workgroupBarrier();
        if (PREFETCH_KV) {
            store_batch(next, K_ROW, BLOCK_N, 0u, li);
        } else {
            stage_pair(SRC_K, SRC_V, hd, n0, BLOCK_N, K_ROW, li);
        }
        workgroupBarrier();
        if (PREFETCH_KV) {
            // Fetched unconditionally (StageBatch says why): after the last tile, from the end of
            // the sequence, of which nothing is kept (its loads read granule 0).
            let ahead = select(seq.seq_kv, n0 + BLOCK_N, t + 1u < num_kv_tiles);
            next = fetch_batch(SRC_K, SRC_V, hd, ahead, BLOCK_N, 0u, li, true);
        }
        let needs_mask = key_tile_needs_mask(seq, m0, BLOCK_M, n0, BLOCK_N);
        // @unroll
        for (var j = 0u; j < N_BLOCKS; j++) {
            // ---- S = Q Kᵀ and dP = dO Vᵀ of 16 keys ----
            var s = coop_mat16x16<f32, C>();
            var dp = coop_mat16x16<f32, C>();
            // @unroll
            for (var d = 0u; d < D_BLOCKS; d++) {
                // Kᵀ's and Vᵀ's blocks: [head_dim][key], the staged rows read column-major.
                let k_frag = coopLoad<coop_mat16x16<f16, B>>(&tiles[(K_ROW + 16u * j) * TILE_STRIDE + 4u * d], TILE_STRIDE);
                s = coopMultiplyAdd(q_frag[d], k_frag, s);
                let v_frag = coopLoad<coop_mat16x16<f16, B>>(&tiles[(V_ROW + 16u * j) * TILE_STRIDE + 4u * d], TILE_STRIDE);
                dp = coopMultiplyAdd(do_frag[d], v_frag, dp);
            }
            // ---- dS, then dQ += dS K ----
            var ds_frag = coop_mat16x16<f16, A>();
            if (REGISTER_GRADIENT) {
                let probs = probs_in_registers(s, positions, alibi2, m0 + 16u * sg, n0 + 16u * j, lse2_of_component, needs_mask, seq);
                ds_frag = gradient_operand(probs, dp, d_of_component);
            } else {
                block_gradient(sg, lane, s, dp, alibi2, row, n0 + 16u * j, lse2, d_row, needs_mask, seq);
                ds_frag = coopLoadT<coop_mat16x16<f16, A>>(&prob_scratch[prob_block(sg, 0u)], PROB_STRIDE);
            }
            // @unroll
            for (var d = 0u; d < D_BLOCKS; d++) {
                let k_frag = coopLoadT<coop_mat16x16<f16, B>>(&tiles[(K_ROW + 16u * j) * TILE_STRIDE + 4u * d], TILE_STRIDE);
                dq_acc[d] = coopMultiplyAdd(ds_frag, k_frag, dq_acc[d]);
            }
            if (!REGISTER_GRADIENT) {
                // Every read of dS is done before the next block writes it.
                subgroupBarrier();
            }
        }
    }

    // ---- epilogue: dQ = scale · Σ dS K, written once (zeros for rows that saw no key) ----
    let dq_at = row_granule(grad.dq, seq.b, seq.q_first + row, head);
    let scale = select(nan_f32(), grad.scale, seq.valid);
    // The subgroups take turns where they share windows.
    for (var turn = 0u; turn < SUBGROUPS / SCORE_WINDOWS; turn++) {
        if (SCORE_WINDOWS < SUBGROUPS) {
            workgroupBarrier(); // the window is free
        }
        if (sg / SCORE_WINDOWS == turn) {
            // @unroll
            for (var d = 0u; d < D_BLOCKS; d++) {
                let values = block_row_values(sg % SCORE_WINDOWS, lane, dq_acc[d]);
                let g = 4u * d + 2u * (lane % 2u);
                if (row < seq.seq_q) {
                    for (var c = 0u; c < 2u; c++) {
                        if (4u * (g + c) < params.head_dim) {
                            dq[dq_at + g + c] = pack_granule(values[c] * scale);
                        }
                    }
                }
            }
        }
    }
}
