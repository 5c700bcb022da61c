// flash_bwd_dq.wgsl — attention backward, FlashAttention-2 style: dQ of one query tile.
//
//   P = exp(scale · Q Kᵀ − LSE) [causal mask],   dP = dO Vᵀ,   dS = P ∘ (dP − D),   dQ = scale · dS K
//
// with D = rowsum(dO ∘ O) from flash_bwd_pre.wgsl. dK and dV come from flash_bwd_dkdv.wgsl, which
// is parallel over K/V tiles; dQ needs a sum over keys instead, so it gets its own pass parallel
// over query tiles that recomputes S and dP. That costs two more products than a fused kernel, but
// a fused one would have to add partial dQ tiles from many workgroups: WGSL has no float atomics,
// and a partial-sum buffer would be O(seq²). This way every output is written once, by one
// workgroup, and the result is deterministic. Shared machinery (bindings 2–7, staging, the
// products) is in flash_bwd_stage.wgsl; this file adds 8 dq (written, array of granules). With
// WRITES_D_BIAS (score_bias_grad_bound.wgsl: a score bias per batch entry and head whose gradient
// the call asks for) it also writes P ∘ (dP − D), the bias's gradient, at 9 d_bias: each of its
// elements is one of this kernel's, so it costs stores, not products; the elements of key tiles
// the masks let it skip are filled with zeros.
//
// What a workgroup owns: BLOCK_M query rows of one (sequence, head) and their dQ rows, accumulated in
// registers and written once. The grid is (num_q_tiles, num_heads, batch), x reversed so that under
// causal masking the tiles with the most keys start first. The workgroup streams the keys in tiles
// of BLOCK_N; under causal masking the key tiles wholly above the diagonal are skipped, and only
// tiles crossing the diagonal or the end of the keys evaluate the mask; with a mask's block
// summary, so are the tiles it shows hidden whole (next_key_tile), and tiles it shows visible
// whole do not read the mask tensor. Rows that see no key (LSE = −∞) get dQ = 0.
//
// What an invocation owns (TILE_ROWS = BLOCK_M queries, TILE_COLS = BLOCK_N keys): ROWS_PER_THREAD
// query rows, their LSE and D; S_VECS groups of 4 key columns of S = Q Kᵀ and dP = dO Vᵀ; O_VECS
// groups of 4 head_dim columns of dQ. Per key tile: the two score products (QK_STEPS steps), dS in
// registers, then dQ += dS K through t_tile (N_STEP keys per step).
//
// Why these sizes: the forward kernel's shape with one more score product and no softmax state; per
// staged k step 4 vec4 reads feed 2 · ROWS_PER_THREAD · 4 · S_VECS multiply-adds. Workgroup memory:
// one BLOCK_N × (BLOCK_M + 4) t_tile plus the stages (25 KiB for 64 × 64, K_STEP = N_STEP = 8).

const TILE_ROWS: u32 = BLOCK_M;
const TILE_COLS: u32 = BLOCK_N;
// S = Q Kᵀ and dP = dO Vᵀ: the query-side operands are the rows.
const S_ROWS_AT: u32 = Q_AT;
const S_COLS_AT: u32 = K_AT;
const DP_ROWS_AT: u32 = DO_AT;
const DP_COLS_AT: u32 = V_AT;

@group(0) @binding(8) var<storage, read_write> dq: array<Granule>;

@compute @workgroup_size(WORKGROUP_SIZE)
fn flash_bwd_dq(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let head = wg.y;
    let seq = sequence(wg.z);
    let hd = Heads(seq, head, head / params.group_size);
    let m0 = (params.num_q_tiles - 1u - wg.x) * BLOCK_M;
    let tx = li % THREADS_X;
    let row0 = (li / THREADS_X) * ROWS_PER_THREAD;
    if (m0 >= seq.seq_q) {
        // Past this sequence's rows (a shorter sequence of a packed batch), which no query sees.
        fill_d_bias(seq, head, m0, 0u, params.seq_kv, li);
        return;
    }

    // Keys this tile can see: all, or under causal masking those up to its last row's diagonal,
    // and with a window from its first row's left edge.
    let kv_end = visible_key_end(seq, m0 + BLOCK_M);
    let first_kv_tile = visible_key_begin(seq, m0) / BLOCK_N;
    let num_kv_tiles = (kv_end + BLOCK_N - 1u) / BLOCK_N;
    // So are those a mask's block summary shows hidden whole (mask_blocks_bound.wgsl).
    var t = next_key_tile(seq, head, m0, BLOCK_M, first_kv_tile, num_kv_tiles, BLOCK_N);
    if (WRITES_D_BIAS) {
        // The bias's gradient where the loop below does not go (the skipped tiles between are
        // filled as the loop steps over them).
        fill_d_bias(seq, head, m0, 0u, min(t * BLOCK_N, params.seq_kv), li);
        fill_d_bias(seq, head, m0, num_kv_tiles * BLOCK_N, params.seq_kv, li);
    }

    // Row statistics of this invocation's rows; rows past the end get a P of 0.
    var lse2: array<f32, ROWS_PER_THREAD>;
    var d: array<f32, ROWS_PER_THREAD>;
    for (var i = 0u; i < ROWS_PER_THREAD; i++) {
        let row = m0 + row0 + i;
        lse2[i] = -NEG_BIG;
        d[i] = 0.0;
        if (row < seq.seq_q) {
            lse2[i] = lse2_of(seq, head, row);
            d[i] = delta[lse_index(seq, head, row)];
        }
    }

    var dq_acc = Output();

    // Pipeline prologue: the first score slice.
    var stage = 0u;
    if (t < num_kv_tiles) {
        store_score_slice(0u, fetch_score_slice(hd, m0, t * BLOCK_N, 0u, li), li);
    }
    workgroupBarrier();

    while (t < num_kv_tiles) {
        let n0 = t * BLOCK_N;
        let t_next = next_key_tile(seq, head, m0, BLOCK_M, t + 1u, num_kv_tiles, BLOCK_N);
        // Key steps past the last visible key are not needed.
        let key_steps = (min(BLOCK_N, kv_end - n0) + N_STEP - 1u) / N_STEP;

        // ---- S = Q Kᵀ and dP = dO Vᵀ, one K_STEP slice of head_dim per step ----
        var s = Scores(); // explicit: some browsers do not re-zero a var declared in a loop
        var dp = Scores();
        score_products(&s, &dp, &stage, hd, m0, n0, SRC_K, hd, n0, li, row0, tx);

        if (DROPOUT) {
            // The forward multiplied V by P ∘ Z / (1 − p) (dropout.wgsl): the gradient that
            // reaches P is dP ∘ Z / (1 − p). D = rowsum(dO ∘ O) is already of that dropped-out O.
            for (var c = 0u; c < S_VECS; c++) {
                let keep = dropout_keep_rows(seq.b, head, m0 + row0, n0 + 4u * (tx + THREADS_X * c));
                for (var i = 0u; i < ROWS_PER_THREAD; i++) {
                    dp[i * S_VECS + c] = select(vec4<f32>(0.0), dp[i * S_VECS + c] * params.dropout_scale, keep[i]);
                }
            }
        }

        // ---- dS = P ∘ (dP − D) (times the soft-cap's slope), in registers (dp becomes dS); ALiBi's
        // bias and the score bias are constants of P's exponent ----
        let needs_mask = key_tile_needs_mask(seq, m0, BLOCK_M, n0, BLOCK_N);
        // The mask tensor is read unless the summary shows the whole tile visible.
        let reads_mask = HAS_MASK && key_tile_blocks(seq, head, m0, BLOCK_M, n0, BLOCK_N) != BLOCK_VISIBLE;
        for (var i = 0u; i < ROWS_PER_THREAD; i++) {
            for (var c = 0u; c < S_VECS; c++) {
                let cols = vec4<u32>(n0 + 4u * (tx + THREADS_X * c)) + vec4<u32>(0u, 1u, 2u, 3u);
                let r = row_probabilities(seq, head, m0 + row0 + i, cols, s[i * S_VECS + c], lse2[i], needs_mask, reads_mask);
                let dz = r.p * (dp[i * S_VECS + c] - d[i]);
                if (WRITES_D_BIAS) {
                    store_d_bias(seq, head, m0 + row0 + i, cols, dz);
                }
                dp[i * S_VECS + c] = dz * soft_cap_slope(r.y);
            }
        }
        store_transposed(&dp, row0, tx);
        workgroupBarrier();

        // ---- dQ += dS K, N_STEP keys per step; then the next tile's first score slice ----
        for (var c = 0u; c < key_steps; c++) {
            let next = (stage + 1u) % STAGES;
            let more_keys = c + 1u < key_steps;
            let more_tiles = t_next < num_kv_tiles;
            var regs = Fetched();
            if (more_keys) {
                regs = fetch_rows_slice(SRC_K, hd, n0 + (c + 1u) * N_STEP, li);
            } else if (more_tiles) {
                regs = fetch_score_slice(hd, m0, t_next * BLOCK_N, 0u, li);
            }
            accumulate_rows(&dq_acc, stage * STAGE_VECS, c * N_STEP, row0, tx);
            if (STAGES == 1u) {
                workgroupBarrier();
            }
            if (more_keys) {
                store_rows_slice(next * STAGE_VECS, regs, li);
            } else if (more_tiles) {
                store_score_slice(next * STAGE_VECS, regs, li);
            }
            workgroupBarrier();
            stage = next;
        }
        if (WRITES_D_BIAS) {
            // Key tiles the summary showed hidden whole: no query of the tile sees them.
            fill_d_bias(seq, head, m0, (t + 1u) * BLOCK_N, min(t_next * BLOCK_N, params.seq_kv), li);
        }
        t = t_next;
    }

    // ---- epilogue: dQ = scale · Σ dS K, written once (zeros for rows that saw no key) ----
    for (var i = 0u; i < ROWS_PER_THREAD; i++) {
        let row = m0 + row0 + i;
        if (row < seq.seq_q) {
            let dq_row = row_granule(grad.dq, seq.b, seq.q_first + row, head);
            for (var c = 0u; c < O_VECS; c++) {
                let dg = tx + THREADS_X * c;
                if (4u * dg < params.head_dim) {
                    dq[dq_row + dg] = pack_granule(dq_acc[i * O_VECS + c] * select(nan_f32(), grad.scale, seq.valid));
                }
            }
        }
    }
}
