"""PyTorch SDPA's backward with and without dropout (FlashAttention-2 and cuDNN backends), beside
examples/cuda_backward's shape: b2 h16 s8192, head_dim 128 and 64, bf16, causal and not. The
forward runs once with requires_grad; the backward (out.backward(dO, retain_graph=True)) is timed:
median of 10 CUDA-event timings after 3 warm-up calls; TFLOP/s count 2.5 x the forward's FLOPs
(halved when causal), as examples/cuda_backward does. One JSON line per run."""
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

print("#", torch.cuda.get_device_name(), "torch", torch.__version__, "cudnn", torch.backends.cudnn.version())
b, s = 2, 8192
for d in [128, 64]:
    h = 2048 // d
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    d_o = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)
    for backend in [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION]:
        for causal in [False, True]:
            for p in [0.0, 0.1]:
                try:
                    with sdpa_kernel(backend):
                        out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=causal)

                        def run():
                            out.backward(d_o, retain_graph=True)

                        for _ in range(3):
                            run()
                        torch.cuda.synchronize()
                        times = []
                        for _ in range(10):
                            start = torch.cuda.Event(enable_timing=True)
                            end = torch.cuda.Event(enable_timing=True)
                            start.record()
                            run()
                            end.record()
                            torch.cuda.synchronize()
                            times.append(start.elapsed_time(end))
                    ms = sorted(times)[len(times) // 2]
                    flops = 2.5 * 4 * b * h * s * s * d / (2 if causal else 1)
                    row = {"backend": backend.name, "head_dim": d, "causal": causal, "dropout": p, "ms": round(ms, 4),
                           "tflops": round(flops / ms / 1e9, 1)}
                except Exception as e:  # a backend that refuses a case says so
                    row = {"backend": backend.name, "head_dim": d, "causal": causal, "dropout": p, "error": str(e)[:200]}
                print(json.dumps(row), flush=True)
    del q, k, v, d_o, out
