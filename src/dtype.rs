//! Element types in memory, and the Rust types that carry them in host slices.

/// Element type of Q, K, V and O in memory. Arithmetic always accumulates in f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// IEEE binary32, 4 bytes; Rust `f32`.
    F32,
    /// IEEE binary16, 2 bytes; [`half::f16`].
    F16,
    /// bfloat16: the upper half of an f32. WGSL has no bf16 type; the kernels read it with a shift.
    BF16,
}

impl DType {
    /// Bytes per element.
    pub const fn size_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }

    /// Short lowercase name used in kernel names and benchmark ids.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
        }
    }

    /// Every element type, in declaration order.
    pub const ALL: [DType; 3] = [DType::F32, DType::F16, DType::BF16];
}

/// A Rust element type that can be passed in host slices: `f32`, [`half::f16`], [`half::bf16`].
pub trait Element: bytemuck::Pod + Send + Sync + 'static {
    /// The [`DType`] a slice of this type holds.
    const DTYPE: DType;
    /// The value as f64 (exact: every f32, f16 and bf16 is an f64).
    fn to_f64(self) -> f64;
    /// Rounds to the nearest representable value.
    fn from_f64(v: f64) -> Self;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> Self {
        v as f32
    }
}

impl Element for half::f16 {
    const DTYPE: DType = DType::F16;
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn from_f64(v: f64) -> Self {
        half::f16::from_f64(v)
    }
}

impl Element for half::bf16 {
    const DTYPE: DType = DType::BF16;
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn from_f64(v: f64) -> Self {
        half::bf16::from_f64(v)
    }
}
