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
  (:func:`tpo_gym.agents.tpo.collapsed_target_fraction`: informative groups whose best completions get
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

import dataclasses
import inspect
import json
import math
import warnings
from collections.abc import Callable
from typing import Any

import torch

try:
    import trl
    from trl import GRPOConfig, GRPOTrainer
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "tpo_gym.integrations.trl needs TRL: pip install 'tpo-gym[llm]' (or pip install trl)"
    ) from exc

from tpo_gym._validation import check_bool, check_choice, check_float, check_int
from tpo_gym.agents.grouping import group_diagnostics
from tpo_gym.agents.tpo import (
    COLLAPSE_WARN_FRACTION,
    collapse_warning,
    collapsed_target_fraction,
    winner_loser_means,
)
from tpo_gym.objectives import at_least_float32, kl_penalty, standardize_scores, tpo_loss, tpo_target

__all__ = [
    "TargetPOConfig",
    "TargetPOTrainer",
    "check_config",
    "reasoning_gym_dataset",
    "reasoning_gym_reward",
    "k3_kl",
    "mask_positions",
    "GRPO_OPTIONS_TPO_IGNORES",
    "OVERRIDDEN_TRL_METHODS",
    "TARGET_UPDATES",
]

TARGET_UPDATES = ("auto", "groups", "weights")

#: The ``trl.GRPOTrainer`` methods (private TRL API) this trainer overrides, each with the parameter
#: names of the TRL version it was written against (TRL 1.16); the test suite fails naming any method
#: whose signature changes. Keep this short: every GRPO rewrite is a chance to break an override.
OVERRIDDEN_TRL_METHODS: dict[str, tuple[str, ...]] = {
    "_generate_and_score_completions": ("self", "inputs"),
    "_calculate_rewards": ("self", "inputs", "prompts", "completions", "completion_ids_list"),
    "_prepare_inputs": ("self", "generation_batch"),
    "_compute_loss": ("self", "model", "inputs"),
    "log": ("self", "logs", "start_time"),
    "_get_per_token_logps_and_entropies": (
        "self", "model", "input_ids", "attention_mask", "logits_to_keep", "batch_size", "compute_entropy",
        "compute_aux_loss", "pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes",
        "num_tiles", "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids"),
}

_NO_IS = "TPO's target uses the trainer's own log-probs: it has no vLLM importance-sampling correction"
_NO_ENTROPY = "TPO's loss has no entropy bonus"
#: GRPOConfig options TPO's loss does not use, and why: any value but ``TargetPOConfig``'s default is a
#: ``ValueError`` naming the option (nothing is silently ignored).
GRPO_OPTIONS_TPO_IGNORES: dict[str, str] = {
    "loss_type": "TPO's loss is its cross-entropy to the target, not one of GRPO's loss variants",
    "scale_rewards": "TPO z-scores the rewards within each group (population std)",
    "epsilon": "TPO has no ratio clipping",
    "epsilon_high": "TPO has no ratio clipping",
    "delta": "TPO has no ratio clipping",
    "importance_sampling_level": "TPO's loss has no importance ratio",
    "sapo_temperature_neg": "SAPO's loss only",
    "sapo_temperature_pos": "SAPO's loss only",
    "vespo_k_pos": "VESPO's loss only",
    "vespo_lambda_pos": "VESPO's loss only",
    "vespo_k_neg": "VESPO's loss only",
    "vespo_lambda_neg": "VESPO's loss only",
    "top_entropy_quantile": "TPO trains on every completion token",
    "entropy_coef": _NO_ENTROPY,
    "use_adaptive_entropy": _NO_ENTROPY,
    "entropy_coef_min": _NO_ENTROPY,
    "entropy_coef_max": _NO_ENTROPY,
    "entropy_coef_delta": _NO_ENTROPY,
    "entropy_target": _NO_ENTROPY,
    "off_policy_mask_threshold": "TPO has no off-policy mask",
    "mask_truncated_completions": "truncated completions are scored candidates of their group",
    "multi_objective_aggregation": "TPO standardises the weighted sum of the rewards ('sum_then_normalize')",
    "use_bias_correction_kl": "TPO's KL term is the plain k3 estimator",
    "vllm_importance_sampling_correction": _NO_IS,
    "vllm_importance_sampling_mode": _NO_IS,
    "vllm_importance_sampling_clip_min": _NO_IS,
    "vllm_importance_sampling_clip_max": _NO_IS,
    "vllm_importance_sampling_cap": _NO_IS,
}


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    r"""GRPO's k3 estimate of :math:`\mathrm{KL}(\pi_\theta \,\|\, \pi_{ref})`, per token, averaged per completion.

    .. math::
        k_{i,t} = e^{\log\pi_{ref}(o_{i,t}) - \log\pi_\theta(o_{i,t})}
                  - \big(\log\pi_{ref}(o_{i,t}) - \log\pi_\theta(o_{i,t})\big) - 1 \;\ge 0, \qquad
        \mathrm{KL} = \frac1N \sum_{i=1}^{N} \frac{\sum_t m_{i,t}\, k_{i,t}}{\max(1, \sum_t m_{i,t})}

    over the N completions (rows) and their valid tokens (``mask``), GRPO's ``loss_type="grpo"``
    averaging; the gradient per token is :math:`(1 - e^{\log\pi_{ref} - \log\pi_\theta})\,\nabla\log\pi_\theta`.
    Masked tokens are ignored whatever they hold.

    :param logp: ``[N, T]`` token log-probs under the policy (with gradient).
    :param ref_logp: ``[N, T]`` token log-probs under the frozen reference.
    :param mask: ``[N, T]`` valid tokens (bool or 0/1).
    :return: a 0-d tensor.
    """
    return kl_penalty(logp, ref_logp, mask.bool())  # the one implementation, shared with the native loop


def mask_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    r"""Position ids of a padded batch from its attention mask: :math:`\max(\mathrm{cumsum}(m) - 1, 0)`.

    The positions generation gives left-padded prompts (each row's first real token is position 0;
    padding gets 0 and is masked anyway).
    """
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)


@dataclasses.dataclass
class TargetPOConfig(GRPOConfig):
    r"""Configuration of :class:`TargetPOTrainer`: TRL's ``GRPOConfig`` plus TPO's settings.

    Generation, batching, optimiser, logging and distributed settings are ``GRPOConfig``'s (for
    example ``num_generations`` = K, ``temperature``, ``max_completion_length``, ``learning_rate``,
    ``num_iterations``, ``use_vllm``). The GRPO loss options TPO does not use
    (:data:`GRPO_OPTIONS_TPO_IGNORES`: ``loss_type``, ``scale_rewards``, ``epsilon*``,
    ``importance_sampling_level``, ...) must keep their defaults (``ValueError`` otherwise). TPO's own:

    :param eta: temperature of the target :math:`q \propto p^{old} e^{u/\eta}`, > 0 (default 1).
    :param anchor: keep the :math:`p^{old}` anchor of the target (default); ``False`` is the no-anchor
        ablation :math:`q = \operatorname{softmax}(u/\eta)`.
    :param length_normalize: the sequence log-prob is the mean of the completion's token log-probs
        instead of their sum (default ``False``, as the paper).
    :param target_update: ``"auto"`` (default), ``"groups"`` or ``"weights"``: how the update stays
        exact across processes and micro-batches (module docstring).
    :param beta: weight of the k3 KL penalty to the frozen reference model, >= 0 (default 0: no
        reference model is built). :func:`k3_kl`.
    """

    eta: float = dataclasses.field(default=1.0, metadata={"help": "TPO target temperature eta > 0."})
    anchor: bool = dataclasses.field(default=True, metadata={"help": "Keep the p_old anchor of the target."})
    length_normalize: bool = dataclasses.field(
        default=False, metadata={"help": "Mean instead of sum of token log-probs as the sequence log-prob."})
    target_update: str = dataclasses.field(
        default="auto", metadata={"help": "'auto', 'groups' (whole groups per micro-batch) or 'weights'."})
    beta: float = dataclasses.field(
        default=0.0, metadata={"help": "Weight of the k3 KL penalty to the frozen reference model (default 0)."})
    use_bias_correction_kl: bool = dataclasses.field(
        default=False, metadata={"help": "Unused by TPO (plain k3 KL); must stay False."})
    vllm_importance_sampling_correction: bool = dataclasses.field(
        default=False, metadata={"help": "Unused by TPO (its target uses the trainer's log-probs); must stay False."})

    def __post_init__(self) -> None:
        check_config(self)  # before GRPOConfig rewrites any option (scale_rewards=True -> "group", ...)
        super().__post_init__()


def check_config(args: Any) -> None:
    """The one check of a :class:`TargetPOConfig`'s TPO settings: ``ValueError`` naming the first bad one and what
    is allowed, else the settings normalised in place.

    ``eta`` a finite number > 0, ``beta`` a finite number >= 0, ``anchor`` / ``length_normalize`` booleans,
    ``target_update`` one of :data:`TARGET_UPDATES`, ``num_generations`` an integer >= 2 (or ``None``, GRPOConfig's
    default), and the GRPO options TPO ignores at their defaults (:data:`GRPO_OPTIONS_TPO_IGNORES`). The config's
    ``__post_init__`` and :class:`TargetPOTrainer` (at init and before each generation) call it, so a setting
    changed after the config was built is checked as well.
    """
    args.eta = check_float("eta", args.eta, minimum=0.0, strict_min=True)
    args.anchor = check_bool("anchor", args.anchor)
    args.length_normalize = check_bool("length_normalize", args.length_normalize)
    args.target_update = check_choice("target_update", args.target_update, TARGET_UPDATES)
    args.beta = check_float("beta", args.beta, minimum=0.0)
    if args.num_generations is not None:
        try:
            args.num_generations = check_int("num_generations", args.num_generations, minimum=2)
        except ValueError as exc:
            raise ValueError(f"{exc} (TPO builds a target over K >= 2 completions of a prompt)") from None
    _check_supported(args)


def resolve_target_update(args: Any) -> str:
    """The exact update form for ``args`` (``"groups"`` or ``"weights"``), or ``ValueError`` why none is."""
    k = int(args.num_generations)
    if k < 2:
        raise ValueError(f"num_generations must be >= 2 for TPO, got {k}")
    per_device = int(args.per_device_train_batch_size)
    accumulation = int(args.gradient_accumulation_steps)
    per_generation = int(args.steps_per_generation)
    iterations = int(args.num_iterations)
    groups_ok = per_device % k == 0
    weights_ok = iterations == 1 and accumulation % per_generation == 0
    groups_why = (f"target_update='groups' needs whole groups in every micro-batch: per_device_train_batch_size "
                  f"({per_device}) must be a multiple of num_generations ({k})")
    weights_why = (f"target_update='weights' is exact only on the first update after each generation: it needs "
                   f"num_iterations == 1 (got {iterations}) and gradient_accumulation_steps ({accumulation}) a "
                   f"multiple of steps_per_generation ({per_generation})")
    mode = args.target_update
    if mode == "groups" and not groups_ok:
        raise ValueError(groups_why)
    if mode == "weights" and not weights_ok:
        raise ValueError(weights_why)
    if mode == "auto":
        if groups_ok:
            return "groups"
        if weights_ok:
            return "weights"
        raise ValueError("no exact TPO update for this configuration: " + groups_why + "; or " + weights_why)
    return mode


def _check_supported(args: Any) -> None:
    """``ValueError`` naming every GRPO option of ``args`` that TPO does not use and that is not at
    ``TargetPOConfig``'s default (it would be silently ignored)."""
    defaults = {f.name: f.default for f in dataclasses.fields(TargetPOConfig) if f.default is not dataclasses.MISSING}
    problems = []
    for name, why in GRPO_OPTIONS_TPO_IGNORES.items():
        value = getattr(args, name, defaults.get(name))
        if name == "scale_rewards":  # GRPOConfig's older spelling: True is "group"
            value = {True: "group", False: "none"}.get(value, value)
        if name in defaults and value != defaults[name]:
            problems.append(f"{name}={value!r} ({why}; leave it at {defaults[name]!r})")
    if problems:
        raise ValueError("TargetPOTrainer does not use these GRPO options: " + "; ".join(problems))


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


def _entropy(p: torch.Tensor) -> torch.Tensor:
    return -(p * torch.log(p.clamp(min=torch.finfo(p.dtype).tiny))).sum(dim=-1)


def _shuffle_groups(batch: dict[str, Any], k: int) -> dict[str, Any]:
    """Permute the rows of ``batch`` by whole groups of ``k`` consecutive rows (TRL's shuffle, per group)."""
    n = len(batch["completion_ids"])
    order = (torch.randperm(n // k).unsqueeze(1) * k + torch.arange(k)).reshape(-1)

    def permute(v: Any) -> Any:
        if v is None or (isinstance(v, torch.Tensor) and v.ndim == 0):
            return v
        if isinstance(v, torch.Tensor):
            return v[order.to(v.device)]
        if isinstance(v, (list, tuple)) and len(v) == n:
            return [v[i] for i in order.tolist()]
        return v

    return {key: permute(value) for key, value in batch.items()}


def _grouped(seq: torch.Tensor, group: torch.Tensor, k: int, *per_row: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``[G, K]`` views of the whole groups of a micro-batch (rows sorted by group): ``seq`` then ``per_row``."""
    order = torch.argsort(group, stable=True)
    ids = group[order]
    if ids.numel() % k or bool((ids.view(-1, k) != ids.view(-1, k)[:, :1]).any()):
        raise RuntimeError("TargetPOTrainer: a micro-batch does not hold whole groups; use target_update='weights'")
    return tuple(x[order].view(-1, k) for x in (seq, *per_row))


# ---------------------------------------------------------------------------------------------
# Reasoning Gym for TRL
# ---------------------------------------------------------------------------------------------
def _reasoning_gym_env(source: Any, size: int, seed: int, config: dict[str, Any]) -> Any:
    """The ``ReasoningGymEnv`` of a dataset name, a ``tpo_gym/ReasoningGym-v0`` env, or the env id."""
    from tpo_gym.envs.reasoning_gym_env import ReasoningGymEnv

    if isinstance(source, str) and source.startswith("tpo_gym/"):
        import gymnasium as gym

        import tpo_gym

        gym.register_envs(tpo_gym)
        if source != "tpo_gym/ReasoningGym-v0":
            raise ValueError(f"source must be a Reasoning Gym dataset name or 'tpo_gym/ReasoningGym-v0', "
                             f"got {source!r}")
        config = dict(config)
        dataset = config.pop("dataset", "graph_color")
        return ReasoningGymEnv(dataset, size=size, seed=seed, **config)
    if isinstance(source, str):
        return ReasoningGymEnv(source, size=size, seed=seed, **config)
    env = getattr(source, "unwrapped", source)
    if isinstance(env, ReasoningGymEnv):
        if config:
            raise ValueError(f"dataset config {sorted(config)} is given by the env itself; pass no config keywords")
        return env
    raise ValueError(f"source must be a Reasoning Gym dataset name, 'tpo_gym/ReasoningGym-v0' or a ReasoningGym "
                     f"env, got {source!r}")


def reasoning_gym_dataset(source: Any = "graph_color", *, size: int = 500, seed: int = 0, tokenizer: Any = None,
                          prompt_format: Any = "env", **config: Any) -> Any:
    """TRL's prompt dataset (a ``datasets.Dataset``) of every entry of a Reasoning Gym dataset.

    Rows: ``prompt``, ``index`` (the entry index, read by :func:`reasoning_gym_reward`), ``question``,
    ``answer`` (text; ``None`` where the dataset has no single answer, as graph_color, whose
    scorer checks the colouring) and ``metadata`` (JSON text). ``prompt`` is the chat messages ``[system, user]`` (TRL
    applies the chat template) with the env's system prompt, or, when the prompt format needs text
    (a prefill, a custom layout), the prompt text built with ``tokenizer``
    (:func:`tpo_gym.agents.prompts.build_prompt`; the model continues it).

    :param source: a Reasoning Gym dataset name (``"basic_arithmetic"``), ``"tpo_gym/ReasoningGym-v0"``
        (with ``dataset=...`` in ``config``) or a ``ReasoningGym`` env.
    :param size: number of entries; ``seed``: the dataset's seed (as the env's arguments).
    :param tokenizer: needed for text prompts (a prompt format with a prefill).
    :param prompt_format: ``"env"``, ``"answer_prefill"``, a dict or a :class:`~tpo_gym.agents.prompts.PromptFormat`.
    :param config: the dataset's own config (``min_terms=2``, ...).
    """
    from datasets import Dataset

    from tpo_gym.agents.prompts import PromptFormat, build_prompt

    env = _reasoning_gym_env(source, size, seed, config)
    fmt = PromptFormat.from_data(prompt_format)
    as_messages = not fmt.prefill and fmt.chat_template and fmt.system in ("env", "none", "custom")
    if not as_messages and tokenizer is None:
        raise ValueError("this prompt_format builds text prompts (a prefill or no chat template): pass tokenizer=")
    rows = []
    for index in range(env.size):
        entry = env.dataset[index]
        question = str(entry["question"])
        if as_messages:
            system = {"env": env.system_prompt, "custom": fmt.system_text, "none": ""}[fmt.system]
            user = question if not fmt.instruction else f"{question}\n\n{fmt.instruction}"
            prompt: Any = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": user}]
        else:
            prompt = build_prompt(tokenizer, question, env.system_prompt, fmt)
        answer = entry.get("answer")
        rows.append({"prompt": prompt, "index": index, "question": question,
                     "answer": None if answer is None else str(answer),
                     "metadata": json.dumps(entry.get("metadata", {}), default=str)})
    return Dataset.from_list(rows)


def reasoning_gym_reward(source: Any = "graph_color", *, size: int = 500, seed: int = 0, prompt_format: Any = "env",
                         **config: Any) -> Callable[..., list[float]]:
    """A TRL reward function scoring completions with the Reasoning Gym dataset's own scorer.

    ``reward(prompts, completions, index, **kwargs) -> list[float]``: for each completion, the
    env's score of entry ``index`` (``extract_answer`` then the dataset's ``score_answer``; the
    prompt format's prefill is prepended and its tag closed, as for tpo-gym's LM policy). Use the same
    ``source`` / ``size`` / ``seed`` / config as :func:`reasoning_gym_dataset`.
    """
    from tpo_gym.agents.prompts import PromptFormat, completion_for_env

    env = _reasoning_gym_env(source, size, seed, config)
    fmt = PromptFormat.from_data(prompt_format)

    def reward(prompts: Any = None, completions: Any = None, index: Any = None, **kwargs: Any) -> list[float]:
        if completions is None or index is None:
            raise ValueError("the Reasoning Gym reward needs the completions and the dataset's 'index' column")
        if len(completions) != len(index):
            raise ValueError(f"{len(completions)} completions but {len(index)} indices")
        out = []
        for completion, i in zip(completions, index, strict=True):
            text = completion[-1]["content"] if isinstance(completion, list) else completion
            env.reset(options={"index": int(i)})
            out.append(float(env.score_candidates([completion_for_env(str(text), fmt)])[0]))
        return out

    reward.__name__ = f"reasoning_gym_{env.dataset_name}"
    return reward


def trl_version() -> str:
    """The installed TRL version."""
    return trl.__version__
