"""Where the agents act in text envs: the rollouts of a language-model policy, and the text env's ``VecEnv``.

This module and :mod:`tpo_gym.agents.common.sampling` are where the agents act in environments
(:mod:`~tpo_gym.agents.common.sampling`: discrete envs; this module: text envs, ``Text`` observation and action spaces
and the group API ``score_candidates(list of completions) -> [K]``, e.g. ``tpo_gym/ReasoningGym-v0``).
:func:`collect_text_rollouts` gathers one iteration's :class:`TextBatch` with a
:class:`~tpo_gym.agents.lm.CausalLMPolicy`:

1. **Prompts.** G contexts are drawn (``env.reset(seed=...)``); each question becomes a prompt through
   the policy's :class:`~tpo_gym.agents.lm.prompts.PromptFormat` and the tokenizer's chat template.
2. **Generation.** ``model.generate`` samples K completions per prompt (left padding,
   ``num_return_sequences=K``, so the K completions of a prompt are contiguous and a group is a reshape
   ``[G*K] -> [G, K]``).
3. **Scores.** Each completion is scored once by the env's own scorer: ``[G, K]``.
4. **Old log-probs.** A separate forward (no grad) gives the sequence log-prob of each completion at the
   sampling temperature (:func:`~tpo_gym.agents.lm.sequence_logprobs`), and with a KL those under the frozen
   reference model.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.vec_env.base_vec_env import VecEnv

from tpo_gym.agents.lm.prompts import completion_for_env

if TYPE_CHECKING:
    from tpo_gym.agents.lm.policy import CausalLMPolicy

__all__ = ["TextBatch", "completion_mask", "collect_text_rollouts", "is_text_env", "TextVecEnv"]


def is_text_env(observation_space: spaces.Space, action_space: spaces.Space) -> bool:
    """Whether the spaces are those of a text env (``Text`` observations and actions)."""
    return isinstance(observation_space, spaces.Text) and isinstance(action_space, spaces.Text)


@dataclasses.dataclass
class TextBatch:
    """The rollouts of one iteration on a text env: G prompts x K completions.

    :param prompts: the G prompt texts (chat template applied, prefill included).
    :param completions: the G*K generated texts (without the prefill), group-contiguous.
    :param prompt_ids: ``[G, P]`` left-padded prompt tokens; ``prompt_mask`` their attention mask.
    :param completion_ids: ``[G*K, T]``; ``token_mask`` ``bool [G*K, T]`` valid tokens (to the first EOS).
    :param scores: ``float32 [G, K]`` env scores.
    :param logp_old: ``[G, K]`` sequence log-probs under pi_old (length-normalised if the policy is).
    :param logp_ref: ``[G, K]`` under the frozen reference model, or ``None``.
    :param token_logp_ref: ``[G*K, T]`` token log-probs under the frozen reference model, or ``None``
        (with ``logp_ref``; TPO's per-token KL penalty reads them).
    :param group_size: K.
    :param stats: timings and sizes of the rollout (generate / score / logprob seconds, tokens/s).
    """

    prompts: list[str]
    completions: list[str]
    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    token_mask: torch.Tensor
    scores: torch.Tensor
    logp_old: torch.Tensor
    logp_ref: torch.Tensor | None
    group_size: int
    stats: dict[str, float]
    token_logp_ref: torch.Tensor | None = None

    @property
    def n_groups(self) -> int:
        """G."""
        return int(self.scores.shape[0])

    @property
    def n_steps(self) -> int:
        """Env steps: one per completion (one-step episodes)."""
        return int(self.scores.numel())

    @property
    def error(self) -> float:
        """1 - mean score."""
        return 1.0 - float(self.scores.mean())

    @property
    def returns(self) -> torch.Tensor:
        """Per-completion returns (the scores)."""
        return self.scores.reshape(-1)

    @property
    def episode_scores(self) -> torch.Tensor:
        """Per-completion scores ``[G*K]``, group-contiguous (as ``RolloutBatch.episode_scores`` at sequence level)."""
        return self.scores.reshape(-1)

    @property
    def lengths(self) -> torch.Tensor:
        """Completion lengths in tokens."""
        return self.token_mask.sum(dim=1)

    def group_rows(self, start: int, stop: int) -> slice:
        """Completion rows of groups ``start .. stop-1``."""
        return slice(start * self.group_size, stop * self.group_size)


def completion_mask(
    completion_ids: torch.Tensor, eos_token_id: int | list[int], pad_token_id: int | None = None
) -> torch.Tensor:
    """``bool [N, T]``: valid completion tokens, up to and including the first EOS (none after it)."""
    eos = torch.tensor(eos_token_id if isinstance(eos_token_id, list) else [eos_token_id],
                       device=completion_ids.device)
    is_eos = torch.isin(completion_ids, eos)
    after_eos = (is_eos.cumsum(dim=1) - is_eos.long()) > 0
    return ~after_eos


def collect_text_rollouts(policy: CausalLMPolicy, env: Any, n_groups: int, k: int, seed: int,
                          with_reference: bool = False) -> TextBatch:
    """Draw ``n_groups`` questions from ``env``, sample ``k`` completions each with ``policy``, score them once.

    ``seed`` seeds the env resets and the torch generator of the sampling; ``with_reference`` also computes
    the log-probs under the policy's frozen reference model (``logp_ref``, ``token_logp_ref``).
    """

    rng = np.random.default_rng(seed)
    seeds = [int(s) for s in rng.integers(2**31 - 1, size=n_groups)]
    items = []
    for s in seeds:
        obs, info = env.reset(seed=s)
        items.append({"question": info.get("question", obs), "system_prompt": info.get("system_prompt")})
    prompts = [policy.prompt_of(i) for i in items]
    prompt_ids, prompt_mask = policy.encode(prompts)
    torch.manual_seed(int(rng.integers(2**62)))
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(int(rng.integers(2**62)))
    start = time.perf_counter()
    completion_ids = policy.generate_ids(prompt_ids, prompt_mask, k)
    t_generate = time.perf_counter() - start
    token_mask = completion_mask(completion_ids, policy.tokenizer.eos_token_id, policy.tokenizer.pad_token_id)
    texts = policy.decode(completion_ids, token_mask)
    start = time.perf_counter()
    scores = np.zeros((n_groups, k), dtype=np.float32)
    for g, s in enumerate(seeds):
        env.reset(seed=s)  # the same question again: score its K completions through the group API
        scores[g] = env.unwrapped.score_candidates([completion_for_env(t, policy.prompt_format)
                                                    for t in texts[g * k:(g + 1) * k]])
    t_score = time.perf_counter() - start
    batch = TextBatch(prompts, texts, prompt_ids, prompt_mask, completion_ids, token_mask,
                      torch.from_numpy(scores).to(policy.device), torch.empty(0), None, k, {})
    start = time.perf_counter()
    with torch.no_grad():
        batch.logp_old = torch.cat([policy.group_logp(batch, a, b) for a, b in policy.micro_batches(n_groups)])
        if with_reference:
            parts = [policy.reference_token_logp(batch, a, b) for a, b in policy.micro_batches(n_groups)]
            batch.token_logp_ref = torch.cat(parts)
            batch.logp_ref = torch.cat([policy.sequence_logp(t, batch, a, b)
                                        for t, (a, b) in zip(parts, policy.micro_batches(n_groups), strict=True)])
    t_logp = time.perf_counter() - start
    n_tokens = int(token_mask.sum())
    batch.stats = {
        "completion_length": float(token_mask.sum(dim=1).float().mean()),
        "tokens_per_s": n_tokens / max(t_generate, 1e-9),
        "generate_s": t_generate,
        "score_s": t_score,
        "logprob_s": t_logp,
    }
    return batch


class TextVecEnv(VecEnv):
    """A one-env SB3 ``VecEnv`` for a text env (SB3's ``DummyVecEnv`` cannot buffer ``Text`` observations).

    Observations are object arrays of strings; ``step`` takes an array of one completion. The agents
    roll out through the env itself (:func:`collect_text_rollouts`); this wrapper exists so that
    SB3's ``get_env``, callbacks and ``set_env`` see the usual ``VecEnv`` surface.
    """

    def __init__(self, env: Any) -> None:
        self.envs = [env]
        super().__init__(1, env.observation_space, env.action_space)
        self._actions: Any = None

    def reset(self) -> Any:
        obs, info = self.envs[0].reset(seed=self._seeds[0] if self._seeds else None)
        self._reset_seeds()
        self.reset_infos[0] = info
        return np.array([obs], dtype=object)

    def step_async(self, actions: Any) -> None:
        self._actions = actions

    def step_wait(self) -> Any:
        obs, reward, terminated, truncated, info = self.envs[0].step(str(self._actions[0]))
        done = terminated or truncated
        info["TimeLimit.truncated"] = truncated and not terminated
        if done:
            info["terminal_observation"] = obs
            obs, self.reset_infos[0] = self.envs[0].reset()
        return (np.array([obs], dtype=object), np.array([reward], dtype=np.float32), np.array([done]), [info])

    def close(self) -> None:
        self.envs[0].close()

    def get_attr(self, attr_name: str, indices: Any = None) -> list[Any]:
        return [getattr(self.envs[0], attr_name)]

    def set_attr(self, attr_name: str, value: Any, indices: Any = None) -> None:
        setattr(self.envs[0], attr_name, value)

    def env_method(self, method_name: str, *args: Any, indices: Any = None, **kwargs: Any) -> list[Any]:
        return [getattr(self.envs[0], method_name)(*args, **kwargs)]

    def env_is_wrapped(self, wrapper_class: type, indices: Any = None) -> list[bool]:
        from stable_baselines3.common.env_util import is_wrapped

        return [is_wrapped(self.envs[0], wrapper_class)]
