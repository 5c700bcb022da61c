// score_bias_bound.wgsl — the score bias tensor (src/problem/score_bias.rs) at binding
// BIAS_BINDING, for the kernels that implement it (the tiled forward, the dQ and dK/dV kernels). Its element type is the
// host's BIAS_DTYPE (0 f32, 1 f16, 2 bf16); the buffer is read as u32 words either way, so that
// no shader feature is needed for 16-bit values and any element offset works. Element (b, h, i, j)
// lies at params.bias.offset + b·params.bias.batch + h·params.bias.head + i·params.bias.seq + j,
// in elements (a stride of 0 broadcasts).

@group(0) @binding(BIAS_BINDING) var<storage, read> bias_words: array<u32>;

const HAS_BIAS: bool = true;

// The bias of query row `row` against key `col` of sequence `seq` and head h, in base 2 (what the
// kernels' scores are), or LOWEST with `hidden` for a −∞ entry: a key the bias hides, as the
// causal mask does. Rows past the sequence's queries and columns past its keys read nothing (0,
// shown): the kernels mask those themselves.
fn bias_element(seq: Sequence, h: u32, row: u32, col: u32) -> ScoreBiasElement {
    if (row >= seq.seq_q || col >= seq.seq_kv) {
        return ScoreBiasElement(0.0, false);
    }
    let e = params.bias.offset + seq.b * params.bias.batch + h * params.bias.head + row * params.bias.seq + col;
    var value = 0.0;
    var hidden = false;
    if (BIAS_DTYPE == 0u) {
        let bits = bias_words[e];
        value = bitcast<f32>(bits);
        hidden = bits == 0xff800000u;
    } else {
        let bits = (bias_words[e / 2u] >> (16u * (e % 2u))) & 0xffffu;
        if (BIAS_DTYPE == 1u) {
            value = unpack2x16float(bits).x;
            hidden = bits == 0xfc00u;
        } else {
            value = bitcast<f32>(bits << 16u);
            hidden = bits == 0xff80u;
        }
    }
    // A hidden key's value is never used: LOWEST keeps the arithmetic finite.
    return ScoreBiasElement(select(value * LOG2_E, LOWEST, hidden), hidden);
}

// Query row `row` against four key columns (the forward and the dQ kernel).
fn score_bias(seq: Sequence, h: u32, row: u32, cols: vec4<u32>) -> ScoreBias {
    var out: ScoreBias;
    for (var j = 0u; j < 4u; j++) {
        let x = bias_element(seq, h, row, cols[j]);
        out.value[j] = x.value;
        out.hidden[j] = x.hidden;
    }
    return out;
}

// Four query rows against key column `col` (the dK/dV kernel, whose tiles are transposed).
fn score_bias_of_rows(seq: Sequence, h: u32, rows: vec4<u32>, col: u32) -> ScoreBias {
    var out: ScoreBias;
    for (var j = 0u; j < 4u; j++) {
        let x = bias_element(seq, h, rows[j], col);
        out.value[j] = x.value;
        out.hidden[j] = x.hidden;
    }
    return out;
}
