//! The hardening issue's concurrency findings: one engine shared by threads builds each pipeline
//! once and gives each thread the sequential result; the async API's futures can be spawned on a
//! multi-threaded executor (they are `Send` on native targets).

mod common;

use std::sync::Barrier;

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
/// A call's O and LSE.
type Output = (Vec<f32>, Vec<f32>);

fn inputs(p: &AttentionProblem) -> Inputs {
    let n = p.required_len(Tensor::Q);
    (values(n, 1), values(n, 2), values(n, 3))
}

/// 16 threads on one fresh engine, released together into their first call; thread `i` runs
/// `problems[i % problems.len()]`. Returns each thread's (O, LSE) and the engine's builds.
fn race(problems: &[AttentionProblem], data: &[Inputs]) -> (Vec<Output>, usize) {
    const THREADS: usize = 16;
    let engine = FlashAttention::new(gpu().unwrap());
    let start = Barrier::new(THREADS);
    let outputs = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|i| {
                let (engine, start) = (&engine, &start);
                let (p, (q, k, v)) = (&problems[i % problems.len()], &data[i % problems.len()]);
                s.spawn(move || {
                    start.wait();
                    let r = engine.forward_blocking(p, q, k, v).unwrap();
                    (r.out, r.lse)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    (outputs, engine.pipeline_builds())
}

/// Finding: concurrent first use built a pipeline once per racing thread.
#[test]
fn concurrent_first_use_builds_each_pipeline_once() {
    let Some(ctx) = gpu() else { return };
    let problems = problems();
    let data: Vec<Inputs> = problems.iter().map(inputs).collect();
    let sequential = FlashAttention::new(ctx);
    let expected: Vec<Output> = problems
        .iter()
        .zip(&data)
        .map(|(p, (q, k, v))| {
            let r = sequential.forward_blocking(p, q, k, v).unwrap();
            (r.out, r.lse)
        })
        .collect();
    assert_eq!(sequential.pipeline_builds(), 2, "the two problems need two pipelines");

    for n in [1, 2] {
        let (outputs, builds) = race(&problems[..n], &data[..n]);
        assert_eq!(builds, n, "{n} problem(s) raced by 16 threads: one build per pipeline");
        for (i, (out, lse)) in outputs.iter().enumerate() {
            let (want_out, want_lse) = &expected[i % n];
            // Bit-identical: the same kernel on the same inputs.
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(out),
                bits(want_out),
                "thread {i}: O differs from the sequential run"
            );
            assert_eq!(
                bits(lse),
                bits(want_lse),
                "thread {i}: LSE differs from the sequential run"
            );
        }
    }
}

fn assert_send<T: Send>(_: T) {}

/// Finding: the async API's futures were `!Send`, so they could not go to `tokio::spawn`. A
/// compile-time check: this file does not build if any of them is not `Send`. The futures are
/// never polled.
#[cfg(not(target_arch = "wasm32"))]
#[test]
fn async_api_futures_are_send() {
    fn shared_by_threads<T: Send + Sync>() {}
    shared_by_threads::<FlashAttention>();
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
