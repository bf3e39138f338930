r"""A Hugging Face causal language model as the policy of the group agents (TPO, GRPO, Group PG).

For a text env (``Text`` observation and action spaces and the group API ``score_candidates(list of
completions) -> [K]``, e.g. ``tpo_gym/ReasoningGym-v0``) one iteration is:

1. **Prompts.** G contexts are drawn (``env.reset(seed=...)``); each question becomes a prompt through
   the policy's :class:`~tpo_gym.agents.prompts.PromptFormat` and the tokenizer's chat template.
2. **Generation.** ``model.generate`` samples K completions per prompt (``do_sample``,
   ``temperature``, ``top_p``, ``max_new_tokens``; left padding; ``num_return_sequences=K``, so the K
   completions of a prompt are contiguous and a group is a reshape ``[G*K] -> [G, K]``).
3. **Scores.** Each completion is scored once by the env's own scorer: ``[G, K]``.
4. **Old log-probs.** A separate forward (no grad) gives the sequence log-prob of each completion
   at the sampling temperature,

   .. math::
       \ell_i = \sum_{t \le T_i} \log \operatorname{softmax}(z_{i,t} / \tau)_{y_{i,t}}

   (fp32 log-softmax of only the sampled tokens, computed in row chunks: never a ``[N, T, vocab]``
   log-prob tensor; tokens after the first EOS and padding are masked; with
   ``length_normalize=True`` divided by the completion length ``T_i``).
5. **Update.** ``n_epochs`` optimiser steps; each accumulates gradients over micro-batches of whole
   groups (``micro_batch_size`` groups at a time, loss weighted by the groups' share), so the step
   is exactly the full-batch step while peak memory is set by the micro-batch.

The objective is the agent's (TPO, GRPO, Group PG), reading the same ``[G, K]`` group structure as
sequence-level groups on the token tasks: scores, ``logp_old`` and the current ``logp``.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import pathlib
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.type_aliases import Schedule

from tpo_gym._validation import check_bool, check_float, check_int
from tpo_gym.agents.persistence import AgentFileError
from tpo_gym.agents.prompts import PromptFormat, build_prompt, completion_for_env

__all__ = ["CausalLMPolicy", "TextBatch", "sequence_logprobs", "load_language_model", "is_text_env", "resolve_dtype",
           "AGENT_MODEL_KWARGS", "AGENT_LORA_KWARGS", "agent_model_kwargs", "check_agent_model_kwargs",
           "check_agent_lora_kwargs", "load_agent_model", "load_agent_tokenizer", "load_agent_adapter"]

#: Rows of the fp32 log-softmax computed at once (bounds the memory of the log-prob step).
LOGPROB_CHUNK_ROWS = 8


def is_text_env(observation_space: spaces.Space, action_space: spaces.Space) -> bool:
    """Whether the spaces are those of a text env (``Text`` observations and actions)."""
    return isinstance(observation_space, spaces.Text) and isinstance(action_space, spaces.Text)


def _require_transformers() -> Any:
    try:
        import transformers
    except ImportError as exc:  # pragma: no cover - the llm extra is installed by make test
        raise ImportError(
            "CausalLMPolicy needs transformers: pip install 'tpo-gym[llm]' (transformers, peft, accelerate, gguf)"
        ) from exc
    return transformers


def load_language_model(model: Any, tokenizer: Any = None, model_kwargs: dict[str, Any] | None = None,
                        dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
    """``(model, tokenizer)`` from a loaded model, a hub id, a local directory or ``.gguf`` file, or an alias.

    ``"smollm2-135m-instruct"`` is SmolLM2-135M-Instruct from the offline package (see
    :mod:`tpo_gym.agents.smollm2`). A loaded ``PreTrainedModel`` needs its ``tokenizer``. Missing
    files raise ``FileNotFoundError`` naming the path (or the fetch command). A GGUF checkpoint comes
    back dequantised as an ordinary dense model (trainable, ``save_pretrained`` writes safetensors).
    """
    transformers = _require_transformers()
    kwargs = dict(model_kwargs or {})
    if isinstance(model, str) and model.lower() == "smollm2-135m-instruct":
        from tpo_gym.agents import smollm2

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


# --------------------------------------------------------------------------------------------
# loading what an agent directory holds (tpo_gym.agents.persistence writes it): local files, no code
# --------------------------------------------------------------------------------------------
#: The ``from_pretrained`` settings an agent file's ``policy_kwargs.model_kwargs`` may hold, with their allowed
#: values. They choose how the weights sit in memory; none of them chooses where files come from (``revision``,
#: ``token``, ``cache_dir``, ``local_files_only=False``) or lets code run (``trust_remote_code``,
#: ``code_revision``, attention kernels from the hub), so a file can set nothing else.
AGENT_MODEL_KWARGS: dict[str, tuple[Any, ...]] = {
    "torch_dtype": ("auto", "float32", "float16", "bfloat16", "float64"),
    "attn_implementation": ("eager", "sdpa", "flex_attention"),
    "local_files_only": (True,),
    "use_safetensors": (True,),
}
#: The ``peft.LoraConfig`` settings an agent file's ``policy_kwargs.lora`` may hold (no module names to import,
#: no initialisation that rewrites the base weights).
AGENT_LORA_KWARGS = frozenset({
    "r", "lora_alpha", "lora_dropout", "target_modules", "exclude_modules", "bias", "use_rslora", "use_dora",
    "fan_in_fan_out", "modules_to_save", "init_lora_weights", "layers_to_transform", "layers_pattern",
    "rank_pattern", "alpha_pattern", "task_type",
})
#: ``config.json`` size fields that must be positive integers when present.
_CONFIG_SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "max_position_embeddings")


def _file_may_set(key: str, value: Any) -> bool:
    return any(type(value) is type(a) and value == a for a in AGENT_MODEL_KWARGS.get(key, ()))


def agent_model_kwargs(model_kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """The entries of ``model_kwargs`` that an agent file keeps (:data:`AGENT_MODEL_KWARGS`): ``save`` drops the
    others (``revision``, ``token``, ``trust_remote_code``, ...), which ``load`` would refuse; the saved
    ``model/`` needs none of them, and a LoRA agent's base model comes with the caller's own settings."""
    return {k: v for k, v in (model_kwargs or {}).items() if _file_may_set(k, v)}


def check_agent_model_kwargs(model_kwargs: Any, field: str = "kwargs.policy_kwargs.model_kwargs") -> dict[str, Any]:
    """``model_kwargs`` read from an agent file, if every key is in :data:`AGENT_MODEL_KWARGS` with an allowed value.

    :raises AgentFileError: naming the first key that is not allowed (``trust_remote_code``, ``revision``,
        ``token``, ...) or has a value that is not.
    """
    if model_kwargs is None:
        return {}
    if not isinstance(model_kwargs, dict):
        raise AgentFileError(f"{field} must be a dict of from_pretrained settings, got {model_kwargs!r:.200}")
    for key, value in model_kwargs.items():
        allowed = AGENT_MODEL_KWARGS.get(key)
        if allowed is None:
            raise AgentFileError(
                f"{field} holds {key!r}, which an agent file may not set (it could run code or reach the network); "
                f"a file may set only {sorted(AGENT_MODEL_KWARGS)}. Trusting remote code is the caller's own "
                "load(..., trust_remote_code=True); other settings: load(..., policy_kwargs={'model_kwargs': {...}})"
            )
        if not _file_may_set(key, value):
            raise AgentFileError(f"{field}.{key} must be one of {list(allowed)}, got {value!r:.200}")
    return dict(model_kwargs)


def check_agent_lora_kwargs(lora: Any, field: str = "kwargs.policy_kwargs.lora") -> dict[str, Any] | None:
    """``lora`` read from an agent file, if every key is in :data:`AGENT_LORA_KWARGS`.

    :raises AgentFileError: naming the first key that is not allowed.
    """
    if lora is None:
        return None
    if not isinstance(lora, dict):
        raise AgentFileError(f"{field} must be a dict of peft.LoraConfig settings, got {lora!r:.200}")
    bad = sorted(set(lora) - AGENT_LORA_KWARGS)
    if bad:
        raise AgentFileError(f"{field} holds {bad}, which an agent file may not set; allowed: "
                                f"{sorted(AGENT_LORA_KWARGS)}")
    init = lora.get("init_lora_weights", True)
    if not (isinstance(init, bool) or init == "gaussian"):
        raise AgentFileError(f"{field}.init_lora_weights must be true, false or 'gaussian', got {init!r:.200}")
    return dict(lora)


def _safetensors_keys(path: pathlib.Path) -> set[str]:
    """The tensor names of a safetensors file, read from its header (the data are not read).

    :raises AgentFileError: the file is not a regular file or not valid safetensors (empty, truncated, bad header).
    """
    from safetensors import safe_open

    if path.is_symlink() or not path.is_file():
        raise AgentFileError(f"{str(path)!r} is missing or not a regular file")
    try:
        with safe_open(str(path), framework="pt") as f:
            return set(f.keys())
    except Exception as exc:  # noqa: BLE001 - SafetensorError, OSError: every damage is reported the same way
        raise AgentFileError(f"{str(path)!r} is not a valid safetensors file ({exc})") from None


def _weight_files(directory: pathlib.Path) -> list[pathlib.Path]:
    """``model.safetensors``, or the shards a ``model.safetensors.index.json`` lists (plain names in ``directory``)."""
    import json

    index = directory / "model.safetensors.index.json"
    if not index.is_file():
        return [directory / "model.safetensors"]
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        shards = sorted(set(weight_map.values()))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise AgentFileError(f"{str(index)!r} is not a safetensors index ({exc!r})") from None
    for shard in shards:
        if not isinstance(shard, str) or pathlib.PurePath(shard).name != shard or not shard.endswith(".safetensors"):
            raise AgentFileError(f"{str(index)!r} names the shard {shard!r}, not a .safetensors file beside it")
    return [directory / s for s in shards]


def load_agent_model(directory: pathlib.Path, model_kwargs: dict[str, Any], dtype: torch.dtype,
                     trust_remote_code: bool = False) -> Any:
    """The causal LM saved in an agent directory's ``model/``, read strictly from local safetensors, running no code.

    ``from_pretrained`` reads only this directory (``local_files_only=True``, ``use_safetensors=True``) and
    imports no code from it unless the caller passes ``trust_remote_code=True``. ``config.json`` must give
    positive sizes, no quantisation and a local attention implementation (``eager`` / ``sdpa`` /
    ``flex_attention``: other names fetch kernels from the hub); ``model_kwargs`` must already have passed
    :func:`check_agent_model_kwargs`. The weights must be exactly the model's: a missing, unexpected or
    mis-shaped weight is an error (a tied ``lm_head`` that the file leaves out is not missing).

    :raises AgentFileError: naming the file and what is wrong.
    """
    transformers = _require_transformers()
    where = str(directory)
    if (directory / "adapter_config.json").exists():
        raise AgentFileError(f"{where!r} holds an adapter_config.json: the model directory of an agent holds a "
                                "whole model (a LoRA agent keeps its adapter in adapter/)")
    files = _weight_files(directory)
    for file in files:
        _safetensors_keys(file)
    try:
        config = transformers.AutoConfig.from_pretrained(where, local_files_only=True,
                                                         trust_remote_code=trust_remote_code)
    except Exception as exc:  # noqa: BLE001 - a missing file, bad JSON, an unknown model type: all are reported
        raise AgentFileError(f"{str(directory / 'config.json')!r} is not a valid model configuration "
                                f"({type(exc).__name__}: {exc})") from None
    for name in _CONFIG_SIZES:
        value = getattr(config, name, None)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise AgentFileError(f"{str(directory / 'config.json')!r}: {name} must be a positive integer, "
                                    f"got {value!r}")
    attention = getattr(config, "_attn_implementation", None)
    if attention not in (None, *AGENT_MODEL_KWARGS["attn_implementation"]):
        raise AgentFileError(f"{str(directory / 'config.json')!r} names the attention implementation "
                                f"{attention!r}; allowed: {list(AGENT_MODEL_KWARGS['attn_implementation'])}")
    if getattr(config, "quantization_config", None) is not None and not trust_remote_code:
        raise AgentFileError(f"{str(directory / 'config.json')!r} holds a quantization_config: an agent saves "
                                "dense weights (load(..., trust_remote_code=True) to accept it)")
    kwargs = {k: v for k, v in model_kwargs.items() if k not in ("local_files_only", "use_safetensors")}
    try:
        model, info = transformers.AutoModelForCausalLM.from_pretrained(
            where, config=config, dtype=dtype, local_files_only=True, use_safetensors=True,
            trust_remote_code=trust_remote_code, output_loading_info=True, **kwargs)
    except Exception as exc:  # noqa: BLE001 - shape mismatches, corrupt data: reported naming the files
        raise AgentFileError(f"{where!r}: the weights {[f.name for f in files]} do not load into the model of "
                                f"config.json ({type(exc).__name__}: {exc})") from None
    wrong = {k: sorted(map(str, info.get(k) or ())) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if any(wrong.values()):
        found = ", ".join(f"{k.replace('_keys', '')} {v}" for k, v in wrong.items() if v)
        raise AgentFileError(f"{where!r}: the weights {[f.name for f in files]} do not match the model of "
                                f"config.json: {found}")
    return model


def load_agent_tokenizer(directory: pathlib.Path, trust_remote_code: bool = False) -> Any:
    """The tokenizer saved in an agent directory's ``tokenizer/``: local files only, no code imported from it
    (``auto_map`` is ignored unless the caller passes ``trust_remote_code=True``).

    :raises AgentFileError: the directory is missing or its files do not load as a tokenizer.
    """
    transformers = _require_transformers()
    if not directory.is_dir():
        raise AgentFileError(f"the agent directory has no tokenizer at {str(directory)!r}")
    try:
        return transformers.AutoTokenizer.from_pretrained(str(directory), local_files_only=True,
                                                          trust_remote_code=trust_remote_code)
    except Exception as exc:  # noqa: BLE001 - bad JSON, unknown classes, custom code refused: all reported
        raise AgentFileError(f"{str(directory)!r} does not hold a loadable tokenizer "
                                f"({type(exc).__name__}: {exc})") from None


def load_agent_adapter(model: Any, directory: pathlib.Path) -> None:
    """Load a saved LoRA adapter (``adapter_model.safetensors``) into ``model``'s fresh adapters, strictly.

    Only the safetensors file is read (``adapter_config.json`` is not: the adapter's shape is the agent's
    ``lora`` setting). Its tensor names must be exactly the adapter's, and each shape must fit.

    :raises AgentFileError: naming the file and the missing, unexpected or mis-shaped weights.
    """
    from peft import get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors.torch import load_file

    file = directory / "adapter_model.safetensors"
    if not directory.is_dir():
        raise AgentFileError(f"the LoRA agent directory has no adapter at {str(directory)!r}")
    keys = _safetensors_keys(file)
    expected = set(get_peft_model_state_dict(model))
    missing, unexpected = sorted(expected - keys), sorted(keys - expected)
    if missing or unexpected:
        raise AgentFileError(f"{str(file)!r} does not match the LoRA adapter of the agent's lora setting: "
                                f"missing {missing}, unexpected {unexpected}")
    try:
        set_peft_model_state_dict(model, load_file(str(file)))
    except Exception as exc:  # noqa: BLE001 - shape mismatches, corrupt data
        raise AgentFileError(f"{str(file)!r} does not load into the LoRA adapter ({exc})") from None


def resolve_dtype(name: str, device: Any) -> torch.dtype:
    """The torch dtype of the policy setting ``dtype`` (``"auto"``: bf16 on CUDA, fp32 elsewhere)."""
    if name not in ("auto", "float32", "bfloat16", "float64"):
        raise ValueError(f"dtype must be one of ['auto', 'float32', 'bfloat16', 'float64'], got {name!r}")
    if name == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}[name]


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


def completion_mask(
    completion_ids: torch.Tensor, eos_token_id: int | list[int], pad_token_id: int | None = None
) -> torch.Tensor:
    """``bool [N, T]``: valid completion tokens, up to and including the first EOS (none after it)."""
    eos = torch.tensor(eos_token_id if isinstance(eos_token_id, list) else [eos_token_id],
                       device=completion_ids.device)
    is_eos = torch.isin(completion_ids, eos)
    after_eos = (is_eos.cumsum(dim=1) - is_eos.long()) > 0
    return ~after_eos


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
        z = chunk.to(torch.promote_types(chunk.dtype, torch.float32)) / temperature  # fp32 or wider
        ids = completion_ids[start:start + LOGPROB_CHUNK_ROWS].unsqueeze(-1)
        out.append(z.gather(-1, ids).squeeze(-1) - torch.logsumexp(z, dim=-1))
    token_logp = torch.cat(out, dim=0)
    return torch.where(token_mask, token_logp, torch.zeros_like(token_logp))


@dataclasses.dataclass
class TextBatch:
    """The rollouts of one iteration on a text env: G prompts x K completions.

    :param prompts: the G prompt texts (chat template applied, prefill included).
    :param completions: the G*K generated texts (without the prefill), group-contiguous.
    :param prompt_ids: ``[G, P]`` left-padded prompt tokens; ``prompt_mask`` their attention mask.
    :param completion_ids: ``[G*K, T]``; ``token_mask`` ``bool [G*K, T]`` valid tokens (to the first EOS).
    :param scores: ``float32 [G, K]`` env scores.
    :param logp_old: ``[G, K]`` sequence log-probs under pi_old (length-normalised if the policy is).
    :param logp_ref: ``[G, K]`` under the frozen reference model, or ``None``.
    :param token_logp_ref: ``[G*K, T]`` token log-probs under the frozen reference model, or ``None``
        (with ``logp_ref``; TPO's per-token KL penalty reads them).
    :param group_size: K.
    :param stats: timings and sizes of the rollout (generate / score / logprob seconds, tokens/s).
    """

    prompts: list[str]
    completions: list[str]
    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    token_mask: torch.Tensor
    scores: torch.Tensor
    logp_old: torch.Tensor
    logp_ref: torch.Tensor | None
    group_size: int
    stats: dict[str, float]
    token_logp_ref: torch.Tensor | None = None

    @property
    def n_groups(self) -> int:
        """G."""
        return int(self.scores.shape[0])

    @property
    def n_steps(self) -> int:
        """Env steps: one per completion (one-step episodes)."""
        return int(self.scores.numel())

    @property
    def error(self) -> float:
        """1 - mean score."""
        return 1.0 - float(self.scores.mean())

    @property
    def returns(self) -> torch.Tensor:
        """Per-completion returns (the scores)."""
        return self.scores.reshape(-1)

    @property
    def lengths(self) -> torch.Tensor:
        """Completion lengths in tokens."""
        return self.token_mask.sum(dim=1)

    def group_rows(self, start: int, stop: int) -> slice:
        """Completion rows of groups ``start .. stop-1``."""
        return slice(start * self.group_size, stop * self.group_size)


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
    :param prompt_format: a :class:`~tpo_gym.agents.prompts.PromptFormat`, its fields as a dict, or
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

    def _encode(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
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
        prompt_ids, prompt_mask = self._encode([self.prompt_of(i) for i in items])
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

    def _reference_token_logp(self, batch: TextBatch, start: int, stop: int) -> torch.Tensor:
        """:meth:`token_logp` under the reference model (:meth:`freeze_reference`), without gradient."""
        with torch.no_grad():
            if self.lora is not None:
                with self.model.disable_adapter():
                    return self.token_logp(batch, start, stop)
            if self.reference is None:
                self.freeze_reference()
            return self.token_logp(batch, start, stop, self.reference)

    # -- rollouts ------------------------------------------------------------------------------
    def collect(self, env: Any, n_groups: int, k: int, seed: int, with_reference: bool = False) -> TextBatch:
        """Draw ``n_groups`` questions from ``env``, sample ``k`` completions each, score them once."""
        rng = np.random.default_rng(seed)
        seeds = [int(s) for s in rng.integers(2**31 - 1, size=n_groups)]
        items = []
        for s in seeds:
            obs, info = env.reset(seed=s)
            items.append({"question": info.get("question", obs), "system_prompt": info.get("system_prompt")})
        prompts = [self.prompt_of(i) for i in items]
        prompt_ids, prompt_mask = self._encode(prompts)
        torch.manual_seed(int(rng.integers(2**62)))
        if torch.cuda.is_available():
            torch.cuda.manual_seed_all(int(rng.integers(2**62)))
        start = time.perf_counter()
        completion_ids = self.generate_ids(prompt_ids, prompt_mask, k)
        t_generate = time.perf_counter() - start
        token_mask = completion_mask(completion_ids, self.tokenizer.eos_token_id, self.tokenizer.pad_token_id)
        texts = self.decode(completion_ids, token_mask)
        start = time.perf_counter()
        scores = np.zeros((n_groups, k), dtype=np.float32)
        for g, s in enumerate(seeds):
            env.reset(seed=s)  # the same question again: score its K completions through the group API
            scores[g] = env.unwrapped.score_candidates([completion_for_env(t, self.prompt_format)
                                                        for t in texts[g * k:(g + 1) * k]])
        t_score = time.perf_counter() - start
        batch = TextBatch(prompts, texts, prompt_ids, prompt_mask, completion_ids, token_mask,
                          torch.from_numpy(scores).to(self.device), torch.empty(0), None, k, {})
        start = time.perf_counter()
        with torch.no_grad():
            batch.logp_old = torch.cat([self.group_logp(batch, a, b) for a, b in self.micro_batches(n_groups)])
            if with_reference:
                parts = [self._reference_token_logp(batch, a, b) for a, b in self.micro_batches(n_groups)]
                batch.token_logp_ref = torch.cat(parts)
                batch.logp_ref = torch.cat([self.sequence_logp(t, batch, a, b)
                                            for t, (a, b) in zip(parts, self.micro_batches(n_groups), strict=True)])
        t_logp = time.perf_counter() - start
        n_tokens = int(token_mask.sum())
        batch.stats = {
            "completion_length": float(token_mask.sum(dim=1).float().mean()),
            "tokens_per_s": n_tokens / max(t_generate, 1e-9),
            "generate_s": t_generate,
            "score_s": t_score,
            "logprob_s": t_logp,
        }
        return batch


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Mean entropy (nats) of ``softmax(logits)`` over the last axis."""
    logp = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
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


class TextVecEnv:
    """A one-env SB3 ``VecEnv`` for a text env (SB3's ``DummyVecEnv`` cannot buffer ``Text`` observations).

    Observations are object arrays of strings; ``step`` takes an array of one completion. The agents
    roll out through the env itself (:meth:`CausalLMPolicy.collect`); this wrapper exists so that
    SB3's ``get_env``, callbacks and ``set_env`` see the usual ``VecEnv`` surface.
    """

    def __new__(cls, env: Any) -> Any:  # built lazily so that SB3 is imported only here
        from stable_baselines3.common.vec_env.base_vec_env import VecEnv

        class _TextVecEnv(VecEnv):
            def __init__(self, inner: Any) -> None:
                self.envs = [inner]
                super().__init__(1, inner.observation_space, inner.action_space)
                self._actions: Any = None

            def reset(self) -> Any:
                obs, info = self.envs[0].reset(seed=self._seeds[0] if self._seeds else None)
                self._reset_seeds()
                self.reset_infos[0] = info
                return np.array([obs], dtype=object)

            def step_async(self, actions: Any) -> None:
                self._actions = actions

            def step_wait(self) -> Any:
                obs, reward, terminated, truncated, info = self.envs[0].step(str(self._actions[0]))
                done = terminated or truncated
                info["TimeLimit.truncated"] = truncated and not terminated
                if done:
                    info["terminal_observation"] = obs
                    obs, self.reset_infos[0] = self.envs[0].reset()
                return (np.array([obs], dtype=object), np.array([reward], dtype=np.float32),
                        np.array([done]), [info])

            def close(self) -> None:
                self.envs[0].close()

            def get_attr(self, attr_name: str, indices: Any = None) -> list[Any]:
                return [getattr(self.envs[0], attr_name)]

            def set_attr(self, attr_name: str, value: Any, indices: Any = None) -> None:
                setattr(self.envs[0], attr_name, value)

            def env_method(self, method_name: str, *args: Any, indices: Any = None, **kwargs: Any) -> list[Any]:
                return [getattr(self.envs[0], method_name)(*args, **kwargs)]

            def env_is_wrapped(self, wrapper_class: type, indices: Any = None) -> list[bool]:
                from stable_baselines3.common.env_util import is_wrapped

                return [is_wrapped(self.envs[0], wrapper_class)]

        return _TextVecEnv(env)
