//! Dropout (src/problem/dropout.rs, shaders/dropout.wgsl) on the tiled forward and the backward's
//! gradient kernels:
//!
//! * the generator as the shader writes it (the wide product in each form the device runs: from
//!   16-bit halves, and as a 64-bit product; Philox4x32-7; the blocks of eight decisions)
//!   against the host's, word for word, on edge and random inputs;
//! * the masks the kernels draw, read off their outputs and compared with the host's bit for bit:
//!   the forward's through one-hot V rows (each output column is one key's dropped-out weight),
//!   the dK/dV kernel's through one-hot dO rows (each dV column is one query's), the dQ kernel's
//!   through one-hot K rows (each dQ column is one key's dS, whose sign is the bit) — for every
//!   tile plan and variant the device fits, packed sequences, causal masks and windows; and the
//!   keep rate against 1 − p;
//! * seeded random problems against the float64 reference with every variant beside dropout
//!   (causal, windows, GQA, packed batches, soft-caps, ALiBi, sinks, a bias), O and the LSE
//!   poisoned with NaN, forward on the caller's buffers and on host slices, and the gradients;
//! * the checks of p and the kernels that refuse dropout by name.

mod common;

use common::batches::Batch;
use common::dropout_masks::{self, assert_keep_rate, compare_masks};
use common::{below, coop_engines, engine_with, gpu, seed_of, shape, storage, submit_and_read, training};
use half::{bf16, f16};
use wgpu::util::DeviceExt;
use wgpu_flash_attn::batch::{Alibi, BatchIndex, BiasLayout, BiasValues, Dropout, ScoreBias};
use wgpu_flash_attn::gpu::readback::read_back;
use wgpu_flash_attn::kernel::{BackwardChoice, BackwardPass, CoopChoice, DecodeChoice, TiledChoice, Variant};
use wgpu_flash_attn::plan::PhiloxMultiply;
use wgpu_flash_attn::plan::{backward_plans, select_backward, select_forward, BoundsChecks, PLANS};
use wgpu_flash_attn::problem::backward::GradTensor;
use wgpu_flash_attn::problem::dropout::philox4x32;
use wgpu_flash_attn::testing::backward_harness::{grad_tolerance, BackwardWorkload};
use wgpu_flash_attn::testing::harness::{nan_bytes, tolerance};
use wgpu_flash_attn::testing::{random_qkv, random_tensor, ErrorStats, Rng};
use wgpu_flash_attn::wgsl::{DROPOUT, MUL_WIDE_HALVES, MUL_WIDE_U64};
use wgpu_flash_attn::{
    reference, AttentionProblem, BackwardInputs, BackwardProblem, DType, Element, Error, FlashAttention,
    ForwardBuffers, GpuContext, KernelChoice, Tensor, TensorBuffer,
};

/// The tests' dropout at `p`: a seed and an offset with bits set in both halves.
fn dropout(p: f32) -> Dropout {
    Dropout {
        p,
        seed: 0x5eed_0000_c0ff_ee42,
        offset: 0x0000_0003_0000_0011,
    }
}

// ------------------------------------------------------------------------- the generator

/// The shader's generator, cut from dropout.wgsl (its constants through `dropout_block`) after
/// `multiply`'s wide product, in a module that runs it on a list of inputs: per item, a Philox
/// counter, (key, a, b) for `philox4x32` and `mul_wide`, and (batch, head, row, col) for
/// `dropout_block` under the params' key and threshold. It writes the four words, then (the high
/// and low words of a · b, the block's eight bits: `first` in bits 0–3, `second` in 4–7).
fn generator_module(multiply: PhiloxMultiply) -> String {
    let generator = wgpu_flash_attn::testing::shader::wgsl_through_fn(DROPOUT, "const PHILOX_M0", "dropout_block")
        .expect("dropout.wgsl declares PHILOX_M0, then dropout_block");
    let mul_wide = match multiply {
        PhiloxMultiply::Halves => MUL_WIDE_HALVES,
        PhiloxMultiply::Wide => MUL_WIDE_U64,
    };
    format!(
        "{mul_wide}\nstruct Params {{ dropout_key0: u32, dropout_key1: u32, dropout_threshold: u32, dropout_scale: f32, \
         part_batch: u32, part_head: u32, part_row: u32, part_pad: u32 }}\n\
         @group(0) @binding(0) var<uniform> params: Params;\n\
         @group(0) @binding(1) var<storage, read> inputs: array<vec4<u32>>;\n\
         @group(0) @binding(2) var<storage, read_write> outputs: array<vec4<u32>>;\n\
         {generator}\n\
         fn bits(keep: vec4<bool>) -> u32 {{\n\
             return select(0u, 1u, keep.x) | select(0u, 2u, keep.y) | select(0u, 4u, keep.z) | select(0u, 8u, keep.w);\n\
         }}\n\
         @compute @workgroup_size(64)\n\
         fn main(@builtin(global_invocation_id) id: vec3<u32>) {{\n\
             let n = arrayLength(&outputs) / 2u;\n\
             if (id.x >= n) {{ return; }}\n\
             let counter = inputs[3u * id.x];\n\
             let extra = inputs[3u * id.x + 1u];\n\
             let at = inputs[3u * id.x + 2u];\n\
             outputs[2u * id.x] = philox4x32(counter, extra.xy);\n\
             let block = dropout_block(at.x, at.y, at.z, at.w);\n\
             let product = mul_wide(extra.z, extra.w);\n\
             outputs[2u * id.x + 1u] = vec4<u32>(product.y, bits(block.first) | (bits(block.second) << 4u), product.x, 0u);\n\
         }}\n"
    )
}

/// Runs [`generator_module`] on `inputs` (three vec4 per item) with `params`; two vec4 per item.
fn run_generator(ctx: &GpuContext, multiply: PhiloxMultiply, params: [u32; 8], inputs: &[[u32; 4]]) -> Vec<[u32; 4]> {
    let device = &ctx.device;
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("dropout generator"),
        source: wgpu::ShaderSource::Wgsl(generator_module(multiply).into()),
    });
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some("dropout generator"),
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    let items = inputs.len() / 3;
    let params = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: Some("generator params"),
        contents: bytemuck::cast_slice(&params),
        usage: wgpu::BufferUsages::UNIFORM,
    });
    let input = storage(ctx, "generator inputs", bytemuck::cast_slice(inputs));
    let size = (items * 32) as u64;
    let output = storage(ctx, "generator outputs", &vec![0xab; items * 32]);
    let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some("dropout generator"),
        layout: &pipeline.get_bind_group_layout(0),
        entries: &[
            wgpu::BindGroupEntry {
                binding: 0,
                resource: params.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 1,
                resource: input.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 2,
                resource: output.as_entire_binding(),
            },
        ],
    });
    let mut encoder = device.create_command_encoder(&Default::default());
    {
        let mut pass = encoder.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bind_group, &[]);
        pass.dispatch_workgroups((items as u32).div_ceil(64), 1, 1);
    }
    ctx.queue.submit([encoder.finish()]);
    let bytes = pollster::block_on(read_back(device, &ctx.queue, &[(&output, 0, size)])).expect("read back");
    bytemuck::cast_slice::<u8, u32>(&bytes[0])
        .chunks(4)
        .map(|w| [w[0], w[1], w[2], w[3]])
        .collect()
}

/// One input of the generator test: a Philox counter and key, the operands of a high multiply,
/// and the (batch, head, row, col) of a block.
type GeneratorItem = ([u32; 4], [u32; 2], [u32; 2], [u32; 4]);

/// The shader's wide product (in each form the device runs), Philox and blocks against the host's:
/// Random123's known answers,
/// operands at the carries' edges (all ones, one half full, the other empty) and random ones, and
/// blocks at rows and keys up to 2³¹ under two thresholds, in a whole problem and in a part of one
/// that starts elsewhere (batch entry 3, head 5, row 10: its blocks are the whole's there).
#[test]
fn the_shaders_generator_is_the_hosts() {
    let Some(ctx) = gpu() else { return };
    let mut rng = Rng::new(0xd0);
    let word = |rng: &mut Rng| rng.next_u64() as u32;
    let edges = [
        0,
        1,
        0xffff,
        0x1_0000,
        0xffff_0000,
        0x8000_0000,
        0x7fff_ffff,
        u32::MAX,
        0x0001_ffff,
    ];
    let mut items: Vec<GeneratorItem> = vec![
        ([0; 4], [0; 2], [0, 0], [0; 4]),
        ([u32::MAX; 4], [u32::MAX; 2], [u32::MAX, u32::MAX], [0, 0, 0, 0]),
        (
            [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
            [0xa409_3822, 0x299f_31d0],
            [0xffff, 0xffff],
            [0; 4],
        ),
    ];
    for &a in &edges {
        for &b in &edges {
            items.push(([a, b, b, a], [b, a], [a, b], [0; 4]));
        }
    }
    for _ in 0..4000 {
        let at = [
            word(&mut rng) >> 20,
            word(&mut rng) >> 24,
            word(&mut rng) >> 1,
            word(&mut rng) >> 1,
        ];
        items.push((
            [word(&mut rng), word(&mut rng), word(&mut rng), word(&mut rng)],
            [word(&mut rng), word(&mut rng)],
            [word(&mut rng), word(&mut rng)],
            at,
        ));
    }
    let mut forms = vec![PhiloxMultiply::Halves];
    if ctx.caps.shader_int64 {
        forms.push(PhiloxMultiply::Wide);
    }
    for (multiply, (p, origin)) in forms
        .into_iter()
        .flat_map(|m| [(0.5f32, [0u32; 3]), (0.1, [3, 5, 10])].map(|x| (m, x)))
    {
        let d = dropout(p);
        let key = d.key();
        let inputs: Vec<[u32; 4]> = items
            .iter()
            .flat_map(|(c, k, ab, at)| [*c, [k[0], k[1], ab[0], ab[1]], *at])
            .collect();
        let out = run_generator(
            ctx,
            multiply,
            [
                key[0],
                key[1],
                d.threshold(),
                (d.scale() as f32).to_bits(),
                origin[0],
                origin[1],
                origin[2],
                0,
            ],
            &inputs,
        );
        for (i, (counter, k, ab, at)) in items.iter().enumerate() {
            let want = philox4x32(*counter, *k);
            assert_eq!(out[2 * i], want, "{multiply:?}: philox {counter:x?} {k:x?}");
            let product = ab[0] as u64 * ab[1] as u64;
            let (hi, lo) = ((product >> 32) as u32, product as u32);
            assert_eq!(
                (out[2 * i + 1][0], out[2 * i + 1][2]),
                (hi, lo),
                "{multiply:?}: {:#x} · {:#x}",
                ab[0],
                ab[1]
            );
            let [b, h, row, col] = at.map(|x| x as usize);
            let [b, h, row] = [b + origin[0] as usize, h + origin[1] as usize, row + origin[2] as usize];
            let (row0, col0) = (row & !1, col & !3);
            let mut bits = 0;
            for r in 0..2 {
                for c in 0..4 {
                    if d.keeps(b, h, row0 + r, col0 + c) {
                        bits |= 1 << (4 * r + c);
                    }
                }
            }
            assert_eq!(out[2 * i + 1][1], bits, "{multiply:?}, p {p}: block at {at:?}");
        }
    }
}

// ------------------------------------------------------------------ masks, bit for bit

/// The forward's mask, read from its output (`forward_mask_check`). Returns (elements compared,
/// kept).
fn forward_mask_check<T: Element>(engine: &FlashAttention, batch: &Batch, label: &str) -> (usize, usize) {
    let p = &batch.problem;
    let index = batch.index();
    let (compared, kept, _) = dropout_masks::forward_mask_check::<T>(label, p, &index, |q, k, v| {
        let r = engine
            .forward_indexed_blocking(p, q, k, v, &index)
            .unwrap_or_else(|e| panic!("{label}: {e}"));
        (r.out, r.kernel)
    });
    (compared, kept)
}

/// The forward's mask is the host's, bit for bit, under every tile plan and variant the device
/// runs, for p = 0.5 and 0.1: batches and heads, GQA, lengths that are no multiple of a tile,
/// causal masks with more queries than keys, windows, packed sequences of different lengths.
/// Over all of it the keep rate is 1 − p within five standard deviations.
#[test]
fn the_forward_drops_exactly_the_hosts_mask() {
    let Some(ctx) = gpu() else { return };
    let mut variants = vec![Variant::WORKGROUP];
    if ctx.caps.subgroups {
        variants.push(Variant::SUBGROUP);
    }
    for p in [0.5f32, 0.1] {
        let (mut compared, mut kept) = (0, 0);
        let problems = [
            Batch::dense(AttentionProblem::new(shape(2, 70, 150, 4, 2, 64), DType::F32)),
            Batch::dense(AttentionProblem::new(shape(1, 130, 100, 2, 2, 64), DType::F32).with_causal(true)),
            Batch::dense(AttentionProblem::new(shape(1, 90, 90, 2, 1, 32), DType::F32).with_window(Some(20), Some(5))),
            Batch::packed(&[(37, 80), (1, 5), (90, 64)], 2, 1, 64, DType::F32),
        ];
        for (n, batch) in problems.into_iter().enumerate() {
            let mut batch = batch;
            batch.problem = batch.problem.with_dropout(dropout(p));
            for &variant in &variants {
                for plan in PLANS {
                    let choice = KernelChoice::Tiled(TiledChoice {
                        variant: Some(variant),
                        plan: Some(plan),
                    });
                    let engine = engine_with(ctx, choice);
                    if engine.select(&batch.problem).is_err() {
                        continue; // a plan this device cannot run
                    }
                    let label = format!("p {p}, problem {n}, {} {}", variant.name(), plan.label());
                    let (c, k) = forward_mask_check::<f32>(&engine, &batch, &label);
                    compared += c;
                    kept += k;
                }
            }
        }
        // f16 storage and tiles, where the device has them.
        if ctx.caps.shader_f16 {
            let engine = engine_with(ctx, KernelChoice::variant(Variant::WORKGROUP_F16));
            let problem = AttentionProblem::new(shape(1, 50, 120, 2, 2, 64), DType::F16).with_dropout(dropout(p));
            let (c, k) = forward_mask_check::<f16>(&engine, &Batch::dense(problem), &format!("p {p}, f16 tiles"));
            compared += c;
            kept += k;
        }
        assert_keep_rate(&format!("p {p}"), &dropout(p), compared, kept);
    }
}

/// The cooperative-matrix kernel's mask is the host's too, bit for bit, on each softmax route and
/// way of streaming K/V (f16, on devices with 16×16 f16 cooperative matrices: the H200), for
/// p = 0.5 and 0.1: batches and heads, GQA, causal with more queries than keys, a window, packed
/// sequences of different lengths.
#[test]
fn the_cooperative_forward_drops_exactly_the_hosts_mask() {
    let Some(ctx) = gpu() else { return };
    let engines = coop_engines(ctx);
    for p in [0.5f32, 0.1] {
        let (mut compared, mut kept) = (0, 0);
        for (route, engine) in &engines {
            let problems = [
                Batch::dense(AttentionProblem::new(shape(2, 70, 150, 4, 2, 64), DType::F16)),
                Batch::dense(AttentionProblem::new(shape(1, 130, 100, 2, 2, 64), DType::F16).with_causal(true)),
                Batch::dense(
                    AttentionProblem::new(shape(1, 90, 90, 2, 1, 32), DType::F16).with_window(Some(20), Some(5)),
                ),
                Batch::packed(&[(37, 80), (1, 5), (90, 64)], 2, 1, 64, DType::F16),
            ];
            for (n, mut batch) in problems.into_iter().enumerate() {
                batch.problem = batch.problem.with_dropout(dropout(p));
                let label = format!("p {p}, problem {n}, {route}");
                let (c, k) = forward_mask_check::<f16>(engine, &batch, &label);
                compared += c;
                kept += k;
            }
        }
        if compared > 0 {
            assert_keep_rate(&format!("p {p}, cooperative"), &dropout(p), compared, kept);
        }
    }
}

/// The gradient kernels' masks, read from their outputs: with dO's row i the unit vector e_i,
/// V all ones and K's row j the unit vector e_j (head_dim ≥ seq_q, seq_kv), dP_ij = 1, so
/// * dV[j][i] = P_ij·Z_ij·r (r = 1/(1 − p)): positive exactly where the dK/dV kernel keeps;
/// * dQ[i][j] = scale·dS_ij = scale·P_ij·(Z_ij·r − D_i): the two values a kept and a dropped
///   element would have differ by scale·P_ij·r, and the dQ kernel's bit is the one its output is
///   nearer (P_ij from the scores, scale·q_i[j], and the reference's LSE; D_i = O_i[i] from the
///   reference, whose mask is the host's — a different bit would move D_i by a P_ij², no more).
fn backward_mask_check(
    label: &str,
    batch: &Batch,
    grads: impl Fn(&[f32], &[f32], &[f32], &[f32]) -> (Vec<f32>, Vec<f32>),
) -> usize {
    let p = &batch.problem;
    let s = p.shape;
    let index = batch.index();
    let bp = BackwardProblem::new(*p);
    let q: Vec<f32> = random_tensor::<f32>(seed_of(label), p.required_len(Tensor::Q))
        .iter()
        .map(|x| 0.3 * x)
        .collect();
    let mut k = vec![0.0f32; p.required_len(Tensor::K)];
    let v = vec![1.0f32; p.required_len(Tensor::V)];
    let mut d_o = vec![0.0f32; bp.required_len(GradTensor::DO)];
    for b in 0..s.batch {
        let rows = index.sequence(p, b);
        for j in 0..rows.seq_kv {
            for g in 0..s.num_kv_heads {
                k[p.k_layout.index(b, rows.kv_first + j, g, j)] = 1.0;
            }
        }
        for i in 0..rows.seq_q {
            for h in 0..s.num_heads {
                d_o[bp.d_o_layout.index(b, rows.q_first + i, h, i)] = 1.0;
            }
        }
    }
    let want = reference::attention_indexed(p, &q, &k, &v, &index).unwrap();
    let (dq, dv) = grads(&q, &k, &v, &d_o);
    let scale = p.softmax_scale() as f64;
    let r = p.dropout.unwrap().scale();
    let mut compared = 0;
    for (what, grad) in [("dK/dV", &dv), ("dQ", &dq)] {
        let (c, _) = compare_masks(&format!("{label}: {what}"), p, &index, 0..s.num_heads, |b, h, i, j| {
            let rows = index.sequence(p, b);
            let row = rows.q_first + i;
            let x = if what == "dQ" {
                grad[bp.dq_layout.index(b, row, h, j)] as f64
            } else {
                grad[bp.dv_layout.index(b, rows.kv_first + j, h / p.group_size(), i)] as f64
            };
            assert!(x.is_finite(), "{label}: {what} = {x} at ({b}, {h}, {i}, {j})");
            if what == "dK/dV" {
                return Some(x > 0.0);
            }
            let lse = want.lse[p.lse_index(b, &rows, h, i)];
            let p_ij = (scale * q[p.q_layout.index(b, row, h, j)] as f64 - lse).exp();
            let d_i = want.out[p.o_layout.index(b, row, h, i)];
            let (kept, dropped) = (scale * p_ij * (r - d_i), -scale * p_ij * d_i);
            Some((x - kept).abs() < (x - dropped).abs())
        });
        compared += c;
    }
    compared
}

/// The kernels' generator multiplies in the device's form (`_dropout64` with 64-bit integers,
/// as on lavapipe, else `_dropout`): the other form, on a context that reports no 64-bit
/// integers, draws the host's mask too, in the forward and in both gradient kernels.
#[test]
fn the_halves_form_draws_the_hosts_mask_too() {
    let Some(ctx) = gpu() else { return };
    let mut halves = ctx.clone();
    halves.caps.shader_int64 = false;
    let engine = FlashAttention::new(&halves);
    let mut batch = Batch::packed(&[(40, 70), (64, 33), (9, 100)], 2, 2, 128, DType::F32);
    batch.problem = batch.problem.with_dropout(dropout(0.1));
    let forward = engine.select(&batch.problem).unwrap().name();
    let bp = BackwardProblem::new(batch.problem);
    let backward = select_backward(&bp, &halves.caps, &BackwardChoice::default()).unwrap();
    for name in [forward, backward.dkdv.name(), backward.dq.name()] {
        assert!(name.ends_with("_dropout"), "{name}");
    }
    forward_mask_check::<f32>(&engine, &batch, "halves");
    host_backward_mask_check(&engine, "halves, packed", &batch);
}

/// [`backward_mask_check`] through the host-slice calls: `engine`'s forward, then its backward
/// from that forward's O and LSE.
fn host_backward_mask_check(engine: &FlashAttention, label: &str, batch: &Batch) -> usize {
    let index = batch.index();
    let bp = BackwardProblem::new(batch.problem);
    backward_mask_check(label, batch, |q, k, v, d_o| {
        let fwd = engine
            .forward_indexed_blocking(&batch.problem, q, k, v, &index)
            .unwrap();
        let inputs = BackwardInputs {
            q,
            k,
            v,
            o: &fwd.out,
            lse: &fwd.lse,
            d_o,
        };
        let g = engine.backward_indexed_blocking(bp, &inputs, &index).unwrap();
        (g.dq, g.dv)
    })
}

/// Both gradient kernels regenerate the forward's mask bit for bit, under every plan of theirs the
/// device fits (the dK/dV kernel reads its blocks transposed), for two batch entries and heads,
/// keys and queries past one tile; and through the host-slice backward of packed sequences.
#[test]
fn the_gradient_kernels_regenerate_the_forwards_mask() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    for p in [0.5f32, 0.1] {
        // MHA: dV sums over a K/V head's query heads, which would mix their masks.
        let problems = [
            AttentionProblem::new(shape(2, 100, 120, 2, 2, 128), DType::F32),
            AttentionProblem::new(shape(1, 90, 70, 2, 2, 128), DType::F32)
                .with_causal(true)
                .with_window(Some(40), None),
        ];
        for problem in problems {
            let problem = problem.with_dropout(dropout(p));
            let batch = Batch::dense(problem);
            let bp = BackwardProblem::new(problem);
            let mut plans: Vec<_> = backward_plans(BackwardPass::DkDv)
                .iter()
                .chain(backward_plans(BackwardPass::Dq))
                .copied()
                .collect();
            plans.sort();
            plans.dedup();
            let mut ran = 0;
            for plan in plans {
                let suits = |pass| plan.is_well_formed_for(pass).then_some(plan);
                let choice = BackwardChoice {
                    variant: None,
                    dkdv_plan: suits(BackwardPass::DkDv),
                    dq_plan: suits(BackwardPass::Dq),
                    ..Default::default()
                };
                let Ok(config) = select_backward(&bp, &ctx.caps, &choice) else {
                    continue;
                };
                let label = format!("p {p}, {}", config.name());
                backward_mask_check(&label, &batch, |q, k, v, d_o| {
                    let work = BackwardWorkload::with_inputs(ctx, bp, q.to_vec(), k.to_vec(), v.to_vec(), d_o.to_vec())
                        .unwrap();
                    work.forward(&engine).unwrap();
                    let g = work.run(&engine, &config).unwrap_or_else(|e| panic!("{label}: {e}"));
                    (g.dq, g.dv)
                });
                ran += 1;
            }
            assert!(ran > 0, "no backward plan runs here");
        }
        // Packed sequences on host slices.
        let mut batch = Batch::packed(&[(40, 70), (64, 33), (9, 100)], 2, 2, 128, DType::F32);
        batch.problem = batch.problem.with_dropout(dropout(p));
        host_backward_mask_check(&engine, &format!("p {p}, packed"), &batch);
    }
}

// ------------------------------------------------------------------ against the reference

/// A random problem with dropout (p from 0.05 to 0.7) and, often, other variants beside it.
fn random_problem(rng: &mut Rng, dtype: DType) -> (AttentionProblem, Vec<u32>, Vec<u32>) {
    let kv_heads = [1, 2][below(rng, 2)];
    let heads = kv_heads * [1, 3][below(rng, 2)];
    let head_dim = [32, 64, 80][below(rng, 3)];
    let (mut p, cu_q, cu_k) = if below(rng, 4) == 0 {
        let lengths: Vec<(usize, usize)> = (0..1 + below(rng, 3))
            .map(|_| (1 + below(rng, 70), 1 + below(rng, 90)))
            .collect();
        let b = Batch::packed(&lengths, heads, kv_heads, head_dim, dtype);
        (b.problem, b.cu_q, b.cu_k)
    } else {
        let seq_q = 1 + below(rng, 90);
        let seq_kv = if below(rng, 3) == 0 { seq_q } else { 1 + below(rng, 110) };
        let shape = shape(1 + below(rng, 2), seq_q, seq_kv, heads, kv_heads, head_dim);
        (AttentionProblem::new(shape, dtype), Vec::new(), Vec::new())
    };
    p = p.with_causal(below(rng, 2) == 0);
    let d = Dropout {
        p: [0.05, 0.1, 0.3, 0.5, 0.7][below(rng, 5)],
        seed: rng.next_u64(),
        offset: rng.next_u64(),
    };
    p = p.with_dropout(d);
    match below(rng, 7) {
        0 => p = p.with_window(Some(below(rng, 30)), Some(below(rng, 30))),
        1 => p = p.with_softcap(4.0),
        2 => p.alibi = Some(Alibi::Geometric),
        3 => p = p.with_sinks(),
        4 if p.varlen.is_none() => {
            let dense = BiasLayout::dense(&p, below(rng, 2) == 0, true);
            p = p.with_bias(ScoreBias {
                dtype: DType::F32,
                layout: dense,
            });
        }
        _ => {}
    }
    (p, cu_q, cu_k)
}

fn label(p: &AttentionProblem, seed: u64) -> String {
    let s = p.shape;
    format!(
        "seed {seed}: b{} {}x{} h{}/{} d{} {} causal {} {:?} varlen {} window {:?} softcap {:?} alibi {:?} sinks {} bias {}",
        s.batch,
        s.seq_q,
        s.seq_kv,
        s.num_heads,
        s.num_kv_heads,
        s.head_dim,
        p.dtype.name(),
        p.causal,
        p.dropout.unwrap(),
        p.varlen.is_some(),
        p.window,
        p.softcap,
        p.alibi,
        p.sinks,
        p.bias.is_some()
    )
}

/// The side tensors a random problem needs: the index of its sequences, sinks, a bias.
struct Sides {
    cu_q: Vec<u32>,
    cu_k: Vec<u32>,
    sinks: Vec<f32>,
    bias: Vec<f32>,
}

impl Sides {
    fn new(p: &AttentionProblem, cu_q: Vec<u32>, cu_k: Vec<u32>, seed: u64) -> Self {
        let bias = p.bias.map_or(Vec::new(), |b| {
            let mut rng = Rng::new(seed ^ 0xb1a5);
            (0..b.required_len(p).unwrap()).map(|_| rng.normal() as f32).collect()
        });
        Sides {
            cu_q,
            cu_k,
            sinks: (0..p.shape.num_heads).map(|h| h as f32 * 0.5 - 1.0).collect(),
            bias,
        }
    }

    fn index(&self, p: &AttentionProblem) -> BatchIndex<'_> {
        BatchIndex {
            cu_seqlens_q: p.varlen.map(|_| &self.cu_q[..]),
            cu_seqlens_k: p.varlen.map(|_| &self.cu_k[..]),
            sinks: p.sinks.then_some(&self.sinks[..]),
            bias: p.bias.map(|_| BiasValues::F32(&self.bias)),
            ..BatchIndex::default()
        }
    }
}

/// The forward against the reference (whose mask is the host's), on the caller's buffers (O and
/// the LSE poisoned with NaN) or on host slices.
fn forward_case<T: Element>(
    ctx: &GpuContext,
    engine: &FlashAttention,
    p: &AttentionProblem,
    sides: &Sides,
    label: &str,
    on_device: bool,
) {
    let seed = seed_of(label);
    let (q, k, v): (Vec<T>, Vec<T>, Vec<T>) = random_qkv(p, seed);
    let index = sides.index(p);
    let (out, lse, kernel) = if on_device {
        let buf = |name, bytes: &[u8]| storage(ctx, name, bytes);
        let (qb, kb, vb) = (
            buf("q", bytemuck::cast_slice(&q)),
            buf("k", bytemuck::cast_slice(&k)),
            buf("v", bytemuck::cast_slice(&v)),
        );
        let o = buf("o", &nan_bytes(p.dtype, p.required_len(Tensor::O)));
        let lse = buf("lse", &nan_bytes(DType::F32, p.lse_len()));
        let (cq, ck) = (
            buf("cu_q", bytemuck::cast_slice(&sides.cu_q)),
            buf("cu_k", bytemuck::cast_slice(&sides.cu_k)),
        );
        let sinks = buf("sinks", bytemuck::cast_slice(&sides.sinks));
        let bias = buf("bias", bytemuck::cast_slice(&sides.bias));
        let buffers = ForwardBuffers {
            cu_seqlens_q: p.varlen.map(|_| TensorBuffer::new(&cq)),
            cu_seqlens_k: p.varlen.map(|_| TensorBuffer::new(&ck)),
            sinks: p.sinks.then(|| TensorBuffer::new(&sinks)),
            bias: p.bias.map(|_| TensorBuffer::new(&bias)),
            ..ForwardBuffers::new(
                TensorBuffer::new(&qb),
                TensorBuffer::new(&kb),
                TensorBuffer::new(&vb),
                TensorBuffer::new(&o),
                Some(TensorBuffer::new(&lse)),
            )
        };
        let mut encoder = ctx.device.create_command_encoder(&Default::default());
        let kernel = engine
            .encode_forward(&mut encoder, p, &buffers, None)
            .unwrap_or_else(|e| panic!("{label}: {e}"));
        let (out, got_lse) = submit_and_read::<T>(ctx, encoder, &o, &lse).unwrap();
        (out, got_lse, kernel.name())
    } else {
        let r = engine
            .forward_indexed_blocking(p, &q, &k, &v, &index)
            .unwrap_or_else(|e| panic!("{label}: {e}"));
        (r.out, r.lse, r.kernel)
    };
    assert!(kernel.contains("_dropout"), "{label}: ran {kernel}");
    let want = reference::attention_indexed(p, &q, &k, &v, &index).unwrap();
    let t = tolerance(p.dtype);
    let o_stats = ErrorStats::from_pairs(out.iter().zip(&want.out).map(|(g, w)| (g.to_f64(), *w)));
    let lse_bad = lse.iter().zip(&want.lse).position(|(g, w)| {
        let g = *g as f64;
        !(g == *w || (g - w).abs() <= t.lse_max_abs * (1.0 + w.abs()))
    });
    assert!(
        o_stats.within(t.out_rel_l2, t.out_max_abs) && lse_bad.is_none(),
        "{label} ({kernel}, {}): O {o_stats}; first bad LSE {:?}",
        if on_device { "device" } else { "host" },
        lse_bad.map(|i| (i, lse[i], want.lse[i]))
    );
}

#[test]
fn dropout_matches_the_reference() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let mut rng = Rng::new(0xd20f);
    for seed in 0..24u64 {
        let (p, cu_q, cu_k) = random_problem(&mut rng, DType::ALL[seed as usize % 3]);
        let sides = Sides::new(&p, cu_q, cu_k, seed);
        let label = label(&p, seed);
        let on_device = seed % 2 == 0;
        match p.dtype {
            DType::F32 => forward_case::<f32>(ctx, &engine, &p, &sides, &label, on_device),
            DType::F16 => forward_case::<f16>(ctx, &engine, &p, &sides, &label, on_device),
            DType::BF16 => forward_case::<bf16>(ctx, &engine, &p, &sides, &label, on_device),
        }
    }
}

/// The cooperative-matrix kernel, forced (each softmax route and way of streaming K/V), with
/// dropout on random f16 problems (and the variants beside it), on the caller's buffers and on
/// host slices, against the reference.
#[test]
fn cooperative_dropout_matches_the_reference() {
    let Some(ctx) = gpu() else { return };
    let mut rng = Rng::new(0xc0d2);
    let mut seed = 0u64;
    for (route, engine) in coop_engines(ctx) {
        for _ in 0..3 {
            let (p, cu_q, cu_k) = random_problem(&mut rng, DType::F16);
            let sides = Sides::new(&p, cu_q, cu_k, seed);
            let label = format!("{} {route}", label(&p, seed));
            forward_case::<f16>(ctx, &engine, &p, &sides, &label, seed.is_multiple_of(2));
            seed += 1;
        }
    }
}

/// dQ, dK, dV (and the sinks' gradient) through dropout, on host slices, against the reference.
fn backward_case<T: Element>(engine: &FlashAttention, p: &AttentionProblem, sides: &Sides, label: &str) {
    let index = sides.index(p);
    let bp = BackwardProblem::new(*p);
    let step = training::step::<T>(engine, bp, &index, seed_of(label), label);
    let config = &step.got.config;
    assert!(
        config.dkdv.dropout.is_some() && config.dq.dropout.is_some(),
        "{label}: {}",
        config.name()
    );
    step.assert_grads_close(label);
    let (got, want) = (&step.got, &step.want);
    if p.sinks {
        let stats = ErrorStats::from_pairs(got.d_sinks.iter().zip(&want.d_sinks).map(|(g, w)| (*g as f64, *w)));
        let rel_l2 = grad_tolerance(p.dtype).rel_l2.max(1e-3);
        assert!(stats.rel_l2 <= rel_l2, "{label}: d_sinks {stats}");
    }
}

#[test]
fn dropout_backward_matches_the_reference() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let mut rng = Rng::new(0xbd20);
    for seed in 0..12u64 {
        let dtype = DType::ALL[seed as usize % 3];
        let (mut p, cu_q, cu_k) = random_problem(&mut rng, dtype);
        // head_dim 32 or 64: each size is a pipeline of its own to compile.
        p.shape.head_dim = 32 << (seed % 2);
        p = match p.varlen {
            Some(v) => p.with_varlen(v),
            None => p.with_layout(wgpu_flash_attn::Layout::Bshd),
        };
        if let Some(b) = p.bias {
            p.bias = Some(ScoreBias {
                layout: BiasLayout::dense(&p, b.layout.batch_stride != 0, true),
                ..b
            });
        }
        let sides = Sides::new(&p, cu_q, cu_k, seed);
        let label = label(&p, seed);
        match dtype {
            DType::F32 => backward_case::<f32>(&engine, &p, &sides, &label),
            DType::F16 => backward_case::<f16>(&engine, &p, &sides, &label),
            DType::BF16 => backward_case::<bf16>(&engine, &p, &sides, &label),
        }
    }
}

// ------------------------------------------------------------------ checks and refusals

/// p = 0 (or below 2⁻¹⁷) is no dropout: the plain kernel, the same bits. A problem with dropout
/// gives other outputs for another seed or offset, and the same for the same ones. p outside
/// [0, 1) is refused; so is dropout by the kernels without it, by name.
#[test]
fn checks_and_refusals() {
    let Some(ctx) = gpu() else { return };
    let engine = FlashAttention::new(ctx);
    let plain = AttentionProblem::mha(1, 40, 2, 64, DType::F32).with_causal(true);
    let n = plain.required_len(Tensor::Q);
    let (q, k, v): (Vec<f32>, Vec<f32>, Vec<f32>) = (random_tensor(1, n), random_tensor(2, n), random_tensor(3, n));
    let run = |p: &AttentionProblem| engine.forward_blocking(p, &q, &k, &v).unwrap();
    let base = run(&plain);
    for off in [0.0, 1e-6] {
        let r = run(&plain.with_dropout(dropout(off)));
        assert_eq!(r.kernel, base.kernel);
        assert_eq!(r.out, base.out, "p {off}");
    }
    let with = |d: Dropout| run(&plain.with_dropout(d));
    let a = with(dropout(0.2));
    let suffix = PhiloxMultiply::for_device(&ctx.caps).name_suffix();
    assert!(a.kernel.ends_with(suffix), "{}", a.kernel);
    assert_eq!(a.lse, base.lse, "the LSE is the undropped softmax's");
    assert_eq!(with(dropout(0.2)).out, a.out, "one seed and offset, one mask");
    assert_ne!(
        with(Dropout {
            seed: 1,
            ..dropout(0.2)
        })
        .out,
        a.out
    );
    assert_ne!(
        with(Dropout {
            offset: 1 << 40,
            ..dropout(0.2)
        })
        .out,
        a.out
    );

    for p in [-0.1f32, 1.0, f32::NAN, 1.0 - 1e-7] {
        let err = engine
            .forward_blocking(&plain.with_dropout(dropout(p)), &q, &k, &v)
            .unwrap_err();
        assert!(matches!(err, Error::InvalidProblem(_)), "p {p}: {err}");
    }

    let p = plain.with_dropout(dropout(0.1));
    let err = engine.naive_forward_blocking(&p, &q, &q, &q).unwrap_err().to_string();
    assert!(err.contains("dropout"), "{err}");
    let decode = engine_with(ctx, KernelChoice::Decode(DecodeChoice::default()));
    let err = decode.select(&p).unwrap_err().to_string();
    assert!(err.contains("dropout"), "{err}");
    // The cooperative-matrix kernel has it, forced or chosen automatically, on the H200's
    // written-down capabilities.
    let f16 = AttentionProblem { dtype: DType::F16, ..p };
    let h200 = wgpu_flash_attn::caps::fixtures::h200();
    for choice in [
        KernelChoice::CooperativeMatrix(CoopChoice::default()),
        KernelChoice::Auto,
    ] {
        let kernel = select_forward(&f16, &h200, &choice, BoundsChecks::default()).unwrap();
        let suffix = PhiloxMultiply::for_device(&h200).name_suffix();
        assert!(
            kernel.name().starts_with("flash_fwd_coop_") && kernel.name().ends_with(suffix),
            "{choice:?}: {}",
            kernel.name()
        );
    }
    // A decode-shaped problem goes to a prefill kernel (the decode kernel has no dropout).
    let one_row = AttentionProblem::new(shape(2, 1, 300, 8, 2, 64), DType::F16)
        .with_causal(true)
        .with_dropout(dropout(0.1));
    let kernel = engine.select(&one_row).unwrap();
    assert!(kernel.name().starts_with("flash_fwd_"), "{}", kernel.name());
}
