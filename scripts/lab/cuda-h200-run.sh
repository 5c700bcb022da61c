#!/usr/bin/env bash
# Runs on the lent H200 from the repository root (BENCHMARKS.md, "Native CUDA forward"): the CUDA
# tests (mma.sync first, then every wgmma variant one at a time), the benchmark sweep and table
# with only the wgmma kernels that passed their tests, and PyTorch's SDPA references in the same
# call. Expects in .gpu-cuda/: cuda_attention_tests, cuda_attention (stripped) and torch_sdpa.py.
# Writes logs and JSON lines under $OUT. Env: SEQS, HEAD_DIMS, REPS, TORCH (0 skips PyTorch).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
cd .gpu-cuda
export LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib FLASH_REQUIRE_CUDA=1
SEQS=${SEQS:-512,1024,2048,4096,8192,16384}; HEAD_DIMS=${HEAD_DIMS:-64,128,256}; REPS=${REPS:-7}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
s=$SECONDS
# TEST_ARGS narrows the first step (e.g. "matches_the_reference host_slices bad_calls"); WGMMA_TESTS=0
# skips the per-variant step; SWEEP=0 times only the engine's default plans.
timeout 120 ./cuda_attention_tests --test-threads 4 --skip wgmma ${TEST_ARGS:-} > "$OUT/tests_mma.log" 2>&1
echo "mma tests rc=$? ($((SECONDS - s)) s): $(grep 'test result' "$OUT/tests_mma.log")"
BENCH_ARGS=()
if [ "${WGMMA_TESTS:-1}" = 1 ]; then
  s=$SECONDS
  timeout 150 ./cuda_attention_tests --test-threads 1 --nocapture wgmma > "$OUT/tests_wgmma.log" 2>&1
  echo "wgmma tests rc=$? ($((SECONDS - s)) s): $(grep 'test result' "$OUT/tests_wgmma.log")"
  grep -E "^wgmma (ok|FAILED)|HANG|refused|panicked" "$OUT/tests_wgmma.log" | cut -c1-400 | sort | uniq -c | head -60
  BENCH_ARGS+=(--wgmma-ok "$OUT/tests_wgmma.log")
fi
[ "${SWEEP:-1}" = 0 ] && BENCH_ARGS+=(--no-sweep)
s=$SECONDS
timeout 240 ./cuda_attention --reps "$REPS" --head-dims "$HEAD_DIMS" --seqs "$SEQS" "${BENCH_ARGS[@]}" \
  --json "$OUT/ours.jsonl" > "$OUT/bench.log" 2>&1
echo "bench rc=$? ($((SECONDS - s)) s)"
grep -E "^sweep" "$OUT/bench.log" | sed 's/  regs/ regs/' | cut -c1-200
if [ "${TORCH:-1}" = 1 ]; then
  s=$SECONDS
  timeout 150 python3 torch_sdpa.py --head-dims "$HEAD_DIMS" --seqs "$SEQS" --causal both --backends flash,cudnn \
    --iters 10 --json "$OUT/torch.jsonl" > "$OUT/torch.log" 2>&1
  echo "torch rc=$? ($((SECONDS - s)) s)"
fi
python3 - "$OUT" <<'PY'
import json, sys, os
out = sys.argv[1]
def load(p):
    return [json.loads(l) for l in open(p)] if os.path.exists(p) else []
ours = {(r["head_dim"], r["seq"], r["causal"]): r for r in load(f"{out}/ours.jsonl")}
torch = {}
for r in load(f"{out}/torch.jsonl"):
    key = (r["head_dim"], r["seq"], r["causal"])
    torch[key] = {b: r.get(f"{b}_fwd_tflops", "-") for b in ("flash", "cudnn")}
print("| head_dim | seq | causal | ours | kernel | FA2 | cuDNN | check |")
print("|---|---|---|---|---|---|---|---|")
for k in sorted(ours):
    r = ours[k]; t = torch.get(k, {})
    print(f"| {k[0]} | {k[1]} | {'yes' if k[2] else 'no'} | {r['tflops']:.0f} | {r['kernel']} | {t.get('flash', '-')} | {t.get('cudnn', '-')} | {'ok' if r['ok'] else 'WRONG'} {r['rel_l2']:.1e} |")
PY
