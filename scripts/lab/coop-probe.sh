# Sourced by a device call's script (scripts/lab/gpu-stage.sh copies it into .gpu/): one process
# of the matrix forward or backward a line, for calls that time builds and source edits side by
# side, and one test binary a line.
#
#   probe NAME BINARY EDIT [attention flags...]
#
# runs $B/BINARY (`examples/attention`, or a build of it at another commit) on head_dim 256,
# batch 2, 8 heads, seq 8192, f16, the cooperative-matrix kernel, 10 runs checked on 16 rows;
# flags given after EDIT override those. EDIT names .gpu/edits/EDIT.edit, text replacements in
# the kernels' sources that a build with the `lab` feature applies (WFA_EDIT, src/lab.rs; the
# binaries scripts/lab/gpu-stage.sh builds have it), or `none`. The process's output goes to
# $OUT/attention.log under `== NAME`; the line printed holds its rate, the check's verdict, the
# kernel and the GPU's clocks, power and temperature just after it (slow processes, session 47).
# with_edit EDIT COMMAND...: COMMAND with .gpu/edits/EDIT.edit applied to the kernels through
# the lab feature (WFA_EDIT, src/lab.rs), or as it is for EDIT `none`; `a+b` applies a.edit,
# then b.edit.
with_edit() {
  local edit=$1
  shift
  if [ "$edit" = none ]; then "$@"; else WFA_EDIT=".gpu/edits/${edit//+/.edit:.gpu/edits/}.edit" "$@"; fi
}

probe() {
  local name=$1 bin=$2 edit=$3
  shift 3
  local log=/tmp/probe.log
  with_edit "$edit" timeout 40 "$B/$bin" --batch 2 --seq 8192 --dtype f16 --variant coop \
    --no-naive --runs 10 --check-rows 16 --heads 8 --head-dim 256 "$@" > $log 2>&1
  local rc=$?
  { echo "== $name"; cat $log; } >> "$OUT/attention.log"
  echo "$name rc=$rc $(grep -E 'TFLOP/s' $log | head -1 | sed 's/  */ /g')" \
    "$(grep -E '^result' $log) $(grep -oE 'flash_fwd_coop[a-z0-9_.]*' $log | head -1)" \
    "| $(nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader)"
}

# decode_probe NAME EDIT [decode_bench flags...]: $B/decode_bench with .gpu/edits/EDIT.edit applied
# through the lab feature (WFA_EDIT; `none` for none); its output goes to $OUT/decode.log under
# `== NAME`, and its result lines are printed with NAME in front.
decode_probe() {
  local name=$1 edit=$2
  shift 2
  local log=/tmp/decode_probe.log
  with_edit "$edit" timeout 90 "$B/decode_bench" "$@" > $log 2>&1
  local rc=$?
  { echo "== $name rc=$rc: $*"; cat $log; } >> "$OUT/decode.log"
  grep -E "decode_b" $log | sed "s/^/$name /; s/  */ /g"
}

# probe_backward NAME BINARY [backward flags...]: $B/BINARY (`examples/backward`, or a build of it
# at another commit) on head_dim 128, batch 2, 16 heads, seq 8192, f16, 5 runs checked on 16 rows;
# flags given after BINARY override those. Output to $OUT/backward.log under `== NAME`; the line
# printed holds its exit status, rates and verdict.
probe_backward() {
  local name=$1 bin=$2
  shift 2
  local log=/tmp/probe_backward.log
  timeout 40 "$B/$bin" --batch 2 --heads 16 --seq 8192 --head-dim 128 --dtype f16 --runs 5 \
    --check-rows 16 "$@" > $log 2>&1
  local rc=$?
  { echo "== $name"; cat $log; } >> "$OUT/backward.log"
  echo "$name rc=$rc $(grep -E 'FLOP/s|^result' $log | tail -3 | tr '\n' ' ' | sed 's/  */ /g')"
}

# warm_up: two backward processes, untimed, before a call's timings. On a fresh machine the
# matrix forward took 1.6–4.7× its time for seconds after the first backward had run: the SM clock
# fell to 600–960 MHz while the timing loop waited between its samples (session 50, calls 1, 5,
# 6, 8, 10: BENCHMARKS.md). Builds from session 50 on warm up in time_passes and queue their
# samples; older builds (d30f4e2's, say) still time the old way, so calls that time them beside
# main should start with this. Needs $B/backward.
warm_up() {
  for _ in 1 2; do
    timeout 60 "$B/backward" --batch 2 --heads 16 --seq 8192 --head-dim 128 --dtype f16 --runs 5 \
      --check-rows 4 > /dev/null 2>&1
  done
}

# run_tests NAME SECONDS BINARY [test filters...]: a test binary under a time limit, its output in
# $OUT/NAME.log; prints its exit status, the seconds since the script set `s`, the summary line
# and the first failures.
run_tests() {
  local name=$1 limit=$2
  shift 2
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "== $name rc=$? $((SECONDS - ${s:-0}))s"
  grep -E "test result" "$OUT/$name.log"
  grep -h -E "FAILED|panicked" -A12 "$OUT/$name.log" | head -30
}

# bench_probe NAME EDIT [flash-attn bench flags...]: $B/flash-attn bench on the matrix forward at
# head_dim 128, batch 4, 8 heads, seq 8192, f16, causal and not, 10 runs checked on 8 rows, with
# .gpu/edits/EDIT.edit applied through the lab feature (`none` for none); later flags override
# those (a second --head-dim, say). Output to $OUT/bench.log under `== NAME`; the line printed
# holds each causality's median ms, TFLOP/s and fastest sample, O's error and the failures.
bench_probe() {
  local name=$1 edit=$2
  shift 2
  local log=/tmp/bench_probe.log
  with_edit "$edit" timeout 60 "$B/flash-attn" bench --dtype f16 --head-dim 128 --no-naive \
    --reps 10 --check-rows 8 --batch 4 --heads 8 --seq 8192 --causal both "$@" > $log 2>&1
  local rc=$?
  { echo "== $name rc=$rc $edit $*"; cat $log; } >> "$OUT/bench.log"
  echo "$name $edit ${*:-plain}: rc=$rc" \
    "$(grep -aE '^  flash:' $log | awk '{print $2, $4, $10}' | tr '\n' ' ')" \
    "$(grep -aoE 'O rel L2 [0-9.e-]+' $log | tr '\n' ' ') fails=$(grep -acE 'FAIL|rror' $log)"
}

# cuda_sweep NAME EDIT [cuda_attention flags...]: $B/cuda_attention's plan sweep at head_dim 128,
# seq 8192, 10 runs, with .gpu/edits/EDIT.edit applied (`none` for none); later flags add to
# those (--softcap 30, say). Output to $OUT/cuda.log under `== NAME`; printed: the exit status
# and the two fastest plans of each causality with their TFLOP/s.
cuda_sweep() {
  local name=$1 edit=$2
  shift 2
  local log=/tmp/cuda_sweep.log
  with_edit "$edit" timeout 120 "$B/cuda_attention" --reps 10 --head-dims 128 --seqs 8192 "$@" > $log 2>&1
  local rc=$?
  { echo "== $name rc=$rc $edit $*"; cat $log; } >> "$OUT/cuda.log"
  echo "== $name rc=$rc $((SECONDS - ${s:-0}))s $edit $*"
  grep -aE "^sweep" $log | sed 's/  */ /g' | awk '{print $4, $5, $8}' | sort -k3 -n -r | awk '{c[$1]++} c[$1]<=2'
}

# cuda_default NAME EDIT [cuda_attention flags...]: $B/cuda_attention's default plan only
# (--no-sweep) at head_dim 128, seq 8192, 10 runs, causal and not, with .gpu/edits/EDIT.edit
# applied (`none` for none); later flags add to those. Output to $OUT/fwd.log under `== NAME`;
# printed: the exit status, and each causality's kernel, TFLOP/s and check verdict.
cuda_default() {
  local name=$1 edit=$2
  shift 2
  local log=/tmp/cuda_default.log
  with_edit "$edit" timeout 60 "$B/cuda_attention" --reps 10 --head-dims 128 --seqs 8192 --no-sweep "$@" > $log 2>&1
  local rc=$?
  { echo "== $name $edit rc=$rc $*"; cat $log; } >> "$OUT/fwd.log"
  echo "fwd $name $edit rc=$rc $((SECONDS - ${s:-0}))s" \
    "$(grep -aE '^d[0-9]' $log | tr -s ' ' | awk '{print $5, $6, $11, $13}' | tr '\n' ' ')"
}

# cuda_backward_probe NAME EDIT [cuda_backward flags...]: $B/cuda_backward at head_dim 128, seq
# 8192, causal and not, atomic dQ, 10 runs, with .gpu/edits/EDIT.edit applied (`none` for none).
# Output to $OUT/bwd.log under `== NAME`; printed: the exit status and the table's rows.
cuda_backward_probe() {
  local name=$1 edit=$2
  shift 2
  local log=/tmp/cuda_backward_probe.log
  with_edit "$edit" timeout 90 "$B/cuda_backward" --head-dims 128 --seqs 8192 --causal both --no-det \
    --reps 10 "$@" > $log 2>&1
  local rc=$?
  { echo "== $name $edit rc=$rc $*"; cat $log; } >> "$OUT/bwd.log"
  echo "bwd $name $edit rc=$rc $((SECONDS - ${s:-0}))s $(grep -E '^\| [0-9]' $log | tr -s ' ' | tr '\n' ' ')"
}
