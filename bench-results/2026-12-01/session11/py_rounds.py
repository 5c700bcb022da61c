# Does the in-process Rust bench slow the Python route down afterwards?
import torch, statistics
import wgpu_flash_attn as fa
from wgpu_flash_attn import _native
b, s, h, d = 2, 8192, 16, 128
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
def ev(fn, n=30, w=5):
    for _ in range(w): fn()
    a, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n): fn()
    e.record(); e.synchronize(); return a.elapsed_time(e) / n
for causal in (False, True):
    f = lambda: fa.flash_attn_func(q, k, v, causal=causal)
    before = [ev(f) for _ in range(4)]
    rust = _native.cuda_bench_direct(_native.Problem("bfloat16", b, s, s, h, h, d, causal=causal), 0, 30, 5)[0]
    after = [ev(f) for _ in range(4)]
    torch.cuda.synchronize(); torch.cuda.empty_cache()
    after_empty = [ev(f) for _ in range(2)]
    print(f"causal={causal}: python before {' '.join('%.3f' % x for x in before)}; rust {rust:.3f}; "
          f"python after {' '.join('%.3f' % x for x in after)}; after empty_cache {' '.join('%.3f' % x for x in after_empty)}", flush=True)
