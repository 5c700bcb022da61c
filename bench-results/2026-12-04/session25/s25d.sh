# Session 25, call 4: the occupancy sweep on a finer grid; the pipeline-cache data (the machine code)
# of main's backward and forward matrix kernels; the CUDA toolkit's disassembler, to read it here.
. .gpu/setup.sh
B=.gpu/b
s=$SECONDS
timeout 200 $B/coop_diag_occ occupancy > $OUT/occupancy.log 2>&1; grep -v "^$" $OUT/occupancy.log | cut -c1-120
mkdir -p $OUT/vk $OUT/vkf
COOP_STATS_DIR=$OUT/vk timeout 100 $B/coop_diag_main backward > $OUT/stats_backward.log 2>&1; tail -3 $OUT/stats_backward.log | cut -c1-200
COOP_STATS_DIR=$OUT/vkf timeout 100 $B/coop_diag_main stats > $OUT/stats_forward.log 2>&1; grep -E "Register" $OUT/stats_forward.log | cut -c1-220 | head -20
ls $OUT/vk | head; ls $OUT/vkf | head
d=$(command -v nvdisasm || ls /usr/local/cuda*/bin/nvdisasm | head -1); echo "nvdisasm: $d"; ls -la $d
mkdir -p $OUT/tool && cp $d $OUT/tool/ && ldd $d | head
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
