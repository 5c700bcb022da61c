# Host cost of one flash_attn_func call on CUDA tensors: a tiny problem (the kernel takes
# microseconds), timed per call with a synchronize only at the end, then profiled.
import cProfile, pstats, time, torch, io
import wgpu_flash_attn as fa
q, k, v = (torch.randn(1, 128, 4, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
for causal in (False, True):
    for _ in range(20): fa.flash_attn_func(q, k, v, causal=causal)
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(500): fa.flash_attn_func(q, k, v, causal=causal)
    torch.cuda.synchronize(); print(f"causal={causal}: {(time.perf_counter() - t) / 500 * 1e6:.1f} us per call (host-bound)")
pr = cProfile.Profile(); pr.enable()
for _ in range(300): fa.flash_attn_func(q, k, v, causal=True)
pr.disable(); torch.cuda.synchronize()
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(18); print(s.getvalue()[:6000])
q, k, v = (torch.randn(2, 8192, 16, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
for causal in (False, True):
    for _ in range(3): fa.flash_attn_func(q, k, v, causal=causal)
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(30): fa.flash_attn_func(q, k, v, causal=causal)
    t1 = time.perf_counter(); torch.cuda.synchronize(); t2 = time.perf_counter()
    print(f"8k causal={causal}: enqueue {(t1 - t) / 30 * 1e3:.3f} ms per call, total {(t2 - t) / 30 * 1e3:.3f} ms per call")
