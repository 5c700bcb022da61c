//! Encoding the tensor maps of Hopper's bulk tensor copies (TMA) with the driver: the host half
//! of the wgmma kernel's loads. The parameters themselves are pure and live in
//! [`plan::tensor_map`](super::plan::tensor_map), tested without a GPU.

use cudarc::driver::sys::{
    self, CUtensorMap, CUtensorMapDataType, CUtensorMapFloatOOBfill, CUtensorMapInterleave, CUtensorMapL2promotion,
    CUtensorMapSwizzle,
};

use super::plan::tensor_map::{MapElement, TensorMapSpec, STRIDE_ALIGN};
use crate::error::{Error, Result};

/// Encodes `spec` for the buffer whose element 0 is at device address `base`: 128-byte swizzle
/// (conflict-free for wgmma's K-major reads), rows past the end of a dimension filled with zeros
/// (so tails need no masking in the copy), 256-byte L2 promotion.
pub fn encode(spec: &TensorMapSpec, base: u64) -> Result<CUtensorMap> {
    let address = base + spec.offset_bytes;
    if !address.is_multiple_of(STRIDE_ALIGN) {
        return Err(Error::InvalidBuffer {
            tensor: "tensor map",
            message: format!("device address {address:#x} is not 16-byte aligned, as TMA requires"),
        });
    }
    if !super::device::driver_available() {
        return Err(Error::Unavailable {
            what: "the CUDA driver (libcuda.so), needed to encode tensor maps".into(),
            why: "the library was not found".into(),
        });
    }
    let data_type = match spec.element {
        MapElement::BF16 => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        MapElement::F16 => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        MapElement::Byte => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
    };
    let element_strides = [1u32; 4];
    let mut map = CUtensorMap { opaque: [0; 16] };
    // SAFETY: every array has the rank's length (4, and 3 strides); `map` is a live out-value;
    // the address is only recorded, not dereferenced, by the encoder.
    unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            data_type,
            4,
            address as *mut std::ffi::c_void,
            spec.global_dim.as_ptr(),
            spec.global_strides.as_ptr(),
            spec.box_dim.as_ptr(),
            element_strides.as_ptr(),
            CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    }
    .result()?;
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::plan::tensor_map::tensor_map_spec;
    use crate::cuda::test_problem as problem;
    use crate::problem::{Tensor, TensorLayout};

    #[test]
    fn offsets_travel_with_the_spec_and_must_keep_16_byte_alignment() {
        let p = problem(64);
        let o = TensorLayout {
            offset: 8,
            ..p.o_layout
        };
        let s = tensor_map_spec(&p.with_tensor_layout(Tensor::O, o), Tensor::O, 64).unwrap();
        assert_eq!(s.offset_bytes, 16);
        let o4 = TensorLayout {
            offset: 4,
            ..p.o_layout
        };
        let s4 = tensor_map_spec(&p.with_tensor_layout(Tensor::O, o4), Tensor::O, 64).unwrap();
        // Checked before any driver call, so this runs without a GPU.
        assert!(matches!(encode(&s4, 0x1000), Err(Error::InvalidBuffer { .. })));
    }
}
