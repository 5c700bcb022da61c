// score_bias_fragments_unbound.wgsl — no fragment view of the score bias (see
// score_bias_fragments_bound.wgsl): BIAS_FRAGMENTS is false and every block of the bias is read
// element by element.

const BIAS_FRAGMENTS: bool = false;

fn bias_block_inside(seq: Sequence, first_row: u32, col: u32) -> bool {
    return false;
}

fn bias_fragment(seq: Sequence, h: u32, first_row: u32, col: u32) -> coop_mat16x16<f16, A> {
    return coop_mat16x16<f16, A>();
}
