"""Bandits of the TPO paper (docs/method.md section 3): the single-context K-armed bandit and the
multi-context (N contexts x K arms) bandit, each with a native batched twin."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from tpo_gym._validation import check_int
from tpo_gym.envs._common import (
    MAX_ARMS,
    MAX_CONTEXTS,
    check_candidate_matrix,
    check_candidates,
    check_discrete_action,
    check_discrete_batch,
    check_reset_args,
    check_size,
    draw_uniform,
)
from tpo_gym.envs.vector import NativeVectorEnv, RenderMixin, cells_image


def _check_n_arms(n_arms: Any) -> int:
    return check_size("n_arms", n_arms, 2, MAX_ARMS, "the action space Discrete(n_arms) holds n_arms as an int64")


def _check_n_contexts(n_contexts: Any) -> int:
    return check_size(
        "n_contexts",
        n_contexts,
        1,
        MAX_CONTEXTS,
        "the observation is a dense one-hot float32 vector of n_contexts and the arm table an int64 array",
    )


def _resolve_correct_arm(correct_arm: Any, n_arms: int, table_seed: int) -> int:
    """The fixed correct arm: ``correct_arm`` if given (an integer in ``[0, n_arms)``), else from ``table_seed``."""
    if correct_arm is None:
        return int(correct_arm_table(1, n_arms, table_seed)[0])
    try:
        return check_int("correct_arm", correct_arm, minimum=0, maximum=n_arms - 1)
    except ValueError as exc:
        raise ValueError(f"{exc} (None draws it from table_seed; n_arms={n_arms})") from None


def _bandit_info(hit: bool) -> dict[str, Any]:
    """The ``info`` of a pull: the episode's score (the reward) and error (1 - reward)."""
    return {"is_success": hit, "score": float(hit), "error": 1.0 - float(hit)}


#: Colours of the ``"rgb_array"`` tile of a bandit: awaiting the pull, a correct pull, a wrong pull.
_TILE_COLORS = {None: (0.5, 0.5, 0.5), True: (0.2, 0.7, 0.3), False: (0.8, 0.2, 0.2)}


class _PullRender(RenderMixin):
    """``render()`` of the bandits: the episode's pull, as text (``"ansi"``) or a 32x32 tile (``"rgb_array"``):
    gray awaiting it, green if it hit the correct arm, red if not."""

    #: ``(arm, hit)`` of this episode's pull, None until it is made.
    _pull: tuple[int, bool] | None = None

    def _render_head(self) -> str:
        raise NotImplementedError

    def _render_text(self) -> str:
        if self._pull is None:
            return f"{self._render_head()}: awaiting a pull\n"
        arm, hit = self._pull
        return f"{self._render_head()}: pulled arm {arm}, reward {float(hit)}\n"

    def _render_rgb(self) -> np.ndarray:
        hit = None if self._pull is None else self._pull[1]
        return cells_image(np.array([[_TILE_COLORS[hit]]]), 32)


class BanditEnv(_PullRender, gym.Env[np.ndarray, np.int64]):
    """K-armed single-context bandit with exactly one correct arm.

    ## Description
    The single-context bandit of the TPO paper (docs/method.md section 3): one context, ``n_arms`` arms, one of
    which pays 1. Every episode is a single pull. It is the smallest problem on which the update
    direction of TPO, GRPO, PG and DG can be compared exactly.

    ## Action Space
    ``Discrete(n_arms)``: the arm to pull.

    ## Observation Space
    ``Box(0, 1, (1,), float32)``, always ``[0.0]`` (there is one context); present so that generic
    agents such as Stable-Baselines3's ``PPO`` run unchanged.

    ## Rewards
    ``1.0`` if the pulled arm is the correct arm, else ``0.0``. ``reward_credit = "step"``: the
    pull's reward is its own credit.

    ## Starting State
    The correct arm is fixed for the life of the environment: the ``correct_arm`` argument if
    given, else drawn once from ``table_seed`` (see :func:`correct_arm_table`). Resets, seeded or
    not, never change it, so every episode, every seed of an agent and every sub-env of a vector
    env face the same bandit problem (as in the paper's single-context bandit); pass another
    ``table_seed`` for another problem.

    ## Episode End
    After one step: ``terminated=True, truncated=False``. The ``info`` of that step carries
    ``is_success`` (bool: the pull was correct), ``score`` (float: the reward) and ``error``
    (float: ``1 - reward``, the paper's logged error).

    ## Arguments
    * ``n_arms`` (int, default 100, ``2 <= n_arms <= 2**63 - 1``): number of arms.
    * ``correct_arm`` (int or None, default None): the correct arm, in ``[0, n_arms)``; None draws it
      from ``table_seed``.
    * ``table_seed`` (int >= 0, default 0): seed of the correct arm when ``correct_arm`` is None.
    * ``render_mode``: None (default), ``"ansi"`` (``render()`` returns the episode's pull as text)
      or ``"rgb_array"`` (a 32x32 tile: gray before the pull, green after a correct pull, red after
      a wrong one).

    Bad values (wrong type, out of range, too large) raise ``ValueError``; so do ``reset`` seeds
    that are not None or an integer >= 0 and ``options`` that are not None or a dict.

    ```python
    >>> import gymnasium as gym, tpo_gym
    >>> env = gym.make("tpo_gym/Bandit-v0", n_arms=10, correct_arm=3)
    ```

    ## Vectorized environment
    ``gym.make_vec("tpo_gym/Bandit-v0", num_envs=N, vectorization_mode="vector_entry_point")`` gives
    :class:`BanditVectorEnv`: N pulls of the same bandit stepped with array operations, with the
    spaces, rewards, ``info`` (``score`` / ``error`` with their ``_score`` / ``_error`` masks) and
    ``reward_credit`` of ``SyncVectorEnv``.

    ## Group API
    ``score_candidates(candidates)`` returns the reward of each of K candidate arms, without
    stepping (see :mod:`tpo_gym.envs.group`).

    ## Version History
    * v0: Initial version.
    """

    metadata: dict[str, Any] = dict(RenderMixin.metadata)
    reward_credit: str = "step"

    def __init__(self, n_arms: int = 100, correct_arm: int | None = None, table_seed: int = 0,
                 render_mode: str | None = None) -> None:
        self._set_render_mode(render_mode)
        self.n_arms = _check_n_arms(n_arms)
        self.table_seed = check_int("table_seed", table_seed, minimum=0, maximum=None)
        self.correct_arm = _resolve_correct_arm(correct_arm, self.n_arms, self.table_seed)
        self.action_space = spaces.Discrete(self.n_arms)
        self.observation_space = spaces.Box(0.0, 1.0, shape=(1,), dtype=np.float32)
        self._done = True

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Start an episode (a single pull of the fixed bandit)."""
        seed, options = check_reset_args(seed, options)
        super().reset(seed=seed)
        self._done = False
        self._pull = None
        return np.zeros(1, dtype=np.float32), {}

    def _require_state(self) -> int:
        if self._done:
            raise RuntimeError("BanditEnv: the episode is over (or never started); call reset() first")
        return self.correct_arm

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Pull one arm; the episode ends."""
        arm = check_discrete_action(action, self.n_arms)
        correct = self._require_state()
        self._done = True
        hit = arm == correct
        self._pull = (arm, hit)
        return np.zeros(1, dtype=np.float32), float(hit), True, False, _bandit_info(hit)

    def score_candidates(self, candidates: Any) -> np.ndarray:
        """Reward ``float32 [K]`` of each candidate arm, without stepping or touching the RNG."""
        cand = check_candidates(candidates, self.n_arms)
        return (cand == self._require_state()).astype(np.float32)

    def _render_head(self) -> str:
        return f"bandit of {self.n_arms} arms"


class BanditVectorEnv(NativeVectorEnv):
    """Native batched :class:`BanditEnv`: ``num_envs`` independent bandits in numpy arrays.

    Same spaces, rewards and seeding as ``num_envs`` copies of :class:`BanditEnv` in a
    ``SyncVectorEnv`` (``NEXT_STEP`` autoreset). ``reset(options={"group_size": G})`` makes groups of
    G sub-envs share a context (here all share the one correct arm);
    ``score_candidates(int [num_envs, K]) -> float32 [num_envs, K]``. ``autoreset_mode`` ``"SameStep"``
    (:class:`~gymnasium.vector.AutoresetMode`) makes every call a real pull (see :mod:`tpo_gym.envs.vector`).
    """

    autoreset_modes = (AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP)

    def __init__(
        self, num_envs: int = 1, n_arms: int = 100, correct_arm: int | None = None, table_seed: int = 0,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP, render_mode: str | None = None,
    ) -> None:
        super().__init__(num_envs, autoreset_mode, render_mode)
        self.n_arms = _check_n_arms(n_arms)
        self.table_seed = check_int("table_seed", table_seed, minimum=0, maximum=None)
        arm = _resolve_correct_arm(correct_arm, self.n_arms, self.table_seed)
        self._set_spaces(spaces.Box(0.0, 1.0, shape=(1,), dtype=np.float32), spaces.Discrete(self.n_arms))
        self.correct_arm = np.full(self.num_envs, arm, np.int64)

    def _draw_contexts(self, gens: list[np.random.Generator], seeded: bool) -> np.ndarray:
        return self.correct_arm[: len(gens)].copy()  # one fixed bandit: nothing to draw

    def _assign_contexts(self, env_ids: np.ndarray, contexts: np.ndarray) -> None:
        pass

    def _observations(self) -> np.ndarray:
        return np.zeros((self.num_envs, 1), dtype=np.float32)

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Pull one arm per sub-env (sub-envs awaiting autoreset are reset instead)."""
        self._check_has_reset()
        acts = check_discrete_batch(actions, self.n_arms, self.num_envs)
        resetting = self._needs_reset.copy()
        self._reset_subenvs(resetting)
        active = ~resetting
        hit = (acts == self.correct_arm) & active
        rewards = hit.astype(np.float64)
        terminated = active.copy()
        self._needs_reset = terminated.copy()
        info: dict[str, Any] = {}
        if active.any():
            self._masked_info(info, "is_success", hit, active)
            self._episode_info(info, active, rewards, 1.0 - rewards)
        return self._autoreset(self._observations(), rewards, terminated, np.zeros(self.num_envs, np.bool_), info)

    def score_candidates(self, candidates: Any) -> np.ndarray:
        """Reward ``float32 [num_envs, K]`` of each candidate arm; 0 for sub-envs awaiting autoreset."""
        self._check_has_reset()
        cand = check_candidate_matrix(candidates, self.n_arms, self.num_envs)
        hit = (cand == self.correct_arm[:, None]) & ~self._needs_reset[:, None]
        return hit.astype(np.float32)


def correct_arm_table(n_contexts: int, n_arms: int, table_seed: int) -> np.ndarray:
    """The correct arm of each context of :class:`ContextualBanditEnv`: ``int64 [n_contexts]``.

    A pure function of its arguments (``np.random.default_rng(table_seed)``), so agents and tests
    can compute the oracle without touching an environment.
    """
    return np.random.default_rng(table_seed).integers(0, n_arms, size=n_contexts).astype(np.int64)


class ContextualBanditEnv(_PullRender, gym.Env[np.ndarray, np.int64]):
    """Multi-context bandit: N contexts x K arms, one correct arm per context.

    ## Description
    The multi-context bandit of the TPO paper (docs/method.md section 3): every episode shows one of
    ``n_contexts`` contexts, uniformly at random; each context has one correct arm out of ``n_arms``.
    The table of correct arms is fixed by ``table_seed`` (see :func:`correct_arm_table`), so it is
    the same problem for every episode seed.

    ## Action Space
    ``Discrete(n_arms)``: the arm to pull.

    ## Observation Space
    ``Box(0, 1, (n_contexts,), float32)``: the one-hot encoding of the context.

    ## Rewards
    ``1.0`` if the arm is the context's correct arm, else ``0.0``. ``reward_credit = "step"``.

    ## Starting State
    The context is drawn uniformly from ``self.np_random`` at each reset.

    ## Episode End
    After one step: ``terminated=True, truncated=False``. The ``info`` of that step carries
    ``is_success`` (bool), ``score`` (float: the reward) and ``error`` (float: ``1 - reward``).

    ## Arguments
    * ``n_contexts`` (int, default 100, ``1 <= n_contexts <= 2**24``: the one-hot observation is
      dense), ``n_arms`` (int, default 10, ``2 <= n_arms <= 2**63 - 1``).
    * ``table_seed`` (int >= 0, default 0): seed of the table of correct arms.
    * ``render_mode``: None (default), ``"ansi"`` (``render()`` returns the context and the episode's
      pull as text) or ``"rgb_array"`` (a 32x32 tile: gray before the pull, green after a correct
      pull, red after a wrong one).

    Bad values raise ``ValueError``, as do bad ``reset`` seeds and options.

    ## Vectorized environment
    :class:`ContextualBanditVectorEnv` through ``vector_entry_point``; same draws, spaces, rewards
    and ``info`` as ``SyncVectorEnv``.

    ## Group API
    ``score_candidates(candidates)``: reward of K candidate arms for the current context.

    ## Version History
    * v0: Initial version.
    """

    metadata: dict[str, Any] = dict(RenderMixin.metadata)
    reward_credit: str = "step"

    def __init__(self, n_contexts: int = 100, n_arms: int = 10, table_seed: int = 0,
                 render_mode: str | None = None) -> None:
        self._set_render_mode(render_mode)
        self.n_contexts = _check_n_contexts(n_contexts)
        self.n_arms = _check_n_arms(n_arms)
        self.table_seed = check_int("table_seed", table_seed, minimum=0, maximum=None)
        self.correct_arms = correct_arm_table(self.n_contexts, self.n_arms, self.table_seed)
        self.action_space = spaces.Discrete(self.n_arms)
        self.observation_space = spaces.Box(0.0, 1.0, shape=(self.n_contexts,), dtype=np.float32)
        self.context: int | None = None
        self._shown: int | None = None  # the context of the current or last episode (for render)

    def _obs(self) -> np.ndarray:
        obs = np.zeros(self.n_contexts, dtype=np.float32)
        assert self.context is not None
        obs[self.context] = 1.0
        return obs

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Draw a context."""
        seed, options = check_reset_args(seed, options)
        super().reset(seed=seed)
        self.context = int(draw_uniform([self.np_random], self.n_contexts)[0])
        self._shown, self._pull = self.context, None
        return self._obs(), {}

    def _require_context(self) -> int:
        if self.context is None:
            raise RuntimeError("ContextualBanditEnv: the episode is over (or never started); call reset()")
        return self.context

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Pull one arm; the episode ends."""
        arm = check_discrete_action(action, self.n_arms)
        ctx = self._require_context()
        obs = self._obs()
        self.context = None
        hit = arm == int(self.correct_arms[ctx])
        self._pull = (arm, hit)
        return obs, float(hit), True, False, _bandit_info(hit)

    def score_candidates(self, candidates: Any) -> np.ndarray:
        """Reward ``float32 [K]`` of each candidate arm for the current context."""
        cand = check_candidates(candidates, self.n_arms)
        return (cand == self.correct_arms[self._require_context()]).astype(np.float32)

    def _render_head(self) -> str:
        shown = "no context yet" if self._shown is None else f"context {self._shown}"
        return f"{shown} of {self.n_contexts}, {self.n_arms} arms"


class ContextualBanditVectorEnv(NativeVectorEnv):
    """Native batched :class:`ContextualBanditEnv` (``NEXT_STEP`` autoreset, array operations).

    ``reset(options={"group_size": G})`` makes groups of G sub-envs share one context;
    ``score_candidates(int [num_envs, K]) -> float32 [num_envs, K]``; ``autoreset_mode`` ``NEXT_STEP`` (default)
    or ``SAME_STEP`` (see :mod:`tpo_gym.envs.vector`).
    """

    autoreset_modes = (AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP)

    def __init__(self, num_envs: int = 1, n_contexts: int = 100, n_arms: int = 10, table_seed: int = 0,
                 autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP, render_mode: str | None = None) -> None:
        super().__init__(num_envs, autoreset_mode, render_mode)
        self.n_contexts = _check_n_contexts(n_contexts)
        self.n_arms = _check_n_arms(n_arms)
        self.table_seed = check_int("table_seed", table_seed, minimum=0, maximum=None)
        self.correct_arms = correct_arm_table(self.n_contexts, self.n_arms, self.table_seed)
        self._set_spaces(spaces.Box(0.0, 1.0, shape=(self.n_contexts,), dtype=np.float32), spaces.Discrete(self.n_arms))
        self.contexts = np.zeros(self.num_envs, dtype=np.int64)

    def _draw_contexts(self, gens: list[np.random.Generator], seeded: bool) -> np.ndarray:
        return draw_uniform(gens, self.n_contexts)

    def _assign_contexts(self, env_ids: np.ndarray, contexts: np.ndarray) -> None:
        self.contexts[env_ids] = contexts

    def _observations(self) -> np.ndarray:
        obs = np.zeros((self.num_envs, self.n_contexts), dtype=np.float32)
        obs[np.arange(self.num_envs), self.contexts] = 1.0
        return obs

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Pull one arm per sub-env (sub-envs awaiting autoreset are reset instead)."""
        self._check_has_reset()
        acts = check_discrete_batch(actions, self.n_arms, self.num_envs)
        resetting = self._needs_reset.copy()
        active = ~resetting
        hit = (acts == self.correct_arms[self.contexts]) & active
        obs_before = self._observations()
        self._reset_subenvs(resetting)
        obs = np.where(resetting[:, None], self._observations(), obs_before)
        self._needs_reset = active.copy()
        rewards = hit.astype(np.float64)
        info: dict[str, Any] = {}
        if active.any():
            self._masked_info(info, "is_success", hit, active)
            self._episode_info(info, active, rewards, 1.0 - rewards)
        return self._autoreset(obs, rewards, active.copy(), np.zeros(self.num_envs, np.bool_), info)

    def score_candidates(self, candidates: Any) -> np.ndarray:
        """Reward ``float32 [num_envs, K]`` of each candidate arm; 0 for sub-envs awaiting autoreset."""
        self._check_has_reset()
        cand = check_candidate_matrix(candidates, self.n_arms, self.num_envs)
        hit = (cand == self.correct_arms[self.contexts][:, None]) & ~self._needs_reset[:, None]
        return hit.astype(np.float32)
