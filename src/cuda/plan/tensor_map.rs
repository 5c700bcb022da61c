//! Tensor maps for Hopper's bulk tensor copies (TMA, `cp.async.bulk.tensor`): the parameters of
//! `cuTensorMapEncodeTiled` for one attention tensor, derived from the problem's layout and
//! checked against the hardware's rules. Pure, so the wgmma kernel's selection can ask whether a
//! layout has tensor maps without a GPU; [`tma::encode`](crate::cuda::tma) makes the driver call.

use crate::error::{Error, Result};
use crate::problem::{AttentionProblem, DType, Tensor};

/// Elements of a 16-bit type in one 128-byte swizzle span: the widest box row a 128-byte
/// swizzled map may have, and the K-major atom width wgmma reads with 128-byte swizzling. A
/// head_dim-128 tile is therefore two boxes side by side, head_dim 256 four.
pub const SWIZZLE_SPAN_ELEMS: u32 = 64;
/// The hardware's limit on every box dimension.
const MAX_BOX_DIM: u32 = 256;
/// Global strides must be multiples of 16 bytes and below 2^40.
pub(crate) const STRIDE_ALIGN: u64 = 16;
const MAX_STRIDE: u64 = 1 << 40;

/// What a map's elements are to the copy engine: the 16-bit types, or bytes (FP8's e4m3, which
/// the copy engine only moves).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapElement {
    BF16,
    F16,
    Byte,
}

impl MapElement {
    /// Bytes per element.
    pub fn size_bytes(self) -> u32 {
        match self {
            MapElement::Byte => 1,
            _ => 2,
        }
    }
}

/// The arguments of `cuTensorMapEncodeTiled` for one tensor, dimensions innermost first:
/// `(head_dim, seq, heads, batch)` (FP8's transposed V: `(keys, head_dim, heads, batch)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorMapSpec {
    pub element: MapElement,
    /// Elements per dimension.
    pub global_dim: [u64; 4],
    /// Bytes between consecutive indices of dimensions 1..4 (dimension 0 is contiguous).
    pub global_strides: [u64; 3],
    /// One copy moves a `[64 columns, rows, 1 head, 1 batch]` box.
    pub box_dim: [u32; 4],
    /// Byte offset of element (0, 0, 0, 0) from the buffer's start (the layout's offset).
    pub offset_bytes: u64,
}

impl TensorMapSpec {
    /// Boxes side by side that cover one head_dim-wide row tile.
    pub fn boxes_per_row_tile(&self) -> u32 {
        (self.global_dim[0] as u32).div_ceil(self.box_dim[0])
    }

    /// Bytes one box fills in shared memory (what the mbarrier's transaction count adds up).
    pub fn box_bytes(&self) -> u32 {
        self.box_dim.iter().product::<u32>() * self.element.size_bytes()
    }
}

/// The copy engine's element for a 16-bit type; `None` for f32.
fn map_element(dtype: DType) -> Option<MapElement> {
    match dtype {
        DType::BF16 => Some(MapElement::BF16),
        DType::F16 => Some(MapElement::F16),
        DType::F32 => None,
    }
}

/// Refuses a box of `rows` rows the hardware cannot copy.
fn check_box_rows(rows: u32) -> Result<()> {
    if rows == 0 || rows > MAX_BOX_DIM {
        return crate::error::invalid!("a TMA box has 1 to {MAX_BOX_DIM} rows, not {rows}");
    }
    Ok(())
}

/// The map's stride for dimension `name` of `extent` indices `bytes` apart: that stride where the
/// copy engine takes it (a non-zero multiple of 16 below 2^40), any legal one for a dimension of
/// extent 1 (never stepped along), else why not.
fn map_stride(name: &str, bytes: u64, extent: usize) -> std::result::Result<u64, String> {
    if bytes != 0 && bytes.is_multiple_of(STRIDE_ALIGN) && bytes < MAX_STRIDE {
        Ok(bytes)
    } else if extent <= 1 {
        Ok(STRIDE_ALIGN)
    } else {
        Err(format!(
            "its {name} stride is {bytes} bytes; the copy engine needs a non-zero multiple of 16 below 2^40"
        ))
    }
}

fn unavailable(tensor: Tensor, why: String) -> Error {
    Error::Unavailable {
        what: format!("TMA loads of tensor `{}`", tensor.name()),
        why,
    }
}

/// The tensor map of `tensor` for tiles of `rows` sequence rows, or why this layout cannot be
/// described to the copy engine (then the kernel must load with `cp.async`).
pub fn tensor_map_spec(problem: &AttentionProblem, tensor: Tensor, rows: u32) -> Result<TensorMapSpec> {
    problem.validate()?;
    let dtype = problem.dtype;
    let Some(element) = map_element(dtype) else {
        return Err(unavailable(tensor, "the TMA kernels take bf16 or f16".into()));
    };
    check_box_rows(rows)?;
    // A head_dim that is not whole swizzle spans is loaded in whole boxes all the same: the
    // copy engine fills the columns past it with zeros (the kernel's tiles are padded).
    let head_dim = problem.shape.head_dim as u32;
    if head_dim == 0 || !head_dim.is_multiple_of(8) || head_dim > MAX_BOX_DIM {
        return Err(unavailable(
            tensor,
            format!("head_dim {head_dim}: rows of whole 16-byte chunks, at most {MAX_BOX_DIM}"),
        ));
    }
    let (batch, seq, heads) = problem.stored_extent(tensor);
    let l = problem.layout(tensor);
    // Saturating: a dimension of extent 1 may carry any stride (validation never steps it), up to
    // usize::MAX elements.
    let elem = dtype.size_bytes() as u64;
    let bytes = |elements: usize| (elements as u64).saturating_mul(elem);
    let stride =
        |name, elements, extent| map_stride(name, bytes(elements), extent).map_err(|why| unavailable(tensor, why));
    let global_strides = [
        stride("seq", l.seq_stride, seq)?,
        stride("head", l.head_stride, heads)?,
        stride("batch", l.batch_stride, batch)?,
    ];
    Ok(TensorMapSpec {
        element,
        global_dim: [head_dim as u64, seq as u64, heads as u64, batch as u64],
        global_strides,
        box_dim: [SWIZZLE_SPAN_ELEMS, rows, 1, 1],
        offset_bytes: bytes(l.offset),
    })
}

/// The tensor map of `problem`'s 16-bit score bias for tiles of `rows` query rows and 64 keys,
/// dimensions innermost first `(keys, query rows, heads, batch)` (a broadcast dimension, stride 0,
/// has extent 1: the kernel reads its index 0), or why the copy engine cannot load it (no bias,
/// an f32 bias, strides that are not multiples of 16 bytes: then the kernel reads the bias from
/// global memory itself).
pub fn bias_map_spec(problem: &AttentionProblem, rows: u32) -> Result<TensorMapSpec> {
    let unavailable = |why: String| Error::Unavailable {
        what: "TMA loads of the score bias".into(),
        why,
    };
    let Some(bias) = problem.bias else {
        return Err(unavailable("the problem has no bias".into()));
    };
    let Some(element) = map_element(bias.dtype) else {
        return Err(unavailable("it is f32; the staged tiles are 16-bit".into()));
    };
    check_box_rows(rows)?;
    let s = problem.shape;
    let l = bias.layout;
    let extent = |stride: usize, n: usize| if stride == 0 { 1 } else { n };
    let dims = [
        s.seq_kv,
        s.seq_q,
        extent(l.head_stride, s.num_heads),
        extent(l.batch_stride, s.batch),
    ];
    if dims.contains(&0) {
        return Err(unavailable("the problem is empty".into()));
    }
    let bytes = |elements: usize| (elements as u64).saturating_mul(2);
    let stride = |name, elements, extent| map_stride(name, bytes(elements), extent).map_err(unavailable);
    let global_strides = [
        stride("row", l.row_stride, dims[1])?,
        stride("head", l.head_stride, dims[2])?,
        stride("batch", l.batch_stride, dims[3])?,
    ];
    Ok(TensorMapSpec {
        element,
        global_dim: dims.map(|d| d as u64),
        global_strides,
        box_dim: [SWIZZLE_SPAN_ELEMS, rows, 1, 1],
        offset_bytes: bytes(l.offset),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::Layout;

    use crate::cuda::test_problem as problem;

    #[test]
    fn contiguous_layouts_map_to_four_dimensions() {
        let p = problem(128);
        let q = tensor_map_spec(&p, Tensor::Q, 128).unwrap();
        assert_eq!(q.global_dim, [128, 1000, 8, 2]);
        assert_eq!(q.global_strides, [8 * 128 * 2, 128 * 2, 1000 * 8 * 128 * 2]);
        assert_eq!(q.box_dim, [64, 128, 1, 1]);
        assert_eq!(q.boxes_per_row_tile(), 2);
        assert_eq!(q.box_bytes(), 64 * 128 * 2);
        // K and V have seq_kv rows of num_kv_heads heads.
        let k = tensor_map_spec(&p, Tensor::K, 64).unwrap();
        assert_eq!(k.global_dim, [128, 777, 2, 2]);
        assert_eq!(k.global_strides[0], 2 * 128 * 2);
        // [batch, heads, seq, dim]: the seq stride is one row.
        let b = tensor_map_spec(&p.with_layout(Layout::Bhsd), Tensor::V, 64).unwrap();
        assert_eq!(b.global_strides, [128 * 2, 777 * 128 * 2, 2 * 777 * 128 * 2]);
        assert_eq!(
            tensor_map_spec(&problem(256), Tensor::O, 64)
                .unwrap()
                .boxes_per_row_tile(),
            4
        );
    }

    #[test]
    fn a_16_bit_bias_maps_keys_rows_and_its_unbroadcast_dimensions() {
        use crate::problem::score_bias::{BiasLayout, ScoreBias};
        let p = problem(128); // batch 2, 8 heads, seq 1000 x 777
        let with = |dtype, layout| p.with_bias(ScoreBias { dtype, layout });
        // Per head, shared by the batch (rows padded to 784 keys): heads are the third
        // dimension, the batch extent 1.
        let heads = BiasLayout {
            offset: 0,
            row_stride: 784,
            head_stride: 784 * 1000,
            batch_stride: 0,
        };
        let s = bias_map_spec(&with(DType::F16, heads), 128).unwrap();
        assert_eq!(s.global_dim, [777, 1000, 8, 1]);
        assert_eq!(s.global_strides, [784 * 2, 1000 * 784 * 2, STRIDE_ALIGN]);
        assert_eq!(
            (s.box_dim, s.element, s.offset_bytes),
            ([64, 128, 1, 1], MapElement::F16, 0)
        );
        // Rows padded to 784 keys, per batch entry and head, at an offset.
        let padded = BiasLayout {
            offset: 8,
            row_stride: 784,
            head_stride: 784 * 1000,
            batch_stride: 784 * 1000 * 8,
        };
        let s = bias_map_spec(&with(DType::BF16, padded), 192).unwrap();
        assert_eq!(s.global_dim, [777, 1000, 8, 2]);
        assert_eq!(s.global_strides, [784 * 2, 784 * 1000 * 2, 784 * 1000 * 8 * 2]);
        assert_eq!((s.element, s.offset_bytes), (MapElement::BF16, 16));
        // Broadcast over heads and batch (strides 0): extent 1 for both. With one query row the
        // row stride is never stepped: any will do (777 keys of 2 bytes).
        let shared = BiasLayout {
            head_stride: 0,
            batch_stride: 0,
            ..heads
        };
        let s = bias_map_spec(&with(DType::F16, shared), 128).unwrap();
        assert_eq!(
            (s.global_dim, s.global_strides),
            ([777, 1000, 1, 1], [784 * 2, STRIDE_ALIGN, STRIDE_ALIGN])
        );
        let mut one_row = p;
        one_row.shape.seq_q = 1;
        let layout = BiasLayout {
            row_stride: 777,
            head_stride: 7776,
            batch_stride: 0,
            offset: 0,
        };
        let s = bias_map_spec(
            &one_row.with_bias(ScoreBias {
                dtype: DType::F16,
                layout,
            }),
            128,
        )
        .unwrap();
        assert_eq!((s.global_dim, s.global_strides[0]), ([777, 1, 8, 1], STRIDE_ALIGN));
        // Dense rows of 777 keys are 1,554 bytes apart: not a multiple of 16.
        let err = bias_map_spec(&with(DType::F16, BiasLayout::dense(&p, true, true)), 128).unwrap_err();
        assert!(
            matches!(err, Error::Unavailable { .. }) && err.to_string().contains("row stride"),
            "{err}"
        );
        // f32 biases, problems without one, and boxes past the hardware's limit.
        assert!(bias_map_spec(&with(DType::F32, padded), 128).is_err());
        assert!(bias_map_spec(&p, 128).is_err());
        assert!(matches!(
            bias_map_spec(&with(DType::F16, padded), 257),
            Err(Error::InvalidProblem(_))
        ));
    }

    #[test]
    fn layouts_the_copy_engine_cannot_describe_are_refused() {
        let p = problem(128);
        // Rows padded by 4 elements: 8-byte aligned strides.
        let mut l = p.k_layout;
        l.seq_stride += 4;
        l.batch_stride = l.seq_stride * 777;
        let err = tensor_map_spec(&p.with_tensor_layout(Tensor::K, l), Tensor::K, 64).unwrap_err();
        assert!(
            matches!(err, Error::Unavailable { .. }) && err.to_string().contains("seq stride"),
            "{err}"
        );
        // Broadcast over the batch (stride 0).
        let mut l = p.v_layout;
        l.batch_stride = 0;
        let err = tensor_map_spec(&p.with_tensor_layout(Tensor::V, l), Tensor::V, 64).unwrap_err();
        assert!(err.to_string().contains("batch stride"), "{err}");
        // ... unless that dimension has extent 1.
        let mut one = problem(128);
        one.shape.batch = 1;
        let one = one.with_layout(Layout::Bshd);
        let mut l = one.v_layout;
        l.batch_stride = 0;
        let s = tensor_map_spec(&one.with_tensor_layout(Tensor::V, l), Tensor::V, 64).unwrap();
        assert_eq!(s.global_strides[2], 16);
        // ... and any stride at all there: the bad-input campaign's seed 6930 (a batch stride of
        // 2^64 - 4 elements) overflowed the byte count.
        l.batch_stride = usize::MAX - 3;
        let s = tensor_map_spec(&one.with_tensor_layout(Tensor::V, l), Tensor::V, 64).unwrap();
        assert_eq!(s.global_strides[2], 16);
        // A head_dim that is not whole swizzle spans is read in whole boxes past its end (the
        // copy engine fills zeros there); f32 and the box limits are refused.
        let padded = tensor_map_spec(&problem(96), Tensor::Q, 64).unwrap();
        assert_eq!((padded.global_dim[0], padded.boxes_per_row_tile()), (96, 2));
        let mut f = p;
        f.dtype = DType::F32;
        assert!(tensor_map_spec(&f, Tensor::Q, 64).is_err());
        assert!(matches!(
            tensor_map_spec(&p, Tensor::Q, 257),
            Err(Error::InvalidProblem(_))
        ));
    }
}
