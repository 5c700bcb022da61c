for f in .gpu/*.deb; do dpkg -x $f /; done; ldconfig
export LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib XDG_RUNTIME_DIR=/tmp FLASH_REQUIRE_CUDA=1 PYTHONUNBUFFERED=1
tar xJf .gpu/bins.tar.xz -C .gpu
D=.gpu/dec
timeout 60 python3 .gpu/torch_decode.py --batch 1,8 --kv-lens 32768,131072 --q-lens 1,4 --dtype bf16 --json $OUT/torch_bf16.jsonl > $OUT/torch_bf16.log 2>&1; echo "torch bf16 rc=$?"
timeout 90 $D/cuda_attention --decode --reps 200 > $OUT/cuda_auto.log 2>&1; echo "cuda rc=$?"; grep "^|" $OUT/cuda_auto.log
grep -h '^{' $OUT/torch_bf16.log | python3 -c "
import sys,json
for l in sys.stdin:
    r=json.loads(l); print(r['dtype'],'b',r['batch'],'q',r['q_len'],'kv',r['kv_len'],'flash',r.get('flash_TBps'),'cudnn',r.get('cudnn_TBps'))"
cd $OUT && tar czf logs.tgz *.log *.jsonl && rm -f *.log *.jsonl
