# Prepared in session 48, not run: the non-matrix forward (FMA units) with its bounds/window mask
# per row instead of per key (edits/tiled_mask_vec.edit: the row's visible keys once, one vector
# select, in both of the softmax's loops), through lab2 (main at 5a90d8a with the lab hook of
# session48/lab_hook.diff: WFA_EDIT edits any module), f16 and f32 at head_dim 128, seq 4096,
# causal and not, two rounds. Run after s48b.sh (or alone: it needs only setup.sh and lab2).
. .gpu/setup.sh; B=.gpu/b
s=$SECONDS
tar -xJf .gpu/lab2.tar.xz -C .gpu
. .gpu/coop-probe.sh
for r in 1 2; do for c in "" "--causal"; do for v in "sg_f16 --dtype f16" "sg_f32 --dtype f32"; do
  set -- $v
  probe tiled-$1-$r$c attention_lab2 none --variant $v --head-dim 128 --heads 16 --seq 4096 $c
  probe tiled_vec-$1-$r$c attention_lab2 tiled_mask_vec --variant $v --head-dim 128 --heads 16 --seq 4096 $c
done; done; done
echo "all done $((SECONDS-s)) s"
