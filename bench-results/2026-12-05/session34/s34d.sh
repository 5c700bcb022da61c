#!/usr/bin/env bash
# Session 34, call 2 (after s34c.sh found the coop forward's mask tests failing on real matrices:
# the passthrough module's explicit layout had no mask or summary binding). The mask tests with
# the layout fixed, on an H100/H200, then the mask bench (benches/mask.rs: a 4-document mask on the
# coop kernel with its summary). Staged with TESTS=mask BENCHES=mask scripts/lab/gpu-stage.sh.
. .gpu/setup.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/smi.txt
B=.gpu/b
timeout 120 $B/mask_test --test-threads 4 > $OUT/test_mask.txt 2>&1; echo "mask rc=$?" | tee -a $OUT/rc.txt
grep -E "^test |test result|panicked" $OUT/test_mask.txt | head -20
timeout 150 $B/mask_bench --bench --warm-up-time 1 --measurement-time 1 > $OUT/mask_bench.txt 2>&1
echo "mask_bench rc=$?"
grep -E "time:|^[a-z_/ 0-9]+$" $OUT/mask_bench.txt | head -30
