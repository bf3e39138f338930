"""Safe save / load of the agents: plain JSON plus tensors read with ``weights_only=True``.

Stable-Baselines3 stores an agent's attributes as JSON whose non-JSON values are cloudpickled
(``":serialized:"`` fields), and unpickles them on load: a crafted file runs arbitrary code. A
tpo-gym agent file is a zip archive with exactly these entries, and loading executes nothing from it:

``tpo_gym.json``
    ``{"format": "tpo-gym-agent", "version": 1, "class": "TPO", "kwargs": {...}, "state": {...},
    "observation_space": {...}, "action_space": {...}, "tpo_gym_version": "..."}``: the constructor
    arguments as plain data (numbers, strings, lists, dicts; classes as ``{"__class__": "module:Name"}``
    restricted to torch and tpo_gym classes), the counters (``num_timesteps``, iteration, ...), the
    per-iteration ``history``, and the spaces described by their parameters.
``weights.pt``
    ``{"policy": state_dict, "optimizer": state_dict}``, read with ``torch.load(weights_only=True)``
    (tensors and plain containers only).

Every failure is an :class:`AgentFileError` naming the part that is wrong: not a zip / truncated, a
missing or repeated entry, an entry larger than its cap (:data:`MAX_JSON_BYTES`,
:data:`MAX_WEIGHTS_BYTES`, checked before it is read) or corrupt, a JSON entry that does not parse,
a field that is not plain data (an SB3 ``:serialized:`` value), a file written by another class, a
field missing, unknown or outside the schema ``save`` writes (:func:`check_agent_meta`, then the
agent's own constructor checks), weights that do not match the policy. A path is written atomically
through :func:`tpo_gym._io.atomic_writer`.
"""
from __future__ import annotations

import inspect
import math
import pathlib
import re
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from tpo_gym._validation import check_int
from tpo_gym.agents.common.sb3_conventions import check_n_threads, check_tensorboard_log
from tpo_gym.agents.files.agent_files import (
    FORMAT,
    JSON_ENTRY,
    MAX_JSON_BYTES,
    MAX_WEIGHTS_BYTES,
    OPTIMIZER_ENTRY,
    VERSION,
    WEIGHTS_ENTRY,
    read_agent_dir,
    read_agent_file,
    write_agent_dir,
    write_agent_file,
)
from tpo_gym.agents.files.serialization import (
    ALLOWED_MODULES,
    SPACE_FIELDS,
    AgentFileError,
    check_plain,
    class_from_name,
    class_to_name,
    decode_value,
    encode_value,
    schedule_from_data,
    schedule_to_data,
    space_from_data,
    space_to_data,
)
from tpo_gym.agents.lm.files import (
    agent_model_kwargs,
    directory_policy_kwargs,
    load_agent_adapter,
    load_directory_model,
    save_language_model_dir,
)

__all__ = [
    # the agent's schema (this module)
    "save_agent", "load_agent", "agent_meta", "agent_settings", "setting_names", "check_agent_meta", "setting_error",
    "check_space_sizes", "package_version", "META_FIELDS", "STATE_FIELDS", "NOT_SETTINGS",
    # re-exported: the containers (agent_files) and the plain-data encodings (serialization)
    "AgentFileError", "FORMAT", "VERSION", "JSON_ENTRY", "WEIGHTS_ENTRY", "OPTIMIZER_ENTRY", "MAX_JSON_BYTES",
    "MAX_WEIGHTS_BYTES", "ALLOWED_MODULES", "read_agent_file", "write_agent_file", "read_agent_dir", "write_agent_dir",
    "space_to_data", "space_from_data", "class_to_name", "class_from_name", "encode_value", "decode_value",
    "check_plain", "schedule_to_data", "schedule_from_data", "SPACE_FIELDS",
]


# --------------------------------------------------------------------------------------------
# the schema of tpo_gym.json
# --------------------------------------------------------------------------------------------
#: The top-level fields :meth:`GroupAlgorithm.save` writes.
META_FIELDS = ("format", "version", "class", "policy", "kwargs", "observation_space", "action_space", "state",
               "tpo_gym_version")
#: The counters of ``state``: integers >= 0.
STATE_COUNTERS = ("num_timesteps", "n_updates", "iteration", "rollout_index")
#: The fields of ``state``.
STATE_FIELDS = (*STATE_COUNTERS, "base_seed", "history")


def _field_check(field: str, check: Callable[..., Any], value: Any, *args: Any) -> Any:
    try:
        return check(field, value, *args)
    except (ValueError, OverflowError) as exc:
        raise AgentFileError(f"field {field!r} is not valid: {exc}") from None


def check_agent_meta(meta: dict[str, Any], settings: Iterable[str], given: Iterable[str] = ()) -> None:
    """Check an agent description against the schema :meth:`~tpo_gym.agents.GroupAlgorithm.save` writes.

    Exactly the fields of :data:`META_FIELDS`; ``kwargs`` a dict holding every name of ``settings``
    (the constructor arguments saved; those in ``given``, passed by the caller, may be absent) and
    no other; the settings no constructor checks (``verbose`` an integer >= 0, ``policy_kwargs`` a
    dict, ``tensorboard_log`` a string or null, and as the constructor checks them ``tensorboard_log`` a sane path,
    ``n_threads`` null or an integer in ``[1, MAX_THREADS]``); ``state`` exactly :data:`STATE_FIELDS`: the counters
    integers >= 0, ``base_seed`` an integer in ``[0, 2**63 - 1]``, ``history`` a list of dicts of
    plain values. The remaining settings are checked by the agent's constructor.

    :raises AgentFileError: naming the first bad field and what it must be.
    """
    missing = [f for f in META_FIELDS if f not in meta]
    unknown = sorted(set(meta) - set(META_FIELDS))
    if missing or unknown:
        raise AgentFileError(f"the file lacks the fields {missing}" if missing else
                             f"the file has unexpected fields {unknown}")
    if not isinstance(meta["tpo_gym_version"], str):
        raise AgentFileError(f"field 'tpo_gym_version' must be a string, got {meta['tpo_gym_version']!r:.80}")
    kwargs = meta["kwargs"]
    if not isinstance(kwargs, dict):
        raise AgentFileError(f"field 'kwargs' must be a dict of settings, got {kwargs!r:.80}")
    settings = list(settings)
    extra = sorted(set(kwargs) - set(settings))
    if extra:
        raise AgentFileError(f"field 'kwargs' has settings {extra} that {meta['class']} does not take")
    given = set(given)
    absent = [name for name in settings if name not in kwargs and name not in given]
    if absent:
        raise AgentFileError(f"field 'kwargs' lacks the settings {absent} (a saved agent holds all of {settings})")
    if "verbose" in kwargs:
        _field_check("kwargs.verbose", check_int, kwargs["verbose"], 0)
    if kwargs.get("policy_kwargs") is not None and not isinstance(kwargs["policy_kwargs"], dict):
        raise AgentFileError(f"field 'kwargs.policy_kwargs' must be a dict, got {kwargs['policy_kwargs']!r:.80}")
    if kwargs.get("tensorboard_log") is not None and not isinstance(kwargs["tensorboard_log"], str):
        raise AgentFileError(f"field 'kwargs.tensorboard_log' must be a string or null, got "
                             f"{kwargs['tensorboard_log']!r:.80}")
    for name, check in (("tensorboard_log", check_tensorboard_log), ("n_threads", check_n_threads)):
        if name in kwargs:  # as the constructor checks them, named as the file's fields
            _field_check(f"kwargs.{name}", lambda _field, value, check=check: check(value), kwargs[name])
    state = meta["state"]
    if not isinstance(state, dict) or set(state) != set(STATE_FIELDS):
        shown = sorted(state) if isinstance(state, dict) else repr(state)[:80]
        raise AgentFileError(f"field 'state' must hold exactly the fields {sorted(STATE_FIELDS)}, got {shown}")
    for name in STATE_COUNTERS:
        _field_check(f"state.{name}", check_int, state[name], 0)
    _field_check("state.base_seed", check_int, state["base_seed"], 0)
    history = state["history"]
    if not isinstance(history, list):
        raise AgentFileError(f"field 'state.history' must be a list of dicts, got {history!r:.80}")
    for i, record in enumerate(history):
        if not isinstance(record, dict) or not all(
            isinstance(v, (int, float, str, bool)) or v is None for v in record.values()
        ):
            raise AgentFileError(f"field 'state.history[{i}]' must be a dict of numbers and strings, "
                                 f"got {record!r:.80}")


def setting_error(exc: Exception, settings: Iterable[str], given: Iterable[str] = (),
                  prefix: str = "kwargs") -> AgentFileError | None:
    """The :class:`AgentFileError` for a ``ValueError`` / ``TypeError`` raised while an agent is built from a file.

    It names ``<prefix>.<name>`` for the one of ``settings`` (from the file) or ``given`` (passed by the
    caller) that the message mentions first, or ``<prefix>`` when it mentions none. ``None`` when that
    name is one of ``given`` (the caller's own error, raised as it is) or ``exc`` already is an
    :class:`AgentFileError`.
    """
    if isinstance(exc, AgentFileError):
        return None
    text, given = str(exc), set(given)
    found = ((re.search(rf"\b{re.escape(name)}\b", text), name) for name in {*settings, *given})
    named = sorted((m.start(), name) for m, name in found if m)
    if named and named[0][1] in given:
        return None
    field = f"{prefix}.{named[0][1]}" if named else prefix
    return AgentFileError(f"field {field!r} is not valid: {text}")


def check_space_sizes(observation_space: spaces.Space, action_space: spaces.Space, weights: dict[str, Any]) -> None:
    """Refuse a Discrete / MultiDiscrete / MultiBinary space larger than the saved policy weights allow.

    A policy holds at least one parameter per action logit and per input category (a one-hot input
    width, an embedding row), so a space size above the number of saved policy parameters cannot
    come from ``save``; checking it before the policy is built keeps a small file from allocating a
    huge layer.
    """
    policy = weights.get("policy")
    if not isinstance(policy, dict) or not all(isinstance(v, torch.Tensor) for v in policy.values()):
        raise AgentFileError(f"entry {WEIGHTS_ENTRY!r}: 'policy' must be a dict of tensors (a state_dict)")
    numel = sum(v.numel() for v in policy.values())
    for field, space in (("observation_space", observation_space), ("action_space", action_space)):
        if isinstance(space, spaces.MultiDiscrete):
            field, size = f"{field}.nvec", int(space.nvec.max()) if space.nvec.size else 0
        elif isinstance(space, (spaces.Discrete, spaces.MultiBinary)):
            field, size = f"{field}.n", math.prod(np.atleast_1d(space.n).tolist())
        else:
            continue
        if size > numel:
            raise AgentFileError(f"field {field!r} describes a space of size {size:,}, more than the {numel:,} saved "
                                 "policy parameters can serve")


# --------------------------------------------------------------------------------------------
# an agent's file: what save writes, what load reads back
# --------------------------------------------------------------------------------------------
#: Constructor arguments that are not saved as settings (the env, the device and the build flag).
NOT_SETTINGS = ("self", "policy", "env", "device", "_init_setup_model")


def setting_names(agent_class: type) -> list[str]:
    """The constructor arguments of ``agent_class`` that its file holds as settings."""
    return [n for n in inspect.signature(agent_class.__init__).parameters if n not in NOT_SETTINGS]


def agent_settings(agent: Any) -> dict[str, Any]:
    """The constructor arguments of ``agent`` as they stand (``level`` resolved), as plain data.

    A language model's ``policy_kwargs`` lose the in-memory model and tokenizer (the directory holds them),
    keep only the ``model_kwargs`` a file may set, and name the base model of a LoRA agent.
    """
    out: dict[str, Any] = {}
    for name in setting_names(type(agent)):
        value = getattr(agent, name)
        if name == "learning_rate":
            value = schedule_to_data(value)
        elif name == "tensorboard_log" and value is not None:
            value = str(value)
        elif name == "policy_kwargs" and agent.is_text:
            value = {k: v for k, v in value.items() if k not in ("model", "tokenizer")}
            if value.get("model_kwargs") is not None:  # only what load accepts from a file
                value["model_kwargs"] = agent_model_kwargs(value["model_kwargs"])
            if getattr(agent.policy, "lora", None) is not None:
                value["model"] = str(agent.policy.model_spec)  # the base model; the adapter is saved
        out[name] = encode_value(value, f"kwargs.{name}")
    return out


def package_version() -> str:
    """The installed tpo-gym version (``"unknown"`` for a checkout that is not installed)."""
    try:
        from importlib.metadata import version

        return version("tpo-gym")
    except Exception:  # noqa: BLE001 - an uninstalled checkout has no metadata
        return "unknown"


def agent_meta(agent: Any) -> dict[str, Any]:
    """The ``tpo_gym.json`` description of ``agent`` (:data:`META_FIELDS` but ``format`` / ``version``)."""
    policy_class = agent.policy_class
    alias = next((k for k, v in agent.policy_aliases.items() if v is policy_class), None)
    return {
        "class": type(agent).__name__,
        "policy": alias if alias is not None else {"__class__": class_to_name(policy_class)},
        "kwargs": agent_settings(agent),
        "observation_space": space_to_data(agent.observation_space),
        "action_space": space_to_data(agent.action_space),
        "state": agent.training_state(),
        "tpo_gym_version": package_version(),
    }


def save_agent(agent: Any, path: Any) -> None:
    """Write ``agent``: a zip (JSON + ``weights_only`` tensors) or, for a language model, a directory."""
    meta = agent_meta(agent)
    if agent.is_text:
        save_language_model_dir(agent.policy, path, meta)
        return
    # clones: in a SeedBatch the parameters are views of the stacked [S, ...] tensors (a view saves all S)
    policy_state = {k: v.detach().clone() for k, v in agent.policy.state_dict().items()}
    write_agent_file(path, meta, {"policy": policy_state, "optimizer": agent.policy.optimizer.state_dict()})


def _policy_from_data(target: type, data: Any) -> Any:
    from tpo_gym.agents.policies.categorical import CategoricalPolicy

    if isinstance(data, str):
        if data not in target.policy_aliases:  # type: ignore[attr-defined]
            raise AgentFileError(f"field 'policy' names an unknown alias {data!r}")
        return data
    if isinstance(data, dict) and set(data) == {"__class__"}:
        return class_from_name(data["__class__"], "policy", (CategoricalPolicy,))
    raise AgentFileError(f"field 'policy' must be a policy alias or a class name, got {data!r}")


def load_agent(cls: type, path: Any, env: Any, device: Any, overrides: dict[str, Any],
               trust_remote_code: bool) -> Any:
    """The agent saved at ``path`` (see ``GroupAlgorithm.load``); nothing in the file is executed.

    ``cls`` is the class ``load`` was called on: a base class without a spec (``GroupAlgorithm``) loads whichever
    registered class the file holds, any other class only its own files. ``overrides`` replace the file's settings.
    """
    from tpo_gym.agents.common.env_setup import resolve_env
    from tpo_gym.agents.common.registry import algorithm_class
    from tpo_gym.agents.common.spec import AlgorithmSpec
    from tpo_gym.agents.lm.policy import CausalLMPolicy

    directory = isinstance(path, (str, pathlib.Path)) and pathlib.Path(path).is_dir()
    meta, weights = read_agent_dir(path) if directory else read_agent_file(path, device="cpu")
    stored = meta.get("class")
    target = cls
    if not isinstance(getattr(cls, "spec", None), AlgorithmSpec):  # a base class: whichever agent the file holds
        try:
            target = algorithm_class(str(stored))
        except ValueError:
            raise AgentFileError(f"the file holds an unknown agent class {stored!r}") from None
    elif stored != cls.__name__:
        raise AgentFileError(
            f"the file holds a {stored} agent, not {cls.__name__}: use {stored}.load (or GroupAlgorithm.load)"
        )
    overrides = dict(overrides)
    check_agent_meta(meta, setting_names(target), given=overrides)  # the schema save writes, field by field
    settings = meta["kwargs"]
    decoded = {k: decode_value(v, f"kwargs.{k}") for k, v in settings.items() if k not in overrides}
    if "learning_rate" in decoded:
        decoded["learning_rate"] = schedule_from_data(settings["learning_rate"])
    policy = overrides.pop("policy", None) or _policy_from_data(target, meta.get("policy"))
    decoded.update(overrides)
    policy_class = target.policy_aliases.get(policy, policy) if isinstance(policy, str) else policy  # type: ignore[attr-defined]
    if directory != (isinstance(policy_class, type) and issubclass(policy_class, CausalLMPolicy)):
        raise AgentFileError(
            f"{str(path)!r} is a directory, which only a language-model agent (CausalLMPolicy) is saved as; "
            f"its policy is {policy!r}" if directory else
            "the file names a language-model agent (CausalLMPolicy), which is saved as a directory (model/, "
            "tokenizer/, tpo_gym.json), never as a zip: a zip does not load a language model"
        )
    if directory:
        decoded["policy_kwargs"] = directory_policy_kwargs(pathlib.Path(path), settings.get("policy_kwargs"),
                                                           overrides.get("policy_kwargs"))
    obs_space = space_from_data(meta.get("observation_space"), "observation_space")
    act_space = space_from_data(meta.get("action_space"), "action_space")
    if not directory:
        check_space_sizes(obs_space, act_space, weights)
    try:  # the constructor checks each setting: a bad one from the file is the file's error
        model = target(policy, None, device="cpu" if device == "auto" else device, _init_setup_model=False,
                       **decoded)
    except (ValueError, TypeError) as exc:
        error = setting_error(exc, settings, given=overrides)
        if error is None:
            raise
        raise error from None
    if model.sampling == "group" and model.group_size < 2 and "group_size" not in overrides:
        raise AgentFileError(f"field 'kwargs.group_size' is not valid: {target.__name__} compares K "
                             f"candidates per context, K must be >= 2, got {model.group_size}")
    if directory:
        load_directory_model(model.policy_kwargs, model.device, pathlib.Path(path), trust_remote_code,
                             overrides.get("policy_kwargs"))
    model.observation_space, model.action_space = obs_space, act_space
    if env is not None:
        env_obj, _ = resolve_env(env, target.__name__)
        assert env_obj is not None
        from stable_baselines3.common.utils import check_for_correct_spaces

        check_for_correct_spaces(env_obj, obs_space, act_space)
        model.set_env(env)
    try:  # the policy checks its own settings (policy_kwargs) and the spaces
        model.build_policy()
    except (ValueError, TypeError) as exc:
        error = setting_error(exc, settings.get("policy_kwargs") or {}, prefix="kwargs.policy_kwargs")
        if error is None or not overrides.keys().isdisjoint(("policy", "policy_kwargs")):
            raise
        raise error from None
    try:
        if directory:
            if model.policy.lora is not None:
                load_agent_adapter(model.policy.model, pathlib.Path(path) / "adapter")
        else:
            model.policy.load_state_dict(weights["policy"])
        if weights.get("optimizer"):
            model.policy.optimizer.load_state_dict(weights["optimizer"])
    except AgentFileError:
        raise
    except (RuntimeError, ValueError, KeyError, TypeError) as exc:
        raise AgentFileError(f"the weights in the file do not fit the policy ({exc})") from None
    model.set_training_state(meta["state"])  # checked by check_agent_meta
    return model
