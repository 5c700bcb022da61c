// flash_fwd_coop.wgsl — exact attention forward on the GPU's matrix units (tensor cores), through
// wgpu's cooperative matrices: QKᵀ and PV as 16×16×16 f16 products with f32 accumulators, the
// online softmax in f32 on the invocations.
//
// Bindings as flash_fwd.wgsl: 0 params, 1 q, 2 k, 3 v (here arrays of halves), 4 o (f16 granules),
// 5 the LSE bits.
//
// What a workgroup owns: one tile of BLOCK_M query rows of one (batch, head), like the register
// kernel (same grid, same longest-first order, same causal tile skipping). It streams K/V in tiles
// of BLOCK_N keys, staged in workgroup memory as f16 with zero-filled tails.
//
// What a subgroup owns: 16 query rows. It holds their Q as HEAD_DIM_PAD/16 cooperative A
// fragments (loaded once) and their output as HEAD_DIM_PAD/16 f32 accumulator fragments for the
// whole kernel. Per K/V tile it computes its 16 × BLOCK_N scores into workgroup memory (the only
// way to reach single elements of a cooperative matrix), where its invocations — two per row, 32
// per subgroup, a size the host checks — apply scale and mask, keep the running max and sum, and
// write P in f16 for the PV product.
//
// Why rescaling is rare: the output lives in accumulator fragments, which cannot be scaled row by
// row, so rescaling means a round trip through workgroup memory. Following FlashAttention-4, a
// row's reference max m_used only moves when a tile's max exceeds it by more than
// RESCALE_THRESHOLD (log2 units); until then P = exp2(s − m_used) ≤ 2^8, which f16 holds, and O and
// l stay consistent because both use the same m_used. The result is exact either way. The decision
// to rescale is made for the whole workgroup (workgroupUniformLoad), because cooperative
// operations must stay in uniform control flow.
//
// Where K and V come from: with DIRECT_KV (and tensors whose rows start on 16-byte boundaries,
// which the host reports in params.flags), the cooperative loads read K and V straight from the
// storage buffers, through the L1 cache that the workgroup's subgroups share: no staging stores,
// no barrier between staging and product. The last, partial K/V tile (and every tile otherwise)
// goes through workgroup memory with zero-filled tails, because a cooperative load of rows past
// the sequence could leave the buffer.
//
// Why the sizes: 16 × 16 × 16 f16 → f32 is the configuration NVIDIA and AMD expose; staged rows
// are padded by 8 halves so consecutive rows start in different banks; BLOCK_N and the subgroup
// count come from the host, fitted to the workgroup memory (48 KiB on NVIDIA).

const SUBGROUP: u32 = 32u;
const SUBGROUPS: u32 = BLOCK_M / 16u;
const WORKGROUP_SIZE: u32 = SUBGROUPS * SUBGROUP;
const D_BLOCKS: u32 = HEAD_DIM_PAD / 16u;
const N_BLOCKS: u32 = BLOCK_N / 16u;
const DIM_VECS: u32 = HEAD_DIM_PAD / 4u;
// Halves per staged row of Q, K or V.
const TILE_STRIDE: u32 = HEAD_DIM_PAD + 8u;
// f32 per row of a subgroup's scores, and halves per row of its P.
const S_STRIDE: u32 = BLOCK_N + 4u;
const P_STRIDE: u32 = BLOCK_N + 8u;
// Columns of a score row each of its two invocations handles.
const HALF_N: u32 = BLOCK_N / 2u;
const RESCALE_THRESHOLD: f32 = 8.0;

// Q at the start, then each tile's K, then its V.
var<workgroup> rows_f16: array<f16, max(BLOCK_M, BLOCK_N) * TILE_STRIDE>;
// Per subgroup: 16 rows of scores (also a 16 × 16 window when the output is rescaled).
var<workgroup> scores: array<f32, SUBGROUPS * 16u * S_STRIDE>;
var<workgroup> probs: array<f16, SUBGROUPS * 16u * P_STRIDE>;
// x: whether any row's reference max moved this tile; y: whether the next K/V tile is read in
// place. Both are decided per tile and read with workgroupUniformLoad, because cooperative
// operations must stay in control flow that naga can prove uniform, and its analysis treats
// anything computed from a loop counter as non-uniform. A vec4, though two words are used: the driver
// lays out workgroup variables in an order of its own, and cooperative loads and stores need
// 16-byte-aligned addresses; with a 4-byte variable placed first, every array after it was off
// by 4 bytes on the H200 and the products silently read shifted rows (BENCHMARKS.md). With every
// variable a multiple of 16 bytes, any order keeps them aligned.
var<workgroup> tile_flags: vec4<u32>;

// Q, K and V as halves (the only storage this kernel takes), so that cooperative loads can read
// them in place; O goes out in granules like every other kernel's.
@group(0) @binding(1) var<storage, read> q: array<f16>;
@group(0) @binding(2) var<storage, read> k: array<f16>;
@group(0) @binding(3) var<storage, read> v: array<f16>;
@group(0) @binding(4) var<storage, read_write> o: array<Granule>;
@group(0) @binding(5) var<storage, read_write> lse: array<u32>;

// Element (half) index of (b, row, h, 0) of Q, K or V.
fn row_element(t: TensorStrides, b: u32, row: u32, h: u32) -> u32 {
    return 4u * row_granule(t, b, row, h);
}

// Bit of params.flags: every row of K and V starts on a 16-byte boundary (the host checks
// offsets and strides), so cooperative loads may read them in place.
const FLAG_ROWS_ALIGNED: u32 = 1u;

const STAGE_Q: u32 = 0u;
const STAGE_K: u32 = 1u;
const STAGE_V: u32 = 2u;

// Stages `count` rows of Q, K or V (rows past `row_end` and columns past head_dim as zeros) into
// rows_f16, row r at r · TILE_STRIDE. All invocations take part; the caller places the barriers.
fn stage_rows(which: u32, b: u32, h: u32, first_row: u32, count: u32, row_end: u32, li: u32) {
    for (var g = li; g < count * DIM_VECS; g += WORKGROUP_SIZE) {
        let r = g / DIM_VECS;
        let dg = g % DIM_VECS;
        let row = first_row + r;
        var x = vec4<f16>(0.0);
        if (row < row_end && 4u * dg < params.head_dim) {
            switch which {
                case STAGE_Q: {
                    let e = row_element(params.q, b, row, h) + 4u * dg;
                    x = vec4<f16>(q[e], q[e + 1u], q[e + 2u], q[e + 3u]);
                }
                case STAGE_K: {
                    let e = row_element(params.k, b, row, h) + 4u * dg;
                    x = vec4<f16>(k[e], k[e + 1u], k[e + 2u], k[e + 3u]);
                }
                default: {
                    let e = row_element(params.v, b, row, h) + 4u * dg;
                    x = vec4<f16>(v[e], v[e + 1u], v[e + 2u], v[e + 3u]);
                }
            }
        }
        let at = r * TILE_STRIDE + 4u * dg;
        rows_f16[at] = x.x;
        rows_f16[at + 1u] = x.y;
        rows_f16[at + 2u] = x.z;
        rows_f16[at + 3u] = x.w;
    }
}

@compute @workgroup_size(WORKGROUP_SIZE)
fn flash_fwd_coop(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let head = wg.y;
    let b = wg.z;
    let kv_head = head / params.group_size;
    let m0 = (params.num_q_tiles - 1u - wg.x) * BLOCK_M;
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

    // Q fragments, once.
    stage_rows(STAGE_Q, b, head, m0, BLOCK_M, params.seq_q, li);
    workgroupBarrier();
    var q_frag: array<coop_mat16x16<f16, A>, D_BLOCKS>;
    // @unroll
    for (var d = 0u; d < D_BLOCKS; d++) {
        q_frag[d] = coopLoadT<coop_mat16x16<f16, A>>(&rows_f16[sg * 16u * TILE_STRIDE + 16u * d], TILE_STRIDE);
    }

    var o_frag: array<coop_mat16x16<f32, C>, D_BLOCKS>;
    // @unroll
    for (var d = 0u; d < D_BLOCKS; d++) {
        o_frag[d] = coop_mat16x16<f32, C>();
    }
    var m_used = NEG_BIG; // this row's reference max (same in both invocations of the row)
    var l_part = 0.0; // sum of exp2(s − m_used) over this invocation's columns

    // Whole tiles of aligned rows are read in place (tile_flags.y, published by invocation 0).
    let aligned = DIRECT_KV && (params.flags & FLAG_ROWS_ALIGNED) != 0u;
    let k_stride = 4u * params.k.seq;
    let v_stride = 4u * params.v.seq;
    if (li == 0u) {
        tile_flags.y = u32(aligned && BLOCK_N <= params.seq_kv);
    }
    for (var t = 0u; t < num_kv_tiles; t++) {
        let n0 = t * BLOCK_N;
        // Also the barrier after which everyone is done with rows_f16 (Q fragments, last V).
        let direct = workgroupUniformLoad(&tile_flags).y != 0u;
        if (li == 0u) {
            tile_flags.x = 0u;
        }
        if (!direct) {
            stage_rows(STAGE_K, b, kv_head, n0, BLOCK_N, params.seq_kv, li);
            workgroupBarrier();
        }

        // ---- S = Q Kᵀ into this subgroup's score rows ----
        // head_dim blocks outside, key blocks inside: N_BLOCKS independent accumulators keep
        // the matrix units busy instead of one chain of dependent multiply-adds. Kᵀ is a
        // column-major B: its element (d, n) is K row n, column d. This product and P·V below come
        // twice, reading the storage buffer or the staged rows: WGSL has no pointer that could
        // stand for either address space.
        var s_frag: array<coop_mat16x16<f32, C>, N_BLOCKS>;
        // @unroll
        for (var j = 0u; j < N_BLOCKS; j++) {
            s_frag[j] = coop_mat16x16<f32, C>();
        }
        if (direct) {
            let k0 = row_element(params.k, b, n0, kv_head);
            // @unroll
            for (var d = 0u; d < D_BLOCKS; d++) {
                // @unroll
                for (var j = 0u; j < N_BLOCKS; j++) {
                    let k_frag = coopLoad<coop_mat16x16<f16, B>>(&k[k0 + 16u * j * k_stride + 16u * d], k_stride);
                    s_frag[j] = coopMultiplyAdd(q_frag[d], k_frag, s_frag[j]);
                }
            }
        } else {
            // @unroll
            for (var d = 0u; d < D_BLOCKS; d++) {
                // @unroll
                for (var j = 0u; j < N_BLOCKS; j++) {
                    let k_frag = coopLoad<coop_mat16x16<f16, B>>(&rows_f16[16u * j * TILE_STRIDE + 16u * d], TILE_STRIDE);
                    s_frag[j] = coopMultiplyAdd(q_frag[d], k_frag, s_frag[j]);
                }
            }
        }
        // @unroll
        for (var j = 0u; j < N_BLOCKS; j++) {
            coopStoreT(s_frag[j], &scores[my_scores + 16u * j], S_STRIDE);
        }
        workgroupBarrier(); // scores visible to the invocations; K no longer needed

        // V can replace K while the invocations work on the scores.
        if (!direct) {
            stage_rows(STAGE_V, b, kv_head, n0, BLOCK_N, params.seq_kv, li);
        }

        // ---- online softmax on this invocation's half row ----
        // The scale is applied as the scores are read (twice), not written back: one
        // workgroup-memory store fewer per score.
        let needs_mask = n0 + BLOCK_N > params.seq_kv
            || (params.causal != 0u && i32(n0 + BLOCK_N) > i32(m0) + params.causal_offset + 1);
        let first_col = half_n * HALF_N;
        let my_row = my_scores + r * S_STRIDE + first_col;
        var tile_max = NEG_BIG;
        for (var c = 0u; c < HALF_N; c++) {
            var x = scores[my_row + c] * params.scale;
            if (needs_mask && !is_visible(row, n0 + first_col + c)) {
                x = NEG_BIG;
            }
            tile_max = max(tile_max, x);
        }
        tile_max = max(tile_max, subgroupShuffleXor(tile_max, 16u));
        // Move the reference max only when the tile's max is far above it (or on the first tile,
        // when the output is still zero and moving it costs nothing).
        var m_new = m_used;
        if (tile_max > m_used + RESCALE_THRESHOLD || t == 0u) {
            m_new = max(m_used, tile_max);
        }
        let alpha = exp2(m_used - m_new);
        if (t > 0u && m_new != m_used) {
            tile_flags.x = 1u; // the same value from every writer
        }
        m_used = m_new;
        l_part *= alpha;
        for (var c = 0u; c < HALF_N; c++) {
            let col = first_col + c;
            var p = exp2(scores[my_row + c] * params.scale - m_used);
            if (needs_mask && !is_visible(row, n0 + col)) {
                p = 0.0;
            }
            l_part += p;
            probs[my_probs + r * P_STRIDE + col] = f16(p);
        }

        // ---- rare: rescale the output rows whose reference max moved ----
        if (workgroupUniformLoad(&tile_flags).x != 0u) {
            // @unroll
            for (var d = 0u; d < D_BLOCKS; d++) {
                coopStoreT(o_frag[d], &scores[my_scores], S_STRIDE);
                workgroupBarrier();
                for (var c = 0u; c < 8u; c++) {
                    scores[my_scores + r * S_STRIDE + half_n * 8u + c] *= alpha;
                }
                workgroupBarrier();
                o_frag[d] = coopLoadT<coop_mat16x16<f32, C>>(&scores[my_scores], S_STRIDE);
            }
        }
        workgroupBarrier(); // V staged, P written

        // ---- O += P V ----
        if (direct) {
            let v0 = row_element(params.v, b, n0, kv_head);
            // @unroll
            for (var j = 0u; j < N_BLOCKS; j++) {
                let p_frag = coopLoadT<coop_mat16x16<f16, A>>(&probs[my_probs + 16u * j], P_STRIDE);
                // @unroll
                for (var d = 0u; d < D_BLOCKS; d++) {
                    let v_frag = coopLoadT<coop_mat16x16<f16, B>>(&v[v0 + 16u * j * v_stride + 16u * d], v_stride);
                    o_frag[d] = coopMultiplyAdd(p_frag, v_frag, o_frag[d]);
                }
            }
        } else {
            // @unroll
            for (var j = 0u; j < N_BLOCKS; j++) {
                let p_frag = coopLoadT<coop_mat16x16<f16, A>>(&probs[my_probs + 16u * j], P_STRIDE);
                // @unroll
                for (var d = 0u; d < D_BLOCKS; d++) {
                    let v_frag = coopLoadT<coop_mat16x16<f16, B>>(&rows_f16[16u * j * TILE_STRIDE + 16u * d], TILE_STRIDE);
                    o_frag[d] = coopMultiplyAdd(p_frag, v_frag, o_frag[d]);
                }
            }
        }
        if (li == 0u) {
            tile_flags.y = u32(aligned && n0 + 2u * BLOCK_N <= params.seq_kv);
        }
    }

    // ---- epilogue: O / l through workgroup memory, 16 columns at a time; LSE ----
    let l = l_part + subgroupShuffleXor(l_part, 16u);
    let inv_l = select(0.0, 1.0 / l, l > 0.0);
    let out_row = row_granule(params.o, b, row, head);
    // @unroll
    for (var d = 0u; d < D_BLOCKS; d++) {
        workgroupBarrier();
        coopStoreT(o_frag[d], &scores[my_scores], S_STRIDE);
        workgroupBarrier();
        // Each invocation writes two granules (8 columns) of its row.
        for (var g = 0u; g < 2u; g++) {
            let col = half_n * 8u + 4u * g;
            let at = my_scores + r * S_STRIDE + col;
            let x = vec4<f32>(scores[at], scores[at + 1u], scores[at + 2u], scores[at + 3u]);
            if (row < params.seq_q && 16u * d + col < params.head_dim) {
                o[out_row + (16u * d + col) / 4u] = pack_granule(x * inv_l);
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
