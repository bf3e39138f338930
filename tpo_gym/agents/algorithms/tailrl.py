r"""TailRL: Group PG with tail-likelihood advantages (Ramasubramanian et al. 2026, arXiv:2609.02987)."""

from __future__ import annotations

from tpo_gym.agents.algorithms.group_advantage import GroupAdvantageAlgorithm
from tpo_gym.agents.common.registry import (
    GROUP_DIAGNOSTICS,
    TEXT_DIAGNOSTICS,
    UPDATE_DIAGNOSTICS,
    AlgorithmSpec,
    register_algorithm,
)
from tpo_gym.objectives.listwise import tailrl_advantages

__all__ = ["TailRL"]


@register_algorithm
class TailRL(GroupAdvantageAlgorithm):
    r"""Tail-likelihood RL: TPO's groups weighted by TailRL's gap-over-survivors advantages.

    The Group PG family (:class:`~tpo_gym.agents.GroupPG`'s groups and loss) with another advantage estimator.
    Sort the n scores of a group, :math:`r_{(1)} \le \dots \le r_{(n)}`:

    .. math::
        A_{(i)} = n \sum_{j \le i} \frac{r_{(j)} - r_{(j-1)}}{n - j + 1} \;-\; \text{its mean over the group},
        \qquad L = -\frac1G \sum_g \sum_{k=1}^{K} A_{g,k}\, \log\pi_\theta(y_{g,k})

    (:func:`~tpo_gym.objectives.listwise.tailrl_advantages`, :func:`~tpo_gym.objectives.group_pg_loss`): MaxRL's
    advantage of the 0/1 reward "at least t", integrated over the thresholds t, so it takes continuous rewards
    of any sign, and on 0/1 rewards it equals :class:`~tpo_gym.agents.MaxRL` exactly. Tied scores get equal
    advantages; all-equal groups get exactly ``A = 0``. The advantages are in the units of the scores (shift
    invariant, scaling with them). ``level="token"``: K candidates per state, each scored by its reward;
    ``"sequence"``: K rollouts per context, scored by the episode; a language model: K completions per prompt.

    Diagnostics: ``zero_variance_fraction``, ``all_fail_fraction``, ``any_success_fraction`` (and on language
    models ``completion_length``, ``mean_score``).
    """

    spec = AlgorithmSpec(
        sampling="group", levels=("token", "sequence"), run_kinds=("token", "mnist", "llm"),
        diagnostics=(*UPDATE_DIAGNOSTICS, *GROUP_DIAGNOSTICS, *TEXT_DIAGNOSTICS),
    )

    group_advantages = staticmethod(tailrl_advantages)
