#!/usr/bin/env python3
"""The table of BENCHMARKS.md "Cooperative matrices, run 6" from this folder's files
(run from this folder after `tar xzf results.tgz`: python3 summarize.py > summary.md)."""
import json

def jl(name):
    return [json.loads(l) for l in open(name)]

coop, tiled = {}, {}
for d in (64, 128, 256):
    for r in jl(f"table_coop{d}.jsonl"):
        coop[(d, r["seq_q"], r["causal"])] = r
    for r in jl(f"table_tiled{d}.jsonl"):
        tiled[(d, r["seq_q"], r["causal"])] = r
torch = {(r["head_dim"], r["seq"], r["causal"]): r for r in jl("torch.jsonl")}

fmt = lambda x, p=1: "–" if x is None else f"{x:.{p}f}"
print("| head_dim | seq | causal | plan | matrix kernel | rel L2 | best non-matrix (sg_f32) | × non-matrix | naive | PyTorch FA2 (bf16) | cuDNN (bf16) |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for d in (64, 128, 256):
    for s in (1024, 4096, 8192, 16384):
        for c in (False, True):
            r, t, tr = coop[(d, s, c)], tiled[(d, s, c)], torch[(d, s, c)]
            assert r["pass"] and t["pass"], (d, s, c)
            naive = r["flash_tflops"] * r["flash_ms"] / r["naive_ms"] if r.get("naive_ms") else None
            print(f"| {d} | {s} | {'yes' if c else 'no'} | {r['plan']} | **{r['flash_tflops']:.1f}** | {r['rel_l2']:.1e} "
                  f"| {t['flash_tflops']:.1f} | {r['flash_tflops'] / t['flash_tflops']:.2f}× "
                  f"| {fmt(naive)} | {tr['flash_fwd_tflops']:.0f} | {tr['cudnn_fwd_tflops']:.0f} |")
