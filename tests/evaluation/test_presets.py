"""Every packaged preset loads and validates; validation rejects malformed presets."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import pytest

import tpo_gym
from tpo_gym.agents.common.registry import SB3_SPEC, is_sb3_algorithm, resolve_algorithm
from tpo_gym.agents.policies.reference_setup import ReferenceMuon
from tpo_gym.evaluation import metrics as M
from tpo_gym.evaluation.experiments import AGENT_ALGOS, RUN_KINDS, make_agent, methods_for_kind
from tpo_gym.evaluation.presets import PresetError, available_presets, load_preset, validate_preset

#: Presets that each mirror one result of docs/method.md section 6.
REQUIRED = ("quick", "tabular-single", "tabular-multi", "mnist", "table1", "table2", "table3", "ablations",
            "eta", "sparse-diagnostics")


def test_every_required_preset_exists() -> None:
    missing = [p for p in REQUIRED if p not in available_presets()]
    assert not missing, f"missing presets: {missing}"


@pytest.mark.parametrize("name", sorted(available_presets()))
def test_preset_loads_and_is_well_formed(name: str) -> None:
    preset = load_preset(name)
    assert preset.name == name, "the file name and the preset's name must agree"
    runs = preset.runs()
    assert len(runs) >= preset.seeds
    assert len({r.run_id for r in runs}) == len(runs), "run ids must be unique"
    for setting in preset.settings:
        assert setting["kind"] in RUN_KINDS
        for method in preset.setting_methods(setting):
            sb3 = is_sb3_algorithm(resolve_algorithm(method["algo"]))  # stable_baselines3:PPO (the continuous preset)
            kinds = SB3_SPEC.run_kinds if sb3 else ()
            assert method["algo"] in methods_for_kind(setting["kind"]) or setting["kind"] in kinds
    for metric_id, rows in preset.data.get("paper", {}).items():
        for cols in rows.values():
            for value in cols.values():
                # every paper number can be compared with a value of ours
                assert M.paper_agrees(1.0, 0.1, value, next(m.get("paper_dash", "never") for m in preset.metrics
                                                             if m["id"] == metric_id)) in (True, False, None)


def test_agent_algos_are_exported_by_the_package() -> None:
    missing = [a for a in AGENT_ALGOS if not hasattr(tpo_gym, a)]
    assert not missing, f"tpo_gym does not export {missing}"


def _valid() -> dict:
    return json.loads(available_presets()["tabular-single"].read_text())


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("description"), "missing field 'description'"),
        (lambda d: d.update(seeds=0), "seeds must be >= 1"),
        (lambda d: d["methods"].append({"name": "X", "algo": "SAC"}), "method 'X': unknown agent 'SAC'"),
        (lambda d: d["methods"].append({"name": "X", "algo": "PPO"}), "cannot run in setting"),
        (lambda d: d["methods"].append({"name": "TPO", "algo": "TPO"}), "duplicate method names"),
        (lambda d: d["settings"][0].update(kind="atari"), "unknown kind 'atari'"),
        (lambda d: d.update(paper={"final_error": {"TPO": {"K=100 B=100": "about 7"}}}), "paper value"),
        (lambda d: d.update(paper={"final_error": {"TPO": {"K=100 B=100": -3}}}), "paper value"),
        (lambda d: d.update(paper={"final_error": {"Nope": {"K=100 B=100": 3}}}), "unknown method 'Nope'"),
        (lambda d: d.update(paper={"final_error": {"TPO": {"V=3": 3}}}), "unknown setting 'V=3'"),
        (lambda d: d.update(paper={"nope": {}}), "unknown metric 'nope'"),
        (lambda d: d["metrics"].append({"id": "s", "type": "steps_to_threshold"}), "numeric threshold"),
        (lambda d: d["metrics"].append({"id": "x", "type": "median"}), "type in"),
    ],
)
def test_validation_rejects(mutate, message: str) -> None:
    data = _valid()
    mutate(data)
    with pytest.raises(PresetError, match=message):
        validate_preset(data, source="test")


def test_unknown_preset_name_lists_close_matches_and_valid_names() -> None:
    with pytest.raises(PresetError) as info:
        load_preset("tabel1")
    text = str(info.value)
    assert "Did you mean: table1" in text
    for name in available_presets():
        assert name in text


def test_preset_from_a_file(tmp_path: Path, tiny_preset_data: dict) -> None:
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(tiny_preset_data))
    preset = load_preset(str(path))
    assert preset.name == "tiny"
    # 2 full settings x 2 methods x 2 seeds + the crash setting's 1 method x 2 seeds
    assert len(preset.runs()) == 10 and len(preset.runs(3)) == 15
    with pytest.raises(PresetError, match="does not exist"):
        load_preset(str(tmp_path / "absent.json"))


def test_subset_of_settings_and_methods() -> None:
    preset = load_preset("table3").subset(["P H=7"], ["TPO", "GRPO", "PPO"])
    assert [s["name"] for s in preset.settings] == ["P H=7 (reference)", "P H=7 (tuned)"]
    assert [m["name"] for m in preset.methods] == ["TPO", "GRPO", "PPO"]
    assert preset.data["paper"]["final_error"] == {
        m: {"P H=7 (reference)": v, "P H=7 (tuned)": v} for m, v in (("TPO", 6.9), ("GRPO", 14.5), ("PPO", 12.0))}
    assert len(preset.runs(3)) == 18
    # the runs of a subset are the same runs as in the full preset (so their records are shared)
    full = {r.run_id: r.config_hash for r in load_preset("table3").runs(3)}
    assert all(full[r.run_id] == r.config_hash for r in preset.runs(3))
    with pytest.raises(PresetError, match="Did you mean: P H=7"):
        load_preset("table3").subset(["P H=77"])
    one = load_preset("table3").subset(["p h=7 (tuned)"])
    assert [s["name"] for s in one.settings] == ["P H=7 (tuned)"] and one.setups == ["tuned"]
    diag = load_preset("sparse-diagnostics").subset(["zv K=32", "K=4"], ["GRPO (zv-masked)", "TPO"])
    titles = [t["title"] for t in diag.tables()]
    assert titles == ["Group-size sweep (epochs=4)", "Zero-variance masking (K=32, epochs=4)"]


# ---------------------------------------------------------------------------------------------
# setups: the reference code's configuration and ours, side by side
# ---------------------------------------------------------------------------------------------
PAPER_PRESETS = ("table1", "table2", "table3", "ablations", "eta", "sparse-diagnostics", "mnist", "tabular-single",
                 "tabular-multi")


@pytest.mark.parametrize("name", PAPER_PRESETS)
def test_paper_presets_run_the_reference_setup_first_and_ours_beside_it(name: str) -> None:
    preset = load_preset(name)
    assert preset.setups == ["reference", "tuned"], "reference is the default (first) setup"
    names = [s["name"] for s in preset.settings]
    bases = list(dict.fromkeys(s["base"] for s in preset.settings))
    assert names == [f"{b} ({u})" for b in bases for u in ("reference", "tuned")], "a setting's columns side by side"
    for s in preset.settings:
        if s["kind"] in ("token", "mnist"):
            setup = s["params"].get("agent_kwargs", {}).get("policy_kwargs", {}).get("setup", "tuned")
        else:
            setup = s["params"].get("setup", "tuned")
        assert setup == s["setup"], f"{s['name']} must build its model / run under its own setup"
    validate_preset(preset.data, source="expanded")  # what the manifest stores validates again


def test_setups_carry_paper_numbers_to_every_column_and_check_each_claim_per_setup() -> None:
    preset = load_preset("table1")
    assert preset.data["paper"]["steps_to_1pct"]["GRPO_token"]["V=2 (reference)"] == 904
    assert preset.data["paper"]["steps_to_1pct"]["GRPO_token"]["V=2 (tuned)"] == 904
    claims = preset.data["paper_claims"]
    assert claims[0]["text"].endswith(" [reference setup]") and claims[1]["text"].endswith(" [tuned setup]")
    ref, tuned = (c["checks"][0]["settings"] for c in claims)
    assert all(x.endswith("(reference)") for x in ref) and all(x.endswith("(tuned)") for x in tuned)
    assert len(ref) == len(tuned) == 4
    assert any(n.startswith("Setup `reference`:") for n in preset.data["notes"])


def test_setup_runs_differ_only_by_what_the_setup_sets() -> None:
    runs = {(r.setting, r.method): r for r in load_preset("mnist").runs(1)}
    ref, tuned = runs[("MNIST (reference)", "GRPO")], runs[("MNIST (tuned)", "GRPO")]
    assert (ref.algo, ref.method_kwargs) == ("REINFORCE", {"baseline": "standardized"})
    assert (tuned.algo, tuned.method_kwargs) == ("GRPO", {})
    assert ref.params["agent_kwargs"] == {"batch_size": 100, "learning_rate": 0.001, "n_epochs": 1,
                                          "policy_kwargs": {"setup": "reference"}}
    assert tuned.params["agent_kwargs"] == {"batch_size": 100, "learning_rate": 0.001}
    # a method's own kwargs survive a setup's override of others
    assert runs[("MNIST (reference)", "TPO")].method_kwargs == {"candidates": "single"}
    assert runs[("MNIST (reference)", "Group PG")].method_kwargs == {"candidates": "single"}
    assert runs[("MNIST (tuned)", "Group PG")].method_kwargs == {}
    assert ref.run_id == "MNIST__reference___GRPO__seed0" and ref.config_hash != tuned.config_hash


def test_subset_by_setup() -> None:
    ref = load_preset("table1").subset(["V=2"], ["TPO_token"], ["REFERENCE"])
    assert [s["name"] for s in ref.settings] == ["V=2 (reference)"] and ref.setups == ["reference"]
    assert [c["text"] for c in ref.data["paper_claims"]][0].endswith("[reference setup]")
    assert ref.data["omitted_claims"] == 1, "the tuned setup's claim is left out, and counted"
    with pytest.raises(PresetError, match="no setup 'refrence'. Did you mean: reference"):
        load_preset("table1").subset(setups=["refrence"])
    with pytest.raises(PresetError, match="has no setups"):
        load_preset("llm-smoke").subset(setups=["reference"])


def _with_setups(**setup) -> dict:
    data = _valid()
    data["setups"] = [dict({"name": "reference"}, **setup), {"name": "tuned"}]
    return data


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (_with_setups(methods={"Nope": {}}), "unknown method 'Nope'"),
        (_with_setups(methods={"TPO": {"algo": "SAC"}}), "method 'TPO': unknown agent 'SAC'"),
        (_with_setups(methods={"TPO": {"algo": "PPO"}}), "algo 'PPO'.*cannot run"),
        (_with_setups(methods={"TPO": {"lr": 1}}), r"methods\['TPO'\] must be"),
        (_with_setups(params=[1]), "params an object"),
        (_with_setups(colour="red"), "unknown fields \\['colour'\\]"),
        (_with_setups(name="a/b"), "needs a 'name'"),
        (dict(_valid(), setups=[{"name": "x"}, {"name": "x"}]), "duplicate setup names"),
    ],
)
def test_validation_rejects_bad_setups(data: dict, message: str) -> None:
    with pytest.raises(PresetError, match=message):
        validate_preset(data, source="test")


@pytest.mark.parametrize("name", sorted(available_presets()))
def test_every_method_of_every_preset_can_be_selected_alone(name: str) -> None:
    """``--methods X`` works for each method (a setup's overrides of the others and tables of settings
    that no longer run are pruned with them) and selects the very runs of the full preset, hashes included."""
    full = load_preset(name)
    hashes = {r.run_id: r.config_hash for r in full.runs(1)}
    for method in full.methods:
        sub = full.subset(None, [method["name"]])
        runs = sub.runs(1)
        assert runs and {r.method for r in runs} == {method["name"]}
        assert {r.run_id: r.config_hash for r in runs}.items() <= hashes.items()
        assert len(runs) == sum(r.method == method["name"] for r in full.runs(1))


def test_quick_runs_every_setting_under_both_setups() -> None:
    preset = load_preset("quick")
    assert preset.setups == ["reference", "tuned"]
    bases = ["single-context bandit", "multi-context bandit", "rev. copy V=2 H=5"]
    assert [s["name"] for s in preset.settings] == [f"{b} ({u})" for b in bases for u in ("reference", "tuned")]
    claims = [c for c in preset.data["paper_claims"] if isinstance(c, dict)]
    assert [c["setup"] for c in claims] == ["reference", "tuned"] * 3, "every claim is checked under each setup"
    why = [n for n in preset.data["notes"] if n.startswith("Why")]
    assert len(why) == 2 and all("tuned setup" in n for n in why), "the claims that fail under tuned say why"


def test_a_setups_setup_param_reaches_the_tabular_runs_and_the_token_policy() -> None:
    runs = {(r.setting, r.method): r for r in load_preset("quick").runs(1)}
    assert runs[("single-context bandit (reference)", "TPO")].params["setup"] == "reference"
    assert "setup" not in runs[("multi-context bandit (tuned)", "TPO")].params
    for setup, optimizer in (("reference", ReferenceMuon), ("tuned", None)):
        spec = runs[(f"rev. copy V=2 H=5 ({setup})", "GRPO")]
        env = gym.make(spec.params["env_id"], **spec.params["env_kwargs"])
        agent = make_agent(spec.algo, env, 0, spec.params, spec.method_kwargs)
        assert agent.policy.setup == setup
        assert isinstance(agent.policy.optimizer, ReferenceMuon) == (optimizer is ReferenceMuon)


def test_policy_kwargs_of_a_setting_win_over_its_setup_param() -> None:
    params = {"setup": "reference", "agent_kwargs": {"batch_size": 4, "group_size": 2,
                                                     "policy_kwargs": {"setup": "tuned", "d_model": 8, "d_ff": 16}}}
    agent = make_agent("TPO", gym.make("tpo_gym/TokenReversal-v0"), 0, params, {})
    assert agent.policy.setup == "tuned"
