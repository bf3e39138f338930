"""The settings of :class:`~tpo_gym.integrations.trl.TargetPOTrainer`: :class:`TargetPOConfig`, their one check
(:func:`check_config`), the GRPO options TPO refuses and the exact update form a configuration allows
(:func:`resolve_target_update`). Re-exported by :mod:`tpo_gym.integrations.trl`."""

from __future__ import annotations

import dataclasses
from typing import Any

from trl import GRPOConfig

from tpo_gym._validation import check_bool, check_choice, check_float, check_int

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


@dataclasses.dataclass
class TargetPOConfig(GRPOConfig):
    r"""Configuration of :class:`~tpo_gym.integrations.trl.TargetPOTrainer`: TRL's ``GRPOConfig`` plus TPO's settings.

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
        reference model is built). :func:`~tpo_gym.integrations.trl.k3_kl`.
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
    ``__post_init__`` and :class:`~tpo_gym.integrations.trl.TargetPOTrainer` (at init and before each generation)
    call it, so a setting changed after the config was built is checked as well.
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

