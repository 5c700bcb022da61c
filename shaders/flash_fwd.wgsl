// flash_fwd.wgsl — exact attention forward, FlashAttention-2 style, register-tiled.
//
//   O = softmax(scale · Q Kᵀ [causal mask]) V,   LSE = log Σ exp(scale · Q Kᵀ)
//
// Bindings: 0 params (common.wgsl), 1 q, 2 k, 3 v (read), 4 o (write) — arrays of granules —
// 5 the f32 log-sum-exp, written as raw bits, for a batch with index tensors (packed
// sequences, key counts) 6–8 (sequence_indexed.wgsl), for per-head tensors (ALiBi slopes,
// sinks) 9–10 (head_terms_bound.wgsl), for a score bias 11 (score_bias_bound.wgsl), and for a
// mask tensor and its block summary 12–13 (mask_bound.wgsl, mask_blocks_bound.wgsl). Dropout
// (dropout.wgsl) needs no binding: its mask is drawn where P is formed.
//
// What a workgroup owns: one tile of BLOCK_M query rows of one (sequence, head). The grid is
// (num_q_tiles, num_heads, batch), num_q_tiles counting the longest sequence's tiles: a
// workgroup past its own sequence's rows returns at once, so a packed batch computes no padding.
// The x index is reversed so that, under causal masking, the tiles with the most keys to visit
// start first. The workgroup streams the K/V sequence in tiles of
// BLOCK_N keys and keeps, per query row, a running max m and sum l of exp2 of the scores (the
// online softmax), rescaling its partial output by exp2(m_old − m_new) whenever m grows. Only
// O (seq_q × head_dim) and LSE (seq_q) are ever written: memory stays O(seq). Under causal
// masking the K/V tiles wholly above the diagonal are never visited; only tiles that cross the
// diagonal or the end of the sequence evaluate the mask. With a mask's block summary, the tiles it
// shows hidden whole are stepped over too (next_key_tile), and tiles it shows visible whole do not
// read the mask.
//
// What an invocation owns: the workgroup is a THREADS_Y × THREADS_X grid. Invocation (ty, tx) owns
// ROWS_PER_THREAD consecutive query rows (row0 = ty · ROWS_PER_THREAD), and within them
//   * S_VECS groups of 4 score columns, 4·(tx + THREADS_X·c) for c < S_VECS, of each K/V tile, and
//   * O_VECS groups of 4 output columns, 4·(tx + THREADS_X·c) for c < O_VECS,
// all in registers. A row's statistics live in the THREADS_X invocations that share it; its max is
// combined with reduce_rows() once per tile, its sum only once at the end (each invocation keeps
// the sum over its own columns, rescaled by the same row-uniform factors).
//
// Why these sizes: each phase is a small matrix product whose operands stream through workgroup
// memory in K_STEP (QKᵀ) or N_STEP (PV) slices; per slice step an invocation reads ROWS_PER_THREAD
// plus 4·S_VECS (or 4·O_VECS) values and does ROWS_PER_THREAD · 4·S_VECS (4·O_VECS) multiply-adds,
// the register tiling that lifts an FMA-bound kernel off the workgroup-memory bandwidth. The tile
// sizes come from the host (src/plan/forward.rs) in a generated `const` block, fitted to the adapter's
// workgroup memory (16 KiB in WebGPU by default, 32 KiB on lavapipe, 48 KiB on NVIDIA Vulkan) and
// invocation limit. Column groups are interleaved across tx (not blocked) so that the invocations of
// a row read consecutive 16-byte words of workgroup memory: no bank conflicts.
//
// The slices form one software pipeline per workgroup: QK_STEPS slices of Q and K, then the V
// slices of the same tile, then the next tile's Q/K slices. While the invocations multiply out of
// the current slice they have already issued the global loads of the next one (into FETCH_VECS
// registers each), so memory latency hides behind arithmetic; the next slice then goes to
// workgroup memory. With STAGES = 2 it goes to the other half of a double buffer and each step
// needs one barrier; with STAGES = 1 (when workgroup memory is short) it overwrites the slice just
// read, after a second barrier.

const WORKGROUP_SIZE: u32 = THREADS_X * THREADS_Y;
const ROWS_PER_THREAD: u32 = BLOCK_M / THREADS_Y;
const ROW_VECS: u32 = ROWS_PER_THREAD / 4u;
const S_VECS: u32 = BLOCK_N / (4u * THREADS_X);
const O_VECS: u32 = HEAD_DIM_PAD / (4u * THREADS_X);
const DIM_VECS: u32 = HEAD_DIM_PAD / 4u;
const QK_STEPS: u32 = HEAD_DIM_PAD / K_STEP;

// Workgroup memory, in vec4s of the tile type:
// * staging, STAGES stages of STAGE_VECS: a Q/K step holds a K_STEP-wide slice of the Q tile,
//   transposed ([k][m]), followed by the same slice of the K tile ([k][n]); a V step holds N_STEP
//   rows of the V tile ([n][d]).
// * p_tile: the probabilities P of the current K/V tile, transposed ([n][m]) so that an invocation
//   reads its ROWS_PER_THREAD rows of one column as vec4s. Rows are padded by one vec4 so that the
//   column-wise writes of the THREADS_X invocations of a row fall in different banks.
const Q_SLICE_VECS: u32 = K_STEP * BLOCK_M / 4u;
const QK_SLICE_VECS: u32 = K_STEP * (BLOCK_M + BLOCK_N) / 4u;
const V_SLICE_VECS: u32 = N_STEP * DIM_VECS;
const STAGE_VECS: u32 = max(QK_SLICE_VECS, V_SLICE_VECS);
// Granules each invocation fetches per step.
const FETCH_VECS: u32 = (STAGE_VECS + WORKGROUP_SIZE - 1u) / WORKGROUP_SIZE;
const P_STRIDE: u32 = BLOCK_M + 4u;
var<workgroup> staging: array<vec4<TileElem>, STAGES * STAGE_VECS>;
var<workgroup> p_tile: array<vec4<TileElem>, BLOCK_N * P_STRIDE / 4u>;

@group(0) @binding(1) var<storage, read> q: array<Granule>;
@group(0) @binding(2) var<storage, read> k: array<Granule>;
@group(0) @binding(3) var<storage, read> v: array<Granule>;
@group(0) @binding(4) var<storage, read_write> o: array<Granule>;
@group(0) @binding(5) var<storage, read_write> lse: array<u32>;

alias Fetched = array<vec4<f32>, FETCH_VECS>;

// Where a workgroup is: its sequence, query head, K/V head and first query row (counted from the
// sequence's start).
struct Tile {
    seq: Sequence,
    head: u32,
    kv_head: u32,
    m0: u32,
}

// Loads the Q/K slice of columns d0 .. d0+K_STEP for query rows m0.. and key rows n0.. .
// Granule g of the slice is row g % rows, column group g / rows: consecutive invocations take
// consecutive rows, so that their transposed stores below hit consecutive words. Rows past the
// sequence and columns past head_dim read as zero and add nothing to the scores.
fn fetch_qk(tile: Tile, n0: u32, d0: u32, li: u32) -> Fetched {
    var regs: Fetched;
    for (var j = 0u; j < FETCH_VECS; j++) {
        let g = li + j * WORKGROUP_SIZE;
        var x = vec4<f32>(0.0);
        if (g < Q_SLICE_VECS) {
            let row = tile.m0 + g % BLOCK_M;
            let d = d0 + 4u * (g / BLOCK_M);
            if (row < tile.seq.seq_q && d < params.head_dim) {
                x = unpack_granule(q[row_granule(params.q, tile.seq.b, tile.seq.q_first + row, tile.head) + d / 4u]);
            }
        } else if (g < QK_SLICE_VECS) {
            let gk = g - Q_SLICE_VECS;
            let row = n0 + gk % BLOCK_N;
            let d = d0 + 4u * (gk / BLOCK_N);
            if (row < tile.seq.seq_kv && d < params.head_dim) {
                x = unpack_granule(k[row_granule(params.k, tile.seq.b, tile.seq.kv_first + row, tile.kv_head) + d / 4u]);
            }
        }
        regs[j] = x;
    }
    return regs;
}

// Stores a fetched Q/K slice, transposed, into the stage starting at `base`.
fn store_qk(base: u32, regs: Fetched, li: u32) {
    for (var j = 0u; j < FETCH_VECS; j++) {
        let g = li + j * WORKGROUP_SIZE;
        var rows = BLOCK_M;
        var first = base;
        var gs = g;
        if (g >= Q_SLICE_VECS) {
            rows = BLOCK_N;
            first = base + Q_SLICE_VECS;
            gs = g - Q_SLICE_VECS;
        }
        if (g < QK_SLICE_VECS) {
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

// Loads V rows first_row .. first_row+N_STEP, all columns. Rows past seq_kv and columns past
// head_dim are zero: their P is zero, but 0 · garbage could be NaN.
fn fetch_v(tile: Tile, first_row: u32, li: u32) -> Fetched {
    var regs: Fetched;
    for (var j = 0u; j < FETCH_VECS; j++) {
        let g = li + j * WORKGROUP_SIZE;
        let row = first_row + g / DIM_VECS;
        let dg = g % DIM_VECS;
        var x = vec4<f32>(0.0);
        if (g < V_SLICE_VECS && row < tile.seq.seq_kv && 4u * dg < params.head_dim) {
            x = unpack_granule(v[row_granule(params.v, tile.seq.b, tile.seq.kv_first + row, tile.kv_head) + dg]);
        }
        regs[j] = x;
    }
    return regs;
}

fn store_v(base: u32, regs: Fetched, li: u32) {
    for (var j = 0u; j < FETCH_VECS; j++) {
        let g = li + j * WORKGROUP_SIZE;
        if (g < V_SLICE_VECS) {
            staging[base + g] = to_tile4(regs[j]);
        }
    }
}

alias Scores = array<vec4<f32>, ROWS_PER_THREAD * S_VECS>;
alias Output = array<vec4<f32>, ROWS_PER_THREAD * O_VECS>;

// The key columns of score vector c of invocation column tx, in the K/V tile that starts at key n0.
fn score_cols(n0: u32, tx: u32, c: u32) -> vec4<u32> {
    return vec4<u32>(n0 + 4u * (tx + THREADS_X * c)) + vec4<u32>(0u, 1u, 2u, 3u);
}

// s += (Q slice)(K slice)ᵀ for this invocation's rows and score columns.
fn accumulate_scores(s: ptr<function, Scores>, base: u32, row0: u32, tx: u32) {
    for (var kk = 0u; kk < K_STEP; kk++) {
        var q_rows = array<vec4<TileElem>, ROW_VECS>();
        for (var g = 0u; g < ROW_VECS; g++) {
            q_rows[g] = staging[base + (kk * BLOCK_M + row0) / 4u + g];
        }
        for (var c = 0u; c < S_VECS; c++) {
            let k_cols = staging[base + Q_SLICE_VECS + kk * (BLOCK_N / 4u) + tx + THREADS_X * c];
            for (var i = 0u; i < ROWS_PER_THREAD; i++) {
                (*s)[i * S_VECS + c] = mul_add4((*s)[i * S_VECS + c], q_rows[i / 4u][i % 4u], k_cols);
            }
        }
    }
}

// acc += P[:, n_first ..] · (V slice) for this invocation's rows and output columns. With
// `hides_keys` (a tile where some row does not see some key) a zero P adds nothing instead of
// multiplying: a NaN or ±∞ in V at a key the row does not see would make 0·∞ = NaN of it. The
// caller passes a constant, so the copy for tiles that hide nothing keeps the plain multiply-add.
fn accumulate_pv(acc: ptr<function, Output>, base: u32, n_first: u32, row0: u32, tx: u32, hides_keys: bool) {
    for (var n = 0u; n < N_STEP; n++) {
        var p_rows = array<vec4<TileElem>, ROW_VECS>();
        for (var g = 0u; g < ROW_VECS; g++) {
            p_rows[g] = p_tile[((n_first + n) * P_STRIDE + row0) / 4u + g];
        }
        for (var c = 0u; c < O_VECS; c++) {
            let v_cols = staging[base + n * DIM_VECS + tx + THREADS_X * c];
            for (var i = 0u; i < ROWS_PER_THREAD; i++) {
                let p = p_rows[i / 4u][i % 4u];
                let sum = mul_add4((*acc)[i * O_VECS + c], p, v_cols);
                (*acc)[i * O_VECS + c] = select(sum, (*acc)[i * O_VECS + c], hides_keys & (f32(p) == 0.0));
            }
        }
    }
}

@compute @workgroup_size(WORKGROUP_SIZE)
fn flash_fwd(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let head = wg.y;
    let seq = sequence(wg.z);
    let tile = Tile(seq, head, head / params.group_size, (params.num_q_tiles - 1u - wg.x) * BLOCK_M);
    let m0 = tile.m0;
    if (m0 >= seq.seq_q) {
        return; // past this sequence's rows (a shorter sequence of a packed batch)
    }
    let tx = li % THREADS_X;
    let row0 = (li / THREADS_X) * ROWS_PER_THREAD;

    // Keys this tile can see: all of them, or under causal masking those up to the diagonal of
    // its last row, and with a window from its first row's left edge. Tiles outside are skipped,
    // not masked.
    let kv_end = visible_key_end(seq, m0 + BLOCK_M);
    let first_kv_tile = visible_key_begin(seq, m0) / BLOCK_N;
    let num_kv_tiles = (kv_end + BLOCK_N - 1u) / BLOCK_N;
    // So are those a mask's block summary shows hidden whole (mask_blocks_bound.wgsl).
    var t = next_key_tile(seq, head, m0, BLOCK_M, first_kv_tile, num_kv_tiles, BLOCK_N);

    var acc = Output();
    var m_run: array<f32, ROWS_PER_THREAD>;
    var l_run: array<f32, ROWS_PER_THREAD>;
    for (var i = 0u; i < ROWS_PER_THREAD; i++) {
        m_run[i] = LOWEST;
        l_run[i] = 0.0;
    }

    // Pipeline prologue: the first Q/K slice.
    var stage = 0u;
    if (t < num_kv_tiles) {
        store_qk(0u, fetch_qk(tile, t * BLOCK_N, 0u, li), li);
    }
    workgroupBarrier();

    while (t < num_kv_tiles) {
        let n0 = t * BLOCK_N;
        let t_next = next_key_tile(seq, head, m0, BLOCK_M, t + 1u, num_kv_tiles, BLOCK_N);
        // V slices past the last visible key are not needed.
        let v_steps = (min(BLOCK_N, kv_end - n0) + N_STEP - 1u) / N_STEP;

        // ---- S = Q Kᵀ, one K_STEP slice of head_dim per step ----
        var s = Scores(); // explicit: some browsers do not re-zero a var declared in a loop
        for (var c = 0u; c < QK_STEPS; c++) {
            let next = (stage + 1u) % STAGES;
            let last = c + 1u == QK_STEPS;
            var regs = Fetched();
            if (!last) {
                regs = fetch_qk(tile, n0, (c + 1u) * K_STEP, li);
            } else {
                regs = fetch_v(tile, n0, li);
            }
            accumulate_scores(&s, stage * STAGE_VECS, row0, tx);
            if (STAGES == 1u) {
                workgroupBarrier(); // the slice just read is about to be overwritten
            }
            if (!last) {
                store_qk(next * STAGE_VECS, regs, li);
            } else {
                store_v(next * STAGE_VECS, regs, li);
            }
            workgroupBarrier();
            stage = next;
        }

        // ---- online softmax, in base 2 with the scale folded in (and the soft-cap and ALiBi's
        // bias, if any) ----
        let needs_mask = key_tile_needs_mask(seq, m0, BLOCK_M, n0, BLOCK_N);
        // The mask tensor is read unless the summary shows the whole tile visible.
        let reads_mask = HAS_MASK && key_tile_blocks(seq, head, m0, BLOCK_M, n0, BLOCK_N) != BLOCK_VISIBLE;
        // Whether some row of the tile does not see some key of it (P·V then skips zero P).
        let hides_keys = needs_mask || reads_mask || HAS_BIAS;
        var tile_max = array<f32, ROWS_PER_THREAD>();
        for (var i = 0u; i < ROWS_PER_THREAD; i++) {
            var mx = LOWEST;
            for (var c = 0u; c < S_VECS; c++) {
                var x = soft_cap(s[i * S_VECS + c] * params.scale);
                let cols = score_cols(n0, tx, c);
                if (has_alibi()) {
                    x += alibi_bias(head, i32(m0 + row0 + i) + seq.causal_offset, cols);
                }
                if (HAS_BIAS) {
                    // Keys the bias hides (−∞) become LOWEST, as masked ones do; their P is
                    // zeroed below.
                    let bias = score_bias(seq, head, m0 + row0 + i, cols);
                    x = select(x + bias.value, vec4<f32>(LOWEST), bias.hidden);
                }
                if (reads_mask) {
                    // Keys the mask hides become LOWEST too, their P zeroed below.
                    x = select(x, vec4<f32>(LOWEST), mask_hidden(seq, head, m0 + row0 + i, cols));
                }
                if (needs_mask) {
                    x = select(vec4<f32>(LOWEST), x, within_keys(cols, visible_keys(seq, m0 + row0 + i)));
                }
                s[i * S_VECS + c] = x;
                mx = max(mx, max(max(x.x, x.y), max(x.z, x.w)));
            }
            tile_max[i] = mx;
        }
        tile_max = reduce_rows(tile_max, tx, row0, true);
        for (var i = 0u; i < ROWS_PER_THREAD; i++) {
            let m_new = max(m_run[i], tile_max[i]);
            // A row that has seen nothing (m = LOWEST) has zero history: alpha 0 wipes it without
            // forming LOWEST − m_new, which may overflow; otherwise exp2(m_old − m_new) ≤ 1.
            let alpha = select(exp2(m_run[i] - m_new), 0.0, m_run[i] == LOWEST);
            m_run[i] = m_new;
            l_run[i] *= alpha;
            for (var c = 0u; c < O_VECS; c++) {
                acc[i * O_VECS + c] *= alpha;
            }
            for (var c = 0u; c < S_VECS; c++) {
                var p = exp2(s[i * S_VECS + c] - m_new);
                if (HAS_BIAS) {
                    // Keys the bias hid: exp2(LOWEST − m_new) is 1, not 0, in a row that has
                    // seen nothing else yet. (A real score of exactly LOWEST goes the same way:
                    // its weight is 0 beside any score above about LOWEST + 150.)
                    p = select(p, vec4<f32>(0.0), s[i * S_VECS + c] == vec4<f32>(LOWEST));
                }
                if (reads_mask) {
                    // Keys the mask hid, as the bias's above.
                    p = select(p, vec4<f32>(0.0), s[i * S_VECS + c] == vec4<f32>(LOWEST));
                }
                if (needs_mask) {
                    // A row with no visible key yet has m_new = LOWEST and would give exp2(0) = 1.
                    p = select(vec4<f32>(0.0), p, within_keys(score_cols(n0, tx, c), visible_keys(seq, m0 + row0 + i)));
                }
                l_run[i] += (p.x + p.y) + (p.z + p.w);
                s[i * S_VECS + c] = p;
            }
        }
        if (DROPOUT) {
            // Dropout (dropout.wgsl): the row sums above keep every probability (the LSE is the
            // undropped softmax's); what multiplies V is P with the dropped ones zeroed. The
            // kept ones' 1/(1 − p) is applied once, in the epilogue.
            for (var c = 0u; c < S_VECS; c++) {
                let keep = dropout_keep_rows(seq.b, head, m0 + row0, n0 + 4u * (tx + THREADS_X * c));
                for (var i = 0u; i < ROWS_PER_THREAD; i++) {
                    s[i * S_VECS + c] = select(vec4<f32>(0.0), s[i * S_VECS + c], keep[i]);
                }
            }
        }
        // P goes to workgroup memory, transposed: PV needs every column of a row, and the row's
        // columns are spread over THREADS_X invocations.
        for (var c = 0u; c < S_VECS; c++) {
            for (var j = 0u; j < 4u; j++) {
                let col = 4u * (tx + THREADS_X * c) + j;
                for (var g = 0u; g < ROW_VECS; g++) {
                    let r = 4u * g;
                    p_tile[(col * P_STRIDE + row0) / 4u + g] = to_tile4(vec4<f32>(
                        s[r * S_VECS + c][j],
                        s[(r + 1u) * S_VECS + c][j],
                        s[(r + 2u) * S_VECS + c][j],
                        s[(r + 3u) * S_VECS + c][j],
                    ));
                }
            }
        }
        workgroupBarrier();

        // ---- O += P V, one N_STEP slice of keys per step; then the next tile's first Q/K slice ----
        for (var c = 0u; c < v_steps; c++) {
            let next = (stage + 1u) % STAGES;
            let more_v = c + 1u < v_steps;
            let more_tiles = t_next < num_kv_tiles;
            var regs = Fetched();
            if (more_v) {
                regs = fetch_v(tile, n0 + (c + 1u) * N_STEP, li);
            } else if (more_tiles) {
                regs = fetch_qk(tile, t_next * BLOCK_N, 0u, li);
            }
            if (hides_keys) {
                accumulate_pv(&acc, stage * STAGE_VECS, c * N_STEP, row0, tx, true);
            } else {
                accumulate_pv(&acc, stage * STAGE_VECS, c * N_STEP, row0, tx, false);
            }
            if (STAGES == 1u) {
                workgroupBarrier();
            }
            if (more_v) {
                store_v(next * STAGE_VECS, regs, li);
            } else if (more_tiles) {
                store_qk(next * STAGE_VECS, regs, li);
            }
            workgroupBarrier();
            stage = next;
        }
        t = t_next;
    }

    // ---- epilogue: O = acc / l, LSE = (m + log2 l) · ln 2, with the head's sink, if any, joining
    // the sum ----
    let l_total = reduce_rows(l_run, tx, row0, false);
    for (var i = 0u; i < ROWS_PER_THREAD; i++) {
        let row = m0 + row0 + i;
        if (row < seq.seq_q) {
            let total = join_sink(head, m_run[i], l_total[i]);
            let l = total.l;
            // A row that saw no key (causal, seq_q > seq_kv) and no sink has l = 0: its output
            // is 0 (with a sink too, as acc is).
            var inv_l = select(0.0, total.o_factor / l, l > 0.0);
            if (DROPOUT) {
                inv_l *= params.dropout_scale;
            }
            if (!seq.valid) {
                inv_l = nan_f32();
            }
            let out_row = row_granule(params.o, seq.b, seq.q_first + row, head);
            for (var c = 0u; c < O_VECS; c++) {
                let dg = tx + THREADS_X * c;
                if (4u * dg < params.head_dim) {
                    o[out_row + dg] = pack_granule(acc[i * O_VECS + c] * inv_l);
                }
            }
            if (tx == 0u && params.write_lse != 0u) {
                var bits = LSE_EMPTY_BITS;
                if (l > 0.0) {
                    bits = bitcast<u32>((total.m + log2(l)) * 0.6931471805599453);
                }
                if (!seq.valid) {
                    bits = NAN_BITS;
                }
                lse[lse_index(seq, head, row)] = bits;
            }
        }
    }
}
