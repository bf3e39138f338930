"""Your own algorithm, in your own training loop, in a tpo-gym report: log it, import it, report it.

A CleanRL-style script: one file, one loop, no agent class. It trains ``MLP-TPO`` (TPO's target and loss from
``tpo_gym.objectives`` on a two-layer MLP policy, instead of the library's transformer) on the token task of a
preset setting, the env built exactly as the bench builds it, and writes one run record per seed with
``RunLogger``. Then it brings a bench folder of that setting's built-in TPO runs, imports the records into it and
rebuilds the report, where ``MLP-TPO`` is a row of every table, figure, claim check and ``summary.csv``:

    tpo-gym bench --preset quick --settings "rev. copy V=2 H=5" --setups tuned --methods TPO --seeds 2 --out DIR
    python examples/external_runs.py --out DIR --no-bench   # trains, logs, then runs the two commands below
    tpo-gym import DIR/external --out DIR
    tpo-gym report DIR

``python examples/external_runs.py`` does all of it (the bench of 2 TPO runs takes about a minute on 2 cores,
the script's own runs a few seconds) and prints where the report is.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from torch import nn

import tpo_gym  # noqa: F401  (registers the tpo_gym/ envs)
from tpo_gym.evaluation import cli
from tpo_gym.evaluation.presets import load_preset, setup_setting_name
from tpo_gym.evaluation.run_logger import RunLogger
from tpo_gym.objectives import standardize_scores, tpo_loss, tpo_target

METHOD = "MLP-TPO"


class MLPPolicy(nn.Module):
    """Next-token logits from the whole observation (prompt and answer so far, one-hot): a two-layer MLP."""

    def __init__(self, obs_len: int, vocab_size: int, hidden: int = 64) -> None:
        super().__init__()
        self.n_symbols = vocab_size + 1  # the tokens and the padding of unwritten slots
        self.net = nn.Sequential(nn.Linear(obs_len * self.n_symbols, hidden), nn.Tanh(), nn.Linear(hidden, vocab_size))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(nn.functional.one_hot(obs.long(), self.n_symbols).flatten(-2).float())


def train(preset: str, setting: dict, seed: int, path: Path, iterations: int | None = None, eta: float = 1.0,
          lr: float = 2e-2, epochs: int = 4, threads: int = 1) -> Path:
    """Train MLP-TPO on ``setting`` (a setting of kind token of ``preset``, a preset name or file) with ``seed``;
    write its run record to ``path``."""
    params = setting["params"]
    agent = params.get("agent_kwargs", {})
    batch, k = int(agent.get("batch_size", 100)), int(agent.get("group_size", 8))
    iterations = int(params["episodes"]) if iterations is None else iterations
    env_kwargs = params.get("env_kwargs", {})
    torch.set_num_threads(threads)  # one thread is fastest for a model this small
    torch.manual_seed(seed)
    venv = gym.make_vec(params["env_id"], num_envs=batch, vectorization_mode="vector_entry_point", **env_kwargs)
    rng = np.random.default_rng(seed)
    horizon = int(env_kwargs.get("length", 10))
    policy = MLPPolicy(2 * horizon, int(env_kwargs.get("vocab_size", 2)))
    optimizer = torch.optim.Adam(policy.parameters(), lr=lr)
    config = {"env_id": params["env_id"], "env_kwargs": env_kwargs, "iterations": iterations, "batch_size": batch,
              "group_size": k, "epochs": epochs, "eta": eta, "lr": lr, "hidden": 64}
    with RunLogger(path, preset=preset, setting=setting["name"], method=METHOD, seed=seed,
                   params=config) as log:
        for step in range(iterations):
            obs, _ = venv.reset(seed=int(rng.integers(2**31 - 1)))  # B fresh prompts
            states, draws, scores, logp_old = [], [], [], []
            with torch.no_grad():
                for _ in range(horizon):  # one episode: a K-candidate group at every state
                    state = torch.as_tensor(obs)
                    logp = torch.log_softmax(policy(state), -1)
                    cand = torch.multinomial(logp.exp(), k, replacement=True)
                    states.append(state)
                    draws.append(cand)
                    logp_old.append(logp.gather(-1, cand))
                    scores.append(torch.as_tensor(venv.score_candidates(cand.numpy()), dtype=torch.float32))
                    obs, _, _, _, info = venv.step(cand[:, 0].numpy())
            error = float(np.mean(info["error"]))  # 1 - mean reward of the B rollouts
            obs_all, cand_all = torch.cat(states), torch.cat(draws)
            q = tpo_target(torch.cat(logp_old), standardize_scores(torch.cat(scores)), eta)
            for epoch in range(epochs):
                loss = tpo_loss(torch.log_softmax(policy(obs_all), -1).gather(-1, cand_all), q)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                if epoch == 0:
                    first_loss = loss.item()
            log.count(env_interactions=batch * horizon, reward_queries=batch * horizon * k)
            log.log(step=step, error=error, loss=first_loss)
    return path


def main(argv: list[str] | None = None) -> Path:
    """Bench (unless ``--no-bench``), train and log each seed, import and report; return the report's path."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/external", help="the bench folder (default: runs/external)")
    parser.add_argument("--preset", default="quick", help="a preset name or file (default: quick)")
    parser.add_argument("--setting", default="rev. copy V=2 H=5", help="a token setting of the preset")
    parser.add_argument("--setup", default="tuned", help="the setup, for a preset with setups (default: tuned)")
    parser.add_argument("--seeds", type=int, default=2, help="seeds 0..N-1 (default: 2)")
    parser.add_argument("--iterations", type=int, default=None, help="default: the setting's episodes")
    parser.add_argument("--no-bench", action="store_true", help="--out holds the bench already")
    args = parser.parse_args(argv)
    preset = load_preset(args.preset)
    name = setup_setting_name(args.setting, args.setup) if preset.setups else args.setting
    setting = next(s for s in preset.settings if s["name"] == name)
    out = Path(args.out)
    if not args.no_bench:
        chosen = ["--setups", args.setup] if preset.setups else []
        cli.main(["bench", "--preset", args.preset, "--settings", args.setting, *chosen, "--methods", "TPO",
                  "--seeds", str(args.seeds), "--out", str(out), "--no-progress"])
    for seed in range(args.seeds):
        record = train(args.preset, setting, seed, out / "external" / f"mlp_tpo_seed{seed}.json", args.iterations)
        print(f"wrote {record}")
    cli.main(["import", str(out / "external"), "--out", str(out), "--no-report"])
    cli.main(["report", str(out)])
    return out / "report.md"


if __name__ == "__main__":
    print(f"report: {main()}")
