// flash_bwd_dbias.wgsl — attention backward: one tile of the score bias's gradient.
//
//   z = soft_cap(scale · Q Kᵀ) + ALiBi + bias,   P = exp(z − LSE) [masks],   dP = dO Vᵀ
//   dL/d(bias)[i, j] = Σ_(b, h) P ∘ (dP − D)
//
// summed over the (batch entry, head) pairs the bias broadcasts to — those its layout gives a
// stride of 0 (params.bias.batch, params.bias.head) — with D = rowsum(dO ∘ O) from
// flash_bwd_pre.wgsl. This is the dQ kernel's dS without the soft-cap's slope: the bias is added
// after the cap. With dropout (DROPOUT, dropout.wgsl) dP is dO Vᵀ ∘ Z / (1 − p), each pair's own
// mask Z regenerated as the dQ kernel does. Shared machinery (bindings 2–7, staging, the score
// products, P of a row) is in flash_bwd_stage.wgsl; this file adds 8 d_bias (written, f32): a dense
// [batch | 1, num_heads | 1, seq_q, seq_kv] tensor from the start of its binding, with a dimension
// exactly where the bias has a non-zero stride (BackwardProblem::d_bias_layout). For a packed batch
// seq_q and seq_kv are the longest sequence's, and rows and columns count from each sequence's
// start, as the bias's do.
//
// What a workgroup owns: a BLOCK_M × BLOCK_N tile (query rows × key columns) of one [seq_q, seq_kv]
// slice of d(bias), accumulated in registers and written once. The grid is (key tiles, query
// tiles, slices); slice z is (batch entry z / heads, head z % heads) of the gradient's own
// dimensions. The workgroup loops over the pairs of its slice — every batch entry where the bias
// broadcasts over the batch, every head where it broadcasts over the heads; batch-major, always in
// that order — and for each recomputes S = Q Kᵀ and dP = dO Vᵀ of its tile and adds P ∘ (dP − D).
// No atomics and a fixed order of summation: the result is deterministic. This kernel is for the
// biases that broadcast, whose sums span pairs the dQ kernel spreads over workgroups; a bias per
// (batch, head) — one pair per slice — has its gradient stored by the dQ kernel itself
// (score_bias_grad_bound.wgsl), unless a plan forces this kernel. Pairs whose sequence does not
// reach the tile, or whose causal mask or window hides it whole, or whose mask tensor a block
// summary shows hiding it whole, are skipped (the next pair's first score slice is fetched while
// the current one's last is multiplied); tiles that cross a mask or an end evaluate it per
// element; keys a −∞ bias or the mask tensor hides and rows that see no key (LSE = −∞) have
// P = 0. Elements no pair reaches (above a causal diagonal, past a short sequence) are written as
// 0. A pair whose sequence the index tensors place outside its tensors (sequence_indexed.wgsl)
// makes the whole slice NaN, as the dQ kernel writes its rows.
//
// What an invocation owns (TILE_ROWS = BLOCK_M queries, TILE_COLS = BLOCK_N keys, the dQ kernel's
// orientation): ROWS_PER_THREAD query rows, their LSE and D for the current pair, and S_VECS groups
// of 4 key columns of S, dP and the d(bias) tile. Per pair: the two score products (QK_STEPS steps
// of K_STEP head_dim columns), then P and P ∘ (dP − D) in registers. Nothing goes through t_tile
// (flash_bwd_stage.wgsl declares it for the other kernels).
//
// Why these sizes: the dQ kernel's plans (src/plan/backward/tiled.rs), whose score products this kernel
// repeats: per staged k step 4 vec4 reads feed 2 · ROWS_PER_THREAD · 4 · S_VECS multiply-adds, and
// an invocation holds three score-shaped tiles (d(bias), S, dP) where the dQ kernel holds two and
// its dQ rows (96 f32 for 128 × 64 on 16 × 16). Per pair it costs two of the backward's seven
// products over its tile, for every pair the bias broadcasts to: 2/7 ≈ 29% more arithmetic than a
// backward without d(bias), whatever the broadcast.

const TILE_ROWS: u32 = BLOCK_M;
const TILE_COLS: u32 = BLOCK_N;
// S = Q Kᵀ and dP = dO Vᵀ: the query-side operands are the rows.
const S_ROWS_AT: u32 = Q_AT;
const S_COLS_AT: u32 = K_AT;
const DP_ROWS_AT: u32 = DO_AT;
const DP_COLS_AT: u32 = V_AT;

@group(0) @binding(8) var<storage, read_write> d_bias: array<f32>;

// The (batch entry, head) pairs that add into one slice of d(bias): batches × heads of them from
// (b0, h0), heads varying fastest.
struct BiasSlice {
    b0: u32,
    h0: u32,
    batches: u32,
    heads: u32,
}

fn bias_slice(z: u32) -> BiasSlice {
    let per_batch = params.bias.batch != 0u;
    let per_head = params.bias.head != 0u;
    let head_slices = select(1u, params.num_heads, per_head);
    return BiasSlice(
        select(0u, z / head_slices, per_batch),
        select(0u, z % head_slices, per_head),
        select(params.batch, 1u, per_batch),
        select(params.num_heads, 1u, per_head),
    );
}

// The sequence and heads of pair `it` of a slice.
fn pair_heads(slice: BiasSlice, it: u32) -> Heads {
    let head = slice.h0 + it % slice.heads;
    return Heads(sequence(slice.b0 + it / slice.heads), head, head / params.group_size);
}

// Whether some element of the tile at (m0, n0) is within the sequence and not hidden whole by its
// causal mask or window: the keys its rows see run from its first row's left edge to its last
// row's end.
fn tile_seen(seq: Sequence, m0: u32, n0: u32) -> bool {
    if (m0 >= seq.seq_q || n0 >= seq.seq_kv) {
        return false;
    }
    let rows_end = min(m0 + BLOCK_M, seq.seq_q);
    return (n0 < visible_key_end(seq, rows_end)) & (n0 + BLOCK_N > visible_key_begin(seq, m0));
}

// The first pair from `first` on whose sequence the tile at (m0, n0) sees, and for whose head a
// mask's block summary does not show the tile hidden whole (mask_blocks_bound.wgsl); the slice's
// pair count when none does.
fn next_pair(slice: BiasSlice, first: u32, m0: u32, n0: u32) -> u32 {
    let pairs = slice.batches * slice.heads;
    var it = first;
    while (it < pairs) {
        let hd = pair_heads(slice, it);
        if (tile_seen(hd.seq, m0, n0) && key_tile_blocks(hd.seq, hd.head, m0, BLOCK_M, n0, BLOCK_N) != BLOCK_HIDDEN) {
            break;
        }
        it++;
    }
    return it;
}

@compute @workgroup_size(WORKGROUP_SIZE)
fn flash_bwd_dbias(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let n0 = wg.x * BLOCK_N;
    let m0 = wg.y * BLOCK_M;
    let slice = bias_slice(wg.z);
    let pairs = slice.batches * slice.heads;
    let tx = li % THREADS_X;
    let row0 = (li / THREADS_X) * ROWS_PER_THREAD;

    var valid = true;
    for (var b = 0u; b < slice.batches; b++) {
        valid = valid & sequence(slice.b0 + b).valid;
    }

    var acc = Scores();

    // Pipeline prologue: the first pair's first score slice.
    var stage = 0u;
    var it = next_pair(slice, 0u, m0, n0);
    if (it < pairs) {
        store_score_slice(0u, fetch_score_slice(pair_heads(slice, it), m0, n0, 0u, li), li);
    }
    workgroupBarrier();

    while (it < pairs) {
        let hd = pair_heads(slice, it);
        let seq = hd.seq;
        let next = next_pair(slice, it + 1u, m0, n0);
        // Under the last slice, the next pair's first (after the last pair: its own again, unused).
        let then_hd = pair_heads(slice, select(it, next, next < pairs));

        // ---- S = Q Kᵀ and dP = dO Vᵀ, one K_STEP slice of head_dim per step ----
        var s = Scores(); // explicit: some browsers do not re-zero a var declared in a loop
        var dp = Scores();
        score_products(&s, &dp, &stage, hd, m0, n0, SRC_SCORES, then_hd, 0u, li, row0, tx);

        if (DROPOUT) {
            // The forward multiplied V by P ∘ Z / (1 − p) (dropout.wgsl): the dP that reaches the
            // logits is dP ∘ Z / (1 − p), the pair's own mask, exactly as the dQ kernel forms it.
            for (var c = 0u; c < S_VECS; c++) {
                let keep = dropout_keep_rows(seq.b, hd.head, m0 + row0, n0 + 4u * (tx + THREADS_X * c));
                for (var i = 0u; i < ROWS_PER_THREAD; i++) {
                    dp[i * S_VECS + c] = select(vec4<f32>(0.0), dp[i * S_VECS + c] * params.dropout_scale, keep[i]);
                }
            }
        }

        // ---- d(bias) += P ∘ (dP − D), in registers; rows past the sequence have P = 0 ----
        let needs_mask = key_tile_needs_mask(seq, m0, BLOCK_M, n0, BLOCK_N);
        // The mask tensor is read unless the summary shows the whole tile visible.
        let reads_mask = HAS_MASK && key_tile_blocks(seq, hd.head, m0, BLOCK_M, n0, BLOCK_N) != BLOCK_VISIBLE;
        for (var i = 0u; i < ROWS_PER_THREAD; i++) {
            let row = m0 + row0 + i;
            var lse2 = -NEG_BIG;
            var d = 0.0;
            if (row < seq.seq_q) {
                lse2 = lse2_of(seq, hd.head, row);
                d = delta[lse_index(seq, hd.head, row)];
            }
            for (var c = 0u; c < S_VECS; c++) {
                let cols = vec4<u32>(n0 + 4u * (tx + THREADS_X * c)) + vec4<u32>(0u, 1u, 2u, 3u);
                let r = row_probabilities(seq, hd.head, row, cols, s[i * S_VECS + c], lse2, needs_mask, reads_mask);
                acc[i * S_VECS + c] += r.p * (dp[i * S_VECS + c] - d);
            }
        }
        it = next;
    }

    // ---- epilogue: the tile, written once (zeros where no pair reached) ----
    let slice_first = wg.z * params.seq_q * params.seq_kv;
    for (var i = 0u; i < ROWS_PER_THREAD; i++) {
        let row = m0 + row0 + i;
        if (row < params.seq_q) {
            let row_first = slice_first + row * params.seq_kv;
            for (var c = 0u; c < S_VECS; c++) {
                let col = n0 + 4u * (tx + THREADS_X * c);
                for (var j = 0u; j < 4u; j++) {
                    if (col + j < params.seq_kv) {
                        d_bias[row_first + col + j] = select(nan_f32(), acc[i * S_VECS + c][j], valid);
                    }
                }
            }
        }
    }
}
