# Session 44, call 4: the fragment bias (this build, .gpu/b/flash-attn) beside main before it
# (541ae32, /tmp/before), three processes each in alternation, b4 h8 s8192 f16 with an f16 bias
# per head at head_dim 64, 128 and 256, non-causal and causal; the plain rate of this build once.
# Stage: as s44a.sh (before.xz: main's stripped flash-attn).
. .gpu/setup.sh; B=.gpu/b
xz -dc .gpu/before.xz > /tmp/before && chmod +x /tmp/before
nvidia-smi --query-gpu=name --format=csv,noheader
s=$SECONDS
one() { # label dim bin extra
  echo "== $1 d$2" >> $OUT/bench.txt
  timeout 60 $3 bench --dtype f16 --head-dim $2 --no-naive --reps 10 --check-rows 8 --batch 4 --heads 8 --seq 8192 --causal both $4 > /tmp/one.txt 2>&1
  cat /tmp/one.txt >> $OUT/bench.txt
  echo "$1 d$2: $(grep -aE '^  flash:' /tmp/one.txt | awk '{print $2, $4}' | tr '\n' ' ') $(grep -aoE 'flash_fwd_coop[a-z0-9_.]*' /tmp/one.txt | sort -u | sed 's/flash_fwd_coop_f16_//' | tr '\n' ' ') fails=$(grep -acE 'FAIL|error' /tmp/one.txt)"
}
for d in 64 128 256; do one plain $d $B/flash-attn ""; done
for p in 1 2 3; do
  for d in 64 128 256; do
    one "before p$p" $d /tmp/before "--bias f16"
    one "frag p$p" $d $B/flash-attn "--bias f16"
  done
done
echo "all done $((SECONDS-s)) s"
