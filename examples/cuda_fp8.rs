//! FP8 attention on Hopper: throughput of the FP8 forward beside our bf16 forward, and
//! FlashAttention-3's accuracy experiment (issue 19).
//!
//! ```text
//! cargo run --release --features cuda,internals --example cuda_fp8 -- \
//!     [--bench] [--accuracy] [--sweep] [--plans 0,3,8] [--rounds 1] [--head-dims 128,256] \
//!     [--seq 8192] [--tokens 16384] [--reps 20] [--magnitudes 10,100,1000]
//! ```
//!
//! `--bench` (the default): batch × seq = `--tokens`, hidden 2048 (16 heads at head_dim 128, 8
//! at 256), head_dim 128 and 256, causal and not: the FP8 forward (per-block scales; the
//! quantization timed apart) and the bf16 wgmma forward, each the median of `--reps`
//! event-timed calls after warm-up; TFLOP/s at `4·B·H·S²·D` (halved when causal); the FP8
//! output's relative L2 distance from the bf16 one printed beside. `--sweep` times every FP8
//! plan instead of the default (`--plans`: those of its indices), `--rounds` times over, the
//! plans taking turns.
//!
//! `--accuracy`: Q and K (then Q, K and V) from N(0, 1) with 0.1% of the entries `--magnitudes`
//! times larger; batch 1, 4 heads, seq 1024, head_dim 128; RMSE of O against the float64 reference of
//! those inputs for the bf16 forward, FP8 with one scale per tensor, per block, and per block
//! with the Hadamard rotation (and the same without outliers).

use half::bf16;
use wgpu_flash_attn::cuda::plan::fp8_plans;
use wgpu_flash_attn::cuda::{CudaAttention, CudaDevice, DeviceTensors, Fp8Config, Fp8Quantization};
use wgpu_flash_attn::testing::timing::cuda_median_ms;
use wgpu_flash_attn::testing::{outlier_tensor, random_tensor, ErrorStats};
use wgpu_flash_attn::{reference, AttentionProblem, DType, Result, Tensor};

fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn bench(attn: &CudaAttention, args: &[String]) -> Result<()> {
    let seq: usize = arg(args, "--seq", 8192);
    let tokens: usize = arg(args, "--tokens", 16384);
    let reps: usize = arg(args, "--reps", 20);
    let sweep = args.iter().any(|a| a == "--sweep");
    let rounds: usize = arg(args, "--rounds", 1);
    let list = |name: &str, default: &str| -> Vec<usize> {
        let text: String = arg(args, name, default.to_string());
        let number = |x: &str| {
            x.trim()
                .parse()
                .unwrap_or_else(|_| panic!("{name}: {x:?} is not a number"))
        };
        text.split(',').filter(|x| !x.trim().is_empty()).map(number).collect()
    };
    let picked = list("--plans", "");
    let dev = attn.device();
    let stream = dev.stream();
    for head_dim in list("--head-dims", "128,256") {
        let heads = 2048 / head_dim;
        let batch = (tokens / seq).max(1);
        for causal in [false, true] {
            let p = AttentionProblem::mha(batch, seq, heads, head_dim, DType::BF16).with_causal(causal);
            let n = p.required_len(Tensor::Q);
            let up =
                |seed| stream.clone_htod(&bytemuck::cast_slice::<bf16, u16>(&random_tensor::<bf16>(seed, n)).to_vec());
            let (q, k, v) = (up(1)?, up(2)?, up(3)?);
            let mut o = stream.alloc_zeros::<u16>(p.required_len(Tensor::O))?;
            let mut o16 = stream.alloc_zeros::<u16>(p.required_len(Tensor::O))?;
            let mut lse = stream.alloc_zeros::<f32>(p.lse_len())?;
            let flops = p.flops();
            let tf = |ms: f64| flops / (ms * 1e-3) / 1e12;
            let label = format!("d{head_dim} s{seq} b{batch} h{heads} causal={causal:<5}");

            let mut bf16_config = String::new();
            let ms16 = cuda_median_ms(dev, 3, reps, || {
                let t = DeviceTensors {
                    q: &q,
                    k: &k,
                    v: &v,
                    o: &mut o16,
                    lse: Some(&mut lse),
                };
                bf16_config = attn.forward_device(&p, t)?.name();
                Ok(())
            })?;
            println!(
                "bf16 {label} {bf16_config:<52} {ms16:>8.3} ms {:>7.1} TFLOP/s",
                tf(ms16)
            );

            let quant = Fp8Quantization::per_block();
            let x = attn.quantize_fp8(&p, &q, &k, &v, quant)?;
            let msq = cuda_median_ms(dev, 3, reps, || attn.quantize_fp8(&p, &q, &k, &v, quant).map(|_| ()))?;
            let bytes = 3.0 * n as f64 * 2.0;
            println!(
                "quant {label} per-block {msq:>8.3} ms ({:.2} TB/s of bf16 read)",
                bytes / (msq * 1e-3) / 1e12
            );
            let plans = if sweep {
                let all = fp8_plans(head_dim);
                if picked.is_empty() {
                    all
                } else {
                    let plan = |&i: &usize| {
                        *all.get(i)
                            .unwrap_or_else(|| panic!("--plans: no plan {i} of {}", all.len()))
                    };
                    picked.iter().map(plan).collect()
                }
            } else {
                vec![wgpu_flash_attn::cuda::plan::default_fp8_plan(head_dim, causal, seq)]
            };
            for plan in (0..rounds).flat_map(|_| plans.iter().copied()) {
                let mut name = String::new();
                let ms = cuda_median_ms(dev, 3, reps, || {
                    name = attn
                        .forward_fp8_device(&p, &x, &mut o, Some(&mut lse), Some(plan))?
                        .name();
                    Ok(())
                });
                let ms = match ms {
                    Ok(ms) => ms,
                    Err(e) => {
                        println!("fp8  {label} {plan:?}: {e}");
                        continue;
                    }
                };
                let info = attn.prepare_fp8(&Fp8Config::new(DType::BF16, head_dim, plan, causal)?)?;
                let got: Vec<u16> = stream.clone_dtoh(&o)?;
                let want: Vec<u16> = stream.clone_dtoh(&o16)?;
                let as_f64 = |b: u16| bf16::from_bits(b).to_f64();
                let d = ErrorStats::from_pairs(got.iter().zip(&want).map(|(&g, &w)| (as_f64(g), as_f64(w))));
                println!(
                    "fp8  {label} {name:<52} {ms:>8.3} ms {:>7.1} TFLOP/s  {:.2}x bf16  vs bf16 O: rel L2 {:.2e}  regs {} local {}",
                    tf(ms),
                    ms16 / ms,
                    d.rel_l2,
                    info.num_regs,
                    info.local_bytes
                );
            }
        }
    }
    Ok(())
}

fn accuracy(attn: &CudaAttention, args: &[String]) -> Result<()> {
    let magnitudes: String = arg(args, "--magnitudes", "10,100,1000".to_string());
    let p = AttentionProblem::mha(1, 1024, 4, 128, DType::BF16);
    let n = p.required_len(Tensor::Q);
    // Outliers in Q and K (what the rotation acts on), then in V too (as issue 19 words it).
    let mut cases = vec![("normal", 0.0, 1.0, false)];
    for m in magnitudes.split(',').filter_map(|m| m.parse::<f64>().ok()) {
        cases.push(("0.1% outliers in Q, K", 1e-3, m, false));
        cases.push(("0.1% outliers in Q, K, V", 1e-3, m, true));
    }
    for (label, rate, magnitude, in_v) in cases {
        let q: Vec<bf16> = outlier_tensor(11, n, rate, magnitude);
        let k: Vec<bf16> = outlier_tensor(12, n, rate, magnitude);
        let v: Vec<bf16> = if in_v {
            outlier_tensor(13, n, rate, magnitude)
        } else {
            random_tensor(13, n)
        };
        let want = reference::attention(&p, &q, &k, &v)?;
        let rmse = |out: &[bf16]| {
            (out.iter()
                .zip(&want.out)
                .map(|(g, w)| (g.to_f64() - w).powi(2))
                .sum::<f64>()
                / out.len() as f64)
                .sqrt()
        };
        let bf16_rmse = rmse(&attn.forward(&p, &q, &k, &v)?.out);
        println!("accuracy {label} (magnitude {magnitude}): bf16 RMSE {bf16_rmse:.3e}");
        for (name, quant) in [
            ("FP8 per-tensor", Fp8Quantization::per_tensor()),
            ("FP8 per-block", Fp8Quantization::per_block()),
            (
                "FP8 per-block + Hadamard",
                Fp8Quantization::per_block().with_hadamard(0x5eed),
            ),
            (
                "FP8 per-tensor + Hadamard",
                Fp8Quantization::per_tensor().with_hadamard(0x5eed),
            ),
        ] {
            let e = rmse(&attn.forward_fp8(&p, &q, &k, &v, quant)?.out);
            println!(
                "accuracy {label} (magnitude {magnitude}): {name:<26} RMSE {e:.3e} ({:.2}x bf16)",
                e / bf16_rmse
            );
        }
    }
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let attn = CudaAttention::new(CudaDevice::new(0)?);
    println!("device: {}", attn.device().name());
    let acc = args.iter().any(|a| a == "--accuracy");
    if acc {
        accuracy(&attn, &args)?;
    }
    if args.iter().any(|a| a == "--bench") || !acc {
        bench(&attn, &args)?;
    }
    Ok(())
}
