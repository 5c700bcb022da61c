#!/usr/bin/env python3
"""One CUDA kernel config compiled as the library compiles it, in seconds and without cargo: its
NVRTC options and kernel file from src/cuda/golden/plans.txt (the golden configs, for sm_90a:
every backward one, the forward's plain ones), the kernel files and headers of cuda/, a lab edit
file applied to all of them (the grammar of src/lab.rs; `a.edit:b.edit` applies both, as
WFA_EDIT does), NVRTC 13.0 and nvdisasm from scripts/lab/cuda-tools.sh. `-D` arguments are added after the config's own (a score-term
variant of a plain forward config: -DFA_SOFTCAP=1 -DFA_EX2_FMA=1, as src/cuda/plan sets them).

    python3 scripts/lab/nvrtc-one.py CONFIG [EDIT] [-DNAME=VALUE ...] [--out DIR]

writes DIR/CONFIG[+defines]-<edit or main>.cubin and .sass (DIR: target/nvrtc-one) and prints
ptxas's report; `python3 scripts/lab/sass-loop-mix.py common` reads the .sass. Static counts, not
timings; scripts/lab/sass-local.sh compiles through the library itself, every config at once."""
import ctypes
import os
import subprocess
import sys

ROOT = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=True).stdout.strip()


def edits(path):
    """The (old, new) blocks of an edit file, refused as src/lab.rs refuses them."""
    text = open(path).read()
    if "\r" in text:
        sys.exit(f"{path}: CRLF line ends")
    blocks, old, new, at = [], None, None, "outside"
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        marker = line.rstrip("\n")
        if at == "outside":
            if marker == "<<<<":
                at, old = "old", ""
            elif marker in ("====", ">>>>"):
                sys.exit(f"{path}: line {number}: `{marker}` outside a block")
        elif marker == "<<<<":
            sys.exit(f"{path}: line {number}: `<<<<` inside a block")
        elif at == "old":
            if marker == "====":
                if not old:
                    sys.exit(f"{path}: line {number}: a block that replaces no text")
                at, new = "new", ""
            elif marker == ">>>>":
                sys.exit(f"{path}: line {number}: `>>>>` before the block's `====`")
            else:
                old += line
        elif marker == "====":
            sys.exit(f"{path}: line {number}: `====` twice in a block")
        elif marker == ">>>>":
            blocks.append((old, new))
            at = "outside"
        else:
            new += line
    if at != "outside" or not blocks:
        sys.exit(f"{path}: a block is not closed, or there is none")
    return blocks


def main():
    args = sys.argv[1:]
    out = os.path.join(ROOT, "target", "nvrtc-one")
    if "--out" in args:
        i = args.index("--out")
        out = args[i + 1]
        del args[i : i + 2]
    defines = [a for a in args if a.startswith("-D")]
    args = [a for a in args if not a.startswith("-D")]
    if not 1 <= len(args) <= 2:
        sys.exit(__doc__)
    config, edit = args[0], (args[1] if len(args) == 2 else None)
    # "bwd NAME: ..." and "wgmma[i] ...: NAME | ...", each with " options=".
    lines = [l for l in open(os.path.join(ROOT, "src/cuda/golden/plans.txt"))
             if " options=" in l and (f" {config}: " in l or f": {config} | " in l)]
    if not lines:
        sys.exit(f"{config}: no options for it in src/cuda/golden/plans.txt")
    options = lines[0].split(" options=", 1)[1].split(" | ")[0].split() + defines
    source = lines[0].split(" source=", 1)[1].split()[0]
    cuda = os.path.join(ROOT, "cuda")
    files = {name: open(os.path.join(cuda, name)).read() for name in os.listdir(cuda) if name.endswith((".cu", ".cuh"))}
    for old, new in [block for path in edit.split(":") for block in edits(path)] if edit else []:
        applied = [name for name in files if old in files[name]]
        for name in applied:
            files[name] = files[name].replace(old, new)
        print(f"edit block: {', '.join(applied) or 'in no file'}")
    tools = subprocess.run([os.path.join(ROOT, "scripts/lab/cuda-tools.sh")], capture_output=True, text=True, check=True).stdout.strip()
    # libnvrtc opens its builtins library by name: loaded first, by its path, it is found.
    ctypes.CDLL(os.path.join(tools, "lib", "libnvrtc-builtins.so.13.0"))
    nvrtc = ctypes.CDLL(os.path.join(tools, "lib", "libnvrtc.so.13"))
    headers = sorted(name for name in files if name.endswith(".cuh"))
    texts = [files[h].encode() for h in headers]
    names = [h.encode() for h in headers]
    flags = [o.encode() for o in options]
    strings = lambda items: (ctypes.c_char_p * len(items))(*items)
    program = ctypes.c_void_p()
    assert nvrtc.nvrtcCreateProgram(ctypes.byref(program), files[source].encode(), source.encode(), len(headers), strings(texts), strings(names)) == 0
    status = nvrtc.nvrtcCompileProgram(program, len(flags), strings(flags))
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(program, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(program, log)
    log = log.value.decode(errors="replace")
    if status != 0:
        sys.exit(log)
    nvrtc.nvrtcGetCUBINSize(program, ctypes.byref(size))
    cubin = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetCUBIN(program, cubin)
    os.makedirs(out, exist_ok=True)
    tag = "".join("+" + d[2:] for d in defines)
    edit_names = "+".join(os.path.splitext(os.path.basename(path))[0] for path in edit.split(":")) if edit else "main"
    stem = os.path.join(out, f"{config}{tag}-{edit_names}")
    open(stem + ".cubin", "wb").write(cubin.raw)
    with open(stem + ".sass", "w") as sass:
        subprocess.run([os.path.join(tools, "bin", "nvdisasm"), "--print-code", stem + ".cubin"], stdout=sass, check=True)
    for line in log.splitlines():
        if "Compiling entry" in line or "spill" in line or "Used" in line:
            print(line.strip())
    print(stem + ".sass")


if __name__ == "__main__":
    main()
