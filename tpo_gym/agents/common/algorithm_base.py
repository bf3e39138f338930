"""The construction half of every tpo-gym agent, on Stable-Baselines3's ``BaseAlgorithm``: settings, env, what a
group is, the policy and its seeding, ``predict``, ``save`` / ``load``.

:class:`AlgorithmBase` is to :class:`~tpo_gym.agents.common.base.GroupAlgorithm` what SB3's ``BaseAlgorithm`` is to
``OnPolicyAlgorithm``: it holds everything but the iteration (rollouts, update, ``learn``), which
:mod:`~tpo_gym.agents.common.base` adds. Its arguments are documented on ``GroupAlgorithm``.
"""

from __future__ import annotations

import inspect
import math
import pathlib
from typing import Any, ClassVar, TypeVar

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.type_aliases import GymEnv, Schedule
from stable_baselines3.common.utils import FloatSchedule

from tpo_gym._validation import check_bool, check_choice, check_device, check_float, check_int, check_options
from tpo_gym.agents.common import persistence
from tpo_gym.agents.common.env_copies import reward_wrappers
from tpo_gym.agents.common.env_setup import check_spaces, resolve_env
from tpo_gym.agents.common.grouping import Grouping, resolve_grouping
from tpo_gym.agents.common.registry import AlgorithmSpec
from tpo_gym.agents.common.sampling import (
    RolloutBatch,
    RolloutEnv,
    RolloutSource,
    make_rollout_env,
    scoring_available,
    tensor_env_available,
)
from tpo_gym.agents.common.sb3_conventions import check_n_threads, check_tensorboard_log
from tpo_gym.agents.lm.policy import CausalLMPolicy
from tpo_gym.agents.lm.text_rollouts import TextBatch
from tpo_gym.agents.policies.categorical import CategoricalPolicy, MlpPolicy
from tpo_gym.agents.policies.gaussian import GaussianMlpPolicy, check_box_agent
from tpo_gym.agents.policies.transformer import TransformerPolicy

__all__ = ["AlgorithmBase", "LEVELS", "BUDGETS"]

LEVELS = ("auto", "token", "sequence")
BUDGETS = ("prompt", "interaction")
SelfAlgorithm = TypeVar("SelfAlgorithm", bound="AlgorithmBase")


class AlgorithmBase(BaseAlgorithm):
    """Settings, env, grouping, policy, seeding, ``predict`` and ``save`` / ``load`` of an agent (not used
    directly: see :class:`~tpo_gym.agents.common.base.GroupAlgorithm`, whose docstring lists the arguments)."""

    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {
        "MlpPolicy": MlpPolicy,
        "TransformerPolicy": TransformerPolicy,
        "CausalLMPolicy": CausalLMPolicy,
    }
    #: What the class is (:class:`~tpo_gym.agents.common.registry.AlgorithmSpec`), declared once by each agent class.
    spec: ClassVar[AlgorithmSpec]
    #: ``spec.sampling``, set from the class's spec: the method's side of what a group is
    #: (:func:`~tpo_gym.agents.common.grouping.resolve_grouping` turns it and ``level`` into :attr:`grouping`).
    sampling: ClassVar[str] = "group"
    #: Base arguments a subclass does not take (its method fixes them), with their fixed value.
    fixed_params: ClassVar[dict[str, Any]] = {}
    policy: CategoricalPolicy

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
        skip_uninformative_steps: bool = False,
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
        defaults = inspect.signature(AlgorithmBase.__init__).parameters
        for name, fixed in self.fixed_params.items():
            if name in given and given[name] != defaults[name].default and given[name] != fixed:
                raise ValueError(f"{type(self).__name__} takes no {name} argument (its method fixes it to {fixed!r})")
        level = self.fixed_params.get("level", level)
        budget = self.fixed_params.get("budget", budget)
        group_size = self.fixed_params.get("group_size", group_size)
        self.batch_size = check_int("batch_size", batch_size, 1)
        self.group_size = check_int("group_size", group_size, 1)
        self.n_epochs = check_int("n_epochs", n_epochs, 1)
        self.level = self._level_asked = check_choice("level", level, LEVELS)
        self.budget = check_choice("budget", budget, BUDGETS)
        policy_class = self.policy_aliases.get(policy) if isinstance(policy, str) else policy
        self._text = isinstance(policy_class, type) and issubclass(policy_class, CausalLMPolicy)
        self._policy_name = policy if isinstance(policy, str) else getattr(policy, "__name__", str(policy))
        self._policy_arg = policy_class
        if learning_rate is None:
            learning_rate = 1e-5 if self._text else 1e-3
        if not callable(learning_rate):
            learning_rate = check_float("learning_rate", learning_rate, 0.0, strict_min=True)
        self.max_grad_norm = None if max_grad_norm is None else check_float(
            "max_grad_norm", max_grad_norm, 0.0, strict_min=True)
        self.skip_uninformative_steps = check_bool("skip_uninformative_steps", skip_uninformative_steps)
        if self.skip_uninformative_steps and self.spec.sampling != "group":
            raise ValueError(f"skip_uninformative_steps=True applies to group methods (a group carries signal when its "
                             f"scores differ); {type(self).__name__} samples {self.spec.sampling!r}")
        self.n_threads = check_n_threads(n_threads)
        tensorboard_log = check_tensorboard_log(tensorboard_log)
        self.stats_window_size = check_int("stats_window_size", stats_window_size, 1)
        if seed is not None:
            seed = check_int("seed", seed, 0)
        policy_kwargs = check_options(policy_kwargs, "policy_kwargs")
        device = check_device(device)  # "cuda" without CUDA is an error; "auto" is the way to fall back
        if isinstance(policy, str) and policy not in self.policy_aliases:
            raise ValueError(f"unknown policy alias {policy!r}; allowed: {sorted(self.policy_aliases)} or a class")
        if env is None and _init_setup_model:
            raise ValueError(f"{type(self).__name__} needs an env to build its policy (its spaces come from the env): "
                             "pass an env instance or id; env=None is only for load (or _init_setup_model=False)")
        env, self._source = resolve_env(env, type(self).__name__)
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
            supported_action_spaces=(spaces.Discrete, spaces.Text, spaces.Box),
        )
        self._base_seed = int(seed) if seed is not None else int(np.random.SeedSequence().entropy % (2**62))
        self._iteration = 0  # iterations since the last reset_num_timesteps=True (history index)
        self._rollout_index = 0  # rollouts collected over this agent's life (seeds the next one)
        self.history: list[dict[str, float]] = []
        self._rollout_env: RolloutEnv | None = None
        self.rollout_batch: RolloutBatch | TextBatch | None = None
        self._text_env: gym.Env[Any, Any] | None = None
        self.grouping: Grouping | None = None  # what a group is: decided once per env (grouping module)
        if self._source is not None:
            self._resolve_grouping()
        if _init_setup_model:
            self._setup_model()

    # ------------------------------------------------------------------------------------------
    # env and grouping
    # ------------------------------------------------------------------------------------------
    @property
    def is_text(self) -> bool:
        """Whether the policy is a language model (``CausalLMPolicy``) on a text env."""
        return self._text

    @property
    def iteration(self) -> int:
        """Iterations since the last ``learn(reset_num_timesteps=True)``: the index of the next ``history`` record."""
        return self._iteration

    @property
    def rollout_source(self) -> RolloutSource | None:
        """Where this agent's rollout envs are rebuilt from (``None`` without an env)."""
        return self._source

    def _check_spaces(self, env: GymEnv) -> None:
        check_spaces(env, who=type(self).__name__, text_policy=self._text, policy_name=self._policy_name,
                     sampling=self.sampling)
        if isinstance(env.action_space, spaces.Box):  # the Gaussian policy (tpo_gym.agents.policies.gaussian)
            check_box_agent(self, env.action_space, self._policy_arg)

    def choose_grouping(self, native: bool) -> Grouping:
        """The grouping of this method on an env with (``native``) or without the group API (subclasses with a
        ``candidates`` argument pass ``single_candidate``)."""
        return resolve_grouping(self.sampling, self.level, self.group_size, native=native, text=self._text)

    def _resolve_grouping(self) -> None:
        """Decide, once per env, what a group is; raise if the env cannot provide it.

        ``level="auto"`` becomes ``"token"`` on an env that scores candidates (a native vector env, or a single env
        with ``score_candidates`` and no extra wrappers) and ``"sequence"`` otherwise: :attr:`level` holds the
        choice, and ``verbose >= 1`` prints it (as SB3 prints the device). The choice is made again for each env
        (``set_env``): a model made with ``level="auto"`` on a token-level env and given a sequence-level one
        goes to ``"sequence"``, as it would have been made on that env.
        """
        assert self._source is not None
        if self.sampling == "group" and getattr(self, "_level_asked", self.level) == "auto":
            self.level = "auto"
        native = scoring_available(self._source) or self._text
        grouping = self.choose_grouping(native)
        if grouping.compares_k and self.group_size < 2:
            raise ValueError(f"{type(self).__name__} compares K candidates per context: group_size must be an "
                             f"integer >= 2, got {self.group_size}")
        if grouping.needs_group_api and not native:
            what = {"candidates": "level='token'", "actions": f"{type(self).__name__}"}[grouping.kind]
            if self.sampling == "oracle":
                what = f"{type(self).__name__} (the supervised oracle)"
            wrapped = self._source.wrapper_names()
            why = (f"this env is wrapped ({', '.join(wrapped)}), and wrapped envs roll out through their wrappers "
                   "(which may change rewards) in a sync vector env, without the group API" if wrapped else
                   f"{self._env_name()} has no score_candidates method (give its class score_candidates(candidates) "
                   "-> float32 [K], the reward of each candidate action now, checked by "
                   "tpo_gym.envs.check_group_env)")
            hint = ("use level='sequence' (K same-seed rollouts per context)" if grouping.kind == "candidates"
                    else "pass an unwrapped env with score_candidates")
            raise ValueError(f"{what} needs an env with the tpo_gym group API (score_candidates); {why}; or {hint}")
        if self.sampling == "group" and self.level == "auto":
            self.level = "token" if grouping.kind == "candidates" else "sequence"
            if self.verbose >= 1 and grouping.compares_k:
                why = ("K completions per prompt" if self._text else
                       f"K candidates scored per state: {self._env_name()} has score_candidates"
                       if grouping.kind == "candidates" else
                       f"K same-seed rollouts per context: {self._env_name()} has no score_candidates")
                print(f"Using level='{self.level}' ({why})")
        self.grouping = grouping
        self._rollout_env = self._text_env = None

    def _env_name(self) -> str:
        """The env's id, else its class name (for messages)."""
        env = getattr(self, "env", None)
        spec = self._source.spec if self._source is not None else None
        if spec is not None:
            return str(spec.id)
        if env is not None:
            try:
                return type(env.unwrapped.envs[0].unwrapped).__name__  # type: ignore[union-attr]
            except AttributeError:
                return type(env.unwrapped).__name__
        return "this env"

    def set_env(self, env: GymEnv | str, force_reset: bool = True) -> None:
        """Use a new env (same spaces; an id works too); rollouts are rebuilt from it."""
        env, source = resolve_env(env, type(self).__name__)
        assert env is not None
        self._check_spaces(env)
        wrapped = self._wrap_env(env, self.verbose, monitor_wrapper=False)
        self.n_envs = wrapped.num_envs  # rollouts use their own vector env: any number of envs is fine
        super().set_env(wrapped, force_reset=force_reset)
        self._source = source
        self._resolve_grouping()

    def require_grouping(self) -> Grouping:
        """:attr:`grouping`, or ``ValueError`` when the agent has no env yet."""
        if self.grouping is None:
            raise ValueError("no env: pass one to the constructor, to load(), or call set_env() first")
        return self.grouping

    @property
    def n_rollouts(self) -> int:
        """Episodes rolled out per iteration: B, or B*K (sequence level; interaction budget)."""
        kind = self.require_grouping().kind
        if kind == "rollouts" or (kind == "none" and self.budget == "interaction"):
            return self.batch_size * self.group_size
        return self.batch_size

    def _get_text_env(self) -> gym.Env[Any, Any]:
        if self._text_env is None:
            assert self._source is not None
            source = self._source
            self._text_env = gym.make(source.spec) if source.spec is not None else source.env_fn()  # type: ignore
            if not hasattr(self._text_env.unwrapped, "score_candidates"):
                raise ValueError("a text env needs the group API: score_candidates(list of completions) -> [K]")
            if wrapped := reward_wrappers(self._text_env):
                raise ValueError(
                    f"{type(self).__name__} scores a text env's completions with its score_candidates, which the "
                    f"wrapper(s) {', '.join(wrapped)} around it cannot change (they may change its rewards, which "
                    "would then be ignored); pass the env without them, or give the env class a score_candidates "
                    "that scores as you want")
        return self._text_env

    def get_rollout_env(self) -> RolloutEnv:
        """The vector env this agent's discrete rollouts run in (built on first use, rebuilt when
        :attr:`n_rollouts` changes)."""
        if self._rollout_env is None or self._rollout_env.num_envs != self.n_rollouts:
            assert self._source is not None
            self._rollout_env = make_rollout_env(self._source, self.n_rollouts, self.rollout_device)
        return self._rollout_env

    @property
    def rollout_device(self) -> torch.device | None:
        """The device of on-device rollouts (see ``rollouts_on_device``), or ``None`` for the numpy envs."""
        wanted = getattr(self, "rollouts_on_device", None)
        if wanted is False or self._text:
            return None
        assert self._source is not None
        if wanted is None and (self.device.type != "cuda" or not tensor_env_available(self._source)):
            return None
        return self.device

    @property
    def fixed_steps_per_iteration(self) -> int | None:
        """Env steps every iteration takes, ``n_rollouts x horizon``, on a fixed-length env; ``None`` where episodes
        vary in length (an env bounded by its ``max_episode_steps``, such as CartPole)."""
        if self._text:
            return self.n_rollouts  # one-step episodes: one completion, one env step
        env = self.get_rollout_env()
        return self.n_rollouts * env.horizon if env.fixed_length else None

    @property
    def steps_per_iteration(self) -> int:
        """Env timesteps one iteration takes (``num_timesteps`` counts the steps actually taken).

        Fixed-length envs (every tpo_gym env: token tasks H, bandits and MNIST 1): ``n_rollouts x H``, so
        ``learn(total_timesteps=n * model.steps_per_iteration)`` runs exactly ``n`` iterations. Envs whose
        episodes vary (CartPole: an episode ends when the pole falls) have no such number: it is then the
        steps the last iteration of ``history`` took (they grow as the policy improves), and before the
        first iteration it raises ``ValueError``. Scored candidates are not env steps.
        """
        fixed = self.fixed_steps_per_iteration
        if fixed is not None:
            return fixed
        if not self.history:
            name = self._source.spec.id if self._source is not None and self._source.spec is not None else "this env"
            raise ValueError(
                f"steps_per_iteration: the episodes of {name} vary in length (up to {self.get_rollout_env().horizon} "
                "steps), so an iteration's env steps are known only once it ran; give learn() total_timesteps in env "
                "steps (it stops at the first iteration that reaches them, as SB3 does)")
        previous = self.history[-2]["num_timesteps"] if len(self.history) > 1 else 0
        return int(self.history[-1]["num_timesteps"] - previous)

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
        policy_class = self.policy_class
        if isinstance(self.action_space, spaces.Box) and policy_class is MlpPolicy:  # "MlpPolicy" on Box actions
            policy_class = GaussianMlpPolicy
        self.policy = policy_class(  # type: ignore[assignment]
            self.observation_space, self.action_space, self.lr_schedule, **self.policy_kwargs, **extra
        )
        self.policy = self.policy.to(self.device)

    def build_policy(self) -> None:
        """Build the policy and its optimiser from the settings (what the constructor does unless
        ``_init_setup_model=False``, as ``load`` builds agents)."""
        self._setup_model()

    def set_random_seed(self, seed: int | None = None) -> None:
        """Seed python, numpy and torch (initialisation) and restart this agent's rollout seeds."""
        if seed is None:
            return
        super().set_random_seed(seed)
        self._base_seed = int(seed)
        self._rollout_index = 0
        self.seed = seed

    # ------------------------------------------------------------------------------------------
    # predict, save / load
    # ------------------------------------------------------------------------------------------
    # predict: SB3's ``BaseAlgorithm.predict`` (the policy's ``predict``, which refuses observations outside
    # the space with a ``ValueError`` naming them)

    def training_state(self) -> dict[str, Any]:
        """The counters and history a file keeps (``state`` of :mod:`~tpo_gym.agents.common.persistence`'s schema)."""
        return {"num_timesteps": int(self.num_timesteps), "n_updates": int(self._n_updates),
                "iteration": int(self._iteration), "rollout_index": int(self._rollout_index),
                "base_seed": int(self._base_seed), "history": self.history}

    def set_training_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`training_state` returned (a loaded agent continues where it was saved)."""
        self.num_timesteps, self._n_updates = state["num_timesteps"], state["n_updates"]
        self._iteration, self._rollout_index = state["iteration"], state["rollout_index"]
        self._base_seed, self.history = state["base_seed"], state["history"]

    def save(self, path: str | pathlib.Path | Any, exclude: Any = None, include: Any = None) -> None:
        """Save the agent as a zip of plain JSON settings and ``weights_only`` tensors (no pickle); a language
        model as a directory (:func:`~tpo_gym.agents.common.persistence.save_agent`).

        ``exclude`` / ``include`` (SB3's arguments) are not used: the file always holds exactly the
        settings, counters, history, spaces and the policy / optimiser weights.
        """
        persistence.save_agent(self, path)

    @classmethod
    def load(  # type: ignore[override]
        cls: type[SelfAlgorithm],
        path: str | pathlib.Path | Any,
        env: GymEnv | str | None = None,
        device: torch.device | str = "auto",
        custom_objects: dict[str, Any] | None = None,
        print_system_info: bool = False,
        force_reset: bool = True,
        trust_remote_code: bool = False,
        **kwargs: Any,
    ) -> SelfAlgorithm:
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
        :raises ValueError: (:class:`~tpo_gym.agents.common.persistence.AgentFileError`) naming the bad part.
        """
        trust_remote_code = check_bool("trust_remote_code", trust_remote_code)
        return persistence.load_agent(cls, path, env, device, {**(custom_objects or {}), **kwargs},
                                      trust_remote_code)

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


class _ScaledSchedule:
    """``schedule(progress) * scale`` (the interaction-matched ``lr * sqrt(K)``)."""

    def __init__(self, schedule: Schedule, scale: float) -> None:
        self.schedule, self.scale = schedule, scale

    def __call__(self, progress_remaining: float) -> float:
        return float(self.schedule(progress_remaining)) * self.scale
