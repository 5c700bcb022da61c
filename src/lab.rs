//! The developer lab's source edits (feature `lab`; never in a build for users): text
//! replacements in the kernels' sources, read from the file the `WFA_EDIT` environment variable
//! names (or files: `a.edit:b.edit` applies both, a's blocks first), so that one build can time variants of a WGSL or CUDA kernel side by side on the lent
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
//! are edited before their loops are unrolled, CUDA programs (the kernel file and the headers it
//! includes) before NVRTC sees them and before their cache key is taken. A block whose old text a module
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

/// The blocks of an edit file's text, in order. Markers are whole lines; lines outside blocks
/// are notes. A file with no block, with CRLF line ends, or with a marker out of place (a block
/// left open, `====` or `>>>>` outside one, `<<<<` inside one) is refused with the line: taken
/// loosely, it would time the kernel unedited, or paste markers into it.
#[cfg(any(feature = "lab", test))]
fn parse(text: &str) -> Result<Vec<Edit>, String> {
    enum At {
        Outside,
        Old(String),
        New(String, String),
    }
    if text.contains('\r') {
        return Err("CRLF line ends (write the file with \\n alone)".into());
    }
    let mut edits = Vec::new();
    let mut at = At::Outside;
    for (i, line) in text.split_inclusive('\n').enumerate() {
        let marker = line.strip_suffix('\n').unwrap_or(line);
        let misplaced = |what: &str| Err(format!("line {}: `{marker}` {what}", i + 1));
        at = match (at, marker) {
            (At::Outside, "<<<<") => At::Old(String::new()),
            (At::Outside, "====" | ">>>>") => return misplaced("outside a block"),
            (At::Outside, _) => At::Outside,
            (At::Old(old), "====") if old.is_empty() => return misplaced("ends a block that replaces no text"),
            (At::Old(old), "====") => At::New(old, String::new()),
            (At::Old(_) | At::New(..), "<<<<") => return misplaced("inside a block"),
            (At::Old(_), ">>>>") => return misplaced("before the block's `====`"),
            (At::Old(old), _) => At::Old(old + line),
            (At::New(..), "====") => return misplaced("twice in a block"),
            (At::New(old, new), ">>>>") => {
                edits.push(Edit { old, new });
                At::Outside
            }
            (At::New(old, new), _) => At::New(old, new + line),
        };
    }
    if !matches!(at, At::Outside) {
        return Err(format!("block {} is not closed by `>>>>`", edits.len() + 1));
    }
    if edits.is_empty() {
        return Err("no `<<<<` … `====` … `>>>>` block".into());
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
/// the files `WFA_EDIT` names (one, or several separated by `:`, whose blocks apply in order), or
/// as they are when the variable is unset; the reason when the
/// file cannot be read or parsed. Says on stderr how many blocks applied in `program`, a block
/// counting once however many of its texts it changed.
#[cfg(feature = "lab")]
pub(crate) fn edited(texts: Vec<String>, program: &str) -> Result<Vec<String>, String> {
    let Some(paths) = std::env::var_os(EDIT_VAR) else {
        return Ok(texts);
    };
    let mut edits = Vec::new();
    for path in std::env::split_paths(&paths) {
        let fail = |e: String| format!("{EDIT_VAR} {}: {e}", path.display());
        edits.extend(parse(&std::fs::read_to_string(&path).map_err(|e| fail(e.to_string()))?).map_err(fail)?);
    }
    let (texts, applied) = apply(texts, &edits);
    eprintln!(
        "{EDIT_VAR} {}: {applied} of {} blocks in {program}",
        paths.to_string_lossy(),
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
    fn malformed_files_are_refused_with_the_line() {
        let refused = |text: &str, why: &str| {
            let e = parse(text).unwrap_err();
            assert!(e.contains(why), "{text:?}: {e}");
        };
        refused("<<<<\nold\n>>>>\n", "line 3: `>>>>` before the block's `====`");
        refused(
            "<<<<\na\n====\nb\n<<<<\nc\n====\nd\n>>>>\n",
            "line 5: `<<<<` inside a block",
        );
        refused("<<<<\na\n====\nb\n", "block 1 is not closed");
        refused(
            "<<<<\n====\nnew\n>>>>\n",
            "line 2: `====` ends a block that replaces no text",
        );
        refused("====\n", "line 1: `====` outside a block");
        refused("<<<<\r\na\r\n====\r\nb\r\n>>>>\r\n", "CRLF");
        refused("a diff, say\n", "no `<<<<`");
        refused("<<<< \na\n====\nb\n>>>>\n", "line 3: `====` outside a block");
        // A marker without its newline at the file's end still closes the block.
        assert_eq!(
            parse("<<<<\na\n====\n>>>>").unwrap(),
            [Edit {
                old: "a\n".into(),
                new: String::new()
            }]
        );
    }
}
