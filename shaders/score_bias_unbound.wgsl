// score_bias_unbound.wgsl — no score bias (see score_bias_bound.wgsl): HAS_BIAS is false and the
// branches that read it compile away.

const HAS_BIAS: bool = false;

fn score_bias(seq: Sequence, h: u32, row: u32, cols: vec4<u32>) -> ScoreBias {
    return ScoreBias(vec4<f32>(0.0), vec4<bool>(false));
}

fn score_bias_of_rows(seq: Sequence, h: u32, rows: vec4<u32>, col: u32) -> ScoreBias {
    return ScoreBias(vec4<f32>(0.0), vec4<bool>(false));
}

fn bias_element(seq: Sequence, h: u32, row: u32, col: u32) -> ScoreBiasElement {
    return ScoreBiasElement(0.0, false);
}
