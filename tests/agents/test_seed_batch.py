"""Seed-batched training (tpo_gym.agents.common.seed_batch): a seed trained in a batch is that seed trained alone."""

from __future__ import annotations

import math
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from tpo_gym import DG, GRPO, PPO, REINFORCE, TPO, SeedBatch, train_seeds
from tpo_gym.agents.common.seed_batch import StackedMuon, stacked_newton_schulz

SMALL = {"policy_kwargs": {"d_model": 16, "d_ff": 32, "n_layers": 1}}
TOKEN = "tpo_gym/TokenReversal-v0"

# (agent class, policy, env id or factory, agent kwargs): every family of agent the harness batches
FAMILIES = {
    "TPO_token": (TPO, "TransformerPolicy", TOKEN, {"level": "token", "batch_size": 12, "group_size": 4, **SMALL}),
    "GRPO_sequence": (GRPO, "TransformerPolicy", TOKEN,
                      {"level": "sequence", "batch_size": 8, "group_size": 4, **SMALL}),
    "PPO": (PPO, "TransformerPolicy", TOKEN, {"batch_size": 16, **SMALL}),
    "DG_reference": (DG, "TransformerPolicy", TOKEN,
                     {"batch_size": 16, "learning_rate": 3e-3,
                      "policy_kwargs": {**SMALL["policy_kwargs"], "setup": "reference"}}),
    "TPO_mnist": (TPO, "MlpPolicy", lambda: gym.make("tpo_gym/MNISTBandit-v0", split="train"),
                  {"candidates": "single", "batch_size": 32}),
}


def _alone(cls, policy, env, kwargs, seed: int, iterations: int):
    agent = cls(policy, env if isinstance(env, str) else env(), seed=seed, **kwargs)
    agent.learn(iterations * agent.steps_per_iteration)
    return agent


def _steps(cls, policy, env, kwargs) -> int:
    return cls(policy, env if isinstance(env, str) else env(), **kwargs).steps_per_iteration


def _max_diff(a: list[dict], b: list[dict]) -> float:
    assert len(a) == len(b) and [r.keys() for r in a] == [r.keys() for r in b]
    worst = 0.0
    for ra, rb in zip(a, b, strict=True):
        for key, va in ra.items():
            vb = rb[key]
            if isinstance(va, float) and math.isnan(va):
                assert math.isnan(vb), key
                continue
            worst = max(worst, abs(float(va) - float(vb)))
    return worst


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_seed_in_a_batch_trains_as_it_does_alone(family: str) -> None:
    cls, policy, env, kwargs = FAMILIES[family]
    iterations, seeds = 3, [0, 1, 2]
    alone = [_alone(cls, policy, env, kwargs, s, iterations).history for s in seeds]
    assert _max_diff(alone[0], alone[1]) > 0  # the seeds differ, so equality below means something
    total = iterations * _steps(cls, policy, env, kwargs)
    looped = train_seeds(cls, policy, env, seeds, total, forward="loop", optimizer="loop", **kwargs)
    for s in range(len(seeds)):  # the loop is the alone computation: bit-identical
        assert _max_diff(looped[s].history, alone[s]) == 0.0
    stacked = train_seeds(cls, policy, env, seeds, total, forward="stacked", optimizer="stacked", **kwargs)
    for s in range(len(seeds)):
        assert _max_diff(stacked[s].history, alone[s]) < 1e-4
        # Muon and Adam normalise each update: where the true gradient is 0 (a key bias shifts every attention
        # logit of a query equally) the gradient is rounding noise, and noise moves a weight a whole step
        # whatever its size; elsewhere a rounding-level difference moves weights far less than a step (~1e-3)
        ref = {n: p.detach() for n, p in looped[s].policy.named_parameters() if not n.endswith("k.bias")}
        got = {n: p.detach() for n, p in stacked[s].policy.named_parameters() if not n.endswith("k.bias")}
        assert max(float((ref[n] - got[n]).abs().max()) for n in ref) < 5e-3


def test_stacked_forward_equals_each_seeds_own_forward() -> None:
    agents = [TPO("TransformerPolicy", TOKEN, seed=s, batch_size=6, group_size=3, **SMALL) for s in range(3)]
    for a in agents:
        a.learn(a.steps_per_iteration)
    names = [n for n, _ in agents[0].policy.named_parameters()]
    params = {n: torch.stack([dict(a.policy.named_parameters())[n].detach() for a in agents]) for n in names}
    obs = torch.stack([a.rollout_batch.obs for a in agents])
    out = agents[0].policy.stacked_step_logits(params, obs)
    for s, a in enumerate(agents):
        torch.testing.assert_close(out[s], a.policy.step_logits(a.rollout_batch.obs), rtol=1e-5, atol=1e-6)


def test_stacked_muon_is_torch_muon_per_seed() -> None:
    gen = torch.Generator().manual_seed(0)
    shapes = [(5, 3), (3, 7)]
    for shape in shapes:
        w = torch.randn(4, *shape, generator=gen)
        grads = [torch.randn(4, *shape, generator=gen) for _ in range(3)]
        stacked = w.clone()
        opt = StackedMuon([{"params": [stacked], "lr": 0.02, "weight_decay": 0.1, "momentum": 0.95, "nesterov": True,
                            "ns_coefficients": (3.4445, -4.775, 2.0315), "eps": 1e-7, "ns_steps": 5,
                            "adjust_lr_fn": "match_rms_adamw"}])
        singles = [torch.nn.Parameter(w[s].clone()) for s in range(4)]
        torch_opts = [torch.optim.Muon([p], lr=0.02, weight_decay=0.1, adjust_lr_fn="match_rms_adamw") for p in singles]
        for g in grads:
            stacked.grad = g.clone()
            opt.step()
            for s, (p, o) in enumerate(zip(singles, torch_opts, strict=True)):
                p.grad = g[s].clone()
                o.step()
        for s in range(4):
            torch.testing.assert_close(stacked[s], singles[s].detach(), rtol=0, atol=2e-3)
        assert not torch.equal(stacked, w)
    with pytest.raises(ValueError, match=r"\[S, A, B\]"):
        stacked_newton_schulz(torch.ones(3, 3), (1.0, 0.0, 0.0), 1, 1e-7)


def test_save_and_load_a_seed_batched_run(tmp_path: Path) -> None:
    cls, policy, env, kwargs = FAMILIES["TPO_token"]
    steps = _steps(cls, policy, env, kwargs)
    agents = train_seeds(cls, policy, env, 2, 2 * steps, forward="stacked", optimizer="stacked", **kwargs)
    alone = [_alone(cls, policy, env, kwargs, s, 2) for s in range(2)]
    for s, (a, b) in enumerate(zip(agents, alone, strict=True)):
        path = tmp_path / f"seed{s}.zip"
        a.save(path)
        loaded = TPO.load(path, env=gym.make(TOKEN))
        assert _max_diff(loaded.history, a.history) == 0.0
        # the optimiser state written back by the batch: the next update of the loaded agent is the next
        # update of the seed trained alone
        loaded.set_env(b.get_env())
        b_state = b.policy.optimizer.state_dict()
        l_state = loaded.policy.optimizer.state_dict()
        for x, y in zip(b_state["optimizers"], l_state["optimizers"], strict=True):
            for key in x["state"]:
                for name, v in x["state"][key].items():
                    torch.testing.assert_close(y["state"][key][name], v, rtol=1e-5, atol=1e-6)
    # the agents no longer share storage once the batch is done
    p0 = next(agents[0].policy.parameters())
    p1 = next(agents[1].policy.parameters())
    assert p0.untyped_storage().data_ptr() != p1.untyped_storage().data_ptr()
    assert p0.grad is None


def test_a_save_in_the_middle_of_a_seed_batched_run_is_that_seeds_own(tmp_path: Path) -> None:
    """A callback's ``model.save`` during ``SeedBatch.learn`` writes that seed's weights only (not the
    stacked S-seed tensors they are views of) and the optimiser state so far (held by the stacked optimiser),
    equal to the seed's trained alone up to the stacked path's float rounding."""
    from stable_baselines3.common.callbacks import BaseCallback

    class SaveAt(BaseCallback):
        def __init__(self, path: Path) -> None:
            super().__init__()
            self.path = path

        def _on_step(self) -> bool:
            if self.model.num_timesteps == 2 * self.model.steps_per_iteration:  # after 1 update, before the 2nd
                self.model.save(self.path)
            return True

    cls, policy, env, kwargs = FAMILIES["TPO_token"]
    steps = _steps(cls, policy, env, kwargs)
    agents = [cls(policy, env, seed=s, **kwargs) for s in range(3)]
    SeedBatch(agents, forward="stacked", optimizer="stacked").learn(
        3 * steps, callback=[SaveAt(tmp_path / f"seed{s}.zip") for s in range(3)])
    alone = _alone(cls, policy, env, kwargs, 1, 1)
    from tpo_gym.agents.common import persistence

    _, weights = persistence.read_agent_file(tmp_path / "seed1.zip", device="cpu")
    for name, t in weights["policy"].items():  # each tensor stored alone, not the [S, ...] storage of its view
        assert t.untyped_storage().nbytes() == t.numel() * t.element_size(), name
    mid = TPO.load(tmp_path / "seed1.zip", env=gym.make(TOKEN))
    for (name, p), q in zip(alone.policy.named_parameters(), mid.policy.parameters(), strict=True):
        assert q.shape == p.shape, name
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5)
    a_state = alone.policy.optimizer.state_dict()["optimizers"]
    m_state = mid.policy.optimizer.state_dict()["optimizers"]
    for x, y in zip(a_state, m_state, strict=True):
        assert x["state"] and sorted(x["state"]) == sorted(y["state"])
        for key in x["state"]:
            for name, v in x["state"][key].items():
                torch.testing.assert_close(y["state"][key][name], v, rtol=1e-4, atol=1e-5)


def test_a_copy_made_in_the_middle_of_a_stacked_run_is_a_plain_agent_that_trains_on() -> None:
    """``copy.deepcopy`` / ``pickle`` of a seed from a callback while the stacked optimiser steps it: a plain agent
    (its own optimiser, current state) that trains on exactly as a copy of that seed made at the same point."""
    import copy
    import pickle

    from stable_baselines3.common.callbacks import BaseCallback

    copies: dict[str, object] = {}

    class CopyAt(BaseCallback):
        def _on_step(self) -> bool:
            if self.model.num_timesteps == 2 * self.model.steps_per_iteration and not copies:
                copies["deep"] = copy.deepcopy(self.model)
                copies["pickled"] = pickle.loads(pickle.dumps(self.model))
            return True

    cls, policy, env, kwargs = FAMILIES["TPO_token"]
    steps = _steps(cls, policy, env, kwargs)
    agents = [cls(policy, env, seed=s, **kwargs) for s in range(2)]
    SeedBatch(agents, forward="loop", optimizer="stacked").learn(3 * steps, callback=[CopyAt(), None])
    histories = []
    for c in copies.values():
        optimizer = c.policy.optimizer
        assert isinstance(optimizer, torch.optim.Optimizer) and type(optimizer).__name__ == "MuonAdamW"
        c.learn(steps, reset_num_timesteps=False)
        histories.append(c.history)
    assert histories[0] == histories[1] and len(histories[0]) == 2
    fresh = cls(policy, env, seed=5, **kwargs)  # copying left no trace on the optimiser classes
    fresh.learn(steps)


def test_bad_seed_counts_get_a_clear_error() -> None:
    cls, policy, env, kwargs = FAMILIES["PPO"]
    for bad in (0, -3, True, [], [1, 1], "3"):
        with pytest.raises(ValueError, match="seed"):
            train_seeds(cls, policy, env, bad, 10, **kwargs)
    with pytest.raises(ValueError, match=r"S=1000000000000 needs about .* GiB .* free; use a smaller S"):
        train_seeds(cls, policy, env, 10**12, 10, **kwargs)
    with pytest.raises(ValueError, match="at least one agent"):
        SeedBatch([])
    with pytest.raises(ValueError, match="env factory"):
        train_seeds(cls, policy, gym.make(TOKEN), 2, 10, **kwargs)


def test_a_batch_refuses_mismatched_agents_and_modes() -> None:
    a = PPO("TransformerPolicy", TOKEN, seed=0, batch_size=16, **SMALL)
    b = REINFORCE("TransformerPolicy", TOKEN, seed=1, batch_size=16, **SMALL)
    with pytest.raises(ValueError, match="one class"):
        SeedBatch([a, b])
    c = PPO("TransformerPolicy", TOKEN, seed=1, batch_size=16, policy_kwargs={"d_model": 8, "d_ff": 32, "n_layers": 1})
    with pytest.raises(ValueError, match="same parameters"):
        SeedBatch([a, c])
    d = PPO("TransformerPolicy", TOKEN, seed=1, batch_size=8, **SMALL)
    with pytest.raises(ValueError, match="steps_per_iteration"):
        SeedBatch([a, d])
    with pytest.raises(ValueError, match="forward"):
        SeedBatch([a], forward="vmap")
    sgd = PPO("TransformerPolicy", TOKEN, seed=0, batch_size=16,
              policy_kwargs={**SMALL["policy_kwargs"], "optimizer_class": torch.optim.RMSprop})
    with pytest.raises(ValueError, match="optimizer='stacked' does not support"):
        SeedBatch([sgd], optimizer="stacked")
    with pytest.raises(ValueError, match="callback: one per seed"):
        SeedBatch([a]).learn(16, callback=[None, None])


def test_a_stacked_optimiser_refuses_seeds_with_other_optimiser_settings() -> None:
    """optimizer="stacked" steps every seed with seed 0's settings: seeds with another learning rate (or
    schedule, or Adam betas) are refused by name; "auto" falls back to the per-seed loop, which follows them."""
    a = TPO("TransformerPolicy", TOKEN, seed=0, batch_size=12, group_size=4, **SMALL)
    b = TPO("TransformerPolicy", TOKEN, seed=1, batch_size=12, group_size=4, learning_rate=0.05, **SMALL)
    with pytest.raises(ValueError, match=r"seed 1 differs from seed 0 in .*'lr': 0.05 vs 0.001; use optimizer='loop'"):
        SeedBatch([a, b], optimizer="stacked")
    assert SeedBatch([a, b]).optimizer == "loop"
    c = TPO("TransformerPolicy", TOKEN, seed=1, batch_size=12, group_size=4, learning_rate=lambda p: 1e-3 * p, **SMALL)
    with pytest.raises(ValueError, match="learning-rate schedule at progress 0.5"):
        SeedBatch([a, c], optimizer="stacked")
    same = TPO("TransformerPolicy", TOKEN, seed=1, batch_size=12, group_size=4, **SMALL)
    assert SeedBatch([a, same], optimizer="stacked").optimizer == "stacked"
    batch = SeedBatch([a, b], optimizer="loop")
    batch.learn(2 * a.steps_per_iteration)
    alone = _alone(TPO, "TransformerPolicy", TOKEN, {"batch_size": 12, "group_size": 4, "learning_rate": 0.05,
                                                      **SMALL}, seed=1, iterations=2)
    assert _max_diff(b.history, alone.history) == 0.0


def test_device_placement_on_cpu() -> None:
    cls, policy, env, kwargs = FAMILIES["PPO"]
    agents = [cls(policy, env, seed=s, device="cpu", **kwargs) for s in range(2)]
    batch = SeedBatch(agents)
    assert (batch.forward, batch.optimizer, batch.rollout) == ("loop", "loop", "loop")  # "auto" on CPU
    batch.learn(agents[0].steps_per_iteration)
    assert all(p.device.type == "cpu" for a in agents for p in a.policy.parameters())
    assert [len(h) for h in batch.histories] == [1, 1]
    assert np.isfinite([h[0]["grad_norm"] for h in batch.histories]).all()


@pytest.mark.parametrize("family", ["TPO_token", "GRPO_sequence", "PPO", "TPO_mnist"])
def test_stacked_rollouts_give_each_seed_its_own_rollout(family: str) -> None:
    """One on-device env of S N sub-envs and one stacked decode: each seed's contexts, draws and curve."""
    cls, policy, env, kwargs = FAMILIES[family]
    kwargs = {**kwargs, "rollouts_on_device": True}
    steps = _steps(cls, policy, env, kwargs)
    alone = [_alone(cls, policy, env, kwargs, s, 3) for s in range(3)]
    agents = [cls(policy, env if isinstance(env, str) else env(), seed=s, **kwargs) for s in range(3)]
    batch = SeedBatch(agents, forward="loop", optimizer="loop", rollout="stacked")
    batch.learn(3 * steps)
    for a, b in zip(alone, agents, strict=True):
        assert [r["error"] for r in a.history] == [r["error"] for r in b.history], "the same rollouts"
        assert _max_diff(a.history, b.history) < 1e-5, "updates on log-probs equal to float rounding"
    stacked = [cls(policy, env if isinstance(env, str) else env(), seed=s, **kwargs) for s in range(3)]
    SeedBatch(stacked, forward="stacked", optimizer="stacked", rollout="stacked").learn(steps)
    for a, b in zip(alone, stacked, strict=True):
        assert a.history[0]["error"] == b.history[0]["error"]
        assert _max_diff(a.history[:1], b.history) < 1e-4


def test_stacked_rollouts_need_on_device_envs_of_one_task() -> None:
    cls, policy, env, kwargs = FAMILIES["TPO_token"]
    host = [cls(policy, env, seed=s, **kwargs) for s in range(2)]
    with pytest.raises(ValueError, match="rollout='stacked': every seed must roll out on its device"):
        SeedBatch(host, rollout="stacked")
    other = cls(policy, "tpo_gym/TokenTask-v0", seed=2, rollouts_on_device=True, **kwargs)
    dev = [cls(policy, env, seed=s, rollouts_on_device=True, **kwargs) for s in range(2)]
    with pytest.raises(ValueError, match="the same env"):
        SeedBatch([*dev, other], rollout="stacked")
    bandit = [TPO("MlpPolicy", "tpo_gym/Bandit-v0", seed=s, batch_size=4, group_size=2, rollouts_on_device=True)
              for s in range(2)]
    with pytest.raises(ValueError, match="no on-device tensor form"):
        SeedBatch(bandit, rollout="stacked")
    assert SeedBatch(dev).rollout == "loop", "auto: loop on CPU"
