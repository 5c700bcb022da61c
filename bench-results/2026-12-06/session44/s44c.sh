# Session 44, call 3: why the coop kernel's bias rate swings 3× between processes (calls 1, 2:
# head_dim 128 non-causal 9.3–34.8 ms with the same build). Experimental builds (not in the
# library): "knob" is s44a's fragment build with two bench knobs, FA_BIAS_ROW_PAD (elements added
# to the bias's row stride) and FA_BIAS_SHARED (one bias for every head); "rot" also starts each
# query tile's walk over its key tiles at tile (query tile % tiles), so that the workgroups in
# flight read the bias (and K/V) at different columns. Each setting three processes.
# Stage: as s44a.sh, then tar cJf .gpu/variants.tar.xz -C /tmp fa-knob fa-rot.
. .gpu/setup.sh; B=.gpu/b
tar xJf .gpu/variants.tar.xz -C /tmp
nvidia-smi --query-gpu=name --format=csv,noheader
s=$SECONDS
one() { # label dim bin [env...]
  local label=$1 d=$2 bin=$3; shift 3
  echo "== $label d$d" >> $OUT/bench.txt
  env "$@" timeout 60 $bin bench --dtype f16 --head-dim $d --no-naive --reps 10 --check-rows 8 --batch 4 --heads 8 --seq 8192 --causal both --bias f16 > /tmp/one.txt 2>&1
  cat /tmp/one.txt >> $OUT/bench.txt
  echo "$label d$d: $(grep -aE '^  flash:' /tmp/one.txt | awk '{print $2, $4}' | tr '\n' ' ') fails=$(grep -acE 'FAIL|error' /tmp/one.txt)"
}
for p in 1 2 3; do
  one "knob p$p" 128 /tmp/fa-knob X=1
  one "pad64 p$p" 128 /tmp/fa-knob FA_BIAS_ROW_PAD=64
  one "shared p$p" 128 /tmp/fa-knob FA_BIAS_SHARED=1
  one "rot p$p" 128 /tmp/fa-rot X=1
done
for p in 1 2; do
  one "knob p$p" 256 /tmp/fa-knob X=1
  one "rot p$p" 256 /tmp/fa-rot X=1
  one "pad64 p$p" 256 /tmp/fa-knob FA_BIAS_ROW_PAD=64
done
echo "all done $((SECONDS-s)) s"
