//! Loop unrolling for WGSL, done on the source text before naga sees it.
//!
//! WGSL has no `#pragma unroll`. The cooperative-matrix kernel keeps its Q, score and output fragments
//! in arrays indexed by loop counters; a run-time index into an array of cooperative matrices
//! forces the driver to unroll the loop itself or to keep the array in addressable (local)
//! memory. Expanding the loops here makes every index a constant in the SPIR-V, whatever the
//! driver's unrolling heuristics, so the fragments can live in registers. The kernel marks
//! those loops, and the host expands them:
//!
//! ```text
//! // @unroll
//! for (var d = 0u; d < D_BLOCKS; d++) { BODY }
//! ```
//!
//! becomes `{ const d = 0u; BODY } { const d = 1u; BODY } …`, D_BLOCKS times, with D_BLOCKS's value
//! given by the host. `d` is then a WGSL constant in each copy, so naga folds every expression of it
//! and constants (indices, shifts of packed bit fields) into a constant in the
//! SPIR-V. The body must not `break` or `continue` (there is no loop left to leave); marked
//! loops may nest.

/// Expands every `// @unroll` loop of `src`; `bounds` gives the value of each bound's name.
pub(crate) fn unroll_loops(src: &str, bounds: &[(&str, u32)]) -> Result<String, String> {
    let mut out = src.to_string();
    // Outer loops first; their copies bring the inner markers along, expanded on later rounds.
    while let Some(marker) = out.find("// @unroll") {
        let after_marker = marker + out[marker..].find('\n').ok_or("`// @unroll` on the last line")? + 1;
        let header_end = after_marker + out[after_marker..].find('{').ok_or("`// @unroll` before no loop")?;
        let header = out[after_marker..header_end].trim();
        let (var, bound) = parse_header(header).ok_or_else(|| {
            format!("`// @unroll` must precede `for (var i = 0u; i < BOUND; i++) {{`, not `{header}`")
        })?;
        let count = bounds
            .iter()
            .find(|(name, _)| *name == bound)
            .map(|(_, n)| *n)
            .ok_or_else(|| format!("no value given for the unroll bound `{bound}`"))?;
        let body_end = matching_brace(&out, header_end).ok_or("unbalanced braces after `// @unroll`")?;
        let body = &out[header_end + 1..body_end];
        if contains_word(body, "break") || contains_word(body, "continue") {
            return Err(format!("an unrolled loop over `{var}` may not `break` or `continue`"));
        }
        let indent: String = out[after_marker..].chars().take_while(|c| c.is_whitespace()).collect();
        let mut copies = String::new();
        for i in 0..count {
            copies.push_str(&format!("{{ const {var} = {i}u;{body}}}\n{indent}"));
        }
        // The marker line's own indentation stays in front of the first copy.
        out.replace_range(marker..body_end + 1, copies.trim_end());
    }
    Ok(out)
}

/// `for (var d = 0u; d < D_BLOCKS; d++)` → `("d", "D_BLOCKS")`.
fn parse_header(header: &str) -> Option<(&str, &str)> {
    let inner = header
        .strip_prefix("for")?
        .trim()
        .strip_prefix('(')?
        .strip_suffix(')')?;
    let mut parts = inner.split(';').map(str::trim);
    let (init, cond, step) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let (var, start) = init.strip_prefix("var ")?.split_once('=')?;
    let var = var.trim();
    let (cond_var, bound) = cond.split_once('<')?;
    let increments = step == format!("{var}++") || step == format!("{var} += 1u");
    (start.trim() == "0u" && cond_var.trim() == var && increments && is_identifier(var))
        .then_some((var, bound.trim()))
        .filter(|(_, b)| is_identifier(b))
}

fn is_identifier(s: &str) -> bool {
    !s.is_empty()
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !s.starts_with(|c: char| c.is_ascii_digit())
}

/// Byte offset of the `}` closing the `{` at `open`, skipping `//` comments.
pub(crate) fn matching_brace(src: &str, open: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut in_comment = false;
    let bytes = src.as_bytes();
    let mut i = open;
    while i < bytes.len() {
        match bytes[i] {
            b'\n' => in_comment = false,
            b'/' if !in_comment && bytes.get(i + 1) == Some(&b'/') => in_comment = true,
            b'{' if !in_comment => depth += 1,
            b'}' if !in_comment => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

fn contains_word(src: &str, word: &str) -> bool {
    src.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .any(|w| w == word)
}

#[cfg(test)]
mod tests {
    use super::unroll_loops;

    #[test]
    fn a_marked_loop_becomes_one_block_per_iteration() {
        let src = "fn f() {\n    // @unroll\n    for (var d = 0u; d < N; d++) {\n        x[d] = y[d];\n    }\n}\n";
        let out = unroll_loops(src, &[("N", 3)]).unwrap();
        assert!(!out.contains("for"), "{out}");
        for i in 0..3 {
            assert!(out.contains(&format!("const d = {i}u;")), "{out}");
        }
        assert_eq!(out.matches("x[d] = y[d];").count(), 3);
        assert!(!out.contains("const d = 3u;"));
    }

    #[test]
    fn nested_loops_and_unmarked_loops() {
        let src = "// @unroll\nfor (var d = 0u; d < D; d++) {\n  // @unroll\n  for (var j = 0u; j < J; j++) {\n    \
                   a[j] += b[d]; // a comment with a brace }\n  }\n  for (var k = 0u; k < 9u; k++) { c += 1; }\n}\n";
        let out = unroll_loops(src, &[("D", 2), ("J", 4)]).unwrap();
        assert_eq!(out.matches("a[j] += b[d];").count(), 8);
        assert_eq!(
            out.matches("for (var k").count(),
            2,
            "an unmarked loop stays a loop: {out}"
        );
        assert!(!out.contains("@unroll"));
    }

    #[test]
    fn malformed_markers_are_errors() {
        let unknown = "// @unroll\nfor (var d = 0u; d < M; d++) { }\n";
        assert!(unroll_loops(unknown, &[("N", 2)]).unwrap_err().contains("`M`"));
        let odd_start = "// @unroll\nfor (var d = 1u; d < N; d++) { }\n";
        assert!(unroll_loops(odd_start, &[("N", 2)]).is_err());
        let leaves = "// @unroll\nfor (var d = 0u; d < N; d++) { if (x) { break; } }\n";
        assert!(unroll_loops(leaves, &[("N", 2)]).unwrap_err().contains("break"));
        let open = "// @unroll\nfor (var d = 0u; d < N; d++) { {\n";
        assert!(unroll_loops(open, &[("N", 2)]).is_err());
    }
}
