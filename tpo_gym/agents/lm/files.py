"""A language-model agent's directory: its model, tokenizer and adapter, written and read safely (local files
only, no code run).

:mod:`tpo_gym.agents.common.persistence` owns the agent's schema and calls this module for what only a directory holds:
:func:`save_language_model_dir` writes ``model/`` (or ``adapter/``) and ``tokenizer/``; the allowlists of the
``from_pretrained`` / ``peft.LoraConfig`` settings such a file may carry, their checks, and the strict loading
of the saved model, tokenizer and LoRA adapter (every problem is an
:class:`~tpo_gym.agents.common.persistence.AgentFileError` naming the file).
"""

from __future__ import annotations

import pathlib
from typing import Any

import torch

from tpo_gym.agents.files.agent_files import write_agent_dir
from tpo_gym.agents.files.serialization import AgentFileError, decode_value

__all__ = ["resolve_dtype", "save_language_model_dir", "directory_policy_kwargs", "load_directory_model",
           "AGENT_MODEL_KWARGS", "AGENT_LORA_KWARGS", "agent_model_kwargs", "check_agent_model_kwargs",
           "check_agent_lora_kwargs", "load_agent_model", "load_agent_tokenizer", "load_agent_adapter"]


def resolve_dtype(name: str, device: Any) -> torch.dtype:
    """The torch dtype of the policy setting ``dtype`` (``"auto"``: bf16 on CUDA, fp32 elsewhere)."""
    if name not in ("auto", "float32", "bfloat16", "float64"):
        raise ValueError(f"dtype must be one of ['auto', 'float32', 'bfloat16', 'float64'], got {name!r}")
    if name == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}[name]


def _require_transformers() -> Any:
    """The ``transformers`` module, or an ``ImportError`` naming the extra to install."""
    try:
        import transformers
    except ImportError as exc:  # pragma: no cover - the llm extra is installed by make test
        raise ImportError(
            "CausalLMPolicy needs transformers: pip install 'tpo-gym[llm]' (transformers, peft, accelerate, gguf)"
        ) from exc
    return transformers


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


# --------------------------------------------------------------------------------------------
# a language-model agent's directory
# --------------------------------------------------------------------------------------------
def save_language_model_dir(policy: Any, path: Any, meta: dict[str, Any]) -> None:
    """A directory: ``model/`` (or ``adapter/`` with LoRA) by ``save_pretrained``, ``tokenizer/``, JSON."""
    lora = getattr(policy, "lora", None) is not None
    if lora and policy.model_spec is None:
        raise ValueError("a LoRA agent built on an in-memory model cannot be saved: pass the base model by hub "
                         "id or path (policy_kwargs={'model': ...}) so the file can name it")

    def save_model(directory: pathlib.Path) -> None:
        policy.model.save_pretrained(directory / ("adapter" if lora else "model"))
        policy.tokenizer.save_pretrained(directory / "tokenizer")

    write_agent_dir(path, meta, {"optimizer": policy.optimizer.state_dict()}, save_model)


def directory_policy_kwargs(root: pathlib.Path, saved: Any, given: Any) -> dict[str, Any]:
    """The policy settings of a language-model agent directory, before its model is loaded.

    The file's ``policy_kwargs`` with its ``model_kwargs`` and ``lora`` checked against the allowlists
    (:func:`check_agent_model_kwargs`, :func:`check_agent_lora_kwargs`)
    and without the ``model`` it may name (never loaded from a file), then the caller's ``policy_kwargs``
    key by key. The directory must hold ``model/`` (a whole model) or, with ``lora``, ``adapter/`` (and then
    the caller passes the base model).
    """
    pk = dict(decode_value(saved or {}, "kwargs.policy_kwargs"))
    given = dict(given or {})
    named = pk.pop("model", None)
    if "tokenizer" in pk:
        raise AgentFileError("field 'kwargs.policy_kwargs.tokenizer' is not valid: an agent directory "
                             "keeps its tokenizer in tokenizer/, never by name")
    if "model_kwargs" in pk and "model_kwargs" not in given:
        pk["model_kwargs"] = check_agent_model_kwargs(pk["model_kwargs"])
    if "lora" in pk and "lora" not in given:
        pk["lora"] = check_agent_lora_kwargs(pk["lora"])
    pk.update(given)
    lora = pk.get("lora") is not None
    if (root / "model").is_dir() == lora or (root / "adapter").is_dir() != lora:
        raise AgentFileError(
            f"{str(root)!r} must hold {'adapter/ (and no model/)' if lora else 'model/ (and no adapter/)'}: its "
            f"policy_kwargs {'set' if lora else 'do not set'} lora"
        )
    if not lora and "model" in given:
        raise ValueError(f"{str(root)!r} holds its model in model/: policy_kwargs={{'model': ...}} names the base "
                         "model of a LoRA directory only")
    if lora and pk.get("model") is None:
        raise AgentFileError(
            f"{str(root)!r} is a LoRA agent: only its adapter is saved, and the base model its file names "
            f"({named!r}) is not loaded from a file. Pass it yourself: load(path, policy_kwargs={{'model': {named!r}}})"
        )
    return pk


def load_directory_model(pk: dict[str, Any], device: Any, root: pathlib.Path, trust_remote_code: bool,
                         given: Any) -> None:
    """Put the model of ``model/`` (not for a LoRA directory: the caller passes its base model) and the tokenizer
    of ``tokenizer/`` into the policy settings ``pk``; local files only, no code run (see
    :func:`load_agent_model`)."""

    if pk.get("model") is None:
        field = "policy_kwargs" if "model_kwargs" in (given or {}) else "kwargs.policy_kwargs"
        mkw = check_agent_model_kwargs(pk.get("model_kwargs"), f"{field}.model_kwargs")
        try:
            dtype = resolve_dtype(pk.get("dtype", "auto"), device)
        except ValueError as exc:
            if "dtype" in (given or {}):
                raise
            raise AgentFileError(f"field 'kwargs.policy_kwargs.dtype' is not valid: {exc}") from None
        pk["model"] = load_agent_model(root / "model", mkw, dtype, trust_remote_code)
    if pk.get("tokenizer") is None:
        pk["tokenizer"] = load_agent_tokenizer(root / "tokenizer", trust_remote_code)
