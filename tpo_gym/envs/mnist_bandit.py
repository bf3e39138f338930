"""The MNIST contextual bandit of the TPO paper, on the real MNIST (see :mod:`tpo_gym.envs.mnist_data`)."""

from __future__ import annotations

import os
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from tpo_gym._validation import check_choice
from tpo_gym.envs._common import (
    check_candidate_matrix,
    check_candidates,
    check_discrete_action,
    check_discrete_batch,
    check_reset_args,
    draw_uniform,
)
from tpo_gym.envs.mnist_data import load_mnist
from tpo_gym.envs.vector import NativeTensorEnv, NativeVectorEnv, RenderMixin, cells_image

#: Characters of the ``"ansi"`` view, dark to bright.
_SHADES = " .:-=+*#%@"

SPLITS = ("train", "test")


class MNISTBanditEnv(RenderMixin, gym.Env[np.ndarray, np.int64]):
    """One-step contextual bandit on MNIST: see an image, name its digit, get 1 if right.

    ## Description
    The MNIST contextual bandit of the TPO paper (docs/method.md section 3). Each episode shows one image drawn
    uniformly (with replacement) from the chosen split of the real MNIST. The label is never part
    of the observation: the agent only learns it through the reward (and, after acting, through
    ``info["label"]``).

    ## Action Space
    ``Discrete(10)``: the predicted digit.

    ## Observation Space
    ``Box(0, 1, (784,), float32)``: the 28x28 image, pixels / 255, flattened row by row.

    ## Rewards
    ``1.0`` if the action equals the label, else ``0.0``. ``reward_credit = "step"``.

    ## Starting State
    The image index is drawn uniformly from ``self.np_random`` at each reset.

    ## Episode End
    After one step: ``terminated=True, truncated=False``. ``info`` of that step carries ``label``
    (int), ``is_success`` (bool), ``score`` (float: the reward) and ``error`` (float:
    ``1 - reward``, the paper's logged training error).

    ## Arguments
    * ``split`` ("train" or "test", default "train").
    * ``root`` (str or None): data dir; default ``$TPO_GYM_DATA_DIR`` or ``~/.cache/tpo_gym``. Missing
      data raise an error naming the command that fetches it, ``python -m tpo_gym.envs.mnist_data``.
      For fast evaluation use :func:`tpo_gym.envs.mnist_data.load_mnist` directly.
    * ``render_mode``: None (default), ``"rgb_array"`` (``render()`` returns the image of the current or
      last episode, ``uint8 [28, 28, 3]``) or ``"ansi"`` (that image as 28 lines of characters, then the
      guess and the label once the agent has guessed).

    ## Vectorized environment
    :class:`MNISTBanditVectorEnv` through ``vector_entry_point``: N images per step with array
    operations, the same draws, spaces, rewards and ``info`` as ``SyncVectorEnv``.

    ## Group API
    ``score_candidates(candidates)``: reward of K candidate labels for the current image.

    ## Version History
    * v0: Initial version.
    """

    metadata: dict[str, Any] = dict(RenderMixin.metadata)
    reward_credit: str = "step"

    def __init__(self, split: str = "train", root: str | os.PathLike[str] | None = None,
                 render_mode: str | None = None) -> None:
        self.split = check_choice("split", split, SPLITS)
        self._set_render_mode(render_mode)
        self.root = root
        self._images, self._labels = load_mnist(self.split, root)
        self.action_space = spaces.Discrete(10)
        self.observation_space = spaces.Box(0.0, 1.0, shape=(784,), dtype=np.float32)
        self.index: int | None = None
        self._shown: int | None = None  # the image of the current or last episode (for render)
        self._guess: int | None = None  # the action of the last episode, once taken (for render)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_images", None)
        state.pop("_labels", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._images, self._labels = load_mnist(self.split, self.root)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Draw an image."""
        seed, options = check_reset_args(seed, options)
        super().reset(seed=seed)
        self.index = int(draw_uniform([self.np_random], len(self._labels))[0])
        self._shown, self._guess = self.index, None
        return self._images[self.index].copy(), {}

    def _require_index(self) -> int:
        if self.index is None:
            raise RuntimeError("MNISTBanditEnv: the episode is over (or never started); call reset()")
        return self.index

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Name a digit; the episode ends and ``info["label"]`` reveals the label."""
        a = check_discrete_action(action, 10)
        idx = self._require_index()
        self.index = None
        label = int(self._labels[idx])
        hit = a == label
        self._guess = a
        info = {"label": label, "is_success": hit, "score": float(hit), "error": 1.0 - float(hit)}
        return self._images[idx].copy(), float(hit), True, False, info

    def _shown_image(self) -> np.ndarray:
        """The image of the current or last episode, ``[28, 28]`` (black before the first reset)."""
        if self._shown is None:
            return np.zeros((28, 28), dtype=np.float32)
        return self._images[self._shown].reshape(28, 28)

    def _render_rgb(self) -> np.ndarray:
        return cells_image(np.repeat(self._shown_image()[..., None], 3, axis=-1), 1)

    def _render_text(self) -> str:
        """The image in characters, then the guess and the label once guessed."""
        shades = np.minimum((self._shown_image() * len(_SHADES)).astype(np.int64), len(_SHADES) - 1)
        art = "\n".join("".join(_SHADES[i] for i in row) for row in shades.tolist())
        if self._shown is None:
            status = "no image yet (call reset())"
        elif self._guess is None:
            status = f"{self.split} image {self._shown}: awaiting a guess"
        else:
            label = int(self._labels[self._shown])
            reward = float(self._guess == label)
            status = f"{self.split} image {self._shown}: guessed {self._guess}, label {label}, reward {reward}"
        return f"{art}\n{status}\n"

    def score_candidates(self, candidates: Any) -> np.ndarray:
        """Reward ``float32 [K]`` of each candidate label for the current image."""
        cand = check_candidates(candidates, 10)
        return (cand == self._labels[self._require_index()]).astype(np.float32)


class MNISTBanditVectorEnv(NativeVectorEnv):
    """Native batched :class:`MNISTBanditEnv` (``NEXT_STEP`` autoreset, array operations).

    ``reset(options={"group_size": G})`` makes groups of G sub-envs see the same image;
    ``score_candidates(int [num_envs, K]) -> float32 [num_envs, K]``; ``autoreset_mode`` ``NEXT_STEP`` (default)
    or ``SAME_STEP``, which makes every call a real step (see :mod:`tpo_gym.envs.vector`).
    """

    autoreset_modes = (AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP)

    def __init__(self, num_envs: int = 1, split: str = "train", root: str | os.PathLike[str] | None = None,
                 autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP, render_mode: str | None = None) -> None:
        super().__init__(num_envs, autoreset_mode, render_mode)
        self.split = check_choice("split", split, SPLITS)
        self.root = root
        self._images, self._labels = load_mnist(self.split, root)
        self._set_spaces(spaces.Box(0.0, 1.0, shape=(784,), dtype=np.float32), spaces.Discrete(10))
        self.indices = np.zeros(self.num_envs, dtype=np.int64)

    def _draw_contexts(self, gens: list[np.random.Generator], seeded: bool) -> np.ndarray:
        return draw_uniform(gens, len(self._labels))

    def _assign_contexts(self, env_ids: np.ndarray, contexts: np.ndarray) -> None:
        self.indices[env_ids] = contexts

    def _observations(self) -> np.ndarray:
        return self._images[self.indices]

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Name one digit per sub-env (sub-envs awaiting autoreset are reset instead)."""
        self._check_has_reset()
        acts = check_discrete_batch(actions, 10, self.num_envs)
        resetting = self._needs_reset.copy()
        active = ~resetting
        labels = self._labels[self.indices]
        hit = (acts == labels) & active
        self._reset_subenvs(resetting)
        self._needs_reset = active.copy()
        rewards = hit.astype(np.float64)
        info: dict[str, Any] = {}
        if active.any():
            self._masked_info(info, "label", labels, active)
            self._masked_info(info, "is_success", hit, active)
            self._episode_info(info, active, rewards, 1.0 - rewards)
        return self._autoreset(self._observations(), rewards, active.copy(), np.zeros(self.num_envs, np.bool_), info)

    def score_candidates(self, candidates: Any) -> np.ndarray:
        """Reward ``float32 [num_envs, K]`` of each candidate label; 0 for sub-envs awaiting autoreset."""
        self._check_has_reset()
        cand = check_candidate_matrix(candidates, 10, self.num_envs)
        hit = (cand == self._labels[self.indices][:, None]) & ~self._needs_reset[:, None]
        return hit.astype(np.float32)


#: MNIST splits already on a device, shared by every tensor env there: ``{(split, root, device): (images, labels)}``.
_DEVICE_DATA: dict[tuple[str, str, str], tuple[Any, Any]] = {}


def _device_mnist(split: str, root: Any, device: Any) -> tuple[Any, Any]:
    """``load_mnist(split, root)`` as torch tensors on ``device``, uploaded once per process and device."""
    import torch

    key = (split, str(root), str(device))
    if key not in _DEVICE_DATA:
        images, labels = load_mnist(split, root)
        _DEVICE_DATA[key] = tuple(torch.from_numpy(np.array(x)).to(device) for x in (images, labels))  # type: ignore
    return _DEVICE_DATA[key]


class MNISTBanditTensorEnv(NativeTensorEnv):
    """:class:`MNISTBanditVectorEnv` on a torch device: images, labels, rewards and infos as tensors there.

    The same draws (one index per sub-env from the same generators, uploaded once per reset), spaces,
    ``group_size`` option, rewards and ``info`` (``label``, ``is_success``, ``score``, ``error`` with
    their masks) as the numpy env; observations ``float32 [N, 784]``, rewards ``float32 [N]``. The split
    is uploaded to each device once per process and shared by every env there. Lockstep one-step
    episodes, input checks and autoreset: :class:`~tpo_gym.envs.vector.NativeTensorEnv`.
    """

    reward_credit: str = "step"
    fixed_horizon: int = 1

    def __init__(self, num_envs: int = 1, split: str = "train", root: str | os.PathLike[str] | None = None,
                 device: Any = "cpu", check_actions: bool = True,
                 autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP, render_mode: str | None = None) -> None:
        import torch

        super().__init__(num_envs, device, check_actions, autoreset_mode, render_mode)
        self.split = check_choice("split", split, SPLITS)
        self.root = root
        self._n_images = len(load_mnist(self.split, root)[1])
        self._images, self._labels = _device_mnist(self.split, root, self.device)
        self._set_spaces(spaces.Box(0.0, 1.0, shape=(784,), dtype=np.float32), spaces.Discrete(10))
        self.indices = torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)

    def _draw_contexts(self, gens: list[np.random.Generator], seeded: bool) -> np.ndarray:
        return draw_uniform(gens, self._n_images)

    def _assign_contexts(self, env_ids: np.ndarray, contexts: np.ndarray) -> None:
        import torch

        self.indices = torch.from_numpy(np.ascontiguousarray(contexts)).to(self.device, non_blocking=True)

    def _observations(self) -> Any:
        return self._images[self.indices]

    def _step(self, acts: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        import torch

        labels = self._labels[self.indices]
        hit = acts == labels
        rewards = hit.float()
        wide = hit.double()
        info = self._end_info({"label": labels, "is_success": hit, "score": wide, "error": 1.0 - wide})
        done = torch.ones(self.num_envs, dtype=torch.bool, device=self.device)
        return self._observations(), rewards, done, torch.zeros_like(done), info

    def _score(self, cand: Any) -> Any:
        return (cand == self._labels[self.indices][:, None]).float()


#: The on-device form of the native vector env (the rollout collector builds it for a torch device).
MNISTBanditVectorEnv.tensor_env = MNISTBanditTensorEnv
