"""Every per-method check (tests/agents/method_checks.py) on every registered method, and on a method added the way
a contributor adds one: one module, defining one registered class, and nothing else edited."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from tests.agents.method_checks import PER_METHOD_CHECKS
from tpo_gym.agents.common.registry import algorithm_class, algorithm_registry, unregister_algorithm


@pytest.mark.parametrize("check", PER_METHOD_CHECKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("name", list(algorithm_registry()))
def test_every_method_passes_every_check(name: str, check: object, tmp_path: Path) -> None:
    check(algorithm_class(name), tmp_path)  # type: ignore[operator]


#: The whole of a new method, as a contributor writes it: a TPO whose fit is the reverse KL, with no __init__, no
#: spec and no docs of its own (it inherits TPO's).
THROWAWAY = '''
"""TPO fitted by the reverse KL: a throwaway method of the per-method tests."""

import torch

from tpo_gym import TPO
from tpo_gym.agents import register_algorithm


@register_algorithm
class ReverseFitTPO(TPO):
    """TPO with the reverse-KL fit :math:`\\\\sum_k p_k (\\\\log p_k - \\\\log q_k)` of the policy's group distribution
    :math:`p` to the target :math:`q` (TPO fits the forward KL)."""

    def compute_loss(self, batch, prepared, current):
        logp = torch.log_softmax(current, dim=-1)
        q = prepared.q.clamp_min(1e-30)
        valid = torch.ones_like(q, dtype=torch.bool) if prepared.mask is None else prepared.mask
        terms = torch.where(valid, logp.exp() * (logp - q.log()), torch.zeros_like(logp))
        return terms.sum(dim=-1).mean()
'''


@pytest.fixture
def throwaway_method(tmp_path: Path) -> object:
    module_dir = tmp_path / "contrib"
    module_dir.mkdir()
    (module_dir / "reverse_fit_tpo.py").write_text(THROWAWAY)
    sys.path.insert(0, str(module_dir))
    try:
        module = importlib.import_module("reverse_fit_tpo")
        yield module.ReverseFitTPO
    finally:
        sys.path.remove(str(module_dir))
        sys.modules.pop("reverse_fit_tpo", None)
        unregister_algorithm("ReverseFitTPO")


def test_a_method_in_one_new_module_passes_every_per_method_check(throwaway_method: type, tmp_path: Path) -> None:
    """The contributor's path: one file with the class and its registration, and every per-method check holds
    (signature docs and spec inherited from TPO; diagnostics it does not log are dropped, not a failure)."""
    assert throwaway_method.__name__ in algorithm_registry()
    assert algorithm_class("ReverseFitTPO") is throwaway_method
    for check in PER_METHOD_CHECKS:
        check(throwaway_method, tmp_path / check.__name__)


def test_the_checks_fail_a_method_that_breaks_them(throwaway_method: type, tmp_path: Path) -> None:
    """The checks can fail: a method logging a key its spec does not declare, or taking an undocumented argument."""
    from tests.agents.method_checks import check_history_and_logged_keys, check_signature_and_docs

    class Chatty(throwaway_method):  # type: ignore[misc, valid-type]
        def prepare(self, batch, old):  # type: ignore[no-untyped-def]
            prepared, diagnostics = super().prepare(batch, old)
            return prepared, {**diagnostics, "undeclared_number": 1.0}

    with pytest.raises(AssertionError, match="undeclared_number"):
        check_history_and_logged_keys(Chatty, tmp_path)

    class Undocumented(throwaway_method):  # type: ignore[misc, valid-type]
        def __init__(self, policy, env, *, mystery: float = 1.0, **kwargs):  # type: ignore[no-untyped-def]
            self.mystery = mystery
            super().__init__(policy, env, **kwargs)

    with pytest.raises(AssertionError, match="does not document mystery"):
        check_signature_and_docs(Undocumented, tmp_path)
