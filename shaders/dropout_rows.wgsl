// dropout_rows.wgsl — dropout's keep masks (dropout.wgsl draws them) in the shape of the tiled
// kernels, whose invocations own ROWS_PER_THREAD query rows (the forward, the dQ kernel) or keys
// (the dK/dV kernel).

// For a kernel whose invocation owns query rows (forward, dQ): which of the four keys from `col` (a
// multiple of 4) each of its ROWS_PER_THREAD rows from `first_row` (even) keeps; keep[i][j] is
// row first_row + i, key col + j. One generator call per two rows.
fn dropout_keep_rows(b: u32, head: u32, first_row: u32, col: u32) -> array<vec4<bool>, ROWS_PER_THREAD> {
    var keep: array<vec4<bool>, ROWS_PER_THREAD>;
    for (var i = 0u; i < ROWS_PER_THREAD; i += 2u) {
        let block = dropout_block(b, head, first_row + i, col);
        keep[i] = block.first;
        keep[i + 1u] = block.second;
    }
    return keep;
}

// For the dK/dV kernel, whose invocation owns keys and reads four query columns: keep[i][j] is key
// first_key + i (first_key a multiple of 4), query `query` + j (a multiple of 4). Each 4 × 4
// square is the two blocks of query pairs (query, query + 1) and (query + 2, query + 3), read
// transposed: two generator calls per four keys, as many per element as for the rows.
fn dropout_keep_keys(b: u32, head: u32, first_key: u32, query: u32) -> array<vec4<bool>, ROWS_PER_THREAD> {
    var keep: array<vec4<bool>, ROWS_PER_THREAD>;
    for (var i = 0u; i < ROWS_PER_THREAD; i += 4u) {
        let lo = dropout_block(b, head, query, first_key + i);
        let hi = dropout_block(b, head, query + 2u, first_key + i);
        for (var j = 0u; j < 4u; j++) {
            keep[i + j] = vec4<bool>(lo.first[j], lo.second[j], hi.first[j], hi.second[j]);
        }
    }
    return keep;
}
