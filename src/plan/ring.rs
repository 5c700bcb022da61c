//! The ring schedule of context-parallel attention (ring attention): how a sequence is cut into
//! chunks, which chunks each rank owns, which K/V shard a rank holds at each step of the ring, and
//! which (query chunk, key chunk) blocks it attends there, under which mask.
//!
//! Each of `N` ranks owns the query, key and value rows of its chunks. At step `t` rank `r`
//! holds the K/V shard of rank `(r − t) mod N` — received from rank `r − 1`, sent on to rank
//! `r + 1` — and attends its own query chunks to it; after `N` steps every query chunk has met
//! every key chunk once, and each query chunk's partial results are merged by their LSEs in step
//! order. Pure, with the pieces both engines share (which problems a ring runs, each block's
//! problem on views of the whole's rows): the wgpu engine (src/runtime/ring.rs) and the CUDA
//! engine (src/cuda/ring.rs, forward) run this schedule with logical ranks on one device; a
//! transport between devices sends the same shards in the same order.

use std::ops::Range;

use crate::error::{Error, Result};
use crate::plan::missing_features;
use crate::problem::features::{Feature, FeatureSet};
use crate::problem::{AttentionProblem, AttentionShape, Layout, Tensor, TensorLayout};

/// How a sequence's rows are dealt to the ranks of a ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ShardLayout {
    /// `N` chunks; rank `r` owns chunk `r`. Under a causal mask rank `N − 1` attends about
    /// `2N − 1` times the (query, key) pairs of rank 0, so the ring runs at the pace of its last
    /// rank.
    Contiguous,
    /// `2N` chunks; rank `r` owns chunks `r` and `2N − 1 − r`, an early and a late one, so that
    /// under a causal mask every rank attends the same number of pairs at every step (the
    /// "zig-zag" layout of ring-flash-attention and Llama 3's context parallelism). Without a
    /// mask it balances as `Contiguous` does.
    ZigZag,
}

/// What a block of the schedule masks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockMask {
    /// Every query row of the block sees every key row.
    Full,
    /// A chunk against itself under a causal mask: row `i` sees keys `0..=i` (the chunk is
    /// square, so top-left and bottom-right alignment agree).
    Causal,
}

/// One attention block of the schedule: a query chunk against a key/value chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RingBlock {
    /// The query chunk (an index into [`Ring::chunk_rows`] of the query sequence).
    pub q_chunk: usize,
    /// The key/value chunk (of the key sequence).
    pub kv_chunk: usize,
    /// What the block masks.
    pub mask: BlockMask,
}

/// A ring of `ranks` ranks and the layout of their shards.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ring {
    ranks: usize,
    layout: ShardLayout,
}

impl Ring {
    /// A ring of `ranks` ranks (at least 1) with shards dealt as `layout` says.
    pub fn new(ranks: usize, layout: ShardLayout) -> Result<Self> {
        if ranks == 0 {
            return Err(Error::InvalidProblem("a ring needs at least one rank".into()));
        }
        // Chunk indices are formed as 2·ranks.
        if ranks > usize::MAX / 2 {
            return Err(Error::InvalidProblem(format!(
                "{ranks} ranks: too many to count chunks"
            )));
        }
        Ok(Ring { ranks, layout })
    }

    /// The number of ranks.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// How the shards are dealt.
    pub fn layout(&self) -> ShardLayout {
        self.layout
    }

    /// The number of chunks a sequence is cut into: `N`, or `2N` zig-zag.
    pub fn chunks(&self) -> usize {
        match self.layout {
            ShardLayout::Contiguous => self.ranks,
            ShardLayout::ZigZag => 2 * self.ranks,
        }
    }

    /// The rows of chunk `chunk` of a sequence of `seq` rows: the chunks are consecutive and
    /// differ in length by at most one row (`chunk · seq / chunks` to the next chunk's start);
    /// empty for a chunk past the last.
    pub fn chunk_rows(&self, seq: usize, chunk: usize) -> Range<usize> {
        let n = self.chunks() as u128;
        let at = |c: usize| ((c as u128).min(n) * seq as u128 / n) as usize;
        at(chunk)..at(chunk.saturating_add(1))
    }

    /// The chunks rank `rank` owns, in sequence order; none for a rank past the last.
    pub fn rank_chunks(&self, rank: usize) -> Vec<usize> {
        if rank >= self.ranks {
            return Vec::new();
        }
        match self.layout {
            ShardLayout::Contiguous => vec![rank],
            ShardLayout::ZigZag => vec![rank, 2 * self.ranks - 1 - rank],
        }
    }

    /// The rank whose K/V shard rank `rank` holds at step `step` (both counted modulo the ranks):
    /// its own at step 0, then its predecessor's, and so on around the ring.
    pub fn shard_at(&self, rank: usize, step: usize) -> usize {
        (rank % self.ranks + self.ranks - step % self.ranks) % self.ranks
    }

    /// The blocks rank `rank` attends at step `step`, `causal` or not: each of its query chunks
    /// against each key chunk of the shard it holds, where a causal mask leaves any key of that
    /// chunk visible (a key chunk after the query chunk is skipped, never loaded; the chunk itself
    /// is `Causal`; an earlier one is `Full`).
    pub fn blocks(&self, rank: usize, step: usize, causal: bool) -> Vec<RingBlock> {
        let held = self.rank_chunks(self.shard_at(rank, step));
        let mut blocks = Vec::with_capacity(4);
        for q_chunk in self.rank_chunks(rank) {
            for &kv_chunk in &held {
                let mask = match (causal, kv_chunk.cmp(&q_chunk)) {
                    (false, _) | (true, std::cmp::Ordering::Less) => BlockMask::Full,
                    (true, std::cmp::Ordering::Equal) => BlockMask::Causal,
                    (true, std::cmp::Ordering::Greater) => continue,
                };
                blocks.push(RingBlock {
                    q_chunk,
                    kv_chunk,
                    mask,
                });
            }
        }
        blocks
    }

    /// Every rank's blocks of query chunk `q_chunk`, in the order their partial results are
    /// merged: by step (the owner's schedule, since a chunk's rows stay on its rank).
    pub fn blocks_of_chunk(&self, q_chunk: usize, causal: bool) -> Vec<RingBlock> {
        let Some(owner) = self.owner(q_chunk) else {
            return Vec::new();
        };
        (0..self.ranks)
            .flat_map(|step| self.blocks(owner, step, causal))
            .filter(|b| b.q_chunk == q_chunk)
            .collect()
    }

    /// The rank that owns chunk `chunk`; `None` for a chunk past the last.
    pub fn owner(&self, chunk: usize) -> Option<usize> {
        if chunk >= self.chunks() {
            return None;
        }
        Some(match self.layout {
            ShardLayout::ZigZag if chunk >= self.ranks => 2 * self.ranks - 1 - chunk,
            _ => chunk,
        })
    }

    /// Whether a problem of `seq_q` query rows and `seq_kv` key rows runs on this ring: every
    /// chunk of either sequence holds a row, and under a causal mask the two sequences are one
    /// (the diagonal blocks must be square).
    pub fn check(&self, seq_q: usize, seq_kv: usize, causal: bool) -> Result<()> {
        if causal && seq_q != seq_kv {
            return Err(Error::InvalidProblem(format!(
                "a causal ring needs seq_q = seq_kv (one sequence sharded over the ranks), got {seq_q} and {seq_kv}"
            )));
        }
        let chunks = self.chunks();
        for (what, seq) in [("seq_q", seq_q), ("seq_kv", seq_kv)] {
            if seq < chunks {
                return Err(Error::InvalidProblem(format!(
                    "{what} = {seq} rows cannot fill the ring's {chunks} chunks ({} ranks, {:?}); \
                     every chunk needs a row",
                    self.ranks, self.layout
                )));
            }
        }
        Ok(())
    }
}

/// One block of a query chunk as an engine records it with logical ranks on one device: the
/// block's forward into scratch slot `slot` (its partial O and LSE), then, after the chunk's first
/// block, the merge of the chunk's running result (slot `merge.0`) with it into slot `merge.1`.
/// `o_to_caller`: the step's last output O (the merge's, or the forward's for a chunk of one
/// block) goes to the caller's O at the chunk's rows instead of its slot; its LSE still goes to
/// the slot. Three slots: two for the running result in turn, one for the block merged in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ChunkStep {
    pub block: RingBlock,
    pub slot: usize,
    pub merge: Option<(usize, usize)>,
    pub o_to_caller: bool,
}

/// Scratch slots (each a chunk-sized O and its LSE) that [`chunk_steps`] uses.
pub(crate) const CHUNK_SLOTS: usize = 3;

/// The steps of query chunk `chunk` (its blocks in merge order, [`Ring::blocks_of_chunk`]) and
/// the slot that holds the chunk's LSE at the end, to be copied into the caller's.
pub(crate) fn chunk_steps(ring: &Ring, chunk: usize, causal: bool) -> (Vec<ChunkStep>, usize) {
    let blocks = ring.blocks_of_chunk(chunk, causal);
    let last = blocks.len().saturating_sub(1);
    let mut running = 0;
    let steps = blocks
        .into_iter()
        .enumerate()
        .map(|(i, block)| {
            let merge = (i > 0).then(|| {
                let into = 1 - running;
                (std::mem::replace(&mut running, into), into)
            });
            ChunkStep {
                block,
                slot: if i == 0 { 0 } else { 2 },
                merge,
                o_to_caller: i == last,
            }
        })
        .collect();
    (steps, running)
}

/// What a ring runs: dense attention, causal or not, with GQA, any scale and a soft-cap (each a
/// property of a single score, the same in every block). A window, ALiBi, a bias or a mask
/// depend on absolute positions and sinks join a row's softmax once; packed batches and caches
/// have no one sequence to shard.
const RING_FEATURES: FeatureSet = FeatureSet::of(&[
    Feature::CausalMask,
    Feature::GroupedKv,
    Feature::ArbitraryScale,
    Feature::SoftCap,
]);

/// Why `problem` cannot run on `ring`, or `Ok`.
pub(crate) fn check_ring_problem(problem: &AttentionProblem, ring: &Ring) -> Result<()> {
    problem.validate()?;
    if let Some(why) = missing_features("ring attention", problem.features(), RING_FEATURES) {
        return Err(Error::Unavailable {
            what: "ring attention".into(),
            why,
        });
    }
    let s = problem.shape;
    ring.check(s.seq_q, s.seq_kv, problem.causal)
}

/// The problem of one block: the whole problem's rows of `block`'s chunks, its output at
/// `o_layout` (a scratch chunk or a view of the caller's O).
pub(crate) fn block_problem(
    whole: &AttentionProblem,
    ring: &Ring,
    block: &RingBlock,
    o_layout: TensorLayout,
) -> AttentionProblem {
    let s = whole.shape;
    let q = ring.chunk_rows(s.seq_q, block.q_chunk);
    let kv = ring.chunk_rows(s.seq_kv, block.kv_chunk);
    AttentionProblem {
        shape: AttentionShape {
            seq_q: q.len(),
            seq_kv: kv.len(),
            ..s
        },
        causal: block.mask == BlockMask::Causal,
        // A window RING_FEATURES lets through (no left bound, a right bound only under the
        // causal mask) hides nothing the causal mask does not, which the block's mask now says.
        window: None,
        q_layout: rows_from(&whole.q_layout, q.start),
        k_layout: rows_from(&whole.k_layout, kv.start),
        v_layout: rows_from(&whole.v_layout, kv.start),
        o_layout,
        ..*whole
    }
}

/// `layout` from its row `row` on. The row is inside the validated tensor: no overflow.
pub(crate) fn rows_from(layout: &TensorLayout, row: usize) -> TensorLayout {
    TensorLayout {
        offset: layout.offset + row * layout.seq_stride,
        ..*layout
    }
}

/// The label of a ring's calls: `ring_4x_ZigZag`.
pub(crate) fn ring_name(ring: &Ring) -> String {
    format!("ring_{}x_{:?}", ring.ranks(), ring.layout())
}

/// A dense `[batch, rows, num_heads, head_dim]` chunk of scratch.
pub(crate) fn scratch_layout(problem: &AttentionProblem, rows: usize) -> TensorLayout {
    let s = problem.shape;
    TensorLayout::contiguous(Layout::Bshd, rows, s.num_heads, s.head_dim)
}

/// Elements of one scratch output and of one scratch LSE: chunk-sized, for the longest query
/// chunk, dense.
pub(crate) fn scratch_lens(problem: &AttentionProblem, ring: &Ring) -> (usize, usize) {
    let s = problem.shape;
    let rows = s.seq_q.div_ceil(ring.chunks());
    let chunk = AttentionProblem {
        shape: AttentionShape { seq_q: rows, ..s },
        o_layout: scratch_layout(problem, rows),
        ..*problem
    };
    (chunk.required_len(Tensor::O), chunk.lse_len())
}

#[cfg(test)]
mod tests {
    use super::{chunk_steps, BlockMask, Ring, ShardLayout, CHUNK_SLOTS};
    use std::collections::HashSet;

    /// (query row, key row) pairs a block covers.
    fn pairs(ring: &Ring, seq: usize, b: &super::RingBlock) -> Vec<(usize, usize)> {
        pairs_of(ring, seq, seq, b)
    }

    fn pairs_of(ring: &Ring, seq_q: usize, seq_kv: usize, b: &super::RingBlock) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        for i in ring.chunk_rows(seq_q, b.q_chunk) {
            for j in ring.chunk_rows(seq_kv, b.kv_chunk) {
                if b.mask == BlockMask::Full || j <= i {
                    out.push((i, j));
                }
            }
        }
        out
    }

    #[test]
    fn every_visible_pair_is_attended_exactly_once() {
        for ranks in 1..=6 {
            for layout in [ShardLayout::Contiguous, ShardLayout::ZigZag] {
                let ring = Ring::new(ranks, layout).unwrap();
                for seq in [ring.chunks(), ring.chunks() + 1, 3 * ring.chunks() - 1, 37] {
                    if seq < ring.chunks() {
                        continue;
                    }
                    for causal in [false, true] {
                        let mut seen = HashSet::new();
                        for rank in 0..ranks {
                            for step in 0..ranks {
                                for b in ring.blocks(rank, step, causal) {
                                    assert!(ring.rank_chunks(rank).contains(&b.q_chunk));
                                    for p in pairs(&ring, seq, &b) {
                                        assert!(seen.insert(p), "{p:?} twice: {ranks} {layout:?} {seq} {causal}");
                                    }
                                }
                            }
                        }
                        let visible = if causal { seq * (seq + 1) / 2 } else { seq * seq };
                        assert_eq!(seen.len(), visible, "{ranks} {layout:?} {seq} {causal}");
                    }
                    // Without a mask the key sequence may differ in length.
                    let seq_kv = 2 * seq + 3;
                    let mut seen = HashSet::new();
                    for rank in 0..ranks {
                        for step in 0..ranks {
                            for b in ring.blocks(rank, step, false) {
                                for p in pairs_of(&ring, seq, seq_kv, &b) {
                                    assert!(seen.insert(p), "{p:?} twice: {ranks} {layout:?} {seq}x{seq_kv}");
                                }
                            }
                        }
                    }
                    assert_eq!(seen.len(), seq * seq_kv);
                }
            }
        }
    }

    #[test]
    fn chunks_tile_the_sequence_and_every_rank_owns_its_share() {
        for ranks in 1..=5 {
            for layout in [ShardLayout::Contiguous, ShardLayout::ZigZag] {
                let ring = Ring::new(ranks, layout).unwrap();
                let mut owned = vec![0; ring.chunks()];
                for rank in 0..ranks {
                    for c in ring.rank_chunks(rank) {
                        owned[c] += 1;
                        assert_eq!(ring.owner(c), Some(rank));
                    }
                }
                assert!(owned.iter().all(|&n| n == 1), "{owned:?}");
                for seq in [ring.chunks(), 100, 101] {
                    let mut next = 0;
                    for c in 0..ring.chunks() {
                        let rows = ring.chunk_rows(seq, c);
                        assert_eq!(rows.start, next);
                        assert!(rows.len() >= seq / ring.chunks() && rows.len() <= seq.div_ceil(ring.chunks()));
                        next = rows.end;
                    }
                    assert_eq!(next, seq);
                }
            }
        }
    }

    #[test]
    fn zigzag_balances_causal_work_at_every_step() {
        for ranks in 1..=8 {
            let ring = Ring::new(ranks, ShardLayout::ZigZag).unwrap();
            let seq = 2 * ranks * 5;
            for step in 0..ranks {
                let work: Vec<usize> = (0..ranks)
                    .map(|r| {
                        ring.blocks(r, step, true)
                            .iter()
                            .map(|b| pairs(&ring, seq, b).len())
                            .sum()
                    })
                    .collect();
                assert!(work.iter().all(|&w| w == work[0]), "step {step}: {work:?}");
            }
        }
        // The contiguous layout does not: its last rank attends about 2·ranks − 1 times its
        // first's.
        let ring = Ring::new(4, ShardLayout::Contiguous).unwrap();
        let work = |r| -> usize {
            (0..4)
                .flat_map(|t| ring.blocks(r, t, true))
                .map(|b| pairs(&ring, 40, &b).len())
                .sum()
        };
        assert!(work(3) > 5 * work(0), "{} {}", work(3), work(0));
    }

    #[test]
    fn a_chunk_starts_with_its_own_shard_and_merges_in_step_order() {
        for layout in [ShardLayout::Contiguous, ShardLayout::ZigZag] {
            let ring = Ring::new(4, layout).unwrap();
            for c in 0..ring.chunks() {
                for causal in [false, true] {
                    let blocks = ring.blocks_of_chunk(c, causal);
                    let owner = ring.owner(c).unwrap();
                    let own = ring.rank_chunks(owner);
                    assert!(own.contains(&blocks[0].kv_chunk), "{layout:?} chunk {c}: {blocks:?}");
                    // In step order: the step at which the owner holds each block's key chunk
                    // never decreases.
                    let step_of = |kv: usize| (0..4).find(|&t| ring.shard_at(owner, t) == ring.owner(kv).unwrap());
                    let steps: Vec<_> = blocks.iter().map(|b| step_of(b.kv_chunk)).collect();
                    assert!(
                        steps.windows(2).all(|w| w[0] <= w[1]),
                        "{layout:?} chunk {c}: {steps:?}"
                    );
                    if causal {
                        assert!(blocks.iter().any(|b| b.kv_chunk == c && b.mask == BlockMask::Causal));
                    }
                }
            }
        }
    }

    #[test]
    fn bad_rings_and_sequences_are_refused() {
        assert!(Ring::new(0, ShardLayout::Contiguous).is_err());
        let ring = Ring::new(4, ShardLayout::ZigZag).unwrap();
        assert!(ring.check(7, 7, true).is_err());
        assert!(ring.check(8, 8, true).is_ok());
        assert!(ring
            .check(8, 9, true)
            .unwrap_err()
            .to_string()
            .contains("seq_q = seq_kv"));
        assert!(ring.check(8, 9, false).is_ok());
        assert!(ring.check(9, 3, false).unwrap_err().to_string().contains("seq_kv"));
        assert_eq!(ring.shard_at(0, 1), 3);
        assert_eq!(ring.shard_at(2, 2), 0);
        // Out-of-range ranks and chunks answer, never panic.
        assert!(ring.rank_chunks(4).is_empty() && ring.rank_chunks(usize::MAX).is_empty());
        assert!(ring.blocks(usize::MAX, usize::MAX, true).is_empty());
        assert_eq!(ring.owner(8), None);
        assert!(ring.blocks_of_chunk(usize::MAX, false).is_empty());
        assert!(ring.chunk_rows(100, usize::MAX).is_empty());
        assert_eq!(
            ring.shard_at(usize::MAX, usize::MAX),
            ring.shard_at(usize::MAX % 4, usize::MAX % 4)
        );
    }

    #[test]
    fn chunk_steps_merge_every_block_once_through_three_slots() {
        for ranks in 1..=5 {
            for layout in [ShardLayout::Contiguous, ShardLayout::ZigZag] {
                let ring = Ring::new(ranks, layout).unwrap();
                for causal in [false, true] {
                    for chunk in 0..ring.chunks() {
                        let (steps, lse_slot) = chunk_steps(&ring, chunk, causal);
                        let blocks = ring.blocks_of_chunk(chunk, causal);
                        let at = format!("{ranks} {layout:?} causal {causal} chunk {chunk}");
                        assert_eq!(steps.iter().map(|s| s.block).collect::<Vec<_>>(), blocks, "{at}");
                        // Simulate: which blocks each slot's partial result covers.
                        let mut held: Vec<Vec<usize>> = vec![Vec::new(); CHUNK_SLOTS];
                        let mut running = None;
                        for (i, step) in steps.iter().enumerate() {
                            assert!(step.slot < CHUNK_SLOTS, "{at}");
                            assert_ne!(
                                Some(step.slot),
                                running,
                                "{at}: the block overwrites the running result"
                            );
                            held[step.slot] = vec![i];
                            running = match step.merge {
                                None => {
                                    assert_eq!(i, 0, "{at}: only the first block starts the result");
                                    Some(step.slot)
                                }
                                Some((from, into)) => {
                                    assert_eq!(Some(from), running, "{at}");
                                    assert!(into != from && into != step.slot && into < CHUNK_SLOTS, "{at}");
                                    let mut merged = held[from].clone();
                                    merged.extend(&held[step.slot]);
                                    held[into] = merged;
                                    Some(into)
                                }
                            };
                            assert_eq!(
                                step.o_to_caller,
                                i + 1 == steps.len(),
                                "{at}: only the last step writes O"
                            );
                        }
                        assert_eq!(running, Some(lse_slot), "{at}");
                        assert_eq!(held[lse_slot], (0..steps.len()).collect::<Vec<_>>(), "{at}");
                    }
                }
            }
        }
    }
}
