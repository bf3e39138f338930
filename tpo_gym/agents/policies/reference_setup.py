r"""The reference code's model and optimiser setup (docs/method.md section 4b), in PyTorch.

The TPO paper's numbers come from a JAX / Flax reference implementation whose defaults differ from a
natural PyTorch port in ways that change the baselines' results. This module holds what
``TransformerPolicy(setup="reference")`` needs:

* :class:`ReferenceMuon`: ``optax.contrib.muon`` semantics. Parameters that are 2-D **in Flax's
  layout** get Muon: bias-corrected Nesterov momentum, Frobenius normalisation, quintic
  Newton-Schulz, the update scaled by :math:`\sqrt{\max(1, n_{out}/n_{in})}` of the ``(in, out)``
  matrix; every other parameter gets Adam with Nesterov momentum (optax's ``adamw(nesterov=True)``,
  no weight decay). Each Muon parameter carries a *layout* mapping its torch tensor to the 2-D Flax
  matrix: ``"dense"`` (a ``Linear`` weight ``[out, in]``: Flax's kernel is its transpose),
  ``"embedding"`` (``[vocab, d]`` in both), ``"embedding:N"`` (a ``[vocab, d]`` table whose Flax
  counterpart is its first ``N`` rows: tpo-gym's token table has one more row than the reference's, the
  placeholder of not-yet-written positions, which the causal model never reads, so its gradient is 0;
  the Muon step, its momentum and its scale are those of the ``[N, d]`` table and the rows past ``N``
  are left as they are), ``"heads:H"`` (a 1-D ``[d]`` attention bias that Flax stores as ``[H, d/H]``).
* :func:`lecun_normal_`, :func:`flax_embedding_normal_`: Flax's default initialisers.

The Muon step for a parameter with gradient :math:`G` (in the Flax layout), step count :math:`t`:

.. math::
    \mu_t = \beta\mu_{t-1} + (1-\beta)G, \qquad
    \hat\mu = \beta\frac{\mu_t}{1-\beta^{t+1}} + (1-\beta)\frac{G}{1-\beta^{t}} \quad(\text{Nesterov}),

    X_0 = \frac{\hat\mu}{\lVert\hat\mu\rVert_F + \epsilon}, \qquad
    X_{j+1} = aX_j + (bA_j + cA_j^2)X_j,\ A_j = X_jX_j^\top
    \quad(\text{on the wide orientation}),

    \theta \leftarrow \theta - \mathrm{lr}\,\sqrt{\max(1, n_{out}/n_{in})}\;X_5

with :math:`(a, b, c) = (3.4445, -4.7750, 2.0315)`, :math:`\beta = 0.95`, :math:`\epsilon = 10^{-8}`.
The Adam step (optax's Nesterov form):
:math:`m_t = \beta_1 m + (1-\beta_1)g`, :math:`v_t = \beta_2 v + (1-\beta_2)g^2`,
:math:`\hat m = \beta_1 m_t/(1-\beta_1^{t+1}) + (1-\beta_1)g/(1-\beta_1^t)`,
:math:`\hat v = v_t/(1-\beta_2^t)`, :math:`\theta \leftarrow \theta - \mathrm{lr}\,\hat m/(\sqrt{\hat v}+\epsilon)`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["ReferenceMuon", "newton_schulz", "lecun_normal_", "flax_dense_init_", "flax_embedding_normal_",
           "LAYOUTS"]

NS_COEFFS = (3.4445, -4.7750, 2.0315)
#: Layout names of Muon parameters (``"heads:H"`` with an integer H).
LAYOUTS = ("dense", "embedding", "embedding:N", "heads:H")
#: ``jax.nn.initializers.truncated_normal``'s std correction for a standard normal truncated to [-2, 2].
_TRUNC_STD = 0.87962566103423978


def lecun_normal_(weight: torch.Tensor, fan_in: int | None = None) -> torch.Tensor:
    """Flax's ``lecun_normal``: truncated normal on [-2s, 2s], variance ``1 / fan_in`` after truncation.

    ``fan_in`` defaults to a ``Linear`` weight's input size (``weight.shape[1]``).
    """
    fan_in = int(weight.shape[1]) if fan_in is None else int(fan_in)
    std = math.sqrt(1.0 / fan_in) / _TRUNC_STD
    with torch.no_grad():
        return torch.nn.init.trunc_normal_(weight, mean=0.0, std=std, a=-2.0 * std, b=2.0 * std)


def flax_dense_init_(module: torch.nn.Module) -> None:
    """Flax's ``nn.Dense`` defaults on every ``Linear`` of ``module``: LeCun-normal weights, zero biases."""
    for layer in module.modules():
        if isinstance(layer, torch.nn.Linear):
            lecun_normal_(layer.weight)
            if layer.bias is not None:
                torch.nn.init.zeros_(layer.bias)


def flax_embedding_normal_(weight: torch.Tensor) -> torch.Tensor:
    """Flax ``nn.Embed``'s default: normal with variance ``1 / d`` for a ``[vocab, d]`` table."""
    with torch.no_grad():
        return weight.normal_(0.0, 1.0 / math.sqrt(weight.shape[1]))


def newton_schulz(x: torch.Tensor, steps: int = 5, coeffs: tuple[float, float, float] = NS_COEFFS,
                  eps: float = 1e-8) -> torch.Tensor:
    """optax's ``orthogonalize_via_newton_schulz`` of a matrix: Frobenius-normalise, then quintic iterations
    on the wide orientation (transposed when it has more rows than columns), transposed back. A 3-D ``x``
    is S matrices (a seed-stacked batch), each orthogonalised on its own."""
    if x.ndim not in (2, 3):
        raise ValueError(f"newton_schulz needs a matrix (or [S, A, B] matrices), got shape {tuple(x.shape)}")
    transposed = x.shape[-2] > x.shape[-1]
    if transposed:
        x = x.mT
    x = x / (torch.linalg.matrix_norm(x, keepdim=x.ndim == 3) + eps)
    a, b, c = coeffs
    for _ in range(steps):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.mT if transposed else x


def _to_flax(t: torch.Tensor, layout: str) -> torch.Tensor:
    """A parameter (or its gradient) in Flax's layout; a leading seed dimension is kept."""
    if layout == "dense":
        return t.mT
    if layout == "embedding":
        return t
    if layout.startswith("embedding:"):
        return t[..., : int(layout.split(":", 1)[1]), :]
    heads = int(layout.split(":", 1)[1])
    return t.reshape(*t.shape[:-1], heads, -1)


def _from_flax(m: torch.Tensor, layout: str, like: torch.Tensor) -> torch.Tensor:
    if layout == "dense":
        return m.mT
    if layout.startswith("embedding:"):  # the rows past N (the placeholder) get no step
        full = torch.zeros_like(like)
        full[..., : m.shape[-2], :] = m
        return full
    return m.reshape(like.shape)


def _check_layout(layout: Any, p: torch.Tensor, stacked: bool = False) -> str:
    ndim = p.ndim - int(stacked)
    ok = layout in ("dense", "embedding") and ndim == 2
    if isinstance(layout, str) and layout.startswith("heads:") and ndim == 1:
        tail = layout.split(":", 1)[1]
        ok = tail.isdigit() and int(tail) >= 1 and p.shape[-1] % int(tail) == 0
    if isinstance(layout, str) and layout.startswith("embedding:") and ndim == 2:
        tail = layout.split(":", 1)[1]
        ok = tail.isdigit() and 1 <= int(tail) <= p.shape[-2]
    if not ok:
        raise ValueError(f"Muon layout {layout!r} does not fit a parameter of shape {tuple(p.shape)}; allowed: "
                         f"'dense' / 'embedding' for 2-D tensors, 'embedding:N' for a 2-D tensor of at least N "
                         f"rows, 'heads:H' for a 1-D tensor of a multiple of H")
    return layout


def _corrected_momentum(m: torch.Tensor, g: torch.Tensor, beta: float, t: int, nesterov: bool) -> torch.Tensor:
    """optax's bias-corrected momentum at step ``t``: Nesterov ``beta m/(1-beta^(t+1)) + (1-beta) g/(1-beta^t)``,
    else ``m / (1 - beta^t)``."""
    if nesterov:
        return beta * m / (1.0 - beta ** (t + 1)) + (1.0 - beta) * g / (1.0 - beta ** t)
    return m / (1.0 - beta ** t)


class ReferenceMuon(torch.optim.Optimizer):
    """``optax.contrib.muon`` in PyTorch (module docstring): Muon on Flax-2-D parameters, Nesterov Adam on the rest.

    :param params: parameter groups, each ``{"params": [...], "muon": bool, "layouts": [...]}``
        (``layouts`` aligned with ``params``, Muon groups only; ``"stacked": True`` for seed-stacked
        parameters ``[S, *shape]``, each seed updated on its own, as :mod:`tpo_gym.agents.common.seed_batch`
        uses), or a plain iterable of tensors (2-D tensors then get Muon with the ``"dense"`` layout,
        the others Adam).
    :param lr: learning rate of both parts (default 1e-3, the reference's).
    :param beta: Muon momentum (0.95).
    :param ns_steps: Newton-Schulz iterations (5).
    :param eps: Muon's Frobenius-norm epsilon and Adam's epsilon (1e-8, as optax passes it to both).
    :param adam_betas: Adam's (b1, b2) (0.9, 0.999).
    :param nesterov: Nesterov momentum in both parts (default, as optax).
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, beta: float = 0.95, ns_steps: int = 5,
                 eps: float = 1e-8, adam_betas: tuple[float, float] = (0.9, 0.999), nesterov: bool = True) -> None:
        items = list(params)
        if not items:
            raise ValueError("ReferenceMuon expects a non-empty iterable of parameters or parameter groups")
        if not all(isinstance(g, dict) for g in items):
            if any(isinstance(g, dict) for g in items):
                raise ValueError("pass either parameter tensors or parameter groups, not a mix")
            muon = [p for p in items if p.ndim == 2]
            adam = [p for p in items if p.ndim != 2]
            items = [g for g in ({"params": muon, "muon": True, "layouts": ["dense"] * len(muon)},
                                 {"params": adam, "muon": False}) if g["params"]]
        for g in items:
            g.setdefault("muon", False)
            if g["muon"]:
                layouts = list(g.get("layouts", ["dense"] * len(g["params"])))
                if len(layouts) != len(g["params"]):
                    raise ValueError("a Muon group needs one layout per parameter")
                g["layouts"] = [_check_layout(lay, p, bool(g.get("stacked"))) for lay, p in
                                zip(layouts, g["params"], strict=True)]
        if not 0.0 <= beta < 1.0 or not all(0.0 <= b < 1.0 for b in adam_betas):
            raise ValueError(f"momenta must be in [0, 1), got beta={beta}, adam_betas={adam_betas}")
        if ns_steps < 1 or eps < 0 or lr < 0:
            raise ValueError(f"need ns_steps >= 1, eps >= 0, lr >= 0; got {ns_steps}, {eps}, {lr}")
        super().__init__(items, {"lr": lr, "beta": beta, "ns_steps": ns_steps, "eps": eps,
                                 "adam_betas": tuple(adam_betas), "nesterov": nesterov})

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's ``load_state_dict``, keeping this optimiser's layouts: they describe the parameters (how
        the model maps to the reference's Flax matrices), not a setting of the saved run."""
        layouts = [g.get("layouts") for g in self.param_groups]
        super().load_state_dict(state_dict)
        for group, layout in zip(self.param_groups, layouts, strict=True):
            if layout is not None:
                group["layouts"] = layout

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        """One step of every parameter with a gradient (closures are not supported)."""
        if closure is not None:
            raise ValueError("ReferenceMuon.step does not support closures")
        for group in self.param_groups:
            if group["muon"]:
                for p, layout in zip(group["params"], group["layouts"], strict=True):
                    if p.grad is not None:
                        self._muon_step(p, layout, group)
            else:
                for p in group["params"]:
                    if p.grad is not None:
                        self._adam_step(p, group)

    def _muon_step(self, p: torch.Tensor, layout: str, group: dict[str, Any]) -> None:
        beta, eps = group["beta"], group["eps"]
        g = _to_flax(p.grad, layout)
        state = self.state[p]
        if not state:
            state["step"] = 0
            state["momentum"] = torch.zeros_like(g)
        elif state["momentum"].shape != g.shape:
            # a state saved before the token table's "embedding:V" layout holds the momentum of all V + 1 rows
            rows = g.shape[-2]
            if not (layout.startswith("embedding:") and state["momentum"].shape[-2] > rows):
                raise ValueError(f"ReferenceMuon: the saved momentum of a parameter of layout {layout!r} has shape "
                                 f"{tuple(state['momentum'].shape)}, its Muon matrix {tuple(g.shape)}")
            state["momentum"] = state["momentum"][..., :rows, :].clone()
        mu = state["momentum"]
        mu.mul_(beta).add_(g, alpha=1.0 - beta)
        state["step"] += 1
        t = state["step"]
        mu_hat = _corrected_momentum(mu, g, beta, t, group["nesterov"])
        update = newton_schulz(mu_hat, group["ns_steps"], NS_COEFFS, eps)
        update = update * math.sqrt(max(1.0, update.shape[-1] / update.shape[-2]))
        p.add_(_from_flax(update, layout, p), alpha=-group["lr"])

    def _adam_step(self, p: torch.Tensor, group: dict[str, Any]) -> None:
        b1, b2 = group["adam_betas"]
        g = p.grad
        state = self.state[p]
        if not state:
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(p)
            state["exp_avg_sq"] = torch.zeros_like(p)
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m.mul_(b1).add_(g, alpha=1.0 - b1)
        v.mul_(b2).addcmul_(g, g, value=1.0 - b2)
        state["step"] += 1
        t = state["step"]
        m_hat = _corrected_momentum(m, g, b1, t, group["nesterov"])
        v_hat = v / (1.0 - b2 ** t)
        p.addcdiv_(m_hat, v_hat.sqrt().add_(group["eps"]), value=-group["lr"])
