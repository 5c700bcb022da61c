#!/usr/bin/env python3
"""PyTorch SDPA with an additive attention bias (attn_mask as a float tensor), beside plain SDPA:
the reference for our score-bias bar (BENCHMARKS.md, "Score bias"). The bias is one
[seq, seq] matrix per head, broadcast over the batch ([1, heads, seq, seq]), in the inputs' dtype.
Each backend that accepts a float mask is timed alone (FlashAttention-2 does not take one).

  python3 scripts/torch_sdpa_bias.py --seqs 8192 --head-dim 128 --batch 2 --heads 16 --dtype fp16
"""
import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}


def time_ms(fn, iters):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", default="8192")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dtype", choices=["bf16", "fp16"], default="fp16")
    ap.add_argument("--backends", default="flash,efficient,cudnn")
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    dtype = torch.float16 if args.dtype == "fp16" else torch.bfloat16
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    for seq in [int(s) for s in args.seqs.split(",")]:
        b, h, d = args.batch, args.heads, args.head_dim
        q, k, v = (torch.randn(b, h, seq, d, device="cuda", dtype=dtype) for _ in range(3))
        bias = torch.randn(1, h, seq, seq, device="cuda", dtype=dtype)
        flops = 4 * b * h * seq * seq * d
        row = {"batch": b, "heads": h, "seq": seq, "head_dim": d, "dtype": args.dtype}
        for name in args.backends.split(","):
            for with_bias in (False, True):
                mask = bias if with_bias else None
                key = f"{name}{'_bias' if with_bias else ''}"
                try:
                    with sdpa_kernel([BACKENDS[name]]):
                        ms = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask), args.iters)
                    row[key + "_ms"] = ms
                    row[key + "_tflops"] = flops / ms / 1e9
                    print(f"seq {seq} {key:16s} {ms:8.3f} ms {flops / ms / 1e9:7.1f} TFLOP/s")
                except RuntimeError as e:
                    print(f"seq {seq} {key:16s} unavailable: {str(e).splitlines()[0][:120]}")
        print(json.dumps(row))


if __name__ == "__main__":
    main()
