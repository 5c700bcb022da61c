// mask_unbound.wgsl — no mask tensor (see mask_bound.wgsl): HAS_MASK is false and the branches
// that read it compile away.

const HAS_MASK: bool = false;

fn mask_hides(seq: Sequence, h: u32, row: u32, col: u32) -> bool {
    return false;
}

fn mask_hidden(seq: Sequence, h: u32, row: u32, cols: vec4<u32>) -> vec4<bool> {
    return vec4<bool>(false);
}

fn mask_hidden_of_rows(seq: Sequence, h: u32, rows: vec4<u32>, col: u32) -> vec4<bool> {
    return vec4<bool>(false);
}
