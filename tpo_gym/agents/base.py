"""The shared base of every tpo-gym agent, on Stable-Baselines3's ``BaseAlgorithm`` (the ARS route).

An iteration ("episode" in the paper's sense) is::

    batch = collect_rollouts(pi_old)               # B contexts; K candidates or K rollouts each
    fixed = self.prepare(batch)                    # targets / advantages, frozen (+ diagnostics)
    for epoch in range(n_epochs):                  # full-batch optimiser steps
        loss = self.compute_loss(batch, fixed, log pi_theta)
        optimizer step

Subclasses supply only :meth:`prepare` and :meth:`compute_loss`, each a few lines that call the
objectives of :mod:`tpo_gym.objectives`, plus their defaults. Everything else (rollouts, logging,
callbacks, save / load, reproducibility) lives here.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from typing import Any, ClassVar, TypeVar

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.type_aliases import GymEnv, MaybeCallback, Schedule
from stable_baselines3.common.utils import FloatSchedule, configure_logger, safe_mean
from stable_baselines3.common.vec_env import DummyVecEnv

from tpo_gym.agents.policies import CategoricalPolicy, MlpPolicy, TransformerPolicy
from tpo_gym.agents.sampling import RolloutBatch, RolloutEnv, collect_rollouts, copy_factory, make_rollout_env

__all__ = ["GroupAlgorithm"]

SelfGroupAlgorithm = TypeVar("SelfGroupAlgorithm", bound="GroupAlgorithm")

LEVELS = ("auto", "token", "sequence")
BUDGETS = ("prompt", "interaction")


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _check_positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    if not math.isfinite(float(value)) or float(value) <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _check_choice(name: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")
    return str(value)


class _ScaledSchedule:
    """``schedule(progress) * scale`` (picklable; used for the interaction-matched ``lr * sqrt(K)``)."""

    def __init__(self, schedule: Schedule, scale: float) -> None:
        self.schedule, self.scale = schedule, scale

    def __call__(self, progress_remaining: float) -> float:
        return float(self.schedule(progress_remaining)) * self.scale


def _single_env(env: GymEnv) -> gym.Env[Any, Any] | None:
    """The first underlying gymnasium env of ``env`` (a ``DummyVecEnv`` or an env), if reachable."""
    if isinstance(env, DummyVecEnv):
        return env.envs[0]
    if isinstance(env, gym.Env):
        return env
    return None


def inherit_param_docs(cls: type) -> type:
    """Class decorator: append the ``:param:`` lines of :class:`GroupAlgorithm` that ``cls`` lacks.

    Only parameters of ``cls.__init__`` are added, so every agent documents its whole constructor.
    """
    import inspect
    import re

    own = cls.__doc__ or ""
    names = set(inspect.signature(cls.__init__).parameters) - {"self", "args", "kwargs"}
    base_doc = inspect.cleandoc(GroupAlgorithm.__doc__ or "")
    blocks = re.findall(r"(:param (\w+):.*?)(?=\n:param |\Z)", base_doc, flags=re.S)
    extra = [
        "    " + text.strip().replace("\n", "\n    ")
        for text, name in blocks
        if name in names and f":param {name}:" not in own
    ]
    if extra:
        cls.__doc__ = own.rstrip() + "\n" + "\n".join(extra) + "\n"
    return cls


class GroupAlgorithm(BaseAlgorithm):
    """Base of TPO, GRPO, Group PG, PPO, REINFORCE, DG and the CE oracle (not used directly).

    :param policy: ``"MlpPolicy"``, ``"TransformerPolicy"`` or a :class:`CategoricalPolicy` subclass.
    :param env: a Gymnasium env instance or a registered id (``"tpo_gym/TokenReversal-v0"``); its
        action space must be ``Discrete``. Rollouts run in ``gym.make_vec`` copies of it
        (``vector_entry_point`` for tpo_gym envs).
    :param learning_rate: learning rate (float or SB3 schedule of the remaining progress).
    :param batch_size: B, contexts (prompts, images) per iteration.
    :param group_size: K, candidates per context (group methods) or the interaction multiplier
        (single-sample methods with ``budget="interaction"``).
    :param n_epochs: E, full-batch optimiser steps per batch.
    :param level: ``"token"`` (each state is a group of K candidate actions scored by the env's group
        API; for one-step tasks: K candidates per context), ``"sequence"`` (K complete rollouts per
        context, score = mean per-step reward, terminal: 0/1 exact match), or ``"auto"`` (token when the
        env has the group API, else sequence). Group methods only.
    :param budget: ``"prompt"`` (every method sees B contexts) or ``"interaction"`` (single-sample
        methods see B*K contexts and use ``learning_rate * sqrt(K)``; no effect on group methods).
    :param max_grad_norm: clip the gradient to this global L2 norm; ``None`` (default): no clipping.
    :param n_threads: torch CPU threads during ``learn`` (restored afterwards). Default 1: these models
        are tiny, and one thread is fastest (more threads only add OpenMP synchronisation, which
        is many times slower on a busy machine). ``None`` keeps torch's setting.
    :param stats_window_size: SB3 window of the episode statistics.
    :param tensorboard_log: tensorboard log dir, or ``None``.
    :param policy_kwargs: keyword arguments of the policy (``net_arch``, ``optimizer_class``,
        ``optimizer_kwargs``, ``d_model``, ...).
    :param verbose: 0 silent, 1 training logs, 2 debug.
    :param seed: seed of the initialisation, the env resets and the action draws.
    :param device: torch device (default ``"cpu"``: these models are small).
    :param _init_setup_model: build the networks (``False`` is used by ``load``).
    """

    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {
        "MlpPolicy": MlpPolicy,
        "TransformerPolicy": TransformerPolicy,
    }
    #: "group": K candidates / rollouts per context; "single": one behaviour trajectory per context;
    #: "oracle": every action scored (CE).
    sampling: ClassVar[str] = "group"
    policy: CategoricalPolicy

    def __init__(
        self,
        policy: str | type[CategoricalPolicy],
        env: GymEnv | str | None,
        learning_rate: float | Schedule = 1e-3,
        batch_size: int = 100,
        group_size: int = 8,
        n_epochs: int = 4,
        level: str = "auto",
        budget: str = "prompt",
        max_grad_norm: float | None = None,
        n_threads: int | None = 1,
        stats_window_size: int = 100,
        tensorboard_log: str | None = None,
        policy_kwargs: dict[str, Any] | None = None,
        verbose: int = 0,
        seed: int | None = None,
        device: torch.device | str = "cpu",
        _init_setup_model: bool = True,
    ) -> None:
        self.batch_size = _check_int("batch_size", batch_size, 1)
        self.group_size = _check_int("group_size", group_size, 1)
        self.n_epochs = _check_int("n_epochs", n_epochs, 1)
        self.level = _check_choice("level", level, LEVELS)
        self.budget = _check_choice("budget", budget, BUDGETS)
        if not callable(learning_rate):
            _check_positive("learning_rate", learning_rate)
        if max_grad_norm is not None:
            max_grad_norm = _check_positive("max_grad_norm", max_grad_norm)
        self.max_grad_norm = max_grad_norm
        self.n_threads = None if n_threads is None else _check_int("n_threads", n_threads, 1)
        if isinstance(policy, str) and policy not in self.policy_aliases:
            raise ValueError(f"unknown policy alias {policy!r}; allowed: {sorted(self.policy_aliases)} or a class")
        if isinstance(env, str):
            env = gym.make(env)
        if env is not None:
            self._check_env(env)
        self._env_spec: Any = None
        self._env_native = False
        super().__init__(
            policy=policy,
            env=env,
            learning_rate=learning_rate,
            policy_kwargs=policy_kwargs,
            stats_window_size=stats_window_size,
            tensorboard_log=tensorboard_log,
            verbose=verbose,
            device=device,
            support_multi_env=True,
            seed=seed,
        )
        self._base_seed = int(seed) if seed is not None else int(np.random.SeedSequence().entropy % (2**62))
        self._iteration = 0
        self.history: list[dict[str, float]] = []
        self._rollout_env: RolloutEnv | None = None
        self.rollout_batch: RolloutBatch | None = None
        self._record_env()
        if self.env is not None and self.level == "auto":
            self.level = "token" if self._env_native else "sequence"
        if self.env is not None and self._groups_of_candidates() and self.level == "token" and not self._env_native:
            raise ValueError(
                "level='token' needs an env with the tpo_gym group API (score_candidates); this env has none: "
                "use level='sequence' (K same-seed rollouts per context)"
            )
        if _init_setup_model:
            self._setup_model()

    # ------------------------------------------------------------------------------------------
    # env handling
    # ------------------------------------------------------------------------------------------
    def _check_env(self, env: GymEnv) -> None:
        """Raise ``ValueError`` for spaces the agents do not support."""
        action_space = env.action_space
        single = _single_env(env)
        if not isinstance(action_space, spaces.Discrete):
            raise ValueError(
                f"{type(self).__name__} supports only Discrete action spaces, got {action_space} "
                "(for continuous actions use Stable-Baselines3's PPO/SAC)"
            )
        if isinstance(env.observation_space, (spaces.Dict, spaces.Tuple)):
            space = type(env.observation_space).__name__
            raise ValueError(f"{type(self).__name__} does not support {space} observations (use Box or Discrete)")
        if self.sampling == "oracle" and (single is None or not hasattr(single.unwrapped, "score_candidates")):
            raise ValueError("CE (the supervised oracle) needs an env with the tpo_gym group API (score_candidates)")

    def _record_env(self) -> None:
        """Remember how to rebuild the env for rollouts (its spec, or copies of the instance)."""
        if self.env is None:
            return
        single = _single_env(self.env)
        inner = single.unwrapped if single is not None else None
        self._env_native = inner is not None and hasattr(inner, "score_candidates")
        spec = getattr(single, "spec", None) if single is not None else None
        if spec is not None:  # drop SB3's Monitor: rollouts do their own bookkeeping
            kept = tuple(w for w in spec.additional_wrappers if w.name != "Monitor")
            spec = dataclasses.replace(spec, additional_wrappers=kept)
        self._env_spec = spec
        self._env_factory = copy_factory(inner) if (self._env_spec is None and inner is not None) else None
        self._rollout_env = None

    def set_env(self, env: GymEnv, force_reset: bool = True) -> None:
        """Use a new env (same spaces); rollouts are rebuilt from it."""
        self._check_env(env)
        super().set_env(env, force_reset=force_reset)
        self._record_env()

    @property
    def n_rollouts(self) -> int:
        """Episodes rolled out per iteration: B, or B*K (sequence level; interaction budget)."""
        if self._groups_of_candidates() and self.level == "sequence":
            return self.batch_size * self.group_size
        if self.sampling == "single" and self.budget == "interaction":
            return self.batch_size * self.group_size
        return self.batch_size

    def _get_rollout_env(self) -> RolloutEnv:
        if self._rollout_env is None or self._rollout_env.num_envs != self.n_rollouts:
            if self._env_spec is None and getattr(self, "_env_factory", None) is None:
                raise ValueError("no env: pass one to the constructor, to load(), or call set_env() first")
            self._rollout_env = make_rollout_env(self._env_spec, self.n_rollouts, getattr(self, "_env_factory", None))
        return self._rollout_env

    @property
    def steps_per_iteration(self) -> int:
        """Env timesteps one iteration consumes: rollouts x episode length.

        Exact for fixed-length envs (every tpo_gym env: token tasks H, bandits and MNIST 1), so
        ``learn(total_timesteps=n * model.steps_per_iteration)`` runs exactly ``n`` iterations. For
        other envs it is the upper bound ``n_rollouts * max_episode_steps``. Scored candidates are
        not env steps.
        """
        return self.n_rollouts * self._get_rollout_env().horizon

    # ------------------------------------------------------------------------------------------
    # model
    # ------------------------------------------------------------------------------------------
    def _get_policy_from_name(self, policy_name: str) -> type[BasePolicy]:
        if policy_name not in self.policy_aliases:
            raise ValueError(f"unknown policy alias {policy_name!r}; allowed: {sorted(self.policy_aliases)} or a class")
        return self.policy_aliases[policy_name]

    @property
    def lr_scale(self) -> float:
        """``sqrt(K)`` for single-sample methods under the interaction budget, else 1."""
        if self.sampling == "single" and self.budget == "interaction":
            return math.sqrt(self.group_size)
        return 1.0

    def _setup_lr_schedule(self) -> None:
        self.lr_schedule = _ScaledSchedule(FloatSchedule(self.learning_rate), self.lr_scale)

    def _setup_model(self) -> None:
        self._setup_lr_schedule()
        self.set_random_seed(self.seed)
        self.policy = self.policy_class(  # type: ignore[assignment]
            self.observation_space, self.action_space, self.lr_schedule, **self.policy_kwargs
        )
        self.policy = self.policy.to(self.device)
        if self.env is not None:
            self._record_env()

    def set_random_seed(self, seed: int | None = None) -> None:
        """Seed python, numpy and torch (initialisation) and this agent's rollouts."""
        if seed is None:
            return
        super().set_random_seed(seed)
        self._base_seed = int(seed)
        self.seed = seed

    def _excluded_save_params(self) -> list[str]:
        return [*super()._excluded_save_params(), "_rollout_env", "rollout_batch", "_env_factory"]

    def _get_torch_save_params(self) -> tuple[list[str], list[str]]:
        return ["policy", "policy.optimizer"], []

    # ------------------------------------------------------------------------------------------
    # one iteration
    # ------------------------------------------------------------------------------------------
    def _iteration_seed(self, iteration: int) -> int:
        """The seed of iteration ``iteration``: a function of the agent's seed and the index only."""
        return int(np.random.SeedSequence([self._base_seed, iteration]).generate_state(1, np.uint64)[0] >> 2)

    def collect_rollouts(self) -> RolloutBatch:
        """Collect the batch of the current iteration with the current policy (pi_old)."""
        group = self._groups_of_candidates()
        return collect_rollouts(
            self.policy,
            self._get_rollout_env(),
            seed=self._iteration_seed(self._iteration),
            n_candidates=self.group_size if (group and self.level == "token") else 0,
            score_all_actions=self.sampling == "oracle",
            group_size=self.group_size if (group and self.level == "sequence") else 1,
        )

    def _groups_of_candidates(self) -> bool:
        """Whether the method samples K candidates (per state) or K rollouts (per context)."""
        return self.sampling == "group"

    def prepare(self, batch: RolloutBatch) -> tuple[dict[str, Any], dict[str, float]]:
        """Frozen quantities of the update (targets, advantages) and diagnostics of the batch."""
        raise NotImplementedError

    def compute_loss(self, batch: RolloutBatch, fixed: dict[str, Any], logp: torch.Tensor) -> torch.Tensor:
        """The objective for the current log-probabilities ``logp`` ``[N, T, n_actions]``."""
        raise NotImplementedError

    def train(self) -> dict[str, float]:
        """Update the policy on ``self.rollout_batch``: ``n_epochs`` full-batch optimiser steps."""
        batch = self.rollout_batch
        if batch is None:
            raise RuntimeError("no rollout batch: call collect_rollouts() first")
        self.policy.set_training_mode(True)
        if not hasattr(self, "_logger"):  # train() called outside learn()
            self._logger = configure_logger(0)
        self._update_learning_rate(self.policy.optimizer)
        fixed, diagnostics = self.prepare(batch)
        optimizer = self.policy.optimizer
        params = [p for p in self.policy.parameters() if p.requires_grad]
        first_loss = last_loss = grad_norm = float("nan")
        for epoch in range(self.n_epochs):
            logp = torch.log_softmax(self.policy.step_logits(batch.obs), dim=-1)
            loss = self.compute_loss(batch, fixed, logp)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if epoch == 0:
                grads = [p.grad.reshape(-1) for p in params if p.grad is not None]
                grad_norm = float(torch.linalg.vector_norm(torch.cat(grads))) if grads else 0.0
                first_loss = float(loss.detach())
            if self.max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
            optimizer.step()
            last_loss = float(loss.detach())
        self._n_updates += self.n_epochs
        return {"loss": first_loss, "final_loss": last_loss, "grad_norm": grad_norm, **diagnostics}

    # ------------------------------------------------------------------------------------------
    # learn
    # ------------------------------------------------------------------------------------------
    def _setup_learn(
        self,
        total_timesteps: int,
        callback: MaybeCallback = None,
        reset_num_timesteps: bool = True,
        tb_log_name: str = "run",
        progress_bar: bool = False,
    ) -> tuple[int, BaseCallback]:
        # SB3's version also resets self.env; rollouts here use their own vector env.
        self.start_time = time.time_ns()
        if reset_num_timesteps:
            self.num_timesteps = 0
            self._episode_num = 0
            self._iteration = 0
            self.history = []
        else:
            total_timesteps += self.num_timesteps
        self._total_timesteps = total_timesteps
        self._num_timesteps_at_start = self.num_timesteps
        if not self._custom_logger:
            self._logger = configure_logger(self.verbose, self.tensorboard_log, tb_log_name, reset_num_timesteps)
        return total_timesteps, self._init_callback(callback, progress_bar)

    def learn(
        self: SelfGroupAlgorithm,
        total_timesteps: int,
        callback: MaybeCallback = None,
        log_interval: int = 1,
        tb_log_name: str = "run",
        reset_num_timesteps: bool = True,
        progress_bar: bool = False,
    ) -> SelfGroupAlgorithm:
        """Train for ``total_timesteps`` env steps (``n`` iterations: ``n * steps_per_iteration``).

        Callbacks: ``on_step`` is called once per iteration, after the rollouts and before the update
        (so ``eval_freq`` / ``save_freq`` of SB3 callbacks count iterations); returning ``False`` stops.

        :param total_timesteps: env steps to train for.
        :param callback: SB3 callback(s).
        :param log_interval: dump the logs every ``log_interval`` iterations.
        :param tb_log_name: tensorboard run name.
        :param reset_num_timesteps: start from 0 (and clear ``history``), or continue a run.
        :param progress_bar: show a progress bar (tqdm / rich).
        :return: self.
        """
        _check_int("total_timesteps", total_timesteps, 0)
        _check_int("log_interval", log_interval, 1)
        previous_threads = torch.get_num_threads()
        if self.n_threads is not None:
            torch.set_num_threads(self.n_threads)
        try:
            return self._learn(total_timesteps, callback, log_interval, tb_log_name, reset_num_timesteps, progress_bar)
        finally:
            torch.set_num_threads(previous_threads)

    def _learn(
        self: SelfGroupAlgorithm,
        total_timesteps: int,
        callback: MaybeCallback,
        log_interval: int,
        tb_log_name: str,
        reset_num_timesteps: bool,
        progress_bar: bool,
    ) -> SelfGroupAlgorithm:
        total_timesteps, callback = self._setup_learn(
            total_timesteps, callback, reset_num_timesteps, tb_log_name, progress_bar
        )
        self._get_rollout_env()
        callback.on_training_start(locals(), globals())
        while self.num_timesteps < total_timesteps:
            callback.on_rollout_start()
            self.rollout_batch = batch = self.collect_rollouts()
            self.num_timesteps += batch.n_steps
            callback.update_locals(locals())
            if not callback.on_step():
                break
            callback.on_rollout_end()
            self._update_current_progress_remaining(self.num_timesteps, total_timesteps)
            stats = self.train()
            record = {"iteration": self._iteration, "num_timesteps": self.num_timesteps, "error": batch.error, **stats}
            self.history.append(record)
            self._iteration += 1
            self._log(record, batch)
            if self._iteration % log_interval == 0:
                self.logger.dump(step=self.num_timesteps)
        callback.on_training_end()
        return self

    def _log(self, record: dict[str, float], batch: RolloutBatch) -> None:
        elapsed = max((time.time_ns() - self.start_time) / 1e9, sys.float_info.epsilon)
        self.logger.record("rollout/error", record["error"])
        self.logger.record("rollout/ep_rew_mean", safe_mean(batch.returns.cpu().numpy()))
        self.logger.record("rollout/ep_len_mean", safe_mean(batch.lengths.cpu().numpy()))
        for key, value in record.items():
            if key not in ("iteration", "num_timesteps", "error"):
                self.logger.record(f"train/{key}", value)
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("time/iterations", self._iteration, exclude="tensorboard")
        self.logger.record("time/fps", int((self.num_timesteps - self._num_timesteps_at_start) / elapsed))
        self.logger.record("time/time_elapsed", int(elapsed), exclude="tensorboard")
        self.logger.record("time/total_timesteps", self.num_timesteps, exclude="tensorboard")

    # ------------------------------------------------------------------------------------------
    # helpers for the subclasses
    # ------------------------------------------------------------------------------------------
    @staticmethod
    def candidate_logp(logp: torch.Tensor, batch: RolloutBatch) -> torch.Tensor:
        """Log-probs ``[N, T, K]`` of the per-state candidates under ``logp`` ``[N, T, n_actions]``."""
        assert batch.candidates is not None
        return logp.gather(-1, batch.candidates)

    @staticmethod
    def action_logp(logp: torch.Tensor, batch: RolloutBatch) -> torch.Tensor:
        """Log-probs ``[N, T]`` of the behaviour actions (0 at invalid steps)."""
        out = logp.gather(-1, batch.actions.unsqueeze(-1)).squeeze(-1)
        return out if batch.step_mask is None else out * batch.step_mask

    @classmethod
    def sequence_logp(cls, logp: torch.Tensor, batch: RolloutBatch) -> torch.Tensor:
        """Sequence log-probs ``[B, K]`` of the rollouts, grouped (sum of token log-probs)."""
        return cls.action_logp(logp, batch).sum(dim=1).reshape(-1, batch.group_size)

    def group_scores(self, batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Scores of the groups and their validity mask: ``[N, T, K]`` (token) or ``[B, K]`` (sequence)."""
        if self.level == "sequence":
            return batch.episode_scores.reshape(-1, batch.group_size), None
        assert batch.candidate_scores is not None
        mask = None
        if batch.step_mask is not None:
            mask = batch.step_mask.unsqueeze(-1).expand_as(batch.candidate_scores)
        return batch.candidate_scores, mask

    @staticmethod
    def group_diagnostics(scores: torch.Tensor, mask: torch.Tensor | None) -> dict[str, float]:
        """Fractions of zero-variance, all-fail (every score <= 0) and any-success (a score >= 1) groups."""
        from tpo_gym.objectives import zero_variance_groups

        valid = torch.ones(scores.shape[:-1], dtype=torch.bool, device=scores.device)
        if mask is not None:
            valid = mask.any(dim=-1)
        hi = scores if mask is None else scores.masked_fill(~mask, -math.inf)
        n = valid.sum().clamp(min=1)

        def frac(x: torch.Tensor) -> float:
            return float((x & valid).sum() / n)

        return {
            "zero_variance_fraction": frac(zero_variance_groups(scores, mask)),
            "all_fail_fraction": frac(hi.max(dim=-1).values <= 0),
            "any_success_fraction": frac(hi.max(dim=-1).values >= 1),
        }
