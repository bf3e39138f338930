"""Make the documentation's own pictures: a frame of each environment family, and TPO's target.

Run ``.venv/bin/python docs/figures.py`` after changing an env's ``render()`` or the method; it writes
small PNGs under ``docs/img/`` that the site shows (the pages of docs/environments/ and docs/method.md)
and that are committed, so the site builds without the MNIST data. Every environment picture is the
env's own ``render()`` in ``"rgb_array"`` mode, enlarged without smoothing; nothing is drawn by hand.
The benchmark figures are not made here: the Benchmarks page shows the committed reports' PNGs
(benchmarks/results/), which docs/hooks.py copies into the site.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import tpo_gym  # noqa: E402

gym.register_envs(tpo_gym)
OUT = Path(__file__).resolve().parent / "img"
#: Pixel density of every figure: about 700 px wide at the sizes below, sharp at the site's width.
DPI = 110


def _panel(name: str, frames: list[tuple[np.ndarray, str]], width: float = 6.4, height: float = 2.0,
           cell: int = 0) -> Path:
    """``docs/img/<name>.png``: the ``(frame, caption)`` pairs side by side, frames enlarged without smoothing
    (with a grid every ``cell`` pixels if ``cell``)."""
    fig, axes = plt.subplots(1, len(frames), figsize=(width, height), squeeze=False)
    for ax, (frame, caption) in zip(axes[0], frames, strict=True):
        ax.imshow(frame, interpolation="nearest")
        ax.set_title(caption, fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
        if cell:  # a gray grid between the env's cells, so that white cells show on the white page
            ax.set_xticks(np.arange(-0.5, frame.shape[1], cell), minor=True)
            ax.set_yticks(np.arange(-0.5, frame.shape[0], cell), minor=True)
            ax.grid(which="minor", color="#999999", linewidth=0.8)
            ax.tick_params(which="minor", length=0)
    fig.tight_layout()
    path = OUT / f"{name}.png"
    fig.savefig(path, dpi=DPI, bbox_inches="tight", pad_inches=0.05)
    plt.close(fig)
    return path


def _frames(env_id: str, actions: list[Callable[[gym.Env, dict], object]], **kwargs: object) -> list[np.ndarray]:
    """The frame after ``reset(seed=0)`` and after each of ``actions`` (a function of the env and the last info)."""
    env = gym.make(env_id, render_mode="rgb_array", **kwargs)
    _, info = env.reset(seed=0)
    frames = [env.render()]
    for act in actions:
        _, _, terminated, truncated, info = env.step(act(env, info))
        frames.append(env.render())
        if terminated or truncated:
            env.reset(seed=1)
    env.close()
    return frames


def bandits() -> Path:
    """The bandits' tile: gray awaiting the pull, green after the correct arm, red after another one."""
    def best(env: gym.Env, _info: dict) -> int:
        return int(np.argmax(env.unwrapped.score_candidates(np.arange(env.action_space.n))))

    waiting, hit = _frames("tpo_gym/ContextualBandit-v0", [best])
    _, miss = _frames("tpo_gym/ContextualBandit-v0", [lambda env, info: (best(env, info) + 1) % env.action_space.n])
    return _panel("env-bandits", [(waiting, "awaiting the pull"), (hit, "correct arm: reward 1"),
                                  (miss, "another arm: reward 0")])


def token_task() -> Path:
    """TokenReversal (V=2, H=10): the prompt on top, the answer row filling in, right tokens then a wrong one."""
    def right(env: gym.Env, _info: dict) -> int:
        return int(np.argmax(env.unwrapped.score_candidates(np.arange(env.action_space.n))))

    def wrong(env: gym.Env, info: dict) -> int:
        return 1 - right(env, info)

    frames = _frames("tpo_gym/TokenReversal-v0", [right] * 4 + [wrong] + [right] * 5)
    return _panel("env-token-task", [(frames[0], "reset: prompt, empty answer"), (frames[4], "4 tokens written"),
                                     (frames[10], "episode end (1 wrong)")], width=7.6, height=1.1, cell=8)


def mnist() -> Path:
    """Four MNIST contexts (the env's frame is the image of the current context)."""
    env = gym.make("tpo_gym/MNISTBandit-v0", render_mode="rgb_array")
    frames = []
    for seed in range(4):
        env.reset(seed=seed)
        label = int(np.argmax(env.unwrapped.score_candidates(np.arange(10))))
        frames.append((env.render(), f"label {label}"))
    env.close()
    return _panel("env-mnist", frames, height=1.9)


def reasoning_gym() -> Path:
    """A Reasoning Gym question (the ``gcd`` dataset) answered right: the frame after the step, at its own size
    (text drawn by the env; enlarging or shrinking it would blur it)."""
    env = gym.make("tpo_gym/ReasoningGym-v0", dataset="gcd", size=5, seed=0, render_mode="rgb_array")
    env.reset(seed=0)
    env.step(f"The numbers share no larger factor. <answer>{env.unwrapped.entry['answer']}</answer>")
    frame = env.render()
    env.close()
    ink = (frame < 250).any(axis=2)  # crop the blank margins right of and below the text
    rows, cols = np.flatnonzero(ink.any(axis=1)), np.flatnonzero(ink.any(axis=0))
    path = OUT / "env-reasoning-gym.png"
    plt.imsave(path, frame[: rows[-1] + 12, : cols[-1] + 12] if ink.any() else frame)
    return path


def tpo_target() -> Path:
    """TPO's target on one group of K = 6 candidates (docs/method.md 1.1-1.2): p_old, the scores s and their
    z-scores u, and q ∝ p_old · exp(u / eta) for eta = 1 and eta = 0.25, computed by tpo_gym.objectives."""
    import torch

    from tpo_gym.objectives import standardize_scores
    from tpo_gym.objectives import tpo_target as target

    p_old = torch.tensor([0.35, 0.25, 0.15, 0.12, 0.08, 0.05], dtype=torch.float64)
    scores = torch.tensor([0.0, 1.0, 0.0, 1.0, 1.0, 0.0], dtype=torch.float64)
    u = standardize_scores(scores)
    q1 = target(p_old.log(), u, eta=1.0)
    q4 = target(p_old.log(), u, eta=0.25)
    k = np.arange(len(p_old))
    fig, (ax_s, ax_p) = plt.subplots(1, 2, figsize=(7.6, 2.8), width_ratios=[1, 2.2])
    ax_s.bar(k, scores.numpy(), color=["#c44e52" if s == 0 else "#55a868" for s in scores.tolist()])
    for i, ui in enumerate(u.tolist()):
        ax_s.annotate(f"u={ui:+.0f}", (i, scores[i].item()), ha="center", va="bottom", fontsize=7,
                      xytext=(0, 2), textcoords="offset points")
    ax_s.set_ylim(0, 1.3)
    ax_s.set_title("scores s (1 = correct)", fontsize=9)
    w = 0.27
    ax_p.bar(k - w, p_old.numpy(), w, label=r"$p^{old}$", color="#8c8c8c")
    ax_p.bar(k, q1.numpy(), w, label=r"$q$, $\eta = 1$", color="#4c72b0")
    ax_p.bar(k + w, q4.numpy(), w, label=r"$q$, $\eta = 0.25$", color="#dd8452")
    ax_p.set_title(r"target $q_i \propto p^{old}_i \, e^{u_i/\eta}$", fontsize=9)
    ax_p.legend(fontsize=8, frameon=False)
    for ax in (ax_s, ax_p):
        ax.set_xticks(k, [f"y{i + 1}" for i in k], fontsize=8)
        ax.tick_params(axis="y", labelsize=8)
        ax.spines[["top", "right"]].set_visible(False)
    ax_p.set_ylabel("probability", fontsize=8)
    fig.tight_layout()
    path = OUT / "tpo-target.png"
    fig.savefig(path, dpi=DPI, bbox_inches="tight", pad_inches=0.05)
    plt.close(fig)
    return path


def main() -> None:
    OUT.mkdir(exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # glyphs of a Reasoning Gym question missing from the font
        for make in (bandits, token_task, mnist, reasoning_gym, tpo_target):
            print(make().relative_to(OUT.parent.parent))


if __name__ == "__main__":
    main()
