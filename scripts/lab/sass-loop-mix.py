#!/usr/bin/env python3
"""The instruction mix of a kernel's loops, from the SASS that sass-from-cache.py, sass-local.sh or
nvrtc-one.py writes.

    python3 scripts/lab/sass-loop-mix.py loops A.sass [B.sass ...]
        each file's four longest loops (a backward branch and its target): instructions by opcode
    python3 scripts/lab/sass-loop-mix.py common A.sass [B.sass ...]
        each function's three longest loops on their shortest path: every block a conditional
        forward branch inside the loop can skip left out (a masked tile's pass, a rescale, a
        rare exact path; the pass of an unmasked tile where no row's max moved), with the
        special-function (MUFU) and FP32 (FADD, FMUL, FFMA) instructions counted apart
    python3 scripts/lab/sass-loop-mix.py hot A.sass FROM TO SKIP_FROM SKIP_TO B.sass FROM TO SKIP_FROM SKIP_TO
        the opcodes two loops [FROM, TO] differ by, each without the block (SKIP_FROM, SKIP_TO)
        that a tile's common path branches over (addresses in hex, as the listing prints them)

Static counts: what a pass through the loop issues when it takes the path kept, not timings."""
import collections
import re
import sys


BRANCH = re.compile(r"BRA\s+(?:\S+\s+)?(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)")


def functions(path):
    """(name, [(address, text)]) of each function in the listing, in order: nvdisasm starts each
    section's addresses from 0 (`.text.NAME:`), cuobjdump names them `Function : NAME`. A branch to
    a label (nvdisasm's listing) gets the label's address appended, as cuobjdump writes it."""
    out = []

    def finish(name, ins, labels):
        target = lambda m: f"{m.group(0)} 0x{labels[m.group(1)]:x}" if m.group(1) in labels else m.group(0)
        out.append((name, [(a, re.sub(r"`\((\.L_x_\d+)\)", target, t)) for a, t in ins]))

    name, ins, labels, pending = "", [], {}, []
    for line in open(path):
        start = re.match(r"(?:\.text\.(\S+):|\s*Function : (\S+))", line)
        if start:
            if ins:
                finish(name, ins, labels)
            name, ins, labels, pending = start.group(1) or start.group(2), [], {}, []
        label = re.match(r"(\.L_x_\d+):", line)
        if label:
            pending.append(label.group(1))
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            address = int(m.group(1), 16)
            labels.update((label_name, address) for label_name in pending)
            pending = []
            ins.append((address, m.group(2).strip()))
    if ins:
        finish(name, ins, labels)
    return out


def instructions(path):
    """Every function's instructions, one after another (a listing of one function: its own)."""
    return [i for _, ins in functions(path) for i in ins]


def opcode(text):
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0]


def backward_branches(ins):
    """(first, last) indices of each loop: a branch back to an address at or before its own."""
    index = {a: i for i, (a, _) in enumerate(ins)}
    found = []
    for i, (a, text) in enumerate(ins):
        m = BRANCH.search(text)
        if m and int(m.group(1), 16) <= a and int(m.group(1), 16) in index:
            found.append((index[int(m.group(1), 16)], i))
    return sorted(found, key=lambda l: l[0] - l[1])


def loops(path):
    for name, ins in functions(path):
        print(path, name, len(ins), "instructions")
        for first, last in backward_branches(ins)[:4]:
            body = ins[first : last + 1]
            mix = collections.Counter(opcode(t) for _, t in body)
            print(f"  loop {body[0][0]:#x}-{body[-1][0]:#x}: {len(body)};", ", ".join(f"{k} {v}" for k, v in mix.most_common()))


def common(path):
    for name, ins in functions(path):
        index = {a: i for i, (a, _) in enumerate(ins)}
        found = backward_branches(ins)[:3]
        if found:
            print(path, name)
        for first, last in found:
            cold = set()
            for i in range(first, last):
                text = ins[i][1]
                m = BRANCH.search(text)
                if m and text.startswith("@") and int(m.group(1), 16) in index:
                    to = index[int(m.group(1), 16)]
                    if i < to <= last:
                        cold.update(range(i + 1, to))
            body = [ins[i] for i in range(first, last + 1) if i not in cold]
            mix = collections.Counter(opcode(t) for _, t in body)
            mufu = sum(v for k, v in mix.items() if k.startswith("MUFU"))
            fp32 = sum(v for k, v in mix.items() if k.split(".")[0] in ("FADD", "FMUL", "FFMA"))
            print(f"  loop {ins[first][0]:#x}-{ins[last][0]:#x}: {len(body)} of {last - first + 1}; MUFU {mufu}, FP32 {fp32};",
                  ", ".join(f"{k} {v}" for k, v in mix.most_common(16)))


def path_mix(path, lo, hi, skip_lo, skip_hi):
    return collections.Counter(
        opcode(t) for a, t in instructions(path) if lo <= a <= hi and not skip_lo < a < skip_hi
    )


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "loops":
        for p in sys.argv[2:]:
            loops(p)
    elif len(sys.argv) > 2 and sys.argv[1] == "common":
        for p in sys.argv[2:]:
            common(p)
    elif len(sys.argv) == 12 and sys.argv[1] == "hot":
        a = path_mix(sys.argv[2], *(int(x, 16) for x in sys.argv[3:7]))
        b = path_mix(sys.argv[7], *(int(x, 16) for x in sys.argv[8:12]))
        print(f"{sum(a.values())} against {sum(b.values())} instructions")
        for k in sorted(set(a) | set(b), key=lambda k: -abs(a[k] - b[k])):
            if a[k] != b[k]:
                print(f"  {k:26} {a[k]:4} {b[k]:4}")
    else:
        sys.exit(__doc__)
