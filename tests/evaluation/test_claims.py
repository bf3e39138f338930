"""tpo_gym.evaluation.claims: each kind of claim check against hand-made numbers, its validation, and the
packaged claims."""

from __future__ import annotations

import json

import pytest

from tests.evaluation.conftest import COLOUR_PRESET
from tpo_gym.evaluation import claims as C
from tpo_gym.evaluation import report as R
from tpo_gym.evaluation.presets import PresetError, load_preset, validate_preset

METRICS = [{"id": "steps", "type": "steps_to_threshold", "key": "error", "threshold": 0.01},
           {"id": "final", "type": "final", "key": "error", "scale": 100, "unit": "%"}]
RAN = {"H=5": ["TPO", "GRPO", "PPO", "DG"], "bandit": ["TPO", "GRPO", "DG"]}
VALUES = {("steps", "TPO", "H=5"): C.Stat(49, 2), ("steps", "GRPO", "H=5"): C.Stat(47, 2),
          ("steps", "PPO", "H=5"): C.Stat(47, 2), ("steps", "DG", "H=5"): C.Stat(None),
          ("steps", "TPO", "bandit"): C.Stat(100, 1), ("steps", "GRPO", "bandit"): C.Stat(104, 1),
          ("steps", "DG", "bandit"): C.Stat(99, 2),
          ("final", "TPO", "H=5"): C.Stat(0.07, 0.07), ("final", "GRPO", "H=5"): C.Stat(0.0, 0.0),
          ("final", "PPO", "H=5"): C.Stat(0.0, 0.0), ("final", "DG", "H=5"): C.Stat(28.4, 1.0),
          ("final", "TPO", "bandit"): C.Stat(0.008, 0.0005), ("final", "GRPO", "bandit"): C.Stat(0.25, 0.01),
          ("final", "DG", "bandit"): C.Stat(0.18, 0.03)}


def _verdict(checks: list[dict], paper=lambda *_: None) -> C.Verdict:
    return C.evaluate_claim({"text": "t", "checks": checks}, METRICS, RAN,
                            lambda metric, m, s: VALUES.get((metric["id"], m, s)) if m in RAN.get(s, []) else None,
                            R._fmt_stat, paper)


def test_claim_best_fails_with_the_numbers_that_refute_it() -> None:
    verdict = _verdict([{"test": "best", "metric": "steps", "method": "TPO", "settings": ["H=5"]}])
    assert verdict.status == C.FAILS
    assert "GRPO 47 ± 2, PPO 47 ± 2, TPO 49 ± 2, DG never" in verdict.evidence[0]


def test_claim_best_of_several_methods_and_among() -> None:
    assert _verdict([{"test": "best", "metric": "steps", "methods": ["TPO", "DG"],
                      "settings": ["bandit"]}]).status == C.HOLDS
    # among restricts the comparison: TPO beats DG on steps in H=5 (never ranks last)
    assert _verdict([{"test": "best", "metric": "steps", "method": "TPO", "among": ["DG"],
                      "settings": ["H=5"]}]).status == C.HOLDS


def test_claim_best_names_the_methods_it_ties_with() -> None:
    verdict = _verdict([{"test": "best", "metric": "steps", "method": "GRPO", "settings": ["H=5"]}])
    assert verdict.status == C.TIE
    assert verdict.evidence[0].endswith("(tied with PPO)")
    assert "tied" not in _verdict([{"test": "best", "metric": "steps", "method": "TPO",
                                    "settings": ["bandit"], "among": ["GRPO"]}]).evidence[0]


def test_claim_worst_order_bounds_and_never() -> None:
    assert _verdict([{"test": "worst", "metric": "steps", "method": "DG", "settings": ["H=5"]}]).status == C.HOLDS
    assert _verdict([{"test": "order", "metric": "final", "methods": ["TPO", "DG", "GRPO"],
                      "settings": ["bandit"]}]).status == C.HOLDS
    assert _verdict([{"test": "order", "metric": "final", "methods": ["GRPO", "TPO"],
                      "settings": ["bandit"]}]).status == C.FAILS
    assert _verdict([{"test": "below", "metric": "final", "methods": ["TPO", "GRPO"], "value": 1}]).status == C.HOLDS
    assert _verdict([{"test": "above", "metric": "final", "method": "DG", "value": 1}]).status == C.FAILS
    assert _verdict([{"test": "never", "metric": "steps", "method": "DG", "settings": ["H=5"]}]).status == C.HOLDS
    assert _verdict([{"test": "never", "metric": "steps", "method": "DG"}]).status == C.FAILS  # reached in bandit
    assert _verdict([{"test": "never", "metric": "steps", "method": "TPO"}]).status == C.FAILS


def test_a_claim_decided_by_a_tie_says_tie_not_holds() -> None:
    # GRPO and PPO both 0.0 at H=5: GRPO is not better than PPO, only as good
    best = _verdict([{"test": "best", "metric": "final", "methods": ["GRPO"], "settings": ["H=5"]}])
    assert best.status == C.TIE == "tie" and best.evidence[0].endswith("(tied with PPO)")
    worst = _verdict([{"test": "worst", "metric": "final", "method": "PPO", "among": ["GRPO"], "settings": ["H=5"]}])
    assert worst.status == C.TIE
    order = _verdict([{"test": "order", "metric": "steps", "methods": ["GRPO", "PPO", "TPO"], "settings": ["H=5"]}])
    assert order.status == C.TIE and order.evidence[0].endswith("(tied: GRPO = PPO)")
    # ties among the named methods themselves decide nothing: GRPO and PPO together beat TPO and DG
    assert _verdict([{"test": "best", "metric": "final", "methods": ["GRPO", "PPO"],
                      "settings": ["H=5"]}]).status == C.HOLDS
    # claims: a failing check still fails; a tie with checks that hold is a tie; a tie with untested ones too
    tie = {"test": "best", "metric": "final", "method": "GRPO", "settings": ["H=5"]}
    assert _verdict([tie, {"test": "worst", "metric": "steps", "method": "DG", "settings": ["H=5"]}]).status == C.TIE
    assert _verdict([tie, {"test": "never", "metric": "steps", "method": "TPO"}]).status == C.FAILS
    assert _verdict([tie, {"test": "best", "metric": "steps", "method": "TPO", "settings": ["V=16"]}]).status == C.TIE


def _verdict_on(values: dict[tuple[str, str], float], check: dict) -> C.Verdict:
    """The verdict of one check on final values ``{(method, setting): value}``."""
    ran: dict[str, list[str]] = {}
    for method, setting in values:
        ran.setdefault(setting, []).append(method)
    return C.evaluate_claim({"text": "t", "checks": [check]}, METRICS, ran,
                            lambda metric, m, s: C.Stat(values[(m, s)]) if (m, s) in values else None, R._fmt_stat)


def test_one_tied_setting_makes_the_check_a_tie_and_worst_setting_ties() -> None:
    tied_in_a = {("TPO", "a"): 1.0, ("GRPO", "a"): 1.0, ("TPO", "b"): 1.0, ("GRPO", "b"): 2.0}
    verdict = _verdict_on(tied_in_a, {"test": "best", "metric": "final", "method": "TPO"})
    assert verdict.status == C.TIE and verdict.evidence[0].endswith("(tied with GRPO)")
    assert "tied" not in verdict.evidence[1]
    shared = {("TPO", "a"): 2.0, ("TPO", "b"): 2.0, ("TPO", "c"): 1.0}
    verdict = _verdict_on(shared, {"test": "worst_setting", "metric": "final", "method": "TPO", "setting": "a"})
    assert verdict.status == C.TIE and verdict.evidence[0].endswith("(tied with b)")
    assert _verdict_on({**shared, ("TPO", "a"): 3.0}, {"test": "worst_setting", "metric": "final", "method": "TPO",
                                                       "setting": "a"}).status == C.HOLDS


def test_claim_paper_and_worst_setting() -> None:
    def paper(mid, m, s):
        return {("final", "DG", "H=5"): 28.0, ("final", "TPO", "H=5"): 5.0}.get((mid, m, s))

    dg = _verdict([{"test": "paper", "metric": "final", "method": "DG", "settings": ["H=5"]}], paper)
    assert dg.status == C.HOLDS and "(paper 28.0)" in dg.evidence[0]
    assert _verdict([{"test": "paper", "metric": "final", "method": "TPO", "settings": ["H=5"]}], paper).status \
        == C.FAILS
    assert _verdict([{"test": "worst_setting", "metric": "steps", "method": "TPO", "setting": "bandit"}]).status \
        == C.HOLDS


def test_claim_not_tested_when_its_settings_did_not_run() -> None:
    verdict = _verdict([{"test": "best", "metric": "steps", "method": "TPO", "settings": ["V=16"]}])
    assert verdict.status == C.UNTESTED and "V=16" in verdict.evidence[0]
    partly = _verdict([{"test": "best", "metric": "final", "method": "TPO", "settings": ["bandit", "V=16"]}])
    assert partly.status == C.PARTLY
    assert C.evaluate_claim("a plain sentence", METRICS, RAN, lambda *_: None, R._fmt_stat).status == C.UNTESTED


def test_mentioned_methods_reads_whole_names_longest_first() -> None:
    names = ["TPO", "TPO-no-anchor", "PG", "Group PG", "GRPO", "GRPO (no KL)", "CE"]
    assert C.mentioned_methods("GRPO and PG plateau higher", names) == {"GRPO", "PG"}
    assert C.mentioned_methods("Group PG and TPO-no-anchor", names) == {"Group PG", "TPO-no-anchor"}
    assert C.mentioned_methods("TPO_token is fastest; CEs", names) == set()


def test_claim_checks_are_validated() -> None:
    data = json.loads(json.dumps(COLOUR_PRESET))
    data["paper_claims"] = [{"text": "x", "checks": [{"test": "best", "metric": "final_error", "method": "PPO"}]}]
    with pytest.raises(PresetError, match="unknown methods"):
        validate_preset(data)
    data["paper_claims"] = [{"text": "x", "checks": [{"test": "fastest", "metric": "final_error", "method": "TPO"}]}]
    with pytest.raises(PresetError, match="test must be one of"):
        validate_preset(data)
    data["paper_claims"] = [{"text": "x", "checks": [{"test": "below", "metric": "final_error", "method": "TPO"}]}]
    with pytest.raises(PresetError, match="numeric 'value'"):
        validate_preset(data)


def test_packaged_claims_name_only_methods_of_their_preset() -> None:
    from tpo_gym.evaluation.presets import available_presets

    everyone = sorted({m["name"] for n in available_presets() for m in load_preset(n).methods}
                      | {"PG", "CE", "TPO_token", "GRPO_token", "REINFORCE"})
    for name in available_presets():
        preset = load_preset(name)
        own = {m["name"] for m in preset.methods}
        for claim in preset.data.get("paper_claims", []):
            assert isinstance(claim, dict) and claim.get("checks"), f"{name}: every claim has a check"
            named = C.mentioned_methods(claim["text"], everyone)
            assert named <= own, f"{name}: claim {claim['text']!r} names {named - own}, which the preset does not run"
