//! The per-dispatch uniform block, mirrored byte for byte from `shaders/common.wgsl`.

use bytemuck::{Pod, Zeroable};

use crate::problem::{AttentionProblem, TensorLayout, ELEMENT_ALIGNMENT};

/// `TensorStrides` in common.wgsl: offset and strides in granules (4 elements), relative to the
/// start of the tensor's binding.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct TensorStrides {
    pub offset: u32,
    pub batch: u32,
    pub seq: u32,
    pub head: u32,
}

impl TensorStrides {
    /// `offset_in_binding_elems`: where element (0, 0, 0, 0) lies from the start of the binding.
    /// Validation has checked that every value is a multiple of 4 and fits in u32 granules.
    pub fn new(layout: &TensorLayout, offset_in_binding_elems: usize) -> Self {
        let g = |x: usize| (x / ELEMENT_ALIGNMENT) as u32;
        TensorStrides {
            offset: g(offset_in_binding_elems),
            batch: g(layout.batch_stride),
            seq: g(layout.seq_stride),
            head: g(layout.head_stride),
        }
    }
}

/// `Params` in common.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub struct Params {
    pub q: TensorStrides,
    pub k: TensorStrides,
    pub v: TensorStrides,
    pub o: TensorStrides,
    pub seq_q: u32,
    pub seq_kv: u32,
    pub head_dim: u32,
    pub num_heads: u32,
    pub group_size: u32,
    pub causal: u32,
    pub causal_offset: i32,
    pub scale: f32,
    pub num_q_tiles: u32,
    pub write_lse: u32,
    pub bh_base: u32,
    /// Kernel-specific bits (none used at present; kept so that the layout stays stable).
    pub flags: u32,
}

// WGSL lays the struct out as four 16-byte members then twelve 4-byte scalars.
const _: () = assert!(std::mem::size_of::<Params>() == 4 * 16 + 12 * 4);

impl Params {
    /// The fields that depend only on the problem; strides and per-dispatch fields are filled in
    /// by the caller. `scale` is the softmax scale as the kernel wants it.
    pub fn for_problem(problem: &AttentionProblem, scale: f32) -> Self {
        let s = problem.shape;
        Params {
            seq_q: s.seq_q as u32,
            seq_kv: s.seq_kv as u32,
            head_dim: s.head_dim as u32,
            num_heads: s.num_heads as u32,
            group_size: problem.group_size() as u32,
            causal: problem.causal as u32,
            causal_offset: problem.causal_offset() as i32,
            scale,
            ..Params::default()
        }
    }

    /// The flash kernels' parameters (forward and backward): the scale in base 2, the bound
    /// strides of q, k, v, o and the grid's query tiles.
    pub fn for_flash(
        problem: &AttentionProblem,
        [q, k, v, o]: [TensorStrides; 4],
        num_q_tiles: u32,
        write_lse: bool,
    ) -> Self {
        let mut params = Params::for_problem(problem, problem.softmax_scale_log2());
        (params.q, params.k, params.v, params.o) = (q, k, v, o);
        params.num_q_tiles = num_q_tiles;
        params.write_lse = write_lse as u32;
        params
    }
}

/// `GradParams` in flash_bwd_common.wgsl: the layouts of the backward's extra tensors and the
/// natural softmax scale (binding 1 of the backward kernels, beside `Params` at binding 0).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub(crate) struct GradParams {
    pub d_o: TensorStrides,
    pub dq: TensorStrides,
    pub dk: TensorStrides,
    pub dv: TensorStrides,
    pub scale: f32,
    pub _pad: [u32; 3],
}

// Four 16-byte members, then a scalar padded to the struct's 16-byte alignment.
const _: () = assert!(std::mem::size_of::<GradParams>() == 4 * 16 + 16);
