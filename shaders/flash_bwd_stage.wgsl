// flash_bwd_stage.wgsl — the register-tiled machinery the gradient kernels share
// (flash_bwd_dkdv.wgsl, flash_bwd_dq.wgsl, flash_bwd_dbias.wgsl): input bindings, slice staging,
// the two score products, P of a query row, and the output products. The kernel file says which
// side of the tile its workgroup owns by defining TILE_ROWS (the rows it owns: keys for dK/dV,
// queries for dQ and d(bias)), TILE_COLS (the rows of the other side it streams through, per
// tile) and where each score operand sits in a stage (S_ROWS_AT, S_COLS_AT, DP_ROWS_AT,
// DP_COLS_AT).
//
// Bindings: 2 q, 3 k, 4 v, 5 d_o (read, arrays of granules), 6 the forward's LSE (read as raw f32
// bits, natural log), 7 delta = rowsum(dO ∘ O) (flash_bwd_pre.wgsl). The kernel files add their
// outputs at 8 (and 9).
//
// What an invocation owns, in every kernel: the workgroup is a THREADS_Y × THREADS_X grid;
// invocation (ty, tx) owns ROWS_PER_THREAD consecutive rows of its side (row0 = ty · ROWS_PER_THREAD)
// and, within them,
//   * S_VECS groups of 4 columns of each score tile, 4·(tx + THREADS_X·c), c < S_VECS — the same
//     elements of S, dP, P and dS, so P and dS are formed in registers without any exchange;
//   * O_VECS groups of 4 output columns (of head_dim), 4·(tx + THREADS_X·c), c < O_VECS.
// Column groups are interleaved across tx so that the invocations of a row read consecutive
// 16-byte words of workgroup memory (no bank conflicts), as in flash_fwd.wgsl.
//
// Workgroup memory, in vec4s of the tile type:
// * staging, STAGES stages of STAGE_VECS. A *score* stage holds a K_STEP-wide slice of head_dim of
//   the four operands of the two score products, each transposed ([k][row]): Q and dO of the query
//   tile (BLOCK_M rows each), then K and V of the key tile (BLOCK_N rows each). A *rows* stage holds
//   N_STEP whole rows ([row][d]) of the tensor the output product multiplies by.
// * t_tile: P or dS of the current tile, transposed ([col][row], TILE_COLS × TILE_ROWS), so that an
//   invocation reads its ROWS_PER_THREAD rows of one column as vec4s in the output product. Each
//   column is padded by one vec4 so that the column-wise writes of the THREADS_X invocations of a
//   row fall in different banks.
//
// The slices form one software pipeline per workgroup, as in the forward: while the invocations
// multiply out of the current stage they have already issued the global loads of the next slice
// (FETCH_VECS granules each, in registers), which then go to workgroup memory — to the other stage
// when STAGES = 2 (one barrier per step), over the one just read when STAGES = 1 (two barriers).

const WORKGROUP_SIZE: u32 = THREADS_X * THREADS_Y;
const ROWS_PER_THREAD: u32 = TILE_ROWS / THREADS_Y;
const ROW_VECS: u32 = ROWS_PER_THREAD / 4u;
const S_VECS: u32 = TILE_COLS / (4u * THREADS_X);
const O_VECS: u32 = HEAD_DIM_PAD / (4u * THREADS_X);
const DIM_VECS: u32 = HEAD_DIM_PAD / 4u;
const QK_STEPS: u32 = HEAD_DIM_PAD / K_STEP;

const Q_SLICE_VECS: u32 = K_STEP * BLOCK_M / 4u;
const K_SLICE_VECS: u32 = K_STEP * BLOCK_N / 4u;
// Where each operand of a score stage starts.
const Q_AT: u32 = 0u;
const DO_AT: u32 = Q_SLICE_VECS;
const K_AT: u32 = 2u * Q_SLICE_VECS;
const V_AT: u32 = 2u * Q_SLICE_VECS + K_SLICE_VECS;
const SCORE_SLICE_VECS: u32 = 2u * (Q_SLICE_VECS + K_SLICE_VECS);
const ROWS_SLICE_VECS: u32 = N_STEP * DIM_VECS;
const STAGE_VECS: u32 = max(SCORE_SLICE_VECS, ROWS_SLICE_VECS);
// Granules each invocation fetches per step.
const FETCH_VECS: u32 = (STAGE_VECS + WORKGROUP_SIZE - 1u) / WORKGROUP_SIZE;
const T_STRIDE: u32 = TILE_ROWS + 4u;

var<workgroup> staging: array<vec4<TileElem>, STAGES * STAGE_VECS>;
var<workgroup> t_tile: array<vec4<TileElem>, TILE_COLS * T_STRIDE / 4u>;

@group(0) @binding(2) var<storage, read> q: array<Granule>;
@group(0) @binding(3) var<storage, read> k: array<Granule>;
@group(0) @binding(4) var<storage, read> v: array<Granule>;
@group(0) @binding(5) var<storage, read> d_o: array<Granule>;
@group(0) @binding(6) var<storage, read> lse: array<u32>;
@group(0) @binding(7) var<storage, read> delta: array<f32>;

alias Fetched = array<vec4<f32>, FETCH_VECS>;
alias Scores = array<vec4<f32>, ROWS_PER_THREAD * S_VECS>;
alias Output = array<vec4<f32>, ROWS_PER_THREAD * O_VECS>;

// The sequence, query head and K/V head a step reads.
struct Heads {
    seq: Sequence,
    head: u32,
    kv_head: u32,
}

// The four tensors a slice can come from.
const SRC_Q: u32 = 0u;
const SRC_DO: u32 = 1u;
const SRC_K: u32 = 2u;
const SRC_V: u32 = 3u;
// What score_products stages last instead of rows: the first score slice of another tile.
const SRC_SCORES: u32 = 4u;

// Granule `dg` of row `row` of tensor `src`; zero past the end of the sequence and past head_dim,
// so padding rows and columns add nothing to any product.
fn load_granule(src: u32, hd: Heads, row: u32, dg: u32) -> vec4<f32> {
    if (4u * dg < params.head_dim) {
        switch src {
            case 0u: {
                if (row < hd.seq.seq_q) {
                    return unpack_granule(q[row_granule(params.q, hd.seq.b, hd.seq.q_first + row, hd.head) + dg]);
                }
            }
            case 1u: {
                if (row < hd.seq.seq_q) {
                    return unpack_granule(d_o[row_granule(grad.d_o, hd.seq.b, hd.seq.q_first + row, hd.head) + dg]);
                }
            }
            case 2u: {
                if (row < hd.seq.seq_kv) {
                    return unpack_granule(k[row_granule(params.k, hd.seq.b, hd.seq.kv_first + row, hd.kv_head) + dg]);
                }
            }
            default: {
                if (row < hd.seq.seq_kv) {
                    return unpack_granule(v[row_granule(params.v, hd.seq.b, hd.seq.kv_first + row, hd.kv_head) + dg]);
                }
            }
        }
    }
    return vec4<f32>(0.0);
}

// Loads the score slice of head_dim columns d0 .. d0+K_STEP: Q and dO rows m0.., K and V rows n0.. .
// Granule g of an operand is its row g % rows, column group g / rows: consecutive invocations take
// consecutive rows, so that the transposed stores below hit consecutive words.
fn fetch_score_slice(hd: Heads, m0: u32, n0: u32, d0: u32, li: u32) -> Fetched {
    var regs: Fetched;
    for (var j = 0u; j < FETCH_VECS; j++) {
        let g = li + j * WORKGROUP_SIZE;
        var x = vec4<f32>(0.0);
        if (g < K_AT) {
            let gs = g % Q_SLICE_VECS;
            x = load_granule(g / Q_SLICE_VECS, hd, m0 + gs % BLOCK_M, d0 / 4u + gs / BLOCK_M);
        } else if (g < SCORE_SLICE_VECS) {
            let gk = g - K_AT;
            let gs = gk % K_SLICE_VECS;
            x = load_granule(SRC_K + gk / K_SLICE_VECS, hd, n0 + gs % BLOCK_N, d0 / 4u + gs / BLOCK_N);
        }
        regs[j] = x;
    }
    return regs;
}

// Stores a fetched score slice, each operand transposed, into the stage starting at `base`.
fn store_score_slice(base: u32, regs: Fetched, li: u32) {
    for (var j = 0u; j < FETCH_VECS; j++) {
        let g = li + j * WORKGROUP_SIZE;
        if (g < SCORE_SLICE_VECS) {
            var rows = BLOCK_M;
            var first = base + (g / Q_SLICE_VECS) * Q_SLICE_VECS;
            var gs = g % Q_SLICE_VECS;
            if (g >= K_AT) {
                let gk = g - K_AT;
                rows = BLOCK_N;
                first = base + K_AT + (gk / K_SLICE_VECS) * K_SLICE_VECS;
                gs = gk % K_SLICE_VECS;
            }
            let t = to_tile4(regs[j]);
            let r = gs % rows;
            let kg = gs / rows;
            for (var c = 0u; c < 4u; c++) {
                let pos = (4u * kg + c) * rows + r;
                staging[first + pos / 4u][pos % 4u] = t[c];
            }
        }
    }
}

// Loads rows first_row .. first_row+N_STEP of tensor `src`, all columns.
fn fetch_rows_slice(src: u32, hd: Heads, first_row: u32, li: u32) -> Fetched {
    var regs: Fetched;
    for (var j = 0u; j < FETCH_VECS; j++) {
        let g = li + j * WORKGROUP_SIZE;
        var x = vec4<f32>(0.0);
        if (g < ROWS_SLICE_VECS) {
            x = load_granule(src, hd, first_row + g / DIM_VECS, g % DIM_VECS);
        }
        regs[j] = x;
    }
    return regs;
}

fn store_rows_slice(base: u32, regs: Fetched, li: u32) {
    for (var j = 0u; j < FETCH_VECS; j++) {
        let g = li + j * WORKGROUP_SIZE;
        if (g < ROWS_SLICE_VECS) {
            staging[base + g] = to_tile4(regs[j]);
        }
    }
}

// The tile's two score products (S and dP, in the kernel's orientation: Q Kᵀ and dO Vᵀ for dQ and
// d(bias), their transposes for dK/dV), one K_STEP slice of head_dim per step through the staging
// ring at `*stage`; each step fetches the next slice into registers before reading the staged
// one. Under the last slice, what follows is staged instead: the first N_STEP rows of `then_src`
// of `then_hd` from `then_first_row`, for the output products; or with `then_src` = SRC_SCORES
// the first score slice of `then_hd`'s tile at (m0, n0), for the d(bias) kernel's next pair.
fn score_products(
    s: ptr<function, Scores>,
    dp: ptr<function, Scores>,
    stage: ptr<function, u32>,
    hd: Heads,
    m0: u32,
    n0: u32,
    then_src: u32,
    then_hd: Heads,
    then_first_row: u32,
    li: u32,
    row0: u32,
    tx: u32,
) {
    for (var c = 0u; c < QK_STEPS; c++) {
        let next = (*stage + 1u) % STAGES;
        let last = c + 1u == QK_STEPS;
        let scores_next = !last || then_src == SRC_SCORES;
        var regs = Fetched();
        if (!last) {
            regs = fetch_score_slice(hd, m0, n0, (c + 1u) * K_STEP, li);
        } else if (scores_next) {
            regs = fetch_score_slice(then_hd, m0, n0, 0u, li);
        } else {
            regs = fetch_rows_slice(then_src, then_hd, then_first_row, li);
        }
        accumulate_scores(s, dp, *stage * STAGE_VECS, row0, tx);
        if (STAGES == 1u) {
            workgroupBarrier(); // the stage just read is about to be overwritten
        }
        if (scores_next) {
            store_score_slice(next * STAGE_VECS, regs, li);
        } else {
            store_rows_slice(next * STAGE_VECS, regs, li);
        }
        workgroupBarrier();
        *stage = next;
    }
}

// s += (S row operand)(S column operand)ᵀ and dp += (dP row operand)(dP column operand)ᵀ over one
// score stage, for this invocation's rows and columns.
fn accumulate_scores(s: ptr<function, Scores>, dp: ptr<function, Scores>, base: u32, row0: u32, tx: u32) {
    for (var kk = 0u; kk < K_STEP; kk++) {
        var s_rows = array<vec4<TileElem>, ROW_VECS>();
        var dp_rows = array<vec4<TileElem>, ROW_VECS>();
        for (var g = 0u; g < ROW_VECS; g++) {
            s_rows[g] = staging[base + S_ROWS_AT + (kk * TILE_ROWS + row0) / 4u + g];
            dp_rows[g] = staging[base + DP_ROWS_AT + (kk * TILE_ROWS + row0) / 4u + g];
        }
        for (var c = 0u; c < S_VECS; c++) {
            let col = kk * (TILE_COLS / 4u) + tx + THREADS_X * c;
            let s_cols = staging[base + S_COLS_AT + col];
            let dp_cols = staging[base + DP_COLS_AT + col];
            for (var i = 0u; i < ROWS_PER_THREAD; i++) {
                (*s)[i * S_VECS + c] = mul_add4((*s)[i * S_VECS + c], s_rows[i / 4u][i % 4u], s_cols);
                (*dp)[i * S_VECS + c] = mul_add4((*dp)[i * S_VECS + c], dp_rows[i / 4u][i % 4u], dp_cols);
            }
        }
    }
}

// P of query row `row` of a sequence against the four key columns `cols`, from their products
// s = q·k (unscaled) and the row's LSE in base 2: the scale and the soft-cap (y, returned for the
// cap's slope), then ALiBi's bias and the score bias, constants of P's exponent (a key the bias
// hides gets P = 0), with `needs_mask` the causal mask, the window and the end of the keys, and
// with `reads_mask` the mask tensor.
// The dQ and d(bias) kernels, whose tiles have query rows; the dK/dV kernel's are transposed.
struct RowProbabilities {
    p: vec4<f32>,
    y: vec4<f32>,
}

fn row_probabilities(
    seq: Sequence,
    head: u32,
    row: u32,
    cols: vec4<u32>,
    s: vec4<f32>,
    lse2: f32,
    needs_mask: bool,
    reads_mask: bool,
) -> RowProbabilities {
    let y = soft_cap(s * params.scale);
    var x = y;
    if (has_alibi()) {
        x += alibi_bias(head, i32(row) + seq.causal_offset, cols);
    }
    var p = vec4<f32>(0.0);
    if (HAS_BIAS) {
        let bias = score_bias(seq, head, row, cols);
        p = select(exp2(x + bias.value - lse2), vec4<f32>(0.0), bias.hidden);
    } else {
        p = exp2(x - lse2);
    }
    if (needs_mask) {
        p = select(vec4<f32>(0.0), p, within_keys(cols, visible_keys(seq, row)));
    }
    if (reads_mask) {
        // Keys the mask tensor hides (mask_bound.wgsl) have P = 0 too.
        p = select(p, vec4<f32>(0.0), mask_hidden(seq, head, row, cols));
    }
    return RowProbabilities(p, y);
}

// Writes this invocation's elements of a score-shaped tile (P or dS) to t_tile, transposed.
// The caller puts a barrier between this and the reads, and between earlier reads and this.
fn store_transposed(x: ptr<function, Scores>, row0: u32, tx: u32) {
    for (var c = 0u; c < S_VECS; c++) {
        for (var j = 0u; j < 4u; j++) {
            let col = 4u * (tx + THREADS_X * c) + j;
            for (var g = 0u; g < ROW_VECS; g++) {
                let r = 4u * g;
                t_tile[(col * T_STRIDE + row0) / 4u + g] = to_tile4(vec4<f32>(
                    (*x)[r * S_VECS + c][j],
                    (*x)[(r + 1u) * S_VECS + c][j],
                    (*x)[(r + 2u) * S_VECS + c][j],
                    (*x)[(r + 3u) * S_VECS + c][j],
                ));
            }
        }
    }
}

// acc += t_tile[col_first .. col_first+N_STEP, rows] · (rows stage) for this invocation's rows and
// output columns.
fn accumulate_rows(acc: ptr<function, Output>, base: u32, col_first: u32, row0: u32, tx: u32) {
    for (var n = 0u; n < N_STEP; n++) {
        var t_rows = array<vec4<TileElem>, ROW_VECS>();
        for (var g = 0u; g < ROW_VECS; g++) {
            t_rows[g] = t_tile[((col_first + n) * T_STRIDE + row0) / 4u + g];
        }
        for (var c = 0u; c < O_VECS; c++) {
            let cols = staging[base + n * DIM_VECS + tx + THREADS_X * c];
            for (var i = 0u; i < ROWS_PER_THREAD; i++) {
                (*acc)[i * O_VECS + c] = mul_add4((*acc)[i * O_VECS + c], t_rows[i / 4u][i % 4u], cols);
            }
        }
    }
}

// The forward's log-sum-exp of query row `row` in base 2 (lse2_of_bits).
fn lse2_of(seq: Sequence, head: u32, row: u32) -> f32 {
    return lse2_of_bits(lse[lse_index(seq, head, row)]);
}

