// sequence_dense.wgsl — sequence(b) for a batch of equal sequences: no index tensors bound.
fn sequence(b: u32) -> Sequence {
    return dense_sequence(b);
}
