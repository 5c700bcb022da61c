//! The developer lab's source edits (feature `lab`; never in a build for users): text
//! replacements in the kernels' sources, read from the file the `WFA_EDIT` environment variable
//! names, so that one build can time variants of a WGSL or CUDA kernel side by side on the lent
//! GPU (scripts/lab/coop-probe.sh, BENCHMARKS.md's experiments) without a Rust build per variant.
//! The file holds blocks
//!
//! ```text
//! <<<<
//! old text
//! ====
//! new text
//! >>>>
//! ```
//!
//! each replacing every occurrence of its old text in each module that contains it (the old text
//! runs from the line after `<<<<` to the line before `====`, newlines included). WGSL modules
//! are edited before their loops are unrolled, CUDA programs (the kernel file and every header)
//! before NVRTC sees them and before their cache key is taken. A block whose old text a module
//! lacks leaves that module alone; each module says on stderr how many blocks applied. A file
//! that cannot be read or parsed fails every module's compile with the reason, so that a mistyped
//! edit is never timed as the kernel. Without the feature [`edited`] returns the texts unchanged
//! and reads no environment.

/// The environment variable naming the edit file.
#[cfg(feature = "lab")]
const EDIT_VAR: &str = "WFA_EDIT";

/// One block of an edit file.
#[cfg(any(feature = "lab", test))]
#[derive(Debug, PartialEq)]
struct Edit {
    old: String,
    new: String,
}

/// The blocks of an edit file's text, in order.
#[cfg(any(feature = "lab", test))]
fn parse(text: &str) -> Result<Vec<Edit>, String> {
    let mut edits = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("<<<<\n") {
        let block = &rest[start + 5..];
        let (old, after) = block
            .split_once("====\n")
            .ok_or_else(|| format!("block {} has no `====` line", edits.len() + 1))?;
        let (new, after) = after
            .split_once(">>>>")
            .ok_or_else(|| format!("block {} has no `>>>>` line", edits.len() + 1))?;
        if old.is_empty() {
            return Err(format!("block {} replaces no text", edits.len() + 1));
        }
        edits.push(Edit {
            old: old.to_string(),
            new: new.to_string(),
        });
        rest = after;
    }
    Ok(edits)
}

/// `texts` with each block applied in order wherever its old text occurs (the old text as the
/// blocks before it left them), and how many blocks applied somewhere.
#[cfg(any(feature = "lab", test))]
fn apply(mut texts: Vec<String>, edits: &[Edit]) -> (Vec<String>, usize) {
    let mut applied = 0;
    for e in edits {
        if texts.iter().any(|t| t.contains(&e.old)) {
            applied += 1;
            for t in texts.iter_mut().filter(|t| t.contains(&e.old)) {
                *t = t.replace(&e.old, &e.new);
            }
        }
    }
    (texts, applied)
}

/// The texts of one program (a WGSL module; a CUDA kernel file and its headers) with the edits of
/// the file `WFA_EDIT` names, or as they are when the variable is unset; the reason when the
/// file cannot be read or parsed. Says on stderr how many blocks applied in `program`, a block
/// counting once however many of its texts it changed.
#[cfg(feature = "lab")]
pub(crate) fn edited(texts: Vec<String>, program: &str) -> Result<Vec<String>, String> {
    let Some(path) = std::env::var_os(EDIT_VAR) else {
        return Ok(texts);
    };
    let path = std::path::PathBuf::from(path);
    let fail = |e: String| format!("{EDIT_VAR} {}: {e}", path.display());
    let edits = parse(&std::fs::read_to_string(&path).map_err(|e| fail(e.to_string()))?).map_err(fail)?;
    let (texts, applied) = apply(texts, &edits);
    eprintln!(
        "{EDIT_VAR} {}: {applied} of {} blocks in {program}",
        path.display(),
        edits.len()
    );
    Ok(texts)
}

/// Without the `lab` feature: the texts as they are.
#[cfg(not(feature = "lab"))]
#[inline]
pub(crate) fn edited(texts: Vec<String>, _program: &str) -> Result<Vec<String>, String> {
    Ok(texts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_replace_every_occurrence_in_order_and_count_those_that_applied() {
        let text = "a note\n<<<<\nx = 1;\n====\nx = 2;\n>>>>\n<<<<\nmissing\n====\ngone\n>>>>\n\
                    <<<<\nx = 2;\ny\n====\nz\n>>>>\n";
        let edits = parse(text).unwrap();
        assert_eq!(edits.len(), 3);
        assert_eq!(
            edits[0],
            Edit {
                old: "x = 1;\n".into(),
                new: "x = 2;\n".into()
            }
        );
        let (texts, applied) = apply(vec!["x = 1;\ny\nx = 1;\n".into(), "x = 1;".into()], &edits);
        // The first block makes both lines `x = 2;`, the third then joins the first with `y`; the
        // second text lacks the first block's newline.
        assert_eq!(texts, ["z\nx = 2;\n", "x = 1;"]);
        assert_eq!(applied, 2);
    }

    #[test]
    fn malformed_blocks_are_refused_with_their_number() {
        assert!(parse("<<<<\nold\n>>>>\n")
            .unwrap_err()
            .contains("block 1 has no `====`"));
        assert!(parse("<<<<\na\n====\nb\n>>>>\n<<<<\nold\n====\nnew\n")
            .unwrap_err()
            .contains("block 2 has no `>>>>`"));
        assert!(parse("<<<<\n====\nnew\n>>>>\n")
            .unwrap_err()
            .contains("replaces no text"));
        assert_eq!(parse("no blocks at all").unwrap(), Vec::new());
    }
}
