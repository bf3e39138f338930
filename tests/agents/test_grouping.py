"""tpo_gym.agents.common.grouping: what a group is (one Grouping from the method and its arguments), the G x K view."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tpo_gym.agents.common.grouping import GROUPING_KINDS, Grouping, group_scores, resolve_grouping, view


@pytest.mark.parametrize("sampling,level,native,text,single,want", [
    ("group", "token", True, False, False, Grouping("candidates", n_candidates=4)),
    ("group", "auto", True, False, False, Grouping("candidates", n_candidates=4)),
    ("group", "auto", False, False, False, Grouping("rollouts", rollout_group=4)),
    ("group", "sequence", True, False, False, Grouping("rollouts", rollout_group=4)),
    ("group", "auto", True, True, False, Grouping("rollouts", rollout_group=4)),
    ("group", "auto", True, False, True, Grouping("actions")),
    ("single", "auto", True, False, False, Grouping("none")),
    ("oracle", "auto", True, False, False, Grouping("actions", score_all_actions=True)),
])
def test_each_method_and_argument_gives_one_grouping(sampling: str, level: str, native: bool, text: bool,
                                                     single: bool, want: Grouping) -> None:
    got = resolve_grouping(sampling, level, 4, native=native, text=text, single_candidate=single)
    assert got == want
    assert got.kind in GROUPING_KINDS
    assert got.compares_k == (got.kind in ("candidates", "rollouts"))
    assert got.needs_group_api == (got.kind == "candidates" or got.score_all_actions)


def test_a_language_model_has_no_token_level_and_a_kind_must_be_known() -> None:
    with pytest.raises(ValueError, match="level='token' is for Discrete token tasks"):
        resolve_grouping("group", "token", 4, native=True, text=True)
    with pytest.raises(ValueError, match="Grouping.kind must be one of candidates, rollouts, actions, none"):
        Grouping("prompts")


def test_the_rollouts_view_sums_valid_steps_per_rollout_into_groups_of_k() -> None:
    logp = torch.log_softmax(torch.randn(4, 3, 5, generator=torch.Generator().manual_seed(0)), dim=-1)
    actions = torch.tensor([[0, 1, 2], [3, 4, 0], [1, 1, 1], [2, 2, 2]])
    step_mask = torch.tensor([[True, True, False], [True, True, True], [True, False, False], [True, True, True]])
    batch = SimpleNamespace(actions=actions, step_mask=step_mask, group_size=2, candidates=None)
    got = view(Grouping("rollouts", rollout_group=2), logp, batch)
    taken = logp.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    want = (taken * step_mask).sum(dim=1).reshape(2, 2)
    torch.testing.assert_close(got, want)
    none = view(Grouping("none"), logp, batch)
    torch.testing.assert_close(none, torch.where(step_mask, taken, torch.zeros_like(taken)))


def test_rollout_scores_of_a_text_batch_are_its_group_scores() -> None:
    from tpo_gym.agents.lm.text_rollouts import TextBatch

    scores = torch.tensor([[0.0, 1.0, 0.5], [0.2, 0.2, 0.9]])
    ids = torch.zeros(6, 1, dtype=torch.long)
    batch = TextBatch(prompts=["a", "b"], completions=["x"] * 6, prompt_ids=torch.zeros(2, 1, dtype=torch.long),
                      prompt_mask=torch.ones(2, 1, dtype=torch.long), completion_ids=ids,
                      token_mask=torch.ones(6, 1, dtype=torch.bool), scores=scores, logp_old=torch.zeros(2, 3),
                      logp_ref=None, group_size=3, stats={})
    got, mask = group_scores(Grouping("rollouts", rollout_group=3), batch)
    assert mask is None and torch.equal(got, scores)
