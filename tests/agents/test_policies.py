"""tpo_gym.agents.policies: predict checks observations against the space; policy files save and load
safely."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from tests.agents.conftest import Boom, bandit_env, small_tpo, token_env
from tpo_gym import TPO
from tpo_gym.agents.common.persistence import AgentFileError


@pytest.mark.parametrize("policy,env", [
    ("MlpPolicy", "bandit"), ("MlpPolicy", "token"), ("TransformerPolicy", "token"), ("MlpPolicy", "mnist")])
def test_predict_on_an_empty_batch_returns_no_actions(policy: str, env: str) -> None:
    made = {"bandit": bandit_env, "token": token_env, "mnist": lambda: gym.make("tpo_gym/MNISTBandit-v0")}[env]()
    model = TPO(policy, made, batch_size=4, seed=0)
    shape = made.observation_space.shape
    one, _ = model.predict(np.stack([made.observation_space.sample()]))
    for empty in (np.zeros((0, *shape), dtype=made.observation_space.dtype), np.zeros((0, *shape)), []):
        actions, state = model.predict(empty, deterministic=True)
        assert state is None and actions.shape == (0,) and actions.dtype == one.dtype


def test_predict_rejects_observations_outside_the_space() -> None:
    model = TPO("TransformerPolicy", token_env(length=3), batch_size=4, seed=0)
    obs, _ = token_env(length=3).reset(seed=0)
    model.predict(obs)
    bad = obs.copy()
    bad[0] = 3  # V = 2: tokens 0, 1 and padding 2
    with pytest.raises(ValueError, match=r"observation value 3 at index \(0, 0\) is outside"):
        model.predict(bad)
    with pytest.raises(ValueError, match="integer dtype"):
        model.predict(obs.astype(np.float64))
    with pytest.raises(ValueError, match="shape"):
        model.predict(obs[:-1])
    mlp = TPO("MlpPolicy", gym.make("tpo_gym/MNISTBandit-v0"), candidates="single", seed=0)
    image = np.zeros((2, 784), dtype=np.float32)
    mlp.predict(image)
    image[1, 5] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        mlp.predict(image)
    image[1, 5] = 2.0
    with pytest.raises(ValueError, match="outside the bounds"):
        mlp.predict(image)


@pytest.mark.parametrize("make", [lambda: small_tpo(), lambda: TPO("TransformerPolicy", token_env(), seed=0)])
def test_policy_save_load_is_safe(make: Any, tmp_path: Path) -> None:
    model = make()
    model.policy.save(str(tmp_path / "policy.pt"))
    loaded = type(model.policy).load(str(tmp_path / "policy.pt"))
    for k, v in model.policy.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[k], v, rtol=0, atol=0)
    marker = tmp_path / "pwned"
    torch.save({"state_dict": {}, "data": Boom(marker)}, tmp_path / "evil.pt")
    with pytest.raises(AgentFileError, match="not a tpo-gym policy file"):
        type(model.policy).load(str(tmp_path / "evil.pt"))
    assert not marker.exists()


def test_policy_save_replaces_a_link_at_its_path_instead_of_writing_through_it(tmp_path: Path) -> None:
    from tpo_gym.agents.policies import MlpPolicy

    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (tmp_path / "policy.pt").symlink_to(victim)
    model = small_tpo()
    model.policy.save(str(tmp_path / "policy.pt"))
    assert victim.read_text() == "keep me"
    assert not (tmp_path / "policy.pt").is_symlink()
    loaded = MlpPolicy.load(str(tmp_path / "policy.pt"))
    for k, v in model.policy.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v)


@pytest.mark.parametrize("module,name", [
    ("tpo_gym.agents.optimizers", "MuonAdamW"), ("tpo_gym.agents.transformer", "TransformerPolicy")])
def test_classes_moved_out_of_policies_still_resolve_by_their_old_name(module: str, name: str) -> None:
    """Agent files name classes ``module:QualName``; files written before the split name ``tpo_gym.agents.policies``,
    and files written before the agents' subpackages name ``tpo_gym.agents.policies.optimizers`` / ``.transformer``."""
    import importlib

    from tpo_gym.agents import policies
    from tpo_gym.agents.common.persistence import class_from_name, class_to_name, decode_value

    moved = getattr(importlib.import_module(module), name)
    assert getattr(policies, name) is moved
    assert class_to_name(moved) == f"{module.replace('agents.', 'agents.policies.')}:{name}"
    for old in (f"tpo_gym.agents.policies:{name}", f"{module}:{name}"):
        assert class_from_name(old, "field", (torch.nn.Module, torch.optim.Optimizer)) is moved
        assert decode_value({"cls": {"__class__": old}}, "kwargs") == {"cls": moved}


def test_agent_file_naming_the_old_policies_module_loads(tmp_path: Path) -> None:
    import json
    import zipfile

    from tpo_gym.agents.policies.optimizers import MuonAdamW
    from tpo_gym.agents.policies.transformer import TransformerPolicy

    model = TPO(TransformerPolicy, token_env(), batch_size=4, seed=0, policy_kwargs={"optimizer_class": MuonAdamW})
    model.save(tmp_path / "new.zip")
    with zipfile.ZipFile(tmp_path / "new.zip") as zf:
        entries = {n: zf.read(n) for n in zf.namelist()}
    meta = json.loads(entries["tpo_gym.json"])
    # as written before the split: the policy by class name (not its alias), both classes under policies
    assert meta["policy"] == "TransformerPolicy"
    meta["policy"] = {"__class__": "tpo_gym.agents.policies:TransformerPolicy"}
    text = json.dumps(meta)
    assert "tpo_gym.agents.policies.optimizers:MuonAdamW" in text
    # before the split (tpo_gym.agents.policies), and before the agents' subpackages (tpo_gym.agents.optimizers)
    for i, old_name in enumerate(("tpo_gym.agents.policies:MuonAdamW", "tpo_gym.agents.optimizers:MuonAdamW")):
        entries["tpo_gym.json"] = text.replace("tpo_gym.agents.policies.optimizers:MuonAdamW", old_name).encode()
        with zipfile.ZipFile(tmp_path / f"old{i}.zip", "w") as zf:
            for n, data in entries.items():
                zf.writestr(n, data)
        loaded = TPO.load(tmp_path / f"old{i}.zip")
        assert type(loaded.policy) is TransformerPolicy and type(loaded.policy.optimizer) is MuonAdamW
        for k, v in model.policy.state_dict().items():
            assert torch.equal(loaded.policy.state_dict()[k], v)


def test_muon_adamw_exposes_its_inner_optimizers_read_only() -> None:
    from tpo_gym.agents.policies.optimizers import MuonAdamW

    opt = MuonAdamW([torch.nn.Parameter(torch.zeros(3, 2)), torch.nn.Parameter(torch.zeros(2))])
    assert [type(o) for o in opt.optimizers] == [torch.optim.Muon, torch.optim.AdamW]
    assert all(a is b for a, b in zip(opt.optimizers, opt._optimizers, strict=True))
    with pytest.raises(AttributeError):
        opt.optimizers = ()  # type: ignore[misc]


def test_a_copied_or_pickled_muon_adamw_agent_trains_on_as_the_original() -> None:
    """MuonAdamW is copied as its two inner optimisers (torch's Optimizer state would overwrite its properties and
    patch the class): the copies continue exactly as the original, and later agents still build."""
    import copy
    import pickle

    import gymnasium as gym

    from tpo_gym import TPO

    def make(seed: int) -> TPO:
        return TPO("TransformerPolicy", gym.make("tpo_gym/TokenReversal-v0"), batch_size=4, group_size=2, seed=seed,
                   policy_kwargs={"d_model": 8, "d_ff": 16, "n_layers": 1})

    model = make(0)
    model.learn(model.steps_per_iteration)
    copies = [copy.deepcopy(model), pickle.loads(pickle.dumps(model))]
    model.learn(2 * model.steps_per_iteration, reset_num_timesteps=False)
    for c in copies:
        assert type(c.policy.optimizer).__name__ == "MuonAdamW" and c.policy.optimizer.optimizers
        c.learn(2 * c.steps_per_iteration, reset_num_timesteps=False)
        assert c.history == model.history
    make(1).learn(model.steps_per_iteration)


def _grouped_batch(setup: str, dtype: torch.dtype) -> tuple[Any, torch.Tensor]:
    """A sequence-level TPO agent (K = 4 rollouts of each of 3 prompts) and its rollout observations."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        agent = TPO("TransformerPolicy", gym.make("tpo_gym/TokenTask-v0", target="reverse_copy", vocab_size=3,
                                                  length=5), level="sequence", batch_size=3, group_size=4, seed=0,
                    policy_kwargs={"d_model": 16, "d_ff": 32, "n_layers": 2, "setup": setup})
        agent.learn(agent.steps_per_iteration)
    finally:
        torch.set_default_dtype(previous)
    return agent, agent.rollout_batch.obs


@pytest.mark.parametrize("setup", ["tuned", "reference"])
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_a_prompt_once_per_group_gives_the_same_logits_and_gradients(setup: str, dtype: torch.dtype,
                                                                     tol: float) -> None:
    """The sequence-level update computes each group's prompt once (issue 46): logits and every parameter's
    gradient equal the plain forward's to float rounding, in both setups."""
    agent, obs = _grouped_batch(setup, dtype)
    policy = agent.policy
    assert bool((obs[0:4, -1, :5] == obs[0, -1, :5]).all())  # the 4 rollouts of a group share their prompt
    weights = torch.randn(obs.shape[0], obs.shape[1], policy.n_actions, dtype=dtype, generator=torch.Generator()
                          .manual_seed(0))
    calls = []
    grouped_hidden = policy._grouped_hidden
    policy._grouped_hidden = lambda *a: calls.append(a) or grouped_hidden(*a)  # type: ignore[method-assign]
    results = []
    for group_size in (1, 4):
        policy.zero_grad(set_to_none=True)
        logits = policy.step_logits(obs, group_size=group_size)
        (logits * weights).sum().backward()
        results.append((logits.detach(), {n: p.grad.clone() for n, p in policy.named_parameters()}))
    (plain, plain_grads), (grouped, grouped_grads) = results
    assert len(calls) == 1 and calls[0][0].shape == (3, 5)  # the grouped forward ran, on 3 prompts
    torch.testing.assert_close(grouped, plain, rtol=tol, atol=tol)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(grouped_grads[name], grad, rtol=tol, atol=tol, msg=name)


def test_a_group_whose_rows_do_not_share_a_prompt_falls_back_to_the_plain_forward() -> None:
    agent, obs = _grouped_batch("tuned", torch.float64)
    mixed = obs.clone()
    mixed[1, :, 0] = (mixed[1, :, 0] + 1) % 3  # row 1's prompt differs from its group's
    torch.testing.assert_close(agent.policy.step_logits(mixed, group_size=4), agent.policy.step_logits(mixed),
                               rtol=0, atol=0)
