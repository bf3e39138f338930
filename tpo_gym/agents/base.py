"""The shared base of every tpo-gym agent, on Stable-Baselines3's ``BaseAlgorithm`` (the ARS route).

An iteration ("episode" in the paper's sense) is::

    batch = collect_rollouts(pi_old)               # B contexts; K candidates or K rollouts each
    old = self.view(batch.logp_old, batch)          # the log-probs the objective reads, under pi_old
    fixed = self.prepare(batch, old)                # targets / advantages, frozen (+ diagnostics)
    for epoch in range(n_epochs):                   # full-batch optimiser steps
        loss = self.compute_loss(batch, fixed, self.view(log pi_theta, batch))
        optimizer step

**What a group is** is decided once, when the agent gets its env, by :meth:`GroupAlgorithm._grouping`
(a :class:`Grouping`): K candidates per visited state, K rollouts per context, every action of a
state, or no groups (single-sample methods). The rollout side collects what it says and
:meth:`GroupAlgorithm.view` turns log-probs into the matching shape (``[..., K]`` for groups);
subclasses supply only :meth:`prepare` and :meth:`compute_loss`, each a few lines that call the
objectives of :mod:`tpo_gym.objectives`. Everything else (rollouts, logging, callbacks, safe
save / load, reproducibility) lives here.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import pathlib
import re
import sys
import time
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback, CallbackList, ProgressBarCallback
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.type_aliases import GymEnv, MaybeCallback, Schedule
from stable_baselines3.common.utils import FloatSchedule
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv, VecEnvWrapper, VecMonitor

from tpo_gym._validation import check_bool, check_choice, check_device, check_float, check_int, check_options
from tpo_gym.agents import persistence
from tpo_gym.agents.lm import (
    CausalLMPolicy,
    TextBatch,
    TextVecEnv,
    agent_model_kwargs,
    check_agent_lora_kwargs,
    check_agent_model_kwargs,
    is_text_env,
    load_agent_adapter,
    load_agent_model,
    load_agent_tokenizer,
    resolve_dtype,
)
from tpo_gym.agents.policies import CategoricalPolicy, MlpPolicy, TransformerPolicy
from tpo_gym.agents.registry import AlgorithmSpec
from tpo_gym.agents.sampling import (
    RolloutBatch,
    RolloutEnv,
    RolloutSource,
    collect_rollouts,
    group_api_available,
    make_rollout_env,
    tensor_env_available,
)

__all__ = ["GroupAlgorithm", "Grouping", "resolve_records"]


def resolve_records(records: list[dict[str, Any]]) -> None:
    """Replace every tensor value of ``records`` by its Python float, in place, with one read-back.

    The diagnostics of an update stay on the device until its record is made; reading them back one
    by one would synchronise a GPU once per value.
    """
    keys = [(r, k) for r in records for k, v in r.items() if isinstance(v, torch.Tensor)]
    if not keys:
        return
    device = keys[0][0][keys[0][1]].device
    values = torch.stack([r[k].detach().reshape(()).to(device, torch.float64) for r, k in keys]).tolist()
    for (r, k), v in zip(keys, values, strict=True):
        r[k] = v

SelfGroupAlgorithm = TypeVar("SelfGroupAlgorithm", bound="GroupAlgorithm")

LEVELS = ("auto", "token", "sequence")
BUDGETS = ("prompt", "interaction")
#: Constructor arguments that are not saved as settings (the env, the device and the build flag).
_NOT_SETTINGS = ("self", "policy", "env", "device", "_init_setup_model")


@dataclasses.dataclass(frozen=True)
class Grouping:
    """How one agent's batch forms groups: decided once, read by the rollout side and by :meth:`view`.

    :param kind: ``"candidates"`` (K actions drawn and scored at every visited state: TPO_token,
        GRPO_token, bandits), ``"rollouts"`` (K complete rollouts per context: sequence level),
        ``"actions"`` (every action of a state: the one-hot TPO of MNIST, the CE oracle) or
        ``"none"`` (one behaviour trajectory per context: PPO, REINFORCE, DG).
    :param n_candidates: K for ``"candidates"``, else 0.
    :param rollout_group: K for ``"rollouts"``, else 1.
    :param score_all_actions: whether the rollouts score every action of every state.
    """

    kind: str
    n_candidates: int = 0
    rollout_group: int = 1
    score_all_actions: bool = False

    @property
    def needs_group_api(self) -> bool:
        """Whether the env must score candidates without stepping (tpo_gym's group API)."""
        return self.n_candidates > 0 or self.score_all_actions


class _IterationProgressBar(ProgressBarCallback):
    """SB3's progress bar counting env steps per iteration (``on_step`` runs once per iteration here)."""

    def _on_training_start(self) -> None:
        self._start = self.model.num_timesteps
        self._total = max(int(self.locals["total_timesteps"]) - self._start, 0)
        super()._on_training_start()

    def _on_step(self) -> bool:
        done = min(self.model.num_timesteps - self._start, self._total)
        self.pbar.update(done - self.pbar.n)
        return True


def _count_progress_by_steps(callback: BaseCallback) -> None:
    """Make SB3 ``ProgressBarCallback`` instances (also inside lists) count env steps per iteration.

    The instance keeps its identity (its class becomes :class:`_IterationProgressBar`, which only
    changes how ``_on_step`` advances the bar), so a caller holding it can still read ``pbar``.
    """
    if type(callback) is ProgressBarCallback:
        callback.__class__ = _IterationProgressBar
    elif isinstance(callback, CallbackList):
        for inner in callback.callbacks:
            _count_progress_by_steps(inner)


def _param_blocks(doc: str) -> dict[str, str]:
    """The ``:param name: text`` blocks of a docstring, by name."""
    text = inspect.cleandoc(doc or "")
    return {name: block.strip() for block, name in re.findall(r"(:param (\w+):.*?)(?=\n:param |\n\n|\Z)", text,
                                                              flags=re.S)}


class GroupAlgorithm(BaseAlgorithm):
    """Base of TPO, GRPO, Group PG, PPO, REINFORCE, DG and the CE oracle (not used directly).

    Subclasses take their own arguments and forward the rest by keyword; the full signature and the
    ``:param:`` lines of the inherited arguments are added to each subclass automatically.

    :param policy: ``"MlpPolicy"``, ``"TransformerPolicy"`` or a :class:`CategoricalPolicy` subclass.
    :param env: a Gymnasium env instance or a registered id (``"tpo_gym/TokenReversal-v0"``), a Gymnasium
        ``VectorEnv`` made by ``gym.make_vec``, or an SB3 ``DummyVecEnv`` / ``SubprocVecEnv`` of registered
        envs; its action space must be ``Discrete``. Rollouts run in the agent's own ``gym.make_vec``
        copies of the env (``vector_entry_point`` for tpo_gym envs), rebuilt from its spec.
    :param learning_rate: learning rate (float or SB3 schedule of the remaining progress); ``None``
        (default): 1e-3, or 1e-5 with ``CausalLMPolicy`` (AdamW, as the paper's LLM runs).
    :param batch_size: B, contexts (prompts, images) per iteration.
    :param group_size: K, candidates per context (group methods) or the interaction multiplier
        (single-sample methods with ``budget="interaction"``).
    :param n_epochs: E, full-batch optimiser steps per batch.
    :param level: ``"token"`` (each state is a group of K candidate actions scored by the env's group
        API; for one-step tasks: K candidates per context), ``"sequence"`` (K complete rollouts per
        context, scored by the env's episode ``score``), or ``"auto"`` (token when the env has the
        group API, else sequence). Group methods only.
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
    :param device: torch device (default ``"cpu"``: these models are small); ``"cuda"`` / ``"cuda:N"``
        need that CUDA device here (else ``ValueError``); ``"auto"``: CUDA when available, else the CPU.
    :param rollouts_on_device: roll out in the env's on-device tensor form (the token tasks:
        :class:`~tpo_gym.envs.token_task.TokenTaskTensorEnv`; MNIST:
        :class:`~tpo_gym.envs.mnist_bandit.MNISTBanditTensorEnv`), so rollout, candidate scoring and the
        batch stay on ``device`` with no host round trip inside an iteration. ``None`` (default): when
        ``device`` is CUDA and the env has that form; ``True``: always (an env without one raises);
        ``False``: the numpy envs. Same values either way (tested on CPU).
    :param _init_setup_model: build the networks (``False`` is used by ``load``).
    """

    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {
        "MlpPolicy": MlpPolicy,
        "TransformerPolicy": TransformerPolicy,
        "CausalLMPolicy": CausalLMPolicy,
    }
    #: What the class is (:class:`~tpo_gym.agents.registry.AlgorithmSpec`), declared once by each agent class.
    spec: ClassVar[AlgorithmSpec]
    #: What a group is: ``spec.sampling`` ("group": K candidates / rollouts per context; "single": one
    #: behaviour trajectory per context; "oracle": every action scored, CE), set from the class's spec.
    sampling: ClassVar[str] = "group"
    #: Base arguments a subclass does not take (its method fixes them), with their fixed value.
    fixed_params: ClassVar[dict[str, Any]] = {}
    policy: CategoricalPolicy
    #: Set by :class:`~tpo_gym.agents.SeedBatch` while it trains this agent with a stacked optimiser: writes
    #: the batch's optimiser state back into this agent's optimiser (so a ``save`` mid-training has it).
    _seed_batch_sync: Callable[[], None] | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Give each agent class its full signature and the ``:param:`` lines of inherited arguments."""
        super().__init_subclass__(**kwargs)
        if "spec" in cls.__dict__:
            cls.sampling = cls.spec.sampling
        if "__init__" not in cls.__dict__:
            return
        own = inspect.signature(cls.__init__)
        base = inspect.signature(GroupAlgorithm.__init__)
        params = [p for p in own.parameters.values() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
        names = {p.name for p in params}
        for p in base.parameters.values():
            if p.name not in names and p.name not in cls.fixed_params:
                params.append(p)
        head = [p for p in params if p.kind is not p.KEYWORD_ONLY]
        tail = sorted((p for p in params if p.kind is p.KEYWORD_ONLY), key=lambda p: p.name == "_init_setup_model")
        cls.__init__.__signature__ = own.replace(parameters=head + tail)  # type: ignore[attr-defined]
        documented = _param_blocks(cls.__doc__ or "")
        inherited = _param_blocks(GroupAlgorithm.__doc__ or "")
        extra = [inherited[p.name] for p in head + tail if p.name in inherited and p.name not in documented]
        if extra:
            cls.__doc__ = (cls.__doc__ or "").rstrip() + "\n\n" + "\n".join("    " + b.replace("\n", "\n    ")
                                                                           for b in extra) + "\n"

    def __init__(
        self,
        policy: str | type[CategoricalPolicy],
        env: GymEnv | str | gym.vector.VectorEnv | None,
        *,
        learning_rate: float | Schedule | None = None,
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
        rollouts_on_device: bool | None = None,
        _init_setup_model: bool = True,
    ) -> None:
        if rollouts_on_device is not None and not isinstance(rollouts_on_device, bool):
            raise ValueError(f"rollouts_on_device must be None, True or False, got {rollouts_on_device!r}")
        self.rollouts_on_device = rollouts_on_device
        given = {"level": level, "budget": budget, "group_size": group_size}
        defaults = inspect.signature(GroupAlgorithm.__init__).parameters
        for name, fixed in self.fixed_params.items():
            if name in given and given[name] != defaults[name].default and given[name] != fixed:
                raise ValueError(f"{type(self).__name__} takes no {name} argument (its method fixes it to {fixed!r})")
        level = self.fixed_params.get("level", level)
        budget = self.fixed_params.get("budget", budget)
        group_size = self.fixed_params.get("group_size", group_size)
        self.batch_size = check_int("batch_size", batch_size, 1)
        self.group_size = check_int("group_size", group_size, 1)
        self.n_epochs = check_int("n_epochs", n_epochs, 1)
        self.level = check_choice("level", level, LEVELS)
        self.budget = check_choice("budget", budget, BUDGETS)
        policy_class = self.policy_aliases.get(policy) if isinstance(policy, str) else policy
        self._text = isinstance(policy_class, type) and issubclass(policy_class, CausalLMPolicy)
        self._policy_name = policy if isinstance(policy, str) else getattr(policy, "__name__", str(policy))
        if learning_rate is None:
            learning_rate = 1e-5 if self._text else 1e-3
        if not callable(learning_rate):
            learning_rate = check_float("learning_rate", learning_rate, 0.0, strict_min=True)
        self.max_grad_norm = None if max_grad_norm is None else check_float(
            "max_grad_norm", max_grad_norm, 0.0, strict_min=True)
        self.n_threads = None if n_threads is None else check_int("n_threads", n_threads, 1)
        self.stats_window_size = check_int("stats_window_size", stats_window_size, 1)
        if seed is not None:
            seed = check_int("seed", seed, 0)
        policy_kwargs = check_options(policy_kwargs, "policy_kwargs")
        device = check_device(device)  # "cuda" without CUDA is an error; "auto" is the way to fall back
        if isinstance(policy, str) and policy not in self.policy_aliases:
            raise ValueError(f"unknown policy alias {policy!r}; allowed: {sorted(self.policy_aliases)} or a class")
        env, self._source = self._resolve_env(env)
        if env is not None:
            self._check_spaces(env)
        if self._text and device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        super().__init__(
            policy=policy,
            env=env,
            learning_rate=learning_rate,
            policy_kwargs=policy_kwargs,
            stats_window_size=self.stats_window_size,
            tensorboard_log=tensorboard_log,
            verbose=verbose,
            device=device,
            support_multi_env=True,
            monitor_wrapper=False,
            seed=seed,
            supported_action_spaces=(spaces.Discrete, spaces.Text),
        )
        self._base_seed = int(seed) if seed is not None else int(np.random.SeedSequence().entropy % (2**62))
        self._iteration = 0  # iterations since the last reset_num_timesteps=True (history index)
        self._rollout_index = 0  # rollouts collected over this agent's life (seeds the next one)
        self.history: list[dict[str, float]] = []
        self._rollout_env: RolloutEnv | None = None
        self.rollout_batch: RolloutBatch | TextBatch | None = None
        self._text_env: gym.Env[Any, Any] | None = None
        self.grouping: Grouping | None = None
        if self._source is not None:
            self._resolve_grouping()
        if _init_setup_model:
            self._setup_model()

    # ------------------------------------------------------------------------------------------
    # env handling
    # ------------------------------------------------------------------------------------------
    def _resolve_env(self, env: Any) -> tuple[GymEnv | None, RolloutSource | None]:
        """The env SB3 keeps (spaces, ``get_env``) and where rollouts are rebuilt from.

        Accepted: ``None``, a registered id, a Gymnasium env, a Gymnasium ``VectorEnv`` with a spec
        (``gym.make_vec``), an SB3 ``DummyVecEnv`` / ``SubprocVecEnv`` (optionally in ``VecMonitor``).
        """
        if env is None:
            return None, None
        if isinstance(env, str):
            env = gym.make(env)
        if isinstance(env, gym.vector.VectorEnv):
            spec = getattr(env, "spec", None)
            if spec is None:
                raise ValueError(
                    f"{type(self).__name__} got a Gymnasium VectorEnv without a spec; pass the single env, its id, "
                    "or a vector env made by gym.make_vec (rollouts are rebuilt from the env spec)"
                )
            vector_only = ("num_envs", "vectorization_mode", "vector_kwargs", "wrappers")
            spec = dataclasses.replace(spec, kwargs={k: v for k, v in spec.kwargs.items() if k not in vector_only})
            return gym.make(spec), RolloutSource.from_spec(spec)
        if isinstance(env, VecEnvWrapper):
            inner = env.venv if isinstance(env, VecMonitor) else None
            if inner is None or isinstance(inner, VecEnvWrapper):
                raise ValueError(
                    f"{type(self).__name__} does not support the VecEnv wrapper {type(env).__name__}: its rollouts "
                    "run in the agent's own vector env, so wrappers that change observations or rewards "
                    "(VecNormalize, VecFrameStack, ...) would be skipped. Supported: an env id, a Gymnasium env or "
                    "VectorEnv, an SB3 DummyVecEnv / SubprocVecEnv (optionally in VecMonitor)"
                )
            return env, self._source_of_vecenv(inner)
        if isinstance(env, VecEnv):
            return env, self._source_of_vecenv(env)
        if isinstance(env, gym.Env):
            if is_text_env(env.observation_space, env.action_space):
                return TextVecEnv(env), RolloutSource.from_env(env)
            return env, RolloutSource.from_env(env)
        raise ValueError(
            f"env must be an env id, a Gymnasium env or VectorEnv, or an SB3 VecEnv; got {type(env).__name__}"
        )

    def _source_of_vecenv(self, venv: VecEnv) -> RolloutSource:
        if isinstance(venv, DummyVecEnv) or type(venv).__name__ == "_TextVecEnv":
            return RolloutSource.from_env(venv.envs[0])
        spec = venv.get_attr("spec", [0])[0]
        if spec is None:
            raise ValueError(
                f"{type(self).__name__} cannot rebuild the envs of this {type(venv).__name__}: they have no spec. "
                "Register the env (gymnasium.register) or pass an env instance"
            )
        return RolloutSource.from_spec(spec)

    def _check_spaces(self, env: GymEnv) -> None:
        """Raise ``ValueError`` for spaces the agents (or the chosen policy) do not support."""
        text = is_text_env(env.observation_space, env.action_space)
        if self._text and not text:
            raise ValueError(
                f"CausalLMPolicy needs a text env (Text observation and action spaces, e.g. tpo_gym/ReasoningGym-v0), "
                f"got observations {env.observation_space} and actions {env.action_space}"
            )
        if text and not self._text:
            raise ValueError(
                f"a text env (Text observations and actions) needs policy='CausalLMPolicy'; got {self._policy_name} "
                "(MlpPolicy / TransformerPolicy take Discrete actions)"
            )
        if self._text:
            if self.sampling != "group":
                raise ValueError(f"{type(self).__name__} does not train language models; use TPO, GRPO or GroupPG")
            return
        if not isinstance(env.action_space, spaces.Discrete):
            raise ValueError(
                f"{type(self).__name__} supports only Discrete action spaces, got {env.action_space} "
                "(for continuous actions use Stable-Baselines3's PPO/SAC)"
            )
        if isinstance(env.observation_space, (spaces.Dict, spaces.Tuple)):
            space = type(env.observation_space).__name__
            raise ValueError(f"{type(self).__name__} does not support {space} observations (use Box or Discrete)")

    def _grouping(self, native: bool) -> Grouping:
        """The grouping of this method on an env with (``native``) or without the group API."""
        if self._text:
            if self.level == "token":
                raise ValueError("level='token' is for Discrete token tasks; a language model's groups are K "
                                 "completions per prompt (level='sequence')")
            return Grouping("rollouts", rollout_group=self.group_size)
        if self.sampling == "single":
            return Grouping("none")
        if self.sampling == "oracle":
            return Grouping("actions", score_all_actions=True)
        level = self.level if self.level != "auto" else ("token" if native else "sequence")
        if level == "token":
            return Grouping("candidates", n_candidates=self.group_size)
        return Grouping("rollouts", rollout_group=self.group_size)

    def _resolve_grouping(self) -> None:
        """Decide, once per env, what a group is; raise if the env cannot provide it."""
        assert self._source is not None
        native = group_api_available(self._source) or self._text
        grouping = self._grouping(native)
        if grouping.kind in ("candidates", "rollouts") and self.group_size < 2:
            raise ValueError(f"{type(self).__name__} compares K candidates per context: group_size must be an "
                             f"integer >= 2, got {self.group_size}")
        if grouping.needs_group_api and not native:
            what = {"candidates": "level='token'", "actions": f"{type(self).__name__}"}[grouping.kind]
            if self.sampling == "oracle":
                what = f"{type(self).__name__} (the supervised oracle)"
            wrapped = self._source.wrapper_names()
            why = (f"this env is wrapped ({', '.join(wrapped)}), and wrapped envs roll out through their wrappers "
                   "in a sync vector env, without the group API" if wrapped else "this env has none")
            hint = ("use level='sequence' (K same-seed rollouts per context)" if grouping.kind == "candidates"
                    else "pass an unwrapped tpo_gym env")
            raise ValueError(f"{what} needs an env with the tpo_gym group API (score_candidates); {why}: {hint}")
        if self.sampling == "group" and self.level == "auto":
            self.level = "token" if grouping.kind == "candidates" else "sequence"
        self.grouping = grouping
        self._rollout_env = None

    def set_env(self, env: GymEnv | str, force_reset: bool = True) -> None:
        """Use a new env (same spaces; an id works too); rollouts are rebuilt from it."""
        env, source = self._resolve_env(env)
        assert env is not None
        self._check_spaces(env)
        wrapped = self._wrap_env(env, self.verbose, monitor_wrapper=False)
        self.n_envs = wrapped.num_envs  # rollouts use their own vector env: any number of envs is fine
        super().set_env(wrapped, force_reset=force_reset)
        self._source = source
        self._resolve_grouping()

    def _require_grouping(self) -> Grouping:
        if self.grouping is None:
            raise ValueError("no env: pass one to the constructor, to load(), or call set_env() first")
        return self.grouping

    @property
    def n_rollouts(self) -> int:
        """Episodes rolled out per iteration: B, or B*K (sequence level; interaction budget)."""
        grouping = self._require_grouping()
        if grouping.kind == "rollouts":
            return self.batch_size * self.group_size
        if self.sampling == "single" and self.budget == "interaction":
            return self.batch_size * self.group_size
        return self.batch_size

    def _get_text_env(self) -> gym.Env[Any, Any]:
        if self._text_env is None:
            assert self._source is not None
            source = self._source
            self._text_env = gym.make(source.spec) if source.spec is not None else source.env_fn()  # type: ignore
            if not hasattr(self._text_env.unwrapped, "score_candidates"):
                raise ValueError("a text env needs the group API: score_candidates(list of completions) -> [K]")
        return self._text_env

    def _get_rollout_env(self) -> RolloutEnv:
        if self._rollout_env is None or self._rollout_env.num_envs != self.n_rollouts:
            assert self._source is not None
            self._rollout_env = make_rollout_env(self._source, self.n_rollouts, self._rollout_device())
        return self._rollout_env

    def _rollout_device(self) -> torch.device | None:
        """The device of on-device rollouts (see ``rollouts_on_device``), or ``None`` for the numpy envs."""
        wanted = getattr(self, "rollouts_on_device", None)
        if wanted is False or self._text:
            return None
        assert self._source is not None
        if wanted is None and (self.device.type != "cuda" or not tensor_env_available(self._source)):
            return None
        return self.device

    @property
    def steps_per_iteration(self) -> int:
        """Env timesteps one iteration consumes: rollouts x episode length.

        Exact for fixed-length envs (every tpo_gym env: token tasks H, bandits and MNIST 1), so
        ``learn(total_timesteps=n * model.steps_per_iteration)`` runs exactly ``n`` iterations. For
        other envs it is the upper bound ``n_rollouts * max_episode_steps``. Scored candidates are
        not env steps.
        """
        if self._text:
            return self.n_rollouts  # one-step episodes: one completion, one env step
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
        base, scale = FloatSchedule(self.learning_rate), self.lr_scale
        self.lr_schedule = base if scale == 1.0 else _ScaledSchedule(base, scale)

    def _setup_model(self) -> None:
        self._setup_lr_schedule()
        self.set_random_seed(self.seed)
        extra = {"device": self.device} if self._text else {}
        self.policy = self.policy_class(  # type: ignore[assignment]
            self.observation_space, self.action_space, self.lr_schedule, **self.policy_kwargs, **extra
        )
        self.policy = self.policy.to(self.device)

    def set_random_seed(self, seed: int | None = None) -> None:
        """Seed python, numpy and torch (initialisation) and restart this agent's rollout seeds."""
        if seed is None:
            return
        super().set_random_seed(seed)
        self._base_seed = int(seed)
        self._rollout_index = 0
        self.seed = seed

    # ------------------------------------------------------------------------------------------
    # one iteration
    # ------------------------------------------------------------------------------------------
    def _iteration_seed(self, index: int) -> int:
        """The seed of the ``index``-th rollout of this agent: a function of its seed and the index only."""
        return int(np.random.SeedSequence([self._base_seed, index]).generate_state(1, np.uint64)[0] >> 2)

    def collect_rollouts(self) -> RolloutBatch | TextBatch:
        """Collect the batch of the next iteration with the current policy (pi_old)."""
        grouping = self._require_grouping()
        if self._text:
            text = self.policy.collect(  # type: ignore[attr-defined]
                self._get_text_env(), self.batch_size, self.group_size,
                seed=self._iteration_seed(self._rollout_index), with_reference=self._needs_reference())
            self._rollout_index += 1
            return text
        batch = collect_rollouts(
            self.policy,
            self._get_rollout_env(),
            seed=self._iteration_seed(self._rollout_index),
            n_candidates=grouping.n_candidates,
            score_all_actions=grouping.score_all_actions,
            group_size=grouping.rollout_group,
        )
        self._rollout_index += 1
        return batch

    def view(self, logp: torch.Tensor, batch: RolloutBatch) -> torch.Tensor:
        """The log-probs the objective reads, from ``logp`` ``[N, T, n_actions]``, by the grouping.

        ``"candidates"``: ``[N, T, K]`` of the per-state candidates; ``"rollouts"``: ``[B, K]``
        sequence log-probs (sum over steps) of the K rollouts of each context; ``"actions"``: ``logp``
        itself; ``"none"``: ``[N, T]`` of the behaviour actions (0 at invalid steps).
        """
        kind = self._require_grouping().kind
        if kind == "candidates":
            assert batch.candidates is not None
            return logp.gather(-1, batch.candidates)
        if kind == "actions":
            return logp
        taken = logp.gather(-1, batch.actions.unsqueeze(-1)).squeeze(-1)
        if batch.step_mask is not None:
            taken = torch.where(batch.step_mask, taken, torch.zeros_like(taken))
        if kind == "rollouts":
            return taken.sum(dim=1).reshape(-1, batch.group_size)
        return taken

    def _needs_reference(self) -> bool:
        """Whether the rollouts must also score completions under a frozen reference model."""
        return False

    def token_penalty(self, batch: TextBatch, start: int, stop: int, token_logp: torch.Tensor) -> torch.Tensor | None:
        """A per-token term added to the loss of groups ``start .. stop-1`` of a language model (``None``: none).

        ``token_logp`` are the completions' token log-probs under the current policy (with gradient); the
        term is a mean over those completions, weighted like the loss in micro-batches (TPO's ``beta`` KL).
        """
        return None

    @staticmethod
    def single_candidate_scores(batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, float]]:
        """Scores over *all* actions from one sampled action per state (``candidates="single"``).

        ``s = A onehot(a)`` with ``A = r - sum_k pi_old(k)^2``
        (:func:`~tpo_gym.objectives.onehot_advantage_scores`), shaped ``[N, T, n_actions]``, with the
        validity mask of the valid steps and the all-fail / any-success diagnostics of the rewards.
        """
        from tpo_gym.objectives import onehot_advantage_scores

        n, t, n_actions = batch.logp_old.shape
        scores = onehot_advantage_scores(
            batch.actions.reshape(-1), batch.rewards.reshape(-1), batch.logp_old.exp().reshape(-1, n_actions)
        ).reshape(n, t, n_actions)
        mask = None if batch.step_mask is None else batch.step_mask.unsqueeze(-1).expand(n, t, n_actions)
        step_mask = None if batch.step_mask is None else batch.step_mask.unsqueeze(-1)
        diagnostics = GroupAlgorithm.group_diagnostics(batch.rewards.unsqueeze(-1), step_mask)
        diagnostics.pop("zero_variance_fraction")
        return scores, mask, diagnostics

    def group_scores(self, batch: RolloutBatch | TextBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Scores of the groups and their validity mask, shaped like :meth:`view`."""
        if isinstance(batch, TextBatch):
            return batch.scores, None
        kind = self._require_grouping().kind
        if kind == "rollouts":
            return batch.episode_scores.reshape(-1, batch.group_size), None
        if batch.candidate_scores is None:
            raise RuntimeError(f"a {kind!r} grouping has no candidate scores")
        mask = None
        if batch.step_mask is not None:
            mask = batch.step_mask.unsqueeze(-1).expand_as(batch.candidate_scores)
        return batch.candidate_scores, mask

    def prepare(self, batch: RolloutBatch, old: torch.Tensor) -> tuple[dict[str, Any], dict[str, float]]:
        """Frozen quantities of the update (targets, advantages) and diagnostics of the batch.

        :param batch: the rollouts.
        :param old: :meth:`view` of the rollout-time log-probs.
        """
        raise NotImplementedError

    def compute_loss(self, batch: RolloutBatch, fixed: dict[str, Any], current: torch.Tensor) -> torch.Tensor:
        """The objective for the current log-probs ``current`` (:meth:`view` of ``log pi_theta``)."""
        raise NotImplementedError

    def _begin_update(self) -> tuple[RolloutBatch | TextBatch, dict[str, Any], dict[str, float]]:
        """The part of :meth:`train` before the epochs: the batch, its frozen quantities, its diagnostics."""
        batch = self.rollout_batch
        if batch is None:
            raise RuntimeError("no rollout batch: call collect_rollouts() first")
        self.policy.set_training_mode(True)
        if not hasattr(self, "_logger"):  # train() called outside learn()
            from stable_baselines3.common.utils import configure_logger

            self._logger = configure_logger(0)
        self._update_learning_rate(self.policy.optimizer)
        old = batch.logp_old if isinstance(batch, TextBatch) else self.view(batch.logp_old, batch)
        fixed, diagnostics = self.prepare(batch, old)
        return batch, fixed, diagnostics

    def loss_from_logits(self, batch: RolloutBatch, fixed: dict[str, Any], logits: torch.Tensor) -> torch.Tensor:
        """The objective of one epoch from the policy's step logits ``[N, T, n_actions]`` of ``batch.obs``."""
        return self.compute_loss(batch, fixed, self.view(torch.log_softmax(logits, dim=-1), batch))

    def _trained_parameters(self) -> list[torch.Tensor]:
        return [p for p in self.policy.parameters() if p.requires_grad]

    @staticmethod
    def _grad_norm(params: list[torch.Tensor]) -> torch.Tensor:
        """L2 norm of the gradients of ``params`` (those that have one), a 0-d tensor (read back by the caller)."""
        grads = [p.grad.reshape(-1) for p in params if p.grad is not None]
        return torch.linalg.vector_norm(torch.cat(grads)) if grads else torch.zeros(())

    def train(self) -> dict[str, float]:
        """Update the policy on ``self.rollout_batch``: ``n_epochs`` full-batch optimiser steps.

        The objectives' value checks of the whole update are read back together at its end
        (:func:`~tpo_gym.objectives.deferred_checks`; immediate on CPU).
        """
        from tpo_gym.objectives import deferred_checks

        with deferred_checks():
            return self._train_update()

    def _train_update(self) -> dict[str, Any]:
        batch, fixed, diagnostics = self._begin_update()
        text = isinstance(batch, TextBatch)
        optimizer = self.policy.optimizer
        params = self._trained_parameters()
        first = norm = last = torch.full((), float("nan"))
        start = time.perf_counter()
        for epoch in range(self.n_epochs):
            optimizer.zero_grad(set_to_none=True)
            if text:
                loss = self._accumulate_text_gradients(batch, fixed)
            else:
                loss = self.loss_from_logits(batch, fixed, self.policy.step_logits(batch.obs))
                loss.backward()
            if epoch == 0:
                norm, first = self._grad_norm(params), loss.detach()
            if self.max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
            optimizer.step()
            last = loss.detach()
        # one read-back per update (on a GPU, no synchronisation inside the epochs)
        values = torch.stack([t.float().to(norm.device) for t in (first, last, norm)])
        first_loss, last_loss, grad_norm = values.tolist()
        self._n_updates += self.n_epochs
        if text:  # timings go to the logger only: the history stays a pure function of the seed
            batch.stats["update_s"] = time.perf_counter() - start
            diagnostics = {**diagnostics, "completion_length": batch.stats["completion_length"],
                           "mean_score": float(batch.scores.mean())}
        return {"loss": first_loss, "final_loss": last_loss, "grad_norm": grad_norm, **diagnostics}

    def group_weights(self, fixed: dict[str, Any], n_groups: int) -> torch.Tensor:
        """``[G]`` weights of the groups in the loss's mean (all 1; GRPO zv-masked: informative only).

        Micro-batches scale their loss by their share of the total weight, so accumulating them
        gives exactly the full-batch gradient.
        """
        return torch.ones(n_groups)

    def _accumulate_text_gradients(self, batch: TextBatch, fixed: dict[str, Any]) -> torch.Tensor:
        """Backward the loss over micro-batches of whole groups; return the full-batch loss."""
        n = batch.n_groups
        weights = self.group_weights(fixed, n).to(torch.float64)
        total_weight = float(weights.sum())
        total = torch.zeros(())
        for a, b in self.policy.micro_batches(n):  # type: ignore[attr-defined]
            share = float(weights[a:b].sum()) / total_weight if total_weight > 0 else (b - a) / n
            part = {k: (v[a:b] if isinstance(v, torch.Tensor) and v.ndim and v.shape[0] == n else v)
                    for k, v in fixed.items()}
            token_logp = self.policy.token_logp(batch, a, b)  # type: ignore[attr-defined]
            current = self.policy.sequence_logp(token_logp, batch, a, b)  # type: ignore[attr-defined]
            loss = self.compute_loss(batch, part, current)
            penalty = self.token_penalty(batch, a, b, token_logp)
            if penalty is not None:
                loss = loss + penalty
            loss = loss * share
            loss.backward()
            total = total + loss.detach().float().cpu()
        return total

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
        """SB3's setup; in addition ``reset_num_timesteps`` restarts ``history`` (rollout seeds go on)."""
        if reset_num_timesteps:
            self._iteration = 0
            self.history = []
        return super()._setup_learn(total_timesteps, callback, reset_num_timesteps, tb_log_name, progress_bar)

    def _init_callback(self, callback: MaybeCallback, progress_bar: bool = False) -> BaseCallback:
        callback = super()._init_callback(callback, progress_bar)
        _count_progress_by_steps(callback)
        return callback

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
        Calling ``learn`` again continues with fresh rollouts (the rollout seeds go on, as SB3's
        agents keep their env and RNG); ``reset_num_timesteps=True`` restarts the step count and
        ``history`` only.

        :param total_timesteps: env steps to train for (an int, or an integral float such as ``1e5``).
        :param callback: SB3 callback(s).
        :param log_interval: dump the logs every ``log_interval`` iterations.
        :param tb_log_name: tensorboard run name.
        :param reset_num_timesteps: start the step count (and ``history``) from 0, or continue them.
        :param progress_bar: show a progress bar (tqdm / rich) over the env steps.
        :return: self.
        """
        total_timesteps = check_int("total_timesteps", total_timesteps, 0, allow_integral_float=True)
        log_interval = check_int("log_interval", log_interval, 1)
        check_bool("reset_num_timesteps", reset_num_timesteps)
        self._require_grouping()
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
        if self._text:
            self._get_text_env()
        else:
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
            self._record_iteration(batch, self.train(), log_interval)
        callback.on_training_end()
        return self

    @staticmethod
    def _episode_means(batch: RolloutBatch | TextBatch) -> dict[str, Any]:
        """The batch's mean return and length for SB3's ``rollout/ep_*_mean`` (tensors, resolved with the record)."""
        return {"ep_rew_mean": batch.returns.float().mean(), "ep_len_mean": batch.lengths.float().mean()}

    def _record_iteration(self, batch: RolloutBatch | TextBatch, stats: dict[str, Any], log_interval: int,
                          episode: dict[str, Any] | None = None) -> None:
        """Append the iteration's record to ``history``, log it, dump the logs every ``log_interval``.

        Tensor values of ``stats`` (diagnostics computed on the device) are read back here, all at once
        (:func:`resolve_records`; a :class:`~tpo_gym.agents.SeedBatch` resolves every seed's in one go
        and passes ``episode``).
        """
        if episode is None:
            episode = self._episode_means(batch)
            resolve_records([stats, episode])
        record = {"iteration": self._iteration, "num_timesteps": self.num_timesteps, "error": batch.error, **stats}
        self.history.append(record)
        self._iteration += 1
        self._log(record, batch, episode)
        if self._iteration % log_interval == 0:
            self.logger.dump(step=self.num_timesteps)

    def _log(self, record: dict[str, float], batch: RolloutBatch, episode: dict[str, float]) -> None:
        elapsed = max((time.time_ns() - self.start_time) / 1e9, sys.float_info.epsilon)
        self.logger.record("rollout/error", record["error"])
        self.logger.record("rollout/ep_rew_mean", episode["ep_rew_mean"])
        self.logger.record("rollout/ep_len_mean", episode["ep_len_mean"])
        for key, value in record.items():
            if key not in ("iteration", "num_timesteps", "error"):
                self.logger.record(f"train/{key}", value)
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("time/iterations", self._iteration, exclude="tensorboard")
        self.logger.record("time/fps", int((self.num_timesteps - self._num_timesteps_at_start) / elapsed))
        self.logger.record("time/time_elapsed", int(elapsed), exclude="tensorboard")
        self.logger.record("time/total_timesteps", self.num_timesteps, exclude="tensorboard")
        for key, value in getattr(batch, "stats", {}).items():
            if key != "completion_length":
                self.logger.record(f"time/{key}", value)

    # ------------------------------------------------------------------------------------------
    # predict
    # ------------------------------------------------------------------------------------------
    def predict(
        self,
        observation: np.ndarray | dict[str, np.ndarray],
        state: tuple[np.ndarray, ...] | None = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = False,
    ) -> tuple[np.ndarray, tuple[np.ndarray, ...] | None]:
        """Actions for one observation or a batch; observations outside the space raise ``ValueError``."""
        return self.policy.predict(observation, state, episode_start, deterministic)

    # ------------------------------------------------------------------------------------------
    # safe save / load
    # ------------------------------------------------------------------------------------------
    def _settings(self) -> dict[str, Any]:
        """The constructor arguments of this agent as they stand (``level`` resolved)."""
        names = [n for n in inspect.signature(type(self).__init__).parameters if n not in _NOT_SETTINGS]
        out: dict[str, Any] = {}
        for name in names:
            value = getattr(self, name)
            if name == "learning_rate":
                value = persistence.schedule_to_data(value)
            elif name == "tensorboard_log" and value is not None:
                value = str(value)
            elif name == "policy_kwargs" and self._text:
                value = {k: v for k, v in value.items() if k not in ("model", "tokenizer")}
                if value.get("model_kwargs") is not None:  # only what load accepts from a file
                    value["model_kwargs"] = agent_model_kwargs(value["model_kwargs"])
                if getattr(self.policy, "lora", None) is not None:
                    value["model"] = str(self.policy.model_spec)  # the base model; the adapter is saved
            out[name] = persistence.encode_value(value, f"kwargs.{name}")
        return out

    def save(
        self,
        path: str | pathlib.Path | Any,
        exclude: Any = None,
        include: Any = None,
    ) -> None:
        """Save the agent as a zip of plain JSON settings and ``weights_only`` tensors (no pickle).

        ``exclude`` / ``include`` (SB3's arguments) are not used: the file always holds exactly the
        settings, counters, history, spaces and the policy / optimiser weights.
        """
        policy_class = self.policy_class
        alias = next((k for k, v in self.policy_aliases.items() if v is policy_class), None)
        meta = {
            "class": type(self).__name__,
            "policy": alias if alias is not None else {"__class__": persistence.class_to_name(policy_class)},
            "kwargs": self._settings(),
            "observation_space": persistence.space_to_data(self.observation_space),
            "action_space": persistence.space_to_data(self.action_space),
            "state": {
                "num_timesteps": int(self.num_timesteps),
                "n_updates": int(self._n_updates),
                "iteration": int(self._iteration),
                "rollout_index": int(self._rollout_index),
                "base_seed": int(self._base_seed),
                "history": self.history,
            },
            "tpo_gym_version": _package_version(),
        }
        if self._text:
            self._save_language_model(path, meta)
            return
        if self._seed_batch_sync is not None:  # saved mid-SeedBatch.learn: the stacked optimiser holds the state
            self._seed_batch_sync()
        # clones: in a SeedBatch the parameters are views of the stacked [S, ...] tensors (a view saves all S)
        policy_state = {k: v.detach().clone() for k, v in self.policy.state_dict().items()}
        weights = {"policy": policy_state, "optimizer": self.policy.optimizer.state_dict()}
        persistence.write_agent_file(path, meta, weights)

    def _save_language_model(self, path: Any, meta: dict[str, Any]) -> None:
        """A directory: ``model/`` (or ``adapter/`` with LoRA) by ``save_pretrained``, ``tokenizer/``, JSON."""
        policy = self.policy
        lora = getattr(policy, "lora", None) is not None
        if lora and policy.model_spec is None:  # type: ignore[attr-defined]
            raise ValueError("a LoRA agent built on an in-memory model cannot be saved: pass the base model by hub "
                             "id or path (policy_kwargs={'model': ...}) so the file can name it")

        def save_model(directory: pathlib.Path) -> None:
            policy.model.save_pretrained(directory / ("adapter" if lora else "model"))  # type: ignore[attr-defined]
            policy.tokenizer.save_pretrained(directory / "tokenizer")  # type: ignore[attr-defined]

        persistence.write_agent_dir(path, meta, {"optimizer": policy.optimizer.state_dict()}, save_model)

    @classmethod
    def load(  # type: ignore[override]
        cls: type[SelfGroupAlgorithm],
        path: str | pathlib.Path | Any,
        env: GymEnv | str | None = None,
        device: torch.device | str = "auto",
        custom_objects: dict[str, Any] | None = None,
        print_system_info: bool = False,
        force_reset: bool = True,
        trust_remote_code: bool = False,
        **kwargs: Any,
    ) -> SelfGroupAlgorithm:
        """Load an agent saved by :meth:`save`; nothing in the file is executed (no pickle).

        ``GroupAlgorithm.load`` returns whichever agent class the file holds; ``TPO.load`` requires a
        TPO file. ``custom_objects`` replaces settings (e.g. ``{"learning_rate": schedule}`` or a policy
        class from outside tpo_gym: ``{"policy": cls}``); ``kwargs`` override settings too.

        A language-model agent is a directory: the model is read from ``model/`` (local safetensors,
        strictly: a missing or unexpected weight is an error) and the tokenizer from ``tokenizer/``,
        never from the network and never running code from the directory. The file's
        ``policy_kwargs.model_kwargs`` may hold only :data:`~tpo_gym.agents.lm.AGENT_MODEL_KWARGS`
        (``trust_remote_code``, ``revision``, ``token``, ... are refused). A LoRA agent keeps only its
        adapter (``adapter/``): the base model the file names is not loaded unless you pass it,
        ``load(path, policy_kwargs={"model": ...})``. For a directory, ``policy_kwargs`` given here
        replace the file's key by key (the rest of the file's policy settings stay).

        :param path: the zip file (or a file object), or a language-model agent's directory.
        :param env: an env instance or id to train or evaluate on (optional for ``predict``).
        :param device: torch device (``"auto"``: the saved one, ``"cpu"`` here).
        :param custom_objects: settings to use instead of the file's.
        :param print_system_info: unused (kept for SB3's signature).
        :param force_reset: unused (rollouts always start from a reset).
        :param trust_remote_code: let a language-model directory's ``config.json`` / tokenizer files import
            their own Python code (``auto_map``). Default ``False``: only the caller can trust code, never
            the file.
        :raises ValueError: (:class:`~tpo_gym.agents.persistence.AgentFileError`) naming the bad part.
        """
        from tpo_gym.agents.registry import algorithm_class

        trust_remote_code = check_bool("trust_remote_code", trust_remote_code)

        directory = isinstance(path, (str, pathlib.Path)) and pathlib.Path(path).is_dir()
        if directory:
            meta, weights = persistence.read_agent_dir(path)
        else:
            meta, weights = persistence.read_agent_file(path, device="cpu")
        stored = meta.get("class")
        target: type[GroupAlgorithm] = cls
        if cls is GroupAlgorithm:
            try:
                target = algorithm_class(str(stored))
            except ValueError:
                raise persistence.AgentFileError(f"the file holds an unknown agent class {stored!r}") from None
        elif stored != cls.__name__:
            raise persistence.AgentFileError(
                f"the file holds a {stored} agent, not {cls.__name__}: use {stored}.load (or GroupAlgorithm.load)"
            )
        overrides = {**(custom_objects or {}), **kwargs}
        allowed = [n for n in inspect.signature(target.__init__).parameters if n not in _NOT_SETTINGS]
        persistence.check_agent_meta(meta, allowed, given=overrides)  # the schema save writes, field by field
        settings = meta["kwargs"]
        decoded = {k: persistence.decode_value(v, f"kwargs.{k}") for k, v in settings.items() if k not in overrides}
        if "learning_rate" in decoded:
            decoded["learning_rate"] = persistence.schedule_from_data(settings["learning_rate"])
        policy = overrides.pop("policy", None) or _policy_from_data(target, meta.get("policy"))
        decoded.update(overrides)
        policy_class = target.policy_aliases.get(policy, policy) if isinstance(policy, str) else policy
        if directory != (isinstance(policy_class, type) and issubclass(policy_class, CausalLMPolicy)):
            raise persistence.AgentFileError(
                f"{str(path)!r} is a directory, which only a language-model agent (CausalLMPolicy) is saved as; "
                f"its policy is {policy!r}" if directory else
                "the file names a language-model agent (CausalLMPolicy), which is saved as a directory (model/, "
                "tokenizer/, tpo_gym.json), never as a zip: a zip does not load a language model"
            )
        if directory:
            decoded["policy_kwargs"] = _directory_policy_kwargs(pathlib.Path(path), settings.get("policy_kwargs"),
                                                                overrides.get("policy_kwargs"))
        obs_space = persistence.space_from_data(meta.get("observation_space"), "observation_space")
        act_space = persistence.space_from_data(meta.get("action_space"), "action_space")
        if not directory:
            persistence.check_space_sizes(obs_space, act_space, weights)
        try:  # the constructor checks each setting: a bad one from the file is the file's error
            model = target(policy, None, device="cpu" if device == "auto" else device, _init_setup_model=False,
                           **decoded)
        except (ValueError, TypeError) as exc:
            error = persistence.setting_error(exc, settings, given=overrides)
            if error is None:
                raise
            raise error from None
        if model.sampling == "group" and model.group_size < 2 and "group_size" not in overrides:
            raise persistence.AgentFileError(f"field 'kwargs.group_size' is not valid: {target.__name__} compares K "
                                             f"candidates per context, K must be >= 2, got {model.group_size}")
        if directory:
            _load_directory_model(model, pathlib.Path(path), trust_remote_code, overrides.get("policy_kwargs"))
        model.observation_space, model.action_space = obs_space, act_space
        if env is not None:
            env_obj, _ = model._resolve_env(env)
            assert env_obj is not None
            from stable_baselines3.common.utils import check_for_correct_spaces

            check_for_correct_spaces(env_obj, obs_space, act_space)
            model.set_env(env)
        try:  # the policy checks its own settings (policy_kwargs) and the spaces
            model._setup_model()
        except (ValueError, TypeError) as exc:
            error = persistence.setting_error(exc, settings.get("policy_kwargs") or {}, prefix="kwargs.policy_kwargs")
            if error is None or not overrides.keys().isdisjoint(("policy", "policy_kwargs")):
                raise
            raise error from None
        try:
            if directory:
                if model.policy.lora is not None:  # type: ignore[attr-defined]
                    load_agent_adapter(model.policy.model, pathlib.Path(path) / "adapter")
            else:
                model.policy.load_state_dict(weights["policy"])
            if weights.get("optimizer"):
                model.policy.optimizer.load_state_dict(weights["optimizer"])
        except persistence.AgentFileError:
            raise
        except (RuntimeError, ValueError, KeyError, TypeError) as exc:
            raise persistence.AgentFileError(f"the weights in the file do not fit the policy ({exc})") from None
        state = meta["state"]  # checked by check_agent_meta
        model.num_timesteps, model._n_updates = state["num_timesteps"], state["n_updates"]
        model._iteration, model._rollout_index = state["iteration"], state["rollout_index"]
        model._base_seed, model.history = state["base_seed"], state["history"]
        return model

    def set_parameters(
        self, load_path_or_dict: str | dict[str, Any], exact_match: bool = True, device: torch.device | str = "auto"
    ) -> None:
        """Load policy (and optimiser) weights from an agent file or a ``get_parameters()`` dict, safely."""
        if isinstance(load_path_or_dict, dict):
            params = load_path_or_dict
        else:
            _, weights = persistence.read_agent_file(load_path_or_dict, device="cpu")
            params = weights
        self.policy.load_state_dict(params["policy"], strict=exact_match)
        if "optimizer" in params and params["optimizer"] is not None:
            self.policy.optimizer.load_state_dict(params["optimizer"])

    def get_parameters(self) -> dict[str, dict[str, Any]]:
        """``{"policy": state_dict, "optimizer": state_dict}``."""
        return {"policy": self.policy.state_dict(), "optimizer": self.policy.optimizer.state_dict()}

    # ------------------------------------------------------------------------------------------
    # helpers for the subclasses
    # ------------------------------------------------------------------------------------------
    @staticmethod
    def group_diagnostics(scores: torch.Tensor, mask: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """Fractions of zero-variance, all-fail (every score <= 0) and any-success (a score >= 1) groups
        (0-d tensors: read back with the iteration's record, see :func:`resolve_records`)."""
        from tpo_gym.objectives import zero_variance_groups

        valid = torch.ones(scores.shape[:-1], dtype=torch.bool, device=scores.device)
        if mask is not None:
            valid = mask.any(dim=-1)
        hi = scores if mask is None else scores.masked_fill(~mask, -math.inf)
        n = valid.sum().clamp(min=1)

        def frac(x: torch.Tensor) -> torch.Tensor:
            return (x & valid).sum() / n

        return {
            "zero_variance_fraction": frac(zero_variance_groups(scores, mask)),
            "all_fail_fraction": frac(hi.max(dim=-1).values <= 0),
            "any_success_fraction": frac(hi.max(dim=-1).values >= 1),
        }


class _ScaledSchedule:
    """``schedule(progress) * scale`` (the interaction-matched ``lr * sqrt(K)``)."""

    def __init__(self, schedule: Schedule, scale: float) -> None:
        self.schedule, self.scale = schedule, scale

    def __call__(self, progress_remaining: float) -> float:
        return float(self.schedule(progress_remaining)) * self.scale


def _policy_from_data(target: type[GroupAlgorithm], data: Any) -> str | type[CategoricalPolicy]:
    if isinstance(data, str):
        if data not in target.policy_aliases:
            raise persistence.AgentFileError(f"field 'policy' names an unknown alias {data!r}")
        return data
    if isinstance(data, dict) and set(data) == {"__class__"}:
        return persistence.class_from_name(data["__class__"], "policy", (CategoricalPolicy,))
    raise persistence.AgentFileError(f"field 'policy' must be a policy alias or a class name, got {data!r}")


def _directory_policy_kwargs(root: pathlib.Path, saved: Any, given: Any) -> dict[str, Any]:
    """The policy settings of a language-model agent directory, before its model is loaded.

    The file's ``policy_kwargs`` with its ``model_kwargs`` and ``lora`` checked against the allowlists
    (:func:`~tpo_gym.agents.lm.check_agent_model_kwargs`, :func:`~tpo_gym.agents.lm.check_agent_lora_kwargs`)
    and without the ``model`` it may name (never loaded from a file), then the caller's ``policy_kwargs``
    key by key. The directory must hold ``model/`` (a whole model) or, with ``lora``, ``adapter/`` (and then
    the caller passes the base model).
    """
    pk = dict(persistence.decode_value(saved or {}, "kwargs.policy_kwargs"))
    given = dict(given or {})
    named = pk.pop("model", None)
    if "tokenizer" in pk:
        raise persistence.AgentFileError("field 'kwargs.policy_kwargs.tokenizer' is not valid: an agent directory "
                                         "keeps its tokenizer in tokenizer/, never by name")
    if "model_kwargs" in pk and "model_kwargs" not in given:
        pk["model_kwargs"] = check_agent_model_kwargs(pk["model_kwargs"])
    if "lora" in pk and "lora" not in given:
        pk["lora"] = check_agent_lora_kwargs(pk["lora"])
    pk.update(given)
    lora = pk.get("lora") is not None
    if (root / "model").is_dir() == lora or (root / "adapter").is_dir() != lora:
        raise persistence.AgentFileError(
            f"{str(root)!r} must hold {'adapter/ (and no model/)' if lora else 'model/ (and no adapter/)'}: its "
            f"policy_kwargs {'set' if lora else 'do not set'} lora"
        )
    if not lora and "model" in given:
        raise ValueError(f"{str(root)!r} holds its model in model/: policy_kwargs={{'model': ...}} names the base "
                         "model of a LoRA directory only")
    if lora and pk.get("model") is None:
        raise persistence.AgentFileError(
            f"{str(root)!r} is a LoRA agent: only its adapter is saved, and the base model its file names "
            f"({named!r}) is not loaded from a file. Pass it yourself: load(path, policy_kwargs={{'model': {named!r}}})"
        )
    return pk


def _load_directory_model(model: GroupAlgorithm, root: pathlib.Path, trust_remote_code: bool, given: Any) -> None:
    """Put the model of ``model/`` (not for a LoRA directory: the caller passes its base model) and the tokenizer
    of ``tokenizer/`` into ``model.policy_kwargs``; local files only, no code run (see
    :func:`~tpo_gym.agents.lm.load_agent_model`)."""
    pk = model.policy_kwargs
    if pk.get("model") is None:
        field = "policy_kwargs" if "model_kwargs" in (given or {}) else "kwargs.policy_kwargs"
        mkw = check_agent_model_kwargs(pk.get("model_kwargs"), f"{field}.model_kwargs")
        try:
            dtype = resolve_dtype(pk.get("dtype", "auto"), model.device)
        except ValueError as exc:
            if "dtype" in (given or {}):
                raise
            raise persistence.AgentFileError(f"field 'kwargs.policy_kwargs.dtype' is not valid: {exc}") from None
        pk["model"] = load_agent_model(root / "model", mkw, dtype, trust_remote_code)
    if pk.get("tokenizer") is None:
        pk["tokenizer"] = load_agent_tokenizer(root / "tokenizer", trust_remote_code)


def _package_version() -> str:
    try:
        from importlib.metadata import version

        return version("tpo-gym")
    except Exception:  # noqa: BLE001 - an uninstalled checkout has no metadata
        return "unknown"
