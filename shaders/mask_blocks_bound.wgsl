// mask_blocks_bound.wgsl — a mask's block summary (src/problem/mask.rs, `MaskBlocks`) at binding
// BLOCKS_BINDING, read by the tiled forward and the dQ and dK/dV kernels to skip key tiles the
// mask hides whole — never loaded — and the mask's reads in tiles it hides nowhere. The buffer
// holds BLOCKS_HEADER words of header (BLOCKS_MAGIC, the key of the description it summarized),
// then one state per MASK_BLOCK × MASK_BLOCK block (BLOCK_MIXED, BLOCK_HIDDEN, BLOCK_VISIBLE) at
// the strides of params.blocks, all written by mask_blocks.wgsl.
//
// The summary is trusted only when its header carries this call's key: one never computed, or
// computed for another mask layout or size, reads as BLOCK_MIXED everywhere (every tile visited,
// every mask element read), so that a wrong buffer costs speed, not the result.

@group(0) @binding(BLOCKS_BINDING) var<storage, read> block_states: array<u32>;

const HAS_MASK_BLOCKS: bool = true;

fn blocks_trusted() -> bool {
    return (block_states[0] == BLOCKS_MAGIC) & (block_states[1] == params.blocks.key);
}

// What the summary says of the blocks covering query rows [m0, m0 + rows) and keys
// [n0, n0 + cols) of sequence `seq` and query head h, within the sequence: BLOCK_HIDDEN if every
// block is hidden, BLOCK_VISIBLE if every one is visible, else BLOCK_MIXED. A tile covers whole
// blocks or parts of them (the answer stays right: it speaks of a superset of the tile).
fn key_tile_blocks(seq: Sequence, h: u32, m0: u32, rows: u32, n0: u32, cols: u32) -> u32 {
    let m_end = min(m0 + rows, seq.seq_q);
    let n_end = min(n0 + cols, seq.seq_kv);
    if ((m_end <= m0) | (n_end <= n0) | !blocks_trusted()) {
        return BLOCK_MIXED;
    }
    let base = BLOCKS_HEADER + seq.b * params.blocks.batch + h * params.blocks.head;
    var hidden = true;
    var visible = true;
    for (var qb = m0 / MASK_BLOCK; qb <= (m_end - 1u) / MASK_BLOCK; qb++) {
        for (var kb = n0 / MASK_BLOCK; kb <= (n_end - 1u) / MASK_BLOCK; kb++) {
            let state = block_states[base + qb * params.blocks.row + kb];
            hidden = hidden & (state == BLOCK_HIDDEN);
            visible = visible & (state == BLOCK_VISIBLE);
        }
    }
    if (hidden) {
        return BLOCK_HIDDEN;
    }
    return select(BLOCK_MIXED, BLOCK_VISIBLE, visible);
}

// The first key tile t' ≥ t, before `end`, of `cols` keys each, that the summary does not show
// hidden whole for query rows [m0, m0 + rows): the forward and the dQ kernel step from one to the
// next, so the tiles between are never loaded.
fn next_key_tile(seq: Sequence, h: u32, m0: u32, rows: u32, t: u32, end: u32, cols: u32) -> u32 {
    var next = t;
    loop {
        if (next >= end) {
            break;
        }
        if (key_tile_blocks(seq, h, m0, rows, next * cols, cols) != BLOCK_HIDDEN) {
            break;
        }
        next++;
    }
    return next;
}
