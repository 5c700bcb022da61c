#!/usr/bin/env python3
"""The table of BENCHMARKS.md "Cooperative matrices, run 5" from this folder's files
(run from this folder: python3 summarize.py > summary.md)."""
import json, re, tarfile

def jl(name):
    return [json.loads(l) for l in open(name)]

logs = tarfile.open("logs-tables.tgz")
coop, shared, tiled = {}, {}, {}
for d in (64, 128, 256):
    for r in jl(f"table_coop{d}.jsonl"):
        coop[(d, r["seq_q"], r["causal"])] = r
for r in jl("table_coop128shared.jsonl"):
    shared[(128, r["seq_q"], r["causal"])] = r
# The tiled tables' JSON lines did not all come back (eight files at most): read their logs.
for d in (64, 128, 256):
    txt = logs.extractfile(f"table_tiled{d}.log").read().decode()
    for m in re.finditer(r"seq (\d+)×\d+, head_dim (\d+), f16, (non-causal|causal)[^\n]*\n(?:[^\n]*\n)*?flash:\s+[\d.]+ ms\s+([\d.]+) TFLOP/s", txt):
        tiled[(int(m.group(2)), int(m.group(1)), m.group(3) == "causal")] = float(m.group(4))
torch = {(r["head_dim"], r["seq"], r["causal"]): r for r in jl("torch.jsonl")}

fmt = lambda x, p=1: "–" if x is None else f"{x:.{p}f}"
print("| head_dim | seq | causal | plan | matrix kernel | rel L2 | softmax via workgroup memory | best non-matrix (sg_f32) | × non-matrix | naive | PyTorch FA2 (bf16) | cuDNN (bf16) |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for d in (64, 128, 256):
    for s in (1024, 4096, 8192, 16384):
        for c in (False, True):
            r, t, tr, sh = coop[(d, s, c)], tiled.get((d, s, c)), torch[(d, s, c)], shared.get((d, s, c))
            naive = r["flash_tflops"] * r["flash_ms"] / r["naive_ms"] if r.get("naive_ms") else None
            print(f"| {d} | {s} | {'yes' if c else 'no'} | {r['plan']} | **{r['flash_tflops']:.1f}** | {r['rel_l2']:.1e} "
                  f"| {fmt(sh['flash_tflops'] if sh else None)} | {fmt(t)} | {fmt(r['flash_tflops'] / t if t else None, 2)}× "
                  f"| {fmt(naive)} | {tr['flash_fwd_tflops']:.0f} | {tr['cudnn_fwd_tflops']:.0f} |")
