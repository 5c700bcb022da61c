// flash_fwd.wgsl — exact attention forward, FlashAttention-2 style, register-tiled.
//
//   O = softmax(scale · Q Kᵀ [causal mask]) V,   LSE = log Σ exp(scale · Q Kᵀ)
//
// Bindings: 0 params (common.wgsl), 1 q, 2 k, 3 v (read), 4 o (write) — arrays of granules —
// and 5 the f32 log-sum-exp, written as raw bits.
//
// What a workgroup owns: one tile of BLOCK_M query rows of one (batch, head). The grid is
// (num_q_tiles, num_heads, batch); the x index is reversed so that, under causal masking, the tiles
// with the most keys to visit start first. The workgroup streams the K/V sequence in tiles of
// BLOCK_N keys and keeps, per query row, a running max m and sum l of exp2 of the scores (the
// online softmax), rescaling its partial output by exp2(m_old − m_new) whenever m grows. Only
// O (seq_q × head_dim) and LSE (seq_q) are ever written: memory stays O(seq). Under causal
// masking the K/V tiles wholly above the diagonal are never visited; only tiles that cross the
// diagonal or the end of the sequence evaluate the mask.
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
// sizes come from the host (src/select.rs) in a generated `const` block, fitted to the adapter's
// workgroup memory (16 KiB in WebGPU by default, 32 KiB on lavapipe, 48 KiB on NVIDIA Vulkan) and
// invocation limit. Column groups are interleaved across tx (not blocked) so that the invocations of
// a row read consecutive 16-byte words of workgroup memory: no bank conflicts.

const WORKGROUP_SIZE: u32 = THREADS_X * THREADS_Y;
const ROWS_PER_THREAD: u32 = BLOCK_M / THREADS_Y;
const ROW_VECS: u32 = ROWS_PER_THREAD / 4u;
const S_VECS: u32 = BLOCK_N / (4u * THREADS_X);
const O_VECS: u32 = HEAD_DIM_PAD / (4u * THREADS_X);
const DIM_VECS: u32 = HEAD_DIM_PAD / 4u;

// Workgroup memory, in vec4s of the tile type:
// * staging: during QKᵀ a K_STEP-wide slice of Q (transposed, [k][m]) then of K ([k][n]); during PV
//   an N_STEP-row slice of V ([n][d]). The phases alternate, so they share the space.
// * p_tile: the probabilities P of the current K/V tile, transposed ([n][m]) so that an invocation
//   reads its ROWS_PER_THREAD rows of one column as vec4s. Rows are padded by one vec4 so that the
//   column-wise writes of the THREADS_X invocations of a row fall in different banks.
const Q_SLICE_VECS: u32 = K_STEP * BLOCK_M / 4u;
const STAGING_VECS: u32 = max(K_STEP * (BLOCK_M + BLOCK_N), N_STEP * HEAD_DIM_PAD) / 4u;
const P_STRIDE: u32 = BLOCK_M + 4u;
var<workgroup> staging: array<vec4<TileElem>, STAGING_VECS>;
var<workgroup> p_tile: array<vec4<TileElem>, BLOCK_N * P_STRIDE / 4u>;

@group(0) @binding(1) var<storage, read> q: array<Granule>;
@group(0) @binding(2) var<storage, read> k: array<Granule>;
@group(0) @binding(3) var<storage, read> v: array<Granule>;
@group(0) @binding(4) var<storage, read_write> o: array<Granule>;
@group(0) @binding(5) var<storage, read_write> lse: array<u32>;

// Stores a K_STEP-wide slice (columns d0 .. d0+K_STEP) of `rows` tensor rows starting at `first_row`,
// transposed, at staging[base ..]: element (r, kk) goes to scalar position kk·rows + r. Rows past
// `row_end` and columns past head_dim read as zero, so they add nothing to the scores.
fn stage_slice_transposed(is_q: bool, tensor: TensorStrides, b: u32, h: u32, first_row: u32, rows: u32, row_end: u32, d0: u32, base: u32, li: u32) {
    let granules = rows * (K_STEP / 4u);
    for (var g = li; g < granules; g += WORKGROUP_SIZE) {
        // Consecutive invocations take consecutive rows, so their workgroup-memory stores below
        // hit consecutive words.
        let r = g % rows;
        let kg = g / rows;
        let row = first_row + r;
        let d = d0 + 4u * kg;
        var x = vec4<f32>(0.0);
        if (row < row_end && d < params.head_dim) {
            let at = row_granule(tensor, b, row, h) + d / 4u;
            if (is_q) {
                x = unpack_granule(q[at]);
            } else {
                x = unpack_granule(k[at]);
            }
        }
        let t = to_tile4(x);
        for (var j = 0u; j < 4u; j++) {
            let pos = (4u * kg + j) * rows + r;
            staging[base + pos / 4u][pos % 4u] = t[j];
        }
    }
}

// Stores V rows first_row .. first_row+N_STEP at staging[0 ..] as [n][d]; rows past seq_kv and
// columns past head_dim are zero (their P is zero, but 0 · garbage could be NaN).
fn stage_v_rows(b: u32, h: u32, first_row: u32, li: u32) {
    for (var g = li; g < N_STEP * DIM_VECS; g += WORKGROUP_SIZE) {
        let r = g / DIM_VECS;
        let dg = g % DIM_VECS;
        let row = first_row + r;
        var x = vec4<f32>(0.0);
        if (row < params.seq_kv && 4u * dg < params.head_dim) {
            x = unpack_granule(v[row_granule(params.v, b, row, h) + dg]);
        }
        staging[g] = to_tile4(x);
    }
}

@compute @workgroup_size(WORKGROUP_SIZE)
fn flash_fwd(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let q_tile = params.num_q_tiles - 1u - wg.x;
    let head = wg.y;
    let b = wg.z;
    let kv_head = head / params.group_size;
    let m0 = q_tile * BLOCK_M;
    let tx = li % THREADS_X;
    let row0 = (li / THREADS_X) * ROWS_PER_THREAD;

    // Keys this tile can see: all of them, or under causal masking those up to the diagonal of
    // its last row. Tiles past that are skipped, not masked.
    var kv_end = params.seq_kv;
    if (params.causal != 0u) {
        kv_end = u32(clamp(i32(m0 + BLOCK_M) + params.causal_offset, 0, i32(params.seq_kv)));
    }
    let num_kv_tiles = (kv_end + BLOCK_N - 1u) / BLOCK_N;

    var acc: array<vec4<f32>, ROWS_PER_THREAD * O_VECS>;
    var m_run: array<f32, ROWS_PER_THREAD>;
    var l_run: array<f32, ROWS_PER_THREAD>;
    for (var i = 0u; i < ROWS_PER_THREAD; i++) {
        m_run[i] = NEG_BIG;
        l_run[i] = 0.0;
    }

    for (var t = 0u; t < num_kv_tiles; t++) {
        let n0 = t * BLOCK_N;

        // ---- S = Q Kᵀ for this tile, K_STEP columns of head_dim at a time ----
        var s: array<vec4<f32>, ROWS_PER_THREAD * S_VECS>;
        for (var d0 = 0u; d0 < HEAD_DIM_PAD; d0 += K_STEP) {
            workgroupBarrier(); // everyone is done reading the previous slice
            stage_slice_transposed(true, params.q, b, head, m0, BLOCK_M, params.seq_q, d0, 0u, li);
            stage_slice_transposed(false, params.k, b, kv_head, n0, BLOCK_N, params.seq_kv, d0, Q_SLICE_VECS, li);
            workgroupBarrier();
            for (var kk = 0u; kk < K_STEP; kk++) {
                var q_rows: array<vec4<TileElem>, ROW_VECS>;
                for (var g = 0u; g < ROW_VECS; g++) {
                    q_rows[g] = staging[(kk * BLOCK_M + row0) / 4u + g];
                }
                for (var c = 0u; c < S_VECS; c++) {
                    let k_cols = staging[Q_SLICE_VECS + kk * (BLOCK_N / 4u) + tx + THREADS_X * c];
                    for (var i = 0u; i < ROWS_PER_THREAD; i++) {
                        s[i * S_VECS + c] = mul_add4(s[i * S_VECS + c], q_rows[i / 4u][i % 4u], k_cols);
                    }
                }
            }
        }

        // ---- online softmax, in base 2 with the scale folded in ----
        let needs_mask = n0 + BLOCK_N > params.seq_kv
            || (params.causal != 0u && i32(n0 + BLOCK_N) > i32(m0) + params.causal_offset + 1);
        var tile_max: array<f32, ROWS_PER_THREAD>;
        for (var i = 0u; i < ROWS_PER_THREAD; i++) {
            var mx = NEG_BIG;
            for (var c = 0u; c < S_VECS; c++) {
                var x = s[i * S_VECS + c] * params.scale;
                if (needs_mask) {
                    for (var j = 0u; j < 4u; j++) {
                        x[j] = select(NEG_BIG, x[j], is_visible(m0 + row0 + i, n0 + 4u * (tx + THREADS_X * c) + j));
                    }
                }
                s[i * S_VECS + c] = x;
                mx = max(mx, max(max(x.x, x.y), max(x.z, x.w)));
            }
            tile_max[i] = mx;
        }
        tile_max = reduce_rows(tile_max, tx, row0, true);
        for (var i = 0u; i < ROWS_PER_THREAD; i++) {
            let m_new = max(m_run[i], tile_max[i]);
            // exp2(NEG_BIG − m) underflows to 0, so the first visible key wipes the (zero) history
            // of a row, and a row that has seen nothing keeps alpha = 1 on zeros.
            let alpha = exp2(m_run[i] - m_new);
            m_run[i] = m_new;
            l_run[i] *= alpha;
            for (var c = 0u; c < O_VECS; c++) {
                acc[i * O_VECS + c] *= alpha;
            }
            for (var c = 0u; c < S_VECS; c++) {
                var p = exp2(s[i * S_VECS + c] - m_new);
                if (needs_mask) {
                    // A row with no visible key yet has m_new = NEG_BIG and would give exp2(0) = 1.
                    for (var j = 0u; j < 4u; j++) {
                        p[j] = select(0.0, p[j], is_visible(m0 + row0 + i, n0 + 4u * (tx + THREADS_X * c) + j));
                    }
                }
                l_run[i] += (p.x + p.y) + (p.z + p.w);
                s[i * S_VECS + c] = p;
            }
        }
        // P goes to workgroup memory, transposed: PV needs every column of a row, and the row's
        // columns are spread over THREADS_X invocations. (The barrier at the start of each V slice
        // below orders these writes before the reads.)
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

        // ---- O += P V, N_STEP keys at a time; slices past the visible keys are skipped ----
        for (var nc = 0u; nc < BLOCK_N && n0 + nc < kv_end; nc += N_STEP) {
            workgroupBarrier();
            stage_v_rows(b, kv_head, n0 + nc, li);
            workgroupBarrier();
            for (var n = 0u; n < N_STEP; n++) {
                var p_rows: array<vec4<TileElem>, ROW_VECS>;
                for (var g = 0u; g < ROW_VECS; g++) {
                    p_rows[g] = p_tile[((nc + n) * P_STRIDE + row0) / 4u + g];
                }
                for (var c = 0u; c < O_VECS; c++) {
                    let v_cols = staging[n * DIM_VECS + tx + THREADS_X * c];
                    for (var i = 0u; i < ROWS_PER_THREAD; i++) {
                        acc[i * O_VECS + c] = mul_add4(acc[i * O_VECS + c], p_rows[i / 4u][i % 4u], v_cols);
                    }
                }
            }
        }
    }

    // ---- epilogue: O = acc / l, LSE = (m + log2 l) · ln 2 ----
    let l_total = reduce_rows(l_run, tx, row0, false);
    for (var i = 0u; i < ROWS_PER_THREAD; i++) {
        let row = m0 + row0 + i;
        if (row < params.seq_q) {
            let l = l_total[i];
            // A row that saw no key (causal, seq_q > seq_kv) has l = 0: its output is 0.
            let inv_l = select(0.0, 1.0 / l, l > 0.0);
            let out_row = row_granule(params.o, b, row, head);
            for (var c = 0u; c < O_VECS; c++) {
                let dg = tx + THREADS_X * c;
                if (4u * dg < params.head_dim) {
                    o[out_row + dg] = pack_granule(acc[i * O_VECS + c] * inv_l);
                }
            }
            if (tx == 0u && params.write_lse != 0u) {
                var bits = LSE_EMPTY_BITS;
                if (l > 0.0) {
                    bits = bitcast<u32>((m_run[i] + log2(l)) * 0.6931471805599453);
                }
                lse[lse_index(b, head, row)] = bits;
            }
        }
    }
}
