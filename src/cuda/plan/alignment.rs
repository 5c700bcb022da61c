//! How wide the kernels may load and store, from where the caller's buffers start and the
//! layouts' strides.

use crate::error::{Error, Result};
use crate::problem::{AttentionProblem, Tensor};

/// The widest global access every tensor allows, given the device address of each buffer's
/// element 0 (`[q, k, v, o]`): 16 bytes when each tensor's first element and all its strides
/// are 16-byte aligned, else 8 (which validation guarantees for offsets and strides; a buffer
/// that starts off 8-byte alignment is refused).
pub fn vec_bytes_for(problem: &AttentionProblem, base_addresses: [u64; 4]) -> Result<u32> {
    let elem = problem.dtype.size_bytes() as u64;
    let mut vec = 16;
    for (tensor, base) in [Tensor::Q, Tensor::K, Tensor::V, Tensor::O]
        .into_iter()
        .zip(base_addresses)
    {
        let l = problem.layout(tensor);
        let start = base + l.offset as u64 * elem;
        if !start.is_multiple_of(8) {
            return Err(Error::InvalidBuffer {
                tensor: tensor.name(),
                message: format!("device address {start:#x} of its first element is not 8-byte aligned"),
            });
        }
        let strides = [l.batch_stride, l.seq_stride, l.head_stride];
        if !start.is_multiple_of(16) || strides.iter().any(|&s| !(s as u64 * elem).is_multiple_of(16)) {
            vec = 8;
        }
    }
    Ok(vec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::test_problem as problem;

    #[test]
    fn alignment_picks_the_access_width() {
        let p = problem(64);
        assert_eq!(vec_bytes_for(&p, [0x1000, 0x2000, 0x3000, 0x4000]).unwrap(), 16);
        // A buffer that starts 8 bytes into an allocation.
        assert_eq!(vec_bytes_for(&p, [0x1008, 0x2000, 0x3000, 0x4000]).unwrap(), 8);
        // A seq stride of 4 elements more than dense: rows 8-byte aligned only.
        let mut l = p.k_layout;
        l.seq_stride += 4;
        l.batch_stride = l.seq_stride * p.shape.seq_kv;
        let padded = p.with_tensor_layout(Tensor::K, l);
        padded.validate().unwrap();
        assert_eq!(vec_bytes_for(&padded, [0x1000, 0x2000, 0x3000, 0x4000]).unwrap(), 8);
        let err = vec_bytes_for(&p, [0x1000, 0x2004, 0x3000, 0x4000]).unwrap_err();
        assert!(matches!(err, Error::InvalidBuffer { tensor: "k", .. }), "{err}");
    }
}
