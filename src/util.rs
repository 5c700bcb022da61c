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
