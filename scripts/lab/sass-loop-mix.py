#!/usr/bin/env python3
"""The instruction mix of a kernel's loops, from the SASS that sass-from-cache.py writes.

    python3 scripts/lab/sass-loop-mix.py loops A.sass [B.sass ...]
        each file's four longest loops (a backward branch and its target): instructions by opcode
    python3 scripts/lab/sass-loop-mix.py hot A.sass FROM TO SKIP_FROM SKIP_TO B.sass FROM TO SKIP_FROM SKIP_TO
        the opcodes two loops [FROM, TO] differ by, each without the block (SKIP_FROM, SKIP_TO)
        that a tile's common path branches over (addresses in hex, as the listing prints them)

Static counts: what a pass through the loop issues when it takes the path kept, not timings."""
import collections
import re
import sys


def instructions(path):
    out = []
    for line in open(path):
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            out.append((int(m.group(1), 16), m.group(2).strip()))
    return out


def opcode(text):
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0]


def loops(path):
    ins = instructions(path)
    index = {a: i for i, (a, _) in enumerate(ins)}
    found = []
    for i, (a, text) in enumerate(ins):
        m = re.search(r"BRA\s+(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)", text)
        if m and int(m.group(1), 16) <= a and int(m.group(1), 16) in index:
            found.append((index[int(m.group(1), 16)], i))
    print(path, len(ins), "instructions")
    for first, last in sorted(found, key=lambda l: l[0] - l[1])[:4]:
        body = ins[first : last + 1]
        mix = collections.Counter(opcode(t) for _, t in body)
        print(f"  loop {body[0][0]:#x}-{body[-1][0]:#x}: {len(body)};", ", ".join(f"{k} {v}" for k, v in mix.most_common()))


def path_mix(path, lo, hi, skip_lo, skip_hi):
    return collections.Counter(
        opcode(t) for a, t in instructions(path) if lo <= a <= hi and not skip_lo < a < skip_hi
    )


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "loops":
        for p in sys.argv[2:]:
            loops(p)
    elif len(sys.argv) == 12 and sys.argv[1] == "hot":
        a = path_mix(sys.argv[2], *(int(x, 16) for x in sys.argv[3:7]))
        b = path_mix(sys.argv[7], *(int(x, 16) for x in sys.argv[8:12]))
        print(f"{sum(a.values())} against {sum(b.values())} instructions")
        for k in sorted(set(a) | set(b), key=lambda k: -abs(a[k] - b[k])):
            if a[k] != b[k]:
                print(f"  {k:26} {a[k]:4} {b[k]:4}")
    else:
        sys.exit(__doc__)
