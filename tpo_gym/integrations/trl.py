r"""Target Policy Optimization on TRL's engine: :class:`TargetPOTrainer` and :class:`TargetPOConfig`.

TRL's :class:`~trl.GRPOTrainer` brings multi-GPU training (accelerate, DeepSpeed / FSDP), vLLM
generation, PEFT and TRL's logging. :class:`TargetPOTrainer` keeps all of that and replaces GRPO's
advantage and loss by TPO's (docs/method.md section 1), computed by :mod:`tpo_gym.objectives`:

.. math::
    u = \mathrm{standardize}(r), \qquad
    q = \operatorname{softmax}\big(\log p^{old} + u/\eta\big), \qquad
    L = -\frac1G \sum_g \sum_{i=1}^{K} q_{g,i} \log \operatorname{softmax}(\ell^\theta_g)_i

over the K completions of each prompt (a group), with :math:`\ell_i` the completion's sequence
log-prob (sum of its token log-probs at the sampling temperature; the mean with
``length_normalize=True``) and :math:`p^{old} = \operatorname{softmax}(\ell^{old})` within the group.
The names are ``TargetPO*``: ``trl.experimental.tpo`` is a different method (Triple Preference
Optimization).

**Exactness across processes and micro-batches.** TRL lays the K completions of a prompt out
contiguously, but a group may be split across processes and, after TRL's per-process shuffle,
across gradient-accumulation micro-batches. The target is built from rewards and old sequence
log-probs gathered over all processes (z-scores with the population std,
:func:`~tpo_gym.objectives.standardize_scores`; not TRL's Bessel std + 1e-4), and the update takes
one of two exact forms (``TargetPOConfig.target_update``):

* ``"groups"``: every micro-batch holds whole groups (this trainer shuffles groups, not rows) and
  the loss is TPO's cross-entropy to the frozen ``q`` (:func:`~tpo_gym.objectives.tpo_loss`),
  recomputing :math:`p^\theta` at every update, so it is exact for any ``num_iterations`` (TPO's
  ``n_epochs``). Needs ``per_device_train_batch_size % num_generations == 0``. With
  ``num_iterations == 1`` the loss forward itself runs at :math:`\theta_{old}`, so :math:`q` is built
  from it and no separate old-log-prob forward is run (the step costs what GRPO's does).
* ``"weights"``: per completion the weight :math:`w_i = q_i - p^{old}_i`, and the loss
  :math:`-\frac1G\sum_i w_i \ell^\theta_i`; its gradient is TPO's :math:`\frac1G\sum_i (p_i - q_i)\nabla\ell_i`
  exactly while :math:`\theta = \theta_{old}`, that is on the first update after each generation:
  ``num_iterations == 1`` and ``gradient_accumulation_steps % steps_per_generation == 0``. Any
  group layout (groups split across processes and micro-batches).
* ``"auto"`` (default): ``"groups"`` where its condition holds, else ``"weights"``. A configuration
  where the chosen form is not exact raises ``ValueError`` naming the settings.

**KL to a frozen reference** (``beta``, default 0; the paper's GSM8K recipe uses 1e-3 with LoRA
r=32). With ``beta > 0`` the loss is TPO's plus :math:`\beta` times GRPO's per-token k3 estimator
against the reference policy, averaged over each completion's tokens and then over the completions
(:func:`k3_kl`; GRPO's ``loss_type="grpo"`` averaging, whatever ``loss_type`` holds). The reference
is GRPOTrainer's own: a frozen copy of the initial model, or, with a PEFT adapter, the same model
with the adapter disabled (no second copy); ``sync_ref_model`` works as in GRPO. The plain k3
estimator is used (``use_bias_correction_kl`` must stay ``False``, ``TargetPOConfig``'s default).

**Positions.** Every forward this trainer makes (loss, old log-probs, reference) passes
``position_ids = max(cumsum(attention_mask) - 1, 0)`` to models whose ``forward`` takes them, the
positions generation used on left-padded prompts (without them a model with learned absolute
positions, GPT-2, scores every padded row at shifted positions).

Old log-probs come from the trainer's own forward (never vLLM's sampling log-probs), at the
sampling temperature as TRL computes them, and only when TPO needs them (not in ``"groups"`` mode
with ``num_iterations == 1``: there the loss forward builds the target). Text models only (no image
inputs); a Mixture-of-Experts model's router loss is added as GRPOTrainer adds it.

**GRPO options TPO does not use.** A value other than ``TargetPOConfig``'s default raises
``ValueError`` naming the option (:data:`GRPO_OPTIONS_TPO_IGNORES` has the list and why):
``loss_type``, ``scale_rewards``, ``epsilon``, ``epsilon_high``, ``delta``,
``importance_sampling_level``, ``sapo_temperature_neg`` / ``_pos``, ``vespo_k_pos`` / ``_lambda_pos``
/ ``_k_neg`` / ``_lambda_neg``, ``top_entropy_quantile``, ``entropy_coef``, ``use_adaptive_entropy``,
``entropy_coef_min`` / ``_max`` / ``_delta``, ``entropy_target``, ``off_policy_mask_threshold``,
``mask_truncated_completions``, ``multi_objective_aggregation``, ``use_bias_correction_kl``,
``vllm_importance_sampling_correction``, ``vllm_importance_sampling_mode``,
``vllm_importance_sampling_clip_min`` / ``_clip_max`` / ``_cap``. ``TargetPOConfig`` defaults
``use_bias_correction_kl`` and ``vllm_importance_sampling_correction`` to ``False`` (GRPOConfig:
``True``): TPO uses neither, so with vLLM TRL runs no old-log-prob forward for an importance
ratio TPO would ignore.

**Logged** (besides TRL's reward, length and timing metrics):

* ``loss`` / ``eval_loss``: TPO's cross-entropy :math:`-\frac1G\sum_g\sum_i q_{g,i}\log p^\theta_{g,i}`
  (plus :math:`\beta\,\mathrm{KL}`), in both update forms (``"weights"`` takes the gradient of its
  surrogate and reports the cross-entropy at :math:`\theta_{old}`, where it is exact); always >= 0
  with ``beta = 0``.
* ``mean_q_winners`` / ``mean_q_losers``: mean ``q`` of the completions above / below their group's
  mean reward (a log step with no such completion leaves the key out, as ``collapsed_target_fraction``
  does one with no informative group: every logged value is a number, never ``None``);
  ``all_fail_fraction`` / ``any_success_fraction``: groups whose best reward is <= 0 / >= 1 (the native
  loop's diagnostics, same names); ``target/zero_variance_fraction``,
  ``target/entropy_q``, ``target/entropy_p_old``, ``target/max_q``; ``collapsed_target_fraction``
  (:func:`tpo_gym.agents.algorithms.tpo.collapsed_target_fraction`: informative groups whose best completions get
  q <= 0.01; when it is above one half in a training step, a ``UserWarning``, once per trainer, names
  the remedies: ``length_normalize=True``, a larger ``eta``, a shorter ``max_completion_length``);
  ``entropy`` (per token); with ``beta > 0``, ``kl`` (:func:`k3_kl`, the penalised value).
* With ``log_completions=True`` the completions table has TPO's numbers: ``tpo_u`` (the reward
  z-score, population std) and ``tpo_q_minus_p_old`` (target minus old group probability, the
  per-completion weight of the update); TRL's ``advantage`` column (GRPO's z-score) is NaN, since
  TPO has none.

Reasoning Gym for TRL: :func:`reasoning_gym_dataset` builds the prompt dataset and
:func:`reasoning_gym_reward` the reward function (the env's own scorer).
"""

from __future__ import annotations

import inspect
import math
import warnings
from typing import Any

import torch

try:
    import trl
    from trl import GRPOTrainer
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "tpo_gym.integrations.trl needs TRL: pip install 'tpo-gym[llm]' (or pip install trl)"
    ) from exc

from tpo_gym.agents.algorithms.tpo import (
    COLLAPSE_WARN_FRACTION,
    collapse_warning,
    collapsed_target_fraction,
    winner_loser_means,
)
from tpo_gym.agents.common.grouping import group_diagnostics
from tpo_gym.integrations._trl_batches import _entropy, _grouped, _shuffle_groups, k3_kl, mask_positions
from tpo_gym.integrations._trl_config import (
    GRPO_OPTIONS_TPO_IGNORES,
    OVERRIDDEN_TRL_METHODS,
    TARGET_UPDATES,
    TargetPOConfig,
    check_config,
    resolve_target_update,
)
from tpo_gym.integrations._trl_data import reasoning_gym_dataset, reasoning_gym_reward
from tpo_gym.objectives import at_least_float32, standardize_scores, tpo_loss, tpo_target

# in the order of the API reference page (docs/reference/integrations/trl.md)
__all__ = [
    "TARGET_UPDATES",
    "OVERRIDDEN_TRL_METHODS",
    "GRPO_OPTIONS_TPO_IGNORES",
    "k3_kl",
    "mask_positions",
    "TargetPOConfig",
    "check_config",
    "resolve_target_update",
    "TargetPOTrainer",
    "reasoning_gym_dataset",
    "reasoning_gym_reward",
]


class TargetPOTrainer(GRPOTrainer):
    """TPO on TRL's ``GRPOTrainer``: same arguments (``model``, ``reward_funcs``, ``args``,
    ``train_dataset``, ``peft_config``, ...), with ``args`` a :class:`TargetPOConfig`.

    See the module docstring for the objective, the KL term, the exactness rules, the GRPO options
    TPO refuses (:data:`GRPO_OPTIONS_TPO_IGNORES`) and what is logged. It overrides the GRPOTrainer
    methods in :data:`OVERRIDDEN_TRL_METHODS` and no others. Example::

        from tpo_gym.integrations.trl import (TargetPOConfig, TargetPOTrainer, reasoning_gym_dataset,
                                              reasoning_gym_reward)

        train = reasoning_gym_dataset("basic_arithmetic", size=500)
        args = TargetPOConfig(output_dir="out", num_generations=8, per_device_train_batch_size=8)
        trainer = TargetPOTrainer(model="HuggingFaceTB/SmolLM2-135M-Instruct", args=args,
                                  reward_funcs=reasoning_gym_reward("basic_arithmetic", size=500),
                                  train_dataset=train)
        trainer.train()
    """

    _tag_names = ["trl", "tpo-gym", "target-po"]

    def __init__(self, model: Any, reward_funcs: Any, args: TargetPOConfig | None = None, **kwargs: Any) -> None:
        if args is None:
            name = model if isinstance(model, str) else model.config._name_or_path
            args = TargetPOConfig(f"{str(name).split('/')[-1]}-TargetPO")
        if not isinstance(args, TargetPOConfig):
            raise ValueError(f"args must be a TargetPOConfig (GRPOConfig plus eta, anchor, length_normalize, "
                             f"target_update), got {type(args).__name__}")
        check_config(args)  # settings changed after the config was built
        if (args.beta != 0.0 and kwargs.get("peft_config") is None and not isinstance(model, str)
                and not hasattr(model, "peft_config") and not getattr(model.config, "_name_or_path", "")):
            raise ValueError(f"beta={args.beta} needs a frozen reference model, which GRPOTrainer loads from the "
                             "model's path, and this model has none: pass a path or hub id, a model loaded with "
                             "from_pretrained, or a peft_config (the reference is then the adapter-disabled base)")
        self.target_update = resolve_target_update(args)
        # whole groups, one update per generation, no optimiser step between generation and loss: the
        # loss forward runs at theta_old, so q is built from it and no separate old forward is needed
        self._target_in_loss = (self.target_update == "groups" and args.num_iterations == 1
                                and args.gradient_accumulation_steps % args.steps_per_generation == 0)
        self._tpo_rewards: torch.Tensor | None = None
        self._table_start = 0  # where this generation's row 0 sits in the completions table's columns
        super().__init__(model=model, reward_funcs=reward_funcs, args=args, **kwargs)

    # ------------------------------------------------------------------ forwards
    def _get_per_token_logps_and_entropies(self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                                           *args: Any, **kwargs: Any) -> Any:
        """GRPOTrainer's, with ``position_ids`` from the attention mask (:func:`mask_positions`) for models
        that take them: the positions generation used on left-padded prompts."""
        if not self._takes_position_ids(model):
            return super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask, *args, **kwargs)

        def add_positions(module: Any, call_args: Any, call_kwargs: dict[str, Any]) -> Any:
            mask = call_kwargs.get("attention_mask")
            if call_kwargs.get("position_ids") is None and mask is not None:
                call_kwargs["position_ids"] = mask_positions(mask)
            return call_args, call_kwargs

        handle = model.register_forward_pre_hook(add_positions, with_kwargs=True)
        try:
            return super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask, *args, **kwargs)
        finally:
            handle.remove()

    def _takes_position_ids(self, model: Any) -> bool:
        inner = self.accelerator.unwrap_model(model)
        if hasattr(inner, "get_base_model"):  # PEFT
            inner = inner.get_base_model()
        try:
            return "position_ids" in inspect.signature(inner.forward).parameters
        except (TypeError, ValueError):  # pragma: no cover - a forward without a signature
            return False

    # ------------------------------------------------------------------ rollout side
    def _calculate_rewards(self, inputs: Any, prompts: Any, completions: Any, completion_ids_list: Any) -> torch.Tensor:
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._tpo_rewards = rewards  # [N_global, n_funcs], gathered over processes
        return rewards

    def _sequence_logp(self, per_token_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Each completion's sequence log-prob (sum, or mean with ``length_normalize``), float32 or wider."""
        valid = mask.bool()
        per_token_logps = at_least_float32(per_token_logps)
        seq = torch.where(valid, per_token_logps, torch.zeros_like(per_token_logps)).sum(dim=-1)
        if self.args.length_normalize:
            seq = seq / valid.sum(dim=-1).clamp(min=1).to(seq.dtype)
        return seq

    @staticmethod
    def _loss_mask(inputs: dict[str, Any]) -> torch.Tensor:
        mask = inputs["completion_mask"]
        return mask if "tool_mask" not in inputs else mask * inputs["tool_mask"]

    def _old_token_logps(self, output: dict[str, Any]) -> torch.Tensor:
        """The trainer's own token log-probs of the completions at generation time."""
        old = output.get("old_per_token_logps")
        if old is not None:  # TRL computed them (generations reused across steps)
            return old
        from trl.models.utils import disable_gradient_checkpointing

        ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        attention = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        mode = "train" if self.model.training else "eval"
        batch = self.args.per_device_train_batch_size if mode == "train" else self.args.per_device_eval_batch_size
        with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            old, _, _ = self._get_per_token_logps_and_entropies(
                self.model, ids, attention, output["completion_ids"].size(1), batch_size=batch)
        return old

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        check_config(self.args)  # a setting changed since init is refused before it trains anything
        self._tpo_rewards = None
        output = super()._generate_and_score_completions(inputs)
        if "pixel_values" in output:
            raise ValueError("TargetPOTrainer supports text models only (the batch has image inputs)")
        rewards_per_func = self._tpo_rewards
        if rewards_per_func is None:  # pragma: no cover - guards a TRL change
            raise RuntimeError("TargetPOTrainer: TRL did not compute the rewards through _calculate_rewards")
        mode = "train" if self.model.training else "eval"
        k = self.num_generations if mode == "train" else self.num_generations_eval
        device = self.accelerator.device
        n_local = output["completion_ids"].size(0)

        weights = self.reward_weights.to(device=device, dtype=rewards_per_func.dtype)
        scored = ~torch.isnan(rewards_per_func).all(dim=1)
        rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
        if rewards.numel() % k:
            raise RuntimeError(f"TargetPOTrainer: {rewards.numel()} completions are not groups of {k}")
        scores = rewards.view(-1, k)
        valid = scored.view(-1, k)
        mask = None if bool(valid.all()) else valid
        u = standardize_scores(scores, mask)
        start = self.accelerator.process_index * n_local
        rows = slice(start, start + n_local)
        output["target_u"] = u.reshape(-1)[rows].float()
        output["target_valid"] = valid.reshape(-1)[rows]
        output["target_row"] = torch.arange(start, start + n_local, device=device)
        output["target_group"] = output["target_row"] // k
        metrics = self._metrics[mode]
        zero_var = (u == 0).all(dim=-1) if mask is None else ((u == 0) | ~valid).all(dim=-1)
        metrics["target/zero_variance_fraction"].append(zero_var.float().mean().item())
        for name, value in group_diagnostics(scores, mask).items():
            if name != "zero_variance_fraction":  # logged above, under its TRL-path name
                metrics[name].append(float(value))
        self._table_columns(torch.where(valid, u, torch.full_like(u, math.nan)).reshape(-1))
        if mode == "train" and self._target_in_loss:
            return output  # q is built from the loss forward itself (theta is still theta_old there)

        seq_old = self._sequence_logp(self._old_token_logps(output), self._loss_mask(output))
        seq_all = self.accelerator.gather(seq_old)  # process order: the layout of the gathered rewards
        logp = seq_all.view(-1, k).to(u.dtype)
        q, p_old = self._target(logp, u, mask)
        log_p_old = torch.log_softmax(logp if mask is None else logp.masked_fill(~mask, -math.inf), dim=-1)
        cross_entropy = torch.where(q > 0, -q * log_p_old, torch.zeros_like(q))  # per completion, sums to CE
        output["advantages"] = (k * (q - p_old)).reshape(-1)[rows].to(seq_old.dtype)
        output["target_q"] = q.reshape(-1)[rows].to(seq_old.dtype)
        output["target_ce"] = cross_entropy.reshape(-1)[rows].to(seq_old.dtype)
        self._log_target(mode, torch.arange(rewards.numel(), device=device).view(-1, k), q, p_old, u, valid)
        return output

    def _target(self, logp: torch.Tensor, u: torch.Tensor, mask: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """``q`` and ``p_old`` over ``[G, K]`` groups from the old sequence log-probs and the z-scores."""
        q = tpo_target(logp, u, eta=self.args.eta, anchor=self.args.anchor, mask=mask)
        # p_old exactly as tpo_target computes q (u = 0, anchored): w = q - p_old is exactly 0 for an
        # all-equal group with the anchor
        p_old = tpo_target(logp, torch.zeros_like(u), eta=1.0, anchor=True, mask=mask)
        return q, p_old

    def _table_columns(self, u: torch.Tensor) -> None:
        """The completions table's TPO columns for this generation (all processes' rows, in TRL's order):
        ``tpo_u``, ``tpo_q_minus_p_old`` (filled once ``q`` is known) and TRL's ``advantage`` as NaN."""
        if not self.log_completions:
            return
        n = u.numel()
        advantages = self._logs["advantages"]  # GRPO's z-scores, which TPO does not use
        replaced = min(n, len(advantages))
        for _ in range(replaced):
            advantages.pop()
        advantages.extend([math.nan] * replaced)
        self._logs["extra"]["tpo_u"].extend(u.tolist())
        weights = self._logs["extra"]["tpo_q_minus_p_old"]
        weights.extend([math.nan] * n)
        self._table_start = len(weights) - n

    def _log_target(self, mode: str, rows: torch.Tensor, q: torch.Tensor, p_old: torch.Tensor, u: torch.Tensor,
                    valid: torch.Tensor) -> None:
        """Target metrics of ``[G, K]`` groups, and their ``q - p_old`` in the completions table (``rows``:
        the global row of each completion in its generation)."""
        metrics = self._metrics[mode]
        metrics["target/entropy_q"].append(_entropy(q).mean().item())
        metrics["target/entropy_p_old"].append(_entropy(p_old).mean().item())
        metrics["target/max_q"].append(q.max(dim=-1).values.mean().item())
        group_mask = None if bool(valid.all()) else valid.bool()
        winners, losers = winner_loser_means(q, u, group_mask)
        metrics["mean_q_winners"].append(winners.item())
        metrics["mean_q_losers"].append(losers.item())
        # z-scores keep the order and the ties of the scores: the informative groups and their best completions
        collapsed = float(collapsed_target_fraction(q, u, group_mask))
        metrics["collapsed_target_fraction"].append(collapsed)
        if mode == "train" and collapsed > COLLAPSE_WARN_FRACTION and not getattr(self, "_collapse_warned", False):
            self._collapse_warned = True
            settings = {"length_normalize": self.args.length_normalize,
                        "max_completion_length": self.args.max_completion_length, "eta": self.args.eta}
            warnings.warn(collapse_warning(collapsed, settings, "TargetPOConfig(length_normalize=True)",
                                           "max_completion_length"), UserWarning, stacklevel=2)
        if not self.log_completions:
            return
        column = self._logs["extra"]["tpo_q_minus_p_old"]
        difference = torch.where(valid.bool(), q - p_old, torch.full_like(q, math.nan))
        for row, value in zip(rows.reshape(-1).tolist(), difference.reshape(-1).tolist(), strict=True):
            index = self._table_start + int(row)
            if 0 <= index < len(column):
                column[index] = value

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """TRL's ``log``, averaging only numbers: NaN entries (a step with no winners, no losers or no
        informative group) are dropped, and a metric with none left is left out of that log step rather
        than logged as ``None`` (which TensorBoard and JSON loggers refuse)."""
        metrics = self._metrics["train" if self.model.training else "eval"]
        for key in list(metrics):
            numbers = [v for v in metrics[key] if v is not None and not math.isnan(v)]
            if numbers:
                metrics[key] = numbers
            else:
                del metrics[key]
        super().log(logs, start_time)

    def _prepare_inputs(self, generation_batch: Any) -> dict[str, Any]:
        if not self.model.training or self.target_update != "groups":
            return super()._prepare_inputs(generation_batch)
        # as GRPOTrainer, but the shuffle permutes whole groups so that every micro-batch holds whole groups
        from trl.trainer.utils import split_tensor_dict

        every = self.args.steps_per_generation * self.num_iterations
        if self._step % every == 0 or self._buffered_inputs is None:
            batch = self._generate_and_score_completions(generation_batch)
            self._buffered_inputs = split_tensor_dict(_shuffle_groups(batch, self.num_generations),
                                                      self.args.steps_per_generation)
        return self._buffered_inputs[self._step % self.args.steps_per_generation]

    # ------------------------------------------------------------------ loss
    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        mask = self._loss_mask(inputs)
        token_logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(
            model, ids, attention, inputs["completion_ids"].size(1), compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled)
        seq = self._sequence_logp(token_logps, mask)
        mode = "train" if self.model.training else "eval"
        k = self.num_generations
        if mode == "train" and self._target_in_loss:
            logp, u, valid, rows = _grouped(seq, inputs["target_group"], k, inputs["target_u"],
                                            inputs["target_valid"], inputs["target_row"])
            groups_mask = None if bool(valid.all()) else valid
            q, p_old = self._target(logp.detach(), u, groups_mask)
            # every process's groups, for the metrics and the completions table
            stacked = self.accelerator.gather(torch.stack([rows.double(), q.double(), p_old.double(), u.double(),
                                                           valid.double()], dim=-1))
            self._log_target(mode, *stacked.unbind(dim=-1))
            loss = tpo_loss(logp, q, groups_mask)
        elif mode == "train" and self.target_update == "groups":
            logp, q, valid = _grouped(seq, inputs["target_group"], k, inputs["target_q"].to(seq.dtype),
                                      inputs["target_valid"])
            loss = tpo_loss(logp, q, None if bool(valid.all()) else valid)
        else:  # per-completion weights: gradient (p_old - q) / G per completion while theta = theta_old
            k = k if mode == "train" else self.num_generations_eval
            surrogate = -(inputs["advantages"].to(seq.dtype) * seq).mean()
            # its value is not TPO's loss: report the cross-entropy at theta_old (= theta here) instead
            cross_entropy = k * inputs["target_ce"].to(seq.dtype).mean()
            loss = surrogate + (cross_entropy - surrogate).detach()
        if self.beta != 0.0:
            kl = k3_kl(at_least_float32(token_logps), at_least_float32(inputs["ref_per_token_logps"]), mask)
            loss = loss + self.beta * kl
            self._metrics[mode]["kl"].append(self.accelerator.gather(kl.detach()).mean().item())
        if mode == "train":
            loss = loss / self.current_gradient_accumulation_steps
        if self.aux_loss_enabled:  # a Mixture-of-Experts router loss, as GRPOTrainer adds it
            normalizer = self.current_gradient_accumulation_steps if mode == "train" else 1.0
            loss = loss + self.router_aux_loss_coef * aux_loss / normalizer
            self._metrics[mode]["aux_loss"].append(self.accelerator.gather_for_metrics(aux_loss).mean().item())
        tokens = mask.bool()
        totals = self.accelerator.reduce(
            torch.stack([torch.where(tokens, entropies, 0.0).sum(), tokens.sum().float()]).detach(), reduction="sum")
        self._metrics[mode]["entropy"].append((totals[0] / totals[1].clamp(min=1.0)).item())
        return loss


def trl_version() -> str:
    """The installed TRL version."""
    return trl.__version__
