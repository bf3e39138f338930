"""The reference code's setup: ReferenceMuon (optax.contrib.muon semantics) and TransformerPolicy(setup="reference")."""

from __future__ import annotations

import math
from pathlib import Path

import gymnasium as gym
import pytest
import torch

import tpo_gym  # noqa: F401
from tpo_gym import TPO
from tpo_gym.agents.policies.reference_setup import ReferenceMuon, newton_schulz

A, B, C = 3.4445, -4.7750, 2.0315
BETA = 0.95


def f5(sigma: float) -> float:
    """Five quintic Newton-Schulz iterations on one singular value: s -> a s + b s^3 + c s^5."""
    for _ in range(5):
        sigma = A * sigma + B * sigma**3 + C * sigma**5
    return sigma


def _param(values: list, layout: str, lr: float = 0.1) -> tuple[torch.nn.Parameter, ReferenceMuon]:
    p = torch.nn.Parameter(torch.zeros(torch.tensor(values).shape, dtype=torch.float64))
    return p, ReferenceMuon([{"params": [p], "muon": True, "layouts": [layout]}], lr=lr)


def _step(p: torch.nn.Parameter, opt: ReferenceMuon, grad: list) -> None:
    p.grad = torch.tensor(grad, dtype=torch.float64)
    opt.step()


def test_first_muon_step_by_hand_on_a_diagonal_matrix() -> None:
    p, opt = _param([[0.0, 0.0], [0.0, 0.0]], "embedding")
    _step(p, opt, [[3.0, 0.0], [0.0, 4.0]])
    # mu_hat is a positive multiple of G; Frobenius-normalised G = diag(0.6, 0.8); square: scale 1
    want = torch.tensor([[-0.1 * f5(0.6), 0.0], [0.0, -0.1 * f5(0.8)]], dtype=torch.float64)
    torch.testing.assert_close(p.data, want, rtol=1e-7, atol=1e-12)


def test_second_muon_step_uses_bias_corrected_nesterov_momentum() -> None:
    p, opt = _param([[0.0, 0.0], [0.0, 0.0]], "embedding")
    g1, g2 = (3.0, 4.0), (1.0, -2.0)
    _step(p, opt, [[g1[0], 0.0], [0.0, g1[1]]])
    before = p.data.clone()
    _step(p, opt, [[g2[0], 0.0], [0.0, g2[1]]])
    mu1 = [(1 - BETA) * g for g in g1]
    mu2 = [BETA * m + (1 - BETA) * g for m, g in zip(mu1, g2, strict=True)]
    hat = [BETA * m / (1 - BETA**3) + (1 - BETA) * g / (1 - BETA**2) for m, g in zip(mu2, g2, strict=True)]
    norm = math.sqrt(sum(h * h for h in hat))
    step = [-0.1 * f5(h / norm) for h in hat]  # f is odd: signs carry through
    torch.testing.assert_close(p.data - before, torch.diag(torch.tensor(step, dtype=torch.float64)),
                               rtol=1e-7, atol=1e-12)


def test_scale_follows_the_flax_orientation_of_the_matrix() -> None:
    g = [[1.0], [2.0], [2.0], [4.0]]  # a torch [4, 1] tensor, |g| = 5
    unit = torch.tensor(g, dtype=torch.float64) / 5.0
    # "dense": a Linear weight [out=4, in=1]; Flax's kernel is [in=1, out=4]: scale sqrt(4 / 1) = 2
    p, opt = _param(g, "dense")
    _step(p, opt, g)
    torch.testing.assert_close(p.data, -0.1 * 2.0 * f5(1.0) * unit, rtol=1e-7, atol=1e-12)
    # "embedding": the same [4, 1] matrix in Flax: sqrt(max(1, 1 / 4)) = 1
    p, opt = _param(g, "embedding")
    _step(p, opt, g)
    torch.testing.assert_close(p.data, -0.1 * 1.0 * f5(1.0) * unit, rtol=1e-7, atol=1e-12)


def test_head_bias_is_one_matrix_per_head() -> None:
    # a [4] bias as Flax's [heads=2, 2] matrix diag(3, 4): the diagonal case again
    p, opt = _param([3.0, 0.0, 0.0, 4.0], "heads:2")
    _step(p, opt, [3.0, 0.0, 0.0, 4.0])
    torch.testing.assert_close(p.data, torch.tensor([-0.1 * f5(0.6), 0.0, 0.0, -0.1 * f5(0.8)],
                                                    dtype=torch.float64), rtol=1e-7, atol=1e-12)


def test_nesterov_adam_steps_by_hand() -> None:
    p = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    opt = ReferenceMuon([{"params": [p], "muon": False}], lr=0.1)
    b1, b2, eps = 0.9, 0.999, 1e-8
    m = v = 0.0
    expected = 0.0
    for t, g in enumerate((1.0, -2.0), start=1):
        p.grad = torch.tensor([g], dtype=torch.float64)
        opt.step()
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        m_hat = b1 * m / (1 - b1 ** (t + 1)) + (1 - b1) * g / (1 - b1**t)
        expected -= 0.1 * m_hat / (math.sqrt(v / (1 - b2**t)) + eps)
        assert p.item() == pytest.approx(expected, rel=1e-12)


def test_newton_schulz_matches_the_singular_value_map() -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 5, dtype=torch.float64)
    u, s, vh = torch.linalg.svd(x, full_matrices=False)
    s = s / torch.linalg.matrix_norm(x)
    want = u @ torch.diag(torch.tensor([f5(float(v)) for v in s], dtype=torch.float64)) @ vh
    torch.testing.assert_close(newton_schulz(x, eps=0.0), want, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(newton_schulz(x.T, eps=0.0), want.T, rtol=1e-9, atol=1e-12)


def test_bad_layouts_and_settings_are_refused() -> None:
    w = torch.nn.Parameter(torch.zeros(4))
    with pytest.raises(ValueError, match="heads:3"):
        ReferenceMuon([{"params": [w], "muon": True, "layouts": ["heads:3"]}])
    with pytest.raises(ValueError, match="dense"):
        ReferenceMuon([{"params": [w], "muon": True, "layouts": ["dense"]}])
    with pytest.raises(ValueError, match="beta"):
        ReferenceMuon([w], beta=1.0)


# ---------------------------------------------------------------------------------------------
# the reference transformer
# ---------------------------------------------------------------------------------------------
def _agent(**policy_kwargs: object) -> TPO:
    env = gym.make("tpo_gym/TokenReversal-v0")
    return TPO("TransformerPolicy", env, batch_size=16, group_size=2, seed=0, learning_rate=1e-3,
               policy_kwargs=policy_kwargs)


def test_reference_architecture_and_initialisation() -> None:
    policy = _agent(setup="reference").policy
    assert policy.n_heads == 2 and policy.setup == "reference"
    block = policy.blocks[0]
    assert not hasattr(block, "qkv") and all(lin.bias is not None for lin in (block.q, block.k, block.v, block.proj))
    assert block.ln1.eps == 1e-6 and policy.ln_f.eps == 1e-6
    assert policy.tok_emb.weight.std().item() == pytest.approx(1 / 8, rel=0.25)
    assert policy.pos_emb.weight.std().item() == pytest.approx(0.02, rel=0.25)
    for lin in (block.q, block.ff1, block.ff2, policy.head):
        fan_in = lin.weight.shape[1]
        assert lin.weight.std().item() == pytest.approx(fan_in ** -0.5, rel=0.2)
        assert lin.weight.abs().max().item() <= 2 * fan_in ** -0.5 / 0.87962566103423978 + 1e-6
        assert torch.count_nonzero(lin.bias) == 0
    tuned = _agent().policy
    assert tuned.n_heads == 4 and hasattr(tuned.blocks[0], "qkv") and tuned.blocks[0].ln1.eps == 1e-5


def test_reference_optimiser_split_follows_flax_layouts() -> None:
    policy = _agent(setup="reference").policy
    assert isinstance(policy.optimizer, ReferenceMuon)
    muon, adam = policy.optimizer.param_groups
    names = {id(p): n for n, p in policy.named_parameters()}
    muon_names = {names[id(p)]: lay for p, lay in zip(muon["params"], muon["layouts"], strict=True)}
    adam_names = {names[id(p)] for p in adam["params"]}
    assert muon_names["tok_emb.weight"] == f"embedding:{policy.vocab_size}"
    assert muon_names["pos_emb.weight"] == "embedding"
    assert muon_names["head.weight"] == "dense" and muon_names["blocks.0.ff1.weight"] == "dense"
    assert muon_names["blocks.1.q.bias"] == "heads:2" and muon_names["blocks.1.v.bias"] == "heads:2"
    for name in ("blocks.0.q.weight", "blocks.0.k.weight", "blocks.0.proj.weight", "blocks.0.proj.bias",
                 "blocks.0.ff1.bias", "head.bias", "blocks.0.ln1.weight", "ln_f.bias"):
        assert name in adam_names, name
    assert len(muon_names) + len(adam_names) == len(list(policy.parameters()))


def test_reference_setup_learns_saves_and_loads(tmp_path: Path) -> None:
    model = _agent(setup="reference")
    model.learn(8 * model.steps_per_iteration)
    errors = [h["error"] for h in model.history]
    assert all(math.isfinite(e) for e in errors)
    path = tmp_path / "ref.zip"
    model.save(path)
    loaded = TPO.load(path)
    assert loaded.policy.setup == "reference" and isinstance(loaded.policy.optimizer, ReferenceMuon)
    obs = torch.as_tensor(gym.make("tpo_gym/TokenReversal-v0").reset(seed=1)[0]).unsqueeze(0)
    with torch.no_grad():
        torch.testing.assert_close(loaded.policy.action_logits(obs), model.policy.action_logits(obs))
    assert loaded.policy.optimizer.state_dict()["state"].keys() == model.policy.optimizer.state_dict()["state"].keys()


def test_unknown_setup_names_the_choices() -> None:
    with pytest.raises(ValueError, match="setup.*reference"):
        _agent(setup="jax")


# ---------------------------------------------------------------------------------------------
# MNIST-style single-sample variants of the reference code
# ---------------------------------------------------------------------------------------------
def test_mlp_reference_initialisation() -> None:
    from tpo_gym.agents.policies import MlpPolicy

    space = gym.spaces.Box(0.0, 1.0, (784,))
    policy = MlpPolicy(space, gym.spaces.Discrete(10), lambda _: 1e-3, setup="reference")
    first = policy.net[0]
    assert torch.count_nonzero(first.bias) == 0
    assert first.weight.std().item() == pytest.approx(784 ** -0.5, rel=0.05)
    assert first.weight.abs().max().item() <= 2 * 784 ** -0.5 / 0.87962566103423978 + 1e-6
    tuned = MlpPolicy(space, gym.spaces.Discrete(10), lambda _: 1e-3)
    assert torch.count_nonzero(tuned.net[0].bias) > 0
    with pytest.raises(ValueError, match="setup"):
        MlpPolicy(space, gym.spaces.Discrete(10), lambda _: 1e-3, setup="flax")


def _one_update(agent: object) -> dict:
    """Run one iteration and return what ``prepare`` computed from its batch."""
    seen: dict = {}
    original = agent.prepare

    def spy(batch: object, old: torch.Tensor) -> tuple:
        prepared, diag = original(batch, old)
        seen.update(batch=batch, old=old, prepared=prepared)
        return prepared, diag

    agent.prepare = spy
    agent.learn(agent.steps_per_iteration)
    return seen


def test_standardized_baseline_is_the_batch_z_score() -> None:
    from tpo_gym import REINFORCE

    agent = REINFORCE("MlpPolicy", gym.make("tpo_gym/MNISTBandit-v0", split="train"), batch_size=32, seed=0,
                      baseline="standardized")
    seen = _one_update(agent)
    r = seen["batch"].credited_rewards()
    want = (r - r.mean(dim=0)) / (r.std(dim=0, correction=0) + 1e-8)
    torch.testing.assert_close(seen["prepared"].adv, want, rtol=1e-5, atol=1e-6)


def test_dg_expected_baseline_and_single_candidate_group_pg() -> None:
    from tpo_gym import DG, GroupPG

    env = gym.make("tpo_gym/MNISTBandit-v0", split="train")
    dg = DG("MlpPolicy", env, batch_size=32, seed=0, baseline="expected")
    seen = _one_update(dg)
    batch = seen["batch"]
    want = batch.credited_rewards() - batch.logp_old.exp().pow(2).sum(dim=-1)
    torch.testing.assert_close(seen["prepared"].adv, want)

    gpg = GroupPG("MlpPolicy", env, batch_size=32, seed=0, candidates="single")
    seen = _one_update(gpg)
    batch, u = seen["batch"], seen["prepared"].u
    probs = batch.logp_old.exp()
    a = batch.actions.long()
    adv = batch.rewards - probs.pow(2).sum(dim=-1)
    # z-score over the 10 classes of A * onehot(a), at the sampled class: (A - A/10) / (|A| * 3/10) = 3 sign(A)
    at_sampled = u.gather(-1, a.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(at_sampled, 3.0 * torch.sign(adv), rtol=1e-5, atol=1e-5)
    assert torch.count_nonzero(u) == torch.count_nonzero(adv)  # only the sampled class carries a weight
    with pytest.raises(ValueError, match="baseline"):
        DG("MlpPolicy", env, baseline="standardized")


@pytest.mark.parametrize("vocab", [2, 16])
def test_token_embedding_muon_step_is_the_reference_v_row_tables(vocab: int) -> None:
    """setup="reference": one step on the token table [V + 1, d] (its last row the never-read placeholder)
    equals the reference's step on its V-row table, by hand: -lr sqrt(max(1, d / V)) NS5(mu_hat / |mu_hat|)."""
    env = gym.make("tpo_gym/TokenTask-v0", target="reverse_copy", reward="bag", vocab_size=vocab, length=3)
    policy = TPO("TransformerPolicy", env, batch_size=4, group_size=2, seed=0, learning_rate=1e-3,
                 policy_kwargs={"setup": "reference"}).policy
    emb = policy.tok_emb.weight
    assert emb.shape == (vocab + 1, policy.d_model)
    before = emb.detach().clone().double()
    g = torch.randn(vocab, policy.d_model, generator=torch.Generator().manual_seed(vocab), dtype=torch.float64)
    for p in policy.parameters():
        p.grad = None
    emb.grad = torch.cat([g, torch.zeros(1, policy.d_model, dtype=torch.float64)]).to(emb.dtype)
    policy.optimizer.step()
    # by hand, step t = 1: mu = (1 - b) g; Nesterov mu_hat = b mu / (1 - b^2) + (1 - b) g / (1 - b)
    mu_hat = BETA * (1 - BETA) * g / (1 - BETA**2) + g
    u, s, vh = torch.linalg.svd(mu_hat, full_matrices=False)
    s = s / torch.linalg.matrix_norm(mu_hat)
    ortho = u @ torch.diag(torch.tensor([f5(float(v)) for v in s], dtype=torch.float64)) @ vh
    scale = math.sqrt(max(1.0, policy.d_model / vocab))  # the reference's [V, d] table: 5.66 at V = 2, d = 64
    want = before[:vocab] - 1e-3 * scale * ortho
    torch.testing.assert_close(emb.detach().double()[:vocab], want, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(emb.detach().double()[vocab], before[vocab])  # the placeholder row: no step
    # a (V + 1)-row table's scale would differ (at V = 2: 4.62 instead of 5.66)
    wrong = before[:vocab] - 1e-3 * math.sqrt(max(1.0, policy.d_model / (vocab + 1))) * ortho
    assert not torch.allclose(emb.detach().double()[:vocab], wrong, rtol=1e-4, atol=1e-6)


def test_embedding_rows_layout_is_checked() -> None:
    w = torch.nn.Parameter(torch.zeros(3, 4))
    with pytest.raises(ValueError, match="embedding:5"):
        ReferenceMuon([{"params": [w], "muon": True, "layouts": ["embedding:5"]}])
    ReferenceMuon([{"params": [w], "muon": True, "layouts": ["embedding:2"]}])


def test_tuned_setup_keeps_the_whole_token_table_in_reference_muon() -> None:
    policy = _agent(optimizer_class=ReferenceMuon).policy
    muon = policy.optimizer.param_groups[0]
    names = {id(p): n for n, p in policy.named_parameters()}
    layouts = {names[id(p)]: lay for p, lay in zip(muon["params"], muon["layouts"], strict=True)}
    assert layouts["tok_emb.weight"] == "embedding"


def test_a_saved_whole_table_momentum_continues_on_the_v_row_table() -> None:
    """An optimiser state saved when the token table's momentum covered all V + 1 rows still steps: its
    first V rows are the V-row table's momentum."""
    p = torch.nn.Parameter(torch.zeros(3, 4, dtype=torch.float64))
    old = ReferenceMuon([{"params": [p], "muon": True, "layouts": ["embedding"]}], lr=0.1)
    p.grad = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    old.step()
    saved = old.state_dict()
    q = torch.nn.Parameter(p.detach().clone())
    new = ReferenceMuon([{"params": [q], "muon": True, "layouts": ["embedding:2"]}], lr=0.1)
    new.load_state_dict(saved)
    q.grad = p.grad.clone()
    new.step()
    assert tuple(new.state[q]["momentum"].shape) == (2, 4)
    torch.testing.assert_close(q.detach()[2], p.detach()[2])  # the placeholder row: no step
