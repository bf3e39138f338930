"""Figures of a report: one colour per method, zero-safe log axes, curves and per-seed steps."""

from __future__ import annotations

import io
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tpo_gym.agents.common.registry import method_spec, resolve_algorithm
from tpo_gym.evaluation import metrics as M
from tpo_gym.evaluation._io import atomic_write_bytes
from tpo_gym.evaluation.presets import Preset
from tpo_gym.evaluation.report.values import Cell, _diagnostic_keys

#: The one colour list of every report: method i of the preset gets ``PALETTE[i % len(PALETTE)]``.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf")
_WEIGHT_KEYS = {"mean_q_winners": ("q", "winners"), "mean_q_losers": ("q", "losers"),
                "mean_abs_adv_winners": ("|A|", "winners"), "mean_abs_adv_losers": ("|A|", "losers")}
_ERROR_KEYS = ("error", "test_error", "misalignment")
#: At most this many decades on a log axis; below, a symlog axis turns linear.
MAX_DECADES = 8


def method_colors(methods: list[str]) -> dict[str, str]:
    """``{method: colour}``: the colour of each method in every figure of a report (preset order)."""
    return {m: PALETTE[i % len(PALETTE)] for i, m in enumerate(methods)}


@dataclass(frozen=True)
class Scale:
    """A y-axis scale: ``"linear"``, ``"log"`` or ``"symlog"`` (linear below ``linthresh``)."""

    kind: str
    linthresh: float | None = None
    floor: float | None = None

    @property
    def note(self) -> str:
        if self.kind == "symlog":
            return f"symlog, linear below {self.linthresh:.0e}"
        return "log" if self.kind == "log" else ""


def zero_safe_scale(values: Any, max_decades: int = MAX_DECADES) -> Scale:
    """The log-like y scale that draws ``values`` honestly.

    All values positive and within ``max_decades`` decades: ``log``. Any value ``<= 0`` (an exact
    zero: a log axis would cut it off or draw it at an arbitrary floor) or a wider range: ``symlog``,
    linear below a threshold -- the smallest positive value rounded down to a power of ten, raised
    so that at most ``max_decades`` decades are drawn logarithmically. No positive value: ``linear``.
    """
    x = np.asarray(values, dtype=float).ravel()
    x = x[np.isfinite(x)]
    pos = x[x > 0]
    if pos.size == 0:
        return Scale("linear")
    top = 10.0 ** math.ceil(math.log10(float(np.max(np.abs(x)))))
    low = 10.0 ** math.floor(math.log10(float(pos.min())))
    if np.any(x <= 0) or top / low > 10.0 ** max_decades:
        thresh = max(low, top / 10.0 ** max_decades)
        return Scale("symlog", linthresh=thresh, floor=0.0 if np.all(x >= 0) else None)
    return Scale("log", floor=low)

@dataclass
class Figure:
    """One written figure: file name, heading and caption for report.md."""

    name: str
    title: str
    caption: str


def _band(mat: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(mean, s.e., seeds with a value)`` per column of a curve matrix."""
    mean = M.seed_mean_curve(mat)
    n = np.sum(~np.isnan(mat), axis=0)
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        se = np.where(n > 1, np.nanstd(mat, axis=0, ddof=1) / np.sqrt(np.maximum(n, 1)), 0.0)
    return mean, np.nan_to_num(se), n


def _apply_scale(ax: Any, scale: Scale) -> None:
    if scale.kind == "log":
        from matplotlib.ticker import LogFormatterSciNotation

        ax.set_yscale("log")
        # label some minor ticks too when the axis spans only a decade or two (e.g. 2% .. 90% error)
        ax.yaxis.set_minor_formatter(LogFormatterSciNotation(labelOnlyBase=False, minor_thresholds=(2, 0.5)))
    elif scale.kind == "symlog":
        ax.set_yscale("symlog", linthresh=scale.linthresh, linscale=0.5)
        if scale.floor is not None:
            ax.set_ylim(bottom=0.0)


def _label_panel(ax: Any, title: str, ylabel: str, scale: Scale) -> None:
    """Title, axis labels and grid of a curve panel over steps. The y-scale's note ("symlog, linear below
    1e-04") goes under the x-axis, where it has the panel's width, not beside the y-axis, where a long label
    runs past the panel's height into its neighbours."""
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("step" + (f"\ny: {scale.note}" if scale.note else ""), fontsize=9)
    ax.set_ylabel(ylabel, fontsize=9)
    ax.grid(alpha=0.3)


def _draw(ax: Any, steps: np.ndarray, mat: np.ndarray, color: Any, scale: Scale, nonneg: bool,
          style: str = "-", label: str | None = None, lw: float = 1.4, method: str | None = None,
          upper: float | None = None) -> Any:
    """One seed-mean line with its ± s.e. band; ``method`` is kept as the line's gid (tests read it)."""
    mean, se, _ = _band(mat)
    (line,) = ax.plot(steps, mean, style, color=color, lw=lw, label=label, gid=method)
    low, high = mean - se, mean + se
    if nonneg:
        low = np.maximum(low, 0.0)
    if upper is not None:
        high = np.minimum(high, upper)
    if scale.kind == "log" and scale.floor is not None:
        low = np.maximum(low, scale.floor)
    ax.fill_between(steps, low, high, color=color, alpha=0.18, lw=0)
    return line


def _width(method: str, colors: dict[str, str]) -> float:
    """Earlier methods draw wider, so a line that a later one overlaps still shows at its edges."""
    order = list(colors)
    return 2.2 - 1.0 * order.index(method) / max(1, len(order) - 1)


def _new_figure(n_panels: int, width: float = 4.2, height: float = 3.2) -> tuple[Any, list[Any]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ncols = min(4, n_panels)
    nrows = math.ceil(n_panels / ncols)
    if n_panels == 1:
        width = 6.0
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows + 0.5), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[n_panels:]:
        ax.set_visible(False)
    return fig, flat[:n_panels]


def _save(fig: Any, path: Path, handles: list[Any], labels: list[str], title: str) -> None:
    import matplotlib.pyplot as plt

    fig.suptitle(title, fontsize=11)
    bottom = 0.0
    if handles:
        column = 0.75 + 0.07 * max(len(label) for label in labels)  # inches per legend column
        ncol = max(1, min(len(labels), int(fig.get_figwidth() // column)))
        rows = math.ceil(len(labels) / ncol)
        fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=8, frameon=False)
        bottom = (0.1 + 0.2 * rows) / fig.get_figheight()
    fig.tight_layout(rect=(0, bottom, 1, 1))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def _settings_with(preset: Preset, cells: dict[tuple[str, str], Cell], keys: tuple[str, ...]) -> list[str]:
    return [s["name"] for s in preset.settings
            if any(k in c.keys() for (_, st), c in cells.items() if st == s["name"] for k in keys)]


def _gaps(cells: dict[tuple[str, str], Cell], keys: tuple[str, ...]) -> list[str]:
    """Where every seed lacks ``keys`` while the run goes on (every group had zero variance).

    Only steps on the key's own logging grid count: a key logged every N steps (a held-out score)
    has no gaps between its evaluations."""
    out = []
    logged: set[float] = set()
    for cell in cells.values():
        for k in keys:
            if cell.rows and k in cell.keys():
                ksteps, mat = cell.matrix(k)
                if mat.size:
                    logged |= {s for s, col in zip(ksteps, (~np.isnan(mat)).any(axis=0), strict=True) if col}
    grid = sorted(logged)
    stride = min(b - a for a, b in zip(grid, grid[1:], strict=False)) if len(grid) > 1 else 1.0

    def expected(step: float) -> bool:
        return stride <= 1 or not grid or (step - grid[0]) % stride == 0

    for (method, setting), cell in cells.items():
        if not cell.rows or not any(k in cell.keys() for k in keys):
            continue
        steps, err = cell.matrix("zero_variance_fraction")
        if err.size == 0:
            continue
        blank = np.ones(len(steps), dtype=bool)
        for k in keys:
            ksteps, mat = cell.matrix(k)
            if mat.size == 0:
                continue
            have = {s for s, col in zip(ksteps, (~np.isnan(mat)).any(axis=0), strict=True) if col}
            blank &= np.array([s not in have and expected(s) for s in steps])
        zero_var = np.nanmin(err, axis=0) >= 1.0 - 1e-9
        both = blank & zero_var
        if both.any():
            first = int(steps[np.flatnonzero(both)[0]])
            out.append(f"{method} in {setting}: {int(both.sum())} of {len(steps)} steps, first at step {first}")
    return out


def _seeds_note(cells: dict[tuple[str, str], Cell], n_seeds: int) -> str:
    short = [f"{c.method} in {c.setting} ({len(c.rows)})" for c in cells.values() if 0 < len(c.rows) < n_seeds]
    base = f"Seed mean ± s.e. over {n_seeds} seeds"
    return base + (f" (fewer seeds: {', '.join(short)})" if short else "") + "."


def _fig_curves(preset: Preset, cells: dict[tuple[str, str], Cell], key: str, colors: dict[str, str],
                log: bool, path: Path, n_seeds: int) -> Figure | None:
    settings = _settings_with(preset, cells, (key,))
    if not settings:
        return None
    fig, axes = _new_figure(len(settings))
    handles: dict[str, Any] = {}
    notes = []
    for ax, setting in zip(axes, settings, strict=True):
        drawn = [(m, *cells[(m, setting)].matrix(key)) for m in colors
                 if (m, setting) in cells and cells[(m, setting)].rows]
        drawn = [(m, s, mat) for m, s, mat in drawn if mat.size]
        means = np.concatenate([M.seed_mean_curve(mat) for _, _, mat in drawn]) if drawn else np.array([])
        nonneg = bool(np.all(means[np.isfinite(means)] >= -1e-12)) if means.size else True
        scale = zero_safe_scale(means) if log else Scale("linear")
        for method, steps, mat in drawn:
            handles[method] = _draw(ax, steps, mat, colors[method], scale, nonneg, method=method,
                                    upper=1.0 if key.endswith("_fraction") else None, lw=_width(method, colors))
        _apply_scale(ax, scale)
        if scale.kind == "symlog":
            notes.append(f"{setting}: symlog, linear below {scale.linthresh:.0e}")
        _label_panel(ax, setting, key, scale)
    order = [m for m in colors if m in handles]
    _save(fig, path, [handles[m] for m in order], order, f"{key}: seed mean ± s.e.")
    caption = _seeds_note(cells, n_seeds)
    if log:
        caption += " Log y-axis."
        if notes:
            caption += (" Panels whose curves reach exactly 0 (or span more than "
                        f"{MAX_DECADES} decades) use a symlog axis, linear below the stated threshold, so zeros "
                        "are drawn at 0 instead of being cut off: " + "; ".join(notes) + ".")
    gaps = _gaps({k: c for k, c in cells.items() if k[1] in settings}, (key,))
    if gaps:
        caption += (" Lines break where every seed had only zero-variance groups (nothing to log): "
                    + "; ".join(gaps) + ".")
    return Figure(path.name, key.replace("_", " "), caption)


def _fig_loss(preset: Preset, cells: dict[tuple[str, str], Cell], colors: dict[str, str], path: Path,
              n_seeds: int) -> Figure | None:
    methods = [m for m in colors if any(c.method == m and "loss" in c.keys() for c in cells.values())]
    if not methods:
        return None
    fig, axes = _new_figure(len(methods))
    setting_names = [s["name"] for s in preset.settings]
    for ax, method in zip(axes, methods, strict=True):
        mine = [s for s in setting_names if (method, s) in cells and "loss" in cells[(method, s)].keys()]
        for i, setting in enumerate(mine):
            steps, mat = cells[(method, setting)].matrix("loss")
            shade = _shade(colors[method], i, len(mine))
            _draw(ax, steps, mat, shade, Scale("linear"), nonneg=False, label=setting if len(mine) > 1 else None,
                  method=f"{method} | {setting}")
        ax.set_title(method, fontsize=10, color=colors[method])
        ax.set_xlabel("step")
        ax.set_ylabel("loss (first epoch)", fontsize=9)
        ax.grid(alpha=0.3)
        if len(mine) > 1:
            ax.legend(fontsize=6, ncol=2)
        elif mine:
            ax.text(0.98, 0.95, mine[0], transform=ax.transAxes, ha="right", va="top", fontsize=7, color="0.4")
    _save(fig, path, [], [], "loss: one panel per method (the objectives differ)")
    caption = (_seeds_note(cells, n_seeds) + " One panel per method, each on its own y-axis: every method "
               "minimises a different objective (TPO: cross-entropy to its target q; GRPO and PPO: clipped "
               "surrogates; REINFORCE, DG: policy-gradient losses), so their values are not comparable. "
               "Darker shades of a method's colour are later settings of the preset.")
    algos = {m["name"]: m["algo"] for m in preset.methods if not m.get("imported")}  # an import's algo: a name
    if any(m in algos and method_spec(resolve_algorithm(algos[m])).clipped_surrogate for m in methods):
        caption += (" At the first epoch the ratio to the rollout policy is 1, so a clipped surrogate equals minus "
                    "the mean advantage, about 0 with zero-mean advantages: GRPO's and PPO's first-epoch loss says "
                    "little about learning.")
    return Figure(path.name, "loss", caption)


def _shade(color: str, i: int, n: int) -> tuple[float, float, float]:
    from matplotlib.colors import to_rgb

    rgb = np.array(to_rgb(color))
    if n <= 1:
        return tuple(rgb)
    mix = 0.65 * (1 - i / (n - 1))  # first setting lightest, last the method's colour
    return tuple(rgb + (1 - rgb) * mix)


def _fig_weights(preset: Preset, cells: dict[tuple[str, str], Cell], colors: dict[str, str], path: Path,
                 n_seeds: int) -> Figure | None:
    keys = tuple(_WEIGHT_KEYS)
    settings = _settings_with(preset, cells, keys)
    if not settings:
        return None
    from matplotlib.lines import Line2D

    fig, axes = _new_figure(len(settings))
    used: dict[str, str] = {}
    for ax, setting in zip(axes, settings, strict=True):
        drawn = []
        for method in colors:
            cell = cells.get((method, setting))
            if cell is None or not cell.rows:
                continue
            for key, (what, side) in _WEIGHT_KEYS.items():
                steps, mat = cell.matrix(key)
                if mat.size:
                    drawn.append((method, what, side, steps, mat))
        means = np.concatenate([M.seed_mean_curve(mat) for *_, mat in drawn]) if drawn else np.array([])
        scale = zero_safe_scale(means)
        for method, what, side, steps, mat in drawn:
            _draw(ax, steps, mat, colors[method], scale, nonneg=True, style="-" if side == "winners" else "--",
                  method=method)
            used[method] = what
        _apply_scale(ax, scale)
        _label_panel(ax, setting, "weight per candidate", scale)
    order = [m for m in colors if m in used]
    handles = [Line2D([], [], color=colors[m], lw=1.6) for m in order]
    labels = [f"{m}: mean {used[m]}" for m in order]
    handles += [Line2D([], [], color="0.3", lw=1.4), Line2D([], [], color="0.3", lw=1.4, ls="--")]
    labels += ["winners (u > 0)", "losers (u < 0)"]
    _save(fig, path, handles, labels, "weight on winners vs losers: seed mean ± s.e.")
    caption = (_seeds_note(cells, n_seeds) + " Solid: candidates that beat their group's mean score (u > 0); "
               "dashed: candidates below it. The weight is the mean target probability q_i for TPO-style "
               "methods and the mean |A_i| for GRPO (docs/method.md section 5); log y-axis, symlog where the "
               "panel reaches 0.")
    gaps = _gaps({k: c for k, c in cells.items() if k[1] in settings}, keys)
    if gaps:
        caption += (" Lines break where every group of every seed had zero variance, so there was no winner "
                    "or loser to weigh: " + "; ".join(gaps) + ".")
    return Figure(path.name, "winners vs losers", caption)


def _fig_seed_steps(preset: Preset, cells: dict[tuple[str, str], Cell], metric: dict[str, Any],
                    colors: dict[str, str], path: Path) -> Figure | None:
    """Per-seed steps to the threshold, one dot per seed, beside the seed-mean crossing (a black bar)."""
    key, thr = metric.get("key", "error"), float(metric["threshold"])
    settings = _settings_with(preset, cells, (key,))
    if not settings:
        return None
    fig, axes = _new_figure(len(settings))
    rng = np.random.default_rng(0)
    handles: dict[str, Any] = {}
    never_any = False
    for ax, setting in zip(axes, settings, strict=True):
        methods = [m for m in colors if (m, setting) in cells and cells[(m, setting)].rows]
        top = 1.0
        per: dict[str, tuple[np.ndarray, float | None, float]] = {}
        for m in methods:
            steps, mat = cells[(m, setting)].matrix(key)
            if not mat.size:
                continue
            per[m] = (M.per_seed_steps_to_threshold(mat, thr, steps), M.steps_to_threshold(mat, thr, steps),
                      float(np.max(steps)))
            top = max(top, per[m][2])
        never_y = top * 1.15
        panel_never = False
        for x, m in enumerate(per):
            values, crossing, _ = per[m]
            jitter = rng.uniform(-0.18, 0.18, values.size)
            reached = np.isfinite(values)
            handles[m] = ax.scatter(x + jitter[reached], values[reached], s=18, color=colors[m], alpha=0.8, gid=m)
            if (~reached).any():
                never_any = panel_never = True
                ax.scatter(x + jitter[~reached], np.full((~reached).sum(), never_y), s=22, facecolors="none",
                           edgecolors=colors[m], gid=m)
            if crossing is not None:
                ax.hlines(crossing, x - 0.32, x + 0.32, color="black", lw=1.6)
        ax.set_xticks(range(len(per)), list(per), fontsize=8, rotation=20)
        finite = [v for vals, _, _ in per.values() for v in vals[np.isfinite(vals)] if v > 0]
        if finite and max(finite) / max(min(finite), 1e-9) > 20:
            ax.set_yscale("log")
        ax.set_xlim(-0.6, len(per) - 0.4)
        if panel_never:
            ax.axhline(never_y, color="grey", lw=0.6, ls=":")
            ax.text(-0.55, never_y, "never", ha="left", va="bottom", fontsize=7, color="grey")
        ax.set_title(setting, fontsize=10)
        ax.set_ylabel(f"steps to {key} < {thr:g}", fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    order = [m for m in colors if m in handles]
    _save(fig, path, [handles[m] for m in order], order, f"per-seed steps to {key} < {thr:g}")
    caption = (f"One dot per seed: the first step at which that seed's own {key} is below {thr:g}; the black bar "
               "is the step at which the seed-mean curve first is (the table's value). Plateau lengths are "
               "heavy-tailed: a few slow seeds can put the seed-mean crossing far above the typical seed.")
    if never_any:
        caption += " Open circles on the dotted line: seeds that never got there within the run."
    return Figure(path.name, f"per-seed steps to {key} < {thr:g}", caption)


def _complementary(cells: dict[tuple[str, str], Cell], a: str, b: str) -> bool:
    """Whether ``a == 1 - b`` wherever both are logged (then plotting ``a`` only repeats ``b``)."""
    seen = False
    for cell in cells.values():
        for rows in cell.rows:
            for r in rows:
                if a in r and b in r and r[a] is not None and r[b] is not None:
                    x, y = float(r[a]), float(r[b])
                    if math.isfinite(x) and math.isfinite(y):
                        seen = True
                        if abs(x + y - 1.0) > 1e-6:
                            return False
    return seen


def _figures(preset: Preset, cells: dict[tuple[str, str], Cell], out: Path, n_seeds: int) -> list[Figure]:
    colors = method_colors([m["name"] for m in preset.methods])
    present = set().union(*(c.keys() for c in cells.values())) if cells else set()
    log = bool(preset.data.get("log_y", False))
    wanted = list(preset.data.get("curves", ["error"]))
    wanted += [k for k in _diagnostic_keys() if k in present and k not in wanted]
    skip_any = _complementary(cells, "any_success_fraction", "all_fail_fraction")
    figures: list[Figure] = []
    done: set[str] = set()
    for key in wanted:
        name = "weights" if key in _WEIGHT_KEYS else key
        if name in done or (name != "weights" and key not in present):
            continue
        done.add(name)
        path = out / f"curves_{name}.png"
        if name == "weights":
            fig = _fig_weights(preset, cells, colors, path, n_seeds)
        elif key == "loss":
            fig = _fig_loss(preset, cells, colors, path, n_seeds)
        elif key == "any_success_fraction" and skip_any:
            continue
        else:
            fraction = key.endswith("_fraction")
            fig = _fig_curves(preset, cells, key, colors, (log and key in _ERROR_KEYS) or key == "grad_norm",
                              path, n_seeds)
            if fig is not None and key == "grad_norm":
                fig.caption = ("L2 norm of the gradient of the first epoch of each step. " + fig.caption)
            if fig is not None and key == "all_fail_fraction" and skip_any:
                fig.caption += (" The fraction of groups with at least one success is 1 − this fraction in "
                                "this run (every score is 0 or 1), so it is not drawn separately.")
            if fig is not None and fraction:
                fig.caption = f"Fraction of groups per step. {fig.caption}"
        if fig is not None:
            figures.append(fig)
    for metric in preset.metrics:
        if metric["type"] == M.STEPS_TO_THRESHOLD:
            fig = _fig_seed_steps(preset, cells, metric, colors, out / f"seeds_{metric['id']}.png")
            if fig is not None:
                figures.append(fig)
    return figures
