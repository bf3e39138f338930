"""The report: zero-safe scales, one colour per method, claim checks, n/a cells, IQM groups, file modes,
rebuilding from results.jsonl."""

from __future__ import annotations

import json
import math
import os
import shutil
import stat
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.evaluation.conftest import COLOUR_PRESET, write_preset
from tpo_gym.evaluation import claims as C
from tpo_gym.evaluation import report as R
from tpo_gym.evaluation._io import atomic_write_text, current_umask, make_dirs
from tpo_gym.evaluation.presets import load_preset
from tpo_gym.evaluation.report import NoStoredRuns, build_report, method_colors, zero_safe_scale
from tpo_gym.evaluation.runner import bench


# ---------------------------------------------------------------------------------------------
# zero-safe scale
# ---------------------------------------------------------------------------------------------
def test_zero_safe_scale_log_when_every_value_is_positive() -> None:
    scale = zero_safe_scale([0.9, 0.1, 2e-3, np.nan])
    assert scale.kind == "log" and scale.floor == pytest.approx(1e-3) and scale.note == "log"


def test_zero_safe_scale_exact_zeros_give_symlog_at_the_resolution() -> None:
    # a token error of 1 token in B*H*n = 100*5*3 tokens, and exact zeros: linear below 1e-4, zero drawn at 0
    scale = zero_safe_scale([0.5, 0.01, 1 / 1500, 0.0, 0.0])
    assert scale.kind == "symlog" and scale.linthresh == pytest.approx(1e-4) and scale.floor == 0.0
    assert "linear below 1e-04" in scale.note


def test_zero_safe_scale_caps_the_number_of_decades() -> None:
    scale = zero_safe_scale([50.0, 1.0, 5.5e-20])
    assert scale.kind == "symlog" and scale.linthresh == pytest.approx(100 / 10**R.MAX_DECADES)
    tiny_negative = zero_safe_scale([0.7, 0.1, -7.4e-17])  # float rounding below 0
    assert tiny_negative.kind == "symlog" and tiny_negative.floor is None


def test_zero_safe_scale_linear_without_positive_values() -> None:
    assert zero_safe_scale([0.0, -1.0]).kind == "linear"
    assert zero_safe_scale([]).kind == "linear"


# ---------------------------------------------------------------------------------------------
# one colour per method
# ---------------------------------------------------------------------------------------------

def test_method_colors_follow_the_preset_order() -> None:
    colors = method_colors(["TPO", "GRPO", "PPO", "DG"])
    assert colors == dict(zip(["TPO", "GRPO", "PPO", "DG"], R.PALETTE[:4], strict=True))
    assert method_colors(["DG", "TPO"])["DG"] == R.PALETTE[0]
    assert len(set(method_colors([f"m{i}" for i in range(10)]).values())) == 10


def test_every_line_of_every_figure_has_its_methods_colour(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from matplotlib.colors import to_hex

    seen: list[tuple[str, str, str]] = []
    original = R._save

    def spy(fig, path, handles, labels, title):
        for ax in fig.axes:
            for line in ax.get_lines():
                if line.get_gid():
                    seen.append((path.name, line.get_gid(), to_hex(line.get_color())))
        original(fig, path, handles, labels, title)

    monkeypatch.setattr("tpo_gym.evaluation.report.figures._save", spy)
    out = tmp_path / "out"
    bench(load_preset(str(write_preset(tmp_path, COLOUR_PRESET))), out, progress=False)
    build_report(out)
    colors = method_colors(["TPO", "DG"])
    figures = {name for name, _, _ in seen}
    assert {"curves_error.png", "curves_misalignment.png", "curves_grad_norm.png"} <= figures
    assert {(gid, c) for _, gid, c in seen} == {("TPO", colors["TPO"]), ("DG", colors["DG"])}


def test_curve_panels_keep_their_labels_inside_the_panel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A y-label no taller than its panel (a long symlog note once ran into the neighbouring panels and the
    title); the scale's note under the x-axis instead."""
    checked: list[tuple[str, str]] = []
    original = R._save

    def spy(fig, path, handles, labels, title):
        fig.canvas.draw()
        for ax in fig.axes:
            if not ax.get_visible() or not ax.get_xlabel().startswith("step"):
                continue
            label = ax.yaxis.label
            assert label.get_window_extent().height <= ax.get_window_extent().height, (path.name, label.get_text())
            if ax.get_yscale() == "symlog":
                assert "symlog, linear below" in ax.get_xlabel() and "symlog" not in label.get_text()
                checked.append((path.name, ax.get_title()))
        original(fig, path, handles, labels, title)

    monkeypatch.setattr("tpo_gym.evaluation.report.figures._save", spy)
    out = tmp_path / "out"
    bench(load_preset(str(write_preset(tmp_path, COLOUR_PRESET))), out, progress=False)
    build_report(out)
    assert {name for name, _ in checked} == {"curves_grad_norm.png"}  # exact zeros there: symlog panels


# ---------------------------------------------------------------------------------------------
# report text
# ---------------------------------------------------------------------------------------------
CLAIMS_PRESET = {
    "name": "claims", "description": "test-only preset: no paper numbers, one claim per verdict",
    "paper_ref": "none", "seeds": 2,
    "settings": [
        {"name": "bandit", "kind": "tabular_single",
         "params": {"n_arms": 10, "batch_size": 20, "steps": 20, "step_size": 0.5}},
        {"name": "multi", "kind": "tabular_multi", "methods": ["TPO"],
         "params": {"n_contexts": 5, "n_arms": 4, "steps": 20, "step_size": 0.5}},
    ],
    "methods": [{"name": "TPO", "algo": "TPO"}, {"name": "DG", "algo": "DG"}, {"name": "PG", "algo": "REINFORCE"}],
    "metrics": [{"id": "final_error", "type": "final", "key": "error", "scale": 100, "unit": "%"},
                {"id": "steps_to_1pct", "type": "steps_to_threshold", "key": "error", "threshold": 0.01}],
    "paper": {},
    "paper_claims": [
        {"text": "TPO beats DG.", "checks": [{"test": "best", "metric": "final_error", "method": "TPO",
                                              "among": ["DG"], "settings": ["bandit"]}]},
        {"text": "DG beats TPO.", "checks": [{"test": "best", "metric": "final_error", "method": "DG",
                                              "among": ["TPO"], "settings": ["bandit"]}]},
        {"text": "PG plateaus.", "checks": [{"test": "above", "metric": "final_error", "method": "PG", "value": 0}]},
    ],
    "notes": ["a note of the preset"],
    "curves": ["error"], "log_y": True,
}


@pytest.fixture(scope="module")
def claims_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("claims")
    out = root / "out"
    bench(load_preset(str(write_preset(root, CLAIMS_PRESET))), out, progress=False)
    build_report(out)
    return out


def test_report_without_paper_numbers_says_nothing_was_compared(claims_report: Path) -> None:
    text = (claims_report / "report.md").read_text()
    assert "Nothing was compared with the paper" in text
    assert "cell(s) differ" not in text and "⚠" not in text.split("## Results")[1].split("## Claims")[0]


def test_report_checks_each_claim_with_numbers(claims_report: Path) -> None:
    text = (claims_report / "report.md").read_text()
    section = text.split("## Claims")[1].split("\n## ")[0]
    statuses = [line.split("**")[1] for line in section.splitlines() if line.startswith("- **")]
    assert sorted(statuses[:2]) == [C.FAILS, C.HOLDS] and statuses[2] == C.HOLDS
    assert "bandit: " in section and "TPO " in section and "DG " in section and "± " in section
    assert "## Notes" in text and "a note of the preset" in text


def test_cells_of_methods_a_setting_does_not_run_read_na(claims_report: Path) -> None:
    text = (claims_report / "report.md").read_text()
    table = text.split("### Final error (%)")[1].split("\n\n")[1]
    dg_row = next(line for line in table.splitlines() if line.startswith("| DG |"))
    assert dg_row.rstrip().endswith("| n/a |")


def test_report_defines_its_terms_and_keeps_headings_short(claims_report: Path) -> None:
    text = (claims_report / "report.md").read_text()
    assert "## Terms" in text and "**step**" in text and "**error**" in text and "**misalignment**" in text
    headings = [line for line in text.splitlines() if line.startswith("#")]
    assert all(len(h) <= 70 for h in headings), headings


def test_subset_report_omits_claims_about_methods_it_did_not_run(tmp_path: Path) -> None:
    preset = load_preset(str(write_preset(tmp_path, CLAIMS_PRESET))).subset(None, ["tpo"])  # any case
    out = tmp_path / "out"
    bench(preset, out, seeds=1, progress=False)
    build_report(out)
    section = (out / "report.md").read_text().split("## Claims")[1].split("\n## ")[0]
    assert "DG" not in section and "PG" not in section
    assert "3 more claim(s) of the full preset concern methods or settings this run did not" in section


def _synthetic(tmp_path: Path, **changes: Any) -> Any:
    """CLAIMS_PRESET (with ``changes``) loaded, its runs not run: the sections are fed hand-made cells."""
    return load_preset(str(write_preset(tmp_path, {**CLAIMS_PRESET, **changes})))


def _cell(method: str, setting: str, finals: list[float]) -> Any:
    """A cell whose seeds log ``error`` 1.0 at step 0 and ``finals[i]`` at step 1."""
    return R.Cell(method, setting, seeds=list(range(len(finals))),
                  rows=[[{"step": 0, "error": 1.0}, {"step": 1, "error": f}] for f in finals])


def test_summary_csv_names_units_and_pandas_reads_its_numbers_as_floats(tmp_path: Path) -> None:
    import io

    import pandas as pd

    preset = _synthetic(tmp_path, paper={"steps_to_1pct": {"TPO": {"bandit": "-"}, "DG": {"bandit": 12}},
                                         "final_error": {"TPO": {"bandit": 0.5}, "DG": {"bandit": ">99"}}})
    cells = {(m, s): _cell(m, s, [0.1, 0.2]) for m, s in
             [("TPO", "bandit"), ("DG", "bandit"), ("PG", "bandit"), ("TPO", "multi")]}
    cells[("PG", "bandit")] = R.Cell("PG", "bandit")  # not run yet: no data
    values = {("steps_to_1pct", "TPO", "bandit"): C.Stat(None), ("steps_to_1pct", "DG", "bandit"): C.Stat(12.0, 1.5),
              ("steps_to_1pct", "PG", "bandit"): C.Stat(math.nan), ("steps_to_1pct", "TPO", "multi"): C.Stat(7.0),
              ("final_error", "TPO", "bandit"): C.Stat(0.5, 0.1), ("final_error", "DG", "bandit"): C.Stat(99.5, 0.2),
              ("final_error", "PG", "bandit"): C.Stat(math.nan), ("final_error", "TPO", "multi"): C.Stat(3.0, 0.5)}
    frame = pd.read_csv(io.StringIO(R._summary_csv(preset, cells, values)))
    assert "final_error_pct" in frame and "final_error" not in frame  # the unit in the name
    assert {"steps_to_1pct", "steps_to_1pct_reached", "final_error_pct_paper_text"} <= set(frame.columns)
    for column in ("steps_to_1pct", "steps_to_1pct_se", "steps_to_1pct_paper", "final_error_pct",
                   "final_error_pct_se", "final_error_pct_paper", "n_ok"):
        assert pd.api.types.is_numeric_dtype(frame[column]), (column, frame[column].dtype)
    rows = frame.set_index(["method", "setting"])
    tpo, dg, pg = rows.loc[("TPO", "bandit")], rows.loc[("DG", "bandit")], rows.loc[("PG", "bandit")]
    assert math.isnan(tpo["steps_to_1pct"]) and tpo["steps_to_1pct_reached"] in (False, "False")  # never reached
    assert dg["steps_to_1pct"] == 12.0 and dg["steps_to_1pct_reached"] in (True, "True")
    assert math.isnan(pg["steps_to_1pct"]) and pd.isna(pg["steps_to_1pct_reached"])  # no data: neither
    assert tpo["steps_to_1pct_paper_text"] == "-" and math.isnan(tpo["steps_to_1pct_paper"])
    assert dg["steps_to_1pct_paper"] == 12.0 and pd.isna(dg["steps_to_1pct_paper_text"])
    assert dg["final_error_pct_paper_text"] == ">99" and tpo["final_error_pct_paper"] == 0.5
    assert math.isnan(rows.loc[("TPO", "multi")]["steps_to_1pct_se"])
    assert str(rows.loc[("TPO", "bandit")]["final_error_pct_within_2se"]) == "True"


def test_summary_column_and_units_are_validated(tmp_path: Path) -> None:
    from tpo_gym.evaluation import metrics as M
    from tpo_gym.evaluation.presets import PresetError

    assert M.summary_column({"id": "final_error", "unit": "%"}) == "final_error_pct"
    assert M.summary_column({"id": "error_pct", "unit": "%"}) == "error_pct"
    assert M.summary_column({"id": "wall", "unit": "s"}) == "wall_s"
    assert M.summary_column({"id": "steps_to_1pct"}) == "steps_to_1pct"
    metrics = CLAIMS_PRESET["metrics"]
    for bad, match in (([{**metrics[0], "unit": "?"}, metrics[1]], "unit must be a string"),
                       ([metrics[0], {"id": "final_error_pct", "type": "final", "key": "error"}], "share a name")):
        with pytest.raises(PresetError, match=match):
            _synthetic(tmp_path, metrics=bad, paper_claims=[])


def test_iqm_over_settings_of_different_scales_is_min_max_normalised_per_setting(tmp_path: Path) -> None:
    from tpo_gym.evaluation import metrics as M

    settings = [CLAIMS_PRESET["settings"][0], {**CLAIMS_PRESET["settings"][1], "methods": ["TPO", "DG"]}]
    preset = _synthetic(tmp_path, settings=settings, metrics=CLAIMS_PRESET["metrics"][:1], paper_claims=[])
    finals = {"bandit": {"TPO": [1e-6, 2e-6], "DG": [3e-6, 4e-6], "PG": [5e-6, 6e-6]},  # errors of 0.0001%
              "multi": {"TPO": [0.37, 0.38], "DG": [0.30, 0.31]}}  # errors of 37%
    cells = {(m, s): _cell(m, s, v) for s, by in finals.items() for m, v in by.items()}
    text = "\n".join(R._aggregate(preset, cells))
    assert "min-max normalised per setting" in text and "rliable normalises scores per task" in text
    assert "| Method | over 2 settings, min-max normalised | over bandit |" in text
    row = next(line for line in text.splitlines() if line.startswith("| TPO |")).split("|")
    # per setting: (value - lowest) / (highest - lowest) over every seed of the methods the column compares
    bandit = (np.array(finals["bandit"]["TPO"]) - 1e-6) / 3e-6
    multi = (np.array(finals["multi"]["TPO"]) - 0.30) / 0.08
    want = M.iqm(np.concatenate([bandit, multi]))
    assert row[2].strip().startswith(f"{want:.3g} ["), (row, want)
    assert row[3].strip().startswith(f"{M.iqm(100 * np.array(finals['bandit']['TPO'])):.3g} [")  # one setting: %
    same = R._min_max_normalised({"A": {"s": np.array([2.0, np.nan])}}, ["s"], ["A"])["A"]["s"]
    assert same[0] == 0.0 and np.isnan(same[1])  # all equal: 0; a seed without data stays NaN


def test_a_claim_decided_by_a_tie_reads_tie_in_the_report(tmp_path: Path) -> None:
    preset = _synthetic(tmp_path, paper_claims=[
        {"text": "TPO beats DG.", "checks": [{"test": "best", "metric": "final_error", "method": "TPO",
                                              "among": ["DG"], "settings": ["bandit"]}]}])
    cells = {(m, "bandit"): _cell(m, "bandit", [0.0]) for m in ("TPO", "DG", "PG")}
    cells[("TPO", "multi")] = _cell("TPO", "multi", [0.0])
    values = {("final_error", m, "bandit"): C.Stat(0.0, 0.0) for m in ("TPO", "DG", "PG")}
    section = "\n".join(R._claims(preset, ["TPO", "DG", "PG"], cells, values))
    assert "- **tie** — TPO beats DG." in section and "**holds**" not in section
    assert "(tied with DG)" in section and "**tie**: nothing contradicts the claim" in section


def test_iqm_compares_methods_over_common_settings(claims_report: Path) -> None:
    groups = R._setting_groups(["TPO", "DG", "PG"], {"TPO": ["bandit", "multi"], "DG": ["bandit"],
                                                     "PG": ["bandit"]})
    assert groups == [(["bandit"], ["TPO", "DG", "PG"])], "a column that compares one method is dropped"
    text = (claims_report / "report.md").read_text()
    iqm = text.split("## Aggregate (IQM)")[1].split("\n## ")[0]
    assert "over bandit" in iqm and "over 2 settings" not in iqm
    groups = R._setting_groups(["A", "B", "C"], {"A": ["s", "t"], "B": ["s", "t"], "C": ["t"]})
    assert groups == [(["s", "t"], ["A", "B"]), (["t"], ["A", "B", "C"])]


# ---------------------------------------------------------------------------------------------
# figures of diagnostics (agents): weights in one panel, no duplicate plot, loss per method
# ---------------------------------------------------------------------------------------------
def test_fraction_plot_is_dropped_when_it_only_repeats_another() -> None:
    cell = R.Cell("TPO", "s", rows=[[{"step": 0, "all_fail_fraction": 0.25, "any_success_fraction": 0.75}]])
    assert R._complementary({("TPO", "s"): cell}, "any_success_fraction", "all_fail_fraction")
    cell.rows[0].append({"step": 1, "all_fail_fraction": 0.25, "any_success_fraction": 0.5})
    assert not R._complementary({("TPO", "s"): cell}, "any_success_fraction", "all_fail_fraction")


def test_gaps_from_zero_variance_are_reported() -> None:
    rows = [{"step": 0, "zero_variance_fraction": 0.5, "mean_q_winners": 0.3},
            {"step": 1, "zero_variance_fraction": 1.0, "mean_q_winners": math.nan}]
    cell = R.Cell("TPO", "s", rows=[rows])
    assert R._gaps({("TPO", "s"): cell}, ("mean_q_winners",)) == ["TPO in s: 1 of 2 steps, first at step 1"]


def test_a_key_logged_every_n_steps_has_no_gaps_between_its_evaluations() -> None:
    rows = [{"step": i, "zero_variance_fraction": 1.0 if i % 2 else 0.5, **({"test_score": 0.1} if i % 3 == 0 else {})}
            for i in range(7)]
    cell = R.Cell("GRPO", "s", rows=[rows])
    assert R._gaps({("GRPO", "s"): cell}, ("test_score",)) == []


# ---------------------------------------------------------------------------------------------
# files: modes, stale figures, rebuilding from results.jsonl
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("umask", "file_mode", "dir_mode"), [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700)])
def test_written_files_respect_the_umask(tmp_path: Path, umask: int, file_mode: int, dir_mode: int) -> None:
    old = os.umask(umask)
    try:
        path = atomic_write_text(tmp_path / "new" / "deeper" / "report.md", "hello\n")
        made = make_dirs(tmp_path / "other")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == file_mode
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == dir_mode
    assert stat.S_IMODE((tmp_path / "new" / "deeper").stat().st_mode) == dir_mode
    assert stat.S_IMODE(made.stat().st_mode) == dir_mode


def test_report_files_are_readable_by_others(claims_report: Path) -> None:
    if current_umask() & 0o044:
        pytest.skip("this process's umask removes read access for others")
    for name in ("report.md", "summary.csv", "results.jsonl", "curves_error.png", "manifest.json"):
        assert (claims_report / name).stat().st_mode & 0o044 == 0o044, name
    assert any((claims_report / "runs").iterdir())
    for path in (claims_report / "runs").iterdir():
        assert path.stat().st_mode & 0o044 == 0o044


def test_rebuild_from_results_jsonl_without_run_records(claims_report: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(claims_report, copy)
    before = (copy / "summary.csv").read_text()
    shutil.rmtree(copy / "runs")
    (copy / "curves_old_layout.png").write_bytes(b"stale")
    build_report(copy)
    assert (copy / "summary.csv").read_text() == before
    text = (copy / "report.md").read_text()
    assert "rebuilt from `results.jsonl`" in text and "not stored" in text
    assert not (copy / "curves_old_layout.png").exists(), "figures of an earlier layout are removed"
    # rows whose configuration hash no longer matches are not used
    rows = [json.loads(line) for line in (copy / "results.jsonl").read_text().splitlines()]
    for row in rows:
        row["config_hash"] = "0" * 16
    (copy / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(NoStoredRuns, match="left as it is"):
        build_report(copy)
    assert "TPO" in (copy / "report.md").read_text(), "the existing report is kept"


def test_report_text_comes_from_the_packaged_preset_when_the_runs_match(tmp_path: Path) -> None:
    """Old runs get the current description, claims and notes; the runs themselves are the manifest's."""
    out = tmp_path / "out"
    bench(load_preset("tabular-single").subset(None, ["TPO", "DG"]), out, seeds=1, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["preset"]["paper_ref"] = "an old reference to a file outside the repository"
    manifest["preset"]["paper_claims"] = ["an old claim as a plain string"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    build_report(out)
    text = (out / "report.md").read_text()
    assert "an old" not in text and "docs/method.md section 3" in text
    assert "Fig. 3b: TPO maintains the lowest misalignment" in text
    assert "2 more claim(s) of the full preset" in text  # Fig. 3a (once per setup) compares with GRPO and PG


def test_per_seed_steps_to_threshold_table_and_figure(claims_report: Path) -> None:
    text = (claims_report / "report.md").read_text()
    section = text.split("### Per seed: steps to error < 1%")[1].split("\n## ")[0]
    rows = {line.split("|")[1].strip(): line for line in section.splitlines() if line.startswith("| ")}
    assert {"TPO", "DG", "PG"} <= set(rows)
    assert "n/a" in rows["DG"]  # the multi-context setting runs TPO only
    assert "[" in rows["TPO"] and "–" in rows["TPO"]
    assert (claims_report / "seeds_steps_to_1pct.png").is_file()
    assert "![per-seed steps to error < 0.01](seeds_steps_to_1pct.png)" in text


def test_claims_follow_a_higher_is_better_metric() -> None:
    score = {"id": "score", "type": "final", "key": "mean_score", "better": "higher"}
    values = {("score", "TPO", "gcd"): C.Stat(0.41, 0.1), ("score", "GRPO", "gcd"): C.Stat(0.5, 0.2)}
    ran = {"gcd": ["TPO", "GRPO"]}

    def verdict(check: dict) -> C.Verdict:
        return C.evaluate_claim({"text": "t", "checks": [check]}, [score], ran,
                                lambda metric, m, s: values.get((metric["id"], m, s)), R._fmt_stat)

    best_tpo = verdict({"test": "best", "metric": "score", "method": "TPO"})
    assert best_tpo.status == C.FAILS and "highest (TPO)" in best_tpo.evidence[0]
    assert "GRPO 0.5" in best_tpo.evidence[0].split("TPO 0.41")[0]  # the best is listed first
    assert verdict({"test": "best", "metric": "score", "method": "GRPO"}).status == C.HOLDS
    assert verdict({"test": "worst", "metric": "score", "method": "TPO"}).status == C.HOLDS
    assert verdict({"test": "order", "metric": "score", "methods": ["GRPO", "TPO"]}).status == C.HOLDS
    assert verdict({"test": "above", "metric": "score", "method": "TPO", "value": 0.4}).status == C.HOLDS


def test_final_metric_window_and_direction_are_validated(tmp_path: Path) -> None:
    import numpy as np

    from tpo_gym.evaluation import metrics as M
    from tpo_gym.evaluation.presets import PresetError

    curves = np.array([[0.0, 1.0, 2.0, np.nan, 4.0], [1.0, 1.0, 1.0, 1.0, 3.0]])
    assert M.final_value(curves).tolist() == [4.0, 3.0]
    assert M.final_value(curves, window=3).tolist() == [(1.0 + 2.0 + 4.0) / 3, (1.0 + 1.0 + 3.0) / 3]
    bad = [{"id": "m", "type": "final", "key": "error", "better": "up"},
           {"id": "m", "type": "steps_to_threshold", "key": "error", "threshold": 0.1, "window": 3},
           {"id": "m", "type": "final", "key": "error", "window": 0}]
    for metric in bad:
        data = {**CLAIMS_PRESET, "metrics": [metric], "paper_claims": []}
        with pytest.raises(PresetError, match="better|window"):
            load_preset(str(write_preset(tmp_path, data)))


def test_claims_are_checked_under_each_setup_side_by_side(tmp_path: Path) -> None:
    out = tmp_path / "out"
    preset = load_preset("tabular-single").subset(None, ["TPO", "GRPO", "PG", "DG"])
    bench(preset, out, seeds=2, progress=False)
    build_report(out)
    text = (out / "report.md").read_text()
    assert "| Method | K=100 B=100 (reference) | K=100 B=100 (tuned) |" in text, "the setups' columns side by side"
    table = text.split("### Claims under each setup")[1].split("\n## ")[0]
    assert "| Claim | reference | tuned |" in table
    row = next(line for line in table.splitlines() if line.startswith("| Fig. 3a"))
    verdicts = [c.strip() for c in row.strip("|").split("|")[1:]]
    assert len(verdicts) == 2 and all(v in ("holds", "tie", "does not hold", "holds where tested")
                                      for v in verdicts), row
    for setup, verdict in zip(("reference", "tuned"), verdicts, strict=True):
        assert f"**{verdict}** — Fig. 3a: TPO and DG converge fastest; GRPO and PG plateau at higher error. " \
               f"[{setup} setup]" in text
    assert "Setup `reference`:" in text, "each setup's description is in the notes"
