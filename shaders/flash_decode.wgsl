// flash_decode.wgsl — attention for a few query rows per sequence against a long K/V cache (LLM
// decoding: one new token, or a few for speculative decoding), split along the keys across
// workgroups (flash-decoding).
//
// What a workgroup owns: one K/V head of one sequence (grid y: K/V head × row block, z: batch),
// ROWS of its packed query rows — the GROUP query heads that read this K/V head times the seq_q
// new tokens (row r is query head kv_head·GROUP + r / seq_q, token r % seq_q), so each K/V row is
// read once for all of them — and one piece of the keys (grid x): keys [split·keys_per_split, +
// keys_per_split), cut at the causal limit of its last token. With one piece it writes O and the
// LSE; with more, a normalized f32 partial O and its LSE per row, which decode_combine.wgsl merges.
//
// What an invocation owns: LANES consecutive invocations form a key group that reads one key row
// together, lane l the words l, l + LANES, ... of it, so a row is one coalesced read (a word is
// WORD_GRANULES granules: two, 16 bytes of a 16-bit type, where the host found K and V aligned so,
// else one: the kernel is bound by its instructions per key, and loads are some of them); their
// partial dot products are added across the group (add_across_lanes: subgroup shuffles, or
// workgroup memory on devices without subgroups). KEY_GROUPS = WG / LANES groups take
// interleaved steps of KEYS_PER_STEP consecutive keys. A lane's loads run ahead of their use (V a
// whole step, K from the end of the previous step's products): a step's time then overlaps the
// next step's memory latency, where a lane waiting for its own step's loads left the SM idle, as
// only two workgroups fit on one (on the H200 the head_dim-128 build holds 255 registers).
// Every lane keeps, for its granules and all ROWS rows, the query slice and the output
// accumulator in registers, and the rows' running max and sum (equal across its group). At the end
// the groups merge their states through workgroup memory.
//
// Sizes (src/plan/decode.rs, DECODE_PLANS): 8 lanes of 16-byte words cover a 128-element 16-bit
// row (256 bytes) in two loads each; LANES never exceeds the smallest subgroup when shuffles add
// the products; ROWS × granules per lane bounds the registers. The host defines WORD_GRANULES,
// the word type KvWord and word_granule (src/wgsl/mod.rs, decode_source).
//
// The bindings past v, where rows and cached keys live, scores and the epilogue are
// decode_common.wgsl's, shared with the cooperative-matrix decode kernel (flash_decode_coop.wgsl).
//
// Every loop over a register array carries the unroll marker and is expanded by the host
// (src/wgsl/unroll.rs): with run-time indices the driver may keep those arrays in local memory.
//
// K/V caches (src/problem/cache.rs): with PAGED, key j of sequence b is row j % page_size of page
// page_table[b · pages_per_seq + j / page_size] of the K and V pools (the layouts' batch stride is
// the page stride); with KV_LENGTHS, sequence b has kv_lens[b] keys and its causal mask ends there.
// The host checks both index tensors when it uploads them; on the caller's buffers a page past the
// pool or a count past seq_kv is read as page 0 / seq_kv, never out of bounds, and the rows of
// that workgroup are written as NaN (O and LSE), so the error shows instead of passing silently.
//
// ALiBi and sinks (head_terms.wgsl; with their tensors at bindings 10–11): a row's slope and
// position are worked out once, and the bias is built into the scores only with ALIBI
// (decode_common.wgsl's scores4, like the soft-cap with SOFTCAP); a head's sink joins the row's
// sum at the end with one piece, else in decode_combine.wgsl.
//
// Masked keys contribute exactly zero: a row's max starts at its first visible key (`seen`), not
// at a sentinel, so any finite softmax scale (negative, tiny, huge) gives the reference's answer;
// a row that sees no key writes O = 0 and LSE = −∞.

const KEY_GROUPS: u32 = WG / LANES;
// The parts decode_common.wgsl merges at the end.
const PARTS: u32 = KEY_GROUPS;
const HEAD_WORDS: u32 = HEAD_GRANULES / WORD_GRANULES;
const WORDS_PER_LANE: u32 = (HEAD_WORDS + LANES - 1u) / LANES;
const GRANULES_PER_LANE: u32 = WORDS_PER_LANE * WORD_GRANULES;
const DOTS: u32 = KEYS_PER_STEP * ROWS;
// Words of K (or V) one lane loads per step of keys.
const KV_WORDS: u32 = KEYS_PER_STEP * WORDS_PER_LANE;
// Granules of one row in `merged`: the lanes' granules, padding included.
const MERGED_ROW: u32 = LANES * GRANULES_PER_LANE;

@group(0) @binding(1) var<storage, read> q: array<Granule>;
@group(0) @binding(2) var<storage, read> k: array<KvWord>;
@group(0) @binding(3) var<storage, read> v: array<KvWord>;

var<workgroup> merged: array<vec4<f32>, ROWS * MERGED_ROW>;

@compute @workgroup_size(WG)
fn flash_decode(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let piece = decode_piece(wg, li);
    let lane = li % LANES;
    let key_group = li / LANES;
    var rows: array<DecodeRow, ROWS>;
    // @unroll
    for (var r = 0u; r < ROWS; r++) {
        rows[r] = decode_row(piece, r);
    }
    let keys_end = piece.end;

    var q_slice: array<vec4<f32>, ROWS * GRANULES_PER_LANE>;
    // @unroll
    for (var r = 0u; r < ROWS; r++) {
        let base = row_granule(params.q, piece.b, rows[r].token, rows[r].head);
        // @unroll
        for (var j = 0u; j < GRANULES_PER_LANE; j++) {
            let g = lane_granule(lane, j);
            if (g < HEAD_GRANULES) {
                q_slice[r * GRANULES_PER_LANE + j] = unpack_granule(q[base + g]);
            }
        }
    }

    var acc: array<vec4<f32>, ROWS * GRANULES_PER_LANE>;
    var row_max: array<f32, ROWS>;
    var row_sum: array<f32, ROWS>;
    // The loads run ahead of their use: a step's K words are in flight from just after the
    // previous step's products (over its butterfly, softmax and P·V), its V words over the whole
    // previous step (v_next). Unpacked V values live one at a time, in the P·V loop.
    let step_stride = KEY_GROUPS * KEYS_PER_STEP;
    var k_raw = load_step(piece, lane, piece.first + key_group * KEYS_PER_STEP, true);
    var v_raw = load_step(piece, lane, piece.first + key_group * KEYS_PER_STEP, false);
    // Trip count uniform across the workgroup: add_across_lanes may hold barriers.
    for (var block = piece.first; block < keys_end; block += step_stride) {
        let first = block + key_group * KEYS_PER_STEP;
        let v_next = load_step(piece, lane, first + step_stride, false);
        var dots = array<f32, DOTS>();
        // @unroll
        for (var u = 0u; u < KEYS_PER_STEP; u++) {
            // @unroll
            for (var j = 0u; j < GRANULES_PER_LANE; j++) {
                let key_part = word_part(k_raw[u * WORDS_PER_LANE + j / WORD_GRANULES], j);
                // @unroll
                for (var r = 0u; r < ROWS; r++) {
                    dots[u * ROWS + r] += dot(q_slice[r * GRANULES_PER_LANE + j], key_part);
                }
            }
        }
        k_raw = load_step(piece, lane, first + step_stride, true);
        dots = add_across_lanes(dots, li);

        // Whether every row sees every key of this group's step (all but the steps at a piece's
        // causal or window edges): then no score needs its mask.
        let whole = (first >= piece.all_first) & (first + KEYS_PER_STEP <= piece.all_end);
        // Each row's weights of the step's keys (zero for keys it does not see), its running
        // max and sum brought to the step, and its accumulator rescaled to the new max.
        var p = array<f32, DOTS>();
        // @unroll
        for (var r = 0u; r < ROWS; r++) {
            var s = array<f32, KEYS_PER_STEP>();
            // @unroll
            for (var u = 0u; u < KEYS_PER_STEP; u++) {
                s[u] = scores4(vec4<f32>(dots[u * ROWS + r]), rows[r], first + u).x;
            }
            var step_max = s[0];
            var any_visible = true;
            if (whole) {
                // @unroll
                for (var u = 0u; u < KEYS_PER_STEP; u++) {
                    step_max = max(step_max, s[u]);
                }
            } else {
                any_visible = false;
                // @unroll
                for (var u = 0u; u < KEYS_PER_STEP; u++) {
                    let visible = sees(rows[r], first + u);
                    step_max = max_visible(step_max, any_visible, s[u], visible);
                    any_visible = any_visible | visible;
                }
            }
            if (any_visible) {
                // After its first visible key a row's sum is at least 1 (its max adds exp2(0)).
                let seen = row_sum[r] > 0.0;
                let new_max = select(step_max, max(row_max[r], step_max), seen);
                let rescale = select(0.0, exp2(row_max[r] - new_max), seen);
                row_max[r] = new_max;
                var sum = row_sum[r] * rescale;
                // @unroll
                for (var u = 0u; u < KEYS_PER_STEP; u++) {
                    var weight = exp2(s[u] - new_max);
                    if (!whole) {
                        weight = select(0.0, weight, sees(rows[r], first + u));
                    }
                    p[u * ROWS + r] = weight;
                    sum += weight;
                }
                row_sum[r] = sum;
                // @unroll
                for (var j = 0u; j < GRANULES_PER_LANE; j++) {
                    acc[r * GRANULES_PER_LANE + j] *= rescale;
                }
            }
        }
        // @unroll
        for (var u = 0u; u < KEYS_PER_STEP; u++) {
            // @unroll
            for (var j = 0u; j < GRANULES_PER_LANE; j++) {
                var value = word_part(v_raw[u * WORDS_PER_LANE + j / WORD_GRANULES], j);
                if (!whole) {
                    // A key past the piece loaded another row's values (load_step), and a weight
                    // of 0 times an infinite value would be NaN.
                    value = select(vec4<f32>(0.0), value, first + u < piece.end);
                }
                // @unroll
                for (var r = 0u; r < ROWS; r++) {
                    acc[r * GRANULES_PER_LANE + j] += p[u * ROWS + r] * value;
                }
            }
        }
        v_raw = v_next;
    }

    // Merge the key groups: each group's accumulator, weighted to the rows' merged max, is added
    // into `merged` one group at a time.
    if (lane == 0u) {
        // @unroll
        for (var r = 0u; r < ROWS; r++) {
            group_max[key_group * ROWS + r] = row_max[r];
            group_sum[key_group * ROWS + r] = row_sum[r];
        }
    }
    workgroupBarrier();
    var weight: array<f32, ROWS>;
    // @unroll
    for (var r = 0u; r < ROWS; r++) {
        weight[r] = part_weight(row_max[r], row_sum[r], merged_stats(r).x);
    }
    for (var g = 0u; g < KEY_GROUPS; g++) {
        if (key_group == g) {
            // @unroll
            for (var r = 0u; r < ROWS; r++) {
                // @unroll
                for (var j = 0u; j < GRANULES_PER_LANE; j++) {
                    let at = r * MERGED_ROW + lane_granule(lane, j);
                    let mine = weight[r] * acc[r * GRANULES_PER_LANE + j];
                    merged[at] = select(merged[at] + mine, mine, g == 0u);
                }
            }
        }
        workgroupBarrier();
    }

    write_rows(piece, li);
}

// This lane's words of K (of_k) or V for the step of keys first .. first + KEYS_PER_STEP. One
// function for both: a storage array cannot be a parameter, and `of_k` is a constant at each call,
// so the driver keeps one of the two loads.
//
// Every word is loaded, a key past the piece reading the words of the cache's first row instead
// (whose scores no row sees, and whose values the P·V step zeroes): a load that may be skipped
// compiles to a load and a move that waits for it where it is issued (BENCHMARKS.md, session 25),
// and these loads are meant to run a step ahead of their use. Only the addresses are conditional.
fn load_step(piece: DecodePiece, lane: u32, first: u32, of_k: bool) -> array<KvWord, KV_WORDS> {
    // Initialized explicitly: a `var` without initializer is zero by the WGSL spec, but Chrome on
    // SwiftShader kept a loop's last trip's values in such arrays (wrong results past the first
    // step, found by web-demo/test.sh).
    var raw = array<KvWord, KV_WORDS>();
    var strides = params.v;
    if (of_k) {
        strides = params.k;
    }
    // @unroll
    for (var u = 0u; u < KEYS_PER_STEP; u++) {
        let key = first + u;
        var base = 0u;
        if (key < piece.end) {
            let row = cache_row(strides, piece.b, key, piece.kv_head);
            // K and V share their page table: one check flags a bad page.
            if (of_k & (row.y == 0u)) {
                bad_index.x = 1u;
            }
            base = row.x / WORD_GRANULES;
        }
        // @unroll
        for (var w = 0u; w < WORDS_PER_LANE; w++) {
            let word = lane + w * LANES;
            // Constant where the lanes divide the row's words (no tail to skip).
            if ((HEAD_WORDS % LANES == 0u) | (word < HEAD_WORDS)) {
                if (of_k) {
                    raw[u * WORDS_PER_LANE + w] = k[base + word];
                } else {
                    raw[u * WORDS_PER_LANE + w] = v[base + word];
                }
            }
        }
    }
    return raw;
}

// The row granule a lane's j-th granule is: its word j / WORD_GRANULES is word lane + that · LANES.
fn lane_granule(lane: u32, j: u32) -> u32 {
    return (lane + (j / WORD_GRANULES) * LANES) * WORD_GRANULES + j % WORD_GRANULES;
}

// A lane's j-th granule, unpacked from the word that holds it.
fn word_part(w: KvWord, j: u32) -> vec4<f32> {
    return unpack_granule(word_granule(w, j % WORD_GRANULES));
}

// Granule g of row r of the merged output (decode_common.wgsl's write_rows reads it).
fn merged_granule(r: u32, g: u32) -> vec4<f32> {
    return merged[r * MERGED_ROW + g];
}
