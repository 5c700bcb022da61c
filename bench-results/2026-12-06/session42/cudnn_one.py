"""One cuDNN SDPA forward inside cudaProfilerStart/Stop, after warm-up, for
`ncu --profile-from-start off`: python3 cudnn_one.py HEAD_DIM SEQ CAUSAL(0/1)."""
import sys
import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend

d, n, causal = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
heads, batch = 2048 // d, max(1, 16384 // n)
q = torch.randn(batch, heads, n, d, device="cuda", dtype=torch.bfloat16)
k, v = torch.randn_like(q), torch.randn_like(q)
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    for _ in range(5):
        F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
