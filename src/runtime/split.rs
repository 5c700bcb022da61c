//! Problems larger than one binding or one dispatch, run as several dispatches over parts of the
//! problem: ranges of the batch, of the heads, or (forward only) of the query rows. Each part is
//! an ordinary problem of its own (a smaller shape, the same strides) whose tensors start at an
//! offset into the caller's tensors, so its result is exactly the rows of the whole result it
//! covers. What the planning needs of a device is one question, "does this part fit?", asked by
//! the caller; the planning itself is pure.
//!
//! Which parts keep the computation unchanged:
//! - whole batch entries: always;
//! - ranges of query heads within one batch entry: for the forward, whole groups of the heads that
//!   share a K/V head, or a range inside one group (its one K/V head); for the backward only whole
//!   groups, since dK and dV sum over the group's query heads;
//! - ranges of query rows of one batch entry (forward only: the backward sums dK and dV over all
//!   rows): the rows keep their position relative to the keys through the causal offset the
//!   kernel is given ([`Part::causal_offset`]), so masks and windows see the same keys.
//!
//! The keys of one (batch entry, K/V head) are never split (that would need the merge of partial
//! results); where they alone exceed a binding the problem is refused, naming the tensor.
//!
//! Per-head terms (src/problem/head_terms.rs) keep a problem's heads together: a part always has
//! all `num_heads` query heads ([`keeps_heads_whole`]). ALiBi's geometric slope depends on the
//! absolute head index and the head count, and the kernels index the `alibi_slopes` and `sinks`
//! tensors by head from their binding's start, which a part could only move by a multiple of the
//! device's storage offset alignment, so a part of fewer heads would read other heads' terms. With
//! every head, a part reads the whole call's tensors unchanged, and its batch entries and query
//! rows are split as for any problem (ALiBi takes a row's position from the causal offset, as the
//! mask does). The backward's gradient kernels read only the slopes (the LSE holds the sinks), so
//! there sinks alone do not keep heads together; their gradient `dL/ds_h` sums over every batch
//! entry and row, which the host backward adds up over its parts and the caller's-buffers
//! backward refuses to split (each part's kernel would overwrite `d_sinks` with its own sum).
//!
//! Dropout's mask is drawn from each element's position in the caller's problem (batch entry,
//! head, row, key: src/problem/dropout.rs), so a part is told where it starts ([`Placement`],
//! `Params::part_*`) and draws the whole's bits. The generator decides rows in pairs, and a
//! kernel's invocation owns pairs that start at even rows of its dispatch: row parts of a problem
//! with dropout start at even rows.

use crate::caps::Caps;
use crate::error::{Error, Result};
use crate::gpu::binding::TensorBuffer;
use crate::plan::missing_features;
use crate::problem::features::{Feature, FeatureSet};
use crate::problem::score_bias::BiasLayout;
use crate::problem::{AttentionMask, AttentionProblem, AttentionShape, ScoreBias, Tensor, TensorLayout};

/// The features a part computes exactly as the whole does: none of them depends on a row's batch
/// entry, the per-head terms (ALiBi, sinks) only on its head, which parts of every head keep
/// ([`keeps_heads_whole`]), dropout on positions a part is told ([`Placement`]), and a score bias
/// or mask tensor on elements a part's layout reaches from its own first one
/// ([`Part::problem`]). Anything else (the index tensors of packed batches, paged caches and key
/// counts, which are per batch entry and would need offsets of their own; a mask's block summary,
/// whose 32-row blocks a part's rows need not start) keeps a problem whole. (The score bias's
/// gradient, a sum over the dimensions the bias broadcasts, is refused by the backward's split.)
pub(crate) const SPLIT_FEATURES: FeatureSet = FeatureSet::of(&[
    Feature::Dropout,
    Feature::Bias,
    Feature::Mask,
    Feature::CausalMask,
    Feature::GroupedKv,
    Feature::ArbitraryScale,
    Feature::SlidingWindow,
    Feature::SoftCap,
    Feature::Alibi,
    Feature::Sinks,
]);

/// Whether `problem` may be split into parts at all: its features are all [`SPLIT_FEATURES`].
pub(crate) fn splittable(problem: &AttentionProblem) -> bool {
    problem.features().missing_from(SPLIT_FEATURES).is_empty()
}

/// Whether every part of `whole` must have all its query heads: where `pass` reads a per-head
/// term, ALiBi's slopes (forward and backward) or the sinks (forward; the backward's gradient
/// kernels find them in the LSE). See the module's documentation.
pub(crate) fn keeps_heads_whole(whole: &AttentionProblem, pass: Pass) -> bool {
    whole.alibi.is_some() || (whole.sinks && pass == Pass::Forward)
}

/// The most dispatches one call is split into: each records a pass with its own uniform and bind
/// group, so a split finer than this is a problem no device should be asked to run this way.
pub(crate) const MAX_PARTS: usize = 1 << 16;

/// Which pass is split; the backward's parts keep all query rows and whole K/V head groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pass {
    Forward,
    Backward,
}

/// One dispatch's share of a problem: batch entries `b0..b0 + nb`, query heads `h0..h0 + nh`,
/// query rows `q0..q0 + nq`. A part with several batch entries has all heads, one with several
/// heads or fewer than all rows has one batch entry, and one with fewer than all rows has heads of
/// at most one K/V head group or whole groups — so the part's LSE rows are `nb·nh` runs of `nq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Part {
    pub b0: usize,
    pub nb: usize,
    pub h0: usize,
    pub nh: usize,
    pub q0: usize,
    pub nq: usize,
}

impl Part {
    /// The part's own problem: its sizes, the whole problem's strides and everything else; its
    /// score bias and mask start at the part's first element of the whole's (a broadcast
    /// dimension, stride 0, moves nothing).
    pub fn problem(&self, whole: &AttentionProblem) -> AttentionProblem {
        let group = whole.group_size();
        // Below the whole tensor's validated extent: no overflow.
        let first = |l: BiasLayout| BiasLayout {
            offset: l.offset + self.b0 * l.batch_stride + self.h0 * l.head_stride + self.q0 * l.row_stride,
            ..l
        };
        AttentionProblem {
            bias: whole.bias.map(|b| ScoreBias {
                layout: first(b.layout),
                ..b
            }),
            mask: whole.mask.map(|m| AttentionMask {
                layout: first(m.layout),
            }),
            shape: AttentionShape {
                batch: self.nb,
                seq_q: self.nq,
                num_heads: self.nh,
                // A range inside one group reads that group's one K/V head.
                num_kv_heads: (self.nh / group).max(1),
                ..whole.shape
            },
            ..*whole
        }
    }

    /// Elements from the whole tensor's element (0, 0, 0, 0) to the part's.
    pub fn element_offset(&self, whole: &AttentionProblem, tensor: Tensor) -> usize {
        let kv = matches!(tensor, Tensor::K | Tensor::V);
        self.offset_in(whole.layout(tensor), kv, whole.group_size())
    }

    /// [`element_offset`](Self::element_offset) in a tensor at `layout` with rows of query heads
    /// (Q, O, dO, dQ) or, when `kv`, of K/V heads (K, V, dK, dV) of `group` query heads each.
    pub fn offset_in(&self, layout: &TensorLayout, kv: bool, group: usize) -> usize {
        let (rows, head) = if kv { (0, self.h0 / group) } else { (self.q0, self.h0) };
        // Below the whole tensor's validated extent: no overflow.
        self.b0 * layout.batch_stride + rows * layout.seq_stride + head * layout.head_stride
    }

    /// LSE values of the part: `nb·nh·nq`.
    pub fn lse_len(&self) -> usize {
        self.nb * self.nh * self.nq
    }

    /// Where the part's LSE values go in the whole LSE (`[batch, num_heads, seq_q]`): runs of
    /// `(index in the part's LSE, index in the whole's, length)`, one per (batch entry, head), or
    /// one in all where they are contiguous.
    pub fn lse_runs(&self, whole: &AttentionProblem) -> Vec<(usize, usize, usize)> {
        let s = whole.shape;
        let at = |b: usize, h: usize| (b * s.num_heads + h) * s.seq_q + self.q0;
        if self.lse_is_contiguous(whole) {
            return vec![(0, at(self.b0, self.h0), self.lse_len())];
        }
        let mut runs = Vec::with_capacity(self.nb * self.nh);
        for b in self.b0..self.b0 + self.nb {
            for h in self.h0..self.h0 + self.nh {
                runs.push((((b - self.b0) * self.nh + h - self.h0) * self.nq, at(b, h), self.nq));
            }
        }
        runs
    }

    /// Whether the part's LSE is one run of the whole's.
    pub fn lse_is_contiguous(&self, whole: &AttentionProblem) -> bool {
        self.nq == whole.shape.seq_q && (self.nh == whole.shape.num_heads || self.nb == 1)
    }
}

/// Where a dispatched problem sits in the caller's: its row 0 relative to the keys (the causal
/// offset the kernels place rows by) and its first batch entry, query head and query row (from
/// which dropout's generator counts). A whole problem sits at its own `seq_kv − seq_q` and at 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Placement {
    pub causal_offset: i64,
    pub batch: usize,
    pub head: usize,
    pub row: usize,
}

impl Placement {
    /// A whole problem's.
    pub fn whole(problem: &AttentionProblem) -> Self {
        Placement {
            causal_offset: problem.causal_offset(),
            batch: 0,
            head: 0,
            row: 0,
        }
    }

    /// The placement of `part` of the problem placed at `self`.
    pub fn of_part(&self, part: &Part) -> Self {
        Placement {
            causal_offset: self.causal_offset + part.q0 as i64,
            batch: self.batch + part.b0,
            head: self.head + part.h0,
            row: self.row + part.q0,
        }
    }
}

/// The head counts a part may have, ascending: ranges inside one group (`1..group`, forward only),
/// then whole groups (`group, 2·group, .., num_heads`); only `num_heads` where the heads stay
/// together ([`keeps_heads_whole`]). Indexed rather than listed: a problem may have billions of
/// heads.
struct HeadCounts {
    group: usize,
    groups: usize,
    partial: usize,
}

impl HeadCounts {
    fn new(whole: &AttentionProblem, pass: Pass) -> Self {
        if keeps_heads_whole(whole, pass) {
            // One "group" of every head: head ranges are all heads or nothing.
            return HeadCounts {
                group: whole.shape.num_heads.max(1),
                groups: 1,
                partial: 0,
            };
        }
        let group = whole.group_size().max(1);
        HeadCounts {
            group,
            groups: whole.shape.num_heads / group,
            partial: if pass == Pass::Forward { group - 1 } else { 0 },
        }
    }

    fn len(&self) -> usize {
        self.partial + self.groups
    }

    fn get(&self, i: usize) -> usize {
        if i < self.partial {
            i + 1
        } else {
            (i - self.partial + 1) * self.group
        }
    }
}

/// The largest `n` in `1..=max` for which `fits(n)` holds, searched as if `fits` were monotone
/// (sizes of bindings and grids grow with a part); `None` if not even 1 fits. The answer always
/// fits, monotone or not.
fn largest(max: usize, mut fits: impl FnMut(usize) -> bool) -> Option<usize> {
    if max == 0 || !fits(1) {
        return None;
    }
    let (mut lo, mut hi) = (1, max);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    Some(lo)
}

/// The parts of `whole`, in order, each of which `fits`: whole batch entries if one fits, else
/// head ranges of one batch entry, else (forward) row ranges of such head ranges. `too_large` is
/// why the whole did not fit; the error when no split works names it and what the smallest part
/// still needs.
pub(crate) fn plan(
    whole: &AttentionProblem,
    pass: Pass,
    too_large: &str,
    mut fits: impl FnMut(&Part) -> Result<()>,
) -> Result<Vec<Part>> {
    let refuse = |why: String| {
        Error::TooLarge(format!(
            "{too_large}; the problem cannot be split into smaller dispatches: {why}"
        ))
    };
    // Packed batches and paged or counted keys are features too: their index tensors are per
    // batch entry and would need offsets of their own.
    if let Some(why) = missing_features("a split into several dispatches", whole.features(), SPLIT_FEATURES) {
        return Err(refuse(why));
    }
    let s = whole.shape;
    let heads = HeadCounts::new(whole, pass);
    // Row parts come in multiples of `row_step` rows (dropout's row pairs: the module's docs).
    let row_step = if whole.active_dropout().is_some() { 2 } else { 1 };
    let rows = |steps: usize| (steps * row_step).min(s.seq_q);
    let part = |nb, nh, nq| Part {
        b0: 0,
        nb,
        h0: 0,
        nh,
        q0: 0,
        nq,
    };
    // The shape of the parts, as (batch entries, index into `heads`, rows), in the order tried:
    // the fewest dispatches first.
    let all_heads = heads.len() - 1;
    let mut shape = None;
    if let Some(nb) = largest(s.batch, |nb| fits(&part(nb, s.num_heads, s.seq_q)).is_ok()) {
        shape = Some((nb, all_heads, s.seq_q));
    } else if let Some(i) = largest(heads.len(), |i| fits(&part(1, heads.get(i - 1), s.seq_q)).is_ok()) {
        shape = Some((1, i - 1, s.seq_q));
    } else if pass == Pass::Forward {
        if let Some(i) = largest(heads.len(), |i| fits(&part(1, heads.get(i - 1), rows(1))).is_ok()) {
            let nh = heads.get(i - 1);
            let steps = largest(s.seq_q.div_ceil(row_step), |n| fits(&part(1, nh, rows(n))).is_ok()).unwrap_or(1);
            shape = Some((1, i - 1, rows(steps)));
        }
    }
    let Some((mut nb, mut hi, mut nq)) = shape else {
        let smallest = match pass {
            Pass::Forward => part(1, heads.get(0), rows(1)),
            Pass::Backward => part(1, heads.get(0), s.seq_q),
        };
        let why = fits(&smallest)
            .err()
            .map_or_else(|| "no part fits".to_string(), |e| e.to_string());
        let row = match row_step {
            1 => "one query row",
            _ => "two query rows (dropout draws rows in pairs)",
        };
        let what = match (pass, keeps_heads_whole(whole, pass)) {
            (Pass::Forward, false) => format!("{row} of one head"),
            (Pass::Forward, true) => format!("{row} of every head (ALiBi and sinks keep the heads together)"),
            (Pass::Backward, false) => "one group of heads that share a K/V head, of one batch entry,".into(),
            (Pass::Backward, true) => "every head of one batch entry (ALiBi keeps the heads together)".into(),
        };
        return Err(refuse(format!("even {what} is too large: {why}")));
    };
    // A part placed elsewhere may bind a few bytes more than the probe at the start (bindings
    // begin at an aligned offset below the tensor); shrink the split dimension until every part
    // fits.
    let shrink = |n: usize| n - (n / 8).max(1);
    loop {
        let parts = tile(whole, nb, heads.get(hi), nq, heads.group)?;
        let Some(e) = parts.iter().find_map(|p| fits(p).err()) else {
            return Ok(parts);
        };
        if nq < s.seq_q && nq > row_step {
            nq = rows(shrink(nq / row_step));
        } else if nb > 1 {
            nb = shrink(nb);
        } else if nq == s.seq_q && hi > 0 {
            hi -= 1;
        } else {
            return Err(refuse(e.to_string()));
        }
    }
}

/// The parts of `nb` batch entries, `nh` heads and `nq` rows (the last of each range shorter)
/// covering `whole`; head ranges of fewer than `group` heads stay inside their group.
fn tile(whole: &AttentionProblem, nb: usize, nh: usize, nq: usize, group: usize) -> Result<Vec<Part>> {
    let s = whole.shape;
    let head_ranges: Vec<(usize, usize)> = if nh >= group {
        (0..s.num_heads)
            .step_by(nh)
            .map(|h0| (h0, nh.min(s.num_heads - h0)))
            .collect()
    } else {
        (0..s.num_heads)
            .step_by(group)
            .flat_map(|g0| {
                (g0..g0 + group)
                    .step_by(nh)
                    .map(move |h0| (h0, nh.min(g0 + group - h0)))
            })
            .collect()
    };
    let count = s
        .batch
        .div_ceil(nb)
        .checked_mul(head_ranges.len())
        .and_then(|n| n.checked_mul(s.seq_q.div_ceil(nq)))
        .filter(|&n| n <= MAX_PARTS);
    let Some(count) = count else {
        return Err(Error::TooLarge(format!(
            "the problem would need more than {MAX_PARTS} dispatches of {nb} batch entries, {nh} heads and {nq} query rows"
        )));
    };
    let mut parts = Vec::with_capacity(count);
    for b0 in (0..s.batch).step_by(nb) {
        for &(h0, heads) in &head_ranges {
            for q0 in (0..s.seq_q).step_by(nq) {
                parts.push(Part {
                    b0,
                    nb: nb.min(s.batch - b0),
                    h0,
                    nh: heads,
                    q0,
                    nq: nq.min(s.seq_q - q0),
                });
            }
        }
    }
    Ok(parts)
}

/// `caps` without a limit on one binding's size: checking a whole call's buffers with these checks
/// everything but what a split into parts changes.
pub(crate) fn unbounded(caps: &Caps) -> Caps {
    Caps {
        max_storage_binding_bytes: u64::MAX,
        ..caps.clone()
    }
}

/// `tensor` moved `bytes` further into its buffer: a part's tensor inside the whole's. The whole
/// tensor's extent was checked, so the sum stays within its buffer.
pub(crate) fn shifted<'a>(tensor: &TensorBuffer<'a>, bytes: u64) -> TensorBuffer<'a> {
    TensorBuffer::at(tensor.buffer, tensor.byte_offset + bytes)
}

/// The timestamp writes of part `i` of `n`: the beginning of the first part's pass and the end of
/// the last's, so that the pair spans the whole call.
pub(crate) fn part_timestamps<'q>(
    timestamps: &Option<wgpu::ComputePassTimestampWrites<'q>>,
    i: usize,
    n: usize,
) -> Option<wgpu::ComputePassTimestampWrites<'q>> {
    let t = timestamps.as_ref()?;
    let begin = if i == 0 { t.beginning_of_pass_write_index } else { None };
    let end = if i + 1 == n { t.end_of_pass_write_index } else { None };
    (begin.is_some() || end.is_some()).then_some(wgpu::ComputePassTimestampWrites {
        query_set: t.query_set,
        beginning_of_pass_write_index: begin,
        end_of_pass_write_index: end,
    })
}

/// A part's problem on buffers of its own (a host-slice call's): the part's problem with every
/// layout starting at its first element.
pub(crate) fn on_own_buffers(part: &Part, whole: &AttentionProblem) -> AttentionProblem {
    let mut sub = part.problem(whole);
    for l in [
        &mut sub.q_layout,
        &mut sub.k_layout,
        &mut sub.v_layout,
        &mut sub.o_layout,
    ] {
        l.offset = 0;
    }
    sub
}

/// The elements of `data` (the whole's tensor at `layout`) that a part's own buffer holds: from
/// the part's first element, `len` of them.
pub(crate) fn part_slice<'d, T>(data: &'d [T], layout: &TensorLayout, element_offset: usize, len: usize) -> &'d [T] {
    let first = layout.offset + element_offset;
    &data[first..first + len]
}

/// Copies the rows (`head_dim` elements each) of a part's tensor into the whole's: part row
/// `(b, s, h)` at `part` goes to `(b0 + b, s0 + s, h0 + h)` at `whole`; `extent` is the part's
/// `(batch, seq, heads)` and `start` its `(b0, s0, h0)`.
pub(crate) fn scatter_rows<T: Copy>(
    into: &mut [T],
    whole: &TensorLayout,
    from: &[T],
    part: &TensorLayout,
    (nb, ns, nh): (usize, usize, usize),
    (b0, s0, h0): (usize, usize, usize),
    head_dim: usize,
) {
    for b in 0..nb {
        for s in 0..ns {
            for h in 0..nh {
                let src = part.index(b, s, h, 0);
                let dst = whole.index(b0 + b, s0 + s, h0 + h, 0);
                into[dst..dst + head_dim].copy_from_slice(&from[src..src + head_dim]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::{DType, Layout};

    fn problem(batch: usize, seq_q: usize, heads: usize, kv_heads: usize) -> AttentionProblem {
        AttentionProblem::new(
            AttentionShape {
                batch,
                seq_q,
                seq_kv: 40,
                num_heads: heads,
                num_kv_heads: kv_heads,
                head_dim: 16,
            },
            DType::F32,
        )
    }

    /// A fit check for [`plan`]: the parts `fits` holds are admitted, the others too large.
    fn fitting(fits: impl Fn(&Part) -> bool + Copy) -> impl Fn(&Part) -> Result<()> + Copy {
        move |p| {
            if fits(p) {
                Ok(())
            } else {
                Err(Error::TooLarge(format!("{p:?}")))
            }
        }
    }

    /// Every (batch, head, row) of the whole is in exactly one part, and each part is a valid
    /// problem whose K/V heads are the ones its query heads read.
    fn check_cover(whole: &AttentionProblem, parts: &[Part]) {
        let s = whole.shape;
        let mut seen = vec![0u8; s.batch * s.num_heads * s.seq_q];
        for p in parts {
            let sub = p.problem(whole);
            sub.validate().unwrap_or_else(|e| panic!("{p:?}: {e}"));
            for b in p.b0..p.b0 + p.nb {
                for h in p.h0..p.h0 + p.nh {
                    // Head h of the whole reads K/V head h / group; in the part, head h - h0
                    // reads (h - h0) / sub_group, counted from the part's first K/V head.
                    let kv = p.h0 / whole.group_size() + (h - p.h0) / sub.group_size();
                    assert_eq!(kv, h / whole.group_size(), "{p:?} head {h}");
                    for q in p.q0..p.q0 + p.nq {
                        seen[(b * s.num_heads + h) * s.seq_q + q] += 1;
                    }
                }
            }
            let mut lse = 0;
            for (at_part, at_whole, len) in p.lse_runs(whole) {
                assert_eq!(at_part, lse, "{p:?}");
                assert!(at_whole + len <= whole.lse_len());
                lse += len;
            }
            assert_eq!(lse, p.lse_len());
        }
        assert!(seen.iter().all(|&n| n == 1), "not a partition: {parts:?}");
    }

    #[test]
    fn batches_then_heads_then_rows() {
        let whole = problem(5, 30, 8, 2);
        // Up to two batch entries per part.
        let parts = plan(&whole, Pass::Forward, "", fitting(|p| p.nb <= 2)).unwrap();
        assert_eq!(parts.len(), 3);
        check_cover(&whole, &parts);
        // Up to six heads: whole groups of four.
        let parts = plan(&whole, Pass::Forward, "", fitting(|p| p.nb == 1 && p.nh <= 6)).unwrap();
        assert!(parts.iter().all(|p| p.nh == 4 && p.nq == 30), "{parts:?}");
        check_cover(&whole, &parts);
        // Up to three heads: inside a group, 3 + 1.
        let parts = plan(&whole, Pass::Forward, "", fitting(|p| p.nb == 1 && p.nh <= 3)).unwrap();
        assert_eq!(parts.iter().map(|p| p.nh).take(2).collect::<Vec<_>>(), [3, 1]);
        check_cover(&whole, &parts);
        // At most 16 (head, row) pairs: not one head's 30 rows, so all 8 heads of 2 rows.
        let parts = plan(&whole, Pass::Forward, "", fitting(|p| p.nb * p.nh * p.nq <= 16)).unwrap();
        assert!(parts.iter().all(|p| (p.nh, p.nq) == (8, 2)), "{parts:?}");
        check_cover(&whole, &parts);
    }

    /// With dropout, row parts start on even rows (the generator draws rows in pairs): where 25
    /// rows fit, parts of 24; where one row fits but two do not, the split is refused by name.
    #[test]
    fn dropout_parts_start_on_even_rows() {
        let whole = problem(1, 61, 1, 1).with_dropout(crate::problem::Dropout {
            p: 0.5,
            seed: 1,
            offset: 0,
        });
        let parts = plan(&whole, Pass::Forward, "", fitting(|p| p.nq <= 25)).unwrap();
        assert_eq!(parts.iter().map(|p| p.nq).collect::<Vec<_>>(), [24, 24, 13]);
        assert!(parts.iter().all(|p| p.q0 % 2 == 0), "{parts:?}");
        check_cover(&whole, &parts);
        // Without dropout the same limit gives parts of 25.
        let plain = problem(1, 61, 1, 1);
        let parts = plan(&plain, Pass::Forward, "", fitting(|p| p.nq <= 25)).unwrap();
        assert_eq!(parts[0].nq, 25);
        let e = plan(&whole, Pass::Forward, "too large", fitting(|p| p.nq <= 1)).unwrap_err();
        assert!(e.to_string().contains("two query rows"), "{e}");
    }

    #[test]
    fn the_backward_keeps_rows_and_groups_whole() {
        let whole = problem(2, 30, 8, 2);
        let parts = plan(&whole, Pass::Backward, "", fitting(|p| p.nb == 1 && p.nh <= 6)).unwrap();
        assert!(parts.iter().all(|p| p.nh == 4 && p.nq == 30));
        check_cover(&whole, &parts);
        // Fewer than a group, or fewer than all rows, is refused by name.
        let e = plan(&whole, Pass::Backward, "whole", |p| {
            if p.nh < 4 {
                Ok(())
            } else {
                Err(Error::TooLarge("tensor `k` spans too much".into()))
            }
        })
        .unwrap_err();
        let m = e.to_string();
        assert!(m.contains("whole") && m.contains("`k`") && m.contains("group"), "{m}");
    }

    #[test]
    fn what_cannot_be_split_is_refused_by_name() {
        let whole = problem(1, 30, 2, 2);
        let e = plan(&whole, Pass::Forward, "tensor `k` spans 9 bytes", |_| {
            Err(Error::TooLarge("tensor `k` spans 9 bytes".into()))
        })
        .unwrap_err();
        assert!(
            matches!(e, Error::TooLarge(ref m) if m.contains("one query row of one head") && m.contains("`k`")),
            "{e}"
        );
        let packed = whole.with_varlen(crate::problem::Varlen {
            total_q: 30,
            total_kv: 40,
        });
        let e = plan(&packed, Pass::Forward, "x", |_| Ok(())).unwrap_err();
        assert!(e.to_string().contains("packed"), "{e}");
        // A mask's block summary (its 32-row blocks need not start where a part's rows do).
        let summarized = whole
            .with_mask(crate::problem::AttentionMask::dense(&whole, true, true))
            .with_mask_blocks();
        let e = plan(&summarized, Pass::Forward, "x", |_| Ok(())).unwrap_err();
        assert!(e.to_string().contains("block summary"), "{e}");
        // A split into too many dispatches.
        let many = problem(1 << 20, 1, 1, 1);
        let e = plan(&many, Pass::Forward, "x", fitting(|p| p.nb == 1)).unwrap_err();
        assert!(e.to_string().contains("dispatches"), "{e}");
    }

    #[test]
    fn per_head_terms_keep_every_head_together() {
        let whole = problem(2, 30, 8, 2);
        // At most 120 (head, row) pairs of one batch entry.
        let fits = fitting(|p| p.nb == 1 && p.nh * p.nq <= 120);
        // Without per-head terms: one group of four heads, all 30 rows.
        let parts = plan(&whole, Pass::Forward, "", fits).unwrap();
        assert!(parts.iter().all(|p| (p.nh, p.nq) == (4, 30)), "{parts:?}");
        // With them, every head of fewer rows.
        for with in [
            whole.with_geometric_alibi(),
            whole.with_alibi_slopes(),
            whole.with_sinks(),
        ] {
            let parts = plan(&with, Pass::Forward, "", fits).unwrap();
            assert!(parts.iter().all(|p| (p.h0, p.nh, p.nq) == (0, 8, 15)), "{parts:?}");
            check_cover(&with, &parts);
        }
        // The backward keeps every row: with ALiBi, one batch entry of every head is too large.
        let e = plan(&whole.with_geometric_alibi(), Pass::Backward, "whole", fits).unwrap_err();
        assert!(e.to_string().contains("every head"), "{e}");
        // Sinks alone are not read by its gradient kernels: groups of heads, as without.
        let parts = plan(&whole.with_sinks(), Pass::Backward, "", fits).unwrap();
        assert!(parts.iter().all(|p| (p.nh, p.nq) == (4, 30)), "{parts:?}");
        check_cover(&whole, &parts);
    }

    #[test]
    fn parts_that_fit_only_at_the_start_are_shrunk() {
        let whole = problem(1, 64, 1, 1).with_layout(Layout::Bhsd);
        // 10 rows fit at row 0 but only 8 elsewhere (as an aligned-down binding start can add).
        let parts = plan(
            &whole,
            Pass::Forward,
            "",
            fitting(|p| p.nq <= if p.q0 == 0 { 10 } else { 8 }),
        )
        .unwrap();
        assert!(parts.iter().all(|p| p.nq <= 8), "{parts:?}");
        check_cover(&whole, &parts);
    }

    /// A part's score bias and mask start at its first element of the whole's: its batch entry,
    /// head and row, through each stride (none through a broadcast one).
    #[test]
    fn a_parts_bias_and_mask_start_at_its_first_element() {
        use crate::problem::{AttentionMask, ScoreBias};
        let whole = problem(3, 10, 6, 3);
        let layout = BiasLayout {
            offset: 5,
            batch_stride: 1000,
            head_stride: 0,
            row_stride: 20,
        };
        let whole = whole
            .with_bias(ScoreBias {
                dtype: crate::problem::DType::F16,
                layout,
            })
            .with_mask(AttentionMask { layout });
        let part = Part {
            b0: 2,
            nb: 1,
            h0: 4,
            nh: 2,
            q0: 7,
            nq: 3,
        };
        let sub = part.problem(&whole);
        let want = BiasLayout {
            offset: 5 + 2 * 1000 + 7 * 20,
            ..layout
        };
        assert_eq!(sub.bias.unwrap().layout, want);
        assert_eq!(sub.mask.unwrap().layout, want);
        assert_eq!(sub.bias.unwrap().dtype, crate::problem::DType::F16);
    }

    #[test]
    fn offsets_place_each_part() {
        let whole = problem(3, 10, 6, 3).with_layout(Layout::Bhsd);
        let p = Part {
            b0: 2,
            nb: 1,
            h0: 4,
            nh: 2,
            q0: 7,
            nq: 3,
        };
        assert_eq!(p.element_offset(&whole, Tensor::Q), whole.q_layout.index(2, 7, 4, 0));
        assert_eq!(p.element_offset(&whole, Tensor::K), whole.k_layout.index(2, 0, 2, 0));
        let placed = Placement::whole(&whole).of_part(&p);
        assert_eq!(
            (placed.causal_offset, placed.batch, placed.head, placed.row),
            (40 - 10 + 7, 2, 4, 7)
        );
        // A part of a part adds both origins.
        let inner = Part {
            b0: 0,
            nb: 1,
            h0: 1,
            nh: 1,
            q0: 2,
            nq: 1,
        };
        let twice = placed.of_part(&inner);
        assert_eq!(
            (twice.causal_offset, twice.batch, twice.head, twice.row),
            (40 - 10 + 9, 2, 5, 9)
        );
        assert_eq!(
            p.lse_runs(&whole),
            vec![(0, (2 * 6 + 4) * 10 + 7, 3), (3, (2 * 6 + 5) * 10 + 7, 3)]
        );
    }
}
