//! One training step on host slices, as the backward tests run it: seeded inputs, the engine's
//! forward, then its backward on that forward's O and LSE, and the float64 reference's gradients
//! for the same inputs.
#![allow(dead_code)]

use wgpu_flash_attn::batch::BatchIndex;
use wgpu_flash_attn::reference::{self, ReferenceGrads};
use wgpu_flash_attn::testing::backward_harness::assert_grads_close;
use wgpu_flash_attn::testing::{random_qkv, random_tensor};
use wgpu_flash_attn::{BackwardInputs, BackwardOutput, BackwardProblem, Element, FlashAttention, GradTensor};

/// The inputs of a step, the engine's gradients and the reference's.
pub struct Step<T> {
    pub problem: BackwardProblem,
    pub q: Vec<T>,
    pub k: Vec<T>,
    pub v: Vec<T>,
    pub d_o: Vec<T>,
    pub got: BackwardOutput<T>,
    pub want: ReferenceGrads,
}

/// Q, K, V seeded from `seed` ([`random_qkv`]) and dO from `seed + 7`, the engine's forward of
/// `bp.forward` and backward of `bp` with the side tensors `index`, and the reference's
/// gradients. A refused call panics with `label`.
pub fn step<T: Element>(
    engine: &FlashAttention,
    bp: BackwardProblem,
    index: &BatchIndex<'_>,
    seed: u64,
    label: &str,
) -> Step<T> {
    let p = &bp.forward;
    let (q, k, v): (Vec<T>, Vec<T>, Vec<T>) = random_qkv(p, seed);
    let d_o: Vec<T> = random_tensor(seed.wrapping_add(7), bp.required_len(GradTensor::DO));
    let fwd = engine
        .forward_indexed_blocking(p, &q, &k, &v, index)
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    let inputs = BackwardInputs {
        q: &q,
        k: &k,
        v: &v,
        o: &fwd.out,
        lse: &fwd.lse,
        d_o: &d_o,
    };
    let got = engine
        .backward_indexed_blocking(bp, &inputs, index)
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    let want = reference::attention_backward_indexed(&bp, &q, &k, &v, &d_o, index).unwrap();
    Step {
        problem: bp,
        q,
        k,
        v,
        d_o,
        got,
        want,
    }
}

impl<T: Element> Step<T> {
    /// dQ, dK and dV within the tests' bounds of the reference's ([`assert_grads_close`]); a
    /// failure names `label` and the kernels.
    pub fn assert_grads_close(&self, label: &str) {
        let (got, want) = (&self.got, &self.want);
        assert_grads_close(
            self.problem.forward.dtype,
            &format!("{label} ({})", got.config.name()),
            [&got.dq, &got.dk, &got.dv],
            [&want.dq, &want.dk, &want.dv],
        );
    }
}
