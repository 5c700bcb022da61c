// mask_blocks_unbound.wgsl — no block summary (see mask_blocks_bound.wgsl): every tile is visited
// and, with a mask, reads it.

const HAS_MASK_BLOCKS: bool = false;

fn key_tile_blocks(seq: Sequence, h: u32, m0: u32, rows: u32, n0: u32, cols: u32) -> u32 {
    return BLOCK_MIXED;
}

fn next_key_tile(seq: Sequence, h: u32, m0: u32, rows: u32, t: u32, end: u32, cols: u32) -> u32 {
    return t;
}
