//! The library's modules are layers (docs/architecture.md): each may import only the layers
//! below it, so that a change to a kernel's plan cannot reach back into the problem description,
//! and a new variant lands in one obvious place per layer. This test reads every file under
//! `src/`, collects the `crate::` paths it uses outside its `#[cfg(test)]` part (code and doc
//! links alike), and fails on an import from a higher layer, on a cycle between files, and on a
//! path through the crate root's re-exports (which would hide the real dependency).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The top-level modules from the bottom layer up. A module may import itself (its own files) and
/// anything listed before it.
const LAYERS: &[&str] = &[
    "dtype",     // element types
    "util",      // small arithmetic
    "error",     // the one error type
    "lab",       // the developer lab's source edits (feature `lab`)
    "problem",   // shapes, layouts, validation: no GPU
    "reference", // the float64 CPU reference
    "caps",      // device facts as plain values
    "plan",      // pure kernel selection and tuning tables
    "wgsl",      // shader assembly and every host mirror of a shader fact
    "spirv",     // SPIR-V passes for the cooperative-matrix kernel
    "gpu",       // wgpu mechanics: pipelines, binding, read-back
    "device",    // getting a device and probing it
    "runtime",   // the engines
    "cuda",      // the CUDA engine (its own layers inside)
    "testing",   // harnesses, timing, shader-test helpers
    "kernel",    // the public facade over `plan`'s types
    "batch",     // the public facade over packed batches, K/V caches and their index
    "ring",      // the public facade over context parallelism's ring schedule
    "candle",    // the candle drop-in: candle-flash-attn's functions over the engines
    "burn",      // burn's attention op over the wgpu engine
];

/// Each file's module path (`plan::forward`, `caps`) and its text before `#[cfg(test)]`.
fn modules() -> BTreeMap<String, String> {
    fn walk(dir: &Path, root: &Path, out: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).expect("src/ is readable") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                // src/bin/ holds binaries: crates of their own, users of the library's API.
                if path != root.join("bin") {
                    walk(&path, root, out);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(root).unwrap().with_extension("");
                let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
                if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
                    parts.pop();
                }
                let text = std::fs::read_to_string(&path).expect("a source file");
                let cut = text.find("#[cfg(test)]").unwrap_or(text.len());
                out.insert(parts.join("::"), text[..cut].to_string());
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = BTreeMap::new();
    walk(&root, &root, &mut out);
    out
}

/// Every `crate::a::b` path in `text`, including those in grouped imports (`use crate::{a, b::c}`).
fn crate_paths(text: &str) -> Vec<String> {
    let mut paths = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            paths.extend(
                group[..end]
                    .split(',')
                    .map(|p| p.trim().to_string())
                    .filter(|p| !p.is_empty()),
            );
        } else {
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(rest.len());
            paths.push(rest[..end].trim_end_matches(':').to_string());
        }
    }
    paths
}

/// The module (file) a path lands in: the longest module path that prefixes it.
fn target<'a>(path: &str, modules: &'a BTreeMap<String, String>) -> Option<&'a str> {
    modules
        .keys()
        .filter(|m| !m.is_empty() && (path == m.as_str() || path.starts_with(&format!("{m}::"))))
        .max_by_key(|m| m.len())
        .map(String::as_str)
}

fn top(module: &str) -> &str {
    module.split("::").next().unwrap_or(module)
}

fn rank(module: &str) -> Option<usize> {
    LAYERS.iter().position(|&l| l == top(module))
}

/// File-level import edges, and the paths that go through the crate root's re-exports.
fn edges(modules: &BTreeMap<String, String>) -> (BTreeMap<&str, BTreeSet<&str>>, Vec<String>) {
    let mut edges: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    let mut through_root = Vec::new();
    for (module, text) in modules {
        if module.is_empty() {
            continue; // lib.rs declares modules and re-exports; it is above every layer
        }
        for path in crate_paths(text) {
            match target(&path, modules) {
                Some(to) if to != module && !module.starts_with(&format!("{to}::")) => {
                    edges.entry(module.as_str()).or_default().insert(to);
                }
                Some(_) => {}
                None if matches!(module.as_str(), "kernel" | "batch" | "ring") => {} // facades' doc links name root items
                None if path.starts_with(|c: char| c.is_ascii_uppercase()) => {
                    through_root.push(format!("src/{module}: crate::{path}"))
                }
                None => {}
            }
        }
    }
    (edges, through_root)
}

#[test]
fn every_module_has_a_layer() {
    let missing: Vec<String> = modules()
        .keys()
        .filter(|m| !m.is_empty() && rank(m).is_none())
        .cloned()
        .collect();
    assert!(missing.is_empty(), "modules without a layer in LAYERS: {missing:?}");
}

#[test]
fn no_module_imports_from_a_higher_layer() {
    let modules = modules();
    let (edges, _) = edges(&modules);
    let mut upward = Vec::new();
    for (from, tos) in &edges {
        for to in tos {
            if let (Some(a), Some(b)) = (rank(from), rank(to)) {
                if b > a {
                    upward.push(format!(
                        "{from} (layer {}) imports {to} (layer {})",
                        LAYERS[a], LAYERS[b]
                    ));
                }
            }
        }
    }
    assert!(upward.is_empty(), "imports from a higher layer:\n{}", upward.join("\n"));
}

#[test]
fn no_cycle_between_files() {
    let modules = modules();
    let (edges, _) = edges(&modules);
    // Depth-first search; a back edge closes a cycle.
    fn visit<'a>(
        node: &'a str,
        edges: &BTreeMap<&'a str, BTreeSet<&'a str>>,
        state: &mut BTreeMap<&'a str, bool>,
        stack: &mut Vec<&'a str>,
        cycles: &mut Vec<String>,
    ) {
        state.insert(node, false); // on the stack
        stack.push(node);
        for &next in edges.get(node).into_iter().flatten() {
            match state.get(next) {
                None => visit(next, edges, state, stack, cycles),
                Some(false) => {
                    let from = stack.iter().position(|&n| n == next).unwrap_or(0);
                    cycles.push(format!("{} -> {next}", stack[from..].join(" -> ")));
                }
                Some(true) => {}
            }
        }
        stack.pop();
        state.insert(node, true); // done
    }
    let mut state = BTreeMap::new();
    let mut cycles = Vec::new();
    for &node in edges.keys() {
        if !state.contains_key(node) {
            visit(node, &edges, &mut state, &mut Vec::new(), &mut cycles);
        }
    }
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

#[test]
fn no_path_goes_through_the_crate_roots_re_exports() {
    let (_, through_root) = edges(&modules());
    assert!(
        through_root.is_empty(),
        "paths through the crate root hide which layer they import (name the module instead):\n{}",
        through_root.join("\n")
    );
}

/// The check itself: an upward import and a cycle in a made-up crate are found.
#[test]
fn the_checks_find_an_upward_import_and_a_cycle() {
    let mut fake = BTreeMap::new();
    fake.insert("problem".to_string(), "use crate::plan::select;".to_string());
    fake.insert(
        "plan".to_string(),
        "use crate::{problem::AttentionProblem, error};".to_string(),
    );
    fake.insert(
        "error".to_string(),
        "fn f() -> crate::Result<()> { todo!() }".to_string(),
    );
    let (edges, through_root) = edges(&fake);
    assert!(edges["problem"].contains("plan"), "{edges:?}");
    assert!(
        edges["plan"].contains("problem") && edges["plan"].contains("error"),
        "{edges:?}"
    );
    assert!(rank("plan") > rank("problem"), "plan sits above problem");
    assert_eq!(through_root, ["src/error: crate::Result"]);
}

/// The crate root stays small (the architecture issue's bar was at most 30 items without
/// `internals`; the `burn` module, issue 20, made it 31, the `ring` module, issue 21, 32): each `pub use` name and each `pub mod`
/// not gated on `internals` counts.
#[test]
fn the_public_root_stays_small() {
    let lib = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).unwrap();
    let lines: Vec<&str> = lib.lines().collect();
    let gated = |i: usize| i > 0 && lines[i - 1].contains("internals");
    let mut items = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim();
        if let Some(module) = line.strip_prefix("pub mod ") {
            if !gated(i) {
                items.push(module.trim_end_matches([';', '{', ' ']).to_string());
            }
        } else if line.starts_with("pub use ") && !gated(i) {
            let mut statement = line.to_string();
            while !statement.ends_with(';') && i + 1 < lines.len() {
                i += 1;
                statement.push_str(lines[i].trim());
            }
            let names = match (statement.find('{'), statement.rfind('}')) {
                (Some(a), Some(b)) => statement[a + 1..b].to_string(),
                _ => statement
                    .rsplit("::")
                    .next()
                    .unwrap_or("")
                    .trim_end_matches(';')
                    .to_string(),
            };
            items.extend(names.split(',').map(|n| n.trim().to_string()).filter(|n| !n.is_empty()));
        }
        i += 1;
    }
    assert!(items.len() <= 32, "{} public root items: {items:?}", items.len());
}
