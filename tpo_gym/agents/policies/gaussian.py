r"""Box (continuous) action spaces: the diagonal-Gaussian MLP policy, its log-densities and the Box checks.

``"MlpPolicy"`` on an env with a bounded ``Box`` action space builds :class:`GaussianMlpPolicy` (as SB3's
``"MlpPolicy"`` picks a Gaussian head for ``Box`` actions). Its distribution at a state is a diagonal Gaussian
:math:`\mathcal N(\mu_\theta(s), \operatorname{diag}\sigma^2)`: the MLP gives the mean, the log standard
deviation is a state-independent parameter (SB3's default, ``log_std_init=0.0``: :math:`\sigma = 1`). An action
is a sample :math:`a_t \sim \mathcal N(\mu(s_t), \sigma^2)`; the env gets it **clipped to the Box bounds** while
its log-probability is that of the unclipped sample (what SB3 does by default, without squashing). With
``squash_output=True`` the env gets :math:`\mathrm{low} + (\tanh(u) + 1)(\mathrm{high} - \mathrm{low})/2` of
the Gaussian sample :math:`u` instead, and the log-probability carries the change of variables,
:math:`\log p(a) = \log\mathcal N(u; \mu, \sigma^2) - \sum_i \log(1 - \tanh^2 u_i)` (SB3's tanh squashing;
the constant scale term of the bounds is left out, as SB3 leaves it out).

Every method reads log-probabilities of the actions taken (there is no finite set of actions to normalise
over). An episode's log-probability is the sum over its steps,

.. math::
    \log p(\text{episode}) = \sum_{t} \log \mathcal N\big(a_t;\ \mu(s_t),\ \sigma^2\big),

so sequence-level groups (K same-seed episodes) work exactly as on Discrete actions. Summed over long episodes
(Pendulum's 200 steps) the log-densities of the K episodes of a group differ by tens of nats: TPO's
:math:`p^{old}` over the group is then one-hot and its target :math:`q \propto p^{old} e^{u/\eta}` collapses
onto it (``collapsed_target_fraction`` near 1, no learning), and GRPO's sequence ratio leaves its clip range at
the first step. ``length_normalize=True`` (the default for Box actions) divides each episode's summed
log-probability by its length, :math:`\frac1{T}\sum_t \log\mathcal N(a_t; \mu(s_t), \sigma^2)`, which keeps the
group's :math:`p^{old}` near uniform and the target on the scores. Measured on Pendulum-v1 (TPO, B=8 reset seeds x
K=4, Adam 1e-2, 50 iterations, seeds 0-2): summed, ``collapsed_target_fraction`` is 0.56-0.63 (the entropy of
:math:`p^{old}` over a group 0.11 nats of a uniform 1.39) and the mean return gains 130; length-normalised it is 0
(1.385 nats) and the return gains 506 (docs/agents/index.md, "Continuous actions", has the table).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.preprocessing import preprocess_obs
from stable_baselines3.common.type_aliases import Schedule
from torch import nn

from tpo_gym._validation import check_bool, check_choice, check_float
from tpo_gym.agents.policies.categorical import SETUPS, MlpPolicy, is_empty_batch, mlp, stacked_linear

__all__ = ["GaussianMlpPolicy", "gaussian_log_prob", "tanh_log_abs_det", "check_box_action_space",
           "check_box_agent", "box_view", "is_box_policy"]

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


def gaussian_log_prob(actions: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    r"""Log-density of a diagonal Gaussian, summed over the last dimension (the action's components):
    :math:`\sum_i -\tfrac12 \big((a_i - \mu_i)/\sigma_i\big)^2 - \log\sigma_i - \tfrac12\log 2\pi`
    (``torch.distributions.Normal(mean, log_std.exp()).log_prob(actions).sum(-1)``, computed directly)."""
    z = (actions - mean) * torch.exp(-log_std)
    return (-0.5 * z.square() - log_std - _HALF_LOG_2PI).sum(dim=-1)


def tanh_log_abs_det(u: torch.Tensor) -> torch.Tensor:
    r""":math:`\sum_i \log(1 - \tanh^2 u_i)` over the last dimension, as
    :math:`2(\log 2 - u - \operatorname{softplus}(-2u))`: exact and finite for every ``u`` (SB3 adds ``1e-6``
    inside the log instead)."""
    return (2.0 * (math.log(2.0) - u - nn.functional.softplus(-2.0 * u))).sum(dim=-1)


def is_box_policy(policy: Any) -> bool:
    """Whether ``policy`` acts in a Box action space (a :class:`GaussianMlpPolicy`)."""
    return isinstance(policy, GaussianMlpPolicy)


class GaussianMlpPolicy(MlpPolicy):
    r"""Diagonal-Gaussian MLP policy for a bounded ``Box`` action space (what ``"MlpPolicy"`` builds on one).

    The MLP (``net_arch``, ``activation_fn``, ``setup`` as :class:`~tpo_gym.agents.policies.MlpPolicy`) maps the
    flattened observation to the mean :math:`\mu(s)` of the ``A = prod(action_space.shape)`` action components;
    ``log_std`` is one state-independent parameter per component. Inherited from ``MlpPolicy`` (hence from
    :class:`~tpo_gym.agents.policies.CategoricalPolicy`): the observation checks of ``predict``, ``save`` /
    ``load`` of the policy alone, the optimiser. The "logits" every method reads
    (:meth:`action_logits`, ``step_logits``, :meth:`stacked_step_logits`) are the distribution's parameters
    ``[..., 2A]``, the mean and then the log standard deviation (so the seed-stacked forward of
    :class:`~tpo_gym.agents.SeedBatch` carries each seed's own ``log_std``); ``n_actions`` is that width, ``2A``.

    ``predict(deterministic=True)`` returns the mean, clipped to the bounds (``squash_output``: squashed into
    them); ``deterministic=False`` a sample, clipped (squashed) the same way, as SB3's ``predict`` does.

    :param observation_space: observation space (Box, Discrete, MultiDiscrete or MultiBinary).
    :param action_space: a bounded ``Box`` of a floating dtype, any shape.
    :param lr_schedule: learning-rate schedule.
    :param net_arch: hidden layer widths of the mean network (default ``[50, 50]``).
    :param activation_fn: activation class (default ``nn.ReLU``).
    :param optimizer_class: optimiser class (default ``torch.optim.Adam``).
    :param optimizer_kwargs: extra optimiser keyword arguments.
    :param setup: ``"tuned"`` (PyTorch initialisation) or ``"reference"`` (Flax defaults), as ``MlpPolicy``.
    :param log_std_init: initial log standard deviation of every component (default 0.0, SB3's: sigma = 1).
    :param squash_output: squash the Gaussian sample into the bounds with ``tanh`` (SB3's ``squash_output``)
        instead of clipping it (default ``False``: clip, as SB3's PPO by default).
    :param length_normalize: sequence-level groups compare episodes by their log-probability divided by their
        length (default ``True``: summed over long episodes, the log-probs of a group's episodes differ by tens of
        nats and TPO's target collapses onto ``p_old``, see the module docstring; ``False``: the summed
        log-probability). Single-sample methods and per-state groups read per-step log-probabilities, which this
        does not change.
    """

    #: Acts in a Box action space (the rollouts dispatch on it: :mod:`tpo_gym.agents.common.box_rollouts`).
    continuous: ClassVar[bool] = True

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        lr_schedule: Schedule,
        net_arch: Sequence[int] = (50, 50),
        activation_fn: type[nn.Module] = nn.ReLU,
        optimizer_class: type[torch.optim.Optimizer] = torch.optim.Adam,
        optimizer_kwargs: dict[str, Any] | None = None,
        setup: str = "tuned",
        log_std_init: float = 0.0,
        squash_output: bool = False,
        length_normalize: bool = True,
    ) -> None:
        setup = check_choice("setup", setup, SETUPS)
        check_box_action_space(action_space, type(self).__name__)
        if not isinstance(observation_space, (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)):
            raise ValueError(f"{type(self).__name__} supports Box, Discrete, MultiDiscrete and MultiBinary "
                             f"observations, got {observation_space}")
        self.log_std_init = check_float("log_std_init", log_std_init, -20.0, 2.0)
        self.length_normalize = check_bool("length_normalize", length_normalize)
        # BasePolicy directly: CategoricalPolicy's constructor takes Discrete actions only
        BasePolicy.__init__(self, observation_space, action_space, optimizer_class=optimizer_class,
                            optimizer_kwargs=optimizer_kwargs, normalize_images=False,
                            squash_output=check_bool("squash_output", squash_output))
        assert isinstance(action_space, spaces.Box)
        self.action_dim = int(np.prod(action_space.shape, dtype=np.int64))
        self.n_actions = 2 * self.action_dim
        self.setup = setup
        self.net_arch = [int(w) for w in net_arch]
        self.activation_fn = activation_fn
        self.net = mlp(int(spaces.flatdim(observation_space)), self.net_arch, activation_fn, self.action_dim, setup)
        self.log_std = nn.Parameter(torch.full((self.action_dim,), self.log_std_init))
        self._low = np.asarray(action_space.low, dtype=np.float64).reshape(-1)
        self._high = np.asarray(action_space.high, dtype=np.float64).reshape(-1)
        self._build_optimizer(lr_schedule)

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        data.update(log_std_init=self.log_std_init, squash_output=self.squash_output,
                    length_normalize=self.length_normalize)
        return data

    # ------------------------------------------------------------------ the distribution
    def split(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mean, log_std)`` of distribution parameters ``[..., 2A]``."""
        return params[..., :self.action_dim], params[..., self.action_dim:]

    def action_logits(self, obs: torch.Tensor) -> torch.Tensor:
        """Distribution parameters ``[N, 2A]``: the mean, then the log standard deviation."""
        x = preprocess_obs(obs, self.observation_space, normalize_images=False)
        mean = self.net(x.to(self.net[0].weight.dtype).reshape(x.shape[0], -1))
        return torch.cat([mean, self.log_std.expand_as(mean)], dim=-1)

    def stacked_step_logits(self, params: dict[str, torch.Tensor], obs: torch.Tensor) -> torch.Tensor:
        """Seed-stacked ``step_logits``: ``obs [S, N, T, *obs_shape]`` -> ``[S, N, T, 2A]``, seed ``s`` with the
        weights ``params[.][s]`` (its ``log_std`` too)."""
        s, n, t = obs.shape[:3]
        x = preprocess_obs(obs.reshape(s * n * t, *obs.shape[3:]), self.observation_space, normalize_images=False)
        x = x.to(params["net.0.weight"].dtype).reshape(s, n * t, -1)
        for i, layer in enumerate(self.net):
            if isinstance(layer, nn.Linear):
                x = stacked_linear(x, params[f"net.{i}.weight"], params.get(f"net.{i}.bias"))
            else:  # the activations: parameter-free and elementwise
                x = layer(x)
        log_std = params["log_std"][:, None, :].expand_as(x)
        return torch.cat([x, log_std], dim=-1).reshape(s, n, t, self.n_actions)

    def sample(self, params: torch.Tensor, k: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """``k`` Gaussian samples per row of ``params [N, 2A]``: ``[N, k, A]`` (before clipping / squashing)."""
        mean, log_std = self.split(params)
        noise = torch.randn((mean.shape[0], k, self.action_dim), generator=generator, dtype=mean.dtype,
                            device=mean.device)
        return mean[:, None] + log_std.exp()[:, None] * noise

    def log_prob(self, params: torch.Tensor, samples: torch.Tensor) -> torch.Tensor:
        """Log-density of ``samples [..., A]`` (Gaussian samples, before clipping / squashing) under the
        parameters ``[..., 2A]`` (broadcast), with the tanh correction when ``squash_output``: ``[...]``."""
        mean, log_std = self.split(params)
        logp = gaussian_log_prob(samples, mean, log_std)
        return logp - tanh_log_abs_det(samples) if self.squash_output else logp

    def to_env_actions(self, samples: torch.Tensor) -> np.ndarray:
        """The actions the env gets for Gaussian ``samples [..., A]``: clipped to the bounds (``squash_output``:
        ``low + (tanh(u) + 1)(high - low) / 2``), ``[..., *action_shape]`` in the space's dtype."""
        u = samples.detach().cpu().to(torch.float64).numpy()
        if self.squash_output:
            a = self._low + (np.tanh(u) + 1.0) * 0.5 * (self._high - self._low)
        else:
            a = u
        a = np.clip(a, self._low, self._high)  # squashed values too: tanh rounds to +-1 in float32
        return a.reshape(*a.shape[:-1], *self.action_space.shape).astype(self.action_space.dtype)

    def batch_log_probs(self, params: torch.Tensor, batch: Any) -> torch.Tensor:
        """Log-probs of a rollout batch under the step parameters ``params [N, T, 2A]``: ``[N, T, K]`` of the
        per-state candidates (``batch.candidates`` ``[N, T, K, A]``), else ``[N, T]`` of the actions taken."""
        if batch.candidates is not None:
            return self.log_prob(params.unsqueeze(2), batch.candidates)
        return self.log_prob(params, batch.actions)

    # ------------------------------------------------------------------ predict
    def predict(
        self,
        observation: np.ndarray | dict[str, np.ndarray],
        state: tuple[np.ndarray, ...] | None = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = False,
    ) -> tuple[np.ndarray, tuple[np.ndarray, ...] | None]:
        """SB3's ``predict`` after the observation checks: actions clipped to the bounds (``squash_output``:
        squashed into them)."""
        if is_empty_batch(observation, self.observation_space):
            return np.zeros((0, *self.action_space.shape), dtype=self.action_space.dtype), state
        return super().predict(observation, state, episode_start, deterministic)

    def _predict(self, observation: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        params = self.action_logits(observation)
        u = self.split(params)[0] if deterministic else self.sample(params, 1)[:, 0]
        return torch.tanh(u) if self.squash_output else u  # SB3's predict clips, or rescales [-1, 1]


# --------------------------------------------------------------------------------------------
# checks
# --------------------------------------------------------------------------------------------
def check_box_action_space(space: spaces.Space, who: str) -> None:
    """Raise ``ValueError`` unless ``space`` is a ``Box`` with finite bounds and a floating dtype."""
    if not isinstance(space, spaces.Box):
        raise ValueError(f"{who} needs a Box action space, got {space}")
    if not np.issubdtype(space.dtype, np.floating):
        raise ValueError(f"{who}: the Box action space {space} has dtype {space.dtype}; the Gaussian policy samples "
                         "real-valued actions, so a Box action space needs a floating dtype (float32 or float64). For "
                         "integer actions use a Discrete action space")
    low, high = np.asarray(space.low), np.asarray(space.high)
    if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high))):
        raise ValueError(f"{who}: the Box action space {space} is unbounded (low={low.tolist()}, "
                         f"high={high.tolist()}); the Gaussian policy clips its actions to the bounds (or squashes "
                         "into them with squash_output=True), so every bound must be finite: give the space finite "
                         "low and high "
                         "(e.g. gymnasium.wrappers.RescaleAction of a bounded space)")


def check_box_agent(agent: Any, space: spaces.Space, policy_class: Any) -> None:
    """Raise ``ValueError`` where the agent ``agent`` cannot train on the Box action space ``space``: an unbounded
    or integer Box, a policy other than ``"MlpPolicy"`` (:class:`GaussianMlpPolicy`), and the options that score
    every action of a Discrete space (the CE oracle, ``candidates="single"``, ``baseline="expected"``).

    :param policy_class: the agent's policy class (``"MlpPolicy"`` resolved to :class:`~tpo_gym.agents.MlpPolicy`).
    """
    who = type(agent).__name__
    check_box_action_space(space, who)
    if policy_class is not MlpPolicy and not (isinstance(policy_class, type)
                                              and issubclass(policy_class, GaussianMlpPolicy)):
        name = getattr(policy_class, "__name__", policy_class)
        raise ValueError(f"{who}: a Box action space needs policy='MlpPolicy' (a diagonal-Gaussian MLP, "
                         f"GaussianMlpPolicy), got {name}")
    if agent.sampling == "oracle":
        raise ValueError(f"{who} (the supervised oracle) scores every action of a Discrete action space; "
                         f"{space} is continuous")
    if getattr(agent, "candidates", "sampled") == "single":
        raise ValueError(f"{who}(candidates='single') scores every action of a Discrete action space; on the Box "
                         f"{space} use candidates='sampled' (K rollouts per context at level='sequence')")
    if getattr(agent, "baseline", "batch") == "expected":
        raise ValueError(f"{who}(baseline='expected') sums pi_old over the actions of a Discrete action space; on "
                         f"the Box {space} use baseline='batch'")


# --------------------------------------------------------------------------------------------
# the view: what the objectives read
# --------------------------------------------------------------------------------------------
def box_view(kind: str, logp: torch.Tensor, batch: Any, length_normalize: bool) -> torch.Tensor:
    """:func:`~tpo_gym.agents.common.grouping.view` for Box actions, from the log-densities of the batch's own actions.

    ``logp`` is ``[N, T, K]`` for per-state candidates (``kind="candidates"``: returned as it is) and ``[N, T]`` of
    the actions taken otherwise: ``"none"`` gives it with 0 at invalid steps; ``"rollouts"`` gives the
    ``[B, K]`` episode log-probs, the sum over valid steps, divided by the episode length with
    ``length_normalize``.
    """
    if kind == "candidates":
        return logp
    if kind not in ("rollouts", "none"):
        raise ValueError(f"a {kind!r} grouping scores every action of a Discrete action space; not for Box actions")
    if batch.step_mask is not None:
        logp = torch.where(batch.step_mask, logp, torch.zeros_like(logp))
    if kind == "none":
        return logp
    episode = logp.sum(dim=1)
    if length_normalize:
        episode = episode / batch.lengths.to(episode.dtype).clamp(min=1)
    return episode.reshape(-1, batch.group_size)
