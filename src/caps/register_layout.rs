//! Where a device keeps the components of a 16×16 cooperative matrix, measured once per device.
//!
//! `VK_KHR_cooperative_matrix` leaves it to the implementation which row and column each of an
//! invocation's components is. The cooperative-matrix kernel can keep its scores in registers (no round trip
//! through workgroup memory) when the layout has the shape FlashAttention-2 relies on for
//! `mma.sync`, which this module checks on the measured layout instead of assuming it:
//!
//! 1. the accumulator (C, f32) and the left operand (A, f16) put the same element in the same
//!    invocation and component, so probabilities computed in the accumulator's registers *are*
//!    the next product's A operand (converted to f16 component by component);
//! 2. every invocation's components fall into the same pattern of *row slots*: component i holds
//!    a row that depends only on the invocation and on slot(i), the same function for every
//!    invocation, and each row is held in one slot only;
//! 3. the invocations that share a row form a coset of one XOR subgroup of lane ids, so a row's
//!    max and sum are a few `subgroupShuffleXor`s over a basis of it.
//!
//! The probe (`probe`) loads matrices whose element (r, c) holds 16·r + c, reads back every
//! invocation's components through the element access of src/spirv/elements.rs, and hands the
//! numbers to [`RegisterLayout::from_positions`]. The kernel then finds each of its own
//! components' row and column the same way, in registers, at its start (flash_fwd_coop.wgsl);
//! only the lane-independent facts below are compiled in.

/// Lanes of the subgroup the cooperative-matrix kernel is written for, and whose fragment layout a
/// [`RegisterLayout`] describes.
pub const COOP_SUBGROUP: u32 = 32;

/// The lane-independent facts of a device's fragment layout that the register softmax needs.
/// Only [`RegisterLayout::from_positions`] makes one, so every value is a checked layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RegisterLayout {
    /// Components each invocation holds of a 16×16 matrix (8 on a 32-wide subgroup).
    components: u32,
    /// Row slots per invocation: how many distinct rows its components cover.
    slots: u32,
    /// The row slot of each component (entries past `components` are 0).
    component_slots: [u8; COMPONENTS],
    /// A basis of the XOR subgroup of lane ids that share a row, with distinct leading bits
    /// (entries past `row_lane_mask_count` are 0).
    row_lane_masks: [u8; 5],
    row_lane_mask_count: u32,
}

/// Components per invocation of a 16×16 matrix spread over a subgroup of COOP_SUBGROUP, each
/// element held once.
pub(crate) const COMPONENTS: usize = 256 / COOP_SUBGROUP as usize;
/// Most row slots the kernel is built for (two bits each in COMPONENT_SLOT_BITS).
pub const MAX_SLOTS: u32 = 4;

impl RegisterLayout {
    /// The layout NVIDIA's Vulkan driver reports on the H200 (driver 580, `coop_layout_probe` in
    /// src/device/layout_probe.rs):
    /// lane 4g + t holds row g at columns 2t, 2t+1, 2t+8, 2t+9, then row g + 8 at the same
    /// columns (`mma.m16n8k16`'s fragments, in the driver's own component order). Selection tests,
    /// naga validation and the H200 diagnostics use it; the library measures.
    pub fn nvidia_h200() -> Self {
        let mut c = vec![0u32; 256];
        for lane in 0..32u32 {
            let (g, t) = (lane / 4, lane % 4);
            for i in 0..8u32 {
                let row = g + 8 * (i / 4);
                let col = 2 * t + i % 2 + 8 * ((i / 2) % 2);
                c[(lane * 8 + i) as usize] = 16 * row + col;
            }
        }
        Self::from_positions(&c, &c, 8).expect("the H200 layout fits")
    }

    /// Checks a measured layout (module docs). `c` and `a` hold, for each lane and component
    /// (`lane · components + i`), the element 16·row + column it holds of the accumulator and of
    /// the A operand.
    pub fn from_positions(c: &[u32], a: &[u32], components: usize) -> Result<Self, String> {
        let lanes = COOP_SUBGROUP as usize;
        if components != COMPONENTS {
            return Err(format!(
                "{components} components per invocation: not a 16x16 matrix over {lanes} lanes"
            ));
        }
        if c.len() != lanes * components || a.len() != c.len() {
            return Err("probe returned the wrong number of positions".into());
        }
        let mut seen = [false; 256];
        for &p in c {
            if p >= 256 || std::mem::replace(&mut seen[p as usize], true) {
                return Err(format!(
                    "accumulator components do not cover the matrix once (element {p})"
                ));
            }
        }
        if a != c {
            return Err("the A operand's layout differs from the accumulator's".into());
        }
        let row = |lane: usize, i: usize| c[lane * components + i] / 16;

        // Row slots, numbered by first appearance in lane 0; every lane must follow the pattern.
        let mut component_slots = [0u8; COMPONENTS];
        let mut slot_rows: Vec<u32> = Vec::new();
        for (i, slot_of_i) in component_slots.iter_mut().enumerate().take(components) {
            let r = row(0, i);
            let slot = slot_rows.iter().position(|&x| x == r).unwrap_or_else(|| {
                slot_rows.push(r);
                slot_rows.len() - 1
            });
            *slot_of_i = slot as u8;
        }
        let slots = slot_rows.len();
        if slots as u32 > MAX_SLOTS {
            return Err(format!(
                "an invocation holds {slots} rows (at most {MAX_SLOTS} supported)"
            ));
        }
        // lane_row[lane][slot]
        let mut lane_row = vec![[0u32; MAX_SLOTS as usize]; lanes];
        for (lane, rows) in lane_row.iter_mut().enumerate() {
            for i in 0..components {
                let s = component_slots[i] as usize;
                let first = (0..components).find(|&k| component_slots[k] as usize == s).unwrap();
                if row(lane, i) != row(lane, first) {
                    return Err(format!("lane {lane} holds components of different rows in one slot"));
                }
                rows[s] = row(lane, first);
            }
            for s in 0..slots {
                if (0..s).any(|t| rows[t] == rows[s]) {
                    return Err(format!("lane {lane} holds one row in two slots"));
                }
            }
        }
        // Each row in one slot only.
        let mut row_slot = [None::<usize>; 16];
        for rows in &lane_row {
            for (s, &r) in rows.iter().enumerate().take(slots) {
                match row_slot[r as usize] {
                    None => row_slot[r as usize] = Some(s),
                    Some(t) if t != s => return Err(format!("row {r} is held in slot {t} and slot {s}")),
                    _ => {}
                }
            }
        }
        // Lanes sharing a row: the XOR differences from lane 0's partners in slot 0 form a
        // subgroup M; every row's lanes must be a coset of it.
        let partners: Vec<usize> = (0..lanes).filter(|&l| lane_row[l][0] == lane_row[0][0]).collect();
        let mask_set: Vec<usize> = partners; // lane 0 ^ l = l
        let in_set = |x: usize| mask_set.contains(&x);
        if mask_set.iter().any(|&x| mask_set.iter().any(|&y| !in_set(x ^ y))) {
            return Err("the lanes sharing a row are not closed under XOR".into());
        }
        for (lane, rows) in lane_row.iter().enumerate() {
            for (s, &row) in rows.iter().enumerate().take(slots) {
                let group: Vec<usize> = (0..lanes).filter(|&l| lane_row[l][s] == row).collect();
                let coset: Vec<usize> = mask_set.iter().map(|&x| lane ^ x).collect();
                if group.len() != coset.len() || coset.iter().any(|l| !group.contains(l)) {
                    return Err(format!(
                        "the lanes sharing lane {lane}'s row in slot {s} are not an XOR coset"
                    ));
                }
            }
        }
        // A basis of M, greedily in increasing order, which gives its vectors distinct leading
        // bits (a vector sharing a leading bit with an earlier one would have met their XOR,
        // smaller, first).
        let mut basis: Vec<u8> = Vec::new();
        let mut span = vec![0usize];
        let mut sorted = mask_set.clone();
        sorted.sort_unstable();
        for &x in &sorted {
            if !span.contains(&x) {
                basis.push(x as u8);
                span = span.iter().flat_map(|&y| [y, y ^ x]).collect();
            }
        }
        let mut row_lane_masks = [0u8; 5];
        row_lane_masks[..basis.len()].copy_from_slice(&basis);
        Ok(RegisterLayout {
            components: components as u32,
            slots: slots as u32,
            component_slots,
            row_lane_masks,
            row_lane_mask_count: basis.len() as u32,
        })
    }

    /// Components each invocation holds of a 16×16 matrix.
    pub fn components(&self) -> u32 {
        self.components
    }

    /// Distinct rows an invocation's components cover.
    pub fn slots(&self) -> u32 {
        self.slots
    }

    /// The row slot of each component.
    pub fn component_slots(&self) -> &[u8] {
        &self.component_slots[..self.components as usize]
    }

    /// A basis (XOR) of the lane differences within a row's lanes: the shuffles of a row
    /// reduction.
    pub fn row_lane_masks(&self) -> &[u8] {
        &self.row_lane_masks[..self.row_lane_mask_count as usize]
    }

    /// The WGSL constants flash_fwd_coop.wgsl's register softmax is compiled with, its fragments
    /// of `components` components (this layout's own, unless the module only compiles the
    /// register code without running it: CoopConfig::compiled_components).
    pub(crate) fn wgsl_constants(&self, components: u32) -> String {
        let bits = |values: &[u8], width: u32| {
            values
                .iter()
                .enumerate()
                .fold(0u64, |acc, (i, &v)| acc | (u64::from(v) << (width * i as u32)))
        };
        let slot_bits = bits(self.component_slots(), 2);
        let masks = self.row_lane_masks();
        let mask_bits = bits(masks, 5);
        // The basis has distinct leading bits (from_positions builds it so): the one lane of each
        // coset with all of them clear leads its row.
        let leader_bits = masks.iter().fold(0u32, |acc, &m| acc | 1 << (7 - m.leading_zeros()));
        format!(
            "const COOP_COMPONENTS: u32 = {}u;\nconst ROW_SLOTS: u32 = {}u;\n\
             const COMPONENT_SLOT_BITS: u32 = {}u;\nconst ROW_LANE_MASK_BITS: u32 = {}u;\n\
             const ROW_LANE_MASK_COUNT: u32 = {}u;\nconst ROW_LEADER_BITS: u32 = {}u;\n",
            components, self.slots, slot_bits, mask_bits, self.row_lane_mask_count, leader_bits
        )
    }

    /// A short tag for kernel names.
    pub(crate) fn tag(&self) -> String {
        let slots: String = self.component_slots().iter().map(|s| char::from(b'0' + s)).collect();
        let masks: Vec<String> = self.row_lane_masks().iter().map(|m| m.to_string()).collect();
        format!("regs{slots}x{}", masks.join("."))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_h200_layout_has_two_row_slots_shared_by_lane_quads() {
        let l = RegisterLayout::nvidia_h200();
        assert_eq!((l.components, l.slots), (8, 2));
        assert_eq!(&l.component_slots[..8], &[0, 0, 0, 0, 1, 1, 1, 1]);
        assert_eq!(&l.row_lane_masks[..l.row_lane_mask_count as usize], &[1, 2]);
        assert_eq!(l.tag(), "regs00001111x1.2");
    }

    /// Lane l holding row l % 16, columns 8·(l / 16) .. + 8: one slot, rows shared by lanes l and
    /// l ^ 16.
    /// `mma.m16n8k16`'s fragments in PTX's component order (lane 4g + t: (g, 2t), (g, 2t+1),
    /// (g+8, 2t), (g+8, 2t+1), then 8 columns on), or transposed.
    fn mma_positions(transposed: bool) -> Vec<u32> {
        let mut c = vec![0u32; 256];
        for lane in 0..32u32 {
            for i in 0..8u32 {
                let (row, col) = ((lane / 4) + 8 * ((i / 2) % 2), 2 * (lane % 4) + i % 2 + 8 * (i / 4));
                c[(lane * 8 + i) as usize] = if transposed { 16 * col + row } else { 16 * row + col };
            }
        }
        c
    }

    /// Lane l holds row l % 16, columns 8·(l / 16) .. + 8.
    fn row_major_positions() -> Vec<u32> {
        (0..32u32)
            .flat_map(|l| (0..8).map(move |i| 16 * (l % 16) + 8 * (l / 16) + i))
            .collect()
    }

    /// The kernel compiles (naga, then the SPIR-V passes) for layouts other than the H200's: one
    /// row slot shared by lanes l and l ^ 16, four slots shared by lanes with the same l % 4, and
    /// PTX's component order. (Whether it computes right on them needs a device that has them.)
    #[test]
    fn the_kernel_compiles_for_other_layouts() {
        let layouts = [
            RegisterLayout::from_positions(&row_major_positions(), &row_major_positions(), 8).unwrap(),
            RegisterLayout::from_positions(&mma_positions(true), &mma_positions(true), 8).unwrap(),
            RegisterLayout::from_positions(&mma_positions(false), &mma_positions(false), 8).unwrap(),
        ];
        for layout in layouts {
            for (bm, bn, d) in [(128, 64, 128), (64, 32, 64), (128, 32, 256)] {
                let config = crate::plan::CoopConfig::new(bm, bn, d).with_register_layout(Some(layout));
                let kernel = crate::wgsl::KernelConfig::FlashCoop(config);
                crate::spirv::compile(&kernel.name(), &kernel.source())
                    .unwrap_or_else(|e| panic!("{}: {e}", kernel.name()));
            }
        }
    }

    #[test]
    fn a_row_major_layout_fits_with_one_slot() {
        let c = row_major_positions();
        let l = RegisterLayout::from_positions(&c, &c, 8).unwrap();
        assert_eq!((l.slots, l.row_lane_mask_count, l.row_lane_masks[0]), (1, 1, 16));
    }

    /// The transposed mma layout: each lane holds 4 rows (two adjacent ones, and 8 on), each row
    /// shared by the 8 lanes with the same lane % 4.
    #[test]
    fn a_transposed_mma_layout_fits_with_four_slots() {
        let c = mma_positions(true);
        let l = RegisterLayout::from_positions(&c, &c, 8).unwrap();
        assert_eq!((l.slots, &l.component_slots[..8]), (4, &[0, 1, 0, 1, 2, 3, 2, 3][..]));
        assert_eq!(&l.row_lane_masks[..l.row_lane_mask_count as usize], &[4, 8, 16]);
    }

    #[test]
    fn layouts_the_register_softmax_cannot_use_are_refused() {
        let mma = mma_positions;
        // A laid out differently from C.
        let err = RegisterLayout::from_positions(&mma(false), &mma(true), 8).unwrap_err();
        assert!(err.contains("A operand"), "{err}");
        // An element held twice.
        let mut twice = mma(false);
        twice[3] = twice[2];
        assert!(RegisterLayout::from_positions(&twice, &twice, 8)
            .unwrap_err()
            .contains("once"));
        // Wrong component count (AMD's A operand is replicated: 16 per lane).
        assert!(RegisterLayout::from_positions(&[0; 512], &[0; 512], 16).is_err());
    }

    #[test]
    fn the_kernel_constants_encode_slots_and_masks() {
        let s = RegisterLayout::nvidia_h200().wgsl_constants(8);
        // Slots 0,0,0,0,1,1,1,1 two bits each: 0b0101_0101 << 8 = 21760; masks 1 | 2 << 5 = 65.
        assert!(
            s.contains("COMPONENT_SLOT_BITS: u32 = 21760u") && s.contains("ROW_LANE_MASK_BITS: u32 = 65u"),
            "{s}"
        );
        assert!(s.contains("ROW_LEADER_BITS: u32 = 3u"), "{s}");
    }
}
