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

Old log-probs come from the trainer's own forward (never vLLM's sampling log-probs), at the
sampling temperature as TRL computes them. With vLLM, TRL's importance-sampling correction of the
GRPO loss is not applied to TPO's loss (the target already uses the trainer's log-probs). Text
models only (no image inputs). Settings of GRPO's loss that TPO does not have (``beta != 0``,
entropy masks and bonuses, off-policy masks, ``mask_truncated_completions``, Liger's fused GRPO
loss, ``multi_objective_aggregation="normalize_then_sum"``) raise ``ValueError``; GRPO's
``loss_type``, ``scale_rewards``, ``epsilon*`` and ``importance_sampling_level`` are not used.

Logged (besides TRL's reward, length and timing metrics): ``target/entropy_q``,
``target/entropy_p_old``, ``target/zero_variance_fraction``, ``target/max_q``, ``entropy``.

Reasoning Gym for TRL: :func:`reasoning_gym_dataset` builds the prompt dataset and
:func:`reasoning_gym_reward` the reward function (the env's own scorer).
"""

from __future__ import annotations

import dataclasses
import json
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

from tpo_gym._validation import check_bool, check_choice, check_float
from tpo_gym.objectives import standardize_scores, tpo_loss, tpo_target

__all__ = [
    "TargetPOConfig",
    "TargetPOTrainer",
    "reasoning_gym_dataset",
    "reasoning_gym_reward",
    "OVERRIDDEN_TRL_METHODS",
    "TARGET_UPDATES",
]

TARGET_UPDATES = ("auto", "groups", "weights")

#: The methods of ``trl.GRPOTrainer`` this trainer overrides or calls (private TRL API); the test
#: suite fails naming any that disappears from the installed TRL.
OVERRIDDEN_TRL_METHODS = (
    "_generate_and_score_completions",
    "_calculate_rewards",
    "_compute_loss",
    "_prepare_inputs",
    "_get_per_token_logps_and_entropies",
)


@dataclasses.dataclass
class TargetPOConfig(GRPOConfig):
    r"""Configuration of :class:`TargetPOTrainer`: TRL's ``GRPOConfig`` plus TPO's settings.

    Generation, batching, optimiser, logging and distributed settings are ``GRPOConfig``'s (for
    example ``num_generations`` = K, ``temperature``, ``max_completion_length``, ``learning_rate``,
    ``num_iterations``, ``use_vllm``). TPO's own:

    :param eta: temperature of the target :math:`q \propto p^{old} e^{u/\eta}`, > 0 (default 1).
    :param anchor: keep the :math:`p^{old}` anchor (default); ``False`` is the no-anchor ablation
        :math:`q = \operatorname{softmax}(u/\eta)`.
    :param length_normalize: the sequence log-prob is the mean of the completion's token log-probs
        instead of their sum (default ``False``, as the paper).
    :param target_update: ``"auto"`` (default), ``"groups"`` or ``"weights"``: how the update stays
        exact across processes and micro-batches (module docstring).
    """

    eta: float = dataclasses.field(default=1.0, metadata={"help": "TPO target temperature eta > 0."})
    anchor: bool = dataclasses.field(default=True, metadata={"help": "Keep the p_old anchor of the target."})
    length_normalize: bool = dataclasses.field(
        default=False, metadata={"help": "Mean instead of sum of token log-probs as the sequence log-prob."})
    target_update: str = dataclasses.field(
        default="auto", metadata={"help": "'auto', 'groups' (whole groups per micro-batch) or 'weights'."})

    def __post_init__(self) -> None:
        self.eta = check_float("eta", self.eta, minimum=0.0, strict_min=True)
        self.anchor = check_bool("anchor", self.anchor)
        self.length_normalize = check_bool("length_normalize", self.length_normalize)
        self.target_update = check_choice("target_update", self.target_update, TARGET_UPDATES)
        if self.num_generations is not None and self.num_generations < 2:
            raise ValueError(
                f"num_generations must be >= 2 for TPO (a target over K >= 2 completions of a prompt), "
                f"got {self.num_generations}"
            )
        super().__post_init__()


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
    """Reject GRPO loss settings that TPO's loss does not have (they would be silently ignored)."""
    problems = []
    if float(args.beta) != 0.0:
        problems.append(f"beta={args.beta} (TargetPOTrainer adds no KL term; set beta=0.0)")
    if float(getattr(args, "top_entropy_quantile", 1.0)) != 1.0:
        problems.append(f"top_entropy_quantile={args.top_entropy_quantile} (must be 1.0)")
    if getattr(args, "off_policy_mask_threshold", None) is not None:
        problems.append(f"off_policy_mask_threshold={args.off_policy_mask_threshold} (must be None)")
    if float(getattr(args, "entropy_coef", 0.0)) != 0.0 or bool(getattr(args, "use_adaptive_entropy", False)):
        problems.append("an entropy bonus (entropy_coef must be 0 and use_adaptive_entropy False)")
    if bool(getattr(args, "mask_truncated_completions", False)):
        problems.append("mask_truncated_completions=True (truncated completions are scored candidates; "
                        "set it False)")
    if bool(getattr(args, "use_liger_loss", False)):
        problems.append("use_liger_loss=True (Liger's fused GRPO loss kernel is not TPO's loss)")
    if getattr(args, "multi_objective_aggregation", "sum_then_normalize") != "sum_then_normalize":
        problems.append(f"multi_objective_aggregation={args.multi_objective_aggregation!r} (TPO standardises "
                        "the weighted sum of the rewards: use 'sum_then_normalize')")
    if problems:
        raise ValueError("TargetPOTrainer does not support: " + "; ".join(problems))


class TargetPOTrainer(GRPOTrainer):
    """TPO on TRL's ``GRPOTrainer``: same arguments (``model``, ``reward_funcs``, ``args``,
    ``train_dataset``, ``peft_config``, ...), with ``args`` a :class:`TargetPOConfig`.

    See the module docstring for the objective, the exactness rules and what is logged. Example::

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
        _check_supported(args)
        self.target_update = resolve_target_update(args)
        # whole groups, one update per generation, no optimiser step between generation and loss: the
        # loss forward runs at theta_old, so q is built from it and no separate old forward is needed
        self._target_in_loss = (self.target_update == "groups" and args.num_iterations == 1
                                and args.gradient_accumulation_steps % args.steps_per_generation == 0)
        self._tpo_rewards: torch.Tensor | None = None
        super().__init__(model=model, reward_funcs=reward_funcs, args=args, **kwargs)

    # ------------------------------------------------------------------ rollout side
    def _calculate_rewards(self, inputs: Any, prompts: Any, completions: Any, completion_ids_list: Any) -> torch.Tensor:
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._tpo_rewards = rewards  # [N_global, n_funcs], gathered over processes
        return rewards

    def _sequence_logp(self, per_token_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        valid = mask.bool()
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
        if old is not None:  # TRL computed them (vLLM, or generations reused across steps)
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
        output["target_group"] = torch.arange(start, start + n_local, device=device) // k
        metrics = self._metrics[mode]
        zero_var = (u == 0).all(dim=-1) if mask is None else ((u == 0) | ~valid).all(dim=-1)
        metrics["target/zero_variance_fraction"].append(zero_var.float().mean().item())
        if mode == "train" and self._target_in_loss:
            return output  # q is built from the loss forward itself (theta is still theta_old there)

        seq_old = self._sequence_logp(self._old_token_logps(output).float(), self._loss_mask(output))
        seq_all = self.accelerator.gather(seq_old)  # process order: the layout of the gathered rewards
        logp = seq_all.view(-1, k).to(u.dtype)
        q, p_old = self._target(logp, u, mask)
        output["advantages"] = (k * (q - p_old)).reshape(-1)[rows].to(seq_old.dtype)
        output["target_q"] = q.reshape(-1)[rows].to(seq_old.dtype)
        self._log_target(mode, q, p_old)
        return output

    def _target(self, logp: torch.Tensor, u: torch.Tensor, mask: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """``q`` and ``p_old`` over ``[G, K]`` groups from the old sequence log-probs and the z-scores."""
        q = tpo_target(logp, u, eta=self.args.eta, anchor=self.args.anchor, mask=mask)
        # p_old exactly as tpo_target computes q (u = 0, anchored): w = q - p_old is exactly 0 for an
        # all-equal group with the anchor
        p_old = tpo_target(logp, torch.zeros_like(u), eta=1.0, anchor=True, mask=mask)
        return q, p_old

    def _log_target(self, mode: str, q: torch.Tensor, p_old: torch.Tensor) -> None:
        metrics = self._metrics[mode]
        metrics["target/entropy_q"].append(_entropy(q).mean().item())
        metrics["target/entropy_p_old"].append(_entropy(p_old).mean().item())
        metrics["target/max_q"].append(q.max(dim=-1).values.mean().item())

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
        token_logps, entropies, _ = self._get_per_token_logps_and_entropies(
            model, ids, attention, inputs["completion_ids"].size(1), compute_entropy=True)
        seq = self._sequence_logp(token_logps.float(), mask)
        mode = "train" if self.model.training else "eval"
        if mode == "train" and self._target_in_loss:
            logp, u, valid = _grouped(seq, inputs["target_group"], self.num_generations, inputs["target_u"],
                                      inputs["target_valid"])
            groups_mask = None if bool(valid.all()) else valid
            q, p_old = self._target(logp.detach(), u, groups_mask)
            self._log_target(mode, q, p_old)
            loss = tpo_loss(logp, q, groups_mask)
        elif mode == "train" and self.target_update == "groups":
            logp, q, valid = _grouped(seq, inputs["target_group"], self.num_generations, inputs["target_q"].float(),
                                      inputs["target_valid"])
            loss = tpo_loss(logp, q, None if bool(valid.all()) else valid)
        else:  # per-sample weights: gradient (p_old - q) / G per completion while theta = theta_old
            loss = -(inputs["advantages"].float() * seq).mean()
        if mode == "train":
            loss = loss / self.current_gradient_accumulation_steps
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
    ``answer`` and ``metadata`` (JSON text). ``prompt`` is the chat messages ``[system, user]`` (TRL
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
        rows.append({"prompt": prompt, "index": index, "question": question, "answer": str(entry["answer"]),
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
