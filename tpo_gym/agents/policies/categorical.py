"""Policies of the tpo-gym agents: the categorical policy base and the MLP (bandits, MNIST).

Both are Stable-Baselines3 :class:`~stable_baselines3.common.policies.BasePolicy` subclasses, so
``model.predict``, ``model.policy.save`` and SB3's evaluation helpers work unchanged. A policy maps
observations to the logits of a categorical distribution over a ``Discrete`` action space; the
agents only need two methods:

* :meth:`CategoricalPolicy.action_logits` -- ``[N, *obs_shape] -> [N, n_actions]`` for a batch of
  states (used while collecting rollouts);
* :meth:`CategoricalPolicy.step_logits` -- ``[N, T, *obs_shape] -> [N, T, n_actions]`` for whole
  trajectories (used in the update).

This module also holds the observation checks of ``predict`` (:func:`check_observations`) and the
seed-stacked ``Linear`` shared by the policies. The optimiser is built by the policy (SB3 convention:
``policy.optimizer``). The causal transformer of the token tasks lives in :mod:`tpo_gym.agents.policies.transformer`
and its optimiser :class:`MuonAdamW` in :mod:`tpo_gym.agents.policies.optimizers`; both are re-exported here, so
``tpo_gym.agents.policies.TransformerPolicy`` (in code and in saved files) keeps working.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.preprocessing import preprocess_obs
from stable_baselines3.common.type_aliases import Schedule
from torch import nn

from tpo_gym._io import atomic_writer
from tpo_gym.agents.files import serialization

__all__ = ["CategoricalPolicy", "MlpPolicy", "check_observations", "is_empty_batch", "stacked_linear", "mlp", "SETUPS"]

#: The transformer's named setups: this project's PyTorch port, and the reference code's.
SETUPS = ("tuned", "reference")


# --------------------------------------------------------------------------------------------
# observations
# --------------------------------------------------------------------------------------------
def check_observations(observation: Any, space: spaces.Space) -> None:
    """Raise ``ValueError`` unless ``observation`` is one element of ``space`` or a batch of them.

    Vectorised for ``Box``, ``Discrete``, ``MultiDiscrete`` and ``MultiBinary``; other spaces are
    checked element by element with ``space.contains``.
    """
    if isinstance(observation, dict):
        raise ValueError("dict observations are not supported by the tpo_gym policies")
    arr = np.asarray(observation)
    shape = tuple(space.shape or ())
    if arr.shape == shape:
        batch = arr.reshape(1, *shape)
    elif arr.ndim == len(shape) + 1 and arr.shape[1:] == shape:
        batch = arr
    else:
        raise ValueError(f"observation has shape {arr.shape}; expected {shape} or (n_envs, *{shape}) for {space}")
    if isinstance(space, (spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)):
        if arr.dtype == np.bool_ and not isinstance(space, spaces.MultiBinary):
            raise ValueError(f"observation must hold integers of {space}, got booleans")
        if not (np.issubdtype(arr.dtype, np.integer) or arr.dtype == np.bool_):
            raise ValueError(f"observation must have an integer dtype for {space}, got dtype {arr.dtype}")
        if isinstance(space, spaces.Discrete):
            lo, hi = int(space.start), int(space.start) + int(space.n) - 1
        elif isinstance(space, spaces.MultiDiscrete):
            lo, hi = np.asarray(space.start), np.asarray(space.start) + np.asarray(space.nvec) - 1
        else:
            lo, hi = 0, 1
        bad = (batch < lo) | (batch > hi)
        if bad.any():
            where = np.argwhere(bad)[0]
            value = batch[tuple(where)]
            raise ValueError(
                f"observation value {value} at index {tuple(int(i) for i in where)} is outside {space} "
                f"(allowed {np.broadcast_to(lo, bad.shape[1:])[tuple(where[1:])]}.."
                f"{np.broadcast_to(hi, bad.shape[1:])[tuple(where[1:])]})"
            )
        return
    if isinstance(space, spaces.Box):
        if not np.issubdtype(arr.dtype, np.number):
            raise ValueError(f"observation must be numeric for {space}, got dtype {arr.dtype}")
        if not np.isfinite(batch).all():
            raise ValueError("observation contains NaN or inf")
        if (batch < space.low).any() or (batch > space.high).any():
            raise ValueError(f"observation lies outside the bounds of {space}")
        return
    for i, row in enumerate(batch):
        if not space.contains(row):
            raise ValueError(f"observation {i} is not in {space}")


def is_empty_batch(observation: Any, space: spaces.Space) -> bool:
    """Whether ``observation`` is a batch of no observations of ``space``: shape ``(0, *space.shape)``
    (any dtype: there is no value to check), or an empty list."""
    if isinstance(observation, dict):
        return False
    try:
        shape = np.shape(observation)
    except ValueError:  # ragged: not a batch at all (check_observations says so)
        return False
    return shape == (0,) or shape == (0, *(space.shape or ()))


# --------------------------------------------------------------------------------------------
# seed-stacked primitives: weights with a leading seed dimension S (tpo_gym.agents.common.seed_batch)
# --------------------------------------------------------------------------------------------
def stacked_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``y[s] = x[s] W[s]^T + b[s]``: ``x`` ``[S, M, in]``, ``weight`` ``[S, out, in]``, ``bias`` ``[S, out]``."""
    if bias is None:
        return torch.bmm(x, weight.transpose(1, 2))
    return torch.baddbmm(bias.unsqueeze(1), x, weight.transpose(1, 2))



# --------------------------------------------------------------------------------------------
# base
# --------------------------------------------------------------------------------------------
def mlp(in_dim: int, net_arch: list[int], activation_fn: type[nn.Module], out_dim: int, setup: str) -> nn.Sequential:
    """The MLP of :class:`MlpPolicy` (and of the Gaussian head's mean): ``Linear`` + activation per width of
    ``net_arch``, then a ``Linear`` to ``out_dim``; PyTorch's initialisation, or the reference code's
    (:func:`~tpo_gym.agents.policies.reference_setup.flax_dense_init_`) with ``setup="reference"``.

    :raises ValueError: a width below 1.
    """
    if any(w < 1 for w in net_arch):
        raise ValueError(f"net_arch widths must be >= 1, got {list(net_arch)}")
    layers: list[nn.Module] = []
    for width in net_arch:
        layers += [nn.Linear(in_dim, width), activation_fn()]
        in_dim = width
    layers.append(nn.Linear(in_dim, out_dim))
    net = nn.Sequential(*layers)
    if setup == "reference":
        from tpo_gym.agents.policies.reference_setup import flax_dense_init_

        flax_dense_init_(net)
    return net


class CategoricalPolicy(BasePolicy):
    """A policy with a categorical distribution over a ``Discrete`` action space.

    :param observation_space: observation space.
    :param action_space: a ``Discrete`` action space.
    :param lr_schedule: learning-rate schedule (SB3 convention); the initial value builds the optimiser.
    :param optimizer_class: optimiser class.
    :param optimizer_kwargs: extra optimiser keyword arguments.
    """

    #: Whether :meth:`step_logits` takes ``group_size`` (rows of a group share a prefix it computes once).
    shares_group_prefix: ClassVar[bool] = False

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        lr_schedule: Schedule,
        optimizer_class: type[torch.optim.Optimizer] = torch.optim.Adam,
        optimizer_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if not isinstance(action_space, spaces.Discrete):
            raise ValueError(f"{type(self).__name__} needs a Discrete action space, got {action_space}")
        super().__init__(
            observation_space,
            action_space,
            optimizer_class=optimizer_class,
            optimizer_kwargs=optimizer_kwargs,
            normalize_images=False,
        )
        self.n_actions = int(action_space.n)

    def predict(
        self,
        observation: np.ndarray | dict[str, np.ndarray],
        state: tuple[np.ndarray, ...] | None = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = False,
    ) -> tuple[np.ndarray, tuple[np.ndarray, ...] | None]:
        """SB3's ``predict`` after checking that every observation lies in the observation space.

        :raises ValueError: for observations of the wrong shape or dtype, NaN / inf values, token ids
            or categories out of range, or values outside a ``Box``'s bounds.
        """
        if is_empty_batch(observation, self.observation_space):  # no observations: no actions, shape [0]
            return np.zeros((0, *self.action_space.shape), dtype=np.int64), state
        check_observations(observation, self.observation_space)
        return super().predict(observation, state, episode_start, deterministic)

    def save(self, path: str) -> None:
        """Save the policy alone: weights and plain-data settings, read back by :meth:`load` with
        ``torch.load(weights_only=True)`` (SB3's own ``BasePolicy.load`` unpickles; this never does)."""

        data = self._get_constructor_parameters()
        settings = {
            "class": type(self).__name__,
            "observation_space": serialization.space_to_data(data.pop("observation_space")),
            "action_space": serialization.space_to_data(data.pop("action_space")),
            "kwargs": serialization.encode_value(
                {k: v for k, v in data.items() if k not in ("normalize_images", "lr_schedule")}, "kwargs"),
        }
        payload = {"state_dict": self.state_dict(), "tpo_gym_policy": json.dumps(settings)}
        if isinstance(path, (str, os.PathLike)):
            with atomic_writer(path) as fh:  # exclusive temp file + rename: a planted link is never followed
                torch.save(payload, fh)
        else:
            torch.save(payload, path)

    @classmethod
    def load(cls, path: str, device: torch.device | str = "auto") -> CategoricalPolicy:  # type: ignore[override]
        """Load a policy written by :meth:`save`, executing nothing from the file."""
        from stable_baselines3.common.utils import get_device


        try:
            saved = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - pickled payloads are refused here
            raise serialization.AgentFileError(
                f"{path!r} is not a tpo-gym policy file of plain tensors ({exc})"
            ) from None
        if not isinstance(saved, dict) or "tpo_gym_policy" not in saved:
            raise serialization.AgentFileError(f"{path!r} is not a tpo-gym policy file")
        settings = json.loads(saved["tpo_gym_policy"])
        serialization.check_plain(settings, "policy settings")
        if settings.get("class") != cls.__name__:
            raise serialization.AgentFileError(f"{path!r} holds a {settings.get('class')}, not a {cls.__name__}")
        kwargs = serialization.decode_value(settings.get("kwargs", {}), "kwargs")
        policy = cls(serialization.space_from_data(settings["observation_space"], "observation_space"),
                     serialization.space_from_data(settings["action_space"], "action_space"),
                     lambda _: 0.0, **kwargs)
        policy.load_state_dict(saved["state_dict"])
        return policy.to(get_device(device))

    def _build_optimizer(self, lr_schedule: Schedule) -> None:
        self.optimizer = self.optimizer_class(self.parameters(), lr=lr_schedule(1), **self.optimizer_kwargs)

    def action_logits(self, obs: torch.Tensor) -> torch.Tensor:
        """Logits ``[N, n_actions]`` for a batch of observations ``[N, *obs_shape]``."""
        raise NotImplementedError

    def rollout_decoder(self, lockstep: bool = False) -> Callable[[torch.Tensor], torch.Tensor]:
        """An ``obs -> logits`` function for the steps of one batch of episodes (may keep a cache).

        ``lockstep=True`` promises that it is called on steps 0, 1, 2, ... of episodes that all move
        together (the on-device envs), so a decoder may count the step instead of reading it from ``obs``.
        """
        return self.action_logits

    def step_logits(self, obs: torch.Tensor) -> torch.Tensor:
        """Logits ``[N, T, n_actions]`` for trajectories of observations ``[N, T, *obs_shape]``."""
        n, t = obs.shape[:2]
        return self.action_logits(obs.reshape(n * t, *obs.shape[2:])).reshape(n, t, self.n_actions)

    def stacked_step_logits(self, params: dict[str, torch.Tensor], obs: torch.Tensor) -> torch.Tensor:
        """:meth:`step_logits` of S models of this architecture at once: ``params`` maps each name of
        ``named_parameters()`` to the S seeds' values stacked ``[S, *shape]``; ``obs``
        ``[S, N, T, *obs_shape]`` -> logits ``[S, N, T, n_actions]`` (seed ``s`` with weights ``params[.][s]``).
        """
        raise NotImplementedError(f"{type(self).__name__} has no seed-stacked forward")

    def stacked_rollout_decoder(self, params: dict[str, torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
        """An ``obs [S, N, *obs_shape] -> logits [S, N, n_actions]`` function of S models for one rollout
        (default: :meth:`stacked_step_logits` on each step's observations)."""
        return lambda obs: self.stacked_step_logits(params, obs.unsqueeze(2))[:, :, 0]

    def forward(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        """Actions for a batch of observations: the argmax (``deterministic``) or a sample."""
        return self._predict(obs, deterministic)

    def _predict(self, observation: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        logits = self.action_logits(observation)
        if deterministic:
            return logits.argmax(dim=-1)
        return torch.distributions.Categorical(logits=logits).sample()


# --------------------------------------------------------------------------------------------
# MLP
# --------------------------------------------------------------------------------------------
class MlpPolicy(CategoricalPolicy):
    """Multi-layer perceptron over the (flattened, preprocessed) observation: 784-50-50-10 ReLU on MNIST.

    Observations go through SB3's ``preprocess_obs`` (``Discrete`` / ``MultiDiscrete`` one-hot,
    ``Box`` as float), are flattened and fed to ``Linear``-``activation`` layers of widths
    ``net_arch`` and a linear head with one logit per action. Default optimiser: Adam (lr from the
    agent, 1e-3 by default), as the paper's MNIST runs.

    :param observation_space: observation space (Box, Discrete or MultiDiscrete).
    :param action_space: a ``Discrete`` action space.
    :param lr_schedule: learning-rate schedule.
    :param net_arch: hidden layer widths (default ``[50, 50]``).
    :param activation_fn: activation class (default ``nn.ReLU``).
    :param optimizer_class: optimiser class (default ``torch.optim.Adam``).
    :param optimizer_kwargs: extra optimiser keyword arguments.
    :param setup: ``"tuned"`` (default: PyTorch's ``Linear`` initialisation) or ``"reference"``
        (the reference code's Flax defaults, docs/method.md section 4b: LeCun-normal kernels, zero biases).
    """

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
    ) -> None:
        from tpo_gym._validation import check_choice

        setup = check_choice("setup", setup, SETUPS)
        if not isinstance(observation_space, (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)):
            raise ValueError(
                f"MlpPolicy supports Box, Discrete, MultiDiscrete and MultiBinary observations, got {observation_space}"
            )
        super().__init__(observation_space, action_space, lr_schedule, optimizer_class, optimizer_kwargs)
        self.setup = setup
        self.net_arch = [int(w) for w in net_arch]
        self.activation_fn = activation_fn
        self.net = mlp(int(spaces.flatdim(observation_space)), self.net_arch, activation_fn, self.n_actions, setup)
        self._build_optimizer(lr_schedule)

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        data.update(net_arch=self.net_arch, activation_fn=self.activation_fn, setup=self.setup)
        return data

    def action_logits(self, obs: torch.Tensor) -> torch.Tensor:
        """Logits ``[N, n_actions]``."""
        x = preprocess_obs(obs, self.observation_space, normalize_images=False)
        return self.net(x.to(self.net[0].weight.dtype).reshape(x.shape[0], -1))

    def stacked_step_logits(self, params: dict[str, torch.Tensor], obs: torch.Tensor) -> torch.Tensor:
        """Seed-stacked :meth:`step_logits` (see :meth:`CategoricalPolicy.stacked_step_logits`)."""
        s, n, t = obs.shape[:3]
        x = preprocess_obs(obs.reshape(s * n * t, *obs.shape[3:]), self.observation_space, normalize_images=False)
        x = x.to(params["net.0.weight"].dtype).reshape(s, n * t, -1)
        for i, layer in enumerate(self.net):
            if isinstance(layer, nn.Linear):
                x = stacked_linear(x, params[f"net.{i}.weight"], params.get(f"net.{i}.bias"))
            else:  # the activations: parameter-free and elementwise
                x = layer(x)
        return x.reshape(s, n, t, self.n_actions)
