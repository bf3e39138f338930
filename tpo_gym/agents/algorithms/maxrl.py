r"""MaxRL: Group PG with MaxRL's advantages (Tajwar et al. 2026, arXiv:2602.02710)."""

from __future__ import annotations

from tpo_gym.agents.algorithms.group_advantage import GroupAdvantageAlgorithm
from tpo_gym.agents.common.registry import (
    GROUP_DIAGNOSTICS,
    TEXT_DIAGNOSTICS,
    UPDATE_DIAGNOSTICS,
    AlgorithmSpec,
    register_algorithm,
)
from tpo_gym.objectives.listwise import maxrl_advantages

__all__ = ["MaxRL"]


@register_algorithm
class MaxRL(GroupAdvantageAlgorithm):
    r"""Maximum-likelihood RL: TPO's groups weighted by MaxRL's advantages ``(r - mean) / mean``.

    The Group PG family (:class:`~tpo_gym.agents.GroupPG`'s groups and loss) with another advantage estimator:

    .. math::
        A_i = \frac{r_i - \bar r}{\bar r}, \qquad
        L = -\frac1G \sum_g \sum_{k=1}^{K} A_{g,k}\, \log\pi_\theta(y_{g,k})

    (:func:`~tpo_gym.objectives.listwise.maxrl_advantages`, :func:`~tpo_gym.objectives.group_pg_loss`). On 0/1
    rewards with m successes of K this weights a success by :math:`(K - m)/m` and a failure by -1: the sample
    estimate of :math:`\nabla \log p_\theta(x)`, the log pass rate, instead of :math:`\nabla p_\theta(x)`, so
    hard contexts (small m) get more weight. An all-fail group (mean 0) and every all-equal group get exactly
    ``A = 0``. Rewards must be non-negative (else a ``ValueError`` at the update); on rewards other than 0/1 the
    same formula estimates :math:`\nabla \log \mathbb{E}[r]` (:class:`~tpo_gym.agents.TailRL` is the published
    continuous generalisation). ``level="token"``: K candidates per state, each scored by its reward;
    ``"sequence"``: K rollouts per context, scored by the episode (with the terminal reward, 0/1 exact match);
    a language model: K completions per prompt.

    Diagnostics: ``zero_variance_fraction``, ``all_fail_fraction``, ``any_success_fraction`` (and on language
    models ``completion_length``, ``mean_score``).
    """

    spec = AlgorithmSpec(
        sampling="group", levels=("token", "sequence"), run_kinds=("token", "mnist", "llm"),
        diagnostics=(*UPDATE_DIAGNOSTICS, *GROUP_DIAGNOSTICS, *TEXT_DIAGNOSTICS),
    )

    group_advantages = staticmethod(maxrl_advantages)
