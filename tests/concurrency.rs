//! The hardening issue's concurrency findings: one engine shared by threads builds each pipeline
//! once and gives each thread the sequential result; the async API's futures can be spawned on a
//! multi-threaded executor (they are `Send` on native targets).

mod common;

use common::gpu;
use wgpu_flash_attn::{AttentionProblem, BackwardInputs, DType, FlashAttention, Tensor};

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 1000.0 - 0.5)
        .collect()
}

/// Two problems that need different pipelines (head_dim 32 and 64).
fn problems() -> [AttentionProblem; 2] {
    [
        AttentionProblem::mha(1, 33, 2, 32, DType::F32),
        AttentionProblem::mha(1, 33, 2, 64, DType::F32).with_causal(true),
    ]
}

type Inputs = (Vec<f32>, Vec<f32>, Vec<f32>);

fn inputs(p: &AttentionProblem) -> Inputs {
    let n = p.required_len(Tensor::Q);
    (values(n, 1), values(n, 2), values(n, 3))
}

fn assert_send<T: Send>(_: T) {}

/// Finding: the async API's futures were `!Send`, so they could not go to `tokio::spawn`. A
/// compile-time check: this file does not build if any of them is not `Send`. The futures are
/// never polled.
#[cfg(not(target_arch = "wasm32"))]
#[test]
fn async_api_futures_are_send() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let p = problems()[0];
    let (q, k, v) = inputs(&p);
    assert_send(engine.prepare(&p));
    assert_send(engine.forward(&p, &q, &k, &v));
    assert_send(engine.naive_forward(&p, &q, &k, &v));
    assert_send(engine.prepare_backward(p));
    let lse = vec![0.0f32; p.lse_len()];
    let grads = BackwardInputs {
        q: &q,
        k: &k,
        v: &v,
        o: &q,
        lse: &lse,
        d_o: &k,
    };
    assert_send(engine.backward(p, &grads));
    assert_send(wgpu_flash_attn::GpuContext::new());
}
