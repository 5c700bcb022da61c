#!/usr/bin/env python3
"""Turns the JSON lines of one H200 run (examples/attention --json, torch_sdpa.py --json) into the
markdown tables of BENCHMARKS.md, so that no figure is copied by hand.

    python3 scripts/lab/bench-table.py RUN_DIR [TABLE | --backward | --coop | --cuda]
RUN_DIR holds TABLE (default table.jsonl: ours, with the naive baseline), torch.jsonl and optionally
sweep.jsonl.
"""
import json, os, sys

def load(path):
    return [json.loads(l) for l in open(path)] if os.path.exists(path) else []

def main(run, table="table.jsonl"):
    ours = load(os.path.join(run, table))
    torch = {(r["head_dim"], r["seq"], r["causal"]): r for r in load(os.path.join(run, "torch.jsonl"))}
    dtype = ours[0]["dtype"] if ours else "f32"
    print(f"| head_dim | seq | batch | causal | flash (ours, {dtype}) | naive (ours, {dtype}) | speed-up | PyTorch FA2 (bf16) | cuDNN (bf16) | rel L2 vs f64 | check |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in ours:
        naive_tflops = 0.0
        if r.get("naive_ms"):
            naive_tflops = r["flash_tflops"] * r["flash_ms"] / r["naive_ms"]
        t = torch.get((r["head_dim"], r["seq_q"], r["causal"]), {})
        speedup = f"{r['naive_ms'] / r['flash_ms']:.2f}×" if r.get("naive_ms") else "—"
        print(f"| {r['head_dim']} | {r['seq_q']} | {r['batch']} | {'yes' if r['causal'] else 'no'} | "
              f"{r['flash_tflops']:.1f} | {naive_tflops:.1f} | {speedup} | {t.get('flash_fwd_tflops', '—')} | "
              f"{t.get('cudnn_fwd_tflops', '—')} | {r['rel_l2']:.1e} | {'pass' if r['pass'] else 'FAIL'} |")
    sweep = load(os.path.join(run, "sweep.jsonl"))
    if sweep:
        print()
        print("| dtype | variant | plan (BMxBNxTXxTYxKSxNSxST) | bounds checks | TFLOP/s | check |")
        print("|---|---|---|---|---|---|")
        for r in sweep:
            print(f"| {r['dtype']} | {r['variant']} | {r['plan']} | {r['bounds']} | {r['flash_tflops']:.2f} | {'pass' if r['pass'] else 'FAIL'} |")

def backward(run):
    """The backward table: bwd.jsonl (examples/backward --json) beside torch_bwd.jsonl."""
    ours = load(os.path.join(run, "bwd.jsonl"))
    torch = {(r["head_dim"], r["seq"], r["causal"]): r for r in load(os.path.join(run, "torch_bwd.jsonl"))}
    print("| head_dim | seq | batch × heads | causal | forward (ours, f32) | backward (ours, f32) | backward / forward "
          "| PyTorch FA2 bwd (bf16) | cuDNN bwd (bf16) | PyTorch math bwd | rel L2, worst gradient | check |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in ours:
        t = torch.get((r["head_dim"], r["seq_q"], r["causal"]), {})
        math = t.get("math_error", "—")
        if "out of memory" in math:
            math = "out of memory"
        rel = r["rel_l2"] if isinstance(r["rel_l2"], str) else ", ".join(f"{x:.1e}" for x in r["rel_l2"]) if isinstance(r["rel_l2"], list) else f"{r['rel_l2']:.1e}"
        print(f"| {r['head_dim']} | {r['seq_q']} | {r['batch']} × {r['heads']} | {'yes' if r['causal'] else 'no'} | "
              f"{r['forward_tflops']:.1f} | {r['backward_tflops']:.1f} | {100 * r['backward_tflops'] / r['forward_tflops']:.0f}% | "
              f"{t.get('flash_bwd_tflops', '—')} | {t.get('cudnn_bwd_tflops', '—')} | {math} | {rel} | {'pass' if r['pass'] else 'FAIL'} |")

def coop(run):
    """The tensor-core table: tables.jsonl holding the cooperative-matrix rows (with the naive
    baseline) and the best non-matrix variant's rows on the same shapes, beside torch.jsonl."""
    rows = load(os.path.join(run, "tables.jsonl"))
    torch = {(r["head_dim"], r["seq"], r["causal"]): r for r in load(os.path.join(run, "torch.jsonl"))}
    key = lambda r: (r["head_dim"], r["seq_q"], r["causal"])
    tiled = {key(r): r for r in rows if r["variant"] != "coop"}
    print("| head_dim | seq | batch × heads | causal | matrix kernel (ours, f16) | best non-matrix (ours, f16 data) "
          "| matrix / non-matrix | naive (ours, f16) | PyTorch FA2 (bf16) | cuDNN (bf16) | rel L2 vs f64 | check |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in sorted((r for r in rows if r["variant"] == "coop"), key=key):
        t, n = torch.get(key(r), {}), tiled.get(key(r))
        naive = r["flash_tflops"] * r["flash_ms"] / r["naive_ms"] if r.get("naive_ms") else None
        ok = r["pass"] and (n is None or n["pass"])
        print(f"| {r['head_dim']} | {r['seq_q']} | {r['batch']} × {r['heads']} | {'yes' if r['causal'] else 'no'} | "
              f"{r['flash_tflops']:.1f} | {n['flash_tflops']:.1f} | {r['flash_tflops'] / n['flash_tflops']:.2f}× | "
              f"{naive:.1f} | {t.get('flash_fwd_tflops', '—')} | {t.get('cudnn_fwd_tflops', '—')} | "
              f"{r['rel_l2']:.1e} | {'pass' if ok else 'FAIL'} |")

def cuda(run):
    """The CUDA forward table: ours.jsonl (examples/cuda_attention --json, each row's default
    plan) beside torch.jsonl."""
    torch = {(r["head_dim"], r["seq"], r["causal"]): r for r in load(os.path.join(run, "torch.jsonl"))}
    print("| head_dim | causal | seq | our default plan | **ours** | FA2 | cuDNN | ours / cuDNN |")
    print("|---|---|---|---|---|---|---|---|")
    key = lambda r: (r["head_dim"], r["causal"], r["seq"])
    for r in sorted(load(os.path.join(run, "ours.jsonl")), key=key):
        t = torch.get((r["head_dim"], r["seq"], r["causal"]), {})
        plan = r["kernel"].replace("flash_fwd_wgmma_bf16_", "").replace("_causal", "")
        cudnn = t.get("cudnn_fwd_tflops")
        ratio = f"{r['tflops'] / cudnn:.2f}×" if cudnn else "—"
        check = "" if r["ok"] else " WRONG"
        print(f"| {r['head_dim']} | {'yes' if r['causal'] else 'no'} | {r['seq']} | `{plan}` | **{r['tflops']:.1f}**{check} | "
              f"{t.get('flash_fwd_tflops', '—')} | {cudnn or '—'} | {ratio} |")

if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[2] == "--cuda":
        cuda(sys.argv[1])
        sys.exit()
    if len(sys.argv) > 2 and sys.argv[2] == "--coop":
        coop(sys.argv[1])
        sys.exit()
    if len(sys.argv) > 2 and sys.argv[2] == "--backward":
        backward(sys.argv[1])
        sys.exit()
    main(*(sys.argv[1:] or ["."]))
