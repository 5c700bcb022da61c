# The CUDA backward walk (cuda/bwd_aux.cuh: query_tiles_seeing, tile_needs_mask, dq_await_turn),
# transcribed line by line, checked against the visible-key intervals (keys_seen) by brute force.
# python3 walk_check.py  ->  "bad 0 trials 20000" (session 32).
import random
def keys_seen(causal, left, right, seq_q, seq_kv, row):
    off = seq_kv - seq_q
    pos = row + off
    begin, end = 0, seq_kv
    if causal and pos + 1 < end: end = pos + 1
    if left >= 0 and pos - left > begin: begin = pos - left
    if (not causal) and right >= 0 and pos + right + 1 < end: end = pos + right + 1
    if end < 0: end = 0
    if begin > end: begin = end
    return begin, end
def cdiv(a, b):  # C++ truncation
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q
def query_tiles_seeing(causal, left, right, seq_q, seq_kv, n0, BM, BN):
    off = seq_kv - seq_q
    n1 = min(n0 + BN, seq_kv)
    first_row, last_row = 0, seq_q - 1
    if causal: first_row = n0 - off
    elif right >= 0: first_row = n0 - right - off
    if left >= 0:
        last = n1 - 1 + left - off
        if last < last_row: last_row = last
    if first_row < 0: first_row = 0
    if n0 >= n1 or first_row > last_row: return (0, 0)
    first = first_row // BM
    return (first, last_row // BM + 1 - first)
def needs_mask(causal, left, right, seq_q, seq_kv, m0, n0, BM, BN):
    return (n0 + BN > seq_kv or keys_seen(causal, left, right, seq_q, seq_kv, m0)[1] < n0 + BN
            or keys_seen(causal, left, right, seq_q, seq_kv, m0 + BM - 1)[0] > n0)
def last_tile(causal, left, right, seq_q, seq_kv, m0, BM, BN):
    last_row = m0 + BM - 1 if m0 + BM < seq_q else seq_q - 1
    return cdiv(keys_seen(causal, left, right, seq_q, seq_kv, last_row)[1] - 1, BN)
random.seed(1)
bad = 0
for trial in range(20000):
    BM = 64; BN = random.choice([64, 128])
    seq_q = random.randint(1, 700); seq_kv = random.randint(1, 700)
    causal = random.random() < 0.5
    left = random.choice([-1, -1, random.randint(0, 300), 0, 10**9])
    right = random.choice([-1, -1, random.randint(0, 300), 0, 10**9])
    if left > 2**31 - 1: left = 2**31 - 1
    if right > 2**31 - 1: right = 2**31 - 1
    q_tiles = (seq_q + BM - 1) // BM; kv_tiles = (seq_kv + BN - 1) // BN
    vis = [keys_seen(causal, left, right, seq_q, seq_kv, r) for r in range(seq_q)]
    visits = {}
    for j in range(kv_tiles):
        n0 = j * BN; n1 = min(n0 + BN, seq_kv)
        truth = sorted({r // BM for r in range(seq_q) if max(vis[r][0], n0) < min(vis[r][1], n1)})
        f, c = query_tiles_seeing(causal, left, right, seq_q, seq_kv, n0, BM, BN)
        got = list(range(f, f + c))
        if got != truth:
            bad += 1; print("range", seq_q, seq_kv, causal, left, right, BN, j, got, truth); break
        for i in got: visits.setdefault(i, []).append(j)
        for i in got:
            m0 = i * BM
            hidden = any(not (vis[r][0] <= k < vis[r][1]) for r in range(m0, min(m0 + BM, seq_q)) for k in range(n0, n0 + BN))
            if hidden and not needs_mask(causal, left, right, seq_q, seq_kv, m0, n0, BM, BN):
                bad += 1; print("mask", seq_q, seq_kv, causal, left, right, i, j); break
    for i, js in visits.items():
        lt = last_tile(causal, left, right, seq_q, seq_kv, i * BM, BM, BN)
        if js != list(range(js[0], js[-1] + 1)) or js[-1] != lt:
            bad += 1; print("order", seq_q, seq_kv, causal, left, right, i, js, lt); break
    if bad: break
print("bad", bad, "trials", trial + 1)
