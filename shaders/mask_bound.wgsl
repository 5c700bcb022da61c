// mask_bound.wgsl — the mask tensor (src/problem/mask.rs) at binding MASK_BINDING, for the kernels
// that implement it (the tiled forward, the dQ and dK/dV kernels, the block summary kernel
// mask_blocks.wgsl). One byte per element, 0 hiding its key and any other value showing it (a
// bool or u8 tensor as PyTorch stores one); the buffer is read as u32 words, so that no shader
// feature is needed and any byte offset works. Element (b, h, i, j) lies at params.mask.offset +
// b·params.mask.batch + h·params.mask.head + i·params.mask.seq + j, in bytes (a stride of 0
// broadcasts), rows and columns counted from each sequence's start as the bias's are.

@group(0) @binding(MASK_BINDING) var<storage, read> mask_words: array<u32>;

const HAS_MASK: bool = true;

fn mask_byte(e: u32) -> u32 {
    return (mask_words[e / 4u] >> (8u * (e % 4u))) & 0xffu;
}

fn mask_row_start(seq: Sequence, h: u32, row: u32) -> u32 {
    return params.mask.offset + seq.b * params.mask.batch + h * params.mask.head + row * params.mask.seq;
}

// Whether the mask hides key `col` from query row `row` of sequence `seq` and head h. Rows past
// the sequence's queries and columns past its keys read nothing (shown): the kernels mask those
// themselves.
fn mask_hides(seq: Sequence, h: u32, row: u32, col: u32) -> bool {
    if ((row >= seq.seq_q) | (col >= seq.seq_kv)) {
        return false;
    }
    return mask_byte(mask_row_start(seq, h, row) + col) == 0u;
}

// Query row `row` against four consecutive key columns (the forward and the dQ kernel): one word
// when the four bytes share it, as they do in a mask with rows of a multiple of 4 bytes.
fn mask_hidden(seq: Sequence, h: u32, row: u32, cols: vec4<u32>) -> vec4<bool> {
    let e = mask_row_start(seq, h, row) + cols.x;
    if ((row < seq.seq_q) & (cols.w < seq.seq_kv) & (e % 4u == 0u)) {
        let bytes = (vec4<u32>(mask_words[e / 4u]) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xffu);
        return bytes == vec4<u32>(0u);
    }
    return vec4<bool>(
        mask_hides(seq, h, row, cols.x),
        mask_hides(seq, h, row, cols.y),
        mask_hides(seq, h, row, cols.z),
        mask_hides(seq, h, row, cols.w),
    );
}

// Four query rows against key column `col` (the dK/dV kernel, whose tiles are transposed).
fn mask_hidden_of_rows(seq: Sequence, h: u32, rows: vec4<u32>, col: u32) -> vec4<bool> {
    return vec4<bool>(
        mask_hides(seq, h, rows.x, col),
        mask_hides(seq, h, rows.y, col),
        mask_hides(seq, h, rows.z, col),
        mask_hides(seq, h, rows.w, col),
    );
}
