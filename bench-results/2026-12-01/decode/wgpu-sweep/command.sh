for f in .gpu/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib XDG_RUNTIME_DIR=/tmp FLASH_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
tar xJf .gpu/bins.tar.xz -C .gpu
D=.gpu/dec
timeout 60 $D/decode_bench --batch 1,8 --kv 32768 --q 1,4 --runs 200 > $OUT/auto.log 2>&1; cat $OUT/auto.log
timeout 230 $D/decode_bench --sweep --batch 1,8 --kv 32768 --q 1,4 --runs 100 --json $OUT/sweep.jsonl > $OUT/sweep.log 2>&1; echo "sweep rc=$?"
python3 - <<'PY'
import json,os
rows=[json.loads(l) for l in open(os.environ['OUT']+'/sweep.jsonl')]
for r in sorted(rows,key=lambda r:(r['shape'],-r['tbps'])): print(r['shape'],r['kernel'],r['us'],r['tbps'],r['pass'])
PY
