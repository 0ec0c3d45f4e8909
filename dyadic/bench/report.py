"""The table (text / Markdown), JSON and the PNG plot."""

import json
import os

COLUMNS = ("primitive", "device", "V", "B", "implementation", "median", "min-max", "vs base",
           "vs floor", "note")


def fmt_time(s):
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.1f} us"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def table_rows(results):
    rows = []
    for r in results:
        ratio = r.get("ratio_to_baseline")
        floor = r.get("ratio_to_floor")
        rows.append((r["primitive"], r["device"], str(r["vocab"]), str(r["batch"]), r["impl"],
                     fmt_time(r["median_s"]),
                     f"{fmt_time(r['min_s'])}-{fmt_time(r['max_s'])}",
                     "-" if ratio is None else f"{ratio:.2f}x {r['baseline']}",
                     "-" if floor is None else f"{floor:.1f}x",
                     r.get("note", "")))
    return rows


def text_table(results):
    rows = table_rows(results)
    w = [max(len(x) for x in col) for col in zip(COLUMNS, *rows)]
    lines = ["  ".join(c.ljust(w[i]) for i, c in enumerate(COLUMNS)).rstrip()]
    lines.append("-" * len(lines[0]))
    lines += ["  ".join(c.ljust(w[i]) for i, c in enumerate(r)).rstrip() for r in rows]
    return "\n".join(lines)


def markdown_table(results):
    rows = table_rows(results)
    out = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def write(results, meta, outdir, plot=True):
    os.makedirs(outdir, exist_ok=True)
    paths = {"json": os.path.join(outdir, "bench.json"), "md": os.path.join(outdir, "bench.md")}
    with open(paths["json"], "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
    with open(paths["md"], "w") as f:
        f.write(f"Measured {meta['date']} on {meta['machine']}.\n"
                f"{meta['versions']}\n\n{markdown_table(results)}\n")
        if meta.get("notes"):
            f.write("\n" + "\n".join(f"- {n}" for n in meta["notes"]) + "\n")
    if plot:
        p = plot_png(results, os.path.join(outdir, "bench.png"), meta)
        if p:
            paths["png"] = p
    return paths


def plot_png(results, path, meta):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    prims = sorted({r["primitive"] for r in results})
    if not prims:
        return None
    fig, axes = plt.subplots(1, len(prims), figsize=(4.2 * len(prims), 3.8), squeeze=False)
    for ax, prim in zip(axes[0], prims):
        series = {}
        for r in results:
            if r["primitive"] == prim:
                series.setdefault((r["impl"], r["device"], r["vocab"]), []).append(
                    (r["batch"], r["median_s"]))
        for (impl, dev, v), pts in sorted(series.items()):
            pts.sort()
            ax.plot([b for b, _ in pts], [t * 1e6 for _, t in pts], marker="o",
                    label=f"{impl} ({dev}) V={v}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(prim)
        ax.set_xlabel("batch")
        ax.set_ylabel("median time (us)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
    fig.suptitle(f"dyadic side-by-side, {meta['machine']}, {meta['date']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
