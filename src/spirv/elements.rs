//! Element access to cooperative matrices, which SPIR-V has and WGSL cannot spell.
//!
//! `SPV_KHR_cooperative_matrix` lets an invocation read and write its own components of a
//! cooperative matrix (`OpCompositeExtract`, `OpCompositeInsert`; how many it holds is
//! `OpCooperativeMatrixLengthKHR`). Which row and column each component is stays
//! implementation-dependent; src/caps/register_layout.rs measures it. With it the cooperative-matrix kernel keeps its
//! scores in registers instead of taking them through workgroup memory.
//!
//! WGSL (naga 30) has no such access, so the kernel declares *placeholder functions* with an
//! ordinary WGSL body, which naga validates and translates like any other function, and this pass
//! replaces their bodies in the SPIR-V. A placeholder is recognised by its name prefix, and the
//! body is built from its signature:
//!
//! - `coop_elements_*(m: coop_mat…) -> array<T, N>`: components 0..N of `m` (N must not exceed the
//!   matrix's length on the device: the caller knows it from the layout probe);
//! - `coop_from_elements_*(x: array<T, N>) -> coop_mat…`: a matrix whose components 0..N are `x`
//!   (N must be the whole length, so that no component is left undefined);
//! - `coop_length_*(m: coop_mat…) -> u32`: `OpCooperativeMatrixLengthKHR` of `m`'s type.
//!
//! A module compiled by any other route (naga's MSL, wgpu's own SPIR-V) keeps the WGSL bodies, which
//! return zeros; the kernels that use placeholders are only ever built through
//! [`crate::spirv::compile`], which runs this pass and fails if a placeholder has a
//! signature it cannot fill.

use std::collections::{HashMap, HashSet};

use crate::spirv::words::{instruction, instructions, literal_string, OP_CONSTANT, OP_TYPE_COOP_MATRIX};

const OP_UNDEF: u32 = 1;
const OP_NAME: u32 = 5;
const OP_TYPE_INT: u32 = 21;
const OP_TYPE_ARRAY: u32 = 28;
const OP_TYPE_FUNCTION: u32 = 33;
const OP_FUNCTION: u32 = 54;
const OP_FUNCTION_PARAMETER: u32 = 55;
const OP_FUNCTION_END: u32 = 56;
const OP_DECORATE: u32 = 71;
const OP_COMPOSITE_CONSTRUCT: u32 = 80;
const OP_COMPOSITE_EXTRACT: u32 = 81;
const OP_COMPOSITE_INSERT: u32 = 82;
const OP_LABEL: u32 = 248;
const OP_RETURN_VALUE: u32 = 254;
const OP_COOP_MATRIX_LENGTH: u32 = 4460;

/// What a placeholder's body becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Placeholder {
    Elements,
    FromElements,
    Length,
}

impl Placeholder {
    fn from_name(name: &str) -> Option<Self> {
        if name.starts_with("coop_from_elements_") {
            Some(Placeholder::FromElements)
        } else if name.starts_with("coop_elements_") {
            Some(Placeholder::Elements)
        } else if name.starts_with("coop_length_") {
            Some(Placeholder::Length)
        } else {
            None
        }
    }
}

/// The types a placeholder's signature may use.
struct Types {
    /// Array id → (element type, length).
    arrays: HashMap<u32, (u32, u32)>,
    /// Cooperative-matrix id → component type.
    matrices: HashMap<u32, u32>,
    /// 32-bit unsigned integer type ids.
    u32s: HashSet<u32>,
    /// Function type id → (return type, parameter types).
    functions: HashMap<u32, (u32, Vec<u32>)>,
}

fn types(words: &[u32]) -> Types {
    let mut constants = HashMap::new();
    let mut t = Types {
        arrays: HashMap::new(),
        matrices: HashMap::new(),
        u32s: HashSet::new(),
        functions: HashMap::new(),
    };
    for (at, op, count) in instructions(words) {
        let w = &words[at..at + count];
        match op {
            OP_CONSTANT if count == 4 => {
                constants.insert(w[2], w[3]);
            }
            OP_TYPE_INT if count == 4 && w[2] == 32 && w[3] == 0 => {
                t.u32s.insert(w[1]);
            }
            OP_TYPE_ARRAY if count == 4 => {
                if let Some(&length) = constants.get(&w[3]) {
                    t.arrays.insert(w[1], (w[2], length));
                }
            }
            OP_TYPE_COOP_MATRIX if count >= 3 => {
                t.matrices.insert(w[1], w[2]);
            }
            OP_TYPE_FUNCTION if count >= 3 => {
                t.functions.insert(w[1], (w[2], w[3..].to_vec()));
            }
            _ => {}
        }
    }
    t
}

/// Replaces the bodies of the module's placeholder functions (module docs), in place. Returns how
/// many it replaced.
pub(crate) fn fill_placeholders(words: &mut Vec<u32>) -> Result<usize, String> {
    let names: HashMap<u32, String> = instructions(words)
        .into_iter()
        .filter(|&(_, op, count)| op == OP_NAME && count > 2)
        .map(|(at, _, count)| (words[at + 1], literal_string(&words[at + 2..at + count])))
        .collect();
    let types = types(words);
    let mut next_id = words[3];
    let mut fresh = || {
        next_id += 1;
        next_id - 1
    };

    // Per replaced function: the offset of its first OpLabel, of its OpFunctionEnd, and the new body.
    let mut replaced: Vec<(usize, usize, Vec<u32>)> = Vec::new();
    let list = instructions(words);
    let mut i = 0;
    while i < list.len() {
        let (at, op, _) = list[i];
        i += 1;
        if op != OP_FUNCTION {
            continue;
        }
        let (return_type, function_id, function_type) = (words[at + 1], words[at + 2], words[at + 4]);
        let Some(kind) = names.get(&function_id).and_then(|n| Placeholder::from_name(n)) else {
            continue;
        };
        let name = &names[&function_id];
        let fail = |why: &str| format!("placeholder `{name}`: {why}");
        let params: Vec<u32> = list[i..]
            .iter()
            .take_while(|&&(_, o, _)| o == OP_FUNCTION_PARAMETER)
            .map(|&(p, _, _)| words[p + 2])
            .collect();
        let param_types = types
            .functions
            .get(&function_type)
            .map(|(_, p)| p.clone())
            .ok_or_else(|| fail("no function type"))?;
        if params.len() != 1 || param_types.len() != 1 {
            return Err(fail("must take exactly one argument"));
        }
        let (param, param_type) = (params[0], param_types[0]);
        let label_index = i + params.len();
        let (label_at, label_op, _) = list[label_index];
        if label_op != OP_LABEL {
            return Err(fail("no label after the parameters"));
        }
        let end_index = list[label_index..]
            .iter()
            .position(|&(_, o, _)| o == OP_FUNCTION_END)
            .map(|p| p + label_index)
            .ok_or_else(|| fail("no OpFunctionEnd"))?;

        // The array's element type and length, where `matrix` is a matrix of that element type
        // (`roles`: what the signature calls the matrix and the array).
        let components_as_array = |matrix: u32, array: u32, roles: (&str, &str)| {
            let component = *types
                .matrices
                .get(&matrix)
                .ok_or_else(|| fail(&format!("{} is not a matrix", roles.0)))?;
            let &(element, length) = types
                .arrays
                .get(&array)
                .ok_or_else(|| fail(&format!("{} is not an array", roles.1)))?;
            if element != component {
                return Err(fail("array element type differs from the matrix component type"));
            }
            Ok((element, length))
        };
        let mut body = instruction(OP_LABEL, &[words[label_at + 1]]);
        let result = match kind {
            Placeholder::Elements => {
                let (element, length) = components_as_array(param_type, return_type, ("argument", "result"))?;
                let ids: Vec<u32> = (0..length)
                    .map(|k| {
                        let id = fresh();
                        body.extend(instruction(OP_COMPOSITE_EXTRACT, &[element, id, param, k]));
                        id
                    })
                    .collect();
                let result = fresh();
                let mut operands = vec![return_type, result];
                operands.extend(ids);
                body.extend(instruction(OP_COMPOSITE_CONSTRUCT, &operands));
                result
            }
            Placeholder::FromElements => {
                let (element, length) = components_as_array(return_type, param_type, ("result", "argument"))?;
                let mut matrix = fresh();
                body.extend(instruction(OP_UNDEF, &[return_type, matrix]));
                for k in 0..length {
                    let x = fresh();
                    body.extend(instruction(OP_COMPOSITE_EXTRACT, &[element, x, param, k]));
                    let next = fresh();
                    body.extend(instruction(OP_COMPOSITE_INSERT, &[return_type, next, x, matrix, k]));
                    matrix = next;
                }
                matrix
            }
            Placeholder::Length => {
                if !types.matrices.contains_key(&param_type) {
                    return Err(fail("argument is not a matrix"));
                }
                if !types.u32s.contains(&return_type) {
                    return Err(fail("result is not u32"));
                }
                let result = fresh();
                body.extend(instruction(OP_COOP_MATRIX_LENGTH, &[return_type, result, param_type]));
                result
            }
        };
        body.extend(instruction(OP_RETURN_VALUE, &[result]));
        replaced.push((label_at, list[end_index].0, body));
        i = end_index;
    }
    if replaced.is_empty() {
        return Ok(0);
    }

    // The module with the new bodies.
    let mut out = words[..5].to_vec();
    out[3] = next_id;
    let mut skip_until = 0;
    for &(at, _, count) in &list {
        if at < skip_until {
            continue;
        }
        if let Some((_, to, body)) = replaced.iter().find(|(from, _, _)| *from == at) {
            out.extend_from_slice(body);
            skip_until = *to;
            continue;
        }
        out.extend_from_slice(&words[at..at + count]);
    }
    // Names and decorations of ids only the old bodies defined would now point at nothing. An
    // id that is still defined appears in some instruction other than a name or decoration (its
    // definition), so: drop the names and decorations whose target was in an old body and
    // appears nowhere else any more.
    let old_body_words: HashSet<u32> = replaced
        .iter()
        .flat_map(|&(from, to, _)| words[from..to].iter().copied())
        .collect();
    let is_about_an_id = |op: u32| DEBUG_AND_ANNOTATIONS.contains(&op);
    let still_used: HashSet<u32> = instructions(&out)
        .into_iter()
        .filter(|&(_, op, _)| !is_about_an_id(op))
        .flat_map(|(at, _, count)| out[at + 1..at + count].to_vec())
        .collect();
    let kept: Vec<(usize, usize)> = instructions(&out)
        .into_iter()
        .filter(|&(at, op, count)| {
            let dangling = |target: u32| old_body_words.contains(&target) && !still_used.contains(&target);
            !(is_about_an_id(op) && count > 1 && dangling(out[at + 1]))
        })
        .map(|(at, _, count)| (at, count))
        .collect();
    let mut cleaned = out[..5].to_vec();
    for (at, count) in kept {
        cleaned.extend_from_slice(&out[at..at + count]);
    }
    *words = cleaned;
    Ok(replaced.len())
}

/// Instructions whose first operand is the id they name or decorate: OpName, OpMemberName,
/// OpDecorate, OpMemberDecorate, OpDecorateId, OpDecorateString, OpMemberDecorateString.
const DEBUG_AND_ANNOTATIONS: [u32; 7] = [OP_NAME, 6, OP_DECORATE, 72, 332, 5632, 5633];

#[cfg(test)]
mod tests {
    use super::*;

    const MODULE: &str = r#"
enable f16;
enable wgpu_cooperative_matrix;
var<workgroup> m: array<vec4<f32>, 64>;
var<workgroup> h: array<vec4<f16>, 64>;
@group(0) @binding(0) var<storage, read_write> out: array<f32>;

fn coop_elements_c(x: coop_mat16x16<f32, C>) -> array<f32, 8> {
    return array<f32, 8>();
}
fn coop_from_elements_a(x: array<f16, 8>) -> coop_mat16x16<f16, A> {
    return coop_mat16x16<f16, A>();
}
fn coop_length_c(x: coop_mat16x16<f32, C>) -> u32 {
    return 0u;
}

@compute @workgroup_size(32)
fn main(@builtin(local_invocation_index) li: u32) {
    let c = coopLoadT<coop_mat16x16<f32, C>>(&m[0], 4u);
    let e = coop_elements_c(c);
    var half_e: array<f16, 8>;
    for (var i = 0u; i < 8u; i++) { half_e[i] = f16(e[i]); }
    let a = coop_from_elements_a(half_e);
    let b = coopLoad<coop_mat16x16<f16, B>>(&h[0], 4u);
    coopStoreT(coopMultiplyAdd(a, b, c), &m[0], 4u);
    out[li] = e[li % 8u] + f32(coop_length_c(c));
}
"#;

    fn count(words: &[u32], wanted: u32) -> usize {
        instructions(words).iter().filter(|&&(_, op, _)| op == wanted).count()
    }

    #[test]
    fn placeholder_bodies_become_component_access() {
        let words = crate::spirv::compile("test", MODULE).unwrap();
        // 8 extracts (elements), 8 extracts and 8 inserts (from elements).
        assert!(count(&words, OP_COMPOSITE_INSERT) == 8, "inserts");
        assert!(count(&words, OP_COMPOSITE_EXTRACT) >= 16, "extracts");
        assert_eq!(count(&words, OP_COOP_MATRIX_LENGTH), 1);
        assert_eq!(count(&words, OP_UNDEF), 1);
    }

    /// A placeholder body with a named local: its name goes with it, and every name left points
    /// at an id the module still uses.
    #[test]
    fn names_of_what_the_old_bodies_defined_go_with_them() {
        let src = MODULE.replace(
            "fn coop_elements_c(x: coop_mat16x16<f32, C>) -> array<f32, 8> {\n    return array<f32, 8>();",
            "fn coop_elements_c(x: coop_mat16x16<f32, C>) -> array<f32, 8> {\n    var scratch_name = array<f32, 8>();\n    scratch_name[1] = 2.0;\n    return scratch_name;",
        );
        assert!(src.contains("scratch_name"));
        let words = crate::spirv::compile("test", &src).unwrap();
        let used: HashSet<u32> = instructions(&words)
            .into_iter()
            .filter(|&(_, op, _)| !DEBUG_AND_ANNOTATIONS.contains(&op))
            .flat_map(|(at, _, count)| words[at + 1..at + count].to_vec())
            .collect();
        let names: Vec<(u32, String)> = instructions(&words)
            .into_iter()
            .filter(|&(_, op, count)| op == OP_NAME && count > 2)
            .map(|(at, _, count)| (words[at + 1], literal_string(&words[at + 2..at + count])))
            .collect();
        assert!(names.iter().all(|(n, _)| *n != 0) && !names.is_empty());
        assert!(!names.iter().any(|(_, name)| name == "scratch_name"), "{names:?}");
        for (id, name) in &names {
            assert!(used.contains(id), "OpName {name} points at an id nothing defines");
        }
    }

    #[test]
    fn a_placeholder_with_a_wrong_signature_is_an_error() {
        let src = MODULE
            .replace(
                "fn coop_length_c(x: coop_mat16x16<f32, C>) -> u32 {\n    return 0u;",
                "fn coop_length_c(x: coop_mat16x16<f32, C>) -> f32 {\n    return 0.0;",
            )
            .replace("f32(coop_length_c(c))", "coop_length_c(c)");
        let err = crate::spirv::compile("test", &src).unwrap_err().to_string();
        assert!(err.contains("coop_length_c") && err.contains("u32"), "{err}");
    }
}
