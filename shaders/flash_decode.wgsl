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
// together, lane l the granules l, l + LANES, ... of it, so a row is one coalesced read; their
// partial dot products are added across the group (add_across_lanes: subgroup shuffles, or
// workgroup memory on devices without subgroups). KEY_GROUPS = WG / LANES groups take
// interleaved blocks of KEYS_PER_STEP consecutive keys; a lane issues all loads of a block (K and
// V) before it uses any, which is what keeps enough bytes in flight for a memory-bound kernel.
// Every lane keeps, for its granules and all ROWS rows, the query slice and the output
// accumulator in registers, and the rows' running max and sum (equal across its group). At the end
// the groups merge their states through workgroup memory.
//
// Sizes (src/plan/decode.rs, DECODE_PLANS): 16 lanes of 8-byte granules cover a 128-element
// 16-bit row in 128 bytes; LANES never exceeds the smallest subgroup when shuffles add the
// products; ROWS × granules per lane bounds the registers.
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
// position are worked out once, so the bias costs a multiply-add per score (0 without ALiBi); a
// head's sink joins the row's sum at the end with one piece, else in decode_combine.wgsl.
//
// Masked keys contribute exactly zero: a row's max starts at its first visible key (`seen`), not
// at a sentinel, so any finite softmax scale (negative, tiny, huge) gives the reference's answer;
// a row that sees no key writes O = 0 and LSE = −∞.

const KEY_GROUPS: u32 = WG / LANES;
const GRANULES_PER_LANE: u32 = (HEAD_GRANULES + LANES - 1u) / LANES;
const DOTS: u32 = KEYS_PER_STEP * ROWS;
// Granules of K (or V) one lane loads per block of keys.
const KV_PARTS: u32 = KEYS_PER_STEP * GRANULES_PER_LANE;
// Granules of one row in `merged`: the lanes' granules, padding included.
const MERGED_ROW: u32 = LANES * GRANULES_PER_LANE;

@group(0) @binding(1) var<storage, read> q: array<Granule>;
@group(0) @binding(2) var<storage, read> k: array<Granule>;
@group(0) @binding(3) var<storage, read> v: array<Granule>;
@group(0) @binding(4) var<storage, read_write> o: array<Granule>;
@group(0) @binding(5) var<storage, read_write> lse: array<u32>;
// [batch, num_heads, seq_q, num_splits, head_dim / 4] and [batch, num_heads, seq_q, num_splits].
@group(0) @binding(6) var<storage, read_write> o_partial: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read_write> lse_partial: array<u32>;
// [batch, pages_per_seq] and [batch]; a 16-byte placeholder when not PAGED / not KV_LENGTHS.
@group(0) @binding(8) var<storage, read> page_table: array<u32>;
@group(0) @binding(9) var<storage, read> kv_lens: array<u32>;

var<workgroup> group_max: array<f32, KEY_GROUPS * ROWS>;
var<workgroup> group_sum: array<f32, KEY_GROUPS * ROWS>;
var<workgroup> merged: array<vec4<f32>, ROWS * MERGED_ROW>;
// Set by any invocation that met a page past the pool or a key count past seq_kv.
var<workgroup> bad_index: u32;

// Granule index of (key, K/V head) row `key` of sequence `b` in a tensor of layout `t`, and whether
// the page it names exists (always, when not PAGED).
fn cache_row(t: TensorStrides, b: u32, key: u32, kv_head: u32) -> vec2<u32> {
    if (!PAGED) {
        return vec2<u32>(row_granule(t, b, key, kv_head), 1u);
    }
    let page = page_table[b * params.pages_per_seq + key / params.page_size];
    let valid = page < params.num_pages;
    return vec2<u32>(row_granule(t, select(0u, page, valid), key % params.page_size, kv_head), u32(valid));
}

// The keys [begin, end) query `token` sees in a sequence of `seq_len` keys (common.wgsl's
// keys_seen at the token's position, aligned to the sequence's end).
fn row_keys(token: u32, seq_len: u32) -> vec2<u32> {
    return keys_seen(i32(token) + i32(seq_len) - i32(params.seq_q), seq_len);
}

// A score in base 2 from a dot product: the scale, the soft-cap if any (common.wgsl), and
// ALiBi's bias for a row of slope `slope` (base 2, 0 without ALiBi) at key position `position`
// against `key`.
fn score(dot_product: f32, slope: f32, position: f32, key: u32) -> f32 {
    return soft_cap(vec4<f32>(dot_product * params.scale)).x - slope * abs(position - f32(key));
}

@compute @workgroup_size(WG)
fn flash_decode(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let split = wg.x;
    let b = wg.z;
    let rows_per_kv_head = params.group_size * params.seq_q;
    let row_blocks = (rows_per_kv_head + ROWS - 1u) / ROWS;
    let kv_head = wg.y / row_blocks;
    let row0 = (wg.y % row_blocks) * ROWS;
    let lane = li % LANES;
    let key_group = li / LANES;

    // The rows' query heads and tokens (rows past the K/V head's last repeat it and are not
    // written), and the end of the keys each row sees: the piece's end, cut at its diagonal.
    // Cleared before anyone may set it (workgroup memory need not start at zero).
    if (li == 0u) {
        bad_index = 0u;
    }
    workgroupBarrier();
    // This sequence's keys: seq_kv, or its own count (clamped, and flagged if past seq_kv).
    var seq_len = params.seq_kv;
    if (KV_LENGTHS) {
        seq_len = kv_lens[b];
        if (seq_len > params.seq_kv) {
            bad_index = 1u;
            seq_len = params.seq_kv;
        }
    }
    let keys_begin = split * params.keys_per_split;
    let piece_end = min(seq_len, keys_begin + params.keys_per_split);
    var head: array<u32, ROWS>;
    var token: array<u32, ROWS>;
    var row_begin: array<u32, ROWS>;
    var row_end: array<u32, ROWS>;
    var row_slope: array<f32, ROWS>;
    var row_position: array<f32, ROWS>;
    var keys_end = keys_begin;
    // The first key any row of the block sees, from which the loop starts (a window's left edge).
    var first_seen = piece_end;
    // @unroll
    for (var r = 0u; r < ROWS; r++) {
        let packed = min(row0 + r, rows_per_kv_head - 1u);
        head[r] = kv_head * params.group_size + packed / params.seq_q;
        token[r] = packed % params.seq_q;
        let keys = row_keys(token[r], seq_len);
        row_slope[r] = alibi_slope(head[r]) * LOG2_E;
        row_position[r] = f32(i32(token[r]) + i32(seq_len) - i32(params.seq_q));
        row_begin[r] = keys.x;
        row_end[r] = min(piece_end, keys.y);
        keys_end = max(keys_end, row_end[r]);
        first_seen = min(first_seen, max(keys_begin, keys.x));
    }

    var q_slice: array<vec4<f32>, ROWS * GRANULES_PER_LANE>;
    // @unroll
    for (var r = 0u; r < ROWS; r++) {
        let base = row_granule(params.q, b, token[r], head[r]);
        // @unroll
        for (var j = 0u; j < GRANULES_PER_LANE; j++) {
            let g = lane + j * LANES;
            if (g < HEAD_GRANULES) {
                q_slice[r * GRANULES_PER_LANE + j] = unpack_granule(q[base + g]);
            }
        }
    }

    var acc: array<vec4<f32>, ROWS * GRANULES_PER_LANE>;
    var row_max: array<f32, ROWS>;
    var row_sum: array<f32, ROWS>;
    // Trip count uniform across the workgroup: add_across_lanes may hold barriers.
    for (var block = first_seen; block < keys_end; block += KEY_GROUPS * KEYS_PER_STEP) {
        let first = block + key_group * KEYS_PER_STEP;
        // Initialized explicitly on every trip: a `var` without initializer inside a loop is zero
        // on each trip by the WGSL spec, but Chrome on SwiftShader kept the last trip's values
        // (wrong results past the first block of keys, found by web-demo/test.sh);
        // tests/naga_validate.rs holds this file to it.
        var k_raw = array<Granule, KV_PARTS>();
        var v_raw = array<Granule, KV_PARTS>();
        // @unroll
        for (var u = 0u; u < KEYS_PER_STEP; u++) {
            let key = first + u;
            if (key < keys_end) {
                let k_row = cache_row(params.k, b, key, kv_head);
                let k_base = k_row.x;
                let v_base = cache_row(params.v, b, key, kv_head).x;
                if (k_row.y == 0u) {
                    bad_index = 1u;
                }
                // @unroll
                for (var j = 0u; j < GRANULES_PER_LANE; j++) {
                    let g = lane + j * LANES;
                    if (g < HEAD_GRANULES) {
                        k_raw[u * GRANULES_PER_LANE + j] = k[k_base + g];
                        v_raw[u * GRANULES_PER_LANE + j] = v[v_base + g];
                    }
                }
            }
        }

        var dots = array<f32, DOTS>();
        // @unroll
        for (var u = 0u; u < KEYS_PER_STEP; u++) {
            // @unroll
            for (var j = 0u; j < GRANULES_PER_LANE; j++) {
                let key_part = unpack_granule(k_raw[u * GRANULES_PER_LANE + j]);
                // @unroll
                for (var r = 0u; r < ROWS; r++) {
                    dots[u * ROWS + r] += dot(q_slice[r * GRANULES_PER_LANE + j], key_part);
                }
            }
        }
        dots = add_across_lanes(dots, li);

        var v_part = array<vec4<f32>, KV_PARTS>();
        // @unroll
        for (var i = 0u; i < KV_PARTS; i++) {
            v_part[i] = unpack_granule(v_raw[i]);
        }
        // @unroll
        for (var r = 0u; r < ROWS; r++) {
            var step_max = 0.0;
            var any_visible = false;
            // @unroll
            for (var u = 0u; u < KEYS_PER_STEP; u++) {
                let s = score(dots[u * ROWS + r], row_slope[r], row_position[r], first + u);
                // `&`, not `&&`: its branch per unrolled copy hung SwiftShader's compile in Chrome.
                let visible = (first + u < row_end[r]) & (first + u >= row_begin[r]);
                step_max = select(step_max, select(s, max(step_max, s), any_visible), visible);
                any_visible = any_visible | visible;
            }
            if (any_visible) {
                // After its first visible key a row's sum is at least 1 (its max adds exp2(0)).
                let seen = row_sum[r] > 0.0;
                let new_max = select(step_max, max(row_max[r], step_max), seen);
                let rescale = select(0.0, exp2(row_max[r] - new_max), seen);
                row_max[r] = new_max;
                var sum = row_sum[r] * rescale;
                // @unroll
                for (var j = 0u; j < GRANULES_PER_LANE; j++) {
                    acc[r * GRANULES_PER_LANE + j] *= rescale;
                }
                // @unroll
                for (var u = 0u; u < KEYS_PER_STEP; u++) {
                    let key = first + u;
                    let p = select(0.0, exp2(score(dots[u * ROWS + r], row_slope[r], row_position[r], key) - new_max), (key < row_end[r]) & (key >= row_begin[r]));
                    sum += p;
                    // @unroll
                    for (var j = 0u; j < GRANULES_PER_LANE; j++) {
                        acc[r * GRANULES_PER_LANE + j] += p * v_part[u * GRANULES_PER_LANE + j];
                    }
                }
                row_sum[r] = sum;
            }
        }
    }

    // Merge the key groups: the rows' overall max and sum, then each group's accumulator,
    // rescaled to that max, added into `merged` one group at a time.
    if (lane == 0u) {
        // @unroll
        for (var r = 0u; r < ROWS; r++) {
            group_max[key_group * ROWS + r] = row_max[r];
            group_sum[key_group * ROWS + r] = row_sum[r];
        }
    }
    workgroupBarrier();
    var total_max: array<f32, ROWS>;
    var total_sum: array<f32, ROWS>;
    // @unroll
    for (var r = 0u; r < ROWS; r++) {
        var m = 0.0;
        var any_seen = false;
        for (var g = 0u; g < KEY_GROUPS; g++) {
            if (group_sum[g * ROWS + r] > 0.0) {
                m = select(group_max[g * ROWS + r], max(m, group_max[g * ROWS + r]), any_seen);
                any_seen = true;
            }
        }
        var sum = 0.0;
        for (var g = 0u; g < KEY_GROUPS; g++) {
            let l = group_sum[g * ROWS + r];
            if (l > 0.0) {
                sum += l * exp2(group_max[g * ROWS + r] - m);
            }
        }
        total_max[r] = m;
        total_sum[r] = sum;
    }
    for (var g = 0u; g < KEY_GROUPS; g++) {
        if (key_group == g) {
            // @unroll
            for (var r = 0u; r < ROWS; r++) {
                let weight = select(0.0, exp2(row_max[r] - total_max[r]), row_sum[r] > 0.0);
                // @unroll
                for (var j = 0u; j < GRANULES_PER_LANE; j++) {
                    let at = r * MERGED_ROW + lane + j * LANES;
                    let mine = weight * acc[r * GRANULES_PER_LANE + j];
                    merged[at] = select(merged[at] + mine, mine, g == 0u);
                }
            }
        }
        workgroupBarrier();
    }

    // With one piece, the head's sink joins the sum here (with more, decode_combine.wgsl adds it):
    // what the merge above kept under total_max is scaled by out_factor to the new max.
    var out_factor: array<f32, ROWS>;
    // @unroll
    for (var r = 0u; r < ROWS; r++) {
        out_factor[r] = 1.0;
        if ((params.sinks != 0u) & (params.num_splits == 1u)) {
            let sink = sink_log2(head[r]);
            let seen = total_sum[r] > 0.0;
            let m = select(sink, max(total_max[r], sink), seen);
            out_factor[r] = select(0.0, exp2(total_max[r] - m), seen);
            total_sum[r] = total_sum[r] * out_factor[r] + exp2(sink - m);
            total_max[r] = m;
        }
    }

    let poisoned = bad_index != 0u;
    for (var item = li; item < ROWS * HEAD_GRANULES; item += WG) {
        let r = item / HEAD_GRANULES;
        let g = item % HEAD_GRANULES;
        if (row0 + r >= rows_per_kv_head) {
            continue;
        }
        let sum = total_sum[r];
        var out = select(vec4<f32>(0.0), merged[r * MERGED_ROW + g] * (out_factor[r] / sum), sum > 0.0);
        var lse_bits = select(LSE_EMPTY_BITS, bitcast<u32>((total_max[r] + log2(sum)) * LN_2), sum > 0.0);
        if (poisoned) {
            out = vec4<f32>(nan_f32());
            lse_bits = NAN_BITS;
        }
        let row = lse_index(dense_sequence(b), head[r], token[r]);
        if (params.num_splits == 1u) {
            o[row_granule(params.o, b, token[r], head[r]) + g] = pack_granule(out);
            if (g == 0u && params.write_lse != 0u) {
                lse[row] = lse_bits;
            }
        } else {
            let piece = row * params.num_splits + split;
            o_partial[piece * HEAD_GRANULES + g] = out;
            if (g == 0u) {
                lse_partial[piece] = lse_bits;
            }
        }
    }
}
