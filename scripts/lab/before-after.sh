#!/usr/bin/env bash
# Runs on the lent H200 from the repository root: the same benchmarks with two builds, alternating
# (old, new, old, new, ...) so that clock drift hits both alike, for a change that must not move
# performance. Expects stripped binaries `attention`, `backward`, `cuda_attention` in $OLD and $NEW
# (default .gpu/old and .gpu/new) and the Vulkan loader .debs in .gpu/. Writes JSON lines per build
# (`<build>_<bench>.jsonl`), the logs, and a summary table (summary.md) under $OUT.
# Env: ROUNDS (3), SHAPE (the wgpu problem), CUDA (0 skips the CUDA rows), CUDA_ARGS (their
# shapes: "--head-dims 128 --seqs 8192"), BACKWARD (0 skips). scripts/lab/build-at.sh builds the
# old binaries from another commit.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
OLD=${OLD:-.gpu/old}; NEW=${NEW:-.gpu/new}; ROUNDS=${ROUNDS:-3}
SHAPE=${SHAPE:-"--batch 2 --heads 16 --seq 8192 --head-dim 128"}
export LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib XDG_RUNTIME_DIR=/tmp
log="$OUT/before-after.log"
for r in $(seq "$ROUNDS"); do
  for build in old new; do
    dir=$OLD; [ "$build" = new ] && dir=$NEW
    echo "== round $r $build" | tee -a "$log"
    for c in "" --causal; do
      timeout 60 "$dir/attention" $SHAPE $c --dtype f16 --no-naive --check-rows 16 --runs 10 \
        --json "$OUT/${build}_coop.jsonl" >> "$log" 2>&1 || echo "FAILED coop $build $c" | tee -a "$log"
      timeout 90 "$dir/attention" $SHAPE $c --dtype f32 --no-naive --check-rows 16 --runs 10 \
        --json "$OUT/${build}_f32.jsonl" >> "$log" 2>&1 || echo "FAILED f32 $build $c" | tee -a "$log"
      if [ "${BACKWARD:-1}" = 1 ]; then
        timeout 90 "$dir/backward" $SHAPE $c --runs 5 --check-rows 16 \
          --json "$OUT/${build}_bwd.jsonl" >> "$log" 2>&1 || echo "FAILED bwd $build $c" | tee -a "$log"
      fi
    done
    if [ "${CUDA:-1}" = 1 ]; then
      timeout 120 "$dir/cuda_attention" ${CUDA_ARGS:---head-dims 128 --seqs 8192} --no-sweep --reps 10 \
        --json "$OUT/${build}_cuda.jsonl" >> "$log" 2>&1 || echo "FAILED cuda $build" | tee -a "$log"
    fi
  done
done
python3 - "$OUT" <<'PY' | tee "$OUT/summary.md"
import json, os, sys, statistics
out = sys.argv[1]
def rows(name):
    path = os.path.join(out, name)
    return [json.loads(l) for l in open(path)] if os.path.exists(path) else []
def rate(r):
    for k in ("flash_tflops", "backward_tflops", "tflops"):
        if k in r:
            return r[k]
    return None
print("| bench | head_dim | seq | causal | old TFLOP/s (median of rounds) | new | new/old | all checks pass |")
print("|---|---|---|---|---|---|---|---|")
shape = lambda r: (r.get("head_dim"), r.get("seq"), bool(r.get("causal")))
for bench in ("coop", "f32", "bwd", "cuda"):
    old, new = rows(f"old_{bench}.jsonl"), rows(f"new_{bench}.jsonl")
    for key in sorted({shape(r) for r in old + new}, key=str):
        pick = lambda rs: [rate(r) for r in rs if shape(r) == key and rate(r) is not None]
        o, n = pick(old), pick(new)
        if not o or not n:
            continue
        passes = all(r.get("pass", r.get("ok", False)) for r in old + new if shape(r) == key)
        mo, mn = statistics.median(o), statistics.median(n)
        d, q, causal = key
        print(f"| {bench} | {d} | {q} | {causal} | {mo:.1f} ({', '.join(f'{x:.1f}' for x in o)}) | "
              f"{mn:.1f} ({', '.join(f'{x:.1f}' for x in n)}) | {mn / mo:.3f} | {passes} |")
PY
