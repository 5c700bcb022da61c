//! SPIR-V for the cooperative-matrix kernel, with workgroup memory made coherent.
//!
//! Cooperative matrices make naga emit the Vulkan memory model. Under that model a plain load or
//! store is *private* to its invocation unless it carries the `NonPrivatePointer` memory operand,
//! and a barrier orders only non-private accesses, and only makes them visible when its semantics
//! include `MakeAvailable` and `MakeVisible`. naga 30 emits neither, so the writes that invocations
//! make to workgroup memory (staged K and V, probabilities) are not guaranteed to be seen by the
//! cooperative loads of other invocations after a `workgroupBarrier()`, nor the cooperative stores
//! (scores) by the invocations. On the H200 the kernel read stale data. The fix: compile the WGSL
//! with naga here, mark every workgroup-memory access non-private, give every workgroup barrier
//! `MakeAvailable | MakeVisible`, and hand the SPIR-V to wgpu as a passthrough module.
//!
//! Subgroup barriers get the same treatment and workgroup memory in their semantics: naga's
//! `subgroupBarrier()` orders only subgroup memory, while the kernel uses it to hand a
//! subgroup's own rows of workgroup memory (its scores and probabilities) between its
//! invocations and its cooperative loads and stores.
//!
//! Cooperative matrices get one operation WGSL cannot spell: the component-wise product of two
//! accumulator matrices (SPIR-V's `OpFMul` on cooperative matrices), with which the kernel scales
//! each output row by its own factor. The kernel writes it as a subtraction, the only one it does
//! on matrices, and every `OpFSub` on a cooperative-matrix type becomes `OpFMul` here.
//!
//! naga's uniformity analysis is also relaxed here: it asks cooperative operations for control
//! flow that is uniform over the whole workgroup, while `VK_KHR_cooperative_matrix` asks for
//! uniformity over the subgroup (its scope), and the kernel branches on subgroup-uniform values
//! (`subgroupAny`). Everything else is validated as usual.

use crate::spirv::words::{instructions, OP_CONSTANT, OP_TYPE_COOP_MATRIX};

const OP_TYPE_POINTER: u32 = 32;
const OP_VARIABLE: u32 = 59;
const OP_LOAD: u32 = 61;
const OP_STORE: u32 = 62;
const OP_ACCESS_CHAIN: u32 = 65;
const OP_IN_BOUNDS_ACCESS_CHAIN: u32 = 66;
const OP_PTR_ACCESS_CHAIN: u32 = 67;
const OP_FSUB: u32 = 131;
const OP_FMUL: u32 = 133;
const OP_CONTROL_BARRIER: u32 = 224;
const OP_COOP_LOAD: u32 = 4457;
const OP_COOP_STORE: u32 = 4458;

const STORAGE_CLASS_WORKGROUP: u32 = 4;
const MEMORY_OPERAND_NON_PRIVATE_POINTER: u32 = 0x20;
const SEMANTICS_SUBGROUP_MEMORY: u32 = 0x80;
const SEMANTICS_WORKGROUP_MEMORY: u32 = 0x100;
const SEMANTICS_MAKE_AVAILABLE_AND_VISIBLE: u32 = 0x2000 | 0x4000;

/// What the rewrite does to the barriers (the accesses are always made non-private). The
/// library uses [`Coherence::FULL`]; the others exist for the probes that measure what each part
/// costs (examples/coop_diagnostics.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Coherence {
    /// Workgroup barriers make workgroup memory available and visible.
    pub workgroup_barrier_visible: bool,
    /// Memory semantics of subgroup barriers.
    pub subgroup_barrier: SubgroupBarrier,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
// Only the diagnostics (examples/coop_diagnostics.rs) construct the weaker variants.
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
pub enum SubgroupBarrier {
    /// Workgroup memory ordered, made available and visible (what the memory model asks).
    Visible,
    /// Workgroup memory ordered (acquire-release), without availability and visibility.
    Ordered,
    /// No memory semantics: execution only.
    ExecutionOnly,
}

impl Coherence {
    pub const FULL: Coherence = Coherence {
        workgroup_barrier_visible: true,
        subgroup_barrier: SubgroupBarrier::Visible,
    };
}

/// The rewrite described in the module docs, in place.
pub(crate) fn rewrite(words: &mut Vec<u32>, coherence: Coherence) -> std::result::Result<(), String> {
    if words.len() < 5 || words[0] != 0x0723_0203 {
        return Err("not a SPIR-V module".into());
    }
    // 1. Which ids are pointers into workgroup memory, and the integer constants by id.
    let mut workgroup_pointer_types = std::collections::HashSet::new();
    let mut workgroup_pointers = std::collections::HashSet::new();
    let mut constants = std::collections::HashMap::new();
    for &(at, op, count) in &instructions(words) {
        let w = &words[at..at + count];
        match op {
            OP_TYPE_POINTER if w[2] == STORAGE_CLASS_WORKGROUP => {
                workgroup_pointer_types.insert(w[1]);
            }
            OP_VARIABLE | OP_ACCESS_CHAIN | OP_IN_BOUNDS_ACCESS_CHAIN | OP_PTR_ACCESS_CHAIN
                if workgroup_pointer_types.contains(&w[1]) =>
            {
                workgroup_pointers.insert(w[2]);
            }
            OP_CONSTANT if count == 4 => {
                constants.insert(w[2], (at, w[1], w[3]));
            }
            _ => {}
        }
    }

    // 2. Barrier semantics: each distinct semantics constant gets a twin with the extra bits,
    //    declared right after it; the barriers point to the twin.
    let mut next_id = words[3];
    let mut twins: std::collections::HashMap<u32, u32> = std::collections::HashMap::new();
    let mut insertions: Vec<(usize, [u32; 4])> = Vec::new();
    let mut rewrites: Vec<(usize, Vec<u32>)> = Vec::new();
    for &(at, op, count) in &instructions(words) {
        let w = &words[at..at + count];
        match op {
            OP_CONTROL_BARRIER => {
                let semantics_id = w[3];
                let Some(&(const_at, ty, value)) = constants.get(&semantics_id) else {
                    return Err("a barrier's semantics are not a plain constant".into());
                };
                let new_value = if value & SEMANTICS_SUBGROUP_MEMORY != 0 {
                    match coherence.subgroup_barrier {
                        SubgroupBarrier::Visible => {
                            value | SEMANTICS_WORKGROUP_MEMORY | SEMANTICS_MAKE_AVAILABLE_AND_VISIBLE
                        }
                        SubgroupBarrier::Ordered => value | SEMANTICS_WORKGROUP_MEMORY,
                        SubgroupBarrier::ExecutionOnly => 0,
                    }
                } else if value & SEMANTICS_WORKGROUP_MEMORY != 0 && coherence.workgroup_barrier_visible {
                    value | SEMANTICS_MAKE_AVAILABLE_AND_VISIBLE
                } else {
                    continue;
                };
                let twin = *twins.entry(semantics_id).or_insert_with(|| {
                    let id = next_id;
                    next_id += 1;
                    insertions.push((const_at + 4, [(4 << 16) | OP_CONSTANT, ty, id, new_value]));
                    id
                });
                rewrites.push((at, vec![w[0], w[1], w[2], twin]));
            }
            // Load: result type, result, pointer, [memory operands]. Store: pointer, object, [..].
            OP_LOAD | OP_STORE => {
                let (pointer, operands_at) = if op == OP_LOAD { (w[3], 4) } else { (w[1], 3) };
                if workgroup_pointers.contains(&pointer) {
                    rewrites.push((at, with_non_private(w, operands_at)));
                }
            }
            // Cooperative load: result type, result, pointer, layout, stride, [memory operands].
            // Cooperative store: pointer, object, layout, stride, [memory operands].
            OP_COOP_LOAD | OP_COOP_STORE => {
                let (pointer, operands_at) = if op == OP_COOP_LOAD { (w[3], 6) } else { (w[1], 5) };
                if workgroup_pointers.contains(&pointer) {
                    if count < operands_at {
                        return Err("a cooperative load or store has no stride operand".into());
                    }
                    rewrites.push((at, with_non_private(w, operands_at)));
                }
            }
            _ => {}
        }
    }

    // 3. Rebuild the word stream with the rewritten instructions and inserted constants.
    let rewrites: std::collections::HashMap<usize, Vec<u32>> = rewrites.into_iter().collect();
    let mut inserted: std::collections::HashMap<usize, Vec<[u32; 4]>> = std::collections::HashMap::new();
    for (at, instruction) in insertions {
        inserted.entry(at).or_default().push(instruction);
    }
    let mut out = words[..5].to_vec();
    out[3] = next_id;
    for (at, _, count) in instructions(words) {
        if let Some(extra) = inserted.get(&at) {
            extra.iter().for_each(|i| out.extend_from_slice(i));
        }
        match rewrites.get(&at) {
            Some(new) => out.extend_from_slice(new),
            None => out.extend_from_slice(&words[at..at + count]),
        }
    }
    *words = out;
    Ok(())
}

/// Every `OpFSub` whose result is a cooperative matrix becomes `OpFMul` (same operands), see the
/// module docs.
pub(crate) fn componentwise_products(words: &mut [u32]) {
    let matrix_types = cooperative_matrix_types(words);
    for (at, op, count) in instructions(words) {
        if op == OP_FSUB && count == 5 && matrix_types.contains(&words[at + 1]) {
            words[at] = (words[at] & 0xffff_0000) | OP_FMUL;
        }
    }
}

/// The ids of the module's cooperative-matrix types.
fn cooperative_matrix_types(words: &[u32]) -> std::collections::HashSet<u32> {
    instructions(words)
        .into_iter()
        .filter(|&(_, op, count)| op == OP_TYPE_COOP_MATRIX && count > 1)
        .map(|(at, _, _)| words[at + 1])
        .collect()
}

/// An instruction with `NonPrivatePointer` added to the memory operands that start at word
/// `operands_at` (appended as a new mask when the instruction has none).
fn with_non_private(w: &[u32], operands_at: usize) -> Vec<u32> {
    let mut new = w.to_vec();
    if new.len() > operands_at {
        new[operands_at] |= MEMORY_OPERAND_NON_PRIVATE_POINTER;
    } else {
        new.push(MEMORY_OPERAND_NON_PRIVATE_POINTER);
        let count = new.len() as u32;
        new[0] = (count << 16) | (new[0] & 0xffff);
    }
    new
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spirv::compile;

    const KERNEL: &str = r#"
enable f16;
enable wgpu_cooperative_matrix;
var<workgroup> tile: array<f16, 256>;
var<workgroup> out_tile: array<f32, 256>;
@group(0) @binding(0) var<storage, read_write> result: array<f32>;
@compute @workgroup_size(32)
fn main(@builtin(local_invocation_index) li: u32) {
    for (var i = li; i < 256u; i += 32u) { tile[i] = f16(i); }
    workgroupBarrier();
    let a = coopLoadT<coop_mat16x16<f16, A>>(&tile[0], 16u);
    let b = coopLoad<coop_mat16x16<f16, B>>(&tile[0], 16u);
    coopStoreT(coopMultiplyAdd(a, b, coop_mat16x16<f32, C>()), &out_tile[0], 16u);
    subgroupBarrier();
    result[li] = out_tile[li];
}
"#;

    #[test]
    fn every_workgroup_access_becomes_non_private_and_barriers_make_writes_visible() {
        let words = compile("test", KERNEL).unwrap();
        let mut loads_stores = 0;
        let mut barriers = 0;
        let constants: std::collections::HashMap<u32, u32> = instructions(&words)
            .into_iter()
            .filter(|&(_, op, n)| op == OP_CONSTANT && n == 4)
            .map(|(at, _, _)| (words[at + 2], words[at + 3]))
            .collect();
        for (at, op, count) in instructions(&words) {
            let w = &words[at..at + count];
            match op {
                OP_COOP_LOAD => {
                    assert!(count > 6 && w[6] & MEMORY_OPERAND_NON_PRIVATE_POINTER != 0);
                    loads_stores += 1;
                }
                OP_COOP_STORE => {
                    assert!(count > 5 && w[5] & MEMORY_OPERAND_NON_PRIVATE_POINTER != 0);
                    loads_stores += 1;
                }
                OP_CONTROL_BARRIER => {
                    // Workgroup and subgroup barriers alike cover workgroup memory and make it
                    // visible.
                    let semantics = constants[&w[3]];
                    let wanted = SEMANTICS_WORKGROUP_MEMORY | SEMANTICS_MAKE_AVAILABLE_AND_VISIBLE;
                    assert_eq!(semantics & wanted, wanted);
                    barriers += 1;
                }
                _ => {}
            }
        }
        assert_eq!((loads_stores, barriers), (3, 2));
        // The invocations' own stores to `tile` and loads from `out_tile` are marked too.
        let marked = |op: u32, operands_at: usize| {
            instructions(&words)
                .into_iter()
                .filter(|&(at, o, n)| {
                    o == op && n > operands_at && words[at + operands_at] & MEMORY_OPERAND_NON_PRIVATE_POINTER != 0
                })
                .count()
        };
        assert!(marked(OP_STORE, 3) >= 1 && marked(OP_LOAD, 4) >= 1);
        // The module still validates as SPIR-V structure: ids stay below the new bound.
        assert!(instructions(&words)
            .iter()
            .all(|&(at, op, _)| op != OP_CONSTANT || words[at + 2] < words[3]));
    }

    /// The one matrix subtraction (`componentwise_product`) of the forward and decode kernels
    /// becomes a product in every configuration, and no other matrix subtraction exists to be
    /// turned into one by mistake.
    #[test]
    fn the_cooperative_kernel_has_exactly_one_componentwise_product() {
        let forward = crate::plan::all_coop_configs()
            .into_iter()
            .map(crate::wgsl::KernelConfig::FlashCoop);
        let decode = crate::plan::all_decode_configs()
            .into_iter()
            .filter(|c| c.is_coop())
            .map(crate::wgsl::KernelConfig::Decode);
        for kernel in forward.chain(decode) {
            let words = compile(&kernel.name(), &kernel.source()).unwrap();
            let matrix_types = cooperative_matrix_types(&words);
            let on_matrices = |op: u32| {
                instructions(&words)
                    .into_iter()
                    .filter(|&(at, o, _)| o == op && matrix_types.contains(&words[at + 1]))
                    .count()
            };
            assert_eq!(
                (on_matrices(OP_FMUL), on_matrices(OP_FSUB)),
                (1, 0),
                "{}",
                kernel.name()
            );
        }
    }

    #[test]
    fn matrix_subtraction_becomes_a_componentwise_product_and_float_subtraction_stays() {
        let kernel = "enable f16;\nenable wgpu_cooperative_matrix;\n\
            var<workgroup> m: array<vec4<f32>, 128>;\n\
            @compute @workgroup_size(32) fn main(@builtin(local_invocation_index) li: u32) {\n\
                let a = coopLoadT<coop_mat16x16<f32, C>>(&m[0], 4u);\n\
                coopStoreT(a - a, &m[64], 4u);\n\
                m[li].x = m[li].y - m[li].z;\n\
            }\n";
        let words = compile("test", kernel).unwrap();
        let count = |op: u32| instructions(&words).iter().filter(|&&(_, o, _)| o == op).count();
        assert_eq!((count(OP_FMUL), count(OP_FSUB)), (1, 1));
    }
}
