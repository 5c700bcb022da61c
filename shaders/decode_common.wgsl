// decode_common.wgsl — what the two decode kernels share: flash_decode.wgsl (FMA units, lane
// groups) and flash_decode_coop.wgsl (matrix units). Both own one K/V head of one sequence, ROWS
// packed query rows and one piece of the keys per workgroup (the grid and the packing are
// described in flash_decode.wgsl), so they share where a packed row and a cached key live, which
// keys a row sees, how a score is formed, and the epilogue: merging the row statistics of the
// workgroup's PARTS (the groups of invocations that each took some of the keys) and writing O and
// the LSE, or a piece's partial results for decode_combine.wgsl.
//
// The host defines HEAD_GRANULES, PAGED, KV_LENGTHS, SOFTCAP and ALIBI (src/wgsl/mod.rs,
// decode_source; the last two leave the score terms a problem lacks out of the build); the
// including kernel defines ROWS, PARTS and WG, binds q, k and v (bindings 1–3) in the element type
// its loads want, and says where its merged output lies (`merged_granule`).

@group(0) @binding(4) var<storage, read_write> o: array<Granule>;
@group(0) @binding(5) var<storage, read_write> lse: array<u32>;
// [batch, num_heads, seq_q, num_splits, head_dim / 4] and [batch, num_heads, seq_q, num_splits].
@group(0) @binding(6) var<storage, read_write> o_partial: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read_write> lse_partial: array<u32>;
// [batch, pages_per_seq] and [batch]; a 16-byte placeholder when not PAGED / not KV_LENGTHS.
@group(0) @binding(8) var<storage, read> page_table: array<u32>;
@group(0) @binding(9) var<storage, read> kv_lens: array<u32>;

// Each part's running max and sum per row, for the merge at the end.
var<workgroup> group_max: array<f32, PARTS * ROWS>;
var<workgroup> group_sum: array<f32, PARTS * ROWS>;
// x is set by any invocation that met a page past the pool or a key count past seq_kv. A vec4,
// so that every workgroup variable of the cooperative-matrix kernel is a multiple of 16 bytes
// (flash_fwd_coop.wgsl says why).
var<workgroup> bad_index: vec4<u32>;

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

// Sequence b's keys: seq_kv, or its own count (clamped, and flagged if past seq_kv). Called
// after bad_index is cleared (decode_piece).
fn sequence_keys(b: u32) -> u32 {
    var seq_len = params.seq_kv;
    if (KV_LENGTHS) {
        seq_len = kv_lens[b];
        if (seq_len > params.seq_kv) {
            bad_index.x = 1u;
            seq_len = params.seq_kv;
        }
    }
    return seq_len;
}

// One packed query row of a workgroup: its query head and token, the keys [begin, end) of this
// piece it sees, and its ALiBi slope (base 2, 0 without ALiBi) and position.
struct DecodeRow {
    head: u32,
    token: u32,
    begin: u32,
    end: u32,
    slope: f32,
    position: f32,
}

// What a workgroup owns (grid: x the pieces of the keys, y K/V heads × row blocks, z the batch):
// sequence b (of seq_len keys) and its K/V head kv_head, packed rows row0 .. row0 + ROWS of the
// head's rows_per_kv_head, and piece `split`, keys keys_begin .. piece_end; of those its rows see
// first .. end (from the first key any row sees, a window's left edge, to the last; empty for a
// piece past a shorter sequence's end), and every one of its rows sees all_first .. all_end (empty
// where all_first ≥ all_end): steps inside need no mask.
struct DecodePiece {
    split: u32,
    b: u32,
    kv_head: u32,
    row0: u32,
    rows_per_kv_head: u32,
    seq_len: u32,
    keys_begin: u32,
    piece_end: u32,
    first: u32,
    end: u32,
    all_first: u32,
    all_end: u32,
}

// The workgroup's piece. Clears bad_index before anyone may set it (workgroup memory need not
// start at zero), behind a workgroup barrier: call it first, in uniform control flow.
fn decode_piece(wg: vec3<u32>, li: u32) -> DecodePiece {
    if (li == 0u) {
        bad_index = vec4<u32>(0u);
    }
    workgroupBarrier();
    var piece: DecodePiece;
    piece.split = wg.x;
    piece.b = wg.z;
    piece.rows_per_kv_head = params.group_size * params.seq_q;
    let row_blocks = (piece.rows_per_kv_head + ROWS - 1u) / ROWS;
    piece.kv_head = wg.y / row_blocks;
    piece.row0 = (wg.y % row_blocks) * ROWS;
    piece.seq_len = sequence_keys(piece.b);
    piece.keys_begin = piece.split * params.keys_per_split;
    piece.piece_end = min(piece.seq_len, piece.keys_begin + params.keys_per_split);
    piece.first = max(piece.piece_end, piece.keys_begin);
    piece.end = piece.keys_begin;
    piece.all_first = 0u;
    piece.all_end = piece.piece_end;
    for (var i = 0u; i < ROWS; i++) {
        let row = decode_row(piece, i);
        piece.end = max(piece.end, row.end);
        piece.first = min(piece.first, max(piece.keys_begin, row.begin));
        piece.all_first = max(piece.all_first, row.begin);
        piece.all_end = min(piece.all_end, row.end);
    }
    return piece;
}

// Row row0 + r of the piece's packed rows (rows past the K/V head's last repeat it: they are
// computed and not written); only the piece's fields before `first` are read.
fn decode_row(piece: DecodePiece, r: u32) -> DecodeRow {
    let p = min(piece.row0 + r, piece.rows_per_kv_head - 1u);
    var row: DecodeRow;
    row.head = piece.kv_head * params.group_size + p / params.seq_q;
    row.token = p % params.seq_q;
    // common.wgsl's keys_seen at the token's position, aligned to the sequence's end.
    let position = i32(row.token) + i32(piece.seq_len) - i32(params.seq_q);
    let keys = keys_seen(position, piece.seq_len);
    row.begin = keys.x;
    row.end = min(piece.piece_end, keys.y);
    row.slope = alibi_slope(row.head) * LOG2_E;
    row.position = f32(position);
    return row;
}

// Scores in base 2 of keys key..key+3 of a row from their dot products: the scale, the soft-cap if
// any (common.wgsl), and ALiBi's bias.
fn scores4(dots: vec4<f32>, row: DecodeRow, key: u32) -> vec4<f32> {
    var s = dots * params.scale;
    if (SOFTCAP) {
        s = soft_cap(s);
    }
    if (ALIBI) {
        let keys = vec4<f32>(f32(key), f32(key + 1u), f32(key + 2u), f32(key + 3u));
        s -= row.slope * abs(row.position - keys);
    }
    return s;
}

// Whether `key` is one the row sees. `&`, not `&&`: its branch per unrolled copy hung
// SwiftShader's compile in Chrome.
fn sees(row: DecodeRow, key: u32) -> bool {
    return (key < row.end) & (key >= row.begin);
}

// The max of `m` and `x` where `visible`, `m` counting only once `any` is set. Masked keys never
// enter a max, so any finite softmax scale gives the reference's answer.
fn max_visible(m: f32, any: bool, x: f32, visible: bool) -> f32 {
    return select(m, select(x, max(m, x), any), visible);
}

// Row r's max and sum over the workgroup's parts (their group_max / group_sum entries, written
// before a workgroup barrier). A part that saw no key of the row (sum 0) weighs nothing.
fn merged_stats(r: u32) -> vec2<f32> {
    var m = 0.0;
    var any_seen = false;
    for (var g = 0u; g < PARTS; g++) {
        if (group_sum[g * ROWS + r] > 0.0) {
            m = max_visible(m, any_seen, group_max[g * ROWS + r], true);
            any_seen = true;
        }
    }
    var sum = 0.0;
    for (var g = 0u; g < PARTS; g++) {
        let l = group_sum[g * ROWS + r];
        if (l > 0.0) {
            sum += l * exp2(group_max[g * ROWS + r] - m);
        }
    }
    return vec2<f32>(m, sum);
}

// The factor a part's accumulator of a row (its max `m`, sum `l`) takes to the row's merged max.
fn part_weight(m: f32, l: f32, merged_max: f32) -> f32 {
    return select(0.0, exp2(m - merged_max), l > 0.0);
}

// Writes granule g of a row's output from `merged` (the parts' accumulators, weighted to the
// merged max `stats.x`, whose sum is `stats.y`): O and the LSE with one piece (where the head's
// sink joins the sum; with more, decode_combine.wgsl adds it), else the piece's normalized partial
// output and its LSE. A workgroup that met a bad cache index writes NaN.
fn write_output(piece: DecodePiece, row: DecodeRow, g: u32, merged: vec4<f32>, stats: vec2<f32>, poisoned: bool) {
    var total_max = stats.x;
    var sum = stats.y;
    var out_factor = 1.0;
    if ((params.sinks != 0u) & (params.num_splits == 1u)) {
        let sink = sink_log2(row.head);
        let seen = sum > 0.0;
        let m = select(sink, max(total_max, sink), seen);
        out_factor = select(0.0, exp2(total_max - m), seen);
        sum = sum * out_factor + exp2(sink - m);
        total_max = m;
    }
    var out = select(vec4<f32>(0.0), merged * (out_factor / sum), sum > 0.0);
    var lse_bits = select(LSE_EMPTY_BITS, bitcast<u32>((total_max + log2(sum)) * LN_2), sum > 0.0);
    if (poisoned) {
        out = vec4<f32>(nan_f32());
        lse_bits = NAN_BITS;
    }
    let at = lse_index(dense_sequence(piece.b), row.head, row.token);
    if (params.num_splits == 1u) {
        o[row_granule(params.o, piece.b, row.token, row.head) + g] = pack_granule(out);
        if (g == 0u && params.write_lse != 0u) {
            lse[at] = lse_bits;
        }
    } else {
        let part = at * params.num_splits + piece.split;
        o_partial[part * HEAD_GRANULES + g] = out;
        if (g == 0u) {
            lse_partial[part] = lse_bits;
        }
    }
}

// Writes the workgroup's rows (not those past the K/V head's last) from the kernel's merged
// output: granule g of row r is merged_granule(r, g). After the merge's last workgroup barrier.
fn write_rows(piece: DecodePiece, li: u32) {
    let poisoned = bad_index.x != 0u;
    for (var item = li; item < ROWS * HEAD_GRANULES; item += WG) {
        let r = item / HEAD_GRANULES;
        let g = item % HEAD_GRANULES;
        if (piece.row0 + r >= piece.rows_per_kv_head) {
            continue;
        }
        write_output(piece, decode_row(piece, r), g, merged_granule(r, g), merged_stats(r), poisoned);
    }
}
