"""Stable-Baselines3's PPO (``MlpPolicy``, library code unchanged) on two tpo_gym envs.

Prints the token error of ``TokenTask-v0`` (copy, bag, V=2, H=4) and the greedy test error of the
MNIST bandit after training; targets: under 5% and under 15%. Run
``python benchmarks/bench_sb3_ppo.py`` (a few minutes on 2 CPU cores; needs the MNIST data:
``python -m tpo_gym.envs.mnist_data``).
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env

import tpo_gym
from tpo_gym.envs.mnist_data import load_mnist

gym.register_envs(tpo_gym)


def token_task(timesteps: int, seed: int) -> float:
    """Train on copy/bag/V=2/H=4; return the greedy token error over 500 fresh episodes."""
    kwargs = {"target": "copy", "reward": "bag", "vocab_size": 2, "length": 4}
    venv = make_vec_env("tpo_gym/TokenTask-v0", n_envs=8, seed=seed, env_kwargs=kwargs)
    model = PPO("MlpPolicy", venv, n_steps=128, batch_size=256, learning_rate=1e-3, gamma=0.0, seed=seed, verbose=0)
    model.learn(total_timesteps=timesteps)
    env = gym.make("tpo_gym/TokenTask-v0", **kwargs)
    errors = []
    for ep in range(500):
        obs, _ = env.reset(seed=10_000 + ep)
        done, info = False, {}
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, _, done, _, info = env.step(int(action))
        errors.append(info["token_error"])
    return float(np.mean(errors))


def mnist_bandit(timesteps: int, seed: int) -> float:
    """Train on the MNIST bandit (train split); return the greedy error on the 10k test images."""
    venv = make_vec_env("tpo_gym/MNISTBandit-v0", n_envs=8, seed=seed)
    model = PPO(
        "MlpPolicy", venv, n_steps=256, batch_size=256, n_epochs=4, learning_rate=1e-3, gamma=0.0, seed=seed, verbose=0
    )
    model.learn(total_timesteps=timesteps)
    images, labels = load_mnist("test")
    with torch.no_grad():
        obs = torch.as_tensor(np.array(images), device=model.device)  # writable copy
        pred = model.policy.get_distribution(obs).distribution.probs.argmax(dim=1).cpu().numpy()
    return float(np.mean(pred != labels))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--token-steps", type=int, default=12_000)
    parser.add_argument("--mnist-steps", type=int, default=60_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    tok = token_task(args.token_steps, args.seed)
    t1 = time.perf_counter()
    print(
        f"TokenTask-v0 (copy, bag, V=2, H=4), PPO {args.token_steps} steps: token error {tok:.2%} "
        f"(target < 5%) [{t1 - t0:.0f}s]",
        flush=True,
    )
    mn = mnist_bandit(args.mnist_steps, args.seed)
    t2 = time.perf_counter()
    print(f"MNISTBandit-v0, PPO {args.mnist_steps} steps: greedy test error {mn:.2%} (target < 15%) [{t2 - t1:.0f}s]")


if __name__ == "__main__":
    main()
