"""The main job's preset (quick, what `make bench` runs) shows the reference and the tuned setup side by side."""

from __future__ import annotations

import gymnasium as gym

from tpo_gym.agents.reference_setup import ReferenceMuon
from tpo_gym.evaluation.experiments import make_agent
from tpo_gym.evaluation.presets import load_preset


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
