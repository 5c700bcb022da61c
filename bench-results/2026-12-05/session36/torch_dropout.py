"""PyTorch SDPA's forward with and without dropout (FlashAttention-2 and cuDNN backends), for
issue 17's dropout bar: b2 h16 s8192 d128 bf16 (examples/cuda_attention's shape), causal and not.
Median of 10 CUDA-event timings after 3 warm-up calls; one JSON line per run."""
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

b, h, s, d = 2, 16, 8192, 128
q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
print("#", torch.cuda.get_device_name(), "torch", torch.__version__, "cudnn", torch.backends.cudnn.version())
for backend in [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION]:
    for causal in [False, True]:
        for p in [0.0, 0.1]:
            try:
                with sdpa_kernel(backend):
                    def run():
                        return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=causal)

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
                flops = 4 * b * h * s * s * d * (0.5 if causal else 1.0)
                print(json.dumps({"backend": backend.name, "causal": causal, "dropout": p, "ms": round(ms, 4),
                                  "tflops": round(flops / ms / 1e9, 1)}))
            except Exception as e:  # a backend without dropout says so
                print(json.dumps({"backend": backend.name, "causal": causal, "dropout": p, "error": str(e)[:200]}))
