// reduce_workgroup.wgsl — combines per-invocation partial row values (the running max of the scores,
// the sum of the probabilities) across the THREADS_X invocations that share a row, through
// workgroup memory. Works on every adapter.

var<workgroup> row_partials: array<f32, BLOCK_M * THREADS_X>;

// `partial[i]` is this invocation's value for local row `row0 + i`; returns the row totals, the
// same in every invocation of the row. Call from uniform control flow (it holds barriers).
fn reduce_rows(partial: array<f32, ROWS_PER_THREAD>, tx: u32, row0: u32, take_max: bool) -> array<f32, ROWS_PER_THREAD> {
    for (var i = 0u; i < ROWS_PER_THREAD; i++) {
        row_partials[(row0 + i) * THREADS_X + tx] = partial[i];
    }
    workgroupBarrier();
    var total: array<f32, ROWS_PER_THREAD>;
    for (var i = 0u; i < ROWS_PER_THREAD; i++) {
        let base = (row0 + i) * THREADS_X;
        var acc = row_partials[base];
        for (var t = 1u; t < THREADS_X; t++) {
            let x = row_partials[base + t];
            acc = select(acc + x, max(acc, x), take_max);
        }
        total[i] = acc;
    }
    // The next call overwrites row_partials: everyone must have read it first.
    workgroupBarrier();
    return total;
}
