# Session 44, call 2: the fragment bias (s44a.sh's build, "frag") beside three experimental builds
# of flash_fwd_coop.wgsl (not in the library; made from this build by /work/variants edits):
# "pref" loads the next tile's bias fragments a tile ahead (valid only where every 16 × 16 block
# lies inside the bias, as here); "grid" launches causal problems with a bias in grid order
# instead of head groups (tile_of_workgroup), to see whether call 1's causal-bias rate (31.5
# TFLOP/s, twice the non-causal time) comes from the group order; "pref_grid" both. b4 h8 s8192
# f16, an f16 bias per head, each head_dim; two rounds alternating; the plain rates once.
# Stage: as s44a.sh, then tar cJf .gpu/variants.tar.xz -C /tmp fa-pref fa-grid fa-pref_grid.
. .gpu/setup.sh; B=.gpu/b
tar xJf .gpu/variants.tar.xz -C /tmp
nvidia-smi --query-gpu=name --format=csv,noheader
s=$SECONDS
one() { # bin label dim extra
  echo "== $2 d$3 $4" >> $OUT/bench.txt
  timeout 60 $1 bench --dtype f16 --head-dim $3 --no-naive --reps 10 --check-rows 8 --batch 4 --heads 8 --seq 8192 --causal both $4 > /tmp/one.txt 2>&1
  cat /tmp/one.txt >> $OUT/bench.txt
  echo "$2 d$3 ${4:-plain}: $(grep -aE 'flash:' /tmp/one.txt | awk '{print $5}' | tr '\n' ' ') $(grep -aoE 'flash_fwd_coop[a-z0-9_]*' /tmp/one.txt | sort -u | sed 's/flash_fwd_coop_f16_//' | tr '\n' ' ') fails=$(grep -acE 'FAIL|error' /tmp/one.txt)"
}
for d in 64 128 256; do one $B/flash-attn frag $d ""; done
for r in 1 2; do
  for d in 64 128 256; do
    for v in frag pref grid pref_grid; do
      bin=/tmp/fa-$v; [ $v = frag ] && bin=$B/flash-attn
      one $bin "r$r $v" $d "--bias f16"
    done
  done
done
echo "all done $((SECONDS-s)) s"
