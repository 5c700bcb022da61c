#!/usr/bin/env bash
# Session 36, call 4 (staged as s36c.sh, branch dropout-producer at the commit after 35557fa:
# the producer's registers within the launch's pool — call 3's kernel waited forever in
# setmaxnreg.inc — and two draws in flight a drawing thread). Short: the budget has ~190 s left.
. .gpu/setup.sh
B=.gpu/b
FLASH_REQUIRE_CUDA=1 timeout 60 $B/cuda_dropout_test --test-threads 1 the_cuda_forward_drops > $OUT/test.txt 2>&1; echo "mask test rc=$?"
grep -E "^test |test result|panicked|HANG" $OUT/test.txt | head
A="--head-dims 128 --seqs 8192 --no-sweep --reps 10"
timeout 25 $B/cuda_attention $A --dropout 0.1 2>&1 | grep -E "^d128"
timeout 25 $B/cuda_attention --head-dims 64 --seqs 8192 --no-sweep --reps 10 --dropout 0.1 2>&1 | grep -E "^d64"
