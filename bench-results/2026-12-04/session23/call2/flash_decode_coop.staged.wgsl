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
// workgroup memory one subgroup at a time), and two windows of workgroup memory no other subgroup
// touches until that merge: `tiles` (f16) and `scores` (f32). A step's K and V cross from the
// cache in 8-byte granules (a head_dim-128 row: one coalesced 256-byte read by the subgroup) into
// registers a step ahead (`k_granules`, `v_granules`); the step copies K into its tile and loads the B fragments from there,
// then V; the V fragments stay in registers while the tile holds P. Fragments loaded straight
// from the cache cost four times the whole kernel's other work on the H200 (their loads, not the
// bytes: the same block reloaded every step was as slow, BENCHMARKS.md); from workgroup memory
// they are cheap. Rows past the piece's keys are copied as zeros, so a fragment never reads past
// the cache and the piece's last block needs no path of its own. Only the subgroup synchronises
// inside the loop (subgroupBarrier, made to cover workgroup memory in src/spirv/coherence.rs).
//
// What an invocation owns: in the copies, the granules lane, lane + 32, ... of a block's rows
// (LANE_GRANULES of them); in the softmax, half of one score row (two invocations per row, 32 per
// subgroup): it reads its scores from the subgroup's `scores` window, applies the scale,
// soft-cap, ALiBi and mask (decode_common.wgsl's scores4/sees, exactly as the FMA kernel), keeps
// the row's running max and sum, writes its half of P (f16, into the tile) and the row's
// rescaling factor (into `scores`). The output stays in accumulator fragments for the whole
// kernel and is rescaled by a 16×16 matrix of factors multiplied component-wise (coop_rows.wgsl).
// Masked keys never enter the max, so any finite scale is exact.
//
// Why the sizes: 16×16×16 f16 → f32 is the configuration NVIDIA and AMD expose, and a
// speculative decoding step's rows (4 query heads per K/V head × 4 new tokens) fill one 16-row
// block; more rows take more workgroups (grid y), fewer leave rows of the block idle (with one
// token, 4 of 16: selection keeps the lane kernel there, src/plan/policy.rs). BLOCK_N keys per
// step and SUBGROUPS bound the workgroup memory (a tile of BLOCK_N padded rows and a score window
// per subgroup: eight subgroups of 16 keys at head_dim 128 take 46 KiB of the 48 the H200 offers)
// and set the bytes in flight per workgroup (a step's K and V per subgroup).
// Plans: src/plan/decode.rs (COOP_DECODE_PLANS).

const SUBGROUP: u32 = 32u;
const ROWS: u32 = 16u;
const PARTS: u32 = SUBGROUPS;
const WG: u32 = SUBGROUPS * SUBGROUP;
const D_BLOCKS: u32 = HEAD_GRANULES / 4u;
const N_BLOCKS: u32 = BLOCK_N / 16u;
// K (or V) fragments of one step.
const STEP_FRAGS: u32 = N_BLOCKS * D_BLOCKS;
// The granules of one 16-key block each lane copies (16 rows of HEAD_GRANULES over 32 lanes, a
// whole number as head_dim is a multiple of 16), and of a step. Granules, not 16-byte words:
// naga cannot reinterpret a u32 word as f16s, and the tile must hold f16 for the fragment loads.
const BLOCK_GRANULES: u32 = 16u * HEAD_GRANULES / SUBGROUP;
const LANE_GRANULES: u32 = N_BLOCKS * BLOCK_GRANULES;
// vec4s of a half score row, and the row strides of the windows: scores (vec4<f32>), P and the
// tile's rows (vec4<f16> granules), factors (vec4<f32>, in the scores window). Padded so that
// consecutive rows start in different banks.
const HALF_VECS: u32 = BLOCK_N / 8u;
const S_STRIDE: u32 = BLOCK_N / 4u + 1u;
const P_STRIDE: u32 = BLOCK_N / 4u + 2u;
const F_STRIDE: u32 = 5u;
const T_STRIDE: u32 = HEAD_GRANULES + 2u;
// Granules of a subgroup's tile: BLOCK_N rows of K or V, or P's 16 rows (fewer granules for
// every BLOCK_N ≥ 16), or at the start the workgroup's Q (in the first subgroups' tiles).
const TILE: u32 = BLOCK_N * T_STRIDE;
// The merged output at the end reuses `scores`: 16 rows of HEAD_GRANULES vec4s.
const MERGED_STRIDE: u32 = HEAD_GRANULES;

@group(0) @binding(1) var<storage, read> q: array<vec4<f16>>;
@group(0) @binding(2) var<storage, read> k: array<vec4<f16>>;
@group(0) @binding(3) var<storage, read> v: array<vec4<f16>>;

var<workgroup> tiles: array<vec4<f16>, SUBGROUPS * TILE>;
var<workgroup> scores: array<vec4<f32>, max(SUBGROUPS * ROWS * S_STRIDE, ROWS * MERGED_STRIDE)>;

// Granule of key `key`'s row (the piece's sequence and K/V head) in a tensor of layout `t`; flags
// a page past the pool.
fn checked_row(t: TensorStrides, piece: DecodePiece, key: u32) -> u32 {
    let at = cache_row(t, piece.b, key, piece.kv_head);
    if (at.y == 0u) {
        bad_index.x = 1u;
    }
    return at.x;
}

// This lane's granules of the K (of_k) or V rows of the step at `block`: zero for rows past the
// piece's keys, which are not read. The 16 keys of a block are rows at the layout's key stride
// from the first: they lie in one page (a page holds a multiple of 16 keys and blocks start at
// multiples of 16).
fn load_granules(piece: DecodePiece, block: u32, lane: u32, of_k: bool) -> array<vec4<f16>, LANE_GRANULES> {
    // Initialized explicitly (flash_decode.wgsl's load_step says why).
    var granules = array<vec4<f16>, LANE_GRANULES>();
    var t = params.v;
    if (of_k) {
        t = params.k;
    }
    // @unroll
    for (var j = 0u; j < N_BLOCKS; j++) {
        let key0 = block + 16u * j;
        if (key0 < piece.end) {
            let base = checked_row(t, piece, key0);
            // @unroll
            for (var i = 0u; i < BLOCK_GRANULES; i++) {
                let item = lane + SUBGROUP * i;
                let r = item / HEAD_GRANULES;
                if (key0 + r < piece.end) {
                    let at = base + r * t.seq + item % HEAD_GRANULES;
                    if (of_k) {
                        granules[j * BLOCK_GRANULES + i] = k[at];
                    } else {
                        granules[j * BLOCK_GRANULES + i] = v[at];
                    }
                }
            }
        }
    }
    return granules;
}

// Writes a step's granules (load_granules) into the subgroup's tile at `tile`, row by row.
fn stash_granules(granules: array<vec4<f16>, LANE_GRANULES>, tile: u32, lane: u32) {
    // @unroll
    for (var j = 0u; j < N_BLOCKS; j++) {
        // @unroll
        for (var i = 0u; i < BLOCK_GRANULES; i++) {
            let item = lane + SUBGROUP * i;
            tiles[tile + (16u * j + item / HEAD_GRANULES) * T_STRIDE + item % HEAD_GRANULES] = granules[j * BLOCK_GRANULES + i];
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
    // Blocks start at multiples of 16 (a piece does), so 16 keys never straddle two pages.
    let start = piece.first & ~15u;
    let step = SUBGROUPS * BLOCK_N;
    // The first step's K and V are in flight while Q is gathered.
    var k_granules = load_granules(piece, start + sg * BLOCK_N, lane, true);
    var v_granules = load_granules(piece, start + sg * BLOCK_N, lane, false);

    // Q's rows, gathered through workgroup memory into A fragments.
    for (var item = li; item < ROWS * HEAD_GRANULES; item += WG) {
        let i = item / HEAD_GRANULES;
        let g = item % HEAD_GRANULES;
        let row = decode_row(piece, i);
        tiles[i * T_STRIDE + g] = q[row_granule(params.q, piece.b, row.token, row.head) + g];
    }
    workgroupBarrier();
    var q_frag: array<coop_mat16x16<f16, A>, D_BLOCKS>;
    // @unroll
    for (var d = 0u; d < D_BLOCKS; d++) {
        q_frag[d] = coopLoadT<coop_mat16x16<f16, A>>(&tiles[4u * d], T_STRIDE);
    }
    workgroupBarrier();

    let my_tile = sg * TILE;
    let my_scores = sg * ROWS * S_STRIDE;
    var o_frag: array<coop_mat16x16<f32, C>, D_BLOCKS>;
    // @unroll
    for (var d = 0u; d < D_BLOCKS; d++) {
        o_frag[d] = coop_mat16x16<f32, C>();
    }
    // The row's running max (base 2) and sum; the sum is positive once the row saw a key.
    var m = 0.0;
    var l = 0.0;
    // Trip counts and branches below are uniform over the subgroup, as cooperative operations
    // need. Each step ends at a subgroup barrier, after which its tile may be overwritten.
    for (var block = start + sg * BLOCK_N; block < keys_end; block += step) {
        stash_granules(k_granules, my_tile, lane);
        subgroupBarrier();
        var s_frag: array<coop_mat16x16<f32, C>, N_BLOCKS>; // set in full below, before any read
        // @unroll
        for (var j = 0u; j < N_BLOCKS; j++) {
            s_frag[j] = coop_mat16x16<f32, C>();
            if (block + 16u * j < keys_end) {
                // @unroll
                for (var d = 0u; d < D_BLOCKS; d++) {
                    let k_frag = coopLoad<coop_mat16x16<f16, B>>(&tiles[my_tile + 16u * j * T_STRIDE + 4u * d], T_STRIDE);
                    s_frag[j] = coopMultiplyAdd(q_frag[d], k_frag, s_frag[j]);
                }
            }
            coopStoreT(s_frag[j], &scores[my_scores + 4u * j], S_STRIDE);
        }
        // Every lane has loaded its K fragments: V takes the tile, and the next step's granules
        // are in flight until the next step's copies.
        subgroupBarrier();
        stash_granules(v_granules, my_tile, lane);
        k_granules = load_granules(piece, block + step, lane, true);
        v_granules = load_granules(piece, block + step, lane, false);
        subgroupBarrier();
        var v_frag: array<coop_mat16x16<f16, B>, STEP_FRAGS>; // set in full below, before any read
        // @unroll
        for (var j = 0u; j < N_BLOCKS; j++) {
            // @unroll
            for (var d = 0u; d < D_BLOCKS; d++) {
                v_frag[j * D_BLOCKS + d] = coopLoadT<coop_mat16x16<f16, B>>(&tiles[my_tile + 16u * j * T_STRIDE + 4u * d], T_STRIDE);
            }
        }

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
            x[i] = select(vec4<f32>(0.0), exp2(x[i] - new_max), visible);
            sum += x[i].x + x[i].y + x[i].z + x[i].w;
        }
        sum += subgroupShuffleXor(sum, 1u);
        if (row_any) {
            m = new_max;
            l = l * factor + sum;
        }
        // Every lane has read its scores and loaded its V fragments: P takes the tile, the
        // factors the scores window.
        subgroupBarrier();
        // @unroll
        for (var i = 0u; i < HALF_VECS; i++) {
            tiles[my_tile + r * P_STRIDE + half * HALF_VECS + i] = vec4<f16>(x[i]);
        }
        scores[my_scores + r * F_STRIDE + 2u * half] = vec4<f32>(factor);
        scores[my_scores + r * F_STRIDE + 2u * half + 1u] = vec4<f32>(factor);
        subgroupBarrier();

        scale_rows(&o_frag, coopLoadT<coop_mat16x16<f32, C>>(&scores[my_scores], F_STRIDE));
        // @unroll
        for (var j = 0u; j < N_BLOCKS; j++) {
            if (block + 16u * j < keys_end) {
                let p_frag = coopLoadT<coop_mat16x16<f16, A>>(&tiles[my_tile + 4u * j], P_STRIDE);
                // @unroll
                for (var d = 0u; d < D_BLOCKS; d++) {
                    o_frag[d] = coopMultiplyAdd(p_frag, v_frag[j * D_BLOCKS + d], o_frag[d]);
                }
            }
        }
        subgroupBarrier();
    }

    // Merge the subgroups: each one's output, weighted to the rows' merged max, is added into
    // `merged` (the start of `scores`, free once every subgroup has left its loop and scaled its
    // output) one at a time.
    if (half == 0u) {
        group_max[sg * ROWS + r] = m;
        group_sum[sg * ROWS + r] = l;
    }
    workgroupBarrier();
    let weight = part_weight(m, l, merged_stats(r).x);
    scores[my_scores + r * F_STRIDE + 2u * half] = vec4<f32>(weight);
    scores[my_scores + r * F_STRIDE + 2u * half + 1u] = vec4<f32>(weight);
    subgroupBarrier();
    scale_rows(&o_frag, coopLoadT<coop_mat16x16<f32, C>>(&scores[my_scores], F_STRIDE));
    workgroupBarrier();
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
