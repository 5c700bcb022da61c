// flash_bwd_dkdv.wgsl — attention backward, FlashAttention-2 style: dK and dV of one K/V tile.
//
//   P = exp(scale · Q Kᵀ − LSE) [causal mask]       (recomputed from the forward's LSE)
//   dV = Pᵀ dO,   dP = dO Vᵀ,   dS = P ∘ (dP − D),   dK = scale · dSᵀ Q
//
// with D = rowsum(dO ∘ O) from flash_bwd_pre.wgsl. Shared machinery (bindings 2–7, staging, the
// products) is in flash_bwd_stage.wgsl; this file adds 8 dk and 9 dv (written, arrays of granules).
//
// What a workgroup owns: BLOCK_N keys of one (sequence, K/V head), and their dK and dV rows, which it
// accumulates in registers and writes once: no atomics, and nothing of size seq_q × seq_kv ever
// reaches memory. The grid is (ceil(seq_kv / BLOCK_N), num_kv_heads, batch). The workgroup loops
// over every query head that shares its K/V head (GQA/MQA) and, for each, over the query tiles of
// BLOCK_M rows, so the sum over the group happens in registers with a single pass over memory.
// Under causal masking (bottom-right aligned: query i sees keys j ≤ i + seq_kv − seq_q) the query
// tiles wholly above the diagonal — rows that see none of these keys — are never visited; only
// tiles that cross the diagonal or an end of a sequence evaluate the mask; with a mask's block
// summary, so are the query tiles it shows hiding all of these keys (next_item), and query tiles
// it shows seeing all of them do not read the mask tensor. Tile x = 0 (the keys seen by the most
// queries) starts first.
//
// What an invocation owns (TILE_ROWS = BLOCK_N keys, TILE_COLS = BLOCK_M queries): ROWS_PER_THREAD
// keys; S_VECS groups of 4 query columns of each transposed score tile Sᵀ = K Qᵀ and dPᵀ = V dOᵀ;
// O_VECS groups of 4 head_dim columns of both dK and dV. Per query tile it runs the two score
// products (QK_STEPS steps of K_STEP head_dim columns), forms Pᵀ and dSᵀ in registers, then
// dV += Pᵀ dO and dK += dSᵀ Q through t_tile (N_STEP query rows per step).
//
// Why these sizes: an invocation holds 2 · ROWS_PER_THREAD · 4 · O_VECS accumulators (dK, dV) plus
// 2 · ROWS_PER_THREAD · 4 · S_VECS scores (Sᵀ, dPᵀ): with 64 keys × 64 queries on 16 × 16 invocations
// at head_dim 128 that is 64 + 32 f32 registers, the forward's budget, and per staged k step 4 vec4
// reads feed 32 multiply-adds. Workgroup memory is one 64 × 68 t_tile plus the stages: 25 KiB with
// K_STEP = N_STEP = 8 fits lavapipe's 32 KiB; NVIDIA's 48 KiB takes K_STEP = 16 or two stages. The
// plans themselves, and the 16 KiB fallback, are chosen in src/plan/backward/tiled.rs.

const TILE_ROWS: u32 = BLOCK_N;
const TILE_COLS: u32 = BLOCK_M;
// Sᵀ = K Qᵀ and dPᵀ = V dOᵀ: the key-side operands are the rows.
const S_ROWS_AT: u32 = K_AT;
const S_COLS_AT: u32 = Q_AT;
const DP_ROWS_AT: u32 = V_AT;
const DP_COLS_AT: u32 = DO_AT;

@group(0) @binding(8) var<storage, read_write> dk: array<Granule>;
@group(0) @binding(9) var<storage, read_write> dv: array<Granule>;

// The first work item from `it` on, before `num_items`, whose query tile a mask's block summary
// does not show hiding all the keys [n0, n0 + BLOCK_N): the items between are never loaded.
fn next_item(seq: Sequence, kv_head: u32, n0: u32, it: u32, num_items: u32, first_tile: u32, tiles_per_head: u32) -> u32 {
    var next = it;
    loop {
        if ((next >= num_items) | !HAS_MASK_BLOCKS) {
            break;
        }
        let h = item_head(kv_head, next, tiles_per_head);
        let m0 = item_m0(next, first_tile, tiles_per_head);
        if (key_tile_blocks(seq, h, m0, BLOCK_M, n0, BLOCK_N) != BLOCK_HIDDEN) {
            break;
        }
        next++;
    }
    return next;
}

@compute @workgroup_size(WORKGROUP_SIZE)
fn flash_bwd_dkdv(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let kv_head = wg.y;
    let seq = sequence(wg.z);
    let n0 = wg.x * BLOCK_N;
    let tx = li % THREADS_X;
    let row0 = (li / THREADS_X) * ROWS_PER_THREAD;
    if (n0 >= seq.seq_kv) {
        return; // past this sequence's keys (a shorter sequence of a packed batch)
    }

    // Query rows that see any of these keys: all, or from the first whose diagonal reaches them
    // (causal) to the last whose window still reaches back to them.
    let rows = rows_seeing(seq, n0, BLOCK_N);
    let first_tile = rows.x / BLOCK_M;
    let tiles_per_head = (rows.y + BLOCK_M - 1u) / BLOCK_M - first_tile;
    // One work item per (query head of the group, query tile).
    let num_items = params.group_size * tiles_per_head;

    var dk_acc = Output();
    var dv_acc = Output();

    // Pipeline prologue: the first score slice.
    var stage = 0u;
    var it = next_item(seq, kv_head, n0, 0u, num_items, first_tile, tiles_per_head);
    if (it < num_items) {
        let hd = Heads(seq, item_head(kv_head, it, tiles_per_head), kv_head);
        store_score_slice(0u, fetch_score_slice(hd, item_m0(it, first_tile, tiles_per_head), n0, 0u, li), li);
    }
    workgroupBarrier();

    while (it < num_items) {
        let hd = Heads(seq, item_head(kv_head, it, tiles_per_head), kv_head);
        let m0 = item_m0(it, first_tile, tiles_per_head);
        let it_next = next_item(seq, kv_head, n0, it + 1u, num_items, first_tile, tiles_per_head);
        // Query-row steps past the end of the sequence are not needed.
        let row_steps = (min(BLOCK_M, seq.seq_q - m0) + N_STEP - 1u) / N_STEP;

        // ---- Sᵀ = K Qᵀ and dPᵀ = V dOᵀ, one K_STEP slice of head_dim per step ----
        var s = Scores(); // explicit: some browsers do not re-zero a var declared in a loop
        var dp = Scores();
        score_products(&s, &dp, &stage, hd, m0, n0, SRC_DO, hd, m0, li, row0, tx);

        // ---- Pᵀ and dSᵀ (times the soft-cap's slope), in registers: s becomes Pᵀ, dp becomes dSᵀ ----
        let needs_mask = m0 + BLOCK_M > seq.seq_q || key_tile_needs_mask(seq, m0, BLOCK_M, n0, BLOCK_N);
        // The mask tensor is read unless the summary shows the whole tile visible.
        let reads_mask = HAS_MASK && key_tile_blocks(seq, hd.head, m0, BLOCK_M, n0, BLOCK_N) != BLOCK_VISIBLE;
        for (var c = 0u; c < S_VECS; c++) {
            // Row statistics of this invocation's query columns.
            var lse2 = vec4<f32>(-NEG_BIG);
            var d = vec4<f32>(0.0);
            for (var j = 0u; j < 4u; j++) {
                let col = m0 + 4u * (tx + THREADS_X * c) + j;
                if (col < seq.seq_q) {
                    lse2[j] = lse2_of(seq, hd.head, col);
                    d[j] = delta[lse_index(seq, hd.head, col)];
                }
            }
            // Dropout's keep bits of these keys for these four queries (dropout.wgsl), read
            // transposed: the forward multiplied V by P ∘ Z / (1 − p).
            var keep = array<vec4<bool>, ROWS_PER_THREAD>();
            if (DROPOUT) {
                keep = dropout_keep_keys(seq.b, hd.head, n0 + row0, m0 + 4u * (tx + THREADS_X * c));
            }
            for (var i = 0u; i < ROWS_PER_THREAD; i++) {
                let y = soft_cap(s[i * S_VECS + c] * params.scale);
                var x = y;
                let queries = vec4<u32>(m0 + 4u * (tx + THREADS_X * c)) + vec4<u32>(0u, 1u, 2u, 3u);
                if (has_alibi()) {
                    // |query position − key| with the roles of alibi_bias's arguments swapped.
                    x += alibi_bias(hd.head, i32(n0 + row0 + i) - seq.causal_offset, queries);
                }
                var p = vec4<f32>(0.0);
                if (HAS_BIAS) {
                    // This invocation's key against four query columns: the transposed read.
                    let bias = score_bias_of_rows(seq, hd.head, queries, n0 + row0 + i);
                    p = select(exp2(x + bias.value - lse2), vec4<f32>(0.0), bias.hidden);
                } else {
                    p = exp2(x - lse2);
                }
                if (needs_mask) {
                    for (var j = 0u; j < 4u; j++) {
                        let col = m0 + 4u * (tx + THREADS_X * c) + j;
                        p[j] = select(0.0, p[j], (col < seq.seq_q) & is_visible(seq, col, n0 + row0 + i));
                    }
                }
                if (reads_mask) {
                    p = select(p, vec4<f32>(0.0), mask_hidden_of_rows(seq, hd.head, queries, n0 + row0 + i));
                }
                var dpv = dp[i * S_VECS + c];
                if (DROPOUT) {
                    // dV = (P ∘ Z)ᵀ dO (its 1/(1 − p) applied once, at the end) and the gradient
                    // that reaches P is dP ∘ Z / (1 − p).
                    dpv = select(vec4<f32>(0.0), dpv * params.dropout_scale, keep[i]);
                    s[i * S_VECS + c] = select(vec4<f32>(0.0), p, keep[i]);
                } else {
                    s[i * S_VECS + c] = p;
                }
                dp[i * S_VECS + c] = p * (dpv - d) * soft_cap_slope(y);
            }
        }
        store_transposed(&s, row0, tx);
        workgroupBarrier();

        // ---- dV += Pᵀ dO, N_STEP query rows per step; then the first Q rows ----
        for (var c = 0u; c < row_steps; c++) {
            let next = (stage + 1u) % STAGES;
            var regs = Fetched();
            if (c + 1u < row_steps) {
                regs = fetch_rows_slice(SRC_DO, hd, m0 + (c + 1u) * N_STEP, li);
            } else {
                regs = fetch_rows_slice(SRC_Q, hd, m0, li);
            }
            accumulate_rows(&dv_acc, stage * STAGE_VECS, c * N_STEP, row0, tx);
            if (STAGES == 1u) {
                workgroupBarrier();
            }
            store_rows_slice(next * STAGE_VECS, regs, li);
            workgroupBarrier();
            stage = next;
        }

        // Every read of Pᵀ finished before the barrier above.
        store_transposed(&dp, row0, tx);
        workgroupBarrier();

        // ---- dK += dSᵀ Q (scaled at the end); then the next item's first score slice ----
        for (var c = 0u; c < row_steps; c++) {
            let next = (stage + 1u) % STAGES;
            let more_rows = c + 1u < row_steps;
            let more_items = it_next < num_items;
            var regs = Fetched();
            if (more_rows) {
                regs = fetch_rows_slice(SRC_Q, hd, m0 + (c + 1u) * N_STEP, li);
            } else if (more_items) {
                let hd_next = Heads(seq, item_head(kv_head, it_next, tiles_per_head), kv_head);
                regs = fetch_score_slice(hd_next, item_m0(it_next, first_tile, tiles_per_head), n0, 0u, li);
            }
            accumulate_rows(&dk_acc, stage * STAGE_VECS, c * N_STEP, row0, tx);
            if (STAGES == 1u) {
                workgroupBarrier();
            }
            if (more_rows) {
                store_rows_slice(next * STAGE_VECS, regs, li);
            } else if (more_items) {
                store_score_slice(next * STAGE_VECS, regs, li);
            }
            workgroupBarrier();
            stage = next;
        }
        it = it_next;
    }

    // ---- epilogue: dK = scale · Σ dSᵀ Q, dV = Σ Pᵀ dO, written once ----
    for (var i = 0u; i < ROWS_PER_THREAD; i++) {
        let row = n0 + row0 + i;
        if (row < seq.seq_kv) {
            let dk_row = row_granule(grad.dk, seq.b, seq.kv_first + row, kv_head);
            let dv_row = row_granule(grad.dv, seq.b, seq.kv_first + row, kv_head);
            for (var c = 0u; c < O_VECS; c++) {
                let dg = tx + THREADS_X * c;
                if (4u * dg < params.head_dim) {
                    dk[dk_row + dg] = pack_granule(dk_acc[i * O_VECS + c] * grad.scale);
                    var dv_out = dv_acc[i * O_VECS + c];
                    if (DROPOUT) {
                        dv_out *= params.dropout_scale;
                    }
                    dv[dv_row + dg] = pack_granule(dv_out);
                }
            }
        }
    }
}
