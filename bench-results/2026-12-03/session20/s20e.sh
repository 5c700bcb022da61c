# Session 20, call 5: split counts for the shipped decode kernels (the lane kernel for one new
# token, the matrix kernel for four) on issue 16's shapes: the rule's choice and forced counts
# around one and a few waves of 132 SMs.
. .gpu/setup.sh
B=.gpu/b
s=$SECONDS
timeout 150 $B/decode_bench --batch 1,8 --kv 32768 --q 1,4 --runs 200 --splits 8,16,24,33,48,66,99 > $OUT/splits_32k.log 2>&1
cut -c1-100 $OUT/splits_32k.log
timeout 90 $B/decode_bench --batch 1 --kv 131072 --q 1,4 --runs 100 --splits 16,33,66,99,132 > $OUT/splits_131k.log 2>&1
cut -c1-100 $OUT/splits_131k.log
echo "all done $((SECONDS-s))s"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
