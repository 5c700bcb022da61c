//! The forward kernels' parameter block: the problem's sizes, strides and folded scale, and the
//! device addresses of its tensors, laid out as the kernels read it.

use crate::problem::backward::{BackwardProblem, GradTensor};
use crate::problem::head_terms::Alibi;
use crate::problem::{AttentionProblem, DType, Tensor};

/// The forward kernels' parameter block, passed by value. Mirrors `struct FwdParams` in
/// `cuda/fwd_params.cuh` field for field; both sides check the size.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FwdParams {
    /// Device addresses of each tensor's element (0, 0, 0, 0), offsets included.
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    /// 0: LSE not written.
    pub lse: u64,
    pub q_batch_stride: i64,
    pub q_seq_stride: i64,
    pub q_head_stride: i64,
    pub k_batch_stride: i64,
    pub k_seq_stride: i64,
    pub k_head_stride: i64,
    pub v_batch_stride: i64,
    pub v_seq_stride: i64,
    pub v_head_stride: i64,
    pub o_batch_stride: i64,
    pub o_seq_stride: i64,
    pub o_head_stride: i64,
    pub seq_q: i32,
    pub seq_kv: i32,
    pub num_heads: i32,
    pub group_size: i32,
    pub causal_offset: i32,
    pub scale_log2: f32,
    /// A packed (varlen) batch: device addresses of the `[batch + 1]` u32 row offsets of Q/O
    /// and K/V (0 for a batch of equal sequences; set by the launcher), and the packed rows.
    pub cu_seqlens_q: u64,
    pub cu_seqlens_k: u64,
    pub total_q: i32,
    pub total_kv: i32,
    /// A sliding window's sides in keys, -1 for unbounded (`AttentionProblem::window`).
    pub window_left: i32,
    pub window_right: i32,
    /// The soft-cap in base 2, `cap · log2 e`, 0 for none (`AttentionProblem::softcap`).
    pub softcap_log2: f32,
    /// `1 / softcap_log2` (0 for none): the kernels multiply by it, a division a score would cost
    /// several instructions.
    pub softcap_inv_log2: f32,
    /// Device addresses of the `[num_heads]` f32 ALiBi slopes (with [`ALIBI_PER_HEAD`]) and
    /// sink logits; 0 for none (set by the launcher).
    pub alibi_slopes: u64,
    pub sinks: u64,
    /// Device address of the score bias's first element (its layout's offset included; set by the
    /// launcher), 0 for none, and its strides in elements.
    pub bias: u64,
    pub bias_batch_stride: i64,
    pub bias_head_stride: i64,
    pub bias_row_stride: i64,
    /// 0 no ALiBi, [`ALIBI_GEOMETRIC`], or [`ALIBI_PER_HEAD`].
    pub alibi_mode: i32,
    /// The bias's element type: 0 f32, 1 f16, 2 bf16.
    pub bias_dtype: i32,
    /// Dropout (`AttentionProblem::dropout`, src/problem/dropout.rs): the generator's key, the
    /// 16-bit threshold below which a probability is dropped (0: none) and the kept ones' factor
    /// `1/(1 − p)`.
    pub dropout_key0: u32,
    pub dropout_key1: u32,
    pub dropout_threshold: u32,
    pub dropout_scale: f32,
}

const _: () = assert!(std::mem::size_of::<FwdParams>() == 272);

impl FwdParams {
    /// Parameters for `problem` (validated) with buffers whose element 0 is at `base_addresses`
    /// (`[q, k, v, o]`) and an LSE buffer at `lse` (0 for none).
    pub fn new(problem: &AttentionProblem, base_addresses: [u64; 4], lse: u64) -> Self {
        let elem = problem.dtype.size_bytes() as u64;
        let start = |tensor: Tensor, base: u64| base + problem.layout(tensor).offset as u64 * elem;
        let strides = |tensor: Tensor| {
            let l = problem.layout(tensor);
            [l.batch_stride as i64, l.seq_stride as i64, l.head_stride as i64]
        };
        let [qb, qs, qh] = strides(Tensor::Q);
        let [kb, ks, kh] = strides(Tensor::K);
        let [vb, vs, vh] = strides(Tensor::V);
        let [ob, os, oh] = strides(Tensor::O);
        let s = &problem.shape;
        let bias = problem.bias;
        let dropout = problem.active_dropout();
        let [dropout_key0, dropout_key1] = dropout.map_or([0, 0], |d| d.key());
        // Packed tensors have one batch: each sequence's rows start at its offset.
        let batch = |stride: i64| if problem.varlen.is_some() { 0 } else { stride };
        let (qb, kb, vb, ob) = (batch(qb), batch(kb), batch(vb), batch(ob));
        FwdParams {
            q: start(Tensor::Q, base_addresses[0]),
            k: start(Tensor::K, base_addresses[1]),
            v: start(Tensor::V, base_addresses[2]),
            o: start(Tensor::O, base_addresses[3]),
            lse,
            q_batch_stride: qb,
            q_seq_stride: qs,
            q_head_stride: qh,
            k_batch_stride: kb,
            k_seq_stride: ks,
            k_head_stride: kh,
            v_batch_stride: vb,
            v_seq_stride: vs,
            v_head_stride: vh,
            o_batch_stride: ob,
            o_seq_stride: os,
            o_head_stride: oh,
            seq_q: s.seq_q as i32,
            seq_kv: s.seq_kv as i32,
            num_heads: s.num_heads as i32,
            group_size: problem.group_size() as i32,
            causal_offset: problem.causal_offset() as i32,
            scale_log2: problem.softmax_scale_log2(),
            cu_seqlens_q: 0,
            cu_seqlens_k: 0,
            total_q: problem.varlen.map_or(0, |v| v.total_q as i32),
            total_kv: problem.varlen.map_or(0, |v| v.total_kv as i32),
            window_left: window_side(problem.window.and_then(|w| w.left)),
            window_right: window_side(problem.window.and_then(|w| w.right)),
            softcap_log2: problem.softcap.map_or(0.0, |cap| cap * std::f32::consts::LOG2_E),
            softcap_inv_log2: problem
                .softcap
                .map_or(0.0, |cap| 1.0 / (cap * std::f32::consts::LOG2_E)),
            alibi_slopes: 0,
            sinks: 0,
            bias: 0,
            bias_batch_stride: bias.map_or(0, |b| b.layout.batch_stride as i64),
            bias_head_stride: bias.map_or(0, |b| b.layout.head_stride as i64),
            bias_row_stride: bias.map_or(0, |b| b.layout.row_stride as i64),
            alibi_mode: match problem.alibi {
                None => 0,
                Some(Alibi::Geometric) => ALIBI_GEOMETRIC,
                Some(Alibi::PerHead) => ALIBI_PER_HEAD,
            },
            bias_dtype: bias.map_or(0, |b| match b.dtype {
                DType::F32 => 0,
                DType::F16 => 1,
                DType::BF16 => 2,
            }),
            dropout_key0,
            dropout_key1,
            dropout_threshold: dropout.map_or(0, |d| d.threshold()),
            dropout_scale: dropout.map_or(1.0, |d| d.scale() as f32),
        }
    }
}

/// `FwdParams::alibi_mode`: the geometric slopes, computed by the kernel.
pub const ALIBI_GEOMETRIC: i32 = 1;
/// `FwdParams::alibi_mode`: the slopes tensor.
pub const ALIBI_PER_HEAD: i32 = 2;

/// A window side as the kernels read it: -1 unbounded, else the keys, saturated at `i32::MAX`.
fn window_side(side: Option<usize>) -> i32 {
    side.map_or(-1, |n| i32::try_from(n).unwrap_or(i32::MAX))
}

/// The decode kernels' parameter block (`cuda/flash_decode.cu`, both entry points), passed by
/// value: the forward parameters, then the split's f32 scratch and sizes. Mirrors `struct
/// DecodeParams` there field for field; both sides check the size.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DecodeParams {
    pub fwd: FwdParams,
    /// Partial outputs, `[batch, num_heads, seq_q, splits, head_dim]` f32 (0 with one split).
    pub part_o: u64,
    /// Partial LSEs, `[batch, num_heads, seq_q, splits]` f32 (0 with one split).
    pub part_lse: u64,
    pub splits: i32,
    pub keys_per_split: i32,
    /// Query heads per K/V head × new tokens.
    pub rows_per_kv_head: i32,
    /// Blocks of the kernel's rows per K/V head.
    pub row_blocks: i32,
    /// Fused combine: `[batch, num_kv_heads × row_blocks]` u32 counters, 0 before and after
    /// every launch (0 with one split).
    pub counters: u64,
    /// Paged caches: the `[batch, pages_per_seq]` u32 page table (0 when not paged).
    pub page_table: u64,
    /// Per-sequence key counts: the `[batch]` u32 tensor (0 without lengths).
    pub kv_lens: u64,
    /// Paged caches: key rows per page, pages per pool, columns of the page table (0 when not
    /// paged).
    pub page_size: i32,
    pub num_pages: i32,
    pub pages_per_seq: i32,
    pub cache_pad: i32,
}

const _: () = assert!(std::mem::size_of::<DecodeParams>() == 344);

/// The backward kernels' parameter block (`cuda/flash_bwd_wgmma.cu` and `cuda/flash_bwd_mma.cu`,
/// all three entry points of each), passed
/// by value: the forward's block (Q, K, V, O and the forward's LSE as read inputs), then dO, the
/// gradients, their strides and the workspace. Mirrors `struct BwdParams` in
/// `cuda/bwd_params.cuh` field for field; both sides check the size.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BwdParams {
    pub fwd: FwdParams,
    /// Device addresses of element (0, 0, 0, 0) of dO, dQ, dK and dV, offsets included.
    pub d_o: u64,
    pub dq: u64,
    pub dk: u64,
    pub dv: u64,
    pub do_batch_stride: i64,
    pub do_seq_stride: i64,
    pub do_head_stride: i64,
    pub dq_batch_stride: i64,
    pub dq_seq_stride: i64,
    pub dq_head_stride: i64,
    pub dk_batch_stride: i64,
    pub dk_seq_stride: i64,
    pub dk_head_stride: i64,
    pub dv_batch_stride: i64,
    pub dv_seq_stride: i64,
    pub dv_head_stride: i64,
    /// The workspace (set by the launcher): the f32 dQ accumulator, D, the base-2 LSE, and the
    /// deterministic build's counters (0 otherwise).
    pub dq_accum: u64,
    pub d_rows: u64,
    pub lse_log2: u64,
    pub semaphores: u64,
    /// Query rows per (batch, head) in the workspace, a multiple of `block_m`.
    pub seq_q_pad: i32,
    pub q_tiles: i32,
    pub num_kv_heads: i32,
    pub kv_tiles: i32,
    /// The softmax scale (dK's and dQ's factor).
    pub scale: f32,
    pub pad_: i32,
}

const _: () = assert!(std::mem::size_of::<BwdParams>() == 456);

impl BwdParams {
    /// Parameters for `problem` (validated) with buffers whose element 0 is at `a`, and the
    /// sizes of `workspace` (its addresses are the launcher's to set).
    pub fn new(
        problem: &BackwardProblem,
        a: &super::backward::BackwardAddresses,
        workspace: &super::backward::BackwardWorkspace,
    ) -> Self {
        let f = &problem.forward;
        let elem = f.dtype.size_bytes() as u64;
        let start = |t: GradTensor, base: u64| base + problem.layout(t).offset as u64 * elem;
        let strides = |t: GradTensor| {
            let l = problem.layout(t);
            [l.batch_stride as i64, l.seq_stride as i64, l.head_stride as i64]
        };
        let [dob, dos, doh] = strides(GradTensor::DO);
        let [dqb, dqs, dqh] = strides(GradTensor::DQ);
        let [dkb, dks, dkh] = strides(GradTensor::DK);
        let [dvb, dvs, dvh] = strides(GradTensor::DV);
        BwdParams {
            fwd: FwdParams::new(f, [a.q, a.k, a.v, a.o], a.lse),
            d_o: start(GradTensor::DO, a.d_o),
            dq: start(GradTensor::DQ, a.dq),
            dk: start(GradTensor::DK, a.dk),
            dv: start(GradTensor::DV, a.dv),
            do_batch_stride: dob,
            do_seq_stride: dos,
            do_head_stride: doh,
            dq_batch_stride: dqb,
            dq_seq_stride: dqs,
            dq_head_stride: dqh,
            dk_batch_stride: dkb,
            dk_seq_stride: dks,
            dk_head_stride: dkh,
            dv_batch_stride: dvb,
            dv_seq_stride: dvs,
            dv_head_stride: dvh,
            dq_accum: 0,
            d_rows: 0,
            lse_log2: 0,
            semaphores: 0,
            seq_q_pad: workspace.seq_q_pad as i32,
            q_tiles: workspace.q_tiles as i32,
            num_kv_heads: f.shape.num_kv_heads as i32,
            kv_tiles: workspace.kv_tiles as i32,
            scale: f.softmax_scale(),
            pad_: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::test_problem as problem;
    use crate::problem::{Layout, TensorLayout};

    #[test]
    fn params_carry_offsets_strides_and_the_folded_scale() {
        let p = problem(64).with_causal(true).with_scale(0.5);
        let o = TensorLayout {
            offset: 8,
            ..TensorLayout::contiguous(Layout::Bhsd, 1000, 8, 64)
        };
        let p = p.with_tensor_layout(Tensor::O, o);
        let params = FwdParams::new(&p, [0x1000, 0x2000, 0x3000, 0x4000], 0x5000);
        assert_eq!(params.o, 0x4000 + 16);
        assert_eq!(params.o_seq_stride, 64);
        assert_eq!(params.o_head_stride, 1000 * 64);
        assert_eq!(params.q_seq_stride, 8 * 64);
        assert_eq!(params.k_seq_stride, 2 * 64);
        assert_eq!(params.group_size, 4);
        assert_eq!(params.causal_offset, 777 - 1000);
        assert_eq!(params.lse, 0x5000);
        assert!((params.scale_log2 - 0.5 * std::f32::consts::LOG2_E).abs() < 1e-7);
    }

    #[test]
    fn backward_params_carry_the_gradient_layouts_and_the_workspace_sizes() {
        use crate::cuda::plan::backward::{BackwardAddresses, CudaBackwardConfig, CudaBackwardPlan};
        let f = problem(64).with_causal(true).with_scale(0.25);
        let dq = TensorLayout {
            offset: 4,
            ..TensorLayout::contiguous(Layout::Bhsd, 1000, 8, 64)
        };
        let p = BackwardProblem::new(f).with_grad_layout(GradTensor::DQ, dq);
        let c = CudaBackwardConfig::new(DType::BF16, 64, CudaBackwardPlan::new(64, 64), true, 16, false).unwrap();
        let a = BackwardAddresses::spaced();
        let params = BwdParams::new(&p, &a, &c.workspace(&p));
        assert_eq!(params.fwd, FwdParams::new(&f, [0x1000, 0x2000, 0x3000, 0x4000], 0x5000));
        assert_eq!(params.dq, 0x7000 + 8);
        assert_eq!(params.dq_seq_stride, 64);
        assert_eq!(params.dq_head_stride, 1000 * 64);
        assert_eq!(params.dk_seq_stride, 2 * 64);
        assert_eq!(params.do_seq_stride, 8 * 64);
        assert_eq!((params.seq_q_pad, params.q_tiles, params.kv_tiles), (1024, 16, 13));
        assert_eq!(params.num_kv_heads, 2);
        assert_eq!(params.scale, 0.25);
    }
}
