#!/usr/bin/env python3
"""The charts and the headline table of BENCHMARKS.md, made from the JSON lines under bench-results/.

    python3 scripts/bench-charts.py           # writes docs/charts/*.svg, prints the headline table
    python3 scripts/bench-charts.py --check   # writes nothing; fails if a committed chart is stale

Every chart compares our kernel with PyTorch's FlashAttention-2 and cuDNN measured in the SAME
device call (the run folder's torch*.jsonl): figures from different calls drift by a few percent
on the same binary, more than some of the gaps shown. Each chart names its run folder.

Python 3 standard library only (the SVG is written by hand), and deterministic: the same inputs give
byte-identical files, so a regenerated chart shows up in `git diff` only when a figure changed.
"""
import argparse
import json
import math
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

RESULTS = Path("bench-results")
CHARTS = Path("docs/charts")

# The runs behind BENCHMARKS.md's current tables. A newer run of a path replaces its folder here.
COOP_RUN = RESULTS / "2026-12-07/session50/call9"   # wgpu cooperative matrix, f16, head_dim 64/128/256
CUDA_RUN = RESULTS / "2026-11-29/cuda-run5"   # CUDA wgmma, bf16, head_dim 64/128/256
F32_RUN = RESULTS / "2026-11-29/run3"         # wgpu register-tiled f32 and the naive kernel
BACKWARD_RUN = RESULTS / "2026-11-29/run9"    # wgpu f32 backward
COOP_BACKWARD_RUN = RESULTS / "2026-12-07/session50/call9"  # wgpu cooperative-matrix backward, f16
HEAD_DIMS = (64, 128, 256)

# --------------------------------------------------------------------------------------- reading


def read_jsonl(run, name):
    """The rows of `name` in a run folder. Some runs keep their JSON lines only inside results.tgz
    (at most eight files come back from a device call, so a run packs them); such a file is read
    from the archive without unpacking it."""
    path = run / name
    if path.exists():
        text = path.read_text()
    else:
        archive = run / "results.tgz"
        if not archive.exists():
            raise FileNotFoundError(path)
        with tarfile.open(archive) as tar:
            text = tar.extractfile(name).read().decode()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def where(run, name):
    """How a chart names a file it read: plain, or as found inside the run's results.tgz."""
    return name if (run / name).exists() else f"{name} in results.tgz"


def wgpu_rows(run, name):
    """examples/attention --json rows, by (head_dim, seq, causal); rows that failed their float64
    check are left out (a wrong result has no speed)."""
    rows = {}
    for r in read_jsonl(run, name):
        if not r["pass"]:
            print(f"note: {run / name}: {r['kernel']} seq {r['seq_q']} failed its check, not plotted", file=sys.stderr)
            continue
        rows[(r["head_dim"], r["seq_q"], r["causal"])] = r
    return rows


def cuda_rows(run, name="ours.jsonl"):
    """examples/cuda_attention --json rows, by (head_dim, seq, causal), the checked ones only."""
    rows = {}
    for r in read_jsonl(run, name):
        if not r["ok"]:
            print(f"note: {run / name}: {r['kernel']} seq {r['seq']} failed its check, not plotted", file=sys.stderr)
            continue
        rows[(r["head_dim"], r["seq"], r["causal"])] = r
    return rows


def torch_rows(run, name="torch.jsonl"):
    """torch_sdpa.py --json rows, by (head_dim, seq, causal)."""
    return {(r["head_dim"], r["seq"], r["causal"]): r for r in read_jsonl(run, name)}


def flash_tflops(row):
    return row["flash_tflops"]


def cuda_tflops(row):
    return row["tflops"]


def naive_tflops(row):
    """The naive kernel's rate on the same FLOP count: the run stores its time, not its rate."""
    return row["flash_tflops"] * row["flash_ms"] / row["naive_ms"] if row.get("naive_ms") else None


# ------------------------------------------------------------------------------------ the charts


@dataclass(frozen=True)
class Series:
    label: str
    points: tuple  # ((x, y), ...) sorted by x
    color: str
    ours: bool  # ours: solid and thick; a reference: dashed


@dataclass(frozen=True)
class Chart:
    filename: str
    title: str
    run: Path  # named under the title: every figure on the chart comes from this one folder
    files: tuple  # the run's files it read, named under the plot
    x_label: str
    y_label: str
    series: tuple
    # A log y axis where our lines sit two orders of magnitude below the references (f32 on the
    # FMA units against bf16 on tensor cores), which a linear axis would flatten onto zero.
    log_y: bool = False


# One color per role across every chart, so that a reader learns them once.
OURS_MAIN = "#1f5fa8"
OURS_OTHER = "#7a7a7a"
FA2 = "#c8401e"
CUDNN = "#2e8b3a"


def points(rows, head_dim, causal, value):
    """(seq, value(row)) over a table's sequence lengths, for one head_dim and masking."""
    picked = sorted((seq, value(r)) for (d, seq, c), r in rows.items() if d == head_dim and c == causal)
    return tuple((seq, y) for seq, y in picked if y is not None)


def torch_series(torch, head_dim, causal):
    return (
        Series("PyTorch FlashAttention-2 (bf16)", points(torch, head_dim, causal, lambda r: r.get("flash_fwd_tflops")), FA2, False),
        Series("PyTorch cuDNN (bf16)", points(torch, head_dim, causal, lambda r: r.get("cudnn_fwd_tflops")), CUDNN, False),
    )


def masking(causal):
    return "causal" if causal else "non-causal"


def forward_chart(filename, title, run, files, head_dim, causal, ours, log_y=False):
    return Chart(
        filename=filename,
        title=f"{title}, head_dim {head_dim}, {masking(causal)}",
        run=run,
        files=tuple(where(run, f) for f in files),
        x_label="sequence length, log₂ scale (batch × seq = 16k tokens, hidden 2048)",
        y_label="TFLOP/s",
        series=ours + torch_series(torch_rows(run), head_dim, causal),
        log_y=log_y,
    )


def coop_charts():
    """(a) The wgpu cooperative-matrix kernel (f16) beside the best non-matrix kernel on the same
    f16 data and PyTorch."""
    for head_dim in HEAD_DIMS:
        coop = wgpu_rows(COOP_RUN, f"table_coop{head_dim}.jsonl")
        tiled = wgpu_rows(COOP_RUN, f"table_tiled{head_dim}.jsonl")
        for causal in (False, True):
            yield forward_chart(
                f"wgpu-coop-f16-d{head_dim}-{masking(causal)}.svg",
                "wgpu cooperative matrix (f16)",
                COOP_RUN,
                [f"table_coop{head_dim}.jsonl", f"table_tiled{head_dim}.jsonl", "torch.jsonl"],
                head_dim,
                causal,
                (
                    Series("ours: cooperative matrix (f16)", points(coop, head_dim, causal, flash_tflops), OURS_MAIN, True),
                    Series("ours: best non-matrix (sg_f32, f16 data)", points(tiled, head_dim, causal, flash_tflops), OURS_OTHER, True),
                ),
            )


def cuda_charts():
    """(b) The CUDA path (wgmma on Hopper, bf16) beside PyTorch."""
    ours = cuda_rows(CUDA_RUN)
    for head_dim in HEAD_DIMS:
        for causal in (False, True):
            yield forward_chart(
                f"cuda-wgmma-bf16-d{head_dim}-{masking(causal)}.svg",
                "CUDA wgmma (bf16)",
                CUDA_RUN,
                ["ours.jsonl", "torch.jsonl"],
                head_dim,
                causal,
                (Series("ours: CUDA wgmma (bf16)", points(ours, head_dim, causal, cuda_tflops), OURS_MAIN, True),),
            )


def f32_charts():
    """(c) The wgpu f32 forward (FMA units, no tensor cores) beside the naive kernel, with
    PyTorch's bf16 tensor-core figures for scale."""
    flash = wgpu_rows(F32_RUN, "table_main.jsonl")
    for causal in (False, True):
        yield forward_chart(
            f"wgpu-f32-d128-{masking(causal)}.svg",
            "wgpu register-tiled (f32)",
            F32_RUN,
            ["table_main.jsonl", "torch.jsonl"],
            128,
            causal,
            (
                Series("ours: flash (f32)", points(flash, 128, causal, flash_tflops), OURS_MAIN, True),
                Series("ours: naive (f32)", points(flash, 128, causal, naive_tflops), OURS_OTHER, True),
            ),
            log_y=True,
        )


def decode_charts():
    """Decode bandwidth (K/V bytes read per second against the KV length), for every run folder
    that holds decode results. None does yet; this is where they will be drawn.

    Reads torch_decode.py's rows (`torch_decode*.jsonl`: batch, heads, kv_heads, head_dim, q_len,
    kv_len, flash_TBps, cudnn_TBps) and our decode benchmark's (`decode*.jsonl`), which are
    expected to carry the same shape fields and `TBps`, K/V bytes read per second in 1e12."""
    for run in sorted(p for p in RESULTS.glob("*/*") if p.is_dir()):
        ours_files = sorted(p.name for p in run.glob("decode*.jsonl"))
        torch_files = sorted(p.name for p in run.glob("torch_decode*.jsonl"))
        if not ours_files and not torch_files:
            continue

        def shape(r):
            return (r["batch"], r["heads"], r["kv_heads"], r["head_dim"], r.get("q_len", 1))

        ours = [r for f in ours_files for r in read_jsonl(run, f)]
        torch = [r for f in torch_files for r in read_jsonl(run, f)]
        for s in sorted({shape(r) for r in ours + torch}):
            batch, heads, kv_heads, head_dim, q_len = s

            def series(label, rows, field, color, is_ours):
                pts = tuple(sorted((r["kv_len"], r[field]) for r in rows if shape(r) == s and field in r))
                return Series(label, pts, color, is_ours)

            yield Chart(
                filename=f"decode-{run.parent.name}-{run.name}-b{batch}-h{heads}-kv{kv_heads}-d{head_dim}-q{q_len}.svg",
                title=f"Decode: batch {batch}, {heads} query heads over {kv_heads} KV heads, head_dim {head_dim}, {q_len} new token(s)",
                run=run,
                files=tuple(ours_files + torch_files),
                x_label="KV length (tokens), log₂ scale",
                y_label="TB/s of K/V read",
                series=tuple(
                    x for x in (
                        series("ours", ours, "TBps", OURS_MAIN, True),
                        series("PyTorch FlashAttention-2", torch, "flash_TBps", FA2, False),
                        series("PyTorch cuDNN", torch, "cudnn_TBps", CUDNN, False),
                    ) if x.points
                ),
            )


def all_charts():
    return [*coop_charts(), *cuda_charts(), *f32_charts(), *decode_charts()]


# ------------------------------------------------------------------------------------------- SVG

WIDTH, HEIGHT = 820, 460
PLOT_LEFT, PLOT_RIGHT, PLOT_TOP, PLOT_BOTTOM = 64, 520, 64, 374  # the legend sits right of the plot
FONT = "font-family=\"Helvetica, Arial, sans-serif\""


def num(x):
    """Coordinates with one decimal: short files, and no float noise between platforms."""
    return f"{x:.1f}"


def nice_step(span, ticks=6):
    """A 1, 2 or 5 × 10^k step giving about `ticks` intervals over `span`."""
    raw = span / ticks
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def tick_label(value):
    """Sequence lengths as 512, 1k, 2k, ..., 16k: powers of two read better that way."""
    return f"{value // 1024}k" if value >= 1024 and value % 1024 == 0 else str(value)


def render(chart):
    xs = [x for s in chart.series for x, _ in s.points]
    ys = [y for s in chart.series for _, y in s.points]
    # x: log2, padded half an octave each side so end markers do not sit on the frame.
    lo, hi = math.log2(min(xs)) - 0.5, math.log2(max(xs)) + 0.5
    if chart.log_y:
        # Decades and their 2 and 5 marks, from the decade below the lowest point.
        y_bottom = 10 ** math.floor(math.log10(min(ys)))
        y_top = 10 ** math.ceil(math.log10(max(ys) * 1.05))
        y_ticks = [m * 10**e for e in range(round(math.log10(y_bottom)), round(math.log10(y_top)) + 1)
                   for m in (1, 2, 5) if m * 10**e <= y_top]

        def y_fraction(y):
            return math.log10(y / y_bottom) / math.log10(y_top / y_bottom)
    else:
        y_step = nice_step(max(ys) * 1.05)
        y_top = math.ceil(max(ys) * 1.05 / y_step) * y_step
        y_ticks = [i * y_step for i in range(round(y_top / y_step) + 1)]

        def y_fraction(y):
            return y / y_top

    def px(x):
        return PLOT_LEFT + (math.log2(x) - lo) / (hi - lo) * (PLOT_RIGHT - PLOT_LEFT)

    def py(y):
        return PLOT_BOTTOM - y_fraction(y) * (PLOT_BOTTOM - PLOT_TOP)

    subtitle = f"run {chart.run.as_posix()} · NVIDIA {gpu_of(chart.run)} · PyTorch 2.11 SDPA in the same device call"
    files = "data: " + ", ".join(chart.files)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" {FONT} font-size="12">',
        f"<title>{escape(chart.title)}</title>",
        f"<desc>{escape(subtitle)}; {escape(files)}</desc>",
        # An opaque background: the charts stay readable on dark-themed pages.
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>',
        f'<text x="{PLOT_LEFT}" y="24" font-size="15" font-weight="bold" fill="#111">{escape(chart.title)}</text>',
        f'<text x="{PLOT_LEFT}" y="44" font-size="12" fill="#444">{escape(subtitle)}</text>',
        f'<text x="{PLOT_LEFT}" y="{HEIGHT - 12}" font-size="11" fill="#666">{escape(files)}</text>',
    ]
    # Gridlines and ticks: y at y_ticks, x at each power of two in range.
    for y in y_ticks:
        out.append(f'<line x1="{PLOT_LEFT}" x2="{PLOT_RIGHT}" y1="{num(py(y))}" y2="{num(py(y))}" stroke="#e3e3e3"/>')
        out.append(f'<text x="{PLOT_LEFT - 6}" y="{num(py(y) + 4)}" text-anchor="end" fill="#333">{y:g}</text>')
    for e in range(math.ceil(lo), math.floor(hi) + 1):
        x = px(2**e)
        out.append(f'<line x1="{num(x)}" x2="{num(x)}" y1="{PLOT_TOP}" y2="{PLOT_BOTTOM}" stroke="#e3e3e3"/>')
        out.append(f'<line x1="{num(x)}" x2="{num(x)}" y1="{PLOT_BOTTOM}" y2="{PLOT_BOTTOM + 5}" stroke="#333"/>')
        out.append(f'<text x="{num(x)}" y="{PLOT_BOTTOM + 18}" text-anchor="middle" fill="#333">{tick_label(2**e)}</text>')
    out.append(f'<rect x="{PLOT_LEFT}" y="{PLOT_TOP}" width="{PLOT_RIGHT - PLOT_LEFT}" height="{PLOT_BOTTOM - PLOT_TOP}" fill="none" stroke="#333"/>')
    out.append(f'<text x="{(PLOT_LEFT + PLOT_RIGHT) // 2}" y="{PLOT_BOTTOM + 40}" text-anchor="middle" fill="#111">{escape(chart.x_label)}</text>')
    mid = (PLOT_TOP + PLOT_BOTTOM) // 2
    y_label = chart.y_label + (", log scale" if chart.log_y else "")
    out.append(f'<text x="18" y="{mid}" text-anchor="middle" transform="rotate(-90 18 {mid})" fill="#111">{escape(y_label)}</text>')

    # The references first, so that our lines are drawn on top where they cross.
    for s in sorted(chart.series, key=lambda s: s.ours):
        style = f'stroke="{s.color}" stroke-width="{2.5 if s.ours else 1.8}" fill="none"'
        if not s.ours:
            style += ' stroke-dasharray="6 4"'
        path = " ".join(f"{num(px(x))},{num(py(y))}" for x, y in s.points)
        out.append(f'<polyline points="{path}" {style}/>')
        for x, y in s.points:
            out.append(f'<circle cx="{num(px(x))}" cy="{num(py(y))}" r="3.2" fill="{s.color}"><title>{escape(s.label)}: {tick_label(x)}, {y:g}</title></circle>')

    # The legend, in the order the series were given (ours first).
    for i, s in enumerate(chart.series):
        y = PLOT_TOP + 10 + i * 22
        dash = "" if s.ours else ' stroke-dasharray="6 4"'
        out.append(f'<line x1="{PLOT_RIGHT + 16}" x2="{PLOT_RIGHT + 44}" y1="{y}" y2="{y}" stroke="{s.color}" stroke-width="{2.5 if s.ours else 1.8}"{dash}/>')
        out.append(f'<circle cx="{PLOT_RIGHT + 30}" cy="{y}" r="3.2" fill="{s.color}"/>')
        out.append(f'<text x="{PLOT_RIGHT + 52}" y="{y + 4}" fill="#111">{escape(s.label)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------ headline table


def ratio(ours, reference):
    return f"{ours / reference:.2f}×" if reference else "—"


def gpu_of(run, row=None):
    """The GPU a run (or one of its rows) ran on, short ("H200", "H100"): wgpu rows name their
    adapter; a run folder may keep nvidia-smi's line in gpu.txt (the CUDA rows name no device).
    The lent machine has been an H200 or an H100: a chart or row must say which."""
    name = (row or {}).get("adapter")
    if name is None and (run / "gpu.txt").exists():
        lines = [l for l in (run / "gpu.txt").read_text().splitlines() if l.strip()]
        name = lines[-1].split(",")[0]
    if name is None:
        names = (r.get("adapter") for f in sorted(run.glob("*.jsonl")) for r in read_jsonl(run, f.name))
        name = next((n for n in names if n), None)
    if name is None:
        raise ValueError(f"{run}: no gpu.txt and no row naming its adapter")
    return next((w for w in name.split() if w[:1] == "H" and w[1:].isdigit()), name)


def headline_rows():
    """(path, dtype, head_dim, seq, causal, ours, FA2, cuDNN, PyTorch's row, run, GPU) at the key shapes:
    our best per path, PyTorch from the same call. Figures at the precision the run's JSON lines
    hold them (PyTorch's to one decimal; ours to one decimal), nothing typed."""
    seq = 8192
    coop, coop_torch = wgpu_rows(COOP_RUN, "table_coop128.jsonl"), torch_rows(COOP_RUN)
    for causal in (False, True):
        key = (128, seq, causal)
        yield ("wgpu cooperative matrix", "f16", key, coop[key]["flash_tflops"],
               coop_torch[key]["flash_fwd_tflops"], coop_torch[key]["cudnn_fwd_tflops"], coop_torch[key], COOP_RUN, gpu_of(COOP_RUN, coop[key]))
    f32, f32_torch = wgpu_rows(F32_RUN, "table_main.jsonl"), torch_rows(F32_RUN)
    for causal in (False, True):
        key = (128, seq, causal)
        yield ("wgpu register-tiled", "f32", key, f32[key]["flash_tflops"],
               f32_torch[key]["flash_fwd_tflops"], f32_torch[key]["cudnn_fwd_tflops"], f32_torch[key], F32_RUN, gpu_of(F32_RUN, f32[key]))
    cuda, cuda_torch = cuda_rows(CUDA_RUN), torch_rows(CUDA_RUN)
    for head_dim in HEAD_DIMS:
        for causal in (False, True):
            key = (head_dim, seq, causal)
            yield ("CUDA wgmma", "bf16", key, cuda[key]["tflops"],
                   cuda_torch[key]["flash_fwd_tflops"], cuda_torch[key]["cudnn_fwd_tflops"], cuda_torch[key], CUDA_RUN, gpu_of(CUDA_RUN, cuda[key]))
    bwd = {(r["head_dim"], r["seq_q"], r["causal"]): r for r in read_jsonl(BACKWARD_RUN, "bwd.jsonl") if r["pass"]}
    bwd_torch = torch_rows(BACKWARD_RUN, "torch_bwd.jsonl")
    for causal in (False, True):
        key = (128, seq, causal)
        yield ("wgpu backward (dQ, dK, dV)", "f32", key, bwd[key]["backward_tflops"],
               bwd_torch[key]["flash_bwd_tflops"], bwd_torch[key]["cudnn_bwd_tflops"], bwd_torch[key], BACKWARD_RUN, gpu_of(BACKWARD_RUN, bwd[key]))
    coop_bwd = {(r["head_dim"], r["seq_q"], r["causal"]): r
                for r in read_jsonl(COOP_BACKWARD_RUN, "bwd_coop.jsonl") if r["pass"]}
    coop_bwd_torch = torch_rows(COOP_BACKWARD_RUN, "torch_bwd.jsonl")
    for causal in (False, True):
        key = (128, seq, causal)
        yield ("wgpu cooperative-matrix backward", "f16", key, coop_bwd[key]["backward_tflops"],
               coop_bwd_torch[key]["flash_bwd_tflops"], coop_bwd_torch[key]["cudnn_bwd_tflops"],
               coop_bwd_torch[key], COOP_BACKWARD_RUN, gpu_of(COOP_BACKWARD_RUN, coop_bwd[key]))


def headline_table():
    lines = [
        "| path | dtype | head_dim | seq | causal | GPU | ours (TFLOP/s) | PyTorch dtype | PyTorch FA2 | cuDNN | ours / FA2 | ours / cuDNN | run |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for path, dtype, (head_dim, seq, causal), ours, fa2, cudnn, torch, run, gpu in headline_rows():
        lines.append(
            f"| {path} | {dtype} | {head_dim} | {seq} | {'yes' if causal else 'no'} | {gpu} | **{ours:.1f}** "
            f"| {torch.get('dtype', 'bf16')} | {fa2} | {cudnn} "
            f"| {ratio(ours, fa2)} | {ratio(ours, cudnn)} | [{run.name}]({run.as_posix()}/) |"
        )
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare with docs/charts/ instead of writing")
    args = ap.parse_args()
    charts = all_charts()
    stale = []
    if not args.check:
        CHARTS.mkdir(parents=True, exist_ok=True)
    for chart in charts:
        path = CHARTS / chart.filename
        svg = render(chart)
        if args.check:
            if not path.exists() or path.read_text() != svg:
                stale.append(path.as_posix())
        else:
            path.write_text(svg)
    print(headline_table(), end="")
    if stale:
        print(f"stale charts (run python3 scripts/bench-charts.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
