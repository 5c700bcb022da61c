//! How a kernel with dropout multiplies inside its generator.

use crate::caps::Caps;

/// How a kernel's Philox generator (shaders/dropout.wgsl) forms the high 32 bits of its
/// 32 × 32-bit products, two a round, seven rounds a draw: compiled in with dropout. Both give the
/// same bits; the wide product is the cheaper where the device has 64-bit integers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PhiloxMultiply {
    /// From 16-bit halves in 32-bit arithmetic (five multiplies and some shifts): every device.
    Halves,
    /// One 64-bit product (WGSL's `u64`, wgpu's `SHADER_INT64`).
    Wide,
}

impl PhiloxMultiply {
    /// The wide product where the device has 64-bit integers, else the halves.
    pub fn for_device(caps: &Caps) -> Self {
        if caps.shader_int64 {
            PhiloxMultiply::Wide
        } else {
            PhiloxMultiply::Halves
        }
    }

    /// The name suffix of a kernel with dropout: `_dropout`, `_dropout64`.
    pub fn name_suffix(self) -> &'static str {
        match self {
            PhiloxMultiply::Halves => "_dropout",
            PhiloxMultiply::Wide => "_dropout64",
        }
    }

    /// Device features the form needs.
    pub fn required_features(self) -> wgpu::Features {
        match self {
            PhiloxMultiply::Halves => wgpu::Features::empty(),
            PhiloxMultiply::Wide => wgpu::Features::SHADER_INT64,
        }
    }

    /// Why the form cannot run on `caps`, if it cannot.
    pub fn unavailable_reason(self, caps: &Caps) -> Option<String> {
        (self == PhiloxMultiply::Wide && !caps.shader_int64)
            .then(|| "dropout's wide products need 64-bit integers (SHADER_INT64), which the device lacks".to_string())
    }
}

/// The name suffix of a kernel's dropout (none without).
pub(crate) fn dropout_suffix(dropout: Option<PhiloxMultiply>) -> &'static str {
    dropout.map_or("", PhiloxMultiply::name_suffix)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caps::fixtures;

    #[test]
    fn the_wide_product_is_chosen_where_the_device_has_64_bit_integers() {
        let with = Caps {
            shader_int64: true,
            ..fixtures::lavapipe()
        };
        let without = Caps {
            shader_int64: false,
            ..fixtures::lavapipe()
        };
        assert_eq!(PhiloxMultiply::for_device(&with), PhiloxMultiply::Wide);
        assert_eq!(PhiloxMultiply::for_device(&without), PhiloxMultiply::Halves);
        assert!(PhiloxMultiply::Wide.unavailable_reason(&without).is_some());
        assert!(PhiloxMultiply::Wide.unavailable_reason(&with).is_none());
        assert!(PhiloxMultiply::Halves.unavailable_reason(&without).is_none());
        assert_eq!(dropout_suffix(Some(PhiloxMultiply::Wide)), "_dropout64");
        assert_eq!(dropout_suffix(None), "");
    }
}
