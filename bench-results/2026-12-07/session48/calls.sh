# Session 48's device calls (an H100, nvidia-h100-x1, one warm machine for calls 1-3).
# Call 1: bash .gpu/s47b.sh (bench-results/2026-12-06/session47/s47b.sh; binaries: main with
#   session47/range_mask.diff, the session-46 lab build with WFA_COOP_EDIT, d30f4e2's attention;
#   edits from session47/edits/).
# Call 2 (its probe names were misparsed: only the soft-cap lines ran):
#   the soft-cap (30) at head_dim 128 with mask_block and without, causal and not.
# Call 3, the same machine:
. .gpu/setup.sh; B=.gpu/b; xz -dc .gpu/attention_old.xz > $B/attention_old; chmod +x $B/attention_old
tar -xJf .gpu/lab.tar.xz -C $B; . .gpu/coop-probe.sh
for r in 1 2; do for c in "" "--causal"; do for d in 128 64; do h=$((2048/d))
  probe old$r-$d$c attention_old none --head-dim $d --heads $h $c
  probe main$r-$d$c attention_lab none --head-dim $d --heads $h $c
  probe mb$r-$d$c attention_lab mask_block --head-dim $d --heads $h $c
  probe mbr$r-$d$c attention_lab mask_block_range --head-dim $d --heads $h $c
done; done; done
# Then no machine came (eight requests); s48b.sh is the call prepared for the next session:
# this build's cooperative tests and bwd_mask_block.diff's backward beside main's.
