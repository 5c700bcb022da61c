"""Zero copy, by timing: ``flash_attn_func`` on PyTorch CUDA tensors against the library's own
Rust call (``CudaAttention::forward_device`` on buffers it allocated, on its own stream), same
shape, same kernel, both timed with CUDA events over many back-to-back calls, in alternating
rounds, each after the GPU has rested for a second (the Rust call's own set-up idles the GPU that
long; on the H200, Python timings back to back without rest ran 8% slower than rested ones, as
the clocks drop under sustained load). Prints the medians' TFLOP/s and their ratio; exits 1 when
the Python call runs below 95% of the Rust call's rate.

Default shape: batch 2, 16 heads of 128, seq 8192, bf16 (the README's H200 table), non-causal and
causal. ``--peers`` adds PyTorch's own SDPA backends (FlashAttention-2, cuDNN) on the same tensors.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

import wgpu_flash_attn as fa
from wgpu_flash_attn import _interface, _native


def timed(fn, iters, warmup):
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=5, help="alternating timings of each route")
    ap.add_argument("--rest", type=float, default=1.0, help="seconds the GPU idles before each Python timing")
    ap.add_argument("--peers", action="store_true", help="also time PyTorch's SDPA flash and cuDNN backends")
    ap.add_argument("--min-ratio", type=float, default=0.95)
    args = ap.parse_args()
    b, h, s, d = args.batch, args.heads, args.seq, args.head_dim
    dtype = getattr(torch, args.dtype)
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=dtype) for _ in range(3))
    print(f"{torch.cuda.get_device_name()}, PyTorch {torch.__version__}; batch {b}, heads {h}, seq {s}, head_dim {d}, {args.dtype}")
    worst = float("inf")
    for causal in (False, True):
        flops = 4 * b * h * s * s * d / (2 if causal else 1)
        tflops = lambda ms: flops / ms / 1e9  # noqa: E731
        problem = _native.Problem(args.dtype, b, s, s, h, h, d, causal=causal)
        py_runs, rust_runs = [], []
        for _ in range(max(1, args.rounds)):
            torch.cuda.synchronize()
            time.sleep(args.rest)
            py_runs.append(timed(lambda: fa.flash_attn_func(q, k, v, causal=causal), args.iters, args.warmup))
            rust_ms, rust_kernel = _native.cuda_bench_direct(problem, 0, args.iters, args.warmup)
            rust_runs.append(rust_ms)
        launch = dict(_interface._last_cuda_launch)
        py_ms, rust_ms = statistics.median(py_runs), statistics.median(rust_runs)
        ratio = rust_ms / py_ms
        worst = min(worst, ratio)
        zero_copy = launch["q"] == q.data_ptr() and launch["k"] == k.data_ptr() and launch["v"] == v.data_ptr()
        print(
            f"causal={causal}: python {py_ms:.3f} ms {tflops(py_ms):.0f} TFLOP/s ({launch['kernel']}); "
            f"rust {rust_ms:.3f} ms {tflops(rust_ms):.0f} TFLOP/s ({rust_kernel}); python/rust {ratio:.3f}; "
            f"launched on the tensors' own memory: {zero_copy}"
        )
        print(f"  rounds (ms): python {' '.join(f'{x:.3f}' for x in py_runs)}; rust {' '.join(f'{x:.3f}' for x in rust_runs)}")
        if args.peers:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
            for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                try:
                    with sdpa_kernel(backend):
                        ms = timed(
                            lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal),
                            args.iters,
                            args.warmup,
                        )
                    print(f"  PyTorch SDPA {name}: {ms:.3f} ms {tflops(ms):.0f} TFLOP/s")
                except RuntimeError as e:
                    print(f"  PyTorch SDPA {name}: unavailable ({str(e).splitlines()[0]})")
    ok = worst >= args.min_ratio
    print(f"{'ok' if ok else 'FAILED'}: python/rust >= {args.min_ratio} (worst {worst:.3f})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
