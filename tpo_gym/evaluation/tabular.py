r"""Tabular bandit experiments of docs/method.md section 3 (paper figures 3 and 4).

Both experiments move a logit table directly with *normalised* steps,

.. math::
    \ell \leftarrow \ell + \alpha\, \frac{g}{\lVert g \rVert}, \qquad g = -\nabla_\ell L,

so methods differ only in the *direction* their objective gives. Every direction comes from the
objective functions of :mod:`tpo_gym.objectives` (autograd on the logit table), never from a
second copy of the math.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from tpo_gym import objectives as O

__all__ = [
    "SINGLE_CONTEXT_METHODS",
    "MULTI_CONTEXT_METHODS",
    "single_context_bandit",
    "multi_context_bandit",
    "misalignment",
    "TABULAR_SETUPS",
    "SAMPLED_LOSSES",
    "REFERENCE_SAMPLED_LOSSES",
    "POPULATION_COEFFICIENTS",
]



def misalignment(g: torch.Tensor, g_star: torch.Tensor) -> float:
    r""":math:`1 - \cos(g, g^*)`; 1.0 when either direction is zero."""
    denom = g.norm() * g_star.norm()
    if denom <= 0:
        return 1.0
    return float(1.0 - (g * g_star).sum() / denom)


def _check_method(method: str, allowed: tuple[str, ...]) -> str:
    if method not in allowed:
        raise ValueError(f"unknown method {method!r}; allowed: {', '.join(allowed)}")
    return method


#: Named setups of the tabular experiments: this project's (``"tuned"``) and the reference code's.
TABULAR_SETUPS = ("tuned", "reference")
#: The reference code's constant baseline / score of an arm with no observed reward (docs/method.md section 4b).
REFERENCE_BASELINE = 0.5


# One loss per method on one batch of B sampled actions of the single-context bandit: ``logits`` the table (with
# gradient), ``logp`` ``[B]`` the log-probs of the sampled actions (the B samples form one group of candidates).
SampledLoss = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, float], torch.Tensor]


def _tpo(logits: torch.Tensor, logp: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor, correct: int,
         eta: float) -> torch.Tensor:
    u = O.standardize_scores(rewards)
    return O.tpo_loss(logp, O.tpo_target(logp.detach(), u, eta=eta))


def _grpo(logits: torch.Tensor, logp: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor, correct: int,
          eta: float) -> torch.Tensor:
    return O.grpo_loss(logp, logp.detach(), rewards, beta=0.0)


def _pg(logits: torch.Tensor, logp: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor, correct: int,
        eta: float) -> torch.Tensor:
    return O.reinforce_loss(logp, O.batch_baseline_advantages(rewards))


def _dg(logits: torch.Tensor, logp: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor, correct: int,
        eta: float) -> torch.Tensor:
    return O.dg_loss(logp, O.batch_baseline_advantages(rewards), eta=eta)


def _group_pg(logits: torch.Tensor, logp: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor, correct: int,
              eta: float) -> torch.Tensor:
    return O.group_pg_loss(logp, O.standardize_scores(rewards), eta=eta)


def _ce(logits: torch.Tensor, logp: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor, correct: int,
        eta: float) -> torch.Tensor:
    """The CE oracle: supervised cross-entropy on the correct arm."""
    return O.cross_entropy_loss(logits.unsqueeze(0), torch.tensor([correct]))


def _reference_tpo(logits: torch.Tensor, logp: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor,
                   correct: int, eta: float) -> torch.Tensor:
    """One score per arm (the observed reward of a sampled arm, the baseline for an unsampled one); target and
    cross-entropy over every arm (one group of n_arms candidates)."""
    logp_all = torch.log_softmax(logits, dim=-1)
    u = torch.full_like(logits, REFERENCE_BASELINE, dtype=rewards.dtype)
    u[actions] = rewards
    return O.tpo_loss(logp_all[None], O.tpo_target(logp_all.detach()[None], u[None], eta=eta))


def _reference_pg(logits: torch.Tensor, logp: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor,
                  correct: int, eta: float) -> torch.Tensor:
    return O.reinforce_loss(logp, rewards - REFERENCE_BASELINE)


def _reference_dg(logits: torch.Tensor, logp: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor,
                  correct: int, eta: float) -> torch.Tensor:
    return O.dg_loss(logp, rewards - REFERENCE_BASELINE, eta=eta)


#: The single-context methods' losses (``setup="tuned"``), by method name (an agent's ``AlgorithmSpec.tabular``).
SAMPLED_LOSSES: dict[str, SampledLoss] = {"tpo": _tpo, "grpo": _grpo, "pg": _pg, "dg": _dg, "group_pg": _group_pg,
                                          "ce": _ce}
#: Where ``setup="reference"`` differs (docs/method.md section 4b): TPO over every arm, PG / DG with baseline 0.5.
REFERENCE_SAMPLED_LOSSES: dict[str, SampledLoss] = {"tpo": _reference_tpo, "pg": _reference_pg, "dg": _reference_dg}


def _sampled_loss(
    method: str, logits: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor, correct: int, eta: float,
    setup: str = "tuned",
) -> torch.Tensor:
    """The method's loss on one batch of B sampled actions of the single-context bandit."""
    loss = (REFERENCE_SAMPLED_LOSSES.get(method) if setup == "reference" else None) or SAMPLED_LOSSES[method]
    logp = torch.log_softmax(logits, dim=-1)[actions]  # [B]: the B samples form one group of candidates
    return loss(logits, logp, actions, rewards, correct, eta)


def single_context_bandit(
    method: str,
    seed: int,
    n_arms: int = 100,
    batch_size: int = 100,
    steps: int = 150,
    step_size: float = 0.1,
    eta: float = 1.0,
    setup: str = "tuned",
) -> list[dict]:
    r"""Single-context bandit with one correct arm (docs/method.md section 3; paper figure 3).

    Zero-initialised logits over ``n_arms`` arms; each step samples ``batch_size`` actions from
    :math:`\pi = \mathrm{softmax}(\ell)`, rewards :math:`r = 1\{a = y^*\}`, takes the method's
    gradient direction on that batch and a normalised step. Logged per step (before the update):
    error :math:`1 - \pi(y^*)` and misalignment :math:`1 - \cos(g, g^*)` to the oracle direction
    :math:`g^* = \pi(y^*)(e_{y^*} - \pi)`.

    ``setup="tuned"`` (default): the B samples form one group; TPO and GRPO use their z-scores, PG
    and DG the batch-mean baseline. ``setup="reference"`` (the reference code, docs/method.md section
    4b): TPO scores every arm, :math:`u_a = r_a` for a sampled arm and 0.5 for an unsampled one, and
    fits :math:`q \propto \pi\, e^{u/\eta}` over all arms (direction :math:`q - \pi`); PG and DG
    use the constant baseline 0.5, :math:`A = r - 0.5`; the other methods are unchanged. (Which score
    the reference gives an unsampled arm is our reading of "baseline 0.5".)

    :return: rows ``{"step", "error", "misalignment", "grad_norm"}``, one per step, plus a final
        row at ``step == steps`` with the error after the last update.
    """
    _check_method(method, SINGLE_CONTEXT_METHODS)
    if setup not in TABULAR_SETUPS:
        raise ValueError(f"setup must be one of {', '.join(TABULAR_SETUPS)}; got {setup!r}")
    if n_arms < 2 or batch_size < 1 or steps < 1 or step_size <= 0:
        raise ValueError(
            f"need n_arms >= 2, batch_size >= 1, steps >= 1, step_size > 0; got n_arms={n_arms}, "
            f"batch_size={batch_size}, steps={steps}, step_size={step_size}"
        )
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(int(rng.integers(2**31)))
    correct = int(rng.integers(n_arms))
    logits = torch.zeros(n_arms, dtype=torch.float64)
    e_star = torch.zeros(n_arms, dtype=torch.float64)
    e_star[correct] = 1.0
    rows: list[dict] = []
    for step in range(steps):
        pi = torch.softmax(logits, -1)
        actions = torch.multinomial(pi, batch_size, replacement=True, generator=gen)
        rewards = (actions == correct).to(torch.float64)
        table = logits.clone().requires_grad_(True)
        _sampled_loss(method, table, actions, rewards, correct, eta, setup).backward()
        g = -table.grad
        g_star = pi[correct] * (e_star - pi)
        norm = g.norm()
        rows.append({"step": step, "error": float(1 - pi[correct]),
                     "misalignment": misalignment(g, g_star), "grad_norm": float(norm)})
        if norm > 0:
            logits = logits + step_size * g / norm
    rows.append({"step": steps, "error": float(1 - torch.softmax(logits, -1)[correct])})
    return rows


#: Per-context coefficient ``c(p, lam)`` on ``(e_y - pi_n)`` of each multi-context method's expected update
#: (docs/method.md section 3), by method name.
POPULATION_COEFFICIENTS: dict[str, Callable[[torch.Tensor, float], torch.Tensor]] = {
    "ce": lambda p, lam: torch.ones_like(p),
    "tpo": lambda p, lam: p * (lam - 1) / (1 - p + lam * p),
    "grpo": lambda p, lam: torch.sqrt(p / (1 - p).clamp_min(1e-12)),
    "dg": lambda p, lam: p / (1 + p),
}


#: The methods each experiment runs (the keys of :data:`SAMPLED_LOSSES` / :data:`POPULATION_COEFFICIENTS`).
SINGLE_CONTEXT_METHODS = tuple(SAMPLED_LOSSES)
MULTI_CONTEXT_METHODS = tuple(POPULATION_COEFFICIENTS)


def multi_context_bandit(
    method: str,
    seed: int,
    n_contexts: int = 100,
    n_arms: int = 10,
    steps: int = 1000,
    step_size: float = 0.1,
    lam: float | None = None,
    setup: str = "tuned",
) -> list[dict]:
    r"""Multi-context bandit with exact population updates (docs/method.md section 3; paper figure 4).

    Logits :math:`\ell_n \sim \mathcal N(0, I)` for ``n_contexts`` contexts of ``n_arms`` arms,
    correct arm :math:`y_n` uniform. Each method's expected update on context n is
    :math:`c(p_n)\,(e_{y_n} - \pi_n)` with :math:`p_n = \pi_n(y_n)` and
    CE :math:`c = 1`, DG :math:`c = p/(1+p)`, GRPO :math:`c = \sqrt{p/(1-p)}`,
    TPO :math:`c = p(\lambda-1)/(1-p+\lambda p)`; the step is normalised over all N·K logits.
    (The CE direction equals minus the gradient of :func:`tpo_gym.objectives.cross_entropy_loss`;
    the tests check it.)
    Logged: error :math:`1 - \tfrac1N\sum_n \pi_n(y_n)` and misalignment to the CE direction.

    ``setup="tuned"`` (default): :math:`\lambda = 28`, each row's error is the one *before* that
    step's update (plus a final row at ``step == steps``). ``setup="reference"``: :math:`\lambda =
    e^{10/3} \approx 28.03` and each row's error is the one *after* its update, as the reference
    logs it (docs/method.md section 4b). ``lam`` overrides either.
    """
    _check_method(method, MULTI_CONTEXT_METHODS)
    if setup not in TABULAR_SETUPS:
        raise ValueError(f"setup must be one of {', '.join(TABULAR_SETUPS)}; got {setup!r}")
    if lam is None:
        lam = math.exp(10 / 3) if setup == "reference" else 28.0
    if n_contexts < 1 or n_arms < 2 or steps < 1 or step_size <= 0 or lam <= 1:
        raise ValueError(
            f"need n_contexts >= 1, n_arms >= 2, steps >= 1, step_size > 0, lam > 1; got "
            f"{n_contexts}, {n_arms}, {steps}, {step_size}, {lam}"
        )
    gen = torch.Generator().manual_seed(int(seed))
    logits = torch.randn(n_contexts, n_arms, generator=gen, dtype=torch.float64)
    labels = torch.randint(n_arms, (n_contexts,), generator=gen)
    onehot = torch.nn.functional.one_hot(labels, n_arms).to(torch.float64)
    coefficient = POPULATION_COEFFICIENTS[method]
    rows: list[dict] = []
    for step in range(steps):
        pi = torch.softmax(logits, -1)
        p = pi.gather(1, labels[:, None])
        g_ce = onehot - pi
        g = coefficient(p, lam) * g_ce
        row = {"step": step, "error": float(1 - p.mean()), "misalignment": misalignment(g, g_ce)}
        logits = logits + step_size * g / g.norm()
        if setup == "reference":
            row["error"] = float(1 - torch.softmax(logits, -1).gather(1, labels[:, None]).mean())
        rows.append(row)
    if setup != "reference":
        rows.append({"step": steps,
                     "error": float(1 - torch.softmax(logits, -1).gather(1, labels[:, None]).mean())})
    return rows
