"""Token tasks of Delightful Policy Gradient / the TPO paper: write H tokens answering a prompt."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from tpo_gym.envs._common import (
    check_candidate_matrix,
    check_candidates,
    check_discrete_action,
    check_discrete_batch,
    check_reset_args,
    draw_tokens,
)
from tpo_gym.envs._token_rules import (
    REWARDS,
    TARGETS,
    _check_token_kwargs,
    candidate_rewards,
    episode_summary,
    reward_credit_of,
    step_rewards,
    token_targets,
)
from tpo_gym.envs.vector import NativeTensorEnv, NativeVectorEnv, RenderMixin, cells_image

# in the order of the API reference page (docs/reference/envs/token_task.md)
__all__ = ["TARGETS", "REWARDS", "token_targets", "candidate_rewards", "step_rewards", "reward_credit_of",
           "episode_summary", "TokenTaskEnv", "TokenTaskVectorEnv", "TokenTaskTensorEnv"]


class TokenTaskEnv(RenderMixin, gym.Env[np.ndarray, np.int64]):
    """Write H tokens that answer a random prompt of H tokens (copy, flip, reverse copy, reverse flip).

    ## Description
    The token tasks of Delightful Policy Gradient used by the TPO paper (docs/method.md section 3). A prompt
    ``x`` of ``length`` (H) tokens is drawn uniformly over ``[0, vocab_size)``; the agent then writes
    H tokens, one per step. The target is ``x`` (copy), ``V-1-x`` (flip), ``x`` reversed
    (reverse_copy) or ``V-1-x`` reversed (reverse_flip); see :func:`token_targets`.

    ## Action Space
    ``Discrete(vocab_size)``: the next token.

    ## Observation Space
    ``MultiDiscrete([V+1] * 2H)``, int64: ``[prompt (H tokens); actions so far (H slots)]``; slots not
    written yet hold ``V`` (padding). The target is never in the observation.

    ## Rewards
    With correctness ``c_t = 1{a_t = target_t}``:

    * ``bag`` (bag of tokens): ``r_t = c_t``;
    * ``sequential``: ``r_t = prod_{j<=t} c_j`` (credit up to the first mistake);
    * ``terminal``: ``r_t = 0`` for ``t < H-1``, ``r_{H-1} = 1{all H tokens correct}``.

    ``reward_credit`` is ``"step"`` for bag and sequential (each step's reward is its own credit)
    and ``"episode"`` for terminal: the paper defines ``r_t = 1{all correct}`` at every position,
    so single-sample methods credit every step with the episode's total reward (the env still
    pays it once, at the last step, so returns are 0 or 1).

    ## Starting State
    The prompt is drawn from ``self.np_random``; all action slots are padding.
    ``reset(options={"prompt": tokens})`` uses the given H tokens instead (evaluation on fixed
    prompts; no random draw).

    ## Episode End
    After H steps: ``terminated=True, truncated=False``. The last ``info`` carries ``token_error``
    (float: fraction of wrong tokens), ``exact_match`` (bool), ``is_success`` (= ``exact_match``)
    and the episode summary in the paper's sense, two floats:

    * ``score``: bag and sequential: the mean per-step reward, return / H; terminal: exact match
      (0.0 or 1.0);
    * ``error``: the paper's logged error: bag and sequential: the token error (= ``token_error``);
      terminal: ``1 - exact match``.

    ## Arguments
    * ``target`` in {copy, flip, reverse_copy, reverse_flip} (default reverse_copy);
    * ``reward`` in {bag, sequential, terminal} (default bag);
    * ``vocab_size`` V, ``2 <= V <= 2**62`` (default 2); ``length`` H, ``1 <= H <= 2**16``
      (default 10). Bad values raise ``ValueError`` naming the limit, as do bad ``reset`` seeds
      and options.
    * ``render_mode``: None (default), ``"ansi"`` (``render()`` returns the prompt and the tokens
      written so far as text, ``_`` for slots not written yet) or ``"rgb_array"`` (the same two rows
      as an ``uint8 [16, 8H, 3]`` picture: one 8x8 cell per token, gray from black (0) to white
      (V-1), blue for unwritten slots).

    Short ids fix these for the paper's settings, e.g. ``tpo_gym/TokenReversal-v0`` = reverse_copy,
    bag, V=2, H=10 (the full list is in :mod:`tpo_gym.envs`).

    ## Vectorized environment
    :class:`TokenTaskVectorEnv` through ``vector_entry_point``: N prompts stepped with array
    operations (tens of times faster than ``SyncVectorEnv``, see ``benchmarks/bench_token_vec.py``),
    with the same spaces, rewards, ``info`` and ``reward_credit``;
    ``reset(options={"group_size": G})`` gives G sub-envs the same prompt (sequence-level methods).

    ## Group API
    ``score_candidates(candidates)``: the reward each of K candidate next tokens would get now, at
    the current prefix (sequential: ``c_k`` times the prefix product; terminal: nonzero only at the
    last step and only if the prefix is all correct).

    ## Version History
    * v0: Initial version.
    """

    metadata: dict[str, Any] = dict(RenderMixin.metadata)

    def __init__(
        self, target: str = "reverse_copy", reward: str = "bag", vocab_size: int = 2, length: int = 10,
        render_mode: str | None = None,
    ) -> None:
        self.target, self.reward, self.vocab_size, self.length = _check_token_kwargs(target, reward, vocab_size, length)
        self._set_render_mode(render_mode)
        self.reward_credit = reward_credit_of(self.reward)
        v, h = self.vocab_size, self.length
        self.action_space = spaces.Discrete(v)
        self.observation_space = spaces.MultiDiscrete(np.full(2 * h, v + 1), dtype=np.int64)
        self._state = np.full(2 * h, v, dtype=np.int64)  # [prompt; actions]
        self._target = np.zeros(h, dtype=np.int64)
        self._t = h  # == H: no episode in progress
        self._prefix_ok = True
        self._n_correct = 0
        self._prefix_len = 0  # length of the all-correct prefix

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Draw a prompt (or take ``options["prompt"]``); clear the action slots."""
        seed, options = check_reset_args(seed, options)
        super().reset(seed=seed)
        h = self.length
        if options is not None and "prompt" in options:
            prompt = self._check_prompt(options["prompt"])
        else:
            prompt = draw_tokens([self.np_random], self.vocab_size, h)[0]
        self._state[:h] = prompt
        self._state[h:] = self.vocab_size
        self._target = token_targets(prompt, self.target, self.vocab_size)
        self._t = 0
        self._prefix_ok = True
        self._n_correct = 0
        self._prefix_len = 0
        return self._state.copy(), {}

    def _check_prompt(self, prompt: Any) -> np.ndarray:
        arr = np.asarray(prompt)
        v, h = self.vocab_size, self.length
        if arr.shape != (h,) or arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"options['prompt'] must be {h} integers in [0, {v}), got {prompt!r}")
        if arr.min() < 0 or arr.max() >= v:
            raise ValueError(f"options['prompt'] tokens must be in [0, {v}), got {arr.tolist()}")
        return arr.astype(np.int64)

    @property
    def prompt(self) -> np.ndarray:
        """The current prompt (a copy)."""
        return self._state[: self.length].copy()

    def _require_active(self) -> None:
        if self._t >= self.length:
            raise RuntimeError("TokenTaskEnv: the episode is over (or never started); call reset() first")

    def _reward_of(self, correct: np.ndarray) -> np.ndarray:
        at_last = self._t == self.length - 1
        return np.asarray(candidate_rewards(correct, self._prefix_ok, at_last, self.reward), dtype=np.float32)

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Write the next token."""
        a = check_discrete_action(action, self.vocab_size)
        self._require_active()
        correct = np.bool_(a == self._target[self._t])
        reward = float(self._reward_of(correct))
        self._prefix_ok = bool(self._prefix_ok and correct)
        self._n_correct += int(correct)
        self._prefix_len += int(self._prefix_ok)
        self._state[self.length + self._t] = a
        self._t += 1
        info: dict[str, Any] = {}
        terminated = self._t == self.length
        if terminated:
            exact = self._n_correct == self.length
            score, error = episode_summary(self._n_correct, self._prefix_len, self.length, self.reward)
            info = {
                "token_error": 1.0 - self._n_correct / self.length,
                "exact_match": exact,
                "is_success": exact,
                "score": float(score),
                "error": float(error),
            }
        return self._state.copy(), reward, terminated, False, info

    def _render_text(self) -> str:
        """The prompt and the tokens written so far (``_``: not written yet)."""
        h, v = self.length, self.vocab_size
        width = len(str(v - 1))

        def row(tokens: np.ndarray) -> str:
            return " ".join(("_" if x == v else str(int(x))).rjust(width) for x in tokens)

        return f"prompt : {row(self._state[:h])}\nwritten: {row(self._state[h:])}\n"

    def _render_rgb(self) -> np.ndarray:
        """The same two rows, 8x8 pixels per token."""
        rows = self._state.reshape(2, self.length)
        colors = np.repeat((rows / (self.vocab_size - 1))[..., None], 3, axis=-1)
        colors[rows == self.vocab_size] = (0.25, 0.4, 0.85)  # unwritten slot
        return cells_image(colors, 8)

    def score_candidates(self, candidates: Any) -> np.ndarray:
        """Reward ``float32 [K]`` of each candidate next token at the current prefix (no side effects)."""
        cand = check_candidates(candidates, self.vocab_size)
        self._require_active()
        return self._reward_of(cand == self._target[self._t])


class _TokenTaskVectors:
    """What the native vector env and its on-device form share: the task's arguments, spaces and prompt draws."""

    def _setup_task(self, target: str, reward: str, vocab_size: int, length: int) -> None:
        self.target, self.reward, self.vocab_size, self.length = _check_token_kwargs(target, reward, vocab_size, length)
        self.reward_credit = reward_credit_of(self.reward)
        v, h = self.vocab_size, self.length
        self._set_spaces(spaces.MultiDiscrete(np.full(2 * h, v + 1), dtype=np.int64), spaces.Discrete(v))  # type: ignore[attr-defined]

    def _draw_contexts(self, gens: list[np.random.Generator], seeded: bool) -> np.ndarray:
        return draw_tokens(gens, self.vocab_size, self.length)


class TokenTaskVectorEnv(_TokenTaskVectors, NativeVectorEnv):
    """Native batched :class:`TokenTaskEnv`: ``num_envs`` prompts in ``[N, 2H]`` arrays.

    ``NEXT_STEP`` autoreset, seeding, spaces and ``info`` as ``SyncVectorEnv`` (identical rewards and
    infos for the same seeds and actions; ``score`` / ``error`` come with ``_score`` / ``_error``
    masks); ``reward_credit`` as :class:`TokenTaskEnv`; ``reset(options={"group_size": G})`` gives
    sub-envs ``i*G..(i+1)*G-1`` the same prompt; ``score_candidates(int [num_envs, K]) -> float32
    [num_envs, K]``. ``autoreset_mode="SameStep"`` gives ``SyncVectorEnv``'s ``SAME_STEP`` autoreset instead
    (groups too: a group's episodes end together; see :mod:`tpo_gym.envs.vector`).
    """

    autoreset_modes = (AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP)

    def __init__(
        self,
        num_envs: int = 1,
        target: str = "reverse_copy",
        reward: str = "bag",
        vocab_size: int = 2,
        length: int = 10,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(num_envs, autoreset_mode, render_mode)
        self._setup_task(target, reward, vocab_size, length)
        n, v, h = self.num_envs, self.vocab_size, self.length
        self._state = np.full((n, 2 * h), v, dtype=np.int64)
        self._target = np.zeros((n, h), dtype=np.int64)
        self._t = np.zeros(n, dtype=np.int64)
        self._prefix_ok = np.ones(n, dtype=np.bool_)
        self._n_correct = np.zeros(n, dtype=np.int64)
        self._prefix_len = np.zeros(n, dtype=np.int64)
        self._rows = np.arange(n)

    @property
    def prompts(self) -> np.ndarray:
        """The current prompts ``int64 [num_envs, H]`` (a copy)."""
        return self._state[:, : self.length].copy()

    def _assign_contexts(self, env_ids: np.ndarray, contexts: np.ndarray) -> None:
        h = self.length
        self._state[env_ids, :h] = contexts
        self._state[env_ids, h:] = self.vocab_size
        self._target[env_ids] = token_targets(contexts, self.target, self.vocab_size)
        self._t[env_ids] = 0
        self._prefix_ok[env_ids] = True
        self._n_correct[env_ids] = 0
        self._prefix_len[env_ids] = 0

    def _observations(self) -> np.ndarray:
        return self._state.copy()

    def _rewards_of(self, correct: np.ndarray) -> np.ndarray:
        """Rewards for correctness ``correct [N, K]`` at each sub-env's current step."""
        at_last = (self._t == self.length - 1)[:, None]
        return candidate_rewards(correct, self._prefix_ok[:, None], at_last, self.reward).astype(np.float32)

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Write one token per sub-env (sub-envs awaiting autoreset are reset instead)."""
        self._check_has_reset()
        acts = check_discrete_batch(actions, self.vocab_size, self.num_envs)
        resetting = self._needs_reset.copy()
        self._reset_subenvs(resetting)
        active = ~resetting
        rows = self._rows
        t = np.minimum(self._t, self.length - 1)
        correct = (acts == self._target[rows, t]) & active
        rewards = self._rewards_of(correct[:, None])[:, 0].astype(np.float64) * active
        self._prefix_ok &= correct | resetting
        self._n_correct += correct
        self._prefix_len += self._prefix_ok & active
        act_rows = rows[active]
        self._state[act_rows, self.length + self._t[active]] = acts[active]
        self._t += active
        terminated = active & (self._t == self.length)
        self._needs_reset = terminated.copy()
        info: dict[str, Any] = {}
        if terminated.any():
            token_error = 1.0 - self._n_correct / self.length
            exact = self._n_correct == self.length
            self._masked_info(info, "token_error", token_error, terminated)
            self._masked_info(info, "exact_match", exact, terminated)
            self._masked_info(info, "is_success", exact, terminated)
            score, error = episode_summary(self._n_correct, self._prefix_len, self.length, self.reward)
            self._episode_info(info, terminated, score, error)
        return self._autoreset(self._observations(), rewards, terminated, np.zeros(self.num_envs, np.bool_), info)

    def score_candidates(self, candidates: Any) -> np.ndarray:
        """Reward ``float32 [num_envs, K]`` of K candidate next tokens per sub-env, no side effects.

        Sub-envs awaiting autoreset (episode over) score 0, as the next ``step`` gives them 0.
        """
        self._check_has_reset()
        cand = check_candidate_matrix(candidates, self.vocab_size, self.num_envs)
        t = np.minimum(self._t, self.length - 1)
        correct = (cand == self._target[self._rows, t][:, None]) & ~self._needs_reset[:, None]
        return self._rewards_of(correct)


class TokenTaskTensorEnv(_TokenTaskVectors, NativeTensorEnv):
    """:class:`TokenTaskVectorEnv` held on a torch device: rollouts without host round trips.

    The same task, seeding, ``NEXT_STEP`` autoreset, ``group_size`` option, spaces, rewards (one
    definition: :func:`candidate_rewards`), ``info`` keys and ``reward_credit`` as the numpy vector
    env, but the state lives in torch tensors on ``device``: ``reset`` returns and ``step`` takes and
    returns torch tensors (observations ``int64 [N, 2H]``, actions ``int64 [N]``, rewards
    ``float32 [N]``, terminated / truncated ``bool [N]``, infos float64 / bool tensors with their
    masks), and ``score_candidates(int64 [N, K]) -> float32 [N, K]`` is tensor code. For the same
    seeds and actions every value equals the numpy env's (the tests compare them). Lockstep, input
    checks and autoreset: :class:`~tpo_gym.envs.vector.NativeTensorEnv`.

    :param device: torch device of the state (``"cpu"``, ``"cuda"``, ``"cuda:N"``...).
    :param check_actions: also check that every action / candidate is in ``[0, V)`` (reads it back).
    :param autoreset_mode: ``NEXT_STEP`` only (other modes raise ``ValueError``; the numpy env offers ``SAME_STEP``).
    :param render_mode: the single env's render mode, recorded only (tensor envs do not render).
    """

    def __init__(
        self,
        num_envs: int = 1,
        target: str = "reverse_copy",
        reward: str = "bag",
        vocab_size: int = 2,
        length: int = 10,
        device: Any = "cpu",
        check_actions: bool = True,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        render_mode: str | None = None,
    ) -> None:
        import torch

        super().__init__(num_envs, device, check_actions, autoreset_mode, render_mode)
        self._setup_task(target, reward, vocab_size, length)
        self.fixed_horizon = self.length
        n, v, h = self.num_envs, self.vocab_size, self.length
        self._state = torch.full((n, 2 * h), v, dtype=torch.int64, device=self.device)
        self._target = torch.zeros((n, h), dtype=torch.int64, device=self.device)
        self._prefix_ok = torch.ones(n, dtype=torch.bool, device=self.device)
        self._n_correct = torch.zeros(n, dtype=torch.int64, device=self.device)
        self._prefix_len = torch.zeros(n, dtype=torch.int64, device=self.device)
        self._t = 0  # the step index of every sub-env (lockstep)

    def _assign_contexts(self, env_ids: np.ndarray, contexts: np.ndarray) -> None:
        import torch

        prompts = torch.from_numpy(np.ascontiguousarray(contexts)).to(self.device, non_blocking=True)
        h = self.length
        self._state[:, :h] = prompts
        self._state[:, h:] = self.vocab_size
        self._target = token_targets(prompts, self.target, self.vocab_size)
        self._t = 0
        self._prefix_ok.fill_(True)
        self._n_correct.zero_()
        self._prefix_len.zero_()

    def _observations(self) -> Any:
        return self._state.clone()

    @property
    def prompts(self) -> Any:
        """The current prompts ``int64 [num_envs, H]`` (a copy, on the device)."""
        return self._state[:, : self.length].clone()

    def _rewards_of(self, correct: Any) -> Any:
        """Rewards ``float32 [N, K]`` for correctness ``correct [N, K]`` at the current step."""
        at_last = self._t == self.length - 1
        return candidate_rewards(correct, self._prefix_ok[:, None], at_last, self.reward).float()

    def _step(self, acts: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        import torch

        t, n = self._t, self.num_envs
        correct = acts == self._target[:, t]
        rewards = self._rewards_of(correct[:, None])[:, 0]
        self._prefix_ok &= correct
        self._n_correct += correct
        self._prefix_len += self._prefix_ok
        self._state[:, self.length + t] = acts
        self._t += 1
        ended = self._t == self.length
        terminated = torch.full((n,), ended, dtype=torch.bool, device=self.device)
        info: dict[str, Any] = {}
        if ended:
            exact = self._n_correct == self.length
            score, error = episode_summary(self._n_correct, self._prefix_len, self.length, self.reward)
            info = self._end_info({"token_error": 1.0 - self._n_correct.double() / self.length, "exact_match": exact,
                                   "is_success": exact, "score": score, "error": error})
        return self._observations(), rewards, terminated, torch.zeros_like(terminated), info

    def _score(self, cand: Any) -> Any:
        return self._rewards_of(cand == self._target[:, self._t][:, None])


#: The on-device form of the native vector env (the rollout collector builds it for a torch device).
TokenTaskVectorEnv.tensor_env = TokenTaskTensorEnv
