// score_bias_bound.wgsl — the score bias tensor (src/problem/score_bias.rs) at binding
// BIAS_BINDING, for the kernels that implement it (the tiled forward). Its element type is the
// host's BIAS_DTYPE (0 f32, 1 f16, 2 bf16); the buffer is read as u32 words either way, so that
// no shader feature is needed for 16-bit values and any element offset works. Element (b, h, i, j)
// lies at params.bias.offset + b·params.bias.batch + h·params.bias.head + i·params.bias.seq + j,
// in elements (a stride of 0 broadcasts).

@group(0) @binding(BIAS_BINDING) var<storage, read> bias_words: array<u32>;

const HAS_BIAS: bool = true;

// The bias of query row `row` of sequence `seq` and head h against key columns `cols`, in base 2
// (what the kernels' scores are), and which of the four are −∞: keys the bias hides, as the
// causal mask does. Columns past the sequence's keys and rows past its queries read nothing (0,
// shown): the kernels mask those themselves.
fn score_bias(seq: Sequence, h: u32, row: u32, cols: vec4<u32>) -> ScoreBias {
    var out = ScoreBias(vec4<f32>(0.0), vec4<bool>(false));
    if (row >= seq.seq_q) {
        return out;
    }
    let row_start = params.bias.offset + seq.b * params.bias.batch + h * params.bias.head + row * params.bias.seq;
    for (var j = 0u; j < 4u; j++) {
        if (cols[j] < seq.seq_kv) {
            let e = row_start + cols[j];
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
            out.value[j] = select(value * LOG2_E, LOWEST, hidden);
            out.hidden[j] = hidden;
        }
    }
    return out;
}
