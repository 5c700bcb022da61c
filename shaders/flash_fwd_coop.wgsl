// flash_fwd_coop.wgsl — exact attention forward on the GPU's matrix units (tensor cores), through
// wgpu's cooperative matrices: QKᵀ and PV as 16×16×16 f16 products with f32 accumulators, the
// online softmax in f32 on the invocations.
//
// Bindings as flash_fwd.wgsl: 0 params, 1 q, 2 k, 3 v (here arrays of vec4<f16>, the 8-byte
// granules every kernel indexes), 4 o (f16 granules), 5 the LSE bits, and for a batch with index
// tensors 6–8 (sequence_indexed.wgsl), for ALiBi slopes or sinks from tensors 9–10
// (head_terms_bound.wgsl), for a score bias 11 (score_bias_bound.wgsl), for a mask tensor and its
// block summary 12–13 (mask_bound.wgsl, mask_blocks_bound.wgsl), the bias's fragment view 14
// (score_bias_fragments_bound.wgsl), and with the exact pass outside the kernel its workgroups'
// flags 15 (huge_flags_bound.wgsl). Dropout (dropout.wgsl) needs no binding: its keep bits are
// drawn where P is formed.
//
// What a workgroup owns: one tile of BLOCK_M query rows of one (sequence, head), like the
// non-matrix kernel flash_fwd.wgsl (same grid, longest first, same causal tile skipping, tiles
// past a shorter sequence's rows return at once). It streams K/V in tiles
// of BLOCK_N keys through workgroup memory: every invocation copies whole granules (coalesced
// 8-byte loads, 8-byte stores; the same column of granules in every tile, so the addresses are
// worked out once), and all subgroups then read their fragments from the one copy, so the taller
// the query tile, the less often K and V cross from L2 (128 rows on the H200).
// With one K/V buffer (KV_BUFFERS = 1) a tile costs two workgroup barriers ("the previous tile is
// no longer read", "this tile is staged"); with two, one (the next tile is copied into the other
// buffer after this one's products). With PREFETCH_KV the next tile's granules are loaded into
// registers before this tile's products, so their latency is not waited for at a barrier.
//
// What a subgroup owns: 16 query rows. It holds their Q as HEAD_DIM_PAD/16 cooperative A
// fragments (loaded once) and their output as HEAD_DIM_PAD/16 f32 accumulator fragments for the
// whole kernel. The softmax takes one of two routes, chosen by the host from the device's
// fragment layout (src/caps/register_layout.rs):
//
// - REGISTER_SOFTMAX (coop_registers.wgsl; the H200): the scores never leave the subgroup's
//   accumulator fragments. Each invocation owns its components of them (8 on a 32-wide
//   subgroup), whose rows and columns it measures at its start; it masks, takes row maxima with
//   a few shuffles among the lanes of each row, writes P in place, and P becomes the next
//   product's A operand component by component. No workgroup memory and no barrier between the
//   two products.
// - Otherwise, through workgroup memory: the subgroup stores 16 rows of scores (f32), and each
//   invocation owns a part of a score row (ROW_LANES = SUBGROUP / 16 parts a row: halves on a
//   32-wide subgroup, whole rows on a 16-wide one; the host compiles the device's size in),
//   read once into registers as vec4s; it applies mask and scale, keeps the running max and sum,
//   and writes its part of P (f16), which the subgroup loads as A fragments. Those rows are the
//   subgroup's alone, so only the subgroup synchronises (subgroupBarrier, made to cover
//   workgroup memory in src/spirv/coherence.rs).
//
// Either way the scale sits inside exp2's argument, and masked scores are −∞ (0 where the register
// softmax carries soft-capped scores as tanh's denominators, CAP_DENOMINATORS). A workgroup streams
// its K/V tiles once (the fast pass), or twice where some row's reference max turned huge, past
// what one multiply-add into exp2 holds exactly (attend_kv_tiles, HUGE_REFERENCE): the exact pass
// runs in the kernel, or in a second dispatch of the same grid for the workgroups the first one
// flagged (EXACT_PASS, huge_flags_bound.wgsl). Sliding windows are run-time parameters
// (common.wgsl): K/V tiles left of every row's window are never loaded, as tiles past the diagonal
// are not, nor are tiles a mask's block summary shows hidden whole (next_key_tile). A soft-cap
// (SOFTCAP), ALiBi (ALIBI), the score bias (HAS_BIAS), the mask (HAS_MASK) and dropout (DROPOUT)
// are compile-time: each is a pass over the scores that the kernels without it do not contain (as
// run-time branches they cost plain attention 5% on the H200, BENCHMARKS.md): the cap
// (soft_cap_raw) first, then ALiBi's and the bias's terms (with_score_terms), then the mask's −∞
// where the summary does not show the tile visible; a head's sink joins each row's sum in the
// epilogue (join_sink, head_terms.wgsl).
// Dropout zeroes the P of the elements it drops after the row sums are taken (the LSE is the
// undropped softmax's, as the backward expects) and the epilogue multiplies by 1/(1 − p); with the
// softmax in registers, the subgroup draws each generator block once and shares its words through
// the score window (kept_components).
//
// Rescaling: the output lives in accumulator fragments, so a row's factor reaches them as a
// 16 × 16 matrix of factors (built in registers, or written to workgroup memory by the rows'
// invocations and loaded as an accumulator) multiplied in component-wise (OpFMul, which WGSL
// cannot spell: see componentwise_product). Following FlashAttention-4, a row's reference max
// m_used only moves when a tile's max exceeds it by more than RESCALE_THRESHOLD (log2 units);
// until then P = exp2(s − m_used) ≤ 2^8, which f16 holds, and O and l stay consistent because
// both use the same m_used. The result is exact either way. Whether the product runs every tile
// or only where some row of the subgroup moved is ROW_FACTORS_ALWAYS (measured). Decisions about
// products are the subgroup's (subgroupAny): cooperative operations need control flow that is
// uniform over the subgroup, which the Vulkan spec asks and the host's SPIR-V build relies on.
//
// Why the sizes: 16 × 16 × 16 f16 → f32 is the configuration NVIDIA and AMD expose. Staged rows
// are padded by one 16-byte pair of granules, so that the eight 16-byte rows a fragment load reads
// at once start in different banks (a row is HEAD_DIM_PAD/2 + 4 words, ≡ 4 mod 8); score rows by
// one vec4, so that the 16-byte reads of 8 consecutive rows by 8 invocations hit different banks.
// Without the score and P rows, the register softmax leaves room for 64-key tiles beside 128
// query rows at head_dim 128.
// Q is staged once through the K/V buffers, 2·KV_BUFFERS·BLOCK_N rows at a time. Tile sizes and
// the streaming options come from the host's plans, fitted to the workgroup memory (48 KiB on
// NVIDIA) and measured (COOP_PLANS in src/plan/coop.rs).

// SUBGROUP, the invocations of a subgroup, is the host's (16 or 32): the lanes of a row below
// are constants of it.
const_assert SUBGROUP == 16u || SUBGROUP == 32u;
const SUBGROUPS: u32 = BLOCK_M / 16u;
// Each subgroup's vote in workgroup_saw_huge is a half of the first two granules.
const_assert SUBGROUPS <= 8u;
const WORKGROUP_SIZE: u32 = SUBGROUPS * SUBGROUP;
const D_BLOCKS: u32 = HEAD_DIM_PAD / 16u;
const N_BLOCKS: u32 = BLOCK_N / 16u;
// Granules (vec4<f16>) per row of Q, K or V, and per staged row in workgroup memory.
const ROW_GRANULES: u32 = HEAD_DIM_PAD / 4u;
const TILE_STRIDE: u32 = ROW_GRANULES + 2u;
// The K/V copy: an invocation always copies the same column of granules, COPY_ROW_STEP staged rows
// apart (K's rows, then V's), so its addresses are worked out once (KvCopy) and each tile only
// adds the tile's first key. Invocations past COPY_ROW_STEP rows' worth copy nothing (none when
// the workgroup size is a multiple of a row's granules, as for head_dim 64, 128, 256).
const COPY_ROW_STEP: u32 = WORKGROUP_SIZE / ROW_GRANULES;
const KV_COPIES: u32 = (2u * BLOCK_N + COPY_ROW_STEP - 1u) / COPY_ROW_STEP;
// Whether every invocation copies exactly KV_COPIES granules of the tile (so none is checked
// against the tile's end), and whether copy i is of K or of V is the same for every invocation
// (so known once the loop is unrolled).
const COPY_EXACT: bool = WORKGROUP_SIZE % ROW_GRANULES == 0u && (2u * BLOCK_N) % COPY_ROW_STEP == 0u;
const KV_SPLIT_AT_COPY: bool = BLOCK_N % COPY_ROW_STEP == 0u;
// Query rows staged at a time to load Q's fragments: as many as the K/V tile's memory holds.
// (Rows staged past BLOCK_M in the last pass are never loaded.)
const Q_PASS_ROWS: u32 = min(BLOCK_M, 2u * KV_BUFFERS * BLOCK_N);
const Q_PASSES: u32 = (BLOCK_M + Q_PASS_ROWS - 1u) / Q_PASS_ROWS;
// Granules of a pass, and how many of them each invocation copies.
const Q_PASS_GRANULES: u32 = Q_PASS_ROWS * ROW_GRANULES;
const Q_COPIES: u32 = (Q_PASS_GRANULES + WORKGROUP_SIZE - 1u) / WORKGROUP_SIZE;
// vec4s per row of a subgroup's scores (f32) and of its P (f16). With the softmax in registers
// (REGISTER_SOFTMAX, coop_registers.wgsl) neither goes through workgroup memory: a 16 × 16 window
// of scores remains, for the fragment layout at the start and the output at the end.
const SCORE_COLS: u32 = select(BLOCK_N, 16u, REGISTER_SOFTMAX);
const S_STRIDE: u32 = SCORE_COLS / 4u + 1u;
const P_STRIDE: u32 = BLOCK_N / 4u + 2u;
const PROB_VECS: u32 = select(SUBGROUPS * 16u * P_STRIDE, 4u, REGISTER_SOFTMAX);
// The workgroup-memory softmax: ROW_LANES invocations share a score row (lanes r and r + 16 of
// a 32-wide subgroup), each taking PART_VECS vec4s of it, and WINDOW_PART_VECS of a 16-column
// window (the row factors', the output's).
const ROW_LANES: u32 = SUBGROUP / 16u;
const PART_VECS: u32 = BLOCK_N / (4u * ROW_LANES);
const WINDOW_PART_VECS: u32 = 4u / ROW_LANES;
const RESCALE_THRESHOLD: f32 = 8.0;
// Whether the output is multiplied by the row factors every tile, or only where some row of the
// subgroup moved its reference max. On the H200 the branch paid only with the softmax through
// workgroup memory up to head_dim 128; at 256 (all 255 registers in use either way, and why the
// branch costs that much there is not known yet) and with the softmax in registers the
// unconditional product was faster (docs/perf-history.md, "Cooperative matrices", steps 13, 18).
const ROW_FACTORS_ALWAYS: bool = HEAD_DIM_PAD > 128u || REGISTER_SOFTMAX;
// MASK_BRANCH, code size against instructions a tile (the H200's measurements: BENCHMARKS.md,
// session 27): the register softmax compiled twice, with the mask's code and without, for tiles
// that need a mask and tiles that do not. It was chosen while the mask sat inside the loop of the
// running max, where NVIDIA's compiler predicated it into every tile: at head_dim 64 the two
// copies gained, at 128 the second spilled. Since the mask is a block of its own
// (softmax_in_registers) one copy branches over it; 64 keeps two, not yet timed against one.
const MASK_BRANCH: bool = HEAD_DIM_PAD <= 64u;

// Where the exact pass runs (EXACT_PASS, generated: src/plan/coop.rs ExactPass, which says where
// each is chosen). EXACT_IN_KERNEL: the fast pass, then the exact pass for a workgroup where some
// row met a huge reference — two copies of the tile loop. EXACT_FLAGGED: the fast pass alone,
// each workgroup storing whether some row met one (note_huge); EXACT_RERUN, the same grid
// dispatched next: the exact pass alone in the workgroups flagged (flagged), the others returning
// at once. One copy of the loop each, so the fast pass keeps the registers a second copy would
// take.
const EXACT_IN_KERNEL: u32 = 0u;
const EXACT_FLAGGED: u32 = 1u;
const EXACT_RERUN: u32 = 2u;

// KV_BUFFERS buffers of KV_TILE_VECS: rows 0..BLOCK_N the tile's K, rows BLOCK_N..2·BLOCK_N its V.
// Q passes through at the start.
const KV_TILE_VECS: u32 = 2u * BLOCK_N * TILE_STRIDE;
var<workgroup> kv_tile: array<vec4<f16>, KV_BUFFERS * KV_TILE_VECS>;
// Per subgroup: 16 rows of scores (also a 16 × 16 window of the rows' rescale factors, and of
// the output when it is written out) and 16 rows of P. With the softmax in registers, only the
// 16 × 16 window (the fragment layout at the start, dropout's draws on the way, the output at the
// end), and P is 4 unused vec4s.
var<workgroup> scores: array<vec4<f32>, SUBGROUPS * 16u * S_STRIDE>;
var<workgroup> probs: array<vec4<f16>, PROB_VECS>;
// Every workgroup variable is a multiple of 16 bytes: NVIDIA's driver lays them out in an order of
// its own, and cooperative loads and stores need 16-byte-aligned addresses (a 4-byte variable
// once shifted every array after it and the products silently read shifted rows;
// docs/perf-history.md, "Cooperative matrices", step 1).

@group(0) @binding(1) var<storage, read> q: array<vec4<f16>>;
@group(0) @binding(2) var<storage, read> k: array<vec4<f16>>;
@group(0) @binding(3) var<storage, read> v: array<vec4<f16>>;
@group(0) @binding(4) var<storage, read_write> o: array<Granule>;
@group(0) @binding(5) var<storage, read_write> lse: array<u32>;

// What an invocation copies of every K/V tile, worked out once: its first staged row, whether its
// column is inside head_dim, where its granule of that row is in K and in V for the tile at key 0
// (for V, "row" first_row − BLOCK_N: the u32 wraps, and every copy that reads V adds BLOCK_N or
// more rows back), and where the granule goes in a buffer.
struct KvCopy {
    seq_kv: u32, // the sequence's keys
    first_row: u32, // staged row of copy 0 (≥ 2·BLOCK_N: copies nothing)
    col_ok: bool, // its column is within head_dim (else it stores zeros)
    k_src: u32,
    v_src: u32,
    slot: u32,
}

fn kv_copy(li: u32, seq: Sequence, h: u32) -> KvCopy {
    let col = li % ROW_GRANULES;
    var first_row = li / ROW_GRANULES;
    if (first_row >= COPY_ROW_STEP) {
        first_row = 2u * BLOCK_N;
    }
    return KvCopy(
        seq.seq_kv,
        first_row,
        4u * col < params.head_dim,
        row_granule(params.k, seq.b, seq.kv_first + first_row, h) + col,
        row_granule(params.v, seq.b, seq.kv_first + first_row - BLOCK_N, h) + col,
        first_row * TILE_STRIDE + col,
    );
}

// Copy i's staged row, and whether it is a row of V.
fn copy_row(cp: KvCopy, i: u32) -> u32 {
    return cp.first_row + i * COPY_ROW_STEP;
}

fn copy_is_v(cp: KvCopy, i: u32) -> bool {
    if (KV_SPLIT_AT_COPY) {
        return i >= BLOCK_N / COPY_ROW_STEP;
    }
    return copy_row(cp, i) >= BLOCK_N;
}

// This invocation's granules of the K/V tile at key n0, loaded into registers: zero past the
// sequence, past head_dim and past the tile. With `checked` false (a whole tile: see
// kv_tile_is_whole) the loads go unchecked; callers pass a literal, so that each call compiles to
// its own loop.
fn load_kv_tile(regs: ptr<function, array<vec4<f16>, KV_COPIES>>, cp: KvCopy, n0: u32, checked: bool) {
    let k_tile = cp.k_src + n0 * params.k.seq;
    let v_tile = cp.v_src + n0 * params.v.seq;
    // @unroll
    for (var i = 0u; i < KV_COPIES; i++) {
        let row = copy_row(cp, i);
        let is_v = copy_is_v(cp, i);
        let key = n0 + row - select(0u, BLOCK_N, is_v);
        var x = vec4<f16>(0.0);
        if (!checked || (row < 2u * BLOCK_N && key < cp.seq_kv && cp.col_ok)) {
            if (is_v) {
                x = v[v_tile + i * COPY_ROW_STEP * params.v.seq];
            } else {
                x = k[k_tile + i * COPY_ROW_STEP * params.k.seq];
            }
        }
        (*regs)[i] = x;
    }
}

// Whether the K/V tile at n0 lies wholly inside K and V, and every invocation's copies inside
// the tile: then no granule needs checking.
fn kv_tile_is_whole(cp: KvCopy, n0: u32) -> bool {
    return COPY_EXACT && n0 + BLOCK_N <= cp.seq_kv && params.head_dim == HEAD_DIM_PAD;
}

fn load_kv_tile_at(regs: ptr<function, array<vec4<f16>, KV_COPIES>>, cp: KvCopy, n0: u32) {
    if (kv_tile_is_whole(cp, n0)) {
        load_kv_tile(regs, cp, n0, false);
    } else {
        load_kv_tile(regs, cp, n0, true);
    }
}

// ... and stored into the buffer whose first vec4 is `base`.
fn store_kv_tile(regs: ptr<function, array<vec4<f16>, KV_COPIES>>, cp: KvCopy, base: u32) {
    // @unroll
    for (var i = 0u; i < KV_COPIES; i++) {
        if (COPY_EXACT || copy_row(cp, i) < 2u * BLOCK_N) {
            kv_tile[base + cp.slot + i * COPY_ROW_STEP * TILE_STRIDE] = (*regs)[i];
        }
    }
}

// Both at once.
fn copy_kv_tile(cp: KvCopy, n0: u32, base: u32) {
    var regs: array<vec4<f16>, KV_COPIES>;
    load_kv_tile_at(&regs, cp, n0);
    store_kv_tile(&regs, cp, base);
}

// −∞, for masked scores (a runtime bitcast: WGSL constants must be finite). This assumes the
// driver keeps infinities (IEEE 754 arithmetic, as NVIDIA's does: the H200 tests include rows that
// see no key); the module does not declare SignedZeroInfNanPreserve, which Vulkan would need to
// promise it everywhere (to be measured before it is added).
fn neg_inf() -> f32 {
    return bitcast<f32>(LSE_EMPTY_BITS);
}

// A raw (unscaled) score soft-capped so that scaling it afterwards gives the capped scaled score
// (common.wgsl's soft_cap): the kernel scales inside exp2 and takes maxima of raw scores, which
// stays right because the cap, like a positive scale, keeps their order. CAP_SERIES (the cap's
// CapForm, src/problem/softcap.rs) adds tanh's series for caps far above the scores.
fn soft_cap_raw(x: f32) -> f32 {
    // Both ratios are uniform: a score costs two multiplies and the tanh, no division.
    let y = vec4<f32>(x * (params.scale / params.softcap));
    let raw_cap = params.softcap / params.scale;
    if (CAP_SERIES) {
        return cap_times_tanh(vec4<f32>(x), y, raw_cap).x;
    }
    return raw_cap * tanh_by_exp2(y).x;
}

// The register softmax's soft-cap without score terms (CAP_DENOMINATORS): each score is carried
// as the denominator d = 1 + e^(2y) of tanh(y) = 1 − 2/d (y its scaled score over the cap), which
// rises with the score, so a row's largest d is its largest capped score (capped_from_denominator)
// and a hidden score is d = 0, below every score (hidden_score). P's exponent is then one
// multiply-add from 1/d (softmax_in_registers), where the capped score itself would cost two
// multiplies, the subtraction from 1 and the multiply by the cap more per score; and 1/0 = ∞ makes
// a hidden score's P exactly 0. The capped scaled scores are bounded by the cap (at most 64 ·
// log2 e in the tanh form, CapForm::SERIES_ABOVE), far below HUGE_REFERENCE, so no row's
// reference is ever huge and rows take the fast pass's exponent only. ALiBi and the bias add to
// the capped score and keep the capped form, as does the series form (CAP_SERIES), whose small
// scores the denominator's 1 would swamp. On an H100 this form ran 1.07× the capped one at head_dim 64 and
// 128 and 0.99× at 256 (BENCHMARKS.md, session 51), where the capped form stays.
const CAP_DENOMINATORS: bool = SOFTCAP && !CAP_SERIES && !ALIBI && !HAS_BIAS && REGISTER_SOFTMAX && HEAD_DIM_PAD <= 128u;

fn cap_denominator(x: f32) -> f32 {
    // One multiply a score: 2y = x · scale / cap in exp2's units, the factor held below f32's
    // largest value (a zero score times ∞ would be NaN) for the tiniest caps.
    return 1.0 + exp2(x * min(params.scale / params.softcap * (2.0 * LOG2_E), 3.0e38));
}

// The capped score, scaled, of a score whose denominator is d: cap · (1 − 2/d), −∞ at d = 0. In
// scaled units, where the cap is at most 64 · log2 e (the tanh form's largest): the raw cap,
// cap / scale, passes f32's range for scales below about 1e-37.
fn capped_from_denominator(d: f32) -> f32 {
    return select(neg_inf(), params.softcap - 2.0 * params.softcap / d, d > 0.0);
}

// What the register softmax writes for a score the mask hides: −∞, or with CAP_DENOMINATORS the
// denominator 0.
fn hidden_score() -> f32 {
    return select(neg_inf(), 0.0, CAP_DENOMINATORS);
}

// The head's terms for with_score_terms, worked out once a workgroup: ALiBi's slope and the bias's
// base-2 values both divided by the base-2 scale (raw_per_base2 = 1 / params.scale), since the
// scores they join are raw.
struct ScoreTerms {
    alibi_raw_slope: f32,
    raw_per_base2: f32,
}

fn score_terms(head: u32) -> ScoreTerms {
    let raw_per_base2 = 1.0 / params.scale;
    return ScoreTerms(alibi_slope(head) * LOG2_E * raw_per_base2, raw_per_base2);
}

// Whether the scores get with_score_terms at all: a compile-time pass plain attention does not
// contain (ALIBI and SOFTCAP are the configuration's, HAS_BIAS the bias binding's).
fn has_score_terms() -> bool {
    return ALIBI || HAS_BIAS;
}

// ALiBi's term for query `row` (within the sequence) against key `col`, in raw units.
fn alibi_raw(seq: Sequence, row: u32, col: u32, terms: ScoreTerms) -> f32 {
    return -terms.alibi_raw_slope * abs(f32(i32(row) + seq.causal_offset) - f32(col));
}

// The bias tensor's term for query `row` against key `col`, in raw units, or −∞ where it hides
// the key. (The raw units can overflow where the scaled ones would not: a bias beyond
// f32::MAX · scale, which no model has, becomes ±∞ here.)
fn bias_raw(seq: Sequence, head: u32, row: u32, col: u32, terms: ScoreTerms) -> f32 {
    let b = bias_element(seq, head, row, col);
    return select(b.value * terms.raw_per_base2, neg_inf(), b.hidden);
}

// Raw (soft-capped) score x of query `row` against key `col` with ALiBi's and the bias tensor's
// terms (the workgroup-memory softmax; the register softmax loads the bias ahead of the products).
fn with_score_terms(x: f32, seq: Sequence, head: u32, row: u32, col: u32, terms: ScoreTerms) -> f32 {
    var y = x;
    if (ALIBI) {
        y += alibi_raw(seq, row, col, terms);
    }
    if (HAS_BIAS) {
        y += bias_raw(seq, head, row, col, terms);
    }
    return y;
}

// A row's reference max after a tile whose scaled max is `tile_max`: it moves only when the
// tile's max exceeds it by more than RESCALE_THRESHOLD, and always from −∞, where every row
// starts (so any finite score is right, however far below −1e30), and where it stays while the
// row has seen no key.
fn next_reference_max(m_used: f32, tile_max: f32) -> f32 {
    return select(m_used, tile_max, tile_max > m_used + RESCALE_THRESHOLD);
}

// What the output and sum kept under reference max m_old are multiplied by under m_new: 1 where
// it did not move (also −∞ to −∞, which exp2 would make NaN), 0 from −∞ (nothing kept yet).
fn rescale_factor(m_old: f32, m_new: f32) -> f32 {
    return select(exp2(m_old - m_new), 1.0, m_old == m_new);
}

// What exp2's argument subtracts for reference max m: m, or 0 for a row that has seen no key
// (all its scores −∞: exp2(−∞ − 0) = 0, where −∞ − −∞ would be NaN).
fn exp_reference(m: f32) -> f32 {
    return select(m, 0.0, m == neg_inf());
}

// The raw score whose scaled value became the reference max: `m_raw` after a tile whose raw max
// is `tile_raw_max` rescaled the row by `alpha` (≠ 1 exactly when the reference moved), or stayed.
fn next_reference_raw(m_raw: f32, tile_raw_max: f32, alpha: f32) -> f32 {
    return select(m_raw, tile_raw_max, alpha != 1.0);
}

// From this magnitude of a row's reference max (log2 units) on, exp2(scale·x − m) is computed the
// other way. The compiler fuses scale·x into the subtraction, so at the max's own score exp2 sees
// scale·x − round(scale·x), the product's rounding error: up to half an ulp of m, ≥ 1 from 2^24
// on, and enough past 2^31 to make exp2 0 or ∞ (a row of such scores came out O = 0). Rows that
// large (a huge scale, huge opposite q and k) use (x − m_raw)·scale instead, exactly 0 at the max.
// They are rare, so that subtraction is not in the fast pass: a workgroup where some row's
// reference turned huge runs its K/V tiles again, the exact way (attend_kv_tiles, EXACT_PASS).
const HUGE_REFERENCE: f32 = 16777216.0;

fn is_huge_reference(m: f32) -> bool {
    return abs(m) >= HUGE_REFERENCE && m != neg_inf();
}

// P = exp2(scale·x − m) for a row with reference max m (scaled) and m_raw (raw), `huge` its
// is_huge_reference(m).
fn probabilities(x: vec4<f32>, m: f32, m_raw: f32, huge: bool) -> vec4<f32> {
    if (huge) {
        return exp2((x - m_raw) * params.scale);
    }
    return exp2(x * params.scale - exp_reference(m));
}

// This invocation's part of a score row (query `row` of `seq`, head `head`), starting at vec4 `at` of
// `scores` and at key column `first_col`, raw (unscaled), soft-capped and with the score terms,
// −∞ where the key is masked (outside the row's visible keys [row_keys.x, row_keys.y), hidden by
// the bias, or with `reads_mask` by the mask tensor).
fn read_row_part(at: u32, first_col: u32, row_keys: vec2<u32>, needs_mask: bool, reads_mask: bool, seq: Sequence, head: u32, row: u32, terms: ScoreTerms) -> array<vec4<f32>, PART_VECS> {
    var x: array<vec4<f32>, PART_VECS>;
    // @unroll
    for (var i = 0u; i < PART_VECS; i++) {
        x[i] = scores[at + i];
    }
    if (SOFTCAP) {
        // @unroll
        for (var i = 0u; i < PART_VECS; i++) {
            x[i] = vec4<f32>(soft_cap_raw(x[i].x), soft_cap_raw(x[i].y), soft_cap_raw(x[i].z), soft_cap_raw(x[i].w));
        }
    }
    if (has_score_terms()) {
        // @unroll
        for (var i = 0u; i < PART_VECS; i++) {
            let col = first_col + 4u * i;
            x[i] = vec4<f32>(
                with_score_terms(x[i].x, seq, head, row, col, terms),
                with_score_terms(x[i].y, seq, head, row, col + 1u, terms),
                with_score_terms(x[i].z, seq, head, row, col + 2u, terms),
                with_score_terms(x[i].w, seq, head, row, col + 3u, terms),
            );
        }
    }
    if (reads_mask) {
        // @unroll
        for (var i = 0u; i < PART_VECS; i++) {
            let cols = vec4<u32>(first_col + 4u * i) + vec4<u32>(0u, 1u, 2u, 3u);
            x[i] = select(x[i], vec4<f32>(neg_inf()), mask_hidden(seq, head, row, cols));
        }
    }
    if (needs_mask) {
        // @unroll
        for (var i = 0u; i < PART_VECS; i++) {
            let cols = vec4<u32>(first_col + 4u * i) + vec4<u32>(0u, 1u, 2u, 3u);
            x[i] = select(vec4<f32>(neg_inf()), x[i], within_keys(cols, row_keys));
        }
    }
    return x;
}

// The workgroup-memory softmax's state for this invocation's part of a row (the register softmax
// keeps its own in RegisterRows).
struct RowPart {
    m_used: f32, // the row's reference max (the same in each invocation of the row)
    m_raw: f32, // the raw score m_used was scaled from
    l_part: f32, // the sum of exp2(s − m_used) over this invocation's columns
    huge_seen: bool, // the reference was huge at some tile (is_huge_reference)
}

// A tile's step for a row whose raw max over the tile is `tile_raw_max`: the reference moves
// (next_reference_max), the sum is rescaled, a huge reference is noted; returns the rescale
// factor.
fn row_part_softmax(row: ptr<function, RowPart>, tile_raw_max: f32) -> f32 {
    let m_new = next_reference_max((*row).m_used, tile_raw_max * params.scale);
    let alpha = rescale_factor((*row).m_used, m_new);
    (*row).m_raw = next_reference_raw((*row).m_raw, tile_raw_max, alpha);
    (*row).m_used = m_new;
    (*row).l_part *= alpha;
    (*row).huge_seen = (*row).huge_seen | is_huge_reference(m_new);
    return alpha;
}

// P = exp2(scale·x − m) into this invocation's part of a row of `probs` at vec4 `at`, and its sum,
// for `row`'s reference; the exact pass (`exact`, attend_kv_tiles) takes a huge reference's form.
// The scale is positive (the host checks), so the tile's max before scaling is its max after.
// With dropout the sum keeps every element and `probs` only the kept ones; the row part is query
// `query` of `seq` and head `head` from key `first_col` (a multiple of 4), so each vec4 is one
// generator block's row.
fn write_part_probs(x: array<vec4<f32>, PART_VECS>, row: RowPart, at: u32, exact: bool, seq: Sequence, head: u32, query: u32, first_col: u32) -> f32 {
    var sum = 0.0;
    let huge = exact && is_huge_reference(row.m_used);
    // @unroll
    for (var i = 0u; i < PART_VECS; i++) {
        let p = probabilities(x[i], row.m_used, row.m_raw, huge);
        sum += p.x + p.y + p.z + p.w;
        var kept = p;
        if (DROPOUT) {
            let block = dropout_block(seq.b, head, query, first_col + 4u * i);
            kept = select(vec4<f32>(0.0), p, block_row_keeps(block, query));
        }
        probs[at + i] = vec4<f16>(kept);
    }
    return sum;
}

// The max and the sum of a value over the ROW_LANES invocations that share a score row (lanes 16
// apart; on a 16-wide subgroup an invocation has the row to itself).
fn row_lanes_max(x: f32) -> f32 {
    if (ROW_LANES == 2u) {
        return max(x, subgroupShuffleXor(x, 16u));
    }
    return x;
}

fn row_lanes_sum(x: f32) -> f32 {
    if (ROW_LANES == 2u) {
        return x + subgroupShuffleXor(x, 16u);
    }
    return x;
}

// O += P_j·V_j for key block j of the tile, with V staged at `v_base`.
fn accumulate_pv_block(o: ptr<function, array<coop_mat16x16<f32, C>, D_BLOCKS>>, p_frag: coop_mat16x16<f16, A>, j: u32, v_base: u32) {
    // @unroll
    for (var d = 0u; d < D_BLOCKS; d++) {
        let v_frag = coopLoadT<coop_mat16x16<f16, B>>(&kv_tile[v_base + 16u * j * TILE_STRIDE + 4u * d], TILE_STRIDE);
        (*o)[d] = coopMultiplyAdd(p_frag, v_frag, (*o)[d]);
    }
}

// Which (query tile rank, head, batch) a workgroup computes; rank 0 is the last query tile, the
// longest under a causal mask. The grid is (query tiles, heads, batch), launched x first.
// Causal, with 128-row tiles (one workgroup per SM on the H200), the workgroups are renumbered in
// groups of heads: within a group, every head's rank-0 tile first, then every rank-1 tile, and so
// on. Two things pull apart here. In grid order (head after head) the last heads' longest tiles
// start near the end and finish alone; longest first over all heads fixes that, but then the
// workgroups in flight read the K/V of every head at different keys, more than L2 holds. A group
// of CAUSAL_GROUP_WORKGROUPS workgroups (about four waves on 132 SMs) is long enough for its
// longest tiles (twice the average) to finish beside its short ones, and spans few enough heads
// for their K/V to stay in L2; on the H200 it beat both grid order and longest first over all
// heads (docs/perf-history.md, "Cooperative matrices", step 24). The size is the H200's (132 SMs,
// one 128-row workgroup each); other devices and the workgroup-memory softmax's 128-row plans are
// not measured.
// With 64-row tiles (head_dim 64, two workgroups per SM) longest first over all heads lost
// (step 22), so those keep grid order. Non-causal tiles are all the same length: grid order,
// which keeps the workgroups in flight on few heads.
const CAUSAL_GROUP_WORKGROUPS: u32 = select(0u, 512u, BLOCK_M >= 128u);

fn tile_of_workgroup(wg: vec3<u32>, groups: vec3<u32>) -> vec3<u32> {
    let heads_in_group = CAUSAL_GROUP_WORKGROUPS / groups.x;
    if (heads_in_group <= 1u || params.causal == 0u) {
        return wg;
    }
    let heads_batches = groups.y * groups.z;
    let linear = wg.x + groups.x * (wg.y + groups.y * wg.z);
    // The group's first (head, batch) pair, its size (smaller for the last group), and this
    // workgroup's place in it: rank-major, so every head's rank r before any head's r + 1.
    let first_head_batch = linear / (heads_in_group * groups.x) * heads_in_group;
    let in_group = min(heads_in_group, heads_batches - first_head_batch);
    let offset_in_group = linear - first_head_batch * groups.x;
    let head_batch = first_head_batch + offset_in_group % in_group;
    return vec3<u32>(offset_in_group / in_group, head_batch % groups.y, head_batch / groups.y);
}

// What an invocation streams its workgroup's K/V tiles with, worked out once by the entry point:
// the query tile, the tiles some row of it sees, its share of the K/V copy, the head's score
// terms, and for the workgroup-memory softmax its query row, the keys that row sees and where its
// parts of the rows of scores and P are.
struct TileStream {
    seq: Sequence,
    head: u32,
    m0: u32, // the query tile's first row
    first_kv_tile: u32,
    num_kv_tiles: u32,
    cp: KvCopy,
    terms: ScoreTerms,
    row: u32,
    row_keys: vec2<u32>,
    r: u32, // the row within the subgroup's 16
    part: u32, // which of the row's ROW_LANES parts of the score columns
    my_scores: u32, // the subgroup's score rows in `scores`, and its P rows in `probs`
    my_probs: u32,
}

// The query tile's pass over its K/V tiles into `o_frag` and the row states (`reg_rows` with
// the softmax in registers, `row_part` otherwise), which it starts empty. `exact` is a literal at each
// call, so that each compiles to its own loop. The fast pass (false) takes exp2's argument in one
// multiply-add from the raw score and only notes rows whose reference turns huge
// (is_huge_reference, huge_seen); the exact pass (true) subtracts those rows' raw max first. The
// entry point runs the exact pass only for a workgroup where the fast one noted a row, so the
// common case pays one comparison a row and tile for the rare one instead of a subtraction a
// score.
fn attend_kv_tiles(exact: bool, ts: TileStream, q_frag: ptr<function, array<coop_mat16x16<f16, A>, D_BLOCKS>>, o_frag: ptr<function, array<coop_mat16x16<f32, C>, D_BLOCKS>>, reg_rows: ptr<function, RegisterRows>, row_part: ptr<function, RowPart>) {
    // @unroll
    for (var d = 0u; d < D_BLOCKS; d++) {
        (*o_frag)[d] = coop_mat16x16<f32, C>();
    }
    if (REGISTER_SOFTMAX) {
        restart_rows(reg_rows);
    } else {
        *row_part = RowPart(neg_inf(), neg_inf(), 0.0, false);
    }
    let my_row = ts.my_scores + ts.r * S_STRIDE + ts.part * PART_VECS;
    let my_p_row = ts.my_probs + ts.r * P_STRIDE + ts.part * PART_VECS;

    // K/V tiles: KV_BUFFERS == 1 frees the one buffer, fills it and waits (two barriers a
    // tile); KV_BUFFERS == 2 fills the other buffer with the next tile after computing this one
    // (one barrier a tile, and the copy overlaps other subgroups' products). With PREFETCH_KV the
    // granules of the next tile are loaded into registers before this tile's products.
    let cp = ts.cp;
    let seq = ts.seq;
    let head = ts.head;
    let m0 = ts.m0;
    // The tiles are those from first_kv_tile on that a mask's block summary does not show hidden
    // whole (next_key_tile; every tile without one); `step` counts the tiles visited, whose parity
    // picks the buffer with two.
    var next_kv: array<vec4<f16>, KV_COPIES>;
    if (KV_BUFFERS == 2u) {
        workgroupBarrier(); // Q's fragments are loaded
        copy_kv_tile(cp, ts.first_kv_tile * BLOCK_N, 0u);
    } else if (PREFETCH_KV) {
        load_kv_tile_at(&next_kv, cp, ts.first_kv_tile * BLOCK_N);
    }
    var tile_bias: array<array<f32, COOP_COMPONENTS>, N_BLOCKS>; // with a bias: set each tile
    var t = ts.first_kv_tile;
    var step = 0u;
    while (t < ts.num_kv_tiles) {
        let n0 = t * BLOCK_N;
        let t_next = next_key_tile(seq, head, m0, BLOCK_M, t + 1u, ts.num_kv_tiles, BLOCK_N);
        let k_base = (step % KV_BUFFERS) * KV_TILE_VECS;
        let v_base = k_base + BLOCK_N * TILE_STRIDE;
        let has_next = t_next < ts.num_kv_tiles;
        // One buffer: no subgroup reads the previous tile (or Q) any more. Two: this tile is
        // staged, and the other buffer is no longer read.
        workgroupBarrier();
        if (KV_BUFFERS == 1u) {
            if (PREFETCH_KV) {
                store_kv_tile(&next_kv, cp, 0u);
            } else {
                copy_kv_tile(cp, n0, 0u);
            }
            workgroupBarrier(); // this tile staged
        }
        if (PREFETCH_KV && has_next) {
            load_kv_tile_at(&next_kv, cp, t_next * BLOCK_N);
        }

        // The bias of this invocation's score components, loaded before the products so that
        // they hide the loads' latency (read after them, the loads stalled the softmax: 0.36× the
        // plain rate on the H200, BENCHMARKS.md); so is the mask, unless the block summary shows
        // the tile visible.
        if (REGISTER_SOFTMAX && HAS_BIAS) {
            tile_bias = bias_components(reg_rows, seq, head, n0, ts.terms);
        }
        let reads_mask = HAS_MASK && key_tile_blocks(seq, head, m0, BLOCK_M, n0, BLOCK_N) != BLOCK_VISIBLE;
        var tile_hidden = array<u32, N_BLOCKS>(); // explicit: some browsers do not re-zero a var declared in a loop
        if (REGISTER_SOFTMAX && reads_mask) {
            tile_hidden = hidden_components(reg_rows, seq, head, n0);
        }

        // ---- S = Q Kᵀ into this subgroup's score rows ----
        // head_dim blocks outside, key blocks inside: N_BLOCKS independent accumulators keep
        // the matrix units busy instead of one chain of dependent multiply-adds. Kᵀ is a
        // column-major B: its element (d, n) is K row n, column d.
        var s_frag: array<coop_mat16x16<f32, C>, N_BLOCKS>; // set in full below, before any read
        // @unroll
        for (var j = 0u; j < N_BLOCKS; j++) {
            s_frag[j] = coop_mat16x16<f32, C>();
        }
        // @unroll
        for (var d = 0u; d < D_BLOCKS; d++) {
            // @unroll
            for (var j = 0u; j < N_BLOCKS; j++) {
                let k_frag = coopLoad<coop_mat16x16<f16, B>>(&kv_tile[k_base + 16u * j * TILE_STRIDE + 4u * d], TILE_STRIDE);
                s_frag[j] = coopMultiplyAdd((*q_frag)[d], k_frag, s_frag[j]);
            }
        }
        if (REGISTER_SOFTMAX) {
            // ---- online softmax and O = diag(alpha) O + P V, P never leaving registers ----
            let needs_mask = key_tile_needs_mask(seq, m0, BLOCK_M, n0, BLOCK_N);
            var moved = false;
            if (MASK_BRANCH) {
                if (needs_mask) {
                    moved = softmax_in_registers(reg_rows, &s_frag, n0, true, seq, head, ts.terms, tile_bias, tile_hidden, exact);
                } else {
                    moved = softmax_in_registers(reg_rows, &s_frag, n0, false, seq, head, ts.terms, tile_bias, tile_hidden, exact);
                }
            } else {
                moved = softmax_in_registers(reg_rows, &s_frag, n0, needs_mask, seq, head, ts.terms, tile_bias, tile_hidden, exact);
            }
            if (ROW_FACTORS_ALWAYS || moved) {
                scale_rows(o_frag, row_matrix((*reg_rows).alpha));
            }
            // @unroll
            for (var j = 0u; j < N_BLOCKS; j++) {
                accumulate_pv_block(o_frag, probs_operand(s_frag[j]), j, v_base);
            }
        } else {
            // @unroll
            for (var j = 0u; j < N_BLOCKS; j++) {
                coopStoreT(s_frag[j], &scores[ts.my_scores + 4u * j], S_STRIDE);
            }
            subgroupBarrier(); // the scores visible to the subgroup's invocations

            // ---- online softmax on this invocation's part of its row, held in registers ----
            let first_col = n0 + ts.part * 4u * PART_VECS;
            let x = read_row_part(my_row, first_col, ts.row_keys, key_tile_needs_mask(seq, m0, BLOCK_M, n0, BLOCK_N), reads_mask, seq, head, ts.row, ts.terms);
            var raw_max = neg_inf();
            // @unroll
            for (var i = 0u; i < PART_VECS; i++) {
                raw_max = max(raw_max, max(max(x[i].x, x[i].y), max(x[i].z, x[i].w)));
            }
            let tile_raw_max = row_lanes_max(raw_max);
            let alpha = row_part_softmax(row_part, tile_raw_max);
            (*row_part).l_part += write_part_probs(x, *row_part, my_p_row, exact, seq, head, ts.row, first_col);
            subgroupBarrier(); // P visible to the subgroup's cooperative loads; the scores all read

            // ---- O = diag(alpha) O + P V ----
            // Where some row of the subgroup moved its reference max, each row's factor goes into a
            // 16 × 16 window of the score rows, is loaded as an accumulator matrix, and multiplies
            // every output fragment component-wise, in place. (Rescaling through workgroup memory
            // instead, fragment by fragment, made NVIDIA's compiler copy all of the output's
            // registers twice a tile, rescaled or not: docs/perf-history.md, "Cooperative
            // matrices", step 13.)
            if (ROW_FACTORS_ALWAYS || subgroupAny(alpha != 1.0)) {
                let window = ts.my_scores + ts.r * S_STRIDE + WINDOW_PART_VECS * ts.part;
                // @unroll
                for (var i = 0u; i < WINDOW_PART_VECS; i++) {
                    scores[window + i] = vec4<f32>(alpha);
                }
                subgroupBarrier();
                scale_rows(o_frag, coopLoadT<coop_mat16x16<f32, C>>(&scores[ts.my_scores], S_STRIDE));
            }
            // @unroll
            for (var j = 0u; j < N_BLOCKS; j++) {
                accumulate_pv_block(o_frag, coopLoadT<coop_mat16x16<f16, A>>(&probs[ts.my_probs + 4u * j], P_STRIDE), j, v_base);
            }

        }

        if (KV_BUFFERS == 2u && has_next) {
            // The other buffer was last read by the previous tile's products, which every
            // subgroup finished before this iteration's barrier.
            let other = ((step + 1u) % 2u) * KV_TILE_VECS;
            if (PREFETCH_KV) {
                store_kv_tile(&next_kv, cp, other);
            } else {
                copy_kv_tile(cp, t_next * BLOCK_N, other);
            }
        }
        t = t_next;
        step++;
    }
}

// Whether some row of the workgroup noted a huge reference in the fast pass (`seen`, this
// invocation's rows): one vote a subgroup, read back uniformly, since the exact pass's barriers
// need the whole workgroup. The votes go where the K/V buffers start (free once every subgroup is
// past the last tile; the exact pass stages its tiles afresh), as eight halves of two granules.
fn workgroup_saw_huge(sg: u32, lane: u32, seen: bool) -> bool {
    let vote = subgroupAny(seen);
    workgroupBarrier(); // every subgroup is done with the K/V buffers
    if (lane == 0u) {
        kv_tile[sg / 4u][sg % 4u] = select(0.0h, 1.0h, vote);
    }
    let votes = array<vec4<f16>, 2>(workgroupUniformLoad(&kv_tile[0]), workgroupUniformLoad(&kv_tile[1]));
    var any = false;
    for (var i = 0u; i < SUBGROUPS; i++) {
        any = any | (votes[i / 4u][i % 4u] != 0.0h);
    }
    return any;
}

@compute @workgroup_size(WORKGROUP_SIZE)
fn flash_fwd_coop(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
    @builtin(subgroup_invocation_id) subgroup_lane: u32,
) {
    let tile = tile_of_workgroup(wg, groups);
    let head = tile.y;
    let seq = sequence(tile.z);
    let kv_head = head / params.group_size;
    let m0 = (params.num_q_tiles - 1u - tile.x) * BLOCK_M;
    if (m0 >= seq.seq_q) {
        return; // past this sequence's rows (a shorter sequence of a packed batch)
    }
    if (EXACT_PASS == EXACT_RERUN && !flagged(wg, groups, li)) {
        return; // the fast dispatch's output stands
    }
    // Subgroups as consecutive runs of SUBGROUP local invocations: what NVIDIA's driver does, not
    // what Vulkan promises (subgroup_id / subgroup_invocation_id would not assume it; not yet
    // measured on the H200, so not yet changed).
    let sg = li / SUBGROUP;
    let lane = li % SUBGROUP;
    // This invocation's row within its subgroup's 16, and which part of the score columns (the
    // workgroup-memory softmax; with the softmax in registers only the output's write-out uses
    // them, and rows come from the fragment layout instead).
    let r = lane % 16u;
    let part = lane / 16u;
    let row = m0 + sg * 16u + r;
    let my_scores = sg * 16u * S_STRIDE;
    let my_probs = sg * 16u * P_STRIDE;

    // The K/V tiles some row of the tile sees: from the first row's window edge (tiles left of
    // every row's window are never loaded) to the last row's end of keys, diagonal or window; the
    // first is the first a mask's block summary does not show hidden whole.
    let kv_end = visible_key_end(seq, m0 + BLOCK_M);
    let num_kv_tiles = (kv_end + BLOCK_N - 1u) / BLOCK_N;
    let first_kv_tile = next_key_tile(seq, head, m0, BLOCK_M, visible_key_begin(seq, m0) / BLOCK_N, num_kv_tiles, BLOCK_N);
    // The keys this row sees (sequence end, causal diagonal, window).
    let row_keys = visible_keys(seq, row);

    // Q fragments, once, staged through the K/V tile's memory, Q_PASS_ROWS rows at a time.
    var q_frag: array<coop_mat16x16<f16, A>, D_BLOCKS>;
    for (var q_pass = 0u; q_pass < Q_PASSES; q_pass++) {
        let first = q_pass * Q_PASS_ROWS;
        // All of this invocation's granules are loaded before any is stored, so that the
        // workgroup waits for global memory once a pass rather than once a granule (a loop that
        // stored each granule right after its load made a workgroup's fixed cost several K/V
        // tiles' worth: docs/perf-history.md, "Cooperative matrices", step 23).
        var staged: array<vec4<f16>, Q_COPIES>; // set in full below, before any read
        // @unroll
        for (var i = 0u; i < Q_COPIES; i++) {
            let g = li + i * WORKGROUP_SIZE;
            let q_row = m0 + first + g / ROW_GRANULES;
            let c = g % ROW_GRANULES;
            var x = vec4<f16>(0.0);
            if (g < Q_PASS_GRANULES && q_row < seq.seq_q && 4u * c < params.head_dim) {
                x = q[row_granule(params.q, seq.b, seq.q_first + q_row, head) + c];
            }
            staged[i] = x;
        }
        workgroupBarrier(); // no subgroup still reads the previous pass's staged rows
        // @unroll
        for (var i = 0u; i < Q_COPIES; i++) {
            let g = li + i * WORKGROUP_SIZE;
            if (g < Q_PASS_GRANULES) {
                kv_tile[(g / ROW_GRANULES) * TILE_STRIDE + g % ROW_GRANULES] = staged[i];
            }
        }
        workgroupBarrier();
        if (sg * 16u / Q_PASS_ROWS == q_pass) { // uniform over the subgroup
            // @unroll
            for (var d = 0u; d < D_BLOCKS; d++) {
                q_frag[d] = coopLoadT<coop_mat16x16<f16, A>>(&kv_tile[(sg * 16u - first) * TILE_STRIDE + 4u * d], TILE_STRIDE);
            }
        }
    }

    // The fast pass over the K/V tiles, and for a workgroup where some row's reference turned
    // huge, the exact pass from the start (attend_kv_tiles): here, or in the rerun (EXACT_PASS).
    var o_frag: array<coop_mat16x16<f32, C>, D_BLOCKS>;
    var row_part: RowPart;
    var reg_rows: RegisterRows;
    if (REGISTER_SOFTMAX) {
        reg_rows = rows_in_registers(seq, my_scores, lane, m0 + sg * 16u);
    }
    let ts = TileStream(seq, head, m0, first_kv_tile, num_kv_tiles, kv_copy(li, seq, kv_head), score_terms(head), row, row_keys, r, part, my_scores, my_probs);
    if (EXACT_PASS == EXACT_RERUN) {
        attend_kv_tiles(true, ts, &q_frag, &o_frag, &reg_rows, &row_part);
    } else {
        attend_kv_tiles(false, ts, &q_frag, &o_frag, &reg_rows, &row_part);
        let saw_huge = workgroup_saw_huge(sg, lane, select(row_part.huge_seen, reg_rows.huge_seen, REGISTER_SOFTMAX));
        if (EXACT_PASS == EXACT_FLAGGED) {
            note_huge(wg, groups, li, saw_huge);
        } else if (saw_huge) {
            attend_kv_tiles(true, ts, &q_frag, &o_frag, &reg_rows, &row_part);
        }
    }

    // ---- epilogue: O / l (in registers, or on the way out with the workgroup-memory softmax)
    // through the subgroup's score window, 16 columns at a time; LSE; the head's sink, if any,
    // joining each row's sum ----
    var row_scale = 1.0; // what this invocation's row of the window is multiplied by on the way out
    if (REGISTER_SOFTMAX) {
        var inv_l: array<f32, ROW_SLOTS>;
        // @unroll
        for (var sl = 0u; sl < ROW_SLOTS; sl++) {
            let total = join_sink(head, reg_rows.m_used[sl], row_sum(reg_rows.l_part[sl]));
            inv_l[sl] = select(0.0, total.o_factor / total.l, total.l > 0.0);
            if (DROPOUT) {
                inv_l[sl] *= params.dropout_scale;
            }
            if (!seq.valid) {
                inv_l[sl] = nan_f32();
            }
            // One invocation of each row's lanes writes its LSE: the one whose subgroup
            // invocation id (what the shuffles' masks act on) has every leader bit clear.
            if ((subgroup_lane & ROW_LEADER_BITS) == 0u && reg_rows.row[sl] < seq.seq_q && params.write_lse != 0u) {
                lse[lse_index(seq, head, reg_rows.row[sl])] = select(NAN_BITS, lse_bits(total.m, total.l), seq.valid);
            }
        }
        scale_rows(&o_frag, row_matrix(inv_l));
    } else {
        let total = join_sink(head, row_part.m_used, row_lanes_sum(row_part.l_part));
        row_scale = select(0.0, total.o_factor / total.l, total.l > 0.0);
        if (DROPOUT) {
            row_scale *= params.dropout_scale;
        }
        if (!seq.valid) {
            row_scale = nan_f32();
        }
        if (part == 0u && row < seq.seq_q && params.write_lse != 0u) {
            lse[lse_index(seq, head, row)] = select(NAN_BITS, lse_bits(total.m, total.l), seq.valid);
        }
    }
    let out_row = row_granule(params.o, seq.b, seq.q_first + row, head);
    // @unroll
    for (var d = 0u; d < D_BLOCKS; d++) {
        subgroupBarrier();
        coopStoreT(o_frag[d], &scores[my_scores], S_STRIDE);
        subgroupBarrier();
        // Each invocation writes WINDOW_PART_VECS granules of its row.
        for (var g = 0u; g < WINDOW_PART_VECS; g++) {
            let col = 16u * d + 4u * (WINDOW_PART_VECS * part + g);
            if (row < seq.seq_q && col < params.head_dim) {
                o[out_row + col / 4u] = pack_granule(scores[my_scores + r * S_STRIDE + WINDOW_PART_VECS * part + g] * row_scale);
            }
        }
    }
}

// The LSE (natural log) of a row with reference max m (log2 units, scaled) and sum l, as bits;
// LSE_EMPTY_BITS for a row that saw no key.
fn lse_bits(m: f32, l: f32) -> u32 {
    if (l > 0.0) {
        return bitcast<u32>((m + log2(l)) * 0.6931471805599453);
    }
    return LSE_EMPTY_BITS;
}
