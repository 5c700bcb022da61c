//! Small arithmetic shared by the host-side modules.

/// Least common multiple (both arguments non-zero), saturating at `u64::MAX`.
pub(crate) fn lcm(a: u64, b: u64) -> u64 {
    fn gcd(a: u64, b: u64) -> u64 {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    (a / gcd(a, b)).saturating_mul(b)
}

/// `x` as a `u32`, or `u32::MAX` if it does not fit: sizes of forced tile plans are computed in
/// 64 bits and saturate, so that a plan too large for any device is refused, not wrapped.
pub(crate) fn sat_u32(x: u64) -> u32 {
    u32::try_from(x).unwrap_or(u32::MAX)
}

/// A host output of `len` elements, each `zero`, for tensor `name`, or [`crate::error::Error::TooLarge`] where
/// the host cannot allocate it: a layout's strides, not its data, set a split call's output size
/// (a sparse O can span gigabytes), and a failed allocation aborts the process, which no caller
/// can handle (found by tests/campaign.rs: a 51 GB O aborted a run).
pub(crate) fn host_output<T: Clone>(name: &'static str, len: usize, zero: T) -> crate::error::Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| {
        crate::error::Error::TooLarge(format!(
            "tensor `{name}`: {len} elements of output do not fit in the host's memory"
        ))
    })?;
    v.resize(len, zero);
    Ok(v)
}
