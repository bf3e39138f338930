"""tpo_gym.agents.common.registry: every agent class declares what it is once, and everything naming methods reads it.

The demo: a new group method defined here (a new objective and a small class), registered, runs through
``learn``, ``save`` / ``load``, ``train_seeds`` and ``tpo-gym bench`` without touching a file of the package.
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tpo_gym import train_seeds
from tpo_gym.agents import GroupAlgorithm
from tpo_gym.agents.common.registry import (
    GROUP_DIAGNOSTICS,
    UPDATE_DIAGNOSTICS,
    AlgorithmSpec,
    Diagnostic,
    algorithm_class,
    algorithm_registry,
    algorithm_spec,
    builtin_algorithms,
    register_algorithm,
    unregister_algorithm,
)
from tpo_gym.agents.common.update import Prepared
from tpo_gym.objectives import standardize_scores

TOKEN = "tpo_gym/TokenReversal-v0"
SMALL = {"batch_size": 6, "group_size": 3, "policy_kwargs": {"d_model": 8, "d_ff": 16, "n_layers": 1}}


def sign_pg_loss(logp: torch.Tensor, scores: torch.Tensor, eta: float, mask: torch.Tensor | None) -> torch.Tensor:
    r"""The toy objective: :math:`L = -\frac{1}{G}\sum_g \sum_k \mathrm{sign}(u_{gk})\, \log\pi(y_{gk}) / \eta`,
    ``u`` the scores z-scored within each group (only whether a candidate beat its group's mean counts)."""
    terms = torch.sign(standardize_scores(scores, mask)) * logp / eta
    if mask is not None:
        terms = torch.where(mask, terms, torch.zeros_like(terms))
    return -terms.sum(dim=-1).mean()


@dataclasses.dataclass(frozen=True)
class SignBatch(Prepared):
    """What SignPG's update keeps frozen: the group scores and their mask."""

    scores: torch.Tensor
    mask: torch.Tensor | None


class SignPG(GroupAlgorithm):
    """Sign policy gradient: push up the candidates above their group's mean score, down the others.

    :param eta: temperature of the weights, > 0 (default 1).
    """

    spec = AlgorithmSpec(
        sampling="group", levels=("token", "sequence"), run_kinds=("token",),
        diagnostics=(*UPDATE_DIAGNOSTICS, *GROUP_DIAGNOSTICS,
                     Diagnostic("above_mean_fraction", "`above_mean_fraction`: fraction of the candidates scored "
                                                       "above their group's mean (SignPG)")),
    )

    def __init__(self, policy: Any, env: Any, *, eta: float = 1.0, **kwargs: Any) -> None:
        if not eta > 0:
            raise ValueError(f"eta must be > 0, got {eta!r}")
        self.eta = float(eta)
        super().__init__(policy, env, **kwargs)

    def prepare(self, batch: Any, old: torch.Tensor) -> tuple[SignBatch, dict[str, Any]]:
        scores, mask = self.group_scores(batch)
        diagnostics = self.group_diagnostics(scores, mask)
        diagnostics["above_mean_fraction"] = (standardize_scores(scores, mask) > 0).double().mean()
        return SignBatch(scores=scores, mask=mask), diagnostics

    def compute_loss(self, batch: Any, prepared: SignBatch, current: torch.Tensor) -> torch.Tensor:
        return sign_pg_loss(current, prepared.scores, self.eta, prepared.mask)


@pytest.fixture
def sign_pg() -> Iterator[type[SignPG]]:
    register_algorithm(SignPG)
    try:
        yield SignPG
    finally:
        unregister_algorithm("SignPG")


def test_a_method_defined_outside_the_package_learns_saves_loads_and_trains_seeds(sign_pg: type) -> None:
    agent = sign_pg("TransformerPolicy", TOKEN, level="token", eta=0.5, seed=0, **SMALL)
    agent.learn(2 * agent.steps_per_iteration)
    assert [set(r) - {"iteration", "num_timesteps", "error"} for r in agent.history] == \
        [{d.key for d in sign_pg.spec.diagnostics}] * 2
    buffer = io.BytesIO()
    agent.save(buffer)
    buffer.seek(0)
    loaded = GroupAlgorithm.load(buffer, env=TOKEN)
    assert type(loaded) is sign_pg and loaded.eta == 0.5 and loaded.history == agent.history
    seeds = train_seeds(sign_pg, "TransformerPolicy", TOKEN, [0, 1], 2 * agent.steps_per_iteration, level="token",
                        eta=0.5, forward="loop", optimizer="loop", **SMALL)
    assert seeds[0].history == agent.history and seeds[1].history != agent.history


def test_a_registered_method_runs_in_tpo_gym_bench_and_its_diagnostics_reach_the_report(
        sign_pg: type, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tpo_gym.evaluation import cli

    preset = {
        "name": "sign-pg", "description": "test-only preset: a method registered by a test", "paper_ref": "none",
        "seeds": 1,
        "settings": [{"name": "H=3", "kind": "token", "params": {
            "env_id": "tpo_gym/TokenTask-v0", "episodes": 2,
            "env_kwargs": {"target": "reverse_copy", "reward": "bag", "vocab_size": 2, "length": 3},
            "agent_kwargs": {**SMALL, "level": "token"}}}],
        "methods": [{"name": "Sign PG", "algo": "SignPG", "kwargs": {"eta": 0.5}}],
        "metrics": [{"id": "final_error", "type": "final", "key": "error", "scale": 100, "unit": "%"}],
    }
    path = tmp_path / "sign-pg.json"
    path.write_text(json.dumps(preset))
    out = tmp_path / "out"
    assert cli.main(["bench", "--preset", str(path), "--out", str(out), "--no-progress"]) == 0, capsys.readouterr()
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all("above_mean_fraction" in r for r in rows)
    report = (out / "report.md").read_text()
    assert "`above_mean_fraction`: fraction of the candidates scored above" in report


def test_the_registry_lists_the_built_in_agents_in_the_order_of_their_modules() -> None:
    """One module per method in tpo_gym/agents/algorithms, in the order of ``BUILTIN`` (the paper's first), each
    holding the one class registered under its name; tpo_gym exports them all."""
    import tpo_gym
    from tpo_gym.agents import algorithms

    by_module = [c.__module__.rpartition(".")[2] for c in builtin_algorithms().values()]
    assert by_module == list(algorithms.BUILTIN)
    assert list(builtin_algorithms())[:7] == ["TPO", "GRPO", "GroupPG", "PPO", "REINFORCE", "DG", "CE"]
    assert list(algorithm_registry())[:len(by_module)] == list(builtin_algorithms())
    for name, spec in algorithm_registry().items():
        cls = algorithm_class(name)
        assert cls is getattr(tpo_gym, name) and cls.spec is spec and cls.sampling == spec.sampling
    assert set(algorithm_registry()) <= set(tpo_gym.__all__)


def test_each_agents_logged_keys_are_the_diagnostics_it_declares() -> None:
    """Every key of the golden histories (every family, every env kind) is declared by its class's spec."""
    from tests.golden.histories import case_method, load_cases

    golden = load_cases()
    seen: dict[str, set[str]] = {}
    for case, runs in golden.items():
        name = case_method(case)
        for run in runs:
            for record in run["history"]:
                seen.setdefault(name, set()).update(set(record) - {"iteration", "num_timesteps", "error"})
    assert set(seen) == set(algorithm_registry())
    for name, keys in seen.items():
        assert keys == {d.key for d in algorithm_spec(name).diagnostics}, name


def test_tabular_methods_named_by_the_registry_exist() -> None:
    from tpo_gym.evaluation import tabular

    implemented = {"tabular_single": tabular.SINGLE_CONTEXT_METHODS, "tabular_multi": tabular.MULTI_CONTEXT_METHODS}
    for name, spec in algorithm_registry().items():
        for kind, methods in implemented.items():
            assert (kind in spec.run_kinds) == (spec.tabular in methods), (name, kind)


def test_the_report_and_the_harness_read_the_registry() -> None:
    from tpo_gym.evaluation import report
    from tpo_gym.evaluation.experiments import methods_for_kind

    assert {"entropy_q", "completion_length", "collapsed_target_fraction", "mean_score"} <= set(report.DIAGNOSTIC_KEYS)
    assert methods_for_kind("llm") == tuple(n for n, s in algorithm_registry().items() if "llm" in s.run_kinds)
    assert methods_for_kind("llm")[:3] == ("TPO", "GRPO", "GroupPG")
    assert methods_for_kind("tabular_multi") == ("TPO", "GRPO", "DG", "CE")


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: AlgorithmSpec(sampling="pairs", run_kinds=("token",)), "sampling must be one of"),
        (lambda: AlgorithmSpec(sampling="group", run_kinds=("atari",)), "run_kinds must be"),
        (lambda: AlgorithmSpec(sampling="single", run_kinds=("llm",)), "'llm' needs sampling='group'"),
        (lambda: AlgorithmSpec(sampling="group", run_kinds=("tabular_single",)), "tabular method name"),
        (lambda: register_algorithm(type("NoSpec", (GroupAlgorithm,), {})), "must declare spec"),
        (lambda: register_algorithm(type("TPO", (GroupAlgorithm,), {"spec": SignPG.spec})), "already registered"),
        (lambda: register_algorithm(dict), "takes a GroupAlgorithm subclass"),
        (lambda: unregister_algorithm("TPO"), "registered from outside tpo_gym"),
        (lambda: algorithm_class("SAC"), "unknown agent 'SAC'; registered: TPO, GRPO"),
    ],
)
def test_bad_registrations_are_refused_naming_the_problem(make: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()
