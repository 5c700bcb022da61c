//! The mask tensor and its block summary in WGSL (shaders/mask_*.wgsl): the pieces a tiled
//! forward or gradient kernel includes for a [`MaskBinding`], the summary kernel's module, and the
//! bindings. The summary's constants (block size, header, magic word, states) are generated here
//! from the host's (src/problem/mask.rs), so shader and host cannot disagree on them.

use crate::plan::MaskBinding;
use crate::problem::mask::{BlockState, BLOCKS_HEADER_WORDS, BLOCKS_MAGIC, MASK_BLOCK};
use crate::problem::DType;
use crate::wgsl::{score_bias_source, BACKWARD_BIAS_BINDING, COMMON, FORWARD_BIAS_BINDING};

pub const MASK_BOUND: &str = include_str!("../../shaders/mask_bound.wgsl");
pub const MASK_UNBOUND: &str = include_str!("../../shaders/mask_unbound.wgsl");
pub const MASK_BLOCKS_BOUND: &str = include_str!("../../shaders/mask_blocks_bound.wgsl");
pub const MASK_BLOCKS_UNBOUND: &str = include_str!("../../shaders/mask_blocks_unbound.wgsl");
pub const MASK_BLOCKS: &str = include_str!("../../shaders/mask_blocks.wgsl");

/// The mask tensor and its block summary of the forward and gradient kernels that implement them:
/// after the score bias, whether or not the kernel binds that.
pub const FORWARD_MASK_BINDING: u32 = FORWARD_BIAS_BINDING + 1;
pub const BACKWARD_MASK_BINDING: u32 = BACKWARD_BIAS_BINDING + 1;

/// The summary kernel's summarized tensor (mask or bias), after its params and its output.
pub const SUMMARY_SOURCE_BINDING: u32 = 2;

/// The summary's facts as WGSL `const`s.
fn constants() -> String {
    format!(
        "const MASK_BLOCK: u32 = {MASK_BLOCK}u;\nconst BLOCKS_HEADER: u32 = {BLOCKS_HEADER_WORDS}u;\n\
         const BLOCKS_MAGIC: u32 = {BLOCKS_MAGIC:#x}u;\nconst BLOCK_MIXED: u32 = {}u;\n\
         const BLOCK_HIDDEN: u32 = {}u;\nconst BLOCK_VISIBLE: u32 = {}u;\n",
        BlockState::Mixed as u32,
        BlockState::Hidden as u32,
        BlockState::Visible as u32
    )
}

/// The mask pieces of a kernel that binds `binding`: the mask tensor at `first` and the summary at
/// `first + 1` where bound (mask_bound.wgsl, mask_blocks_bound.wgsl), the unbound pieces, whose
/// functions fold to constants, elsewhere.
pub(crate) fn mask_source(binding: MaskBinding, first: u32) -> String {
    let mut src = constants();
    if binding.tensor {
        src.push_str(&format!("const MASK_BINDING: u32 = {first}u;\n{MASK_BOUND}"));
    } else {
        src.push_str(MASK_UNBOUND);
    }
    if binding.blocks {
        src.push_str(&format!(
            "const BLOCKS_BINDING: u32 = {}u;\n{MASK_BLOCKS_BOUND}",
            first + 1
        ));
    } else {
        src.push_str(MASK_BLOCKS_UNBOUND);
    }
    src
}

/// The summary kernel's module (mask_blocks.wgsl): summarizing the mask, or with `bias` the −∞
/// entries of a score bias of that type, bound at [`SUMMARY_SOURCE_BINDING`].
pub(crate) fn summary_source(bias: Option<DType>) -> String {
    let mut src = constants();
    let hides = match bias {
        None => {
            src.push_str(&format!(
                "const MASK_BINDING: u32 = {SUMMARY_SOURCE_BINDING}u;\n{MASK_BOUND}"
            ));
            src.push_str(&score_bias_source(None, 0));
            "mask_hides(seq, h, row, col)"
        }
        Some(dtype) => {
            src.push_str(MASK_UNBOUND);
            src.push_str(&score_bias_source(Some(dtype), SUMMARY_SOURCE_BINDING));
            "bias_element(seq, h, row, col).hidden"
        }
    };
    src.push_str(&format!(
        "\n// Whether the summarized tensor hides key `col` from query row `row`.\n\
         fn source_hides(seq: Sequence, h: u32, row: u32, col: u32) -> bool {{\n    return {hides};\n}}\n"
    ));
    src.push_str(COMMON);
    src.push_str(MASK_BLOCKS);
    src
}

/// The summary kernel's name, pipeline label and cache key: `mask_blocks_mask` or
/// `mask_blocks_bias_{dtype}`.
pub(crate) fn summary_name(bias: Option<DType>) -> String {
    match bias {
        None => "mask_blocks_mask".into(),
        Some(t) => format!("mask_blocks_bias_{}", t.name()),
    }
}
