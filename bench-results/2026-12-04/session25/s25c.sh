# Session 25, call 3: how many workgroups an SM runs at once against their workgroup memory
# (coop_diagnostics occupancy), then the dQ kernel's plans with fewer subgroups again.
. .gpu/setup.sh
B=.gpu/b
s=$SECONDS
timeout 200 $B/coop_diag_occ occupancy > $OUT/occupancy.log 2>&1; cat $OUT/occupancy.log | grep -v "^$" | cut -c1-120
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
