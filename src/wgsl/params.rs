//! The per-dispatch uniform block, mirrored byte for byte from `shaders/common.wgsl`.

use bytemuck::{Pod, Zeroable};

use crate::problem::mask::MaskBlocks;
use crate::problem::{Alibi, AttentionProblem, TensorLayout, ELEMENT_ALIGNMENT};

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
    /// The decode kernel's pieces of the keys per K/V head (`DecodeSplit::splits`).
    pub num_splits: u32,
    /// Keys per piece (`DecodeSplit::keys_per_split`).
    pub keys_per_split: u32,
    /// A paged cache's tokens per page, page-table columns and pool size (`PagedKv`).
    pub page_size: u32,
    pub pages_per_seq: u32,
    pub num_pages: u32,
    /// Rows of a packed batch's Q/O and K/V (`Varlen`); 0 otherwise.
    pub total_q: u32,
    pub total_kv: u32,
    /// A sliding window's sides, `u32::MAX` for unbounded (`AttentionProblem::window`).
    pub window_left: u32,
    pub window_right: u32,
    /// The soft-cap in base 2, `cap · log2 e` (`AttentionProblem::softcap`).
    pub softcap: f32,
    /// ALiBi's slopes (`AttentionProblem::alibi`): [`ALIBI_NONE`], [`ALIBI_GEOMETRIC`] or
    /// [`ALIBI_PER_HEAD`] (read from the `alibi_slopes` tensor).
    pub alibi: u32,
    /// 1 when the sinks tensor joins every row's denominator (`AttentionProblem::sinks`).
    pub sinks: u32,
    /// The batch size, for kernels that loop over it (flash_bwd_sinks.wgsl).
    pub batch: u32,
    /// Where the score bias's elements lie (`AttentionProblem::bias`), in elements rather than
    /// granules: `seq` is the row stride.
    pub bias: TensorStrides,
    /// Dropout (`AttentionProblem::dropout`, shaders/dropout.wgsl): the generator's key
    /// (`Dropout::key`), the 16-bit threshold below which a draw drops its element, and the kept
    /// values' factor `1/(1 − p)`. Zero without dropout.
    pub dropout_key0: u32,
    pub dropout_key1: u32,
    pub dropout_threshold: u32,
    pub dropout_scale: f32,
    /// Where the dispatch's problem starts in the caller's (a part of a split problem,
    /// src/runtime/split.rs): its first batch entry, query head and query row, from which
    /// dropout's generator counts. Zero for a whole problem.
    pub part_batch: u32,
    pub part_head: u32,
    pub part_row: u32,
    pub part_pad: u32,
    /// Where the mask's bytes lie (`AttentionProblem::mask`), in bytes: `seq` is the row stride.
    pub mask: TensorStrides,
    /// The mask's block summary (`AttentionProblem::mask_blocks`).
    pub blocks: MaskBlocksParams,
}

/// `MaskBlocksParams` in common.wgsl: the key a block summary's header must carry for the kernels
/// to trust it, and the strides of its states in words (`MaskBlocks::strides`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct MaskBlocksParams {
    pub key: u32,
    pub batch: u32,
    pub head: u32,
    pub row: u32,
}

impl MaskBlocksParams {
    /// The summary of `problem`'s mask (or bias); zeros for a problem with neither.
    pub fn of(problem: &AttentionProblem) -> Self {
        let Ok(blocks) = MaskBlocks::of(problem) else {
            return MaskBlocksParams::default();
        };
        // Validation kept every word below 2^32.
        let (batch, head, row) = blocks.strides();
        MaskBlocksParams {
            key: blocks.key(),
            batch: batch as u32,
            head: head as u32,
            row: row as u32,
        }
    }
}

/// `Params::alibi`: the modes of shaders/head_terms_*.wgsl.
pub const ALIBI_NONE: u32 = 0;
pub const ALIBI_GEOMETRIC: u32 = 1;
pub const ALIBI_PER_HEAD: u32 = 2;

// WGSL lays the struct out as four 16-byte members, twenty-four 4-byte scalars, one 16-byte member,
// eight 4-byte scalars, two 16-byte members.
const _: () = assert!(std::mem::size_of::<Params>() == 4 * 16 + 24 * 4 + 16 + 8 * 4 + 2 * 16);

impl Params {
    /// The fields that depend only on the problem; strides and per-dispatch fields are filled in
    /// by the caller. `scale` is the softmax scale as the kernel wants it.
    pub fn for_problem(problem: &AttentionProblem, scale: f32) -> Self {
        let s = problem.shape;
        let side = |n: Option<usize>| n.map_or(u32::MAX, |n| n.min(u32::MAX as usize - 1) as u32);
        let window = problem.window.unwrap_or_default();
        let dropout = problem.active_dropout();
        let [dropout_key0, dropout_key1] = dropout.map_or([0, 0], |d| d.key());
        Params {
            dropout_key0,
            dropout_key1,
            dropout_threshold: dropout.map_or(0, |d| d.threshold()),
            dropout_scale: dropout.map_or(1.0, |d| d.scale() as f32),
            window_left: side(window.left),
            window_right: side(window.right),
            softcap: problem.softcap.map_or(0.0, |cap| cap * std::f32::consts::LOG2_E),
            alibi: match problem.alibi {
                None => ALIBI_NONE,
                Some(Alibi::Geometric) => ALIBI_GEOMETRIC,
                Some(Alibi::PerHead) => ALIBI_PER_HEAD,
            },
            sinks: problem.sinks as u32,
            batch: s.batch as u32,
            // Validation kept every element below 2^32.
            bias: problem.bias.map_or(TensorStrides::default(), |b| TensorStrides {
                offset: b.layout.offset as u32,
                batch: b.layout.batch_stride as u32,
                seq: b.layout.row_stride as u32,
                head: b.layout.head_stride as u32,
            }),
            mask: problem.mask.map_or(TensorStrides::default(), |m| TensorStrides {
                offset: m.layout.offset as u32,
                batch: m.layout.batch_stride as u32,
                seq: m.layout.row_stride as u32,
                head: m.layout.head_stride as u32,
            }),
            blocks: MaskBlocksParams::of(problem),
            seq_q: s.seq_q as u32,
            seq_kv: s.seq_kv as u32,
            head_dim: s.head_dim as u32,
            num_heads: s.num_heads as u32,
            group_size: problem.group_size() as u32,
            causal: problem.causal as u32,
            causal_offset: problem.causal_offset() as i32,
            scale,
            total_q: problem.varlen.map_or(0, |v| v.total_q as u32),
            total_kv: problem.varlen.map_or(0, |v| v.total_kv as u32),
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
        if problem.varlen.is_some() {
            // Packed tensors have one batch: each sequence's rows start at its offset.
            for t in [&mut params.q, &mut params.k, &mut params.v, &mut params.o] {
                t.batch = 0;
            }
        }
        params.num_q_tiles = num_q_tiles;
        params.write_lse = write_lse as u32;
        params
    }
}

impl Params {
    /// The merge kernel's parameters (shaders/merge.wgsl): the bound strides of o_a, o_b and o in
    /// the q, k and o slots, the problem's seq_q, num_heads and head_dim.
    pub fn for_merge(problem: &AttentionProblem, [o_a, o_b, o]: [TensorStrides; 3], write_lse: bool) -> Self {
        let mut params = Params::for_problem(problem, 1.0);
        (params.q, params.k, params.o) = (o_a, o_b, o);
        params.write_lse = write_lse as u32;
        params
    }

    /// The gradient sums' parameters (shaders/grad_sum.wgsl): the bound strides of the parts and
    /// of the f32 sums in the q and o slots, the problem's seq_q (rows), num_heads and head_dim.
    pub fn for_grad_sum(problem: &AttentionProblem, parts: TensorStrides, sums: TensorStrides) -> Self {
        let mut params = Params::for_problem(problem, 1.0);
        (params.q, params.o) = (parts, sums);
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

#[cfg(test)]
mod tests {
    use std::mem::{offset_of, size_of};

    use super::{GradParams, MaskBlocksParams, Params, TensorStrides};
    use crate::plan::{all_backward_kernels, all_configs};
    use crate::wgsl::KernelConfig;

    /// `(name, byte offset)` of each member of the WGSL struct `name` in `source`, and its size,
    /// as naga lays it out.
    fn wgsl_struct(source: &str, name: &str) -> (Vec<(String, u32)>, u32) {
        let module = naga::front::wgsl::parse_str(source).expect("the kernel parses");
        let ty = module
            .types
            .iter()
            .find(|(_, ty)| ty.name.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("no struct {name}"))
            .1;
        let naga::TypeInner::Struct { members, span } = &ty.inner else {
            panic!("{name} is not a struct")
        };
        let members = members
            .iter()
            .map(|m| (m.name.clone().unwrap_or_default(), m.offset))
            .collect();
        (members, *span)
    }

    fn check(wgsl: (Vec<(String, u32)>, u32), rust: &[(&str, usize)], rust_size: usize) {
        assert_eq!(
            wgsl.1 as usize, rust_size,
            "struct size: WGSL {} bytes, Rust {rust_size}",
            wgsl.1
        );
        for (name, offset) in &wgsl.0 {
            if name.starts_with("_pad") {
                continue;
            }
            let host = rust.iter().find(|(n, _)| n == name).map(|&(_, o)| o);
            assert_eq!(
                host,
                Some(*offset as usize),
                "member {name}: WGSL offset {offset}, Rust {host:?}"
            );
        }
        let named = wgsl.0.iter().filter(|(n, _)| !n.starts_with("_pad")).count();
        assert_eq!(named, rust.len(), "WGSL members {:?} vs Rust {rust:?}", wgsl.0);
    }

    /// The host's `Params` is the shaders' `Params` byte for byte: every member at the offset
    /// naga gives it, and the same size (a mismatch would hand every kernel shifted sizes).
    #[test]
    fn params_match_the_shaders_struct() {
        let source = KernelConfig::Flash(all_configs()[0]).source();
        let rust = [
            ("q", offset_of!(Params, q)),
            ("k", offset_of!(Params, k)),
            ("v", offset_of!(Params, v)),
            ("o", offset_of!(Params, o)),
            ("seq_q", offset_of!(Params, seq_q)),
            ("seq_kv", offset_of!(Params, seq_kv)),
            ("head_dim", offset_of!(Params, head_dim)),
            ("num_heads", offset_of!(Params, num_heads)),
            ("group_size", offset_of!(Params, group_size)),
            ("causal", offset_of!(Params, causal)),
            ("causal_offset", offset_of!(Params, causal_offset)),
            ("scale", offset_of!(Params, scale)),
            ("num_q_tiles", offset_of!(Params, num_q_tiles)),
            ("write_lse", offset_of!(Params, write_lse)),
            ("bh_base", offset_of!(Params, bh_base)),
            ("num_splits", offset_of!(Params, num_splits)),
            ("keys_per_split", offset_of!(Params, keys_per_split)),
            ("page_size", offset_of!(Params, page_size)),
            ("pages_per_seq", offset_of!(Params, pages_per_seq)),
            ("num_pages", offset_of!(Params, num_pages)),
            ("total_q", offset_of!(Params, total_q)),
            ("total_kv", offset_of!(Params, total_kv)),
            ("window_left", offset_of!(Params, window_left)),
            ("window_right", offset_of!(Params, window_right)),
            ("softcap", offset_of!(Params, softcap)),
            ("alibi", offset_of!(Params, alibi)),
            ("sinks", offset_of!(Params, sinks)),
            ("batch", offset_of!(Params, batch)),
            ("bias", offset_of!(Params, bias)),
            ("dropout_key0", offset_of!(Params, dropout_key0)),
            ("dropout_key1", offset_of!(Params, dropout_key1)),
            ("dropout_threshold", offset_of!(Params, dropout_threshold)),
            ("dropout_scale", offset_of!(Params, dropout_scale)),
            ("part_batch", offset_of!(Params, part_batch)),
            ("part_head", offset_of!(Params, part_head)),
            ("part_row", offset_of!(Params, part_row)),
            ("part_pad", offset_of!(Params, part_pad)),
            ("mask", offset_of!(Params, mask)),
            ("blocks", offset_of!(Params, blocks)),
        ];
        check(wgsl_struct(&source, "Params"), &rust, size_of::<Params>());
        let strides = [
            ("offset", offset_of!(TensorStrides, offset)),
            ("batch", offset_of!(TensorStrides, batch)),
            ("seq", offset_of!(TensorStrides, seq)),
            ("head", offset_of!(TensorStrides, head)),
        ];
        check(
            wgsl_struct(&source, "TensorStrides"),
            &strides,
            size_of::<TensorStrides>(),
        );
        let blocks = [
            ("key", offset_of!(MaskBlocksParams, key)),
            ("batch", offset_of!(MaskBlocksParams, batch)),
            ("head", offset_of!(MaskBlocksParams, head)),
            ("row", offset_of!(MaskBlocksParams, row)),
        ];
        check(
            wgsl_struct(&source, "MaskBlocksParams"),
            &blocks,
            size_of::<MaskBlocksParams>(),
        );
    }

    #[test]
    fn grad_params_match_the_shaders_struct() {
        let kernel = all_backward_kernels()
            .into_iter()
            .find(|k| matches!(k, crate::plan::BackwardKernel::Grad(_)))
            .expect("a gradient kernel");
        let source = KernelConfig::Backward(kernel).source();
        let rust = [
            ("d_o", offset_of!(GradParams, d_o)),
            ("dq", offset_of!(GradParams, dq)),
            ("dk", offset_of!(GradParams, dk)),
            ("dv", offset_of!(GradParams, dv)),
            ("scale", offset_of!(GradParams, scale)),
        ];
        check(wgsl_struct(&source, "GradParams"), &rust, size_of::<GradParams>());
    }
}
