// score_bias_fragments_bound.wgsl — the f16 score bias read as 16 × 16 matrix fragments, for the
// cooperative-matrix forward's register softmax (coop_registers.wgsl, bias_components).
//
// Why: read element by element (score_bias_bound.wgsl), each score component costs its own
// index, bounds checks, 16-bit load and unpacking, several times the softmax's own work a score;
// one cooperative load brings a subgroup's 16 × 16 block of the bias in the accumulator's layout
// (the A operand's, which the layout probe checked is the accumulator's), leaving a conversion and
// a multiply a component.
//
// The same buffer as `bias_words` (score_bias_bound.wgsl, which the element reads of the blocks
// at the sequence's edges still use), bound a second time as vec4s of f16. The host compiles
// this in only where every block's start is 16-byte aligned, as cooperative loads need: an f16
// bias whose offset and strides are multiples of 8 elements, in a binding the device aligns to
// 16 bytes (CoopConfig::bias_fragments, src/plan/coop.rs).

@group(0) @binding(BIAS_FRAGMENTS_BINDING) var<storage, read> bias_vec4s: array<vec4<f16>>;

const BIAS_FRAGMENTS: bool = true;

// Whether the 16 × 16 block of query rows [first_row, first_row + 16) and key columns
// [col, col + 16) of `seq` lies inside the bias, so that bias_fragment reads only its elements.
fn bias_block_inside(seq: Sequence, first_row: u32, col: u32) -> bool {
    return first_row + 16u <= seq.seq_q && col + 16u <= seq.seq_kv;
}

// The bias of that block for head h, element (r, c) the bias of row first_row + r against key
// col + c, as the A operand (raw values, not yet scaled into base 2). Called by the whole
// subgroup, for a block bias_block_inside accepts.
fn bias_fragment(seq: Sequence, h: u32, first_row: u32, col: u32) -> coop_mat16x16<f16, A> {
    let e = params.bias.offset + seq.b * params.bias.batch + h * params.bias.head + first_row * params.bias.seq + col;
    return coopLoadT<coop_mat16x16<f16, A>>(&bias_vec4s[e / 4u], params.bias.seq / 4u);
}
