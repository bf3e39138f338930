"""TPO_token on token reversal in one file: the env, the objectives, a small transformer and the loop.

Each iteration is the paper's Algorithm 1 (docs/method.md section 1), at the token level:

1. roll out B prompts with the snapshot pi_old; at every prefix state draw K next-token candidates
   from pi_old with replacement (candidate 0 is the token taken) and score them with the env's group
   API, ``venv.score_candidates`` (their immediate reward): every state is a group;
2. z-score the scores within each group: u (section 1.1);
3. build the target q = softmax(log p_old + u / eta) over the K candidates (section 1.2);
4. take E full-batch optimiser steps on the cross-entropy from q to the policy (sections 1.3, 1.4).

Only ``tpo_gym.objectives`` and the registered env are used: no agent class. The model is section 4's
causal transformer (pre-norm, GELU, learned positions) and the optimiser Muon on the 2-D weights with
AdamW on the rest.

Same seed, same curve: on the CPU this script reproduces ``TPO("TransformerPolicy", env, level="token")``
bit for bit, and tests/test_examples.py checks it (error and loss of every iteration, final weights) at
a tiny size. Nothing is copied from the library for that; the script makes the same choices: the
modules are built in the same order after ``torch.manual_seed(seed)`` (so the initial weights are
equal); iteration i is seeded by ``SeedSequence([seed, i])`` and that seed draws the env reset's seed,
then the seed of the candidate draws, as the agent's rollouts do (which makes runs resumable); logits
are decoded with the same key / value cache (so they are the same floats); the optimiser split is the
same. Change any of these and the curves agree only in distribution.

    python examples/tpo_minimal.py                     # the paper's setting: V=2, H=10, B=100, K=8
    python examples/tpo_minimal.py --iterations 20 --length 6
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import tpo_gym  # noqa: F401  (registers the tpo_gym/ envs)
from tpo_gym.objectives import standardize_scores, tpo_loss, tpo_target


@dataclass
class Args:
    env_id: str = "tpo_gym/TokenReversal-v0"  # reverse copy, bag-of-tokens reward (docs/method.md section 3)
    vocab_size: int = 2  # V, the token vocabulary
    length: int = 10  # H, the prompt and answer length
    seed: int = 0  # seeds the initial weights and every iteration's rollouts
    iterations: int = 100  # training iterations ("episodes" in the paper's plots)
    batch_size: int = 100  # B, prompts per iteration
    group_size: int = 8  # K, candidates per state
    epochs: int = 4  # E, optimiser steps per batch
    eta: float = 1.0  # temperature of the target
    learning_rate: float = 1e-3  # of Muon and AdamW alike
    d_model: int = 64  # transformer width
    n_layers: int = 2  # transformer blocks
    n_heads: int = 4  # attention heads
    d_ff: int = 256  # feed-forward width
    threads: int = 1  # torch CPU threads (one is fastest for this model size)


class Block(nn.Module):
    """Pre-norm block: x + attn(ln(x)), then x + ffn(ln(x)); causal; ``cache`` keeps keys / values for decoding."""

    def __init__(self, d: int, n_heads: int, d_ff: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.ln1, self.qkv, self.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ln2, self.ff1, self.ff2 = nn.LayerNorm(d), nn.Linear(d, d_ff), nn.Linear(d_ff, d)

    def forward(self, x: torch.Tensor, cache: list[torch.Tensor] | None = None) -> torch.Tensor:
        n, length, d = x.shape
        q, k, v = (z.reshape(n, length, self.n_heads, d // self.n_heads).transpose(1, 2)
                   for z in self.qkv(self.ln1(x)).split(d, dim=-1))
        causal = not cache  # the first chunk is causal; a decoded position attends to every cached one
        if cache:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        if cache is not None:
            cache[:] = [k, v]
        att = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        x = x + self.proj(att.transpose(1, 2).reshape(n, length, d))
        return x + self.ff2(F.gelu(self.ff1(self.ln2(x))))


class Transformer(nn.Module):
    """Reads [prompt; answer so far] (unwritten slots hold the padding token V) and gives next-token logits."""

    def __init__(self, args: Args) -> None:
        super().__init__()
        self.h = args.length
        self.tok_emb = nn.Embedding(args.vocab_size + 1, args.d_model)
        self.pos_emb = nn.Embedding(2 * args.length, args.d_model)
        self.blocks = nn.ModuleList([Block(args.d_model, args.n_heads, args.d_ff) for _ in range(args.n_layers)])
        self.ln_f = nn.LayerNorm(args.d_model)
        self.head = nn.Linear(args.d_model, args.vocab_size)

    def trunk(self, tokens: torch.Tensor, start: int = 0, caches: list[list[torch.Tensor]] | None = None):
        x = self.tok_emb(tokens) + self.pos_emb.weight[start : start + tokens.shape[1]]
        for i, block in enumerate(self.blocks):
            x = block(x, None if caches is None else caches[i])
        return x

    def decode(self, obs: torch.Tensor, t: int, caches: list[list[torch.Tensor]]) -> torch.Tensor:
        """Logits ``[N, V]`` of answer token t: the prompt at t = 0, then only the token written last."""
        tokens, start = (obs[:, : self.h], 0) if t == 0 else (obs[:, self.h + t - 1 : self.h + t], self.h + t - 1)
        return self.head(self.ln_f(self.trunk(tokens, start, caches)[:, -1]))

    def all_logits(self, last_obs: torch.Tensor) -> torch.Tensor:
        """Logits ``[N, H, V]`` of every answer token in one pass over the last observation (causal attention)."""
        return self.head(self.ln_f(self.trunk(last_obs[:, : 2 * self.h - 1]))[:, self.h - 1 :])


def main(args: Args) -> tuple[list[dict[str, float]], Transformer]:
    """Train; return the per-iteration error (1 - mean reward of the rollouts) and first-epoch loss, and the model."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = Transformer(args)
    matrices = [p for p in model.parameters() if p.ndim == 2]
    optimizers = [torch.optim.Muon(matrices, lr=args.learning_rate, weight_decay=0.0, adjust_lr_fn="match_rms_adamw"),
                  torch.optim.AdamW([p for p in model.parameters() if p.ndim != 2], lr=args.learning_rate,
                                    weight_decay=0.0)]
    venv = gym.make_vec(args.env_id, num_envs=args.batch_size, vectorization_mode="vector_entry_point",
                        vocab_size=args.vocab_size, length=args.length)
    history = []
    for iteration in range(args.iterations):
        # 1. rollouts of pi_old, K scored candidates per state
        seed = int(np.random.SeedSequence([args.seed, iteration]).generate_state(1, np.uint64)[0] >> 2)
        rng = np.random.default_rng(seed)
        obs, _ = venv.reset(seed=int(rng.integers(2**31 - 1)))
        draws_rng = torch.Generator().manual_seed(int(rng.integers(2**62)))
        caches: list[list[torch.Tensor]] = [[] for _ in model.blocks]
        logp_old, candidates, scores = [], [], []
        with torch.no_grad():
            for t in range(args.length):
                last_obs = torch.as_tensor(obs)
                logits = model.decode(last_obs, t, caches)
                draws = torch.multinomial(torch.softmax(logits, -1), args.group_size, replacement=True,
                                          generator=draws_rng)
                logp_old.append(torch.log_softmax(logits, -1).gather(-1, draws))
                candidates.append(draws)
                scores.append(venv.score_candidates(draws.numpy()))
                obs, _, _, _, info = venv.step(draws[:, 0].numpy())
        logp_old, candidates = torch.stack(logp_old, 1), torch.stack(candidates, 1)  # [B, H, K]
        # 2.-3. z-scores within each state's group, and the frozen target
        u = standardize_scores(torch.from_numpy(np.stack(scores, 1)))
        q = tpo_target(logp_old, u, args.eta)
        # 4. E full-batch steps on the cross-entropy from q to pi_theta over the candidates
        for epoch in range(args.epochs):
            for opt in optimizers:
                opt.zero_grad(set_to_none=True)
            loss = tpo_loss(torch.log_softmax(model.all_logits(last_obs), -1).gather(-1, candidates), q)
            loss.backward()
            for opt in optimizers:
                opt.step()
            if epoch == 0:
                first_loss = loss.item()
        history.append({"error": float(np.mean(info["error"])), "loss": first_loss})
        print(f"iteration {iteration}: error {history[-1]['error']:.4f}  loss {first_loss:.4f}")
    return history, model


def parse_args(argv: list[str] | None = None) -> Args:
    """Every field of :class:`Args` as a ``--flag``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for field in dataclasses.fields(Args):
        parser.add_argument(f"--{field.name.replace('_', '-')}", type=type(field.default), default=field.default)
    return Args(**vars(parser.parse_args(argv)))


if __name__ == "__main__":
    main(parse_args())
