#!/usr/bin/env python3
"""The machine code NVIDIA's Vulkan driver made of a pipeline, from its pipeline-cache data.

`coop_pipeline_stats` (src/coop_probe.rs) writes each cooperative configuration's cache data to
$COOP_STATS_DIR/<name>.vkcache. NVIDIA (driver 580) stores there, after a 100-byte header, a
zstd frame; inside it a container whose SASS is a plain run of 16-byte Hopper instructions ending
in EXIT. This script cuts that run out and hands it to the CUDA toolkit's disassembler.

    python3 scripts/lab/sass-from-cache.py unpack DIR   # needs the zstd tool: DIR/<name>.vkcache -> DIR/<name>.raw
    python3 scripts/lab/sass-from-cache.py sass DIR     # needs nvdisasm (CUDA toolkit): DIR/<name>.raw -> DIR/<name>.sass

(The H200 machine has nvdisasm but no zstd, so `unpack` runs on the build machine.) The code's
first instruction is found by trying starts before the first S2R (reading a special register,
which every kernel does early) until nvdisasm accepts the whole run."""
import glob
import os
import struct
import subprocess
import sys

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
EXIT = b"\x4d\x79\x00\x00\x00\x00\x00\x00"  # EXIT, unpredicated, first 8 bytes
S2R = 0x919  # opcode field (low 12 bits) of S2R


def unpack(directory):
    for cache in sorted(glob.glob(os.path.join(directory, "*.vkcache"))):
        blob = open(cache, "rb").read()
        at = blob.find(ZSTD_MAGIC)
        run = subprocess.run(["zstd", "-d", "-c"], input=blob[at:], capture_output=True)
        if at < 0 or run.returncode != 0:
            print(f"{cache}: no zstd frame ({run.stderr[:100]!r})")
            continue
        open(cache[: -len(".vkcache")] + ".raw", "wb").write(run.stdout)
        print(f"{cache}: {len(run.stdout)} bytes unpacked")


def disassemble(directory):
    for raw in sorted(glob.glob(os.path.join(directory, "*.raw"))):
        data = open(raw, "rb").read()
        end = data.find(EXIT) + 16  # the last instruction: NVIDIA ends the code with it
        starts = [i for i in range(end % 16, end, 16) if struct.unpack_from("<H", data, i)[0] & 0xFFF == S2R]
        if end < 16 or not starts:
            print(f"{raw}: no code found")
            continue
        for start in range(starts[0] - 16 * 16, starts[0] + 16, 16):
            if start < 0:
                continue
            code = raw[: -len(".raw")] + ".code"
            open(code, "wb").write(data[start:end])
            run = subprocess.run(["nvdisasm", "-b", "SM90", code], capture_output=True, text=True)
            if run.returncode == 0:
                open(raw[: -len(".raw")] + ".sass", "w").write(run.stdout)
                lines = run.stdout.splitlines()
                count = lambda op: sum(f" {op}" in line for line in lines)
                print(f"{raw}: {len(lines)} lines, HMMA {count('HMMA')}, LDSM {count('LDSM')}, "
                      f"LDL {count('LDL')}, STL {count('STL')}, BAR {count('BAR')}")
                break
        else:
            print(f"{raw}: nvdisasm accepted no start")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("unpack", "sass"):
        sys.exit(__doc__)
    (unpack if sys.argv[1] == "unpack" else disassemble)(sys.argv[2])
