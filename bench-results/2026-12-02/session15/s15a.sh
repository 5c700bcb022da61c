# Session 15, call 1: correctness on the H200 of this session's work, three suites side by side
# (16 CPU cores, one GPU): tests/cuda_attention.rs whole (decode ALiBi, padded head dims), the
# candle drop-in's CUDA route (ALiBi twins), the Python package's CUDA route (ALiBi, head_dim 96/100);
# then the padded head_dim's speed beside its tile width and PyTorch's at the same head_dim.
. .gpu/setup.sh
B=.gpu/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
s=$SECONDS
( timeout 420 $B/cuda_attention_test --test-threads 4 > $OUT/test_cuda_all.log 2>&1; echo "cuda_attention rc=$? $(grep 'test result' $OUT/test_cuda_all.log) ($((SECONDS-s)) s)" > $OUT/rc_cuda.txt ) &
# The candle tests (scripts/lab/candle-cuda-h200-run.sh's first half; its speed half needs a quiet GPU).
( python3 -c 'import lzma, sys; open(sys.argv[1], "wb").write(lzma.open(sys.argv[1] + ".xz").read())' .gpu-candle/candle_tests && chmod +x .gpu-candle/candle_tests
  timeout 300 .gpu-candle/candle_tests --test-threads 1 cuda_ > $OUT/candle_tests.log 2>&1
  echo "candle rc=$? $(grep 'test result' $OUT/candle_tests.log) ($((SECONDS-s)) s)" > $OUT/candle_run.txt
  grep -E "panicked|FAILED" $OUT/candle_tests.log | cut -c1-300 | head >> $OUT/candle_run.txt ) &
# The Python tests (python/cuda/h200-run.sh's first half, likewise).
( site=/tmp/wgpu-flash-attn-site; rm -rf $site && python3 -m zipfile -e $(ls .gpu/python/wgpu_flash_attn-*.whl | head -1) $site
  PYTHONPATH=$site timeout 300 python3 python/cuda/test_cuda.py > $OUT/test_python.log 2>&1
  echo "python rc=$? $(tail -1 $OUT/test_python.log) ($((SECONDS-s)) s)" > $OUT/python_run.txt
  grep -E "^(ok|FAILED) |max error|Error|assert" $OUT/test_python.log | cut -c1-220 >> $OUT/python_run.txt ) &
wait
cat $OUT/rc_cuda.txt; grep -E "panicked|FAILED" $OUT/test_cuda_all.log | cut -c1-300 | head -20
cat $OUT/candle_run.txt | head -30
cat $OUT/python_run.txt | head -60
echo "tests done $((SECONDS-s)) s"
timeout 100 $B/cuda_attention --head-dims 96,128,192,256 --seqs 8192 --no-sweep --reps 10 > $OUT/bench_pad.log 2>&1; grep -iE "tflop|d96|d192" $OUT/bench_pad.log | head -20
timeout 100 python3 .gpu/torch_sdpa.py --head-dims 96,128,192,256 --seqs 8192 > $OUT/torch_pad.log 2>&1; tail -20 $OUT/torch_pad.log
echo "all done $((SECONDS-s)) s"
