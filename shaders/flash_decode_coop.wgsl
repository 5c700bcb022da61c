// flash_decode_coop.wgsl — the decode kernel (a few query rows per sequence against a long K/V
// cache, split along the keys) on the matrix units: QKᵀ and PV as 16×16×16 f16 products with f32
// accumulators, through wgpu's cooperative matrices. The grid, the packing of query heads × new
// tokens into rows, the pieces of the keys, the caches, and the epilogue are flash_decode.wgsl's
// (their shared code is decode_common.wgsl); so is the combine that merges the pieces.
//
// What a workgroup owns: one K/V head of one sequence, 16 packed query rows (one matrix block; the
// rows past the K/V head's last repeat it) and one piece of the keys. The packed rows' Q is
// gathered once through workgroup memory into each subgroup's A fragments.
//
// What a subgroup owns: blocks of BLOCK_N consecutive keys of the piece (subgroup s takes blocks
// s, s + SUBGROUPS, ...), with its own running max, sum and output for the 16 rows, merged with
// the other subgroups' at the end (their statistics by decode_common.wgsl, their outputs added in
// workgroup memory one subgroup at a time). K and V fragments are loaded straight
// from the cache: 16 keys of one K/V head are 16 rows at one stride (a page holds a multiple of 16
// keys and blocks start at multiples of 16, so also in a paged cache). Each K and V byte is read
// once, by one subgroup; they are not staged. The next step's K and this step's V are loaded
// before the softmax; on the H200 where they are issued does not change the time, which those
// loads set all the same (four times the rest of the kernel; a copy through workgroup memory was
// slower: BENCHMARKS.md, "What the matrix decode kernel waits on"). The one block of 16
// keys a piece may end inside is copied into workgroup memory with zero rows past its end, since
// a fragment load would read past the cache.
//
// What an invocation owns: half of one score row (two invocations per row, 32 per subgroup) in
// the softmax: it reads its scores from the subgroup's window of workgroup memory, applies the
// scale, soft-cap, ALiBi and mask (decode_common.wgsl's scores4/sees, exactly as the FMA kernel),
// keeps the row's running max and sum, writes its half of P (f16) and the row's rescaling
// factor. The output stays in accumulator fragments for the whole kernel and is rescaled by a
// 16×16 matrix of factors multiplied component-wise (coop_rows.wgsl). Masked keys never enter the max, so any finite scale is exact.
//
// Why the sizes: 16×16×16 f16 → f32 is the configuration NVIDIA and AMD expose, and a
// speculative decoding step's rows (4 query heads per K/V head × 4 new tokens) fill one 16-row
// block; more rows take more workgroups (grid y), fewer leave rows of the block idle (with one
// token, 4 of 16: selection keeps the lane kernel there, src/plan/policy.rs). BLOCK_N keys per step bound the fragments in flight; SUBGROUPS the
// workgroup memory (scores, P and factors per subgroup) and the loads in flight per workgroup.
// Plans: src/plan/decode.rs (COOP_DECODE_PLANS).

const SUBGROUP: u32 = 32u;
const ROWS: u32 = 16u;
const PARTS: u32 = SUBGROUPS;
const WG: u32 = SUBGROUPS * SUBGROUP;
const D_BLOCKS: u32 = HEAD_GRANULES / 4u;
const N_BLOCKS: u32 = BLOCK_N / 16u;
// K (or V) fragments of one step.
const STEP_FRAGS: u32 = N_BLOCKS * D_BLOCKS;
// vec4s of a half score row, and the row strides of the windows: scores (vec4<f32>), P and the
// staged rows (vec4<f16> granules), factors (vec4<f32>). Padded so that consecutive rows start in
// different banks.
const HALF_VECS: u32 = BLOCK_N / 8u;
const S_STRIDE: u32 = BLOCK_N / 4u + 1u;
const P_STRIDE: u32 = BLOCK_N / 4u + 2u;
const F_STRIDE: u32 = 5u;
const T_STRIDE: u32 = HEAD_GRANULES + 2u;
// The merged output at the end reuses `scores`: 16 rows of HEAD_GRANULES vec4s.
const MERGED_STRIDE: u32 = HEAD_GRANULES;

@group(0) @binding(1) var<storage, read> q: array<vec4<f16>>;
@group(0) @binding(2) var<storage, read> k: array<vec4<f16>>;
@group(0) @binding(3) var<storage, read> v: array<vec4<f16>>;

var<workgroup> scores: array<vec4<f32>, max(SUBGROUPS * ROWS * S_STRIDE, ROWS * MERGED_STRIDE)>;
var<workgroup> probs: array<vec4<f16>, SUBGROUPS * ROWS * P_STRIDE>;
var<workgroup> factors: array<vec4<f32>, SUBGROUPS * ROWS * F_STRIDE>;
// Q's 16 rows at the start; then the piece's last, partial block of keys: K rows, then V rows.
var<workgroup> staged: array<vec4<f16>, 2u * ROWS * T_STRIDE>;

// Copies keys key0 .. key0 + count (< 16) of K and V into `staged`, zero rows after them. By one
// subgroup; the caller's subgroupBarrier publishes it.
fn stage_partial_block(piece: DecodePiece, key0: u32, count: u32, lane: u32) {
    for (var item = lane; item < 2u * ROWS * HEAD_GRANULES; item += SUBGROUP) {
        let is_v = item >= ROWS * HEAD_GRANULES;
        let rest = item % (ROWS * HEAD_GRANULES);
        let r = rest / HEAD_GRANULES;
        let g = rest % HEAD_GRANULES;
        var value = vec4<f16>(0.0);
        if (r < count) {
            if (is_v) {
                value = v[checked_row(params.v, piece, key0 + r) + g];
            } else {
                value = k[checked_row(params.k, piece, key0 + r) + g];
            }
        }
        staged[select(0u, ROWS * T_STRIDE, is_v) + r * T_STRIDE + g] = value;
    }
}

// Granule of key `key`'s row (the piece's sequence and K/V head) in a tensor of layout `t`; flags
// a page past the pool.
fn checked_row(t: TensorStrides, piece: DecodePiece, key: u32) -> u32 {
    let at = cache_row(t, piece.b, key, piece.kv_head);
    if (at.y == 0u) {
        bad_index.x = 1u;
    }
    return at.x;
}

// The K fragments (B operands of QKᵀ, column-major) of the step's blocks from `block`: from the
// cache, or for the piece's partial last block from `staged`, which this call fills with its K
// and V (load_v_step then reads V from there). Blocks past the keys are left as they are. Uniform
// over the subgroup.
fn load_k_step(frags: ptr<function, array<coop_mat16x16<f16, B>, STEP_FRAGS>>, piece: DecodePiece, block: u32, lane: u32) {
    // @unroll
    for (var j = 0u; j < N_BLOCKS; j++) {
        let key0 = block + 16u * j;
        if (key0 + 16u <= piece.end) {
            let at = checked_row(params.k, piece, key0);
            // @unroll
            for (var d = 0u; d < D_BLOCKS; d++) {
                (*frags)[j * D_BLOCKS + d] = coopLoad<coop_mat16x16<f16, B>>(&k[at + 4u * d], params.k.seq);
            }
        } else if (key0 < piece.end) {
            stage_partial_block(piece, key0, piece.end - key0, lane);
            subgroupBarrier();
            // @unroll
            for (var d = 0u; d < D_BLOCKS; d++) {
                (*frags)[j * D_BLOCKS + d] = coopLoad<coop_mat16x16<f16, B>>(&staged[4u * d], T_STRIDE);
            }
        }
    }
}

// The V fragments (B operands of PV, row-major) of the step's blocks from `block`, as
// load_k_step (which staged a partial block).
fn load_v_step(frags: ptr<function, array<coop_mat16x16<f16, B>, STEP_FRAGS>>, piece: DecodePiece, block: u32) {
    // @unroll
    for (var j = 0u; j < N_BLOCKS; j++) {
        let key0 = block + 16u * j;
        if (key0 + 16u <= piece.end) {
            let at = checked_row(params.v, piece, key0);
            // @unroll
            for (var d = 0u; d < D_BLOCKS; d++) {
                (*frags)[j * D_BLOCKS + d] = coopLoadT<coop_mat16x16<f16, B>>(&v[at + 4u * d], params.v.seq);
            }
        } else if (key0 < piece.end) {
            // @unroll
            for (var d = 0u; d < D_BLOCKS; d++) {
                (*frags)[j * D_BLOCKS + d] = coopLoadT<coop_mat16x16<f16, B>>(&staged[ROWS * T_STRIDE + 4u * d], T_STRIDE);
            }
        }
    }
}

@compute @workgroup_size(WG)
fn flash_decode(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let piece = decode_piece(wg, li);
    let sg = li / SUBGROUP;
    let lane = li % SUBGROUP;
    // In the softmax: this invocation's row and half of it.
    let r = lane / 2u;
    let half = lane % 2u;
    let keys_end = piece.end;
    let mine = decode_row(piece, r);

    // Q's rows, gathered through workgroup memory into A fragments.
    for (var item = li; item < ROWS * HEAD_GRANULES; item += WG) {
        let i = item / HEAD_GRANULES;
        let g = item % HEAD_GRANULES;
        let row = decode_row(piece, i);
        staged[i * T_STRIDE + g] = q[row_granule(params.q, piece.b, row.token, row.head) + g];
    }
    workgroupBarrier();
    var q_frag: array<coop_mat16x16<f16, A>, D_BLOCKS>;
    // @unroll
    for (var d = 0u; d < D_BLOCKS; d++) {
        q_frag[d] = coopLoadT<coop_mat16x16<f16, A>>(&staged[4u * d], T_STRIDE);
    }
    workgroupBarrier();

    let my_scores = sg * ROWS * S_STRIDE;
    let my_probs = sg * ROWS * P_STRIDE;
    let my_factors = sg * ROWS * F_STRIDE;
    var o_frag: array<coop_mat16x16<f32, C>, D_BLOCKS>;
    // @unroll
    for (var d = 0u; d < D_BLOCKS; d++) {
        o_frag[d] = coop_mat16x16<f32, C>();
    }
    // The row's running max (base 2) and sum; the sum is positive once the row saw a key.
    var m = 0.0;
    var l = 0.0;
    // Blocks start at multiples of 16 (a piece does), so 16 keys never straddle two pages.
    let start = piece.first & ~15u;
    // Trip counts and branches below are uniform over the subgroup, as cooperative operations need.
    // A step's K fragments are loaded during the step before (its softmax and barriers), its V
    // fragments before its QKᵀ products.
    let step = SUBGROUPS * BLOCK_N;
    var k_frag: array<coop_mat16x16<f16, B>, STEP_FRAGS>;
    var v_frag: array<coop_mat16x16<f16, B>, STEP_FRAGS>;
    load_k_step(&k_frag, piece, start + sg * BLOCK_N, lane);
    for (var block = start + sg * BLOCK_N; block < keys_end; block += step) {
        load_v_step(&v_frag, piece, block);
        var s_frag: array<coop_mat16x16<f32, C>, N_BLOCKS>; // set in full below, before any read
        // @unroll
        for (var j = 0u; j < N_BLOCKS; j++) {
            s_frag[j] = coop_mat16x16<f32, C>();
            if (block + 16u * j < keys_end) {
                // @unroll
                for (var d = 0u; d < D_BLOCKS; d++) {
                    s_frag[j] = coopMultiplyAdd(q_frag[d], k_frag[j * D_BLOCKS + d], s_frag[j]);
                }
            }
            coopStoreT(s_frag[j], &scores[my_scores + 4u * j], S_STRIDE);
        }
        load_k_step(&k_frag, piece, block + step, lane);
        subgroupBarrier();

        // The softmax of this invocation's half row: keys first .. first + BLOCK_N / 2.
        let first = block + half * (BLOCK_N / 2u);
        let at = my_scores + r * S_STRIDE + half * HALF_VECS;
        var x: array<vec4<f32>, HALF_VECS>; // set in full below, before any read
        var step_max = 0.0;
        var any_visible = false;
        // @unroll
        for (var i = 0u; i < HALF_VECS; i++) {
            let key = first + 4u * i;
            x[i] = scores4(scores[at + i], mine, key);
            step_max = max_visible(step_max, any_visible, x[i].x, sees(mine, key));
            any_visible = any_visible | sees(mine, key);
            step_max = max_visible(step_max, any_visible, x[i].y, sees(mine, key + 1u));
            any_visible = any_visible | sees(mine, key + 1u);
            step_max = max_visible(step_max, any_visible, x[i].z, sees(mine, key + 2u));
            any_visible = any_visible | sees(mine, key + 2u);
            step_max = max_visible(step_max, any_visible, x[i].w, sees(mine, key + 3u));
            any_visible = any_visible | sees(mine, key + 3u);
        }
        // The other half of the row is the neighbouring invocation.
        let other_max = subgroupShuffleXor(step_max, 1u);
        let other_any = subgroupShuffleXor(u32(any_visible), 1u) != 0u;
        step_max = max_visible(step_max, any_visible, other_max, other_any);
        let row_any = any_visible | other_any;
        let seen = l > 0.0;
        let new_max = select(step_max, max(m, step_max), seen);
        // Rows that see no key here keep their state (factor 1, P = 0).
        let factor = select(1.0, select(0.0, exp2(m - new_max), seen), row_any);
        var sum = 0.0;
        // @unroll
        for (var i = 0u; i < HALF_VECS; i++) {
            let key = first + 4u * i;
            let visible = vec4<bool>(sees(mine, key), sees(mine, key + 1u), sees(mine, key + 2u), sees(mine, key + 3u));
            let p = select(vec4<f32>(0.0), exp2(x[i] - new_max), visible);
            sum += p.x + p.y + p.z + p.w;
            probs[my_probs + r * P_STRIDE + half * HALF_VECS + i] = vec4<f16>(p);
        }
        sum += subgroupShuffleXor(sum, 1u);
        if (row_any) {
            m = new_max;
            l = l * factor + sum;
        }
        factors[my_factors + r * F_STRIDE + 2u * half] = vec4<f32>(factor);
        factors[my_factors + r * F_STRIDE + 2u * half + 1u] = vec4<f32>(factor);
        subgroupBarrier();

        scale_rows(&o_frag, coopLoadT<coop_mat16x16<f32, C>>(&factors[my_factors], F_STRIDE));
        // @unroll
        for (var j = 0u; j < N_BLOCKS; j++) {
            if (block + 16u * j < keys_end) {
                let p_frag = coopLoadT<coop_mat16x16<f16, A>>(&probs[my_probs + 4u * j], P_STRIDE);
                // @unroll
                for (var d = 0u; d < D_BLOCKS; d++) {
                    o_frag[d] = coopMultiplyAdd(p_frag, v_frag[j * D_BLOCKS + d], o_frag[d]);
                }
            }
        }
    }

    // Merge the subgroups: each one's output, weighted to the rows' merged max, is added into
    // `merged` (the scores window, free once every subgroup has left its loop) one at a time.
    if (half == 0u) {
        group_max[sg * ROWS + r] = m;
        group_sum[sg * ROWS + r] = l;
    }
    workgroupBarrier();
    let weight = part_weight(m, l, merged_stats(r).x);
    factors[my_factors + r * F_STRIDE + 2u * half] = vec4<f32>(weight);
    factors[my_factors + r * F_STRIDE + 2u * half + 1u] = vec4<f32>(weight);
    subgroupBarrier();
    scale_rows(&o_frag, coopLoadT<coop_mat16x16<f32, C>>(&factors[my_factors], F_STRIDE));
    for (var g = 0u; g < SUBGROUPS; g++) {
        if (sg == g) {
            // @unroll
            for (var d = 0u; d < D_BLOCKS; d++) {
                var total = o_frag[d];
                if (g > 0u) {
                    total = total + coopLoadT<coop_mat16x16<f32, C>>(&scores[4u * d], MERGED_STRIDE);
                }
                coopStoreT(total, &scores[4u * d], MERGED_STRIDE);
            }
        }
        workgroupBarrier();
    }

    write_rows(piece, li);
}

// Granule g of row r of the merged output, in `scores` (decode_common.wgsl's write_rows reads it).
fn merged_granule(r: u32, g: u32) -> vec4<f32> {
    return scores[r * MERGED_STRIDE + g];
}
