//! What a caller may force of forward selection: which kernel, and that kernel's knobs.

use crate::error::{Error, Result};
use crate::plan::coop::CoopChoice;
use crate::plan::decode::DecodeChoice;
use crate::plan::tiled::{TiledChoice, Variant};

/// What the caller asks of forward selection: which kernel, and that kernel's knobs. Each kernel's
/// knobs live in its own variant, so a request cannot name both kernels. `Default` is
/// [`KernelChoice::Auto`].
///
/// Forcing the register-tiled kernel with subgroup shuffles and one tile plan, and giving the
/// choice to an engine:
///
/// ```rust
/// use wgpu_flash_attn::kernel::{TilePlan, TiledChoice, Variant};
/// use wgpu_flash_attn::{KernelChoice, Options};
///
/// let sg = KernelChoice::variant(Variant::SUBGROUP); // any plan that fits the device
/// assert_eq!(sg.tiled().variant, Some(Variant::SUBGROUP));
///
/// let exact = KernelChoice::Tiled(TiledChoice {
///     variant: Some(Variant::WORKGROUP),
///     plan: Some(TilePlan::new(64, 64, 8, 16, 16, 16, 1)), // 64 × 64 tile, 8 × 16 invocations
/// });
/// let options = Options { choice: exact, ..Options::default() };
/// // FlashAttention::with_options(&ctx, options) then runs exactly this kernel, or returns
/// // Error::Unavailable saying why the device cannot.
/// # let _ = options;
/// ```
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
    /// The decode kernel (split-KV flash-decoding with the query heads of a K/V head packed
    /// together), with any of its knobs fixed — the number of pieces of the keys, say. Runs any
    /// problem it implements the features of, however many query rows; automatic selection
    /// takes it for a few new tokens against a cache.
    Decode(DecodeChoice),
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
    ///
    /// ```rust
    /// use wgpu_flash_attn::kernel::{CoopChoice, TilePlan, TiledChoice, Variant};
    /// use wgpu_flash_attn::{Error, KernelChoice};
    /// # fn main() -> wgpu_flash_attn::Result<()> {
    /// let tiled = TiledChoice {
    ///     variant: Variant::from_name("sg_f32"),
    ///     plan: TilePlan::parse("64x64x8x16x16x16"),
    /// };
    /// let coop = CoopChoice { tile: Some((128, 64)), ..CoopChoice::default() };
    ///
    /// // No knobs: automatic. Knobs of one kernel name that kernel.
    /// let none = (TiledChoice::default(), CoopChoice::default());
    /// assert_eq!(KernelChoice::from_knobs(None, none.0, none.1)?, KernelChoice::Auto);
    /// assert_eq!(KernelChoice::from_knobs(None, tiled, CoopChoice::default())?, KernelChoice::Tiled(tiled));
    /// assert_eq!(
    ///     KernelChoice::from_knobs(Some(true), TiledChoice::default(), coop)?,
    ///     KernelChoice::CooperativeMatrix(coop)
    /// );
    ///
    /// // The tiled kernel named with a matrix-kernel knob, or knobs of both: refused, not resolved.
    /// let err = KernelChoice::from_knobs(Some(false), TiledChoice::default(), coop).unwrap_err();
    /// assert!(matches!(err, Error::InvalidChoice(_)), "{err}");
    /// assert!(matches!(KernelChoice::from_knobs(None, tiled, coop), Err(Error::InvalidChoice(_))));
    /// # Ok(()) }
    /// ```
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

/// Whether wgpu adds bounds checks to the kernels' memory accesses.
///
/// Off by default: wgpu's checks make the flash kernel about 10× slower (on an H200:
/// docs/perf-history.md, "Bounds checks on vs off"), because they clamp every index into the
/// per-invocation register arrays as well as into storage, which keeps the driver from holding
/// those arrays in registers.
/// Dropping them is sound here because the host checks, before every dispatch, that each
/// tensor's whole extent lies inside its binding, and the kernels guard every row and column they
/// touch and index workgroup and register arrays with compile-time bounds.
///
/// A setting of selection, not only of the pipeline cache: the cooperative-matrix kernel's SPIR-V
/// is built by this library and passed through to the driver, so wgpu cannot add checks to it.
/// With `On`, automatic selection skips that kernel and forcing it is an `Error::Unavailable`
/// (`select_forward`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum BoundsChecks {
    /// wgpu's default checks: every index is clamped at run time.
    On,
    /// Modules created with `create_shader_module_trusted` and no runtime checks. Browsers
    /// always check, whatever is asked here.
    #[default]
    Off,
}
