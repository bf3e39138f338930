"""A language-model agent directory loads safely: no code run, no network, strict weights, clear errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.agents.lm_toys import lm_kwargs, say_letter_env, tiny_llama, tiny_tokenizer
from tpo_gym import TPO
from tpo_gym.agents import persistence
from tpo_gym.agents.persistence import AgentFileError

PROMPTS = ["say a", "say b"]


def _agent(**policy: Any) -> TPO:
    return TPO("CausalLMPolicy", say_letter_env(), batch_size=4, group_size=4, seed=0,
               policy_kwargs={**lm_kwargs(), **policy})


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("saved") / "agent"
    _agent().save(path)
    return path


@pytest.fixture
def agent_dir(saved: Path, tmp_path: Path) -> Path:
    """A fresh copy of a saved (untrained) tiny LM agent, free to tamper with."""
    return Path(shutil.copytree(saved, tmp_path / "agent"))


def _edit_json(path: Path, edit: Any) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _set_model_kwargs(directory: Path, model_kwargs: dict[str, Any]) -> None:
    _edit_json(directory / "tpo_gym.json", lambda m: m["kwargs"]["policy_kwargs"].update(model_kwargs=model_kwargs))


def _plant_code(directory: Path, module: str, marker: Path) -> None:
    (directory / f"{module}.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
        "from transformers import LlamaConfig, PreTrainedTokenizerFast\n"
        "class EvilConfig(LlamaConfig):\n    pass\n"
        "class EvilTokenizer(PreTrainedTokenizerFast):\n    pass\n"
    )


# --------------------------------------------------------------------------------------------
# 1. no code, no network
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key, value", [
    ("trust_remote_code", True), ("code_revision", "main"), ("revision", "main"), ("token", "hf_x"),
    ("cache_dir", "/tmp"), ("local_files_only", False), ("gguf_file", "x.gguf"), ("use_kernels", True),
    ("attn_implementation", "kernels-community/flash-attn"),
])
def test_load_refuses_code_or_network_settings_in_model_kwargs(agent_dir: Path, tmp_path: Path, key: str,
                                                               value: Any) -> None:
    marker = tmp_path / "marker"
    _edit_json(agent_dir / "model" / "config.json",
               lambda c: c.update(auto_map={"AutoConfig": "configuration_evil.EvilConfig"}))
    _plant_code(agent_dir / "model", "configuration_evil", marker)
    _set_model_kwargs(agent_dir, {key: value})
    with pytest.raises(AgentFileError, match=f"model_kwargs.*{key}"):
        TPO.load(agent_dir)
    assert not marker.exists()


def test_load_never_imports_code_that_config_or_tokenizer_files_name(agent_dir: Path, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    _edit_json(agent_dir / "model" / "config.json", lambda c: c.update(auto_map={
        "AutoConfig": "configuration_evil.EvilConfig", "AutoModelForCausalLM": "configuration_evil.EvilConfig"}))
    _plant_code(agent_dir / "model", "configuration_evil", marker)
    assert TPO.load(agent_dir).predict(PROMPTS, deterministic=True)[0].shape == (2,)  # auto_map ignored
    _edit_json(agent_dir / "tokenizer" / "tokenizer_config.json", lambda c: c.update(
        tokenizer_class="EvilTokenizer", auto_map={"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}))
    _plant_code(agent_dir / "tokenizer", "tokenization_evil", marker)
    with pytest.raises(AgentFileError, match="tokenizer.*does not hold a loadable tokenizer"):
        TPO.load(agent_dir)
    assert not marker.exists()


def test_trust_remote_code_is_only_the_callers_argument(agent_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers

    calls: list[tuple[str, dict[str, Any]]] = []
    for name in ("AutoConfig", "AutoModelForCausalLM", "AutoTokenizer"):
        auto = getattr(transformers, name)
        original = auto.from_pretrained

        def record(*args: Any, _name: str = name, _original: Any = original, **kwargs: Any) -> Any:
            calls.append((_name, kwargs))
            return _original(*args, **kwargs)

        monkeypatch.setattr(auto, "from_pretrained", record)
    for trust in (False, True):
        calls.clear()
        TPO.load(agent_dir, **({"trust_remote_code": True} if trust else {}))
        assert sorted({c[0] for c in calls}) == ["AutoConfig", "AutoModelForCausalLM", "AutoTokenizer"]
        assert all(kw["trust_remote_code"] is trust and kw["local_files_only"] is True for _, kw in calls)
    with pytest.raises(ValueError, match="trust_remote_code must be True or False"):
        TPO.load(agent_dir, trust_remote_code="yes")


def test_save_keeps_only_the_model_kwargs_a_file_may_set(tmp_path: Path) -> None:
    model = _agent(model_kwargs={"revision": "main", "attn_implementation": "eager", "trust_remote_code": True})
    model.save(tmp_path / "agent")
    meta = json.loads((tmp_path / "agent" / "tpo_gym.json").read_text())
    assert meta["kwargs"]["policy_kwargs"]["model_kwargs"] == {"attn_implementation": "eager"}
    assert TPO.load(tmp_path / "agent").policy.model_kwargs == {"attn_implementation": "eager"}


def _save_base(tmp_path: Path) -> Path:
    base = tmp_path / "base"
    tiny_llama().save_pretrained(base)
    tiny_tokenizer().save_pretrained(base)
    return base


def test_lora_directory_loads_its_base_model_only_when_the_caller_passes_it(tmp_path: Path) -> None:
    base = _save_base(tmp_path)
    model = TPO("CausalLMPolicy", say_letter_env(), batch_size=4, group_size=4, seed=0, learning_rate=1e-2,
                policy_kwargs={"model": str(base), "lora": {"r": 2}, "max_new_tokens": 4})
    model.learn(model.steps_per_iteration)
    model.save(tmp_path / "agent")
    assert not (tmp_path / "agent" / "model").exists() and (tmp_path / "agent" / "adapter").is_dir()
    with pytest.raises(AgentFileError, match=r"base model .* is not loaded from a file.*policy_kwargs=\{'model'"):
        TPO.load(tmp_path / "agent")
    loaded = TPO.load(tmp_path / "agent", policy_kwargs={"model": str(base)})
    assert loaded.policy.lora == {"r": 2}  # the file's other policy settings stay
    expected = model.predict(PROMPTS, deterministic=True)[0].tolist()
    assert loaded.predict(PROMPTS, deterministic=True)[0].tolist() == expected
    _edit_json(tmp_path / "agent" / "tpo_gym.json",
               lambda m: m["kwargs"]["policy_kwargs"]["lora"].update(megatron_core="os"))
    with pytest.raises(AgentFileError, match=r"policy_kwargs\.lora holds \['megatron_core'\]"):
        TPO.load(tmp_path / "agent", policy_kwargs={"model": str(base)})


def test_a_whole_model_directory_loads_only_its_own_model(agent_dir: Path) -> None:
    with pytest.raises(ValueError, match="holds its model in model/"):
        TPO.load(agent_dir, policy_kwargs={"model": "some/hub-model"})


def test_a_zip_never_loads_a_language_model(agent_dir: Path, tmp_path: Path) -> None:
    meta = json.loads((agent_dir / "tpo_gym.json").read_text())
    meta["kwargs"]["policy_kwargs"]["model"] = str(agent_dir / "model")
    meta.pop("format"), meta.pop("version")
    persistence.write_agent_file(tmp_path / "lm.zip", meta, {"policy": {}, "optimizer": {}})
    with pytest.raises(AgentFileError, match="saved as a directory .* never as a zip"):
        TPO.load(tmp_path / "lm.zip")


# --------------------------------------------------------------------------------------------
# 2. damaged directories: one clear error naming the file
# --------------------------------------------------------------------------------------------
def _truncate(d: Path) -> None:
    f = d / "model" / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _bad_header(d: Path) -> None:
    f = d / "model" / "model.safetensors"
    f.write_bytes(b"\xff" * 8 + b"{not json" + f.read_bytes()[17:])


def _outside_link(d: Path) -> None:
    f = d / "model" / "model.safetensors"
    outside = d.parent / "elsewhere.safetensors"
    shutil.copy(f, outside)
    f.unlink()
    f.symlink_to(outside)


def _optimizer_dir(d: Path) -> None:
    (d / "optimizer.pt").unlink()
    (d / "optimizer.pt").mkdir()


DAMAGE = {
    "truncated weights": (_truncate, r"model\.safetensors' is not a valid safetensors file"),
    "empty weights": (lambda d: (d / "model" / "model.safetensors").write_bytes(b""),
                      r"model\.safetensors' is not a valid safetensors file"),
    "bad header": (_bad_header, r"model\.safetensors' is not a valid safetensors file"),
    "weights linked outside": (_outside_link, r"model\.safetensors' is a symbolic link"),
    "config not JSON": (lambda d: (d / "model" / "config.json").write_text("{not json"),
                        r"config\.json' is not a valid model configuration"),
    "negative vocab_size": (lambda d: _edit_json(d / "model" / "config.json", lambda c: c.update(vocab_size=-1)),
                            r"config\.json': vocab_size must be a positive integer, got -1"),
    "hub attention kernel in config": (
        lambda d: _edit_json(d / "model" / "config.json",
                             lambda c: c.update(attn_implementation="kernels-community/flash-attn")),
        r"config\.json' names the attention implementation 'kernels-community/flash-attn'"),
    "optimizer is a directory": (_optimizer_dir, r"optimizer\.pt' is not a regular file"),
    "optimizer missing": (lambda d: (d / "optimizer.pt").unlink(), r"has no 'optimizer\.pt'"),
    "tokenizer missing": (lambda d: shutil.rmtree(d / "tokenizer"), "has no tokenizer at"),
    "tokenizer not JSON": (lambda d: (d / "tokenizer" / "tokenizer.json").write_text("{not json"),
                           "tokenizer' does not hold a loadable tokenizer"),
    "model missing": (lambda d: shutil.rmtree(d / "model"), r"must hold model/ \(and no adapter/\)"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_directory_raises_an_agent_file_error_naming_the_file(agent_dir: Path, damage: str) -> None:
    tamper, message = DAMAGE[damage]
    tamper(agent_dir)
    with pytest.raises(AgentFileError, match=message):
        TPO.load(agent_dir)


# --------------------------------------------------------------------------------------------
# 3. strict weights
# --------------------------------------------------------------------------------------------
def _rewrite_weights(path: Path, edit: Any) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(str(path))
    edit(state)
    save_file(state, str(path), metadata={"format": "pt"})


@pytest.mark.parametrize("edit, message", [
    (lambda s: s.pop("lm_head.weight"), r"missing \['lm_head\.weight'\]"),
    (lambda s: s.update({"extra.weight": torch.zeros(2)}), r"unexpected \['extra\.weight'\]"),
])
def test_model_weights_load_strictly(agent_dir: Path, edit: Any, message: str) -> None:
    _rewrite_weights(agent_dir / "model" / "model.safetensors", edit)
    with pytest.raises(AgentFileError, match=message):
        TPO.load(agent_dir)


def test_tied_embeddings_are_not_a_missing_weight(tmp_path: Path) -> None:
    net = tiny_llama()
    net.config.tie_word_embeddings = True
    net.tie_weights()
    model = _agent(model=net)
    model.save(tmp_path / "agent")
    expected = model.predict(PROMPTS, deterministic=True)[0].tolist()
    assert TPO.load(tmp_path / "agent").predict(PROMPTS, deterministic=True)[0].tolist() == expected


def test_adapter_weights_load_strictly(tmp_path: Path) -> None:
    base = _save_base(tmp_path)
    TPO("CausalLMPolicy", say_letter_env(), batch_size=4, group_size=4, seed=0,
        policy_kwargs={"model": str(base), "lora": {"r": 2}, "max_new_tokens": 4}).save(tmp_path / "agent")
    adapter = tmp_path / "agent" / "adapter" / "adapter_model.safetensors"
    dropped: list[str] = []
    _rewrite_weights(adapter, lambda s: dropped.append(sorted(s)[0]) or s.pop(dropped[0]))
    with pytest.raises(AgentFileError, match=rf"adapter_model\.safetensors.*missing \['{dropped[0]}'\]"):
        TPO.load(tmp_path / "agent", policy_kwargs={"model": str(base)})
    _rewrite_weights(adapter, lambda s: s.update({dropped[0]: torch.zeros(1), "extra.lora_A.weight": torch.zeros(1)}))
    with pytest.raises(AgentFileError, match=r"unexpected \['extra\.lora_A\.weight'\]"):
        TPO.load(tmp_path / "agent", policy_kwargs={"model": str(base)})


# --------------------------------------------------------------------------------------------
# 4. writes follow no planted link
# --------------------------------------------------------------------------------------------
def test_save_follows_no_link_planted_at_a_temporary_name(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine")
    (tmp_path / ".agent.tmp").symlink_to(victim)
    (tmp_path / ".agent.old").symlink_to(victim)
    model = _agent()
    model.save(tmp_path / "agent")
    model.save(tmp_path / "agent")  # over an existing agent
    assert sorted(p.name for p in victim.iterdir()) == ["keep.txt"] and (victim / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".agent.old", ".agent.tmp", "agent", "victim"]
    expected = model.predict(PROMPTS, deterministic=True)[0].tolist()
    assert TPO.load(tmp_path / "agent").predict(PROMPTS, deterministic=True)[0].tolist() == expected
