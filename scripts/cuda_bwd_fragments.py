#!/usr/bin/env python3
# Replays cuda/flash_bwd_mma.cu's fragment addressing on a CPU, for one CTA and one step of its
# walk (no mask), with the PTX semantics of ldmatrix.x4 (plain and .trans) and
# mma.m16n8k16, and compares the warps' dV and dK fragments and the CTA's dQ tile with plain
# matrix products. Values stay floats (no 16-bit rounding): it checks the layouts only (the
# swizzle, TileAddr, the C-to-A repacking of Pᵀ and dSᵀ, dSᵀ through shared memory and read back
# transposed, the dQ split over warps and passes), with no GPU. It mirrors the kernel by hand, so
# a change to the kernel's addressing must be made here too.
#
#   python3 scripts/cuda_bwd_fragments.py                 # every plan: 64,64,64 64,64,128 128,64,64 128,64,128
#   python3 scripts/cuda_bwd_fragments.py 128,64,64       # head_dim,block_m,block_n
import random, sys

def run(D, BM, BN):
    WARPS = BN // 16
    ROW = D * 2
    DSROW = BM * 2
    KV = BN * ROW
    QO = BM * ROW
    STAGE = 2 * QO + 2 * BM * 4
    K_STEPS, M_TILES, M_STEPS, D_TILES, N_STEPS = D // 16, BM // 8, BM // 16, D // 8, BN // 16
    RG = BM // 16
    WPR = WARPS // RG
    DQ_COLS = D // WPR
    DQ_TILES = DQ_COLS // 8
    PASSES = DQ_COLS // 64 if DQ_COLS > 64 else 1
    PASS_TILES = DQ_TILES // PASSES
    rnd = random.Random(D * 1000 + BM * 10 + BN)
    K = [[rnd.gauss(0, 1) for _ in range(D)] for _ in range(BN)]
    V = [[rnd.gauss(0, 1) for _ in range(D)] for _ in range(BN)]
    Q = [[rnd.gauss(0, 1) for _ in range(D)] for _ in range(BM)]
    dO = [[rnd.gauss(0, 1) for _ in range(D)] for _ in range(BM)]
    lse2 = [rnd.gauss(3, 1) for _ in range(BM)]
    Dr = [rnd.gauss(0, 1) for _ in range(BM)]
    sl2 = 0.125 * 1.4426950408889634
    smem = {}  # byte address (even) -> value

    def swz(rb, row, chunk):
        return row * rb + ((chunk ^ (row & 7)) << 4)

    def store_tile(base, M):
        rb = len(M[0]) * 2
        for r, row in enumerate(M):
            for c, x in enumerate(row):
                smem[base + swz(rb, r, c // 8) + (c % 8) * 2] = x

    s_k = 0
    s_v = s_k + KV
    s_stage0 = s_v + KV
    s_ds = s_stage0 + 2 * STAGE
    stage = 1  # use stage 1 to test the stage offset
    so = stage * STAGE
    DO_OFF = QO
    store_tile(s_k, K)
    store_tile(s_v, V)
    store_tile(s_stage0 + so, Q)
    store_tile(s_stage0 + so + DO_OFF, dO)

    class TileAddr:
        def __init__(self, rb, tile, row, c, c0=0):
            self.rb = rb
            self.base = []
            for b in range(4):
                ch = c0 + 2 * b + c
                self.base.append(tile + row * rb + ((ch & ~7) << 4) + (((ch & 7) ^ (row & 7)) << 4))
        def at(self, k, extra):
            return self.base[k & 3] + (k >> 2) * 128 + extra * self.rb

    def ldm(addrs, trans):
        # addrs[lane]: row address given by that lane; matrix i uses lanes 8i..8i+7.
        out = [[None] * 4 for _ in range(32)]
        for i in range(4):
            rows = [addrs[8 * i + r] for r in range(8)]
            for L in range(32):
                g, t = L // 4, L % 4
                if not trans:
                    lo = smem[rows[g] + 4 * t]
                    hi = smem[rows[g] + 4 * t + 2]
                else:
                    lo = smem[rows[2 * t] + 2 * g]
                    hi = smem[rows[2 * t + 1] + 2 * g]
                out[L][i] = (lo, hi)
        return out

    def mma(c, a, b0, b1):
        # c[lane][4] floats, a[lane][4] pairs, b0/b1[lane] pairs; D = A·B + C.
        A = [[0.0] * 16 for _ in range(16)]
        B = [[0.0] * 8 for _ in range(16)]
        for L in range(32):
            g, t = L // 4, L % 4
            for (reg, row, k0) in [(0, g, 2 * t), (1, g + 8, 2 * t), (2, g, 8 + 2 * t), (3, g + 8, 8 + 2 * t)]:
                A[row][k0], A[row][k0 + 1] = a[L][reg]
            B[2 * t][g], B[2 * t + 1][g] = b0[L]
            B[8 + 2 * t][g], B[8 + 2 * t + 1][g] = b1[L]
        for L in range(32):
            g, t = L // 4, L % 4
            for e in range(4):
                r = g + 8 * (e >> 1)
                col = 2 * t + (e & 1)
                c[L][e] += sum(A[r][k] * B[k][col] for k in range(16))

    dk_w, dv_w, dq_tiles = {}, {}, {}
    lanes = range(32)
    # Per warp: Sᵀ, P, dV, dPᵀ, dS (stored), dK.
    for warp in range(WARPS):
        qt_b = [TileAddr(ROW, s_stage0, (L & 7) + (L >> 4) * 8, (L >> 3) & 1) for L in lanes]
        q_b = [TileAddr(ROW, s_stage0, (L & 7) + ((L >> 3) & 1) * 8, L >> 4) for L in lanes]
        k_a = [TileAddr(ROW, s_k, warp * 16 + (L & 7) + ((L >> 3) & 1) * 8, L >> 4) for L in lanes]
        acc = [[[0.0] * 4 for _ in lanes] for _ in range(M_TILES)]
        for kk in range(K_STEPS):
            a = ldm([k_a[L].at(kk, 0) for L in lanes], False)
            for nn in range(M_TILES // 2):
                b = ldm([qt_b[L].at(kk, nn * 16) + so for L in lanes], False)
                mma(acc[2 * nn], a, [b[L][0] for L in lanes], [b[L][1] for L in lanes])
                mma(acc[2 * nn + 1], a, [b[L][2] for L in lanes], [b[L][3] for L in lanes])
        pk = [[[None] * 4 for _ in lanes] for _ in range(M_STEPS)]
        for n in range(M_TILES):
            for L in lanes:
                t = L % 4
                for e in range(4):
                    acc[n][L][e] = 2 ** (acc[n][L][e] * sl2 - lse2[n * 8 + 2 * t + (e & 1)])
                pk[n // 2][L][(n & 1) * 2] = (acc[n][L][0], acc[n][L][1])
                pk[n // 2][L][(n & 1) * 2 + 1] = (acc[n][L][2], acc[n][L][3])
        dv = [[[0.0] * 4 for _ in lanes] for _ in range(D_TILES)]
        dk = [[[0.0] * 4 for _ in lanes] for _ in range(D_TILES)]
        for kk in range(M_STEPS):
            for dd in range(D_TILES // 2):
                b = ldm([q_b[L].at(dd, kk * 16) + so + DO_OFF for L in lanes], True)
                mma(dv[2 * dd], pk[kk], [b[L][0] for L in lanes], [b[L][1] for L in lanes])
                mma(dv[2 * dd + 1], pk[kk], [b[L][2] for L in lanes], [b[L][3] for L in lanes])
        acc = [[[0.0] * 4 for _ in lanes] for _ in range(M_TILES)]
        for kk in range(K_STEPS):
            a = ldm([k_a[L].at(kk, 0) + KV for L in lanes], False)
            for nn in range(M_TILES // 2):
                b = ldm([qt_b[L].at(kk, nn * 16) + so + DO_OFF for L in lanes], False)
                mma(acc[2 * nn], a, [b[L][0] for L in lanes], [b[L][1] for L in lanes])
                mma(acc[2 * nn + 1], a, [b[L][2] for L in lanes], [b[L][3] for L in lanes])
        for n in range(M_TILES):
            for L in lanes:
                g, t = L // 4, L % 4
                d = [Dr[n * 8 + 2 * t], Dr[n * 8 + 2 * t + 1]]
                for r in range(2):
                    idx = (n & 1) * 2 + r
                    pr = pk[n // 2][L][idx]
                    word = (pr[0] * (acc[n][L][2 * r] - d[0]), pr[1] * (acc[n][L][2 * r + 1] - d[1]))
                    pk[n // 2][L][idx] = word
                    addr = s_ds + swz(DSROW, warp * 16 + g + 8 * r, n) + 4 * t
                    smem[addr], smem[addr + 2] = word
        for kk in range(M_STEPS):
            for dd in range(D_TILES // 2):
                b = ldm([q_b[L].at(dd, kk * 16) + so for L in lanes], True)
                mma(dk[2 * dd], pk[kk], [b[L][0] for L in lanes], [b[L][1] for L in lanes])
                mma(dk[2 * dd + 1], pk[kk], [b[L][2] for L in lanes], [b[L][3] for L in lanes])
        dk_w[warp], dv_w[warp] = dk, dv
    # dQ, after the barrier: each warp its rows and columns.
    dQ = [[0.0] * D for _ in range(BM)]
    for warp in range(WARPS):
        rg = warp % RG
        cg = 0 if WPR == 1 else warp // RG
        ds_a = [TileAddr(DSROW, s_ds, (L & 7) + (L >> 4) * 8, (L >> 3) & 1, 2 * rg) for L in lanes]
        k_b = [TileAddr(ROW, s_k, (L & 7) + ((L >> 3) & 1) * 8, L >> 4, cg * (DQ_COLS // 8)) for L in lanes]
        for p in range(PASSES):
            dq = [[[0.0] * 4 for _ in lanes] for _ in range(PASS_TILES)]
            for kk in range(N_STEPS):
                a = ldm([ds_a[L].at(0, kk * 16) for L in lanes], True)
                for dd in range(PASS_TILES // 2):
                    b = ldm([k_b[L].at(p * (PASS_TILES // 2) + dd, kk * 16) for L in lanes], True)
                    mma(dq[2 * dd], a, [b[L][0] for L in lanes], [b[L][1] for L in lanes])
                    mma(dq[2 * dd + 1], a, [b[L][2] for L in lanes], [b[L][3] for L in lanes])
            for n in range(PASS_TILES):
                for L in lanes:
                    g, t = L // 4, L % 4
                    for e in range(4):
                        row = 16 * rg + g + 8 * (e >> 1)
                        col = cg * DQ_COLS + p * PASS_TILES * 8 + 8 * n + 2 * t + (e & 1)
                        dQ[row][col] += dq[n][L][e]
    # Reference.
    S = [[sum(K[j][x] * Q[i][x] for x in range(D)) for i in range(BM)] for j in range(BN)]
    P = [[2 ** (S[j][i] * sl2 - lse2[i]) for i in range(BM)] for j in range(BN)]
    dP = [[sum(V[j][x] * dO[i][x] for x in range(D)) for i in range(BM)] for j in range(BN)]
    dS = [[P[j][i] * (dP[j][i] - Dr[i]) for i in range(BM)] for j in range(BN)]
    dV = [[sum(P[j][i] * dO[i][x] for i in range(BM)) for x in range(D)] for j in range(BN)]
    dK = [[sum(dS[j][i] * Q[i][x] for i in range(BM)) for x in range(D)] for j in range(BN)]
    dQr = [[sum(dS[j][i] * K[j][x] for j in range(BN)) for x in range(D)] for i in range(BM)]
    err = 0.0
    seen = set()
    for warp in range(WARPS):
        for d in range(D_TILES):
            for L in lanes:
                g, t = L // 4, L % 4
                for e in range(4):
                    key = warp * 16 + g + 8 * (e >> 1)
                    col = 8 * d + 2 * t + (e & 1)
                    seen.add((key, col))
                    err = max(err, abs(dk_w[warp][d][L][e] - dK[key][col]) / (1 + abs(dK[key][col])))
                    err = max(err, abs(dv_w[warp][d][L][e] - dV[key][col]) / (1 + abs(dV[key][col])))
    assert len(seen) == BN * D
    for i in range(BM):
        for x in range(D):
            err = max(err, abs(dQ[i][x] - dQr[i][x]) / (1 + abs(dQr[i][x])))
    print(f"D={D} BM={BM} BN={BN} (warps {WARPS}, dQ {RG}x{WPR} warps, {PASSES} pass(es)): max rel err {err:.2e}")
    return err

worst = max(run(*map(int, a.split(","))) for a in (sys.argv[1:] or ["64,64,64", "64,64,128", "128,64,64", "128,64,128"]))
print("OK" if worst < 1e-9 else "MISMATCH")
sys.exit(0 if worst < 1e-9 else 1)
