"""Reasoning Gym for TRL: the prompt dataset and the reward function of a Reasoning Gym dataset. Re-exported by
:mod:`tpo_gym.integrations.trl`."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any


def _reasoning_gym_env(source: Any, size: int, seed: int, config: dict[str, Any]) -> Any:
    """The ``ReasoningGymEnv`` of a dataset name, a ``tpo_gym/ReasoningGym-v0`` env, or the env id."""
    from tpo_gym.envs.reasoning_gym_env import ReasoningGymEnv

    if isinstance(source, str) and source.startswith("tpo_gym/"):
        import gymnasium as gym

        import tpo_gym

        gym.register_envs(tpo_gym)
        if source != "tpo_gym/ReasoningGym-v0":
            raise ValueError(f"source must be a Reasoning Gym dataset name or 'tpo_gym/ReasoningGym-v0', "
                             f"got {source!r}")
        config = dict(config)
        dataset = config.pop("dataset", "graph_color")
        return ReasoningGymEnv(dataset, size=size, seed=seed, **config)
    if isinstance(source, str):
        return ReasoningGymEnv(source, size=size, seed=seed, **config)
    env = getattr(source, "unwrapped", source)
    if isinstance(env, ReasoningGymEnv):
        if config:
            raise ValueError(f"dataset config {sorted(config)} is given by the env itself; pass no config keywords")
        return env
    raise ValueError(f"source must be a Reasoning Gym dataset name, 'tpo_gym/ReasoningGym-v0' or a ReasoningGym "
                     f"env, got {source!r}")


def reasoning_gym_dataset(source: Any = "graph_color", *, size: int = 500, seed: int = 0, tokenizer: Any = None,
                          prompt_format: Any = "env", **config: Any) -> Any:
    """TRL's prompt dataset (a ``datasets.Dataset``) of every entry of a Reasoning Gym dataset.

    Rows: ``prompt``, ``index`` (the entry index, read by :func:`reasoning_gym_reward`), ``question``,
    ``answer`` (text; ``None`` where the dataset has no single answer, as graph_color, whose
    scorer checks the colouring) and ``metadata`` (JSON text). ``prompt`` is the chat messages ``[system, user]`` (TRL
    applies the chat template) with the env's system prompt, or, when the prompt format needs text
    (a prefill, a custom layout), the prompt text built with ``tokenizer``
    (:func:`tpo_gym.agents.lm.prompts.build_prompt`; the model continues it).

    :param source: a Reasoning Gym dataset name (``"basic_arithmetic"``), ``"tpo_gym/ReasoningGym-v0"``
        (with ``dataset=...`` in ``config``) or a ``ReasoningGym`` env.
    :param size: number of entries; ``seed``: the dataset's seed (as the env's arguments).
    :param tokenizer: needed for text prompts (a prompt format with a prefill).
    :param prompt_format: ``"env"``, ``"answer_prefill"``, a dict or a :class:`~tpo_gym.agents.lm.prompts.PromptFormat`.
    :param config: the dataset's own config (``min_terms=2``, ...).
    """
    from datasets import Dataset

    from tpo_gym.agents.lm.prompts import PromptFormat, build_prompt

    env = _reasoning_gym_env(source, size, seed, config)
    fmt = PromptFormat.from_data(prompt_format)
    as_messages = not fmt.prefill and fmt.chat_template and fmt.system in ("env", "none", "custom")
    if not as_messages and tokenizer is None:
        raise ValueError("this prompt_format builds text prompts (a prefill or no chat template): pass tokenizer=")
    rows = []
    for index in range(env.size):
        entry = env.dataset[index]
        question = str(entry["question"])
        if as_messages:
            system = {"env": env.system_prompt, "custom": fmt.system_text, "none": ""}[fmt.system]
            user = question if not fmt.instruction else f"{question}\n\n{fmt.instruction}"
            prompt: Any = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": user}]
        else:
            prompt = build_prompt(tokenizer, question, env.system_prompt, fmt)
        answer = entry.get("answer")
        rows.append({"prompt": prompt, "index": index, "question": question,
                     "answer": None if answer is None else str(answer),
                     "metadata": json.dumps(entry.get("metadata", {}), default=str)})
    return Dataset.from_list(rows)


def reasoning_gym_reward(source: Any = "graph_color", *, size: int = 500, seed: int = 0, prompt_format: Any = "env",
                         **config: Any) -> Callable[..., list[float]]:
    """A TRL reward function scoring completions with the Reasoning Gym dataset's own scorer.

    ``reward(prompts, completions, index, **kwargs) -> list[float]``: for each completion, the
    env's score of entry ``index`` (``extract_answer`` then the dataset's ``score_answer``; the
    prompt format's prefill is prepended and its tag closed, as for tpo-gym's LM policy). Use the same
    ``source`` / ``size`` / ``seed`` / config as :func:`reasoning_gym_dataset`.
    """
    from tpo_gym.agents.lm.prompts import PromptFormat, completion_for_env

    env = _reasoning_gym_env(source, size, seed, config)
    fmt = PromptFormat.from_data(prompt_format)

    def reward(prompts: Any = None, completions: Any = None, index: Any = None, **kwargs: Any) -> list[float]:
        if completions is None or index is None:
            raise ValueError("the Reasoning Gym reward needs the completions and the dataset's 'index' column")
        if len(completions) != len(index):
            raise ValueError(f"{len(completions)} completions but {len(index)} indices")
        out = []
        for completion, i in zip(completions, index, strict=True):
            text = completion[-1]["content"] if isinstance(completion, list) else completion
            env.reset(options={"index": int(i)})
            out.append(float(env.score_candidates([completion_for_env(str(text), fmt)])[0]))
        return out

    reward.__name__ = f"reasoning_gym_{env.dataset_name}"
    return reward

