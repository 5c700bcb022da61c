//! What a caller may force of forward selection: which kernel, and that kernel's knobs.

use crate::error::{Error, Result};
use crate::plan::coop::CoopChoice;
use crate::plan::tiled::{TiledChoice, Variant};

/// What the caller asks of forward selection: which kernel, and that kernel's knobs. Each kernel's
/// knobs live in its own variant, so a request cannot name both kernels. `Default` is
/// [`KernelChoice::Auto`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KernelChoice {
    /// The best kernel the device runs for the problem: the cooperative-matrix kernel for f16 data
    /// where the device has tensor cores through wgpu, else the best tiled variant and plan.
    #[default]
    Auto,
    /// The register-tiled kernel (no matrix units), with any of its knobs fixed.
    Tiled(TiledChoice),
    /// The cooperative-matrix (tensor-core) kernel, with any of its knobs fixed; an
    /// [`Error::Unavailable`] naming each reason where the device or the problem cannot run it.
    CooperativeMatrix(CoopChoice),
}

impl KernelChoice {
    /// The tiled kernel with exactly this variant.
    pub fn variant(variant: Variant) -> Self {
        KernelChoice::Tiled(TiledChoice {
            variant: Some(variant),
            plan: None,
        })
    }

    /// The choice that separate knobs describe, as a command line collects them: `kernel` names
    /// a kernel (`Some(true)`: the cooperative-matrix one, `Some(false)`: the tiled one) or
    /// leaves it to the knobs, which name it by being set. Knobs of both kernels, or one kernel's
    /// knobs with the other kernel named, are an [`Error::InvalidChoice`] that says which.
    pub fn from_knobs(cooperative_matrix: Option<bool>, tiled: TiledChoice, coop: CoopChoice) -> Result<Self> {
        let tiled_set = tiled != TiledChoice::default();
        let coop_set = coop != CoopChoice::default();
        let contradiction = match (cooperative_matrix, tiled_set, coop_set) {
            (_, true, true) => Some("knobs of the tiled kernel and of the cooperative-matrix kernel"),
            (Some(true), true, _) => Some("the cooperative-matrix kernel with knobs of the tiled kernel"),
            (Some(false), _, true) => Some("the tiled kernel with knobs of the cooperative-matrix kernel"),
            _ => None,
        };
        if let Some(what) = contradiction {
            return Err(Error::InvalidChoice(format!("{what} ({tiled:?}, {coop:?})")));
        }
        Ok(match (cooperative_matrix, tiled_set, coop_set) {
            (Some(true), ..) | (None, false, true) => KernelChoice::CooperativeMatrix(coop),
            (Some(false), ..) | (None, true, false) => KernelChoice::Tiled(tiled),
            _ => KernelChoice::Auto,
        })
    }

    /// The tiled kernel's knobs as asked (all free unless the tiled kernel was chosen).
    pub fn tiled(&self) -> TiledChoice {
        match self {
            KernelChoice::Tiled(tiled) => *tiled,
            _ => TiledChoice::default(),
        }
    }
}
