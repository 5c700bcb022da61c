. .gpu/setup.sh
tar xJf .gpu/bins.tar.xz -C .gpu
B=.gpu/dec
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
for seed in 1 2 3; do timeout 60 $B/varlen_bench --runs 30 --seed $seed 2>&1; done | tee $OUT/varlen_bench.txt
for dt in fp16 bf16; do for st in "2513 40208" "2230 35680" "1934 30944"; do set -- $st
timeout 60 python3 .gpu/torch_sdpa.py --head-dims 128 --seqs $1 --tokens $2 --causal yes --dtype $dt 2>&1 | grep head_dim; done; done | tee $OUT/torch.txt
timeout 120 $B/flash-attn bench --batch 2 --heads 16 --seq 8192 --head-dim 128 --dtype f16 --causal no --no-naive 2>&1 | tail -5 | tee $OUT/coop_dense.txt
t() { s=$SECONDS; timeout $1 $B/$2 --test-threads ${4:-1} $3 > $OUT/test_$2.log 2>&1; echo "$2 $3 rc=$? $((SECONDS-s))s $(grep 'test result' $OUT/test_$2.log)"; grep -E "FAILED|panicked" -A3 $OUT/test_$2.log | head -12; }
t 150 varlen "" 1
t 200 cuda_attention "" 4
