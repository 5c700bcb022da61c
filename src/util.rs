//! Small arithmetic shared by the host-side modules.

/// Least common multiple (both arguments non-zero).
pub(crate) fn lcm(a: u64, b: u64) -> u64 {
    fn gcd(a: u64, b: u64) -> u64 {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    a / gcd(a, b) * b
}
