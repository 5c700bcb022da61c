//! The cooperative-matrix kernels with their matrix operations emulated by subgroup shuffles, so
//! that they run (slowly) on a device without matrix units: a CPU driver in CI. A testing aid,
//! switched on by `FLASH_EMULATE_MATRICES=1` on a device with subgroups of exactly 16 or 32 and no
//! matrices (lavapipe at `LP_NATIVE_VECTOR_WIDTH=512`: 16; src/device/context.rs).
//!
//! What it tests and what it does not. Everything of a kernel but the matrix unit itself runs as
//! written: its tiling, staging, masks, softmax (in registers or through workgroup memory), row
//! rescaling and epilogue. A 16 × 16 matrix becomes f32 components in a layout of the lane
//! count's, the same for all three roles: on 32 lanes eight in the H200's fragment layout
//! ([`RegisterLayout::nvidia_h200`](crate::caps::RegisterLayout::nvidia_h200): lane 4g + t holds
//! rows g and g + 8 at columns 2t, 2t + 1, 2t + 8, 2t + 9), so that the register softmax's
//! compiled-in layout is the emulated one; on 16 lanes a row each (lane r holds row r), which
//! only the workgroup-memory softmax runs on (the register softmax knows 32-lane layouts only).
//! Loads and stores read and write those elements where the driver's would (row- or
//! column-major, the stride in the array's vec4 elements, as naga emits
//! `OpCooperativeMatrixLoadKHR`); a product gathers each A and B element it needs with
//! `subgroupShuffle`. Not tested: the driver's own matrix code and layout, and timing.
//!
//! The lowering is textual and knows only this repository's shaders: three matrix types, the
//! five operations they use (`coopLoad[T]`, `coopStore[T]`, `coopMultiplyAdd`), the element
//! access placeholders of coop_elements.wgsl and coop_rows.wgsl's `componentwise_product`, all on
//! arrays of `vec4<f16>` or `vec4<f32>` named at the call. Anything else is an error naming it.

use std::collections::BTreeSet;

/// The emulated matrix types, replacing wgpu's: (WGSL type, struct name).
const TYPES: [(&str, &str); 3] = [
    ("coop_mat16x16<f32, C>", "CoopC"),
    ("coop_mat16x16<f16, A>", "CoopA"),
    ("coop_mat16x16<f16, B>", "CoopB"),
];

/// The matrices, the layout and the product for subgroups of `lanes` (16 or 32), before any
/// kernel code: a matrix is `256 / lanes` f32 components per invocation, component i being
/// m[i / 4][i % 4] of a matNx4 (whose + and − are the matrices' own, component-wise), in the
/// lane count's layout ([`LAYOUT_32`], [`LAYOUT_16`]).
fn prelude(lanes: u32) -> String {
    let components = 256 / lanes;
    let matrix = format!("mat{}x4<f32>", components / 4);
    let layout = if lanes == 16 { LAYOUT_16 } else { LAYOUT_32 };
    format!(
        "
// ---- cooperative matrices emulated by subgroup shuffles (src/wgsl/coop_emulation.rs) ----
alias CoopC = {matrix};
alias CoopA = {matrix};
alias CoopB = {matrix};
const COOP_EMU_COMPONENTS: u32 = {components}u;

var<private> coop_emu_lane: u32;
{layout}"
    )
}

/// 32 lanes: the element positions and the product.
const LAYOUT_32: &str = "
// Eight components per invocation, lane 4g + t: row g + 8·(i / 4), column 2t + i % 2 + 8·((i / 2) % 2).
fn coop_emu_row(i: u32) -> u32 {
    return coop_emu_lane / 4u + 8u * (i / 4u);
}

fn coop_emu_col(i: u32) -> u32 {
    return 2u * (coop_emu_lane % 4u) + i % 2u + 8u * ((i / 2u) % 2u);
}

// D = A·B + C: for each k, A's element (row, k) of both of this invocation's rows and B's (k, col)
// of its four columns, fetched from the lanes that hold them.
fn coop_emu_mul_add(a: CoopA, b: CoopB, c: CoopC) -> CoopC {
    var d = c;
    let lane = coop_emu_lane;
    for (var k = 0u; k < 16u; k++) {
        let a_src = 4u * (lane / 4u) + (k % 8u) / 2u;
        let a_comp = ((k / 8u) % 2u) * 2u + k % 2u;
        let a_top = subgroupShuffle(a[0][a_comp], a_src);
        let a_bottom = subgroupShuffle(a[1][a_comp], a_src);
        let b_src = 4u * (k % 8u) + lane % 4u;
        for (var i = 0u; i < 4u; i++) {
            let b_val = subgroupShuffle(b[k / 8u][i], b_src);
            d[0][i] = fma(a_top, b_val, d[0][i]);
            d[1][i] = fma(a_bottom, b_val, d[1][i]);
        }
    }
    return d;
}
";

/// 16 lanes: the element positions and the product.
const LAYOUT_16: &str = "
// Sixteen components per invocation, lane r: row r, column i.
fn coop_emu_row(i: u32) -> u32 {
    return coop_emu_lane;
}

fn coop_emu_col(i: u32) -> u32 {
    return i;
}

// D = A·B + C: A's row is this invocation's own; B's row k is lane k's.
fn coop_emu_mul_add(a: CoopA, b: CoopB, c: CoopC) -> CoopC {
    var d = c;
    for (var k = 0u; k < 16u; k++) {
        let a_val = a[k / 4u][k % 4u];
        for (var i = 0u; i < 16u; i++) {
            d[i / 4u][i % 4u] = fma(a_val, subgroupShuffle(b[i / 4u][i % 4u], k), d[i / 4u][i % 4u]);
        }
    }
    return d;
}
";

/// The functions the lowering replaces with its own (coop_elements.wgsl's element access
/// placeholders; coop_rows.wgsl's component-wise product), and their emulated bodies.
/// The kernel's COOP_COMPONENTS is the emulation's count on the subgroups it runs on.
const REPLACED_FUNCTIONS: [(&str, &str); 5] = [
    (
        "coop_elements_c",
        "fn coop_elements_c(m: CoopC) -> array<f32, COOP_COMPONENTS> {
    var x: array<f32, COOP_COMPONENTS>;
    for (var i = 0u; i < COOP_EMU_COMPONENTS; i++) {
        x[i] = m[i / 4u][i % 4u];
    }
    return x;
}
",
    ),
    (
        "coop_from_elements_c",
        "fn coop_from_elements_c(x: array<f32, COOP_COMPONENTS>) -> CoopC {
    var m: CoopC;
    for (var i = 0u; i < COOP_EMU_COMPONENTS; i++) {
        m[i / 4u][i % 4u] = x[i];
    }
    return m;
}
",
    ),
    (
        "coop_from_elements_a",
        "fn coop_from_elements_a(x: array<f16, COOP_COMPONENTS>) -> CoopA {
    var m: CoopA;
    for (var i = 0u; i < COOP_EMU_COMPONENTS; i++) {
        m[i / 4u][i % 4u] = f32(x[i]);
    }
    return m;
}
",
    ),
    (
        "coop_elements_a",
        "fn coop_elements_a(m: CoopA) -> array<f16, COOP_COMPONENTS> {
    var x: array<f16, COOP_COMPONENTS>;
    for (var i = 0u; i < COOP_EMU_COMPONENTS; i++) {
        x[i] = f16(m[i / 4u][i % 4u]);
    }
    return x;
}
",
    ),
    (
        "componentwise_product",
        "fn componentwise_product(a: CoopC, b: CoopC) -> CoopC {
    var d: CoopC;
    for (var i = 0u; i < COOP_EMU_COMPONENTS; i++) {
        d[i / 4u][i % 4u] = a[i / 4u][i % 4u] * b[i / 4u][i % 4u];
    }
    return d;
}
",
    ),
];

/// One emulated load or store: of which array, row- or column-major, and (loads) which role.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Access {
    array: String,
    row_major: bool,
    /// `Some(struct name)` for a load of that type; `None` for a store.
    load: Option<&'static str>,
}

impl Access {
    fn function_name(&self) -> String {
        let layout = if self.row_major { "rm" } else { "cm" };
        match self.load {
            Some(ty) => format!("coop_emu_load_{ty}_{layout}_{}", self.array),
            None => format!("coop_emu_store_{layout}_{}", self.array),
        }
    }

    /// The function, for an array of `vec4<scalar>`.
    fn source(&self, scalar: &str) -> String {
        let (major, minor) = if self.row_major { ("r", "c") } else { ("c", "r") };
        let name = self.function_name();
        let array = &self.array;
        let at = format!(
            "        let r = coop_emu_row(i);\n        let c = coop_emu_col(i);\n        \
             let s = 4u * (base + {major} * stride) + {minor};\n"
        );
        match self.load {
            Some(ty) => format!(
                "\nfn {name}(base: u32, stride: u32) -> {ty} {{\n    var m: {ty};\n    \
                 for (var i = 0u; i < COOP_EMU_COMPONENTS; i++) {{\n{at}        m[i / 4u][i % 4u] = f32({array}[s / 4u][s % 4u]);\n    }}\n    \
                 return m;\n}}\n"
            ),
            None => {
                // What a store to an f16 array holds is an operand (P, dS); to f32, an accumulator.
                let ty = if scalar == "f16" { "CoopA" } else { "CoopC" };
                format!(
                    "\nfn {name}(m: {ty}, base: u32, stride: u32) {{\n    \
                     for (var i = 0u; i < COOP_EMU_COMPONENTS; i++) {{\n{at}        {array}[s / 4u][s % 4u] = {scalar}(m[i / 4u][i % 4u]);\n    }}\n}}\n"
                )
            }
        }
    }
}

/// The kernel module `src` (a cooperative-matrix kernel's WGSL) with its matrix operations
/// emulated for subgroups of `lanes` (16 or 32; module docs); the reason where it uses something
/// the lowering does not know.
pub fn emulate_cooperative_matrices(src: &str, lanes: u32) -> Result<String, String> {
    if lanes != 16 && lanes != 32 {
        return Err(format!("matrices are emulated on subgroups of 16 or 32, not {lanes}"));
    }
    // Comments go first: they name the operations too.
    let mut out: String = src
        .lines()
        .map(|line| line.find("//").map_or(line, |at| &line[..at]))
        .filter(|line| line.trim() != "enable wgpu_cooperative_matrix;")
        .flat_map(|line| [line, "\n"])
        .collect();
    for (wgsl, name) in TYPES {
        out = out.replace(wgsl, name);
    }
    if let Some(at) = out.find("coop_mat") {
        return Err(format!("unknown cooperative matrix type at `{}`", snippet(&out, at)));
    }
    let mut replacements = String::new();
    for (name, emulated) in REPLACED_FUNCTIONS {
        if let Some(without) = remove_function(&out, name)? {
            out = without;
            replacements.push('\n');
            replacements.push_str(emulated);
        }
    }
    let mut accesses = BTreeSet::new();
    out = rewrite_calls(&out, &mut accesses)?;
    out = out.replace("coopMultiplyAdd(", "coop_emu_mul_add(");
    if let Some(at) = find_unknown_operation(&out) {
        return Err(format!("unknown cooperative operation at `{}`", snippet(&out, at)));
    }
    out = set_lane_in_entry_points(&out)?;

    let mut generated = prelude(lanes);
    generated.push_str(&replacements);
    for access in &accesses {
        let scalar = array_scalar(&out, &access.array)
            .ok_or_else(|| format!("array `{}` is not declared as array<vec4<f16|f32>>", access.array))?;
        generated.push_str(&access.source(scalar));
    }
    // After the `enable` lines, which must come first.
    let body_at = out
        .match_indices("enable ")
        .last()
        .map(|(at, _)| at + out[at..].find('\n').map_or(out.len() - at, |n| n + 1))
        .unwrap_or(0);
    out.insert_str(body_at, &generated);
    Ok(out)
}

/// A few characters of `s` from `at`, for messages.
fn snippet(s: &str, at: usize) -> String {
    s[at..].chars().take(60).collect()
}

/// Where `s` still calls a `coop…` builtin (a name starting `coop` and a capital letter).
fn find_unknown_operation(s: &str) -> Option<usize> {
    s.match_indices("coop").map(|(at, _)| at).find(|&at| {
        let before = s[..at].chars().next_back();
        let after = s[at + 4..].chars().next();
        !before.is_some_and(|c| c.is_alphanumeric() || c == '_') && after.is_some_and(|c| c.is_ascii_uppercase())
    })
}

/// The index of the bracket closing the one at `open` (`(`, `[` or `{`, nesting any of them).
fn matching_close(s: &str, open: usize) -> Result<usize, String> {
    let mut depth = 0i32;
    for (i, ch) in s[open..].char_indices() {
        match ch {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => {
                depth -= 1;
                if depth == 0 {
                    return Ok(open + i);
                }
            }
            _ => {}
        }
    }
    Err(format!("unbalanced brackets from `{}`", snippet(s, open)))
}

/// The arguments between the parentheses at `open` and `close`, split at top-level commas.
fn arguments(s: &str, open: usize, close: usize) -> Vec<String> {
    let mut args = Vec::new();
    let (mut depth, mut start) = (0i32, open + 1);
    for (i, ch) in s[open + 1..close].char_indices() {
        match ch {
            '(' | '[' | '{' | '<' => depth += 1,
            ')' | ']' | '}' | '>' => depth -= 1,
            ',' if depth == 0 => {
                args.push(s[start..open + 1 + i].trim().to_string());
                start = open + 2 + i;
            }
            _ => {}
        }
    }
    args.push(s[start..close].trim().to_string());
    args
}

/// `&name[index]` as (name, index).
fn element_pointer(arg: &str) -> Result<(String, String), String> {
    let inner = arg
        .strip_prefix('&')
        .ok_or_else(|| format!("`{arg}`: not a pointer to an array element"))?;
    let open = inner
        .find('[')
        .ok_or_else(|| format!("`{arg}`: not an array element"))?;
    let close = matching_close(inner, open)?;
    if close + 1 != inner.len() {
        return Err(format!("`{arg}`: not a pointer to an array element"));
    }
    Ok((inner[..open].trim().to_string(), inner[open + 1..close].to_string()))
}

/// Every `coopLoad[T]<Type>(&a[i], stride)` and `coopStore[T](m, &a[i], stride)` as a call of
/// its emulating function, noted in `accesses`.
fn rewrite_calls(src: &str, accesses: &mut BTreeSet<Access>) -> Result<String, String> {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    loop {
        let next = ["coopLoad", "coopStore"]
            .iter()
            .filter_map(|op| rest.find(op).map(|at| (at, *op)))
            .min();
        let Some((at, op)) = next else {
            out.push_str(rest);
            return Ok(out);
        };
        out.push_str(&rest[..at]);
        let after = &rest[at + op.len()..];
        let row_major = after.starts_with('T');
        let after = if row_major { &after[1..] } else { after };
        let (load, after) = if op == "coopLoad" {
            let close = after
                .find('>')
                .filter(|_| after.starts_with('<'))
                .ok_or_else(|| format!("`{}`: a load without its type", snippet(rest, at)))?;
            let ty = TYPES
                .iter()
                .map(|(_, name)| *name)
                .find(|name| &after[1..close] == *name)
                .ok_or_else(|| format!("`{}`: an unknown matrix type", snippet(rest, at)))?;
            (Some(ty), &after[close + 1..])
        } else {
            (None, after)
        };
        if !after.starts_with('(') {
            return Err(format!("`{}`: not a call", snippet(rest, at)));
        }
        let close = matching_close(after, 0)?;
        let args = arguments(after, 0, close);
        let (value, pointer, stride) = match (load, args.as_slice()) {
            (Some(_), [pointer, stride]) => (None, pointer, stride),
            (None, [value, pointer, stride]) => (Some(value), pointer, stride),
            _ => return Err(format!("`{}`: unexpected arguments", snippet(rest, at))),
        };
        let (array, index) = element_pointer(pointer)?;
        let access = Access { array, row_major, load };
        let name = access.function_name();
        match value {
            Some(value) => out.push_str(&format!("{name}({value}, {index}, {stride})")),
            None => out.push_str(&format!("{name}({index}, {stride})")),
        }
        accesses.insert(access);
        rest = &after[close + 1..];
    }
}

/// `src` without function `name` (its declaration through its closing brace), or `None` if it
/// declares none.
fn remove_function(src: &str, name: &str) -> Result<Option<String>, String> {
    let Some(at) = src.find(&format!("fn {name}(")) else {
        return Ok(None);
    };
    let open = at
        + src[at..]
            .find('{')
            .ok_or_else(|| format!("function `{name}` has no body"))?;
    let close = matching_close(src, open)?;
    Ok(Some(format!("{}{}", &src[..at], &src[close + 1..])))
}

/// Each `@compute` entry point sets `coop_emu_lane` first, from its subgroup invocation id (its
/// own parameter, or one added).
fn set_lane_in_entry_points(src: &str) -> Result<String, String> {
    let mut out = String::with_capacity(src.len() + 256);
    let mut rest = src;
    while let Some(at) = rest.find("@compute") {
        let fn_at = at + rest[at..].find("fn ").ok_or("an entry point without `fn`")?;
        let open = fn_at + rest[fn_at..].find('(').ok_or("an entry point without parameters")?;
        let close = matching_close(rest, open)?;
        let params = &rest[open + 1..close];
        let body = close + rest[close..].find('{').ok_or("an entry point without a body")?;
        const BUILTIN: &str = "@builtin(subgroup_invocation_id)";
        let (lane, params) = match params.find(BUILTIN) {
            Some(p) => {
                let name: String = params[p + BUILTIN.len()..]
                    .trim_start()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                (name, params.to_string())
            }
            None => (
                "coop_emu_lane_in".to_string(),
                format!("\n    {BUILTIN} coop_emu_lane_in: u32,{params}"),
            ),
        };
        out.push_str(&rest[..open + 1]);
        out.push_str(&params);
        out.push_str(&rest[close..=body]);
        out.push_str(&format!("\n    coop_emu_lane = {lane};"));
        rest = &rest[body + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The scalar type of `array`'s vec4 elements, from its declaration.
fn array_scalar<'a>(src: &'a str, array: &str) -> Option<&'a str> {
    src.match_indices(&format!("> {array}: array<vec4<"))
        .find_map(|(at, m)| {
            let from = at + m.len();
            ["f16", "f32"]
                .into_iter()
                .any(|s| src[from..].starts_with(s))
                .then(|| &src[from..from + 3])
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wgsl::{cooperative_kernels, KernelConfig};

    /// Every cooperative-matrix kernel lowers and validates (naga) without matrices.
    #[test]
    fn every_cooperative_kernel_lowers_to_plain_wgsl() {
        let kernels = cooperative_kernels();
        assert!(kernels.len() > 100, "{}", kernels.len());
        for kernel in kernels {
            let lanes = match kernel {
                KernelConfig::FlashCoop(c) => c.subgroup,
                _ => 32,
            };
            let src = emulate_cooperative_matrices(&kernel.source(), lanes)
                .unwrap_or_else(|e| panic!("{}: {e}", kernel.name()));
            assert!(
                !src.contains("coop_mat") && !src.contains("coopLoad"),
                "{}",
                kernel.name()
            );
            let module = naga::front::wgsl::parse_str(&src)
                .unwrap_or_else(|e| panic!("{}: {}", kernel.name(), e.emit_to_string(&src)));
            naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
                .validate(&module)
                .unwrap_or_else(|e| panic!("{}: {e:?}", kernel.name()));
        }
    }

    #[test]
    fn unknown_uses_are_errors() {
        let err = emulate_cooperative_matrices("fn f(m: coop_mat8x8<f32, C>) {}", 32).unwrap_err();
        assert!(err.contains("unknown cooperative matrix type"), "{err}");
        let err = emulate_cooperative_matrices("fn f() { let x = coopLoad<CoopQ>(&a[0], 4u); }", 32).unwrap_err();
        assert!(err.contains("unknown matrix type"), "{err}");
        let err = emulate_cooperative_matrices("fn f() { coopTranspose(x); }", 16).unwrap_err();
        assert!(err.contains("unknown cooperative operation"), "{err}");
        let err = emulate_cooperative_matrices(
            "var<workgroup> a: array<vec2<f32>, 4>;\nfn f() { let x = coopLoadT<coop_mat16x16<f32, C>>(&a[0], 4u); }",
            32,
        )
        .unwrap_err();
        assert!(err.contains("array<vec4"), "{err}");
        let err = emulate_cooperative_matrices("", 8).unwrap_err();
        assert!(err.contains("16 or 32"), "{err}");
    }
}
