r"""A Hugging Face causal language model as the policy of the group agents (TPO, GRPO, Group PG) on text envs.

:class:`CausalLMPolicy` holds the model (:func:`load_language_model`: a hub id, a local directory or ``.gguf``
file, the offline SmolLM2 alias, or a loaded model), generates completions and computes their log-probs. Its
rollouts on a text env are :func:`~tpo_gym.agents.lm.text_rollouts.collect_text_rollouts`; what an agent directory
holds is read by :mod:`tpo_gym.agents.lm.files`.

* **Log-probs.** The sequence log-prob of each completion at the sampling temperature is

  .. math::
      \ell_i = \sum_{t \le T_i} \log \operatorname{softmax}(z_{i,t} / \tau)_{y_{i,t}}

  (fp32 log-softmax of only the sampled tokens, computed in row chunks: never a ``[N, T, vocab]``
  log-prob tensor; tokens after the first EOS and padding are masked; with
  ``length_normalize=True`` divided by the completion length ``T_i``).
* **Update.** ``n_epochs`` optimiser steps; each accumulates gradients over micro-batches of whole
  groups (``micro_batch_size`` groups at a time, loss weighted by the groups' share), so the step
  is exactly the full-batch step while peak memory is set by the micro-batch.

The objective is the agent's (TPO, GRPO, Group PG), reading the same ``[G, K]`` group structure as
sequence-level groups on the token tasks: scores, ``logp_old`` and the current ``logp``.
"""

from __future__ import annotations

import copy
import math
import pathlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.type_aliases import Schedule

from tpo_gym._validation import check_bool, check_float, check_int
from tpo_gym.agents.lm.files import _require_transformers, resolve_dtype
from tpo_gym.agents.lm.prompts import PromptFormat, build_prompt, completion_for_env
from tpo_gym.agents.lm.text_rollouts import TextBatch, completion_mask, is_text_env
from tpo_gym.objectives import at_least_float32

__all__ = ["CausalLMPolicy", "sequence_logprobs", "load_language_model", "entropy", "describe_model"]

#: Rows of the fp32 log-softmax computed at once (bounds the memory of the log-prob step).
LOGPROB_CHUNK_ROWS = 8


def load_language_model(model: Any, tokenizer: Any = None, model_kwargs: dict[str, Any] | None = None,
                        dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
    """``(model, tokenizer)`` from a loaded model, a hub id, a local directory or ``.gguf`` file, or an alias.

    ``"smollm2-135m-instruct"`` is SmolLM2-135M-Instruct from the offline package (see
    :mod:`tpo_gym.agents.lm.smollm2`). A loaded ``PreTrainedModel`` needs its ``tokenizer``. Missing
    files raise ``FileNotFoundError`` naming the path (or the fetch command). A GGUF checkpoint comes
    back dequantised as an ordinary dense model (trainable, ``save_pretrained`` writes safetensors).
    """
    transformers = _require_transformers()
    kwargs = dict(model_kwargs or {})
    if isinstance(model, str) and model.lower() == "smollm2-135m-instruct":
        from tpo_gym.agents.lm import smollm2

        loaded, tok = smollm2.load(dtype=dtype)
        return _as_dense(loaded), tokenizer if tokenizer is not None else tok
    if isinstance(model, (str, pathlib.Path)):
        text = str(model)
        path = pathlib.Path(text).expanduser()
        looks_local = path.exists() or text.startswith((".", "/", "~")) or text.endswith(".gguf")
        if looks_local and not path.exists():
            raise FileNotFoundError(f"model path {text!r} does not exist")
        if path.is_file() and path.suffix == ".gguf":
            kwargs.setdefault("gguf_file", path.name)
            source: str = str(path.parent)
        else:
            source = str(path) if path.exists() else text
        if tokenizer is None:
            tok_kwargs = {k: v for k, v in kwargs.items() if k in ("gguf_file", "revision", "local_files_only")}
            tokenizer = transformers.AutoTokenizer.from_pretrained(source, **tok_kwargs)
        loaded = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs)
        return _as_dense(loaded), tokenizer
    if isinstance(model, torch.nn.Module):
        if tokenizer is None:
            raise ValueError("a loaded model needs its tokenizer: policy_kwargs={'model': model, 'tokenizer': tok}")
        return model, tokenizer
    raise ValueError(f"model must be a hub id, a local path, 'smollm2-135m-instruct' or a loaded model, got {model!r}")


def _as_dense(model: Any) -> Any:
    """A GGUF checkpoint loads dequantised into ordinary dense weights but keeps its quantizer marker,
    which makes ``save_pretrained`` refuse; drop the marker so the trained model saves as safetensors."""
    quantizer = getattr(model, "hf_quantizer", None)
    method = getattr(getattr(quantizer, "quantization_config", None), "quant_method", None)
    if quantizer is not None and "gguf" in str(getattr(method, "value", method)).lower():
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    return model


def _prepare_tokenizer(tokenizer: Any) -> Any:
    """A copy of ``tokenizer`` set up for generation: left padding, the EOS token as pad token if it has none.

    The caller's tokenizer object is left as it was (a copy is changed, never the argument).
    """
    import copy

    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token is None:
            raise ValueError("the tokenizer has neither a pad token nor an EOS token; set one")
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no EOS token: completions could never end")
    return tokenizer


def sequence_logprobs(
    model: Any,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    token_mask: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    r"""Per-token log-probs ``[N, T]`` of the sampled completion tokens (0 where ``token_mask`` is False).

    One forward over ``[prompt; completion]`` with position ids from the attention mask (left
    padding does not change the result), keeping only the logits that predict completion tokens;
    the fp32 log-softmax of :math:`z/\tau` is evaluated for the sampled token only
    (:math:`z_y - \operatorname{logsumexp}(z)`), :data:`LOGPROB_CHUNK_ROWS` rows at a time.

    :param prompt_ids: ``[N, P]`` left-padded prompt tokens (one row per completion).
    :param prompt_mask: ``[N, P]`` attention mask of the prompts.
    :param completion_ids: ``[N, T]`` completion tokens.
    :param token_mask: ``bool [N, T]`` valid completion tokens.
    :param temperature: the sampling temperature :math:`\tau`.
    """
    t = completion_ids.shape[1]
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention = torch.cat([prompt_mask.long(), token_mask.long()], dim=1)
    position_ids = (attention.cumsum(dim=1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=attention, position_ids=position_ids,
                   logits_to_keep=t + 1).logits[:, :-1]
    out = []
    for start in range(0, logits.shape[0], LOGPROB_CHUNK_ROWS):
        chunk = logits[start:start + LOGPROB_CHUNK_ROWS]
        z = at_least_float32(chunk) / temperature
        ids = completion_ids[start:start + LOGPROB_CHUNK_ROWS].unsqueeze(-1)
        out.append(z.gather(-1, ids).squeeze(-1) - torch.logsumexp(z, dim=-1))
    token_logp = torch.cat(out, dim=0)
    return torch.where(token_mask, token_logp, torch.zeros_like(token_logp))


class CausalLMPolicy(BasePolicy):
    """A causal language model (``transformers``) as a policy over completions, with an AdamW optimiser.

    :param observation_space: a ``Text`` space (the env's).
    :param action_space: a ``Text`` space (completions).
    :param lr_schedule: learning-rate schedule (SB3 convention).
    :param model: a hub id, a local directory or ``.gguf`` file, ``"smollm2-135m-instruct"`` (offline),
        or a loaded ``PreTrainedModel`` (then pass ``tokenizer``).
    :param tokenizer: the tokenizer (default: loaded with the model).
    :param model_kwargs: extra ``from_pretrained`` keyword arguments.
    :param lora: ``peft.LoraConfig`` keyword arguments (e.g. ``{"r": 32, "lora_alpha": 64}``) to train
        LoRA adapters only; ``None`` trains every weight.
    :param max_new_tokens: completion length bound (>= 1).
    :param temperature: sampling temperature (> 0); log-probs are computed at the same temperature.
    :param top_p: nucleus sampling mass in (0, 1].
    :param do_sample: sample (default) or decode greedily.
    :param prompt_format: a :class:`~tpo_gym.agents.lm.prompts.PromptFormat`, its fields as a dict, or
        ``"env"`` / ``"answer_prefill"``.
    :param length_normalize: divide each sequence log-prob by its length (default off, as the paper).
    :param micro_batch_size: groups per forward / backward (gradient accumulation up to the full
        batch); ``None``: all groups at once.
    :param dtype: ``"auto"`` (bf16 on CUDA, fp32 on CPU), ``"float32"``, ``"bfloat16"`` or ``"float64"``
        (for exact gradient checks).
    :param device: the device the agent runs on (set by the agent).
    :param optimizer_class: optimiser class (default ``torch.optim.AdamW``).
    :param optimizer_kwargs: extra optimiser keyword arguments.
    """

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        lr_schedule: Schedule,
        model: Any = None,
        tokenizer: Any = None,
        model_kwargs: dict[str, Any] | None = None,
        lora: dict[str, Any] | None = None,
        max_new_tokens: int = 64,
        temperature: float = 1.0,
        top_p: float = 1.0,
        do_sample: bool = True,
        prompt_format: Any = "env",
        length_normalize: bool = False,
        micro_batch_size: int | None = None,
        dtype: str = "auto",
        device: Any = "cpu",
        optimizer_class: type[torch.optim.Optimizer] = torch.optim.AdamW,
        optimizer_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if not is_text_env(observation_space, action_space):
            raise ValueError(
                "CausalLMPolicy needs a text env (Text observation and action spaces, e.g. tpo_gym/ReasoningGym-v0), "
                f"got observations {observation_space} and actions {action_space}"
            )
        if model is None:
            raise ValueError("CausalLMPolicy needs policy_kwargs={'model': <hub id, local path or loaded model>}")
        super().__init__(observation_space, action_space, optimizer_class=optimizer_class,
                         optimizer_kwargs=optimizer_kwargs, normalize_images=False)
        self.max_new_tokens = check_int("max_new_tokens", max_new_tokens, 1)
        self.temperature = check_float("temperature", temperature, 0.0, strict_min=True)
        self.top_p = check_float("top_p", top_p, 0.0, maximum=1.0, strict_min=True)
        self.do_sample = check_bool("do_sample", do_sample)
        self.prompt_format = PromptFormat.from_data(prompt_format)
        self.length_normalize = check_bool("length_normalize", length_normalize)
        self.micro_batch_size = None if micro_batch_size is None else check_int("micro_batch_size",
                                                                               micro_batch_size, 1)
        torch_dtype = resolve_dtype(dtype, device)
        self.dtype_name = dtype
        self.model_spec = model if isinstance(model, (str, pathlib.Path)) else None
        net, tok = load_language_model(model, tokenizer, model_kwargs, torch_dtype)
        net = _as_dense(net)
        self.tokenizer = _prepare_tokenizer(tok)
        net = net.to(dtype=torch_dtype)
        self.lora = dict(lora) if lora is not None else None
        if self.lora is not None:
            try:
                import peft
            except ImportError as exc:  # pragma: no cover
                raise ImportError("LoRA needs peft: pip install 'tpo-gym[llm]'") from exc
            net = peft.get_peft_model(net, peft.LoraConfig(**{"task_type": "CAUSAL_LM", **self.lora}))
        self.model = net
        self.model_kwargs = dict(model_kwargs or {})
        self.reference: Any = None
        self.optimizer = self.optimizer_class(
            [p for p in self.model.parameters() if p.requires_grad], lr=lr_schedule(1), **self.optimizer_kwargs
        )

    # -- SB3 -------------------------------------------------------------------------------
    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        data.update(max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p)
        return data

    def save(self, path: str) -> None:
        """Write the model and tokenizer with ``save_pretrained`` into directory ``path`` (safetensors)."""
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)

    @classmethod
    def load(cls, path: str, device: Any = "auto") -> Any:  # type: ignore[override]
        """Not a pickle: reload a saved directory as ``policy_kwargs={"model": path}`` or with ``TPO.load``."""
        raise ValueError(f"load {path!r} through the agent (TPO.load) or as policy_kwargs={{'model': {path!r}}}; "
                         "CausalLMPolicy files are Hugging Face directories, never pickles")

    def forward(self, obs: Any, deterministic: bool = False) -> Any:  # pragma: no cover - SB3 abstract
        return self.generate_text([obs] if isinstance(obs, str) else list(obs), deterministic=deterministic)

    def _predict(self, observation: Any, deterministic: bool = False) -> Any:  # pragma: no cover
        return self.forward(observation, deterministic)

    def predict(
        self,
        observation: Any,
        state: Any = None,
        episode_start: Any = None,
        deterministic: bool = False,
    ) -> tuple[Any, None]:
        """The completion of one question (a ``str``) or a list of them; ``deterministic``: greedy.

        A question may also be a dict with ``"question"`` and ``"system_prompt"`` (a text env's
        ``reset`` info), so the prompt is built exactly as in training. Returns what the env scores
        (prefill included); an empty list gives an empty array.
        """
        single = isinstance(observation, (str, dict))
        items = [observation] if single else list(observation)
        if not items:
            return np.array([], dtype=object), None
        if not all(isinstance(o, (str, dict)) for o in items):
            raise ValueError("observation must be a question string, an info dict, or a list of them")
        texts = self.generate_text(items, deterministic=deterministic)
        return (texts[0] if single else np.array(texts, dtype=object)), None

    # -- prompts and generation ------------------------------------------------------------
    def prompt_of(self, item: str | dict[str, Any]) -> str:
        """The prompt text of a question (or of an env's ``reset`` info)."""
        if isinstance(item, dict):
            question, system = item.get("question"), item.get("system_prompt")
            if not isinstance(question, str):
                raise ValueError("an info dict needs a 'question' string")
        else:
            question, system = item, None
        return build_prompt(self.tokenizer, question, system, self.prompt_format)

    def encode(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(input_ids, attention_mask)`` ``[N, P]`` of prompt texts on the policy's device (left padding, no
        special tokens added: the chat template has them)."""
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        return enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)

    @torch.no_grad()
    def generate_ids(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, k: int,
                     deterministic: bool = False) -> torch.Tensor:
        """``[G*K, T]`` completion tokens, K per prompt, contiguous (padding after EOS)."""
        sample = self.do_sample and not deterministic
        kwargs: dict[str, Any] = {"do_sample": sample, "max_new_tokens": self.max_new_tokens,
                                  "num_return_sequences": k, "pad_token_id": self.tokenizer.pad_token_id,
                                  "eos_token_id": self.tokenizer.eos_token_id}
        if sample:
            kwargs.update(temperature=self.temperature, top_p=self.top_p, top_k=0)
        was_training = self.model.training
        self.model.eval()
        try:
            out = self.model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, **kwargs)
        finally:
            self.model.train(was_training)
        return out[:, prompt_ids.shape[1]:]

    def decode(self, completion_ids: torch.Tensor, token_mask: torch.Tensor) -> list[str]:
        """Generated texts (special tokens dropped)."""
        rows = [ids[m].tolist() for ids, m in zip(completion_ids, token_mask, strict=True)]
        return self.tokenizer.batch_decode(rows, skip_special_tokens=True)

    def generate_text(self, items: list[Any], deterministic: bool = False) -> list[str]:
        """One completion per item, as the env would score it (prefill included)."""
        prompt_ids, prompt_mask = self.encode([self.prompt_of(i) for i in items])
        completion_ids = self.generate_ids(prompt_ids, prompt_mask, 1, deterministic)
        mask = completion_mask(completion_ids, self.tokenizer.eos_token_id, self.tokenizer.pad_token_id)
        return [completion_for_env(t, self.prompt_format) for t in self.decode(completion_ids, mask)]

    # -- log-probs ---------------------------------------------------------------------------
    def token_logp(self, batch: TextBatch, start: int, stop: int, model: Any = None) -> torch.Tensor:
        """Token log-probs ``[(stop - start) * K, T]`` of the completions of groups ``start .. stop-1``
        (0 at invalid tokens), under ``model`` (default: the policy's)."""
        rows = batch.group_rows(start, stop)
        k = batch.group_size
        prompt_ids = batch.prompt_ids[start:stop].repeat_interleave(k, dim=0)
        prompt_mask = batch.prompt_mask[start:stop].repeat_interleave(k, dim=0)
        return sequence_logprobs(model if model is not None else self.model, prompt_ids, prompt_mask,
                                 batch.completion_ids[rows], batch.token_mask[rows], self.temperature)

    def sequence_logp(self, token_logp: torch.Tensor, batch: TextBatch, start: int, stop: int) -> torch.Tensor:
        """``[stop - start, K]`` sequence log-probs from :meth:`token_logp`'s rows: the sum over tokens, or
        the mean with ``length_normalize``."""
        seq = token_logp.sum(dim=1)
        if self.length_normalize:
            seq = seq / batch.token_mask[batch.group_rows(start, stop)].sum(dim=1).clamp(min=1)
        return seq.reshape(stop - start, batch.group_size)

    def group_logp(self, batch: TextBatch, start: int, stop: int, model: Any = None) -> torch.Tensor:
        """Sequence log-probs ``[stop - start, K]`` of the completions of groups ``start .. stop-1``."""
        return self.sequence_logp(self.token_logp(batch, start, stop, model), batch, start, stop)

    def micro_batches(self, n_groups: int) -> Iterator[tuple[int, int]]:
        """``(start, stop)`` group ranges of at most ``micro_batch_size`` groups covering ``0 .. n_groups``."""
        size = self.micro_batch_size or n_groups
        for start in range(0, n_groups, size):
            yield start, min(start + size, n_groups)

    def freeze_reference(self) -> None:
        """Keep a frozen copy of the current weights as the reference model (TRL's KL reference).

        With LoRA there is no copy: the reference is the base model with the adapters disabled (the
        initial model, as TRL and peft do it).
        """
        if self.lora is not None:
            return
        self.reference = copy.deepcopy(self.model).eval()
        for p in self.reference.parameters():
            p.requires_grad_(False)

    def reference_token_logp(self, batch: TextBatch, start: int, stop: int) -> torch.Tensor:
        """:meth:`token_logp` under the reference model (:meth:`freeze_reference`), without gradient."""
        with torch.no_grad():
            if self.lora is not None:
                with self.model.disable_adapter():
                    return self.token_logp(batch, start, stop)
            if self.reference is None:
                self.freeze_reference()
            return self.token_logp(batch, start, stop, self.reference)

    def collect(self, env: Any, n_groups: int, k: int, seed: int, with_reference: bool = False) -> TextBatch:
        """Deprecated: rollouts are not the policy's job; use
        :func:`~tpo_gym.agents.lm.text_rollouts.collect_text_rollouts` ``(policy, env, n_groups, k, seed, ...)``,
        which this calls (same batch)."""
        import warnings

        from tpo_gym.agents.lm.text_rollouts import collect_text_rollouts

        warnings.warn("CausalLMPolicy.collect is deprecated: use tpo_gym.agents.lm.text_rollouts.collect_text_rollouts("
                      "policy, env, n_groups, k, seed, with_reference)", DeprecationWarning, stacklevel=2)
        return collect_text_rollouts(self, env, n_groups, k, seed, with_reference)


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Mean entropy (nats) of ``softmax(logits)`` over the last axis."""
    logp = torch.log_softmax(at_least_float32(logits), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1).mean()


def describe_model(policy: CausalLMPolicy) -> dict[str, Any]:
    """Plain-data description of the policy's model for reports."""
    n = sum(p.numel() for p in policy.model.parameters())
    trainable = sum(p.numel() for p in policy.model.parameters() if p.requires_grad)
    return {"model": str(policy.model_spec) if policy.model_spec is not None else type(policy.model).__name__,
            "parameters": n, "trainable": trainable, "lora": policy.lora,
            "prompt_format": policy.prompt_format.to_data(), "max_new_tokens": policy.max_new_tokens,
            "temperature": policy.temperature, "top_p": policy.top_p, "length_normalize": policy.length_normalize,
            "log2_params": math.log2(max(n, 1))}
