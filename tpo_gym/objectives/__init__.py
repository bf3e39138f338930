r"""The objectives of TPO and of every baseline, as small pure torch functions.

Every agent and every experiment of tpo-gym calls these functions; none keeps a second copy of
the math. Each docstring states the equation it implements: TPO's group standardisation, target
and cross-entropy fit as the TPO paper (Target Policy Optimization, arXiv 2604.06159) defines them
in its method, the baselines (GRPO and its variants, PPO, REINFORCE, Group PG, the CE oracle) as
that paper runs them in its experiments, and DG as Osband 2026 ("Delightful Policy Gradient",
arXiv 2603.14608) defines it.

Conventions
-----------
* A **group** is the last dimension ``K`` of a tensor shaped ``[..., K]``: the K scored candidates
  of one context (K actions of a bandit, K next tokens of a prefix state, K completions of a
  prompt). Leading dimensions ``...`` index groups and are averaged over.
* ``mask`` (optional, boolean, same shape) marks *valid* candidates; ``False`` entries are padding.
  Padding is **ignored whatever it holds** (0, NaN, ``-inf`` log-probs, ...): masked entries are
  replaced (``torch.where``, never a multiplication by 0) before any arithmetic, so they receive
  zero target mass, zero advantage and an exactly zero, finite gradient, and the result equals
  the one for the same batch with the masked entries set to 0.
* **Means over rows.** Group losses (:func:`tpo_loss`, :func:`grpo_loss`, :func:`group_pg_loss`)
  sum over the candidates of a group and average over the groups with at least one valid
  candidate. Per-step losses (:func:`ppo_loss`, :func:`reinforce_loss`, :func:`dg_loss`) take
  ``[B, T]`` tensors (``T`` steps of ``B`` trajectories; a 1-D ``[B]`` tensor is ``B`` one-step
  trajectories), sum over the valid steps of a trajectory and average over the trajectories
  with at least one valid step. :func:`cross_entropy_loss` averages over its valid rows. A fully
  masked group, trajectory or row contributes nothing; a fully masked batch gives a loss of 0
  with a zero gradient (never NaN).
* **Wide arithmetic.** Every sum, count and mean of a reduction, and every product of a loss
  (advantage times log-prob, ``u / eta`` times log-prob, ratio times advantage), is computed in
  float64 whatever the input dtype (a float16 batch of more than 65,504 groups, or an all-True
  mask, is exact), and the result comes back in the inputs' dtype (float32 or wider for the
  ratio-based :func:`ppo_loss` and :func:`grpo_loss`). So finite inputs never give NaN: a loss
  whose value or gradient weights lie beyond the range of that dtype is refused with a
  ``ValueError`` saying which inputs to shrink (see each function), never returned as ``inf``.
* ``logp`` are log-probabilities of the chosen candidates under the current policy (for a
  sequence, the sum of its token log-probs, no length normalisation); ``logp_old`` the same under
  the rollout-time snapshot ``pi_old``.
* **Zero-variance groups.** A group carries no signal (``u = 0``, GRPO advantage 0) when the
  population standard deviation of its valid scores is at most a tolerance *relative to their
  magnitude*:

  .. math::
      \sigma(s) \le \tau \cdot \max_i |s_i|, \qquad
      \tau = \max\big(\mathrm{STD\_EPS},\ \varepsilon_{\mathrm{dtype}} / 2\big),

  with :data:`STD_EPS` ``= 1e-6`` and :math:`\varepsilon_{\mathrm{dtype}} / 2` the unit roundoff
  of the scores' dtype (``torch.finfo(dtype).eps / 2``): :math:`\tau = 10^{-6}` for float32 and
  float64, :math:`2^{-11}` for float16, :math:`2^{-8}` for bfloat16. So scores that differ by
  about one unit in the last place of their dtype (rounding noise) carry no signal, and for
  scores of order one (e.g. 0/1 rewards, :math:`\max_i |s_i| = 1`) this is the paper's
  :math:`\sigma(s) \le 10^{-6}`. Being relative, the rule is invariant to scaling (``u(a s) =
  u(s)`` for every ``a > 0``, ``[0, 1e-7, 0, 1e-7]`` gives ``u = [-1, 1, -1, 1]``), and
  ``u(a s + b) = u(s)`` whenever both groups have a relative spread
  :math:`\sigma / \max_i |s_i|` above :math:`\tau`; a shift that makes the spread smaller than
  :math:`\tau` times the magnitude (``[1, 1 + 1e-7, 1]``) removes the signal. The statistics are
  computed in float32 or wider (float16 and bfloat16 are upcast; results come back in the input
  dtype) by a shifted two-pass algorithm: ``d = s - min(s)`` over the valid scores (exactly 0
  for an all-equal group, no cancellation against a large offset), divided by its range before
  squaring (no overflow, no underflow), then centred. An exactly all-equal group, a group with
  fewer than two valid candidates and an all-zero group always have :math:`\sigma = 0` exactly
  and get exactly :math:`u = 0`, whatever the magnitude and dtype. :func:`standardize_scores`,
  :func:`grpo_advantages` and :func:`zero_variance_groups` share this one computation and always
  agree.

Errors
------
Every tensor argument is checked before any arithmetic. A ``ValueError`` naming the argument is
raised for NaN or ``±inf`` at a valid (unmasked) position (a log-probability of ``-inf`` means a
sampled candidate had probability 0: mask it out instead), for an empty tensor (no group, no
trajectory, ``K = 0`` or ``T = 0``), a 0-d tensor, mismatched shapes, labels or actions out of
range. A tensor of the wrong *kind* (not a tensor; an integer or bool dtype where floating point
is needed; a non-bool mask; a non-integer dtype for labels or actions, even 2.0) raises
:class:`InputTypeError`, which is both a ``TypeError`` and a ``ValueError``. Scalar arguments
(``eta``, ``clip_eps``, ``beta``, ``eps``, ``anchor``, ``mask_zero_variance``) are checked by
:mod:`tpo_gym._validation` with its shared messages (``"eta must be a finite number > 0, got
0.0"``).
"""

from __future__ import annotations

from tpo_gym.objectives._checks import (
    LOG_RATIO_CLIP,
    STD_EPS,
    InputTypeError,
    at_least_float32,
    deferred_checks,
    working_dtype,
)
from tpo_gym.objectives.grpo import grpo_advantages, grpo_loss, k3_kl, kl_penalty, zero_variance_groups
from tpo_gym.objectives.listwise import LPO_FITS, LPO_TAUS, lpo_loss, lpo_target, maxrl_advantages, tailrl_advantages
from tpo_gym.objectives.single import (
    batch_baseline_advantages,
    cross_entropy_loss,
    dg_gate,
    dg_loss,
    group_pg_loss,
    ppo_loss,
    reinforce_loss,
)
from tpo_gym.objectives.tpo import onehot_advantage_scores, standardize_scores, tpo_loss, tpo_target

__all__ = [
    "STD_EPS",
    "at_least_float32",
    "working_dtype",
    "LOG_RATIO_CLIP",
    "InputTypeError",
    "standardize_scores",
    "tpo_target",
    "tpo_loss",
    "onehot_advantage_scores",
    "grpo_advantages",
    "zero_variance_groups",
    "grpo_loss",
    "kl_penalty",
    "batch_baseline_advantages",
    "ppo_loss",
    "reinforce_loss",
    "group_pg_loss",
    "dg_gate",
    "dg_loss",
    "cross_entropy_loss",
    "k3_kl",
    "deferred_checks",
    "lpo_target",
    "lpo_loss",
    "LPO_TAUS",
    "LPO_FITS",
    "maxrl_advantages",
    "tailrl_advantages",
]
