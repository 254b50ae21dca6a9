"""The experiments' figures, drawn with matplotlib when it is installed.

matplotlib is an optional dependency that only this module imports, and only when a figure is drawn:
without it an experiment still writes every table, and says how to get the figures (install
matplotlib, then run the same command again: finished models are read back, not trained again).
Each function takes plain numbers, as results.json holds them, and writes one PNG (about 100 KB).
Checked in tests/experiments/test_experiments.py.
"""

from pathlib import Path

import numpy as np

MISSING = ("figures need matplotlib, which is not installed: `pip install matplotlib`, then run the same "
           "command again (finished models are read back, not trained again)")
TRIPLET_COLOURS = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink"]


def available() -> bool:
    try:
        import matplotlib  # noqa: F401  (only asking whether it is there)
    except ImportError:
        return False
    return True


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no window, no display needed
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path, bottom: float = 0.0) -> None:
    """Write the figure; `bottom`: the fraction of its height kept free below the panels (a legend's)."""
    fig.tight_layout(rect=(0, bottom, 1, 1))
    fig.savefig(path, dpi=100)
    _pyplot().close(fig)
    print(f"figure: {path}")


def running_mean(values: list, window: int) -> np.ndarray:
    """The mean of each value and the window - 1 before it (fewer at the start)."""
    sums = np.cumsum(np.concatenate([[0.0], values]))
    ends = np.arange(1, len(values) + 1)
    starts = np.maximum(ends - window, 0)
    return (sums[ends] - sums[starts]) / (ends - starts)


def loss_curves(path: Path, panels: dict, log_scale: set = frozenset()) -> None:
    """One panel per group ({"Siamese": {label: [loss per step]}, "Triplet": {...}}): each step's loss,
    faint, and its running mean over a twentieth of the steps, as Rygaard et al.'s Fig. 3. The panels
    named in log_scale get a logarithmic loss axis, chosen by the caller and not by the numbers, so
    that every run of a study draws the same panel on the same scale (a loss of 0, which a log axis
    cannot show, leaves the curve's line there open)."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(7.5 * len(panels), 3.8), squeeze=False)
    for ax, (title, curves) in zip(axes[0], panels.items()):
        for colour, (label, losses) in zip(TRIPLET_COLOURS, curves.items()):
            steps = np.arange(1, len(losses) + 1)
            ax.plot(steps, losses, color=colour, alpha=0.25, linewidth=0.8)
            ax.plot(steps, running_mean(losses, max(1, len(losses) // 20)), color=colour, linewidth=2, label=label)
        if title in log_scale:
            ax.set_yscale("log")
        ax.set_title(f"{title} networks" + (" (log scale)" if title in log_scale else ""))
        ax.set_xlabel("step")
        ax.set_ylabel("training loss")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))  # beside the curves, not on them
    _save(fig, path)


def pca_panels(path: Path, panels: dict) -> None:
    """One panel per model ({label: {"query", "positive", "negative": [[x, y], ...], "explained": [r1, r2]}}):
    each triplet in its own colour, the query a circle joined to its positive (triangle, solid line)
    and its negative (cross, dashed line), as Rygaard et al.'s Fig. 2B."""
    plt = _pyplot()
    columns = min(len(panels), 3)
    rows = -(-len(panels) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.9 * rows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for ax, (label, pca) in zip(axes.flat, panels.items()):
        for i, (q, p, n) in enumerate(zip(pca["query"], pca["positive"], pca["negative"])):
            colour = TRIPLET_COLOURS[i % len(TRIPLET_COLOURS)]
            ax.plot([q[0], p[0]], [q[1], p[1]], color=colour, linewidth=1)
            ax.plot([q[0], n[0]], [q[1], n[1]], color=colour, linewidth=1, linestyle="--")
            ax.scatter(*q, color=colour, marker="o", s=50, edgecolors="black", linewidths=0.5, zorder=3)
            ax.scatter(*p, color=colour, marker="^", s=50, zorder=3)
            ax.scatter(*n, color=colour, marker="x", s=50, zorder=3)
        ratio = pca["explained"]
        ax.set_title(label)
        ax.set_xlabel(f"PC1 ({100 * ratio[0]:.0f}% of variance)")
        ax.set_ylabel(f"PC2 ({100 * ratio[1]:.0f}%)")
        ax.grid(alpha=0.3)
    handles = [plt.Line2D([], [], color="grey", marker=m, linestyle=s, label=t)
               for m, s, t in (("o", "", "query"), ("^", "-", "positive"), ("x", "--", "negative"))]
    legend_height = 0.4 / fig.get_figheight()  # 0.4 inch below the panels, clear of their axis labels
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize="small")
    _save(fig, path, bottom=legend_height)


def dims_figure(path: Path, dims: list, results: dict, tests: dict, speed: dict, metric: str, label: str,
                margin: float | None = None) -> None:
    """Left: each model's `metric` difference with its 95% interval (unadjusted): the trained model at
    each D from the untrained start model (tests["against_start"]), the untrained PCA projection at
    each D from it (tests["projection_cost"]), the trained model at each D from the base model, paired
    (tests["against_base"]), and the base model from the start (tests["base_moved"]) as a line with its
    interval as a band; 0 is the start model, the grey band ±margin. Each seed's own difference is a
    small dot beside its mean, offset so that none hides under the mean's marker. An identical pair
    (every difference 0) is a marker at 0 with no bar. Right: search speed against D ({corpus label:
    [queries per second per D]})."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.6))
    offset = {"against_start": 0.94, "projection_cost": 1.0, "against_base": 1.06}  # side by side at each D
    for family, colour, marker, name in (("against_start", "tab:blue", "o", "trained D - start model"),
                                         ("projection_cost", "tab:orange", "s", "untrained PCA projection - start model"),
                                         ("against_base", "tab:purple", "^", "trained D - base model (paired)")):
        xs = [dim * offset[family] for dim in dims]
        found = [tests[family][str(dim)] for dim in dims]
        means = [t["difference"] for t in found]
        ends = [t.get("ci95", [0.0, 0.0]) for t in found]
        bars = [[m - e[0] for m, e in zip(means, ends)], [e[1] - m for m, e in zip(means, ends)]]
        left.errorbar(xs, means, yerr=bars, marker=marker, color=colour, capsize=3, label=name, linestyle="none")
        for x, test in zip(xs, found):
            seeds = test.get("seed_differences", [])
            if len(seeds) > 1:
                left.scatter([x * 1.025] * len(seeds), seeds, color=colour, s=10, alpha=0.8, zorder=3,
                             edgecolors="black", linewidths=0.3)
    base = tests["base_moved"]
    left.axhline(base["difference"], color="tab:green", linewidth=1.5, label="base model - start model")
    left.axhspan(*base.get("ci95", [0.0, 0.0]), color="tab:green", alpha=0.15)
    left.axhline(0, color="grey", linestyle=":", linewidth=1.5, label="start model, untrained")
    if margin:
        left.axhspan(-margin, margin, color="grey", alpha=0.15, label=f"equivalence margin {margin:g} either side of 0")
    left.set_title(f"{label} differences; bars and band: 95% intervals (unadjusted),\n"
                   "small dots beside each marker: each seed's own difference", fontsize="medium")
    left.set_ylabel(f"{label} difference")
    for colour, (corpus, values) in zip(TRIPLET_COLOURS, speed.items()):
        right.plot(dims, values, marker="o", color=colour, label=corpus)
    right.set_title("exact search speed")
    right.set_ylabel("queries per second")
    right.set_yscale("log")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(dims, [str(d) for d in dims])
        ax.xaxis.set_minor_locator(plt.NullLocator())
    # Speeds span one or two powers of ten: label 1, 2 and 5 times each, written out (2,000, not 2x10^3).
    right.yaxis.set_major_locator(plt.LogLocator(subs=(1.0, 2.0, 5.0)))
    right.yaxis.set_major_formatter(plt.FuncFormatter(lambda value, _: f"{value:,.0f}"))
    right.yaxis.set_minor_locator(plt.NullLocator())
    for ax in (left, right):
        ax.set_xlabel("embedding size D")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    _save(fig, path)


def differences(path: Path, tests: dict, xlabel: str, margin: float | None = None) -> None:
    """One row per model ({label: {"difference", "ci95": [low, high], "p_holm" or "p_randomization",
    "seed_differences"}}): its mean difference as a dot, its 95% interval (unadjusted) as a bar, each
    seed's own difference as a small dot just below the row, the line at 0 and the grey band ±margin.
    A dot is filled where p (Holm-adjusted where given) < 0.05 and hollow where the test cannot tell;
    the title says which correction each follows, since a bar clear of 0 can carry a hollow dot."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 0.55 * len(tests) + 1.6))
    for row, (label, test) in enumerate(reversed(list(tests.items()))):
        low, high = test.get("ci95", [0.0, 0.0])  # an identical pair: every difference 0, nothing tested
        p = test.get("p_holm", test.get("p_randomization", 1.0))
        ax.plot([low, high], [row, row], color="tab:blue", linewidth=2)
        ax.scatter([test["difference"]], [row], color="tab:blue" if p < 0.05 else "white", edgecolors="tab:blue",
                   s=45, zorder=3)
        seeds = test.get("seed_differences", [])
        ax.scatter(seeds, [row - 0.22] * len(seeds), color="black", s=10, zorder=3)
    ax.axvline(0, color="grey", linewidth=1, linestyle="--")
    if margin:
        ax.axvspan(-margin, margin, color="grey", alpha=0.15)
    ax.set_yticks(range(len(tests)), list(reversed(list(tests))))
    ax.set_xlabel(xlabel)
    adjusted = all("p_holm" in test for test in tests.values())
    ax.set_title(("dot filled: Holm-adjusted p < 0.05;\nhollow: not detectable after the adjustment;\n"
                  if adjusted else "dot filled: p < 0.05, hollow: not detectable;\n")
                 + "bar: the 95% interval, not adjusted; small dots below: each seed"
                 + (f";\ngrey band: the equivalence margin, {margin:g} either side of 0" if margin else ""), fontsize="small")
    ax.grid(alpha=0.3, axis="x")
    _save(fig, path)
