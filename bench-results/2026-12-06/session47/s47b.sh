# NOT RUN (session 47): the device budget ran out in failed starts; kept for the next session
# (stage: range_mask.diff applied, TESTS="edge variants wgpu_attention" EXAMPLES=attention
# scripts/lab/gpu-stage.sh, which also copies scripts/lab/coop-probe.sh; the lab build of
# session 46 as .gpu/lab.tar.xz; edits/ as .gpu/edits).
# Session 47, call 2: the register softmax's window mask as one unsigned comparison a score
# (`col - kv_begin >= kv_count`, this build) against main (the lab build, no edit) and d30f4e2,
# head_dim 256 and 128; the lab probes mask_branch (the softmax compiled with and without the
# mask at every head_dim), range_branch (both), range_nohuge (the range mask, no huge-row note),
# mask_block[_range] (the mask's 16 components under one branch, apart from the max: one block the
# compiler may branch over instead of 16 it predicates);
# the soft-cap folded. GPU clocks after each run (the slow processes). Then this build's
# cooperative tests: edge, variants.
. .gpu/setup.sh; B=.gpu/b
s=$SECONDS
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
xz -dc .gpu/attention_old.xz > $B/attention_old && chmod +x $B/attention_old
tar -xJf .gpu/lab.tar.xz -C $B
. .gpu/coop-probe.sh
round_of() { local round=$1
  probe old$round attention_old none
  probe main$round attention_lab none
  probe new$round attention none
  probe mask_branch$round attention_lab mask_branch
  probe range_branch$round attention_lab range_branch
  probe range_nohuge$round attention_lab range_nohuge
  probe mask_block$round attention_lab mask_block
  probe mask_block_range$round attention_lab mask_block_range
  probe old_causal$round attention_old none --causal
  probe main_causal$round attention_lab none --causal
  probe new_causal$round attention none --causal
  probe range_branch_causal$round attention_lab range_branch --causal
  probe mask_block_range_causal$round attention_lab mask_block_range --causal
}
t() { local n=$1; shift; timeout ${T:-200} "$@" > $OUT/$n.log 2>&1; echo "== $n rc=$? $((SECONDS-s))s"; grep -E "^test |test result" $OUT/$n.log | grep -v " ok$" ; grep -h -E "FAILED|panicked" -A12 $OUT/$n.log | head -30; }
round_of 1
for c in "" "--causal"; do
  probe main128$c attention_lab none --head-dim 128 --heads 16 $c
  probe new128$c attention none --head-dim 128 --heads 16 $c
done
T=150 t test_edge $B/edge_test cooperative rows_whose_reference
T=150 t test_variants $B/variants_test cooperative
for c in "" "--causal"; do
  probe mask_branch128$c attention_lab mask_branch --head-dim 128 --heads 16 $c
  probe cap_main$c attention none --head-dim 128 --heads 16 --softcap 30 $c
  probe cap_fold$c attention_lab softcap_fold --head-dim 128 --heads 16 --softcap 30 $c
done
round_of 2
# The slow processes: the same problem in six processes each way, the exact pass as a second
# dispatch (the default here) and in the kernel, the clocks after each.
for i in 1 2 3 4 5 6; do
  probe slow_second$i attention none
  probe slow_kernel$i attention none --coop-exact-pass kernel
done
echo "all done $((SECONDS-s)) s"
