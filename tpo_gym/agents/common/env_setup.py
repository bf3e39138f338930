"""The env an agent is given: which forms are accepted, where its rollouts are rebuilt from, which spaces work.

An agent keeps the env SB3 keeps (spaces, ``get_env``) but rolls out in its own vector copies, rebuilt from a
:class:`~tpo_gym.agents.common.env_copies.RolloutSource` (the env's spec, or a copy factory of an instance).
:func:`resolve_env` turns what a user passes into that pair; :func:`check_spaces` refuses the spaces an agent (or
its policy) cannot train on, naming what it got and what works.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium as gym
from gymnasium import spaces
from stable_baselines3.common.type_aliases import GymEnv
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv, VecEnvWrapper, VecMonitor

from tpo_gym.agents.common.env_copies import RolloutSource
from tpo_gym.agents.lm.text_rollouts import TextVecEnv, is_text_env

__all__ = ["resolve_env", "check_spaces"]


def resolve_env(env: Any, who: str) -> tuple[GymEnv | None, RolloutSource | None]:
    """The env SB3 keeps and where rollouts are rebuilt from (``who`` names the agent class in errors).

    Accepted: ``None``, a registered id, a Gymnasium env, a Gymnasium ``VectorEnv`` with a spec
    (``gym.make_vec``), an SB3 ``DummyVecEnv`` / ``SubprocVecEnv`` (optionally in ``VecMonitor``). A Gymnasium
    env keeps its wrappers, also those that do not record their constructor arguments (copied, see
    :func:`~tpo_gym.agents.common.sampling.rebuild_plan`); a ``SubprocVecEnv`` whose envs carry such wrappers is refused
    (``ValueError``: their wrapper objects live in the subprocesses), as a wrapper that cannot be copied is
    (``TypeError``).
    """
    if env is None:
        return None, None
    if isinstance(env, str):
        env = gym.make(env)
    if isinstance(env, gym.vector.VectorEnv):
        spec = getattr(env, "spec", None)
        if spec is None:
            raise ValueError(
                f"{who} got a Gymnasium VectorEnv without a spec; pass the single env, its id, "
                "or a vector env made by gym.make_vec (rollouts are rebuilt from the env spec)"
            )
        vector_only = ("num_envs", "vectorization_mode", "vector_kwargs", "wrappers", "autoreset_mode")
        spec = dataclasses.replace(spec, kwargs={k: v for k, v in spec.kwargs.items() if k not in vector_only})
        return gym.make(spec), RolloutSource.from_spec(spec)
    if isinstance(env, VecEnvWrapper):
        inner = env.venv if isinstance(env, VecMonitor) else None
        if inner is None or isinstance(inner, VecEnvWrapper):
            raise ValueError(
                f"{who} does not support the VecEnv wrapper {type(env).__name__}: its rollouts "
                "run in the agent's own vector env, so wrappers that change observations or rewards "
                "(VecNormalize, VecFrameStack, ...) would be skipped. Supported: an env id, a Gymnasium env or "
                "VectorEnv, an SB3 DummyVecEnv / SubprocVecEnv (optionally in VecMonitor)"
            )
        return env, _source_of_vecenv(inner, who)
    if isinstance(env, VecEnv):
        return env, _source_of_vecenv(env, who)
    if isinstance(env, gym.Env):
        if is_text_env(env.observation_space, env.action_space):
            return TextVecEnv(env), RolloutSource.from_env(env, who)
        return env, RolloutSource.from_env(env, who)
    raise ValueError(
        f"env must be an env id, a Gymnasium env or VectorEnv, or an SB3 VecEnv; got {type(env).__name__}"
    )


def _source_of_vecenv(venv: VecEnv, who: str) -> RolloutSource:
    if isinstance(venv, (DummyVecEnv, TextVecEnv)):
        return RolloutSource.from_env(venv.envs[0], who)
    spec = venv.get_attr("spec", [0])[0]
    if spec is None:
        raise ValueError(
            f"{who} cannot rebuild the envs of this {type(venv).__name__}: they have no spec. "
            "Register the env (gymnasium.register) or pass an env instance"
        )
    lost = [w.name for w in spec.additional_wrappers if w.kwargs is None and w.name != "Monitor"]
    if lost:
        raise ValueError(
            f"{who} cannot rebuild the envs of this {type(venv).__name__}: its rollouts run in its own copies, "
            f"rebuilt from the env spec, and the wrapper(s) {', '.join(lost)} do not record their constructor "
            "arguments (gymnasium.utils.RecordConstructorArgs), so the spec cannot re-create them (and the wrapped "
            "envs live in the subprocesses). Pass the wrapped env itself or a DummyVecEnv of it (its wrappers are "
            "copied), or make the wrappers inherit gymnasium.utils.RecordConstructorArgs"
        )
    return RolloutSource.from_spec(spec)


def check_spaces(env: GymEnv, *, who: str, text_policy: bool, policy_name: str, sampling: str) -> None:
    """Raise ``ValueError`` for spaces the agent ``who`` (or its policy) does not support.

    :param text_policy: the policy is a language model (``CausalLMPolicy``).
    :param policy_name: the policy's name, for the message.
    :param sampling: the method's ``AlgorithmSpec.sampling`` (only group methods train language models).
    """
    text = is_text_env(env.observation_space, env.action_space)
    if text_policy and not text:
        raise ValueError(
            f"CausalLMPolicy needs a text env (Text observation and action spaces, e.g. tpo_gym/ReasoningGym-v0), "
            f"got observations {env.observation_space} and actions {env.action_space}"
        )
    if text and not text_policy:
        raise ValueError(
            f"a text env (Text observations and actions) needs policy='CausalLMPolicy'; got {policy_name} "
            "(MlpPolicy / TransformerPolicy take Discrete actions, MlpPolicy Box actions too)"
        )
    if text_policy:
        if sampling != "group":
            raise ValueError(f"{who} does not train language models; use TPO, GRPO or GroupPG")
        return
    if not isinstance(env.action_space, (spaces.Discrete, spaces.Box)):
        raise ValueError(
            f"{who} supports Discrete and bounded Box action spaces (Box: policy='MlpPolicy', a diagonal Gaussian), "
            f"got {env.action_space}"
        )
    if isinstance(env.observation_space, (spaces.Dict, spaces.Tuple)):
        space = type(env.observation_space).__name__
        raise ValueError(f"{who} does not support {space} observations (use Box or Discrete)")
