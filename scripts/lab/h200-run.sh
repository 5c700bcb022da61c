#!/usr/bin/env bash
# Runs on the lent H200 (see BENCHMARKS.md): the lavapipe test binaries against NVIDIA's Vulkan driver,
# a tile-plan sweep, the forward table beside the naive kernel, seq 65536, and PyTorch's SDPA references.
# Expects in .gpu/: the Debian Vulkan loader and GL dispatch .debs, the stripped binaries `attention`,
# `wgpu_attention`, `errors`, and torch_sdpa.py. Writes logs and JSON lines under $OUT.
set -u
if [ -z "${SKIP_SETUP:-}" ]; then for f in .gpu/*.deb; do dpkg -x "$f" /; done; ldconfig; fi
[ -z "${SKIP_SETUP:-}" ] && export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib FLASH_REQUIRE_GPU=1 XDG_RUNTIME_DIR=/tmp
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
A=${A:-.gpu/attention}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
step() { echo "== $*" | tee -a "$OUT/steps.log"; }

if [ "${TESTS:-1}" = 1 ]; then
  step tests
  for t in wgpu_attention errors; do timeout 150 .gpu/$t --test-threads 4 > "$OUT/test_$t.log" 2>&1; echo "$t rc=$?" | tee -a "$OUT/steps.log"; tail -3 "$OUT/test_$t.log"; done
fi

if [ -n "${SWEEP:-}" ]; then
  step sweep
  base="${SWEEP_BASE:---batch 2 --heads 16 --seq 8192 --head-dim 128} --no-naive --runs 5 --check-rows 32 --json $OUT/sweep.jsonl"
  for spec in $SWEEP; do  # spec = variant:plan:bounds:dtype
    IFS=: read -r v p b d <<< "$spec"
    echo "-- $spec" >> "$OUT/sweep.log"
    # coop: the cooperative kernel (plan = its BMxBN tile) streaming K/V as its plan does;
    # coopp / coopn: with / without the K/V prefetch into registers, one buffer;
    # coopd / coopdn: the same with K/V double-buffered.
    tile="--plan"; extra=""
    case $v in
      coop) ;;
      coopp) v=coop; extra="--coop-prefetch on --coop-buffers 1";;
      coopn) v=coop; extra="--coop-prefetch off --coop-buffers 1";;
      coopd) v=coop; extra="--coop-prefetch on --coop-buffers 2";;
      coopdn) v=coop; extra="--coop-prefetch off --coop-buffers 2";;
    esac
    [ "$v" = coop ] && tile="--coop-tile"
    timeout 60 $A $base $extra --variant "$v" ${p:+$tile $p} --bounds-checks "${b:-off}" --dtype "${d:-f32}" >> "$OUT/sweep.log" 2>&1 || echo "FAILED $spec" >> "$OUT/sweep.log"
  done
  grep -E "^-- |flash:|FAIL|error" "$OUT/sweep.log"
  # The fastest correct f32 configuration runs the table and the long sequence.
  BEST=$(python3 -c "
import json
rows = [json.loads(l) for l in open('$OUT/sweep.jsonl')]
rows = [r for r in rows if r['pass'] and r['dtype'] == 'f32']
if rows:  # a sweep of f16 kernels only has no f32 plan to pass on
    b = max(rows, key=lambda r: r['flash_tflops'])
    print(f\"--variant {b['variant']} --plan {b['plan']} --bounds-checks {b['bounds']}\")")
  echo "best: $BEST" | tee -a "$OUT/steps.log"
  TABLE_ARGS="${TABLE_ARGS:-$BEST}"
fi

# TABLES: ';'-separated "name|extra args" sets, each run over the sequence lengths in TABLE
# (batch · seq = 16k, 16 heads of 128, causal and not) into table_<name>.jsonl.
TABLES=${TABLES:-"main|${TABLE_ARGS:-}"}
if [ -n "${TABLE:-}" ]; then
  IFS=';' read -ra sets <<< "$TABLES"
  for set in "${sets[@]}"; do
    name=${set%%|*}; args=${set#*|}
    [ "$name" = main ] && args="${TABLE_ARGS:-$args}"
    step "table $name: $args"
    for n in $TABLE; do for c in "" --causal; do
      timeout 120 $A --batch $((16384 / n)) --heads 16 --seq $n --head-dim 128 $c --runs 10 $args --json "$OUT/table_$name.jsonl" > /tmp/run.log 2>&1
      cat /tmp/run.log >> "$OUT/table_$name.log"; grep -E "^(problem|kernel|flash|naive|speed|result|error)" /tmp/run.log
    done; done
  done
fi

if [ "${LONG:-0}" = 1 ]; then
  step seq 65536
  timeout 200 $A --batch 1 --heads 16 --seq 65536 --head-dim 128 --runs 3 --check-rows 48 --json "$OUT/long.jsonl" 2>&1 | tee "$OUT/long.log"
  nvidia-smi --query-gpu=memory.used --format=csv >> "$OUT/long.log"
fi

if [ -n "${TORCH:-}" ]; then
  step torch
  timeout 300 python3 .gpu/torch_sdpa.py $TORCH --json "$OUT/torch.jsonl" 2>&1 | tee "$OUT/torch.log" | tail -20
fi
# At most eight files come back from $OUT: the logs travel as one archive.
(cd "$OUT" && tar czf logs.tgz $(ls *.log | grep -v steps.log) && rm -f $(ls *.log | grep -v steps.log))
step done
