//! Golden snapshot of everything the CUDA planning produces: for every table plan (both
//! kernels, every head_dim, dtype, masking and access width) the kernel name, the `-D` defines,
//! the compile job and its disk-cache file, block, shared memory and launch grid, or the refusal;
//! and for a set of problems (head_dim 64/128/256, causal or not, GQA, aligned and unaligned
//! strides, bf16/f16, Hopper or not) the selected kernel, the fallback reason, the geometry and
//! the parameter block's bytes.
//!
//! `golden/plans.txt` was written by the code before the plan types were split per kernel kind;
//! a refactor that keeps it passing compiles and launches the same kernels. A deliberate change
//! re-blesses it: `WGPU_FLASH_ATTN_BLESS=1 cargo test --features cuda --lib golden`, then review
//! the diff like any generated code.

use super::nvrtc::CompileJob;
use super::plan::{
    all_backward_configs, mma_plans, select_cuda, select_mma, vec_bytes_for, wgmma_plans, BackwardAddresses, BwdParams,
    CudaKernelConfig, CudaPlan, FwdParams,
};
use super::CUDA_HEAD_DIMS;
use crate::problem::backward::BackwardProblem;
use crate::problem::{AttentionProblem, AttentionShape, DType, Layout, Tensor, TensorLayout};

const GOLDEN: &str = include_str!("golden/plans.txt");
const GOLDEN_PATH: &str = "src/cuda/golden/plans.txt";

/// One line per table plan × dtype × masking × access width.
fn table_lines(out: &mut Vec<String>) {
    for head_dim in CUDA_HEAD_DIMS {
        let probe = super::test_problem(head_dim);
        let mma: Vec<CudaPlan> = mma_plans(head_dim).iter().map(|&p| p.into()).collect();
        let wgmma: Vec<CudaPlan> = wgmma_plans(head_dim).iter().map(|&p| p.into()).collect();
        let tables = [("mma", mma), ("wgmma", wgmma)];
        for (table, plans) in tables {
            for (i, &plan) in plans.iter().enumerate() {
                for dtype in [DType::BF16, DType::F16] {
                    for causal in [false, true] {
                        for vec_bytes in [16, 8] {
                            let at = format!(
                                "{table}[{i}] d{head_dim} {} causal={causal} vec={vec_bytes}",
                                dtype.name()
                            );
                            match CudaKernelConfig::new(dtype, head_dim, plan, causal, vec_bytes) {
                                Ok(c) => out.push(config_line(&at, &c, &probe)),
                                Err(e) => out.push(format!("{at}: refused: {e}")),
                            }
                        }
                    }
                }
            }
        }
    }
}

fn config_line(at: &str, c: &CudaKernelConfig, probe: &AttentionProblem) -> String {
    let job = CompileJob::forward(c, "sm_90a");
    let key = job.cache_key((13, 0), 13000);
    let mut probe = *probe;
    probe.dtype = c.dtype();
    let g = c.geometry(&probe.with_causal(c.causal()));
    format!(
        "{at}: {} | {} | source={} options={} | cache={} | geometry={g:?}",
        c.name(),
        c.defines().join(" "),
        job.source_name,
        job.options.join(" "),
        job.cache_file_name(key),
    )
}

/// The problems selection is pinned on, with a label each.
fn problems() -> Vec<(String, AttentionProblem)> {
    let mut out = Vec::new();
    for head_dim in [64, 96, 128, 256] {
        for dtype in [DType::BF16, DType::F16] {
            for causal in [false, true] {
                let tag = format!("d{head_dim} {} causal={causal}", dtype.name());
                let mha = AttentionProblem::mha(2, 1024, 4, head_dim, dtype).with_causal(causal);
                out.push((format!("{tag} mha bshd"), mha));
                out.push((format!("{tag} mha bhsd"), mha.with_layout(Layout::Bhsd)));
                let mut gqa = super::test_problem(head_dim).with_causal(causal);
                gqa.dtype = dtype;
                out.push((format!("{tag} gqa 8:2 ragged"), gqa));
                // Rows padded by 4 elements: 8-byte aligned only.
                let mut l = gqa.k_layout;
                l.seq_stride += 4;
                l.batch_stride = l.seq_stride * gqa.shape.seq_kv;
                out.push((format!("{tag} gqa k rows +4"), gqa.with_tensor_layout(Tensor::K, l)));
                // K broadcast over the batch: no tensor map.
                let mut l = gqa.k_layout;
                l.batch_stride = 0;
                out.push((
                    format!("{tag} gqa k batch stride 0"),
                    gqa.with_tensor_layout(Tensor::K, l),
                ));
                // O starting 8 elements into its buffer, with a scale.
                let o = TensorLayout {
                    offset: 8,
                    ..gqa.o_layout
                };
                out.push((
                    format!("{tag} gqa o offset 8 scale 0.5"),
                    gqa.with_tensor_layout(Tensor::O, o).with_scale(0.5),
                ));
                // seq_q < seq_kv, one query.
                let shape = AttentionShape {
                    batch: 3,
                    seq_q: 1,
                    seq_kv: 4097,
                    num_heads: 16,
                    num_kv_heads: 16,
                    head_dim,
                };
                out.push((
                    format!("{tag} decode"),
                    AttentionProblem::new(shape, dtype).with_causal(causal),
                ));
            }
        }
    }
    let mut f32 = AttentionProblem::mha(1, 64, 1, 64, DType::F32);
    out.push(("f32".into(), f32));
    f32.dtype = DType::BF16;
    f32.shape.num_heads = 70_000;
    f32.shape.num_kv_heads = 70_000;
    out.push(("70000 heads".into(), f32.with_layout(Layout::Bshd)));
    out
}

/// One line per problem × device × buffer placement: what the engine would launch.
fn selection_lines(out: &mut Vec<String>) {
    for (label, p) in problems() {
        // Buffers 16-byte aligned, and one starting 8 bytes in.
        for (place, bases) in [
            ("aligned", [0x1000, 0x20000, 0x40000, 0x60000]),
            ("q+8", [0x1008, 0x20000, 0x40000, 0x60000]),
        ] {
            let vec_bytes = match vec_bytes_for(&p, bases) {
                Ok(v) => v,
                Err(e) => {
                    out.push(format!("{label} {place}: buffers refused: {e}"));
                    continue;
                }
            };
            match select_mma(&p, vec_bytes) {
                Ok(c) => out.push(format!("{label} {place} vec={vec_bytes}: mma default {}", c.name())),
                Err(e) => out.push(format!("{label} {place} vec={vec_bytes}: mma default refused: {e}")),
            }
            for hopper in [false, true] {
                let at = format!("{label} {place} vec={vec_bytes} hopper={hopper}");
                match select_cuda(&p, vec_bytes, hopper) {
                    Ok(s) => {
                        let g = s.config.geometry(&p);
                        out.push(format!(
                            "{at}: {} fallback={:?} geometry={g:?}",
                            s.config.name(),
                            s.fallback
                        ));
                    }
                    Err(e) => out.push(format!("{at}: refused: {e}")),
                }
            }
            if p.validate().is_ok() {
                let params = FwdParams::new(&p, bases, 0x80000);
                out.push(format!("{label} {place}: params {}", hex(&params)));
            }
        }
    }
}

/// One line per backward config (the compile job, cache file, grids and workspace for the probe
/// problem), then the parameter block of the probe problem.
fn backward_lines(out: &mut Vec<String>) {
    for c in all_backward_configs() {
        let job = CompileJob::backward(&c, "sm_90a");
        let key = job.cache_key((13, 0), 13000);
        let mut probe = super::test_problem(c.head_dim as usize).with_causal(c.causal);
        probe.dtype = c.dtype;
        let p = BackwardProblem::new(probe);
        out.push(format!(
            "bwd {}: {} | source={} options={} | cache={} | main={:?} aux={:?} | workspace={:?}",
            c.name(),
            c.defines().join(" "),
            job.source_name,
            job.options.join(" "),
            job.cache_file_name(key),
            c.geometry(&p),
            c.aux_geometry(&p),
            c.workspace(&p),
        ));
    }
    let p = BackwardProblem::new(super::test_problem(128).with_causal(true));
    let a = BackwardAddresses {
        q: 0x1000,
        k: 0x20000,
        v: 0x40000,
        o: 0x60000,
        lse: 0x80000,
        d_o: 0xa0000,
        dq: 0xc0000,
        dk: 0xe0000,
        dv: 0x100000,
    };
    let c = all_backward_configs()[0];
    let params = BwdParams::new(&p, &a, &c.workspace(&p));
    // SAFETY: `BwdParams` is `#[repr(C)]` plain data without padding (the forward's block, 4
    // addresses, 12 strides, 4 addresses, 6 four-byte fields), so every byte is initialized.
    let bytes = unsafe {
        std::slice::from_raw_parts(
            &params as *const BwdParams as *const u8,
            std::mem::size_of::<BwdParams>(),
        )
    };
    out.push(format!(
        "bwd params d128 causal gqa 8:2 ragged: {}",
        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
    ));
}

/// The parameter block as the kernel receives it.
fn hex(params: &FwdParams) -> String {
    // SAFETY: `FwdParams` is `#[repr(C)]` plain data without padding (272 bytes: its four-byte
    // fields come in runs of even length between the eight-byte ones), so every byte is
    // initialized.
    let bytes = unsafe {
        std::slice::from_raw_parts(
            params as *const FwdParams as *const u8,
            std::mem::size_of::<FwdParams>(),
        )
    };
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn snapshot() -> String {
    let mut lines = Vec::new();
    table_lines(&mut lines);
    selection_lines(&mut lines);
    backward_lines(&mut lines);
    lines.join("\n") + "\n"
}

#[test]
fn plans_selection_and_params_match_the_golden_snapshot() {
    let now = snapshot();
    if std::env::var("WGPU_FLASH_ATTN_BLESS").as_deref() == Ok("1") {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(GOLDEN_PATH);
        std::fs::write(&path, &now).unwrap();
        return;
    }
    let (mut want, mut got) = (GOLDEN.lines(), now.lines());
    for line in 1.. {
        match (want.next(), got.next()) {
            (None, None) => break,
            (w, g) => assert_eq!(
                g, w,
                "{GOLDEN_PATH}:{line} differs (re-bless only for a deliberate change)"
            ),
        }
    }
}
