//! What of a mask a tiled forward or gradient kernel binds (shaders/mask_*.wgsl): the mask
//! tensor, and its block summary. Compiled into the kernel (a binding cannot be switched at run
//! time), so it is part of every configuration that makes a pipeline; the mask's strides and the
//! summary's key are run-time values (`Params::mask`, `Params::blocks`).

use crate::problem::AttentionProblem;

/// Which mask tensors a kernel binds: none for a problem without a mask or summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MaskBinding {
    /// The mask's bytes (shaders/mask_bound.wgsl).
    pub tensor: bool,
    /// The block summary (shaders/mask_blocks_bound.wgsl).
    pub blocks: bool,
}

impl MaskBinding {
    /// What `problem` needs.
    pub fn of(problem: &AttentionProblem) -> Self {
        MaskBinding {
            tensor: problem.mask.is_some(),
            blocks: problem.mask_blocks,
        }
    }

    /// What a pipeline's name gains: `_mask`, `_blocks`, both or nothing.
    pub fn name_suffix(&self) -> String {
        format!(
            "{}{}",
            if self.tensor { "_mask" } else { "" },
            if self.blocks { "_blocks" } else { "" }
        )
    }

    /// The three bindings a kernel may have beside none, for the shader tests.
    pub const BOUND: [MaskBinding; 3] = [
        MaskBinding {
            tensor: true,
            blocks: false,
        },
        MaskBinding {
            tensor: false,
            blocks: true,
        },
        MaskBinding {
            tensor: true,
            blocks: true,
        },
    ];
}
