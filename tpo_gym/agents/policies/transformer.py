"""The causal transformer policy of the token tasks: :class:`TransformerPolicy` and its blocks.

A :class:`~tpo_gym.agents.policies.CategoricalPolicy` over ``MultiDiscrete([V + 1] * 2H)`` token
observations (docs/method.md section 4), in two setups (``"tuned"``, ``"reference"``). It scores a whole
trajectory in **one** forward pass of its last observation (the observation of step ``t`` is a prefix of
it), decodes rollouts with a key / value cache, and has a seed-stacked forward for
:mod:`tpo_gym.agents.common.seed_batch` (with the stacked LayerNorm / embedding primitives defined here). Its
default optimiser is :class:`~tpo_gym.agents.policies.optimizers.MuonAdamW`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from gymnasium import spaces
from stable_baselines3.common.type_aliases import Schedule
from torch import nn

from tpo_gym.agents.policies.categorical import SETUPS, CategoricalPolicy, stacked_linear
from tpo_gym.agents.policies.optimizers import MuonAdamW

__all__ = ["TransformerPolicy"]


# --------------------------------------------------------------------------------------------
# seed-stacked primitives of the transformer (stacked_linear, shared with the MLP, is in tpo_gym.agents.policies)
# --------------------------------------------------------------------------------------------
def stacked_layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm of ``x`` ``[S, M, d]`` with per-seed affine ``weight`` / ``bias`` ``[S, d]``."""
    y = F.layer_norm(x, (x.shape[-1],), None, None, eps)
    return torch.addcmul(bias.unsqueeze(1), y, weight.unsqueeze(1))


def stacked_embedding(tokens: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rows ``table[s, tokens[s]]``: ``tokens`` ``[S, ...]``, ``table`` ``[S, V, d]`` -> ``[S, ..., d]``.

    One ``F.embedding`` over the seeds' tables laid end to end (token ``v`` of seed ``s`` is row
    ``s V + v``), so the backward is the embedding's dense scatter, not an indexing one.
    """
    s, v, d = table.shape
    offsets = (torch.arange(s, device=tokens.device) * v).reshape(s, *([1] * (tokens.ndim - 1)))
    return F.embedding(tokens + offsets, table.reshape(s * v, d))


# --------------------------------------------------------------------------------------------
# causal transformer
# --------------------------------------------------------------------------------------------
class _Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(ln(x))``, ``x + ffn(ln(x))``; causal, no dropout.

    ``setup="tuned"``: one fused ``qkv`` projection, LayerNorm eps 1e-5, exact GELU (PyTorch defaults).
    ``setup="reference"`` (docs/method.md section 4b): separate ``q`` / ``k`` / ``v`` / ``proj``
    projections with biases, LayerNorm eps 1e-6, GELU with the tanh approximation (Flax's ``nn.gelu``).
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, setup: str = "tuned") -> None:
        super().__init__()
        self.n_heads = n_heads
        self.reference = setup == "reference"
        eps = 1e-6 if self.reference else 1e-5
        self.ln1 = nn.LayerNorm(d_model, eps=eps)
        if self.reference:
            self.q, self.k, self.v = (nn.Linear(d_model, d_model) for _ in range(3))
        else:
            self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model, eps=eps)
        self.ff1 = nn.Linear(d_model, d_ff)
        self.ff2 = nn.Linear(d_ff, d_model)
        self._gelu = "tanh" if self.reference else "none"

    def _qkv(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.reference:
            return self.q(h), self.k(h), self.v(h)
        q, k, v = self.qkv(h).split(h.shape[-1], dim=-1)
        return q, k, v

    def forward(self, x: torch.Tensor, cache: list[torch.Tensor] | None = None) -> torch.Tensor:
        """Apply the block to ``x`` ``[N, L, d]``.

        With ``cache`` (a list, empty on the first call) the keys / values of earlier calls are
        reused and this call's are appended: incremental decoding, one new position at a time after
        the first (causal) chunk.
        """
        n, length, d = x.shape
        q, k, v = self._qkv(self.ln1(x))
        shape = (n, length, self.n_heads, d // self.n_heads)
        q, k, v = (z.reshape(shape).transpose(1, 2) for z in (q, k, v))
        causal = True
        if cache is not None:
            if cache:
                k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
                causal = length > 1
                if causal:
                    raise ValueError("incremental decoding takes one new position per call after the first")
            cache[:] = [k, v]
        att = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        x = x + self.proj(att.transpose(1, 2).reshape(n, length, d))
        return x + self.ff2(F.gelu(self.ff1(self.ln2(x)), approximate=self._gelu))

    def forward_after(self, x: torch.Tensor, prefix: list[torch.Tensor], repeat: int) -> torch.Tensor:
        """Apply the block to ``x`` ``[N, L, d]``, positions that follow a shared prefix: ``prefix`` is the
        ``[k, v]`` cache of a causal :meth:`forward` on ``N / repeat`` prefixes, row ``i`` of ``x`` following
        prefix ``i // repeat``. Each position attends to its whole prefix and causally within ``x``: the same
        result as :meth:`forward` on the concatenated sequences, without recomputing a prefix per row."""
        n, length, d = x.shape
        q, k, v = self._qkv(self.ln1(x))
        shape = (n, length, self.n_heads, d // self.n_heads)
        q, k, v = (z.reshape(shape).transpose(1, 2) for z in (q, k, v))
        width = prefix[0].shape[2]
        k = torch.cat([prefix[0].repeat_interleave(repeat, dim=0), k], dim=2)
        v = torch.cat([prefix[1].repeat_interleave(repeat, dim=0), v], dim=2)
        visible = torch.ones(length, width + length, dtype=torch.bool, device=x.device).tril(diagonal=width)
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=visible)
        x = x + self.proj(att.transpose(1, 2).reshape(n, length, d))
        return x + self.ff2(F.gelu(self.ff1(self.ln2(x)), approximate=self._gelu))

    def stacked_forward(self, p: dict[str, torch.Tensor], x: torch.Tensor, length: int,
                        cache: list[torch.Tensor] | None = None) -> torch.Tensor:
        """:meth:`forward` of S blocks: ``p`` this block's parameters stacked ``[S, ...]`` (names
        relative to the block), ``x`` ``[S, N * length, d]``; attention runs on the ``S N`` sequences at once.
        ``cache`` as in :meth:`forward` (incremental decoding of all S N sequences)."""
        s, m, d = x.shape
        n = m // length
        h = stacked_layer_norm(x, p["ln1.weight"], p["ln1.bias"], self.ln1.eps)
        if self.reference:
            q, k, v = (stacked_linear(h, p[f"{z}.weight"], p[f"{z}.bias"]) for z in ("q", "k", "v"))
        else:
            q, k, v = stacked_linear(h, p["qkv.weight"], p["qkv.bias"]).split(d, dim=-1)
        shape = (s * n, length, self.n_heads, d // self.n_heads)
        q, k, v = (z.reshape(shape).transpose(1, 2) for z in (q, k, v))
        causal = True
        if cache is not None:
            if cache:
                if length > 1:
                    raise ValueError("incremental decoding takes one new position per call after the first")
                k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
                causal = False
            cache[:] = [k, v]
        att = F.scaled_dot_product_attention(q, k, v, is_causal=causal).transpose(1, 2).reshape(s, m, d)
        x = x + stacked_linear(att, p["proj.weight"], p["proj.bias"])
        h = stacked_layer_norm(x, p["ln2.weight"], p["ln2.bias"], self.ln2.eps)
        h = F.gelu(stacked_linear(h, p["ff1.weight"], p["ff1.bias"]), approximate=self._gelu)
        return x + stacked_linear(h, p["ff2.weight"], p["ff2.bias"])


class TransformerPolicy(CategoricalPolicy):
    """The causal transformer of the token tasks (docs/method.md section 4).

    Input: the observation ``[prompt (H tokens); actions so far (H slots, padding = V)]`` of a
    ``MultiDiscrete([V + 1] * 2H)`` space. Token embedding (vocabulary ``V + 1``, the padding token
    included) plus learned position embedding, ``n_layers`` pre-norm blocks (causal multi-head
    attention, FFN with GELU), a final LayerNorm and a linear head to ``V`` logits. No dropout. The
    logits of the ``t``-th action are read at position ``H - 1 + t`` (the last written token), so a
    whole trajectory is scored by one forward pass of its last observation.

    Two setups, selected by name (``policy_kwargs={"setup": ...}``):

    * ``"tuned"`` (default, this project's PyTorch port): 2 layers, ``d_model`` 64, 4 heads, FFN 256
      (about 100k parameters for V = 2, H = 10); a fused q/k/v projection; optimiser
      :class:`MuonAdamW` (``torch.optim.Muon`` on 2-D weights, AdamW on biases / LayerNorms);
      PyTorch's default initialisation for ``Linear`` / ``LayerNorm``, embeddings ``N(0, 1)``.
    * ``"reference"``: the reference code's setup (docs/method.md section 4b): 2 heads, separate
      q / k / v / output projections with biases, LayerNorm eps 1e-6, GELU (tanh approximation),
      Flax's default initialisation (token embedding ``N(0, 1/d)``, position embedding
      ``N(0, 0.02^2)``, every ``Linear`` LeCun normal, biases 0) and the optimiser
      :class:`~tpo_gym.agents.policies.reference_setup.ReferenceMuon` (``optax.contrib.muon``: Muon on the
      embeddings, the FFN and head kernels and the per-head q / k / v biases, Nesterov Adam on the
      rest). Use it with ``learning_rate=1e-3`` (the reference's).

    :param observation_space: ``MultiDiscrete([V + 1] * 2H)``.
    :param action_space: ``Discrete(V)``.
    :param lr_schedule: learning-rate schedule.
    :param d_model: model width.
    :param n_layers: number of blocks.
    :param n_heads: attention heads (must divide ``d_model``; default 4, or 2 with ``setup="reference"``).
    :param d_ff: FFN hidden width.
    :param muon_on_embeddings: with the default optimiser, also apply Muon to the embeddings and the
        head (default, as optax's muon); ``False`` moves them to AdamW.
    :param optimizer_class: optimiser class (default :class:`MuonAdamW`, or ``ReferenceMuon`` with
        ``setup="reference"``).
    :param optimizer_kwargs: extra optimiser keyword arguments.
    :param setup: ``"tuned"`` (default) or ``"reference"`` (see above).
    """

    shares_group_prefix = True

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        lr_schedule: Schedule,
        d_model: int = 64,
        n_layers: int = 2,
        n_heads: int | None = None,
        d_ff: int = 256,
        muon_on_embeddings: bool = True,
        optimizer_class: type[torch.optim.Optimizer] | None = None,
        optimizer_kwargs: dict[str, Any] | None = None,
        setup: str = "tuned",
    ) -> None:
        from tpo_gym._validation import check_choice
        from tpo_gym.agents.policies import reference_setup

        setup = check_choice("setup", setup, SETUPS)
        reference = setup == "reference"
        if n_heads is None:
            n_heads = 2 if reference else 4
        if optimizer_class is None:
            optimizer_class = reference_setup.ReferenceMuon if reference else MuonAdamW
        if not isinstance(action_space, spaces.Discrete):
            raise ValueError(f"TransformerPolicy needs a Discrete(V) action space, got {action_space}")
        vocab = int(action_space.n)
        if (
            not isinstance(observation_space, spaces.MultiDiscrete)
            or observation_space.nvec.ndim != 1
            or observation_space.nvec.shape[0] % 2 != 0
            or not np.all(observation_space.nvec == vocab + 1)
        ):
            raise ValueError(
                "TransformerPolicy needs a token-task observation space MultiDiscrete([V + 1] * 2H) with "
                f"V = action_space.n = {vocab}; got {observation_space}"
            )
        if d_model < 1 or n_layers < 1 or n_heads < 1 or d_ff < 1 or d_model % n_heads != 0:
            raise ValueError(
                f"need d_model, n_layers, n_heads, d_ff >= 1 and n_heads | d_model; got d_model={d_model}, "
                f"n_layers={n_layers}, n_heads={n_heads}, d_ff={d_ff}"
            )
        super().__init__(observation_space, action_space, lr_schedule, optimizer_class, optimizer_kwargs)
        self.vocab_size = vocab
        self.horizon = int(observation_space.nvec.shape[0]) // 2
        self.d_model, self.n_layers, self.n_heads, self.d_ff = d_model, n_layers, n_heads, d_ff
        self.muon_on_embeddings = muon_on_embeddings
        self.setup = setup
        self.tok_emb = nn.Embedding(vocab + 1, d_model)
        self.pos_emb = nn.Embedding(2 * self.horizon, d_model)
        self.blocks = nn.ModuleList([_Block(d_model, n_heads, d_ff, setup) for _ in range(n_layers)])
        self.ln_f = nn.LayerNorm(d_model, eps=1e-6 if reference else 1e-5)
        self.head = nn.Linear(d_model, vocab)
        if reference:
            self._reference_init()
        if optimizer_class is MuonAdamW and not muon_on_embeddings:
            self.optimizer_kwargs = {
                **self.optimizer_kwargs,
                "adamw_params": [self.tok_emb.weight, self.pos_emb.weight, self.head.weight],
            }
        if optimizer_class is reference_setup.ReferenceMuon:
            self.optimizer = optimizer_class(self.reference_param_groups(), lr=lr_schedule(1),
                                             **self.optimizer_kwargs)
        else:
            self._build_optimizer(lr_schedule)
        self.optimizer_kwargs.pop("adamw_params", None)

    def _reference_init(self) -> None:
        """Flax's defaults (docs/method.md section 4b)."""
        from tpo_gym.agents.policies.reference_setup import flax_dense_init_, flax_embedding_normal_

        flax_embedding_normal_(self.tok_emb.weight)
        with torch.no_grad():
            self.pos_emb.weight.normal_(0.0, 0.02)
        flax_dense_init_(self)

    def reference_param_groups(self) -> list[dict[str, Any]]:
        """The reference optimiser's split: which parameters are 2-D in Flax's layout (Muon) and how.

        Muon: the token and position embeddings (the token table as the reference's ``V``-row table,
        ``"embedding:V"``, under ``setup="reference"``), the FFN and head kernels (``"dense"``), and the
        q / k / v biases, ``[heads, d/heads]`` in Flax (``"heads:H"``); with the fused projection of
        ``setup="tuned"`` the ``qkv`` weight counts as one dense kernel. Nesterov Adam: the q / k / v /
        output kernels (3-D in Flax), the other biases and the LayerNorms.
        """
        # setup="reference": the token table's Muon step is the reference's V-row table's; the placeholder
        # row (index V) is outside it ("embedding:V"), so the step is scaled sqrt(max(1, d / V)), not d / (V + 1)
        tok_layout = f"embedding:{self.vocab_size}" if self.setup == "reference" else "embedding"
        muon: list[tuple[torch.Tensor, str]] = [(self.tok_emb.weight, tok_layout), (self.pos_emb.weight, "embedding"),
                                                (self.head.weight, "dense")]
        for block in self.blocks:
            muon += [(block.ff1.weight, "dense"), (block.ff2.weight, "dense")]
            if block.reference:
                muon += [(lin.bias, f"heads:{self.n_heads}") for lin in (block.q, block.k, block.v)]
            else:
                muon.append((block.qkv.weight, "dense"))
        chosen = {id(p) for p, _ in muon}
        adam = [p for p in self.parameters() if id(p) not in chosen]
        return [{"params": [p for p, _ in muon], "muon": True, "layouts": [lay for _, lay in muon]},
                {"params": adam, "muon": False}]

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        data.update(
            d_model=self.d_model,
            n_layers=self.n_layers,
            n_heads=self.n_heads,
            d_ff=self.d_ff,
            muon_on_embeddings=self.muon_on_embeddings,
            setup=self.setup,
        )
        return data

    def hidden(self, tokens: torch.Tensor) -> torch.Tensor:
        """Final hidden states ``[N, L, d_model]`` of token sequences ``[N, L]`` (``L <= 2H``)."""
        length = tokens.shape[1]
        x = self.tok_emb(tokens.long()) + self.pos_emb.weight[:length]
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)

    def action_logits(self, obs: torch.Tensor) -> torch.Tensor:
        """Logits ``[N, V]`` of the next token of each observation ``[N, 2H]``."""
        h = self.horizon
        obs = obs.reshape(-1, 2 * h).long()
        written = (obs[:, h:] != self.vocab_size).sum(dim=1).clamp(max=h - 1)
        length = h + int(written.max()) if obs.shape[0] else h
        hid = self.hidden(obs[:, :length])  # causal: later (padding) positions cannot matter
        rows = torch.arange(obs.shape[0], device=obs.device)
        return self.head(hid[rows, h - 1 + written])

    def rollout_decoder(self, lockstep: bool = False) -> Callable[[torch.Tensor], torch.Tensor]:
        """A stateful ``obs -> logits`` function for one rollout, with a key/value cache.

        Call it on the observations of steps 0, 1, 2, ... of one batch of episodes; each call after
        the first processes only the token written since the previous call. If the batch is not in
        lock-step (rows at different steps) or a step is skipped, it falls back to
        :meth:`action_logits`. Same logits as :meth:`action_logits` up to float rounding.
        ``lockstep=True``: the caller promises lock-step, so the step is counted, never read back from
        ``obs`` (no device synchronisation; the on-device rollouts use it).
        """
        caches: list[list[torch.Tensor]] = [[] for _ in self.blocks]
        expected = [0]
        h = self.horizon

        def decode(obs: torch.Tensor) -> torch.Tensor:
            obs = obs.reshape(-1, 2 * h).long()
            if lockstep:
                t = expected[0]
                if not 0 <= t < h:
                    raise ValueError(f"a lockstep rollout of this policy has {h} steps; decode was called again")
            else:
                written = (obs[:, h:] != self.vocab_size).sum(dim=1)
                t = int(written[0]) if obs.shape[0] else 0
                if t != expected[0] or t >= h or not bool((written == t).all()):
                    expected[0] = -1  # out of lock-step: no more caching for this rollout
                    return self.action_logits(obs)
            if t == 0:
                x = self.tok_emb(obs[:, :h]) + self.pos_emb.weight[:h]
            else:
                x = self.tok_emb(obs[:, h + t - 1 : h + t]) + self.pos_emb.weight[h + t - 1 : h + t]
            for block, cache in zip(self.blocks, caches, strict=True):
                x = block(x, cache)
            expected[0] = t + 1
            return self.head(self.ln_f(x[:, -1]))

        return decode

    def _stacked_hidden(self, params: dict[str, torch.Tensor], tokens: torch.Tensor, start: int = 0,
                        caches: list[list[torch.Tensor]] | None = None) -> torch.Tensor:
        """Final-LayerNorm hidden states ``[S, N, L, d]`` of S models on ``tokens`` ``[S, N, L]`` at
        positions ``start .. start + L - 1`` (``caches``: one per block, for incremental decoding)."""
        s, n, length = tokens.shape
        pos = params["pos_emb.weight"][:, None, start : start + length]
        x = (stacked_embedding(tokens, params["tok_emb.weight"]) + pos).reshape(s, n * length, self.d_model)
        for i, block in enumerate(self.blocks):
            prefix = f"blocks.{i}."
            x = block.stacked_forward({k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)},
                                      x, length, None if caches is None else caches[i])
        x = stacked_layer_norm(x, params["ln_f.weight"], params["ln_f.bias"], self.ln_f.eps)
        return x.reshape(s, n, length, self.d_model)

    def stacked_step_logits(self, params: dict[str, torch.Tensor], obs: torch.Tensor) -> torch.Tensor:
        """Seed-stacked :meth:`step_logits` (see :meth:`CategoricalPolicy.stacked_step_logits`)."""
        h, (s, n, t) = self.horizon, obs.shape[:3]
        x = self._stacked_hidden(params, obs[:, :, -1].long()[:, :, : h - 1 + t])
        x = x[:, :, h - 1 : h - 1 + t].reshape(s, n * t, self.d_model)
        return stacked_linear(x, params["head.weight"], params["head.bias"]).reshape(s, n, t, self.vocab_size)

    def stacked_rollout_decoder(self, params: dict[str, torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
        """:meth:`rollout_decoder` of S models at once, for rollouts in lockstep (every row at the same step).

        ``decode(obs)`` with ``obs`` ``[S, N, 2H]`` at steps 0, 1, 2, ... returns logits ``[S, N, V]``;
        a key / value cache per block, and the step index counted here, not read from ``obs`` (no
        device read-back). Same logits as each seed's own :meth:`rollout_decoder` up to float rounding.
        """
        caches: list[list[torch.Tensor]] = [[] for _ in self.blocks]
        step = [0]
        h = self.horizon

        def decode(obs: torch.Tensor) -> torch.Tensor:
            t = step[0]
            if t >= h:
                raise ValueError(f"a rollout of this policy has {h} steps; decode was called a {t + 1}th time")
            obs = obs.long()
            tokens, start = (obs[:, :, :h], 0) if t == 0 else (obs[:, :, h + t - 1 : h + t], h + t - 1)
            x = self._stacked_hidden(params, tokens, start, caches)[:, :, -1]
            step[0] = t + 1
            return stacked_linear(x, params["head.weight"], params["head.bias"])

        return decode

    def step_logits(self, obs: torch.Tensor, group_size: int = 1) -> torch.Tensor:
        """Logits ``[N, T, V]`` of trajectories ``[N, T, 2H]``: one forward of the last observation.

        Valid because the observation of step ``t`` is a prefix of the last one (the tokens written
        later sit at positions that step ``t`` cannot attend to).

        ``group_size`` K > 1: rows ``gK .. gK + K - 1`` are K rollouts of one prompt (a sequence-level group), so
        the prompt's H positions are computed once per group, ``[G, H]``, and the K answers' ``T - 1`` positions
        attend to their group's prompt keys / values (:meth:`_Block.forward_after`): the same logits and
        gradients up to float rounding, with ``G H + G K (T - 1)`` positions instead of ``G K (H + T - 1)``.
        Rows whose prompts are not shared within their group fall back to the plain forward.
        """
        h, t = self.horizon, obs.shape[1]
        last = obs[:, -1].long()
        n = last.shape[0]
        if group_size > 1 and n % group_size == 0 and n:
            prompts = last[::group_size, :h]
            if torch.equal(last[:, :h].reshape(-1, group_size, h), prompts[:, None].expand(-1, group_size, h)):
                return self.head(self._grouped_hidden(prompts, last[:, h : h - 1 + t], group_size))
        hid = self.hidden(last[:, : h - 1 + t])
        return self.head(hid[:, h - 1 : h - 1 + t])

    def _grouped_hidden(self, prompts: torch.Tensor, answers: torch.Tensor, group_size: int) -> torch.Tensor:
        """Final hidden states ``[G K, T, d]`` at positions ``H - 1 .. H + T - 2`` of K answers ``[G K, T - 1]``
        per prompt ``[G, H]``, the prompts computed once (:meth:`step_logits`)."""
        h = self.horizon
        x = self.tok_emb(prompts) + self.pos_emb.weight[:h]
        caches: list[list[torch.Tensor]] = [[] for _ in self.blocks]
        for block, cache in zip(self.blocks, caches, strict=True):
            x = block(x, cache)
        first = self.ln_f(x[:, -1:]).repeat_interleave(group_size, dim=0)
        if answers.shape[1] == 0:
            return first
        y = self.tok_emb(answers) + self.pos_emb.weight[h : h + answers.shape[1]]
        for block, cache in zip(self.blocks, caches, strict=True):
            y = block.forward_after(y, cache, group_size)
        return torch.cat([first, self.ln_f(y)], dim=1)
