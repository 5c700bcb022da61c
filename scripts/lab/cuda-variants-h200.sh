#!/usr/bin/env bash
# Runs on the lent H200 from the repository root: the score-term variants of the CUDA forward
# kernels (ALiBi, the score bias, the soft-cap compiled in per problem; src/cuda/plan ScoreTerms).
# First their correctness tests (both kernels, every variant, against the float64 reference),
# then hd128 seq 8192 bf16 (batch 2, 16 heads: the example's 16k tokens × hidden 2048) timed
# plain, with ALiBi, with an f16 and a bf16 per-head bias, with a soft-cap, and all together with
# sinks, causal or not, then PyTorch's SDPA (FlashAttention-2, cuDNN) plain and with the same f16
# bias for the bars (ALiBi and soft-cap within 10% of plain; the f16 bias at 60% of plain and
# above cuDNN's).
#
# Expects in .gpu-cuda/ (copied from the build machine's target dir):
#   cuda_attention_tests  = target/release/deps/cuda_attention-<hash> (cargo test --no-run)
#   cuda_attention        = target/release/examples/cuda_attention
# and PyTorch on the machine for shared/bench/torch_sdpa.py (or ../shared/...) and
# scripts/torch_sdpa_bias.py.
# Writes logs under $OUT. Env: REPS (10), SEQS (8192), HEAD_DIMS (128), TORCH (0 skips PyTorch),
# TESTS (0 skips the tests).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
ROOT=$PWD
BIN=$ROOT/.gpu-cuda
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-/usr/local/cuda/targets/x86_64-linux/lib} FLASH_REQUIRE_CUDA=1
REPS=${REPS:-10}; SEQS=${SEQS:-8192}; HEAD_DIMS=${HEAD_DIMS:-128}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"

if [ "${TESTS:-1}" = 1 ]; then
  s=$SECONDS
  # The variant matrix, the random head-term mixes, windows and soft-caps, the plain suites (the
  # plain kernels changed too: their dead run-time branches are gone), and the NVRTC compile of
  # every variant of the default plans.
  timeout 420 "$BIN/cuda_attention_tests" --test-threads 4 \
    every_score_term_variant_matches_the_reference alibi_sinks_and_bias_match_the_reference \
    windows_and_soft_caps_match_the_reference matches_the_reference_on_ragged_gqa_causal_and_strided_problems \
    packed_batches_match_the_reference kernels_compile_with_nvrtc bad_calls_are_errors \
    > "$OUT/tests.log" 2>&1
  echo "tests rc=$? ($((SECONDS - s)) s): $(grep 'test result' "$OUT/tests.log")"
  grep -E "panicked|FAILED|failed" "$OUT/tests.log" | cut -c1-300 | head -20
  grep -E "_alibi|_bias|_cap" "$OUT/tests.log" | grep -E "spill" | cut -c1-220 > "$OUT/ptxas.txt"
fi

# One timing run per variant: the engine's default plan (no sweep), both maskings.
bench() {
  local tag=$1; shift
  local s=$SECONDS
  timeout 300 "$BIN/cuda_attention" --reps "$REPS" --head-dims "$HEAD_DIMS" --seqs "$SEQS" --no-sweep \
    --json "$OUT/ours_$tag.jsonl" "$@" > "$OUT/bench_$tag.log" 2>&1
  echo "bench $tag rc=$? ($((SECONDS - s)) s)"
}
bench plain
bench alibi --alibi geometric
bench alibi_perhead --alibi per-head
bench bias_f16 --bias-f16
bench bias_bf16 --bias
bench softcap --softcap 30
bench sinks --sinks
bench all --alibi geometric --bias-f16 --softcap 30 --sinks

# torch_sdpa.py lives in the shared checkout: shared/ in the repository root on the device
# machine, ../shared beside the worktrees here.
SDPA=$ROOT/shared/bench/torch_sdpa.py
[ -f "$SDPA" ] || SDPA=$ROOT/../shared/bench/torch_sdpa.py
if [ "${TORCH:-1}" = 1 ]; then
  s=$SECONDS
  timeout 200 python3 "$SDPA" --head-dims "$HEAD_DIMS" --seqs "$SEQS" --causal both \
    --backends flash,cudnn --iters 10 --json "$OUT/torch.jsonl" > "$OUT/torch.log" 2>&1
  echo "torch rc=$? ($((SECONDS - s)) s)"
  s=$SECONDS
  # PyTorch's float-mask bias, fp16, [1, heads, seq, seq] (per head, broadcast over the batch).
  timeout 200 python3 "$ROOT/scripts/torch_sdpa_bias.py" --seqs "$SEQS" --head-dim 128 --batch 2 --heads 16 \
    --dtype fp16 --backends efficient,cudnn --iters 10 > "$OUT/torch_bias.log" 2>&1
  echo "torch bias rc=$? ($((SECONDS - s)) s)"
  tail -n 20 "$OUT/torch_bias.log"
fi

python3 - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
rows = {}
for path in sorted(glob.glob(f"{out}/ours_*.jsonl")):
    tag = os.path.basename(path)[5:-6]
    for line in open(path):
        r = json.loads(line)
        rows[(tag, r["head_dim"], r["seq"], r["causal"])] = r
plain = {k[1:]: r["tflops"] for k, r in rows.items() if k[0] == "plain"}
print("| variant | head_dim | seq | causal | TFLOP/s | × plain | kernel | check |")
print("|---|---|---|---|---|---|---|---|")
for k in sorted(rows, key=lambda k: (k[1], k[2], k[3], k[0] != "plain", k[0])):
    r = rows[k]
    base = plain.get(k[1:])
    ratio = f"{r['tflops'] / base:.2f}" if base else "-"
    print(f"| {k[0]} | {k[1]} | {k[2]} | {'yes' if k[3] else 'no'} | {r['tflops']:.0f} | {ratio} | {r['kernel']} | "
          f"{'ok' if r['ok'] else 'WRONG'} {r['rel_l2']:.1e} |")
PY
