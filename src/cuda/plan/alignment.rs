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
        // Checked: this runs on layouts and addresses as given (a debug build panicked on a
        // huge offset or an address near u64::MAX; found by tests/campaign.rs).
        let Some(start) = (l.offset as u64).checked_mul(elem).and_then(|o| o.checked_add(base)) else {
            return Err(Error::InvalidBuffer {
                tensor: tensor.name(),
                message: format!(
                    "device address {base:#x} plus its offset of {} elements overflows 64 bits",
                    l.offset
                ),
            });
        };
        if !start.is_multiple_of(8) {
            return Err(Error::InvalidBuffer {
                tensor: tensor.name(),
                message: format!("device address {start:#x} of its first element is not 8-byte aligned"),
            });
        }
        let strides = [l.batch_stride, l.seq_stride, l.head_stride];
        // (s · elem) mod 16 from s mod 16: the product itself may overflow.
        if !start.is_multiple_of(16) || strides.iter().any(|&s| !((s as u64 % 16) * elem).is_multiple_of(16)) {
            vec = 8;
        }
    }
    Ok(vec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::test_problem as problem;

    /// Huge strides and offsets, and addresses near u64::MAX, are an error or a width, not an
    /// overflow (a debug build panicked on both).
    #[test]
    fn huge_strides_and_addresses_do_not_overflow() {
        let mut p = problem(64);
        p.q_layout.batch_stride = usize::MAX;
        assert_eq!(vec_bytes_for(&p, [0; 4]).unwrap(), 8);
        p.q_layout.batch_stride = usize::MAX - 15;
        assert_eq!(vec_bytes_for(&p, [0; 4]).unwrap(), 16);
        let mut p = problem(64);
        p.q_layout.offset = 8;
        let e = vec_bytes_for(&p, [u64::MAX - 15, 0, 0, 0]).unwrap_err();
        assert!(matches!(e, Error::InvalidBuffer { tensor: "q", .. }), "{e}");
        let mut p = problem(64);
        p.k_layout.offset = usize::MAX;
        assert!(matches!(
            vec_bytes_for(&p, [0; 4]),
            Err(Error::InvalidBuffer { tensor: "k", .. })
        ));
    }

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
