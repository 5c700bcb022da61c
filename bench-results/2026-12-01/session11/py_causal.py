# Why is the Python route's causal call slower than the Rust call on the same kernel?
import torch
import wgpu_flash_attn as fa
from wgpu_flash_attn import _native, _interface
b, s, h, d = 2, 8192, 16, 128
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
def ev(fn, n=30, w=5):
    for _ in range(w): fn()
    a, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n): fn()
    e.record(); e.synchronize(); return a.elapsed_time(e) / n
addr = _interface._device_address
for causal in (True, False, True):
    rust = _native.cuda_bench_direct(_native.Problem("bfloat16", b, s, s, h, h, d, causal=causal), 0, 30, 5)[0]
    func = ev(lambda: fa.flash_attn_func(q, k, v, causal=causal))
    out = torch.empty_like(q); lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
    layouts = {n: (0, x.stride(0), x.stride(1), x.stride(2)) for n, x in (("q", q), ("k", k), ("v", v))}
    problem = _native.Problem("bfloat16", b, s, s, h, h, d, causal=causal, layouts=layouts)
    stream = torch.cuda.current_stream().cuda_stream
    fixed = ev(lambda: _native.cuda_forward(problem, 0, stream, addr(q), addr(k), addr(v), addr(out), addr(lse)))
    plain = _native.Problem("bfloat16", b, s, s, h, h, d, causal=causal)
    fixed_plain = ev(lambda: _native.cuda_forward(plain, 0, stream, addr(q), addr(k), addr(v), addr(out), addr(lse)))
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        on_side = ev(lambda: fa.flash_attn_func(q, k, v, causal=causal))
    q2, k2, v2 = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) * 0.0 + 1.0 for _ in range(3))
    print(f"causal={causal}: rust {rust:.3f} ms; flash_attn_func {func:.3f}; native fixed O {fixed:.3f}; "
          f"native fixed O, no layouts {fixed_plain:.3f}; flash_attn_func on a side stream {on_side:.3f}", flush=True)
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
    for _ in range(10): fa.flash_attn_func(q, k, v, causal=True)
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=10)[:4000])
