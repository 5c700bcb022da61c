// flash_bwd_coop.wgsl — what the two cooperative-matrix gradient kernels share
// (flash_bwd_dkdv_coop.wgsl, flash_bwd_dq_coop.wgsl): input bindings, staging whole rows of f16 into
// workgroup memory, and the one element-wise step of the backward, P and dS of a 16 × 16 block.
//
// Bindings as flash_bwd_stage.wgsl: 2 q, 3 k, 4 v, 5 d_o (here arrays of vec4<f16>, the 8-byte
// granules every kernel indexes), 6 the forward's LSE (raw f32 bits, natural log), 7 delta =
// rowsum(dO ∘ O) (flash_bwd_pre.wgsl). The kernel files add their outputs at 8 (and 9).
//
// The products are 16 × 16 × 16 f16 → f32 cooperative matrices, as in the forward
// (flash_fwd_coop.wgsl). The element-wise step, P = exp2(S · scale − LSE · log2 e) and
// dS = P ∘ (dP − D), takes one of two routes, as the forward's softmax does:
// * in registers (REGISTER_GRADIENT, where the device's fragment layout allows it:
//   src/caps/register_layout.rs): each invocation computes P and dS on its own components of the
//   S and dP accumulators and puts them into A operands component by component, the accumulator
//   and the A operand being laid out alike (probs_in_registers, gradient_operand). Which query
//   and key a component is, the kernel measures once at its start (block_positions);
// * through workgroup memory, for the other devices: a subgroup stores its S and then its dP
//   block (f32) in one window, each invocation reads eight elements of one row of each, forms P
//   and dS, and writes them back as f16, which the subgroup loads as the A operands of the next
//   products. The blocks are the subgroup's alone, so only the subgroup synchronises
//   (subgroupBarrier, made to cover workgroup memory in src/spirv/coherence.rs). Every scratch
//   block is laid out [query][key] in both kernels (the dK/dV kernel's transposed scores are
//   stored column-major), so the step is the same code: invocation `lane` owns row lane / 2, keys
//   8 · (lane % 2) .. + 8.
//
// A soft-cap (SOFTCAP) and ALiBi's bias (ALIBI, its slopes from the head count: a slopes tensor takes
// the tiled kernels) are compiled in, as in the forward, so that the plain kernels carry neither:
// P's exponent is the forward's logit (logits), and dS = P ∘ (dP − D) is multiplied by the cap's
// slope 1 − tanh², the logit's derivative in the scaled score.
//
// Why f16 for P and dS: they are the A operands of the f16 products (FlashAttention-2 rounds them
// to the input type too); P ≤ 1, and |dS| ≤ |dP| + |D| ≤ 2 · |dO row| · (largest |V row|), within
// f16's range unless those rows are huge, and where it is not, the gradients come out non-finite,
// not silently wrong. Sums stay f32 (the accumulators, D, the LSE).

const SUBGROUP: u32 = 32u;
const WORKGROUP_SIZE: u32 = SUBGROUPS * SUBGROUP;
const D_BLOCKS: u32 = HEAD_DIM_PAD / 16u;
// Granules (vec4<f16>) per row of a tensor, and per staged row: padded by one 16-byte pair, so
// that the eight 16-byte rows a fragment load reads at once start in different banks (as in the
// forward).
const ROW_GRANULES: u32 = HEAD_DIM_PAD / 4u;
const TILE_STRIDE: u32 = ROW_GRANULES + 2u;
// A 16 × 16 f32 block: rows of 4 vec4s plus one of padding; an f16 block: 4 vec4<f16>s plus two
// (16 bytes, keeping every row 16-byte aligned for the cooperative loads).
const SCORE_STRIDE: u32 = 5u;
const SCORE_BLOCK: u32 = 16u * SCORE_STRIDE;
const PROB_STRIDE: u32 = 6u;
const PROB_BLOCK: u32 = 16u * PROB_STRIDE;

// SCORE_WINDOWS f32 blocks (the kernel's constant): the window S and then dP pass through on the
// workgroup-memory route, one per subgroup, and through which output blocks are written out (and
// the register route's positions measured), where the register route's kernels let their
// subgroups take turns at fewer. One f32 block per subgroup rather than two leaves room for the
// dK/dV kernel's query groups at head_dim 128 in 48 KiB. Then PROB_BLOCKS f16 blocks per subgroup
// (the dK/dV kernel keeps P and dS, the dQ kernel dS, the split kernel exchanges Pᵀ; at least one
// block in all, as WGSL has no empty arrays).
var<workgroup> score_scratch: array<vec4<f32>, SCORE_WINDOWS * SCORE_BLOCK>;
var<workgroup> prob_scratch: array<vec4<f16>, max(1u, SUBGROUPS * PROB_BLOCKS) * PROB_BLOCK>;

@group(0) @binding(2) var<storage, read> q: array<vec4<f16>>;
@group(0) @binding(3) var<storage, read> k: array<vec4<f16>>;
@group(0) @binding(4) var<storage, read> v: array<vec4<f16>>;
@group(0) @binding(5) var<storage, read> d_o: array<vec4<f16>>;
@group(0) @binding(6) var<storage, read> lse: array<u32>;
@group(0) @binding(7) var<storage, read> delta: array<f32>;

// The sequence, query head and K/V head rows are read for.
struct Heads {
    seq: Sequence,
    head: u32,
    kv_head: u32,
}

const SRC_Q: u32 = 0u;
const SRC_DO: u32 = 1u;
const SRC_K: u32 = 2u;
const SRC_V: u32 = 3u;

// Rows of one tensor as a staging reads them: the granule index of granule 0 of the first row
// staged, the rows' stride in granules, and how many rows from the first on exist.
struct RowRun {
    at: u32,
    stride: u32,
    rows: u32,
}

// The rows of tensor `src` from row `first` of the sequence on (for Q and dO of query head
// hd.head, for K and V of hd.kv_head).
fn row_run(src: u32, hd: Heads, first: u32) -> RowRun {
    var t = params.q;
    var row0 = hd.seq.q_first;
    var len = hd.seq.seq_q;
    var head = hd.head;
    switch src {
        case 1u: {
            t = grad.d_o;
        }
        case 2u: {
            t = params.k;
        }
        case 3u: {
            t = params.v;
        }
        default: {}
    }
    if (src >= SRC_K) {
        row0 = hd.seq.kv_first;
        len = hd.seq.seq_kv;
        head = hd.kv_head;
    }
    return RowRun(row_granule(t, hd.seq.b, row0 + first, head), t.seq, len - min(first, len));
}

// Whether granule `g` of row `r` of `run` exists: not past the end of the sequence nor past
// head_dim. A copy that does not is padding, staged as zero so that padding rows and columns add
// nothing to any product.
fn run_has(run: RowRun, r: u32, g: u32) -> bool {
    return (r < run.rows) & (4u * g < params.head_dim);
}

// Granule `g` of row `r` of `run`, a row of tensor `src`; zero where it does not exist.
fn load_run_granule(src: u32, run: RowRun, r: u32, g: u32) -> vec4<f16> {
    if (run_has(run, r, g)) {
        return load_granule(src, run.at + r * run.stride + g);
    }
    return vec4<f16>(0.0);
}

// Granule `at` of tensor `src`.
fn load_granule(src: u32, at: u32) -> vec4<f16> {
    switch src {
        case 0u: {
            return q[at];
        }
        case 1u: {
            return d_o[at];
        }
        case 2u: {
            return k[at];
        }
        default: {
            return v[at];
        }
    }
}

// Staging copies rows of two tensors at once (K and V, or Q and dO): `rows` rows of `src_a` then
// `rows` rows of `src_b`, from row `first` of each, to consecutive staged rows of the kernel's
// `tiles`. Consecutive invocations take consecutive granules of a row (coalesced 8-byte loads). An
// invocation issues STAGE_BATCH loads into registers before it stores any, so their latencies
// overlap (one round trip to L2 per batch, not per granule): chunk `chunk` is copies
// chunk · STAGE_BATCH + c of the 2 · rows · ROW_GRANULES granules (staging_copy).
// (STAGE_BATCH comes from the host, which unrolls the loops over it: GradKernel::stage_batch.)
//
// A batch fetched a tile ahead, to be stored after this tile's products, loads every copy: a load
// that may be skipped (the granule or a zero) compiles to a load into a temporary and a move that
// waits for it where it is issued, so such a fetch would wait before the products instead of
// during them. Its padding copies load granule 0 of their tensor instead, and `kept` (bit c for
// copy c) says which copies are real; the others are stored as zeros. A batch staged at once keeps
// the conditional loads (every copy kept): there the loads are waited for right away anyway, and
// the H200 ran the dQ kernel's synchronous staging much slower with unconditional ones
// (BENCHMARKS.md, session 25).
struct StageBatch {
    granules: array<vec4<f16>, STAGE_BATCH>,
    kept: u32,
}
const_assert STAGE_BATCH <= 32u;

// Staged row and granule of an invocation's copy `n`: copy n of invocation li is granule
// n · WORKGROUP_SIZE + li of the rows laid end to end. Where whole rows fit the workgroup (every
// shipped plan), an invocation keeps one granule column and its row steps by a constant, so that
// once unrolled no copy divides, and its address is the run's plus a multiple of the row stride.
fn staging_copy(n: u32, li: u32) -> vec2<u32> {
    if (WORKGROUP_SIZE % ROW_GRANULES == 0u) {
        return vec2<u32>(n * (WORKGROUP_SIZE / ROW_GRANULES) + li / ROW_GRANULES, li % ROW_GRANULES);
    }
    let i = n * WORKGROUP_SIZE + li;
    return vec2<u32>(i / ROW_GRANULES, i % ROW_GRANULES);
}

// Whether copy `n` of invocation `li` is of a staged row before `rows`. Where whole rows fit the
// workgroup and `rows` is a multiple of the rows one copy of every invocation covers (every shipped
// plan), the answer is the same for every invocation: once unrolled, the choice of tensor is no
// branch.
fn copy_before(n: u32, li: u32, rows: u32) -> bool {
    let step = WORKGROUP_SIZE / ROW_GRANULES;
    if ((WORKGROUP_SIZE % ROW_GRANULES == 0u) && (rows % step == 0u)) {
        return n * step < rows;
    }
    return staging_copy(n, li).x < rows;
}

// Chunk `chunk` of a staging (see StageBatch), loaded into registers; `ahead`: every copy loaded.
fn fetch_batch(src_a: u32, src_b: u32, hd: Heads, first: u32, rows: u32, chunk: u32, li: u32, ahead: bool) -> StageBatch {
    let run_a = row_run(src_a, hd, first);
    let run_b = row_run(src_b, hd, first);
    var batch = StageBatch();
    batch.kept = select(0xffffffffu, 0u, ahead);
    // @unroll
    for (var c = 0u; c < STAGE_BATCH; c++) {
        let n = chunk * STAGE_BATCH + c;
        let copy = staging_copy(n, li);
        if (ahead) {
            if (copy_before(n, li, rows)) {
                let has = run_has(run_a, copy.x, copy.y);
                batch.granules[c] = load_granule(src_a, select(0u, run_a.at + copy.x * run_a.stride + copy.y, has));
                batch.kept |= select(0u, 1u << c, has);
            } else {
                let r = copy.x - rows;
                let has = copy_before(n, li, 2u * rows) & run_has(run_b, r, copy.y);
                batch.granules[c] = load_granule(src_b, select(0u, run_b.at + r * run_b.stride + copy.y, has));
                batch.kept |= select(0u, 1u << c, has);
            }
        } else if (copy.x < rows) {
            batch.granules[c] = load_run_granule(src_a, run_a, copy.x, copy.y);
        } else if (copy.x < 2u * rows) {
            batch.granules[c] = load_run_granule(src_b, run_b, copy.x - rows, copy.y);
        }
    }
    return batch;
}

// Stores a chunk fetched by fetch_batch at staged row `at` on.
fn store_batch(batch: StageBatch, at: u32, rows: u32, chunk: u32, li: u32) {
    // @unroll
    for (var c = 0u; c < STAGE_BATCH; c++) {
        let copy = staging_copy(chunk * STAGE_BATCH + c, li);
        if (copy.x < 2u * rows) {
            let kept = ((batch.kept >> c) & 1u) != 0u;
            tiles[(at + copy.x) * TILE_STRIDE + copy.y] = select(vec4<f16>(0.0), batch.granules[c], kept);
        }
    }
}

// Chunks of a staging of `rows` rows of each of two tensors.
fn stage_chunks(rows: u32) -> u32 {
    return (2u * rows * ROW_GRANULES + STAGE_BATCH * WORKGROUP_SIZE - 1u) / (STAGE_BATCH * WORKGROUP_SIZE);
}

// Stages `rows` rows of `src_a` and of `src_b` from row `first` at staged row `at` on, chunk by chunk.
fn stage_pair(src_a: u32, src_b: u32, hd: Heads, first: u32, rows: u32, at: u32, li: u32) {
    for (var chunk = 0u; chunk < stage_chunks(rows); chunk++) {
        store_batch(fetch_batch(src_a, src_b, hd, first, rows, chunk, li, false), at, rows, chunk, li);
    }
}

// A query tile of a dK/dV kernel's work items (flash_bwd_common.wgsl's item_head, item_m0): the
// query head and K/V head its rows are read for, and its first row.
struct QueryTile {
    hd: Heads,
    m0: u32,
}

// Work item `it`'s query tile; past the last item, rows past the end of the sequence, of which a
// fetch a tile ahead (made unconditionally: StageBatch) keeps nothing (its loads read granule 0).
fn item_tile(seq: Sequence, kv_head: u32, it: u32, num_items: u32, first_tile: u32, tiles_per_head: u32) -> QueryTile {
    if (it >= num_items) {
        return QueryTile(Heads(seq, kv_head * params.group_size, kv_head), seq.seq_q);
    }
    return QueryTile(Heads(seq, item_head(kv_head, it, tiles_per_head), kv_head), item_m0(it, first_tile, tiles_per_head));
}

// A query tile's Q and dO rows, fetched a tile ahead (one batch holds them: the kernels' PREFETCH_QDO).
fn fetch_query_tile(tile: QueryTile, li: u32) -> StageBatch {
    return fetch_batch(SRC_Q, SRC_DO, tile.hd, tile.m0, BLOCK_M, 0u, li, true);
}

// A query row's LSE bits (x) and D's bits (y), loaded whether or not the row exists (row 0's
// where it does not), so that the load can be issued a tile ahead (StageBatch says why).
fn fetch_row_stats(seq: Sequence, head: u32, row: u32) -> vec2<u32> {
    let at = select(0u, lse_index(seq, head, row), row < seq.seq_q);
    return vec2<u32>(lse[at], bitcast<u32>(delta[at]));
}

// LSE · log2 e (x) and D (y) of a query row from fetch_row_stats; a row that does not exist sees
// no key.
fn row_stats_of(raw: vec2<u32>, exists: bool) -> vec2<f32> {
    return select(vec2<f32>(-NEG_BIG, 0.0), vec2<f32>(lse2_of_bits(raw.x), bitcast<f32>(raw.y)), exists);
}

// LSE · log2 e (x) and D (y) of query row `row` of `head`, read at once.
fn query_row_stats(seq: Sequence, head: u32, row: u32) -> vec2<f32> {
    return row_stats_of(fetch_row_stats(seq, head, row), row < seq.seq_q);
}

// ALiBi's slope · log2 e of query head `head` (0 without ALIBI), for logits: worked out once per
// head, not per score.
fn alibi_slope2(head: u32) -> f32 {
    if (ALIBI) {
        return alibi_slope(head) * LOG2_E;
    }
    return 0.0;
}

// The base-2 logits of four raw scores `s` of query rows `queries` against keys `keys` (both
// sequence-relative), as the forward formed them (x): the scale, the soft-cap (SOFTCAP; tanh as
// the forward's CapForm, with tanh's series near 0 under CAP_SERIES) and ALiBi's bias at the
// head's `alibi2` (alibi_slope2); and the cap's slope 1 − tanh² at each (y), the logit's
// derivative in the scaled score (1 without a cap).
fn logits(s: vec4<f32>, alibi2: f32, seq: Sequence, queries: vec4<u32>, keys: vec4<u32>) -> array<vec4<f32>, 2> {
    var x = s * params.scale;
    var slope = vec4<f32>(1.0);
    if (SOFTCAP) {
        let inv_cap = 1.0 / params.softcap; // uniform
        var t = vec4<f32>(); // tanh of the scaled score over the cap
        if (CAP_SERIES) {
            x = cap_times_tanh(x, x * inv_cap, params.softcap);
            t = x * inv_cap;
        } else {
            t = tanh_by_exp2(x * inv_cap);
            x = params.softcap * t;
        }
        slope = 1.0 - t * t;
    }
    if (ALIBI) {
        x += alibi_bias_at(alibi2, vec4<i32>(queries) + vec4<i32>(seq.causal_offset), keys);
    }
    return array<vec4<f32>, 2>(x, slope);
}

// Where block `i` (< PROB_BLOCKS) of subgroup `sg`'s f16 scratch starts.
fn prob_block(sg: u32, i: u32) -> u32 {
    return (sg * PROB_BLOCKS + i) * PROB_BLOCK;
}

// P and dS of one 16 × 16 block of scores: `s` = S (or Sᵀ with SCORES_TRANSPOSED) and `dp` = dP
// likewise, unscaled, straight from the products; `query` is this invocation's row of the block
// (sequence-relative), `alibi2` its head's alibi_slope2, `key0` the block's first key, `lse2` and `d`
// the row's statistics. Writes P (with PROB_BLOCKS = 2) and dS, f16, [query][key], into the subgroup's
// scratch blocks 0 (and 1). Masked keys, keys past the sequence and rows past it get P = dS = 0.
fn block_gradient(sg: u32, lane: u32, s: coop_mat16x16<f32, C>, dp: coop_mat16x16<f32, C>, alibi2: f32, query: u32, key0: u32, lse2: f32, d: f32, needs_mask: bool, seq: Sequence) {
    let at = sg * SCORE_BLOCK;
    let half = lane % 2u;
    let mine = at + (lane / 2u) * SCORE_STRIDE + 2u * half;
    // S, then dP, through the one window: each invocation keeps its eight elements of both.
    store_scores(s, at);
    subgroupBarrier();
    let s_mine = array<vec4<f32>, 2>(score_scratch[mine], score_scratch[mine + 1u]);
    subgroupBarrier();
    store_scores(dp, at);
    subgroupBarrier();
    let dp_mine = array<vec4<f32>, 2>(score_scratch[mine], score_scratch[mine + 1u]);
    let out = prob_block(sg, 0u) + (lane / 2u) * PROB_STRIDE + 2u * half;
    let keys_seen = visible_keys(seq, query);
    for (var c = 0u; c < 2u; c++) {
        let keys = vec4<u32>(key0 + 8u * half + 4u * c) + vec4<u32>(0u, 1u, 2u, 3u);
        let logit = logits(s_mine[c], alibi2, seq, vec4<u32>(query), keys);
        var p = exp2(logit[0] - lse2);
        if (needs_mask) {
            let shown = within_keys(keys, keys_seen) & vec4<bool>(query < seq.seq_q);
            p = select(vec4<f32>(0.0), p, shown);
        }
        let ds = p * (dp_mine[c] - d) * logit[1];
        if (PROB_BLOCKS == 2u) {
            prob_scratch[out + c] = vec4<f16>(p);
            prob_scratch[out + PROB_BLOCK + c] = vec4<f16>(ds);
        } else {
            prob_scratch[out + c] = vec4<f16>(ds);
        }
    }
    subgroupBarrier();
}

// Stores a block of scores into the window at `at`, [query][key] (column-major for the dK/dV
// kernel's transposed ones).
fn store_scores(m: coop_mat16x16<f32, C>, at: u32) {
    if (SCORES_TRANSPOSED) {
        coopStore(m, &score_scratch[at], SCORE_STRIDE);
    } else {
        coopStoreT(m, &score_scratch[at], SCORE_STRIDE);
    }
}

// This invocation's eight values of an output block (row lane / 2, columns 8 · (lane % 2) .. + 8),
// through score window `window`.
fn block_row_values(window: u32, lane: u32, m: coop_mat16x16<f32, C>) -> array<vec4<f32>, 2> {
    let at = window * SCORE_BLOCK;
    coopStoreT(m, &score_scratch[at], SCORE_STRIDE);
    subgroupBarrier();
    let mine = at + (lane / 2u) * SCORE_STRIDE + 2u * (lane % 2u);
    let values = array<vec4<f32>, 2>(score_scratch[mine], score_scratch[mine + 1u]);
    subgroupBarrier();
    return values;
}

// ---- the element-wise step in registers (REGISTER_GRADIENT) ----

// Where this invocation's components of a 16 × 16 block lie: component i is element
// 16 · row + column, in byte i % 4 of word i / 4.
alias BlockPositions = array<u32, (COOP_COMPONENTS + 3u) / 4u>;

// Measures block_positions once, as the host's layout probe does: loads a block whose element
// (r, c) is 16 · r + c from score window `window` and reads back its own components.
fn block_positions(window: u32, lane: u32) -> BlockPositions {
    let at = window * SCORE_BLOCK;
    for (var e = lane; e < 256u; e += SUBGROUP) {
        score_scratch[at + (e / 16u) * SCORE_STRIDE + (e % 16u) / 4u][e % 4u] = f32(e);
    }
    subgroupBarrier();
    let index = coop_elements_c(coopLoadT<coop_mat16x16<f32, C>>(&score_scratch[at], SCORE_STRIDE));
    subgroupBarrier(); // read before the window is used again
    var positions = BlockPositions();
    // @unroll
    for (var i = 0u; i < COOP_COMPONENTS; i++) {
        positions[i / 4u] |= u32(index[i]) << (8u * (i % 4u));
    }
    return positions;
}

// The query of component i within its block: its row of S, its column of Sᵀ.
fn component_query(positions: BlockPositions, i: u32) -> u32 {
    let e = (positions[i / 4u] >> (8u * (i % 4u))) & 255u;
    return select(e / 16u, e % 16u, SCORES_TRANSPOSED);
}

// The key of component i within its block: its column of S, its row of Sᵀ.
fn component_key(positions: BlockPositions, i: u32) -> u32 {
    let e = (positions[i / 4u] >> (8u * (i % 4u))) & 255u;
    return select(e % 16u, e / 16u, SCORES_TRANSPOSED);
}

// P of a block and the soft-cap's slope at each of its elements, on an invocation's components.
struct BlockProbs {
    p: array<f32, COOP_COMPONENTS>,
    slope: array<f32, COOP_COMPONENTS>,
}

// P of a block on this invocation's own components of the score accumulator `s` (S, or Sᵀ with
// SCORES_TRANSPOSED, unscaled), and the soft-cap's slope at each (all 1 without a cap): `query0`
// and `key0` are the block's first query row and key (sequence-relative), `alibi2` its head's
// alibi_slope2, `lse2` each component's query row's LSE · log2 e. The arithmetic of
// block_gradient; masked keys, keys past the sequence and rows past it get P = 0.
fn probs_in_registers(s: coop_mat16x16<f32, C>, positions: BlockPositions, alibi2: f32, query0: u32, key0: u32, lse2: array<f32, COOP_COMPONENTS>, needs_mask: bool, seq: Sequence) -> BlockProbs {
    let raw = coop_elements_c(s);
    var probs = BlockProbs();
    // @unroll
    for (var i = 0u; i < COOP_COMPONENTS; i++) {
        // A component's query and key only where ALiBi reads them (the plain kernel does not).
        var query = 0u;
        var key = 0u;
        if (ALIBI) {
            query = query0 + component_query(positions, i);
            key = key0 + component_key(positions, i);
        }
        let logit = logits(vec4<f32>(raw[i]), alibi2, seq, vec4<u32>(query), vec4<u32>(key));
        probs.p[i] = exp2(logit[0].x - lse2[i]);
        probs.slope[i] = logit[1].x;
    }
    // The mask is a block of its own under one branch, as in the forward's register softmax
    // (coop_registers.wgsl): inside the loop above the compiler may predicate it into every block.
    if (needs_mask) {
        // @unroll
        for (var i = 0u; i < COOP_COMPONENTS; i++) {
            let query = query0 + component_query(positions, i);
            let key = key0 + component_key(positions, i);
            let keys_seen = visible_keys(seq, query);
            probs.p[i] = select(0.0, probs.p[i], (key >= keys_seen.x) & (key < keys_seen.y) & (query < seq.seq_q));
        }
    }
    return probs;
}

// dS = P ∘ (dP − D) ∘ slope of a block as the next product's A operand (f16), from P and the cap's
// slope on this invocation's components, the dP accumulator and each component's query row's D.
fn gradient_operand(probs: BlockProbs, dp: coop_mat16x16<f32, C>, d: array<f32, COOP_COMPONENTS>) -> coop_mat16x16<f16, A> {
    let dp_x = coop_elements_c(dp);
    var ds = array<f16, COOP_COMPONENTS>();
    // @unroll
    for (var i = 0u; i < COOP_COMPONENTS; i++) {
        ds[i] = f16(probs.p[i] * (dp_x[i] - d[i]) * probs.slope[i]);
    }
    return coop_from_elements_a(ds);
}

// Values on this invocation's components as an A operand (f16).
fn operand_of(x: array<f32, COOP_COMPONENTS>) -> coop_mat16x16<f16, A> {
    var h = array<f16, COOP_COMPONENTS>();
    // @unroll
    for (var i = 0u; i < COOP_COMPONENTS; i++) {
        h[i] = f16(x[i]);
    }
    return coop_from_elements_a(h);
}
