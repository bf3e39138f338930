"""tpo_gym.agents.common.persistence: save / load of agent zips and language-model directories.

Exact resumption and bit-identical reruns; files load safely: no code run, no network, bounded reads,
strict weights, one clear error naming the damaged or edited field or file."""

from __future__ import annotations

import io
import json
import pickle
import shutil
import struct
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from stable_baselines3.common.utils import LinearSchedule

from tests.agents.conftest import Boom, bandit_env, params_of, small_tpo, token_env
from tests.agents.lm_toys import lm_kwargs, say_letter_env, tiny_llama, tiny_tokenizer
from tpo_gym import GRPO, TPO
from tpo_gym.agents import GroupAlgorithm, agent_files, persistence
from tpo_gym.agents.common.persistence import AgentFileError


def _make_tpo(**kw: Any) -> TPO:
    return TPO("TransformerPolicy", token_env(length=3), batch_size=16, seed=5, **kw)


def test_save_load_predict_identical(tmp_path: Path) -> None:
    model = _make_tpo()
    model.learn(3 * model.steps_per_iteration)
    obs = np.stack([token_env(length=3).reset(seed=s)[0] for s in range(20)])
    actions, _ = model.predict(obs, deterministic=True)
    model.save(tmp_path / "tpo.zip")
    loaded = TPO.load(tmp_path / "tpo.zip")
    again, _ = loaded.predict(obs, deterministic=True)
    np.testing.assert_array_equal(actions, again)
    for k, v in params_of(model).items():
        torch.testing.assert_close(params_of(loaded)[k], v, rtol=0, atol=0)
    assert loaded.history == model.history
    assert loaded.eta == model.eta and loaded.level == "token"


@pytest.mark.parametrize("make", [_make_tpo, lambda: GRPO("MlpPolicy", bandit_env(), batch_size=16, seed=2)])
def test_resume_equals_uninterrupted(tmp_path: Path, make: Any) -> None:
    straight = make()
    n = 3 * straight.steps_per_iteration
    straight.learn(2 * n)

    first = make()
    first.learn(n)
    first.save(tmp_path / "half.zip")
    env = first.get_env()
    resumed = type(first).load(tmp_path / "half.zip", env=env)
    resumed.learn(n, reset_num_timesteps=False)

    assert [h["iteration"] for h in resumed.history] == list(range(6))
    assert resumed.history == straight.history
    assert resumed.num_timesteps == straight.num_timesteps
    for k, v in params_of(straight).items():
        torch.testing.assert_close(params_of(resumed)[k], v, rtol=0, atol=0)


def test_same_seed_bit_identical_curves() -> None:
    runs = []
    for _ in range(2):
        model = _make_tpo()
        model.learn(4 * model.steps_per_iteration)
        runs.append((model.history, params_of(model)))
    assert runs[0][0] == runs[1][0]
    for k in runs[0][1]:
        assert torch.equal(runs[0][1][k], runs[1][1][k])
    other = _make_tpo()
    other.set_random_seed(6)
    other.learn(4 * other.steps_per_iteration)
    assert other.history != runs[0][0]


def test_optimizer_state_is_saved(tmp_path: Path) -> None:
    model = _make_tpo()
    model.learn(model.steps_per_iteration)
    model.save(tmp_path / "m.zip")
    loaded = TPO.load(tmp_path / "m.zip")
    saved = model.policy.optimizer.state_dict()["optimizers"]
    restored = loaded.policy.optimizer.state_dict()["optimizers"]
    assert len(saved) == 2  # Muon + AdamW
    for a, b in zip(saved, restored, strict=True):
        for key in a["state"]:
            for name, value in a["state"][key].items():
                if isinstance(value, torch.Tensor):
                    assert torch.equal(value, b["state"][key][name])


# ---------------------------------------------------------------------------------------------
# damaged or edited zips: atomic writes, bounded reads, one clear error naming what is wrong
# ---------------------------------------------------------------------------------------------
def _entries(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def _write_zip(path: Path, entries: list[tuple[str, bytes]]) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about a repeated name: that is the point of some tests
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            for name, data in entries:
                zf.writestr(name, data)
    return path


def test_save_never_follows_a_link_planted_at_a_temp_name(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (tmp_path / ".m.zip.tmp").symlink_to(victim)
    model = small_tpo()
    model.save(tmp_path / "m.zip")
    assert victim.read_text() == "keep me"
    assert (tmp_path / ".m.zip.tmp").is_symlink()
    loaded = TPO.load(tmp_path / "m.zip")
    for k, v in params_of(model).items():
        assert torch.equal(params_of(loaded)[k], v)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".m.zip.tmp", "m.zip", "victim.txt"]  # no temp left


def test_save_to_a_file_object_round_trips() -> None:
    model = small_tpo()
    buffer = io.BytesIO()
    model.save(buffer)
    buffer.seek(0)
    loaded = TPO.load(buffer)
    for k, v in params_of(model).items():
        assert torch.equal(params_of(loaded)[k], v)


def test_an_oversized_json_entry_is_refused_before_it_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:

    model = small_tpo()
    model.save(tmp_path / "m.zip")
    entries = _entries(tmp_path / "m.zip")
    padded = entries["tpo_gym.json"] + b" " * (3 * 2**20)  # valid JSON: 3 MB of whitespace after the object
    path = _write_zip(tmp_path / "big.zip", [("tpo_gym.json", padded), ("weights.pt", entries["weights.pt"])])
    monkeypatch.setattr(agent_files, "MAX_JSON_BYTES", 2**20)
    opened: list[str] = []
    real_open = zipfile.ZipFile.open

    def spy(self: zipfile.ZipFile, name: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(getattr(name, "filename", name))
        return real_open(self, name, *args, **kwargs)

    monkeypatch.setattr(zipfile.ZipFile, "open", spy)
    with pytest.raises(AgentFileError, match=r"'tpo_gym\.json' is larger than its limit of 1,048,576 bytes"):
        TPO.load(path)
    assert "tpo_gym.json" not in opened  # refused from the size in the header, nothing decompressed


def test_an_entry_whose_header_understates_its_size_is_refused(tmp_path: Path) -> None:
    model = small_tpo()
    model.save(tmp_path / "m.zip")
    entries = _entries(tmp_path / "m.zip")
    path = _write_zip(tmp_path / "lie.zip", [("tpo_gym.json", entries["tpo_gym.json"]),
                                              ("weights.pt", entries["weights.pt"])])
    raw = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo("tpo_gym.json")
    central = raw.index(b"PK\x01\x02")  # the first central directory record is the JSON entry's
    for at in (info.header_offset + 22, central + 24):  # uncompressed size: local header, central directory
        assert raw[at:at + 4] == struct.pack("<I", info.file_size)
        raw[at:at + 4] = struct.pack("<I", 10)
    path.write_bytes(bytes(raw))
    with pytest.raises(AgentFileError, match="'tpo_gym.json' is corrupt"):
        TPO.load(path)


def test_repeated_entries_are_refused(tmp_path: Path) -> None:
    model = small_tpo()
    model.save(tmp_path / "m.zip")
    entries = _entries(tmp_path / "m.zip")
    meta = json.loads(entries["tpo_gym.json"])
    meta["kwargs"]["batch_size"] = 4
    path = _write_zip(tmp_path / "twice.zip", [("tpo_gym.json", entries["tpo_gym.json"]),
                                               ("weights.pt", entries["weights.pt"]),
                                               ("tpo_gym.json", json.dumps(meta).encode())])
    with pytest.raises(AgentFileError, match=r"holds the entries \['tpo_gym.json'\] more than once"):
        TPO.load(path)


@pytest.mark.parametrize("entry", ["tpo_gym.json", "weights.pt"])
def test_a_flipped_byte_in_compressed_data_names_the_entry(tmp_path: Path, entry: str) -> None:
    model = small_tpo()
    model.save(tmp_path / "m.zip")
    raw = (tmp_path / "m.zip").read_bytes()
    with zipfile.ZipFile(tmp_path / "m.zip") as zf:
        info = zf.getinfo(entry)
    assert info.compress_type == zipfile.ZIP_DEFLATED
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    # interior bytes (a flip in the final block's unused padding bits changes no data, and loads)
    for offset in range(0, info.compress_size - 16, max(1, info.compress_size // 7)):
        damaged = bytearray(raw)
        damaged[start + offset] ^= 0x5A
        (tmp_path / "bad.zip").write_bytes(bytes(damaged))
        with pytest.raises(AgentFileError, match=f"'{entry}' is corrupt"):
            TPO.load(tmp_path / "bad.zip")


def _edited(path: Path, out: Path, field: str, value: Any) -> Path:
    """A copy of the agent file at ``path`` with ``field`` (dotted; ``"-"`` deletes it) of its JSON set to ``value``."""
    entries = _entries(path)
    meta = json.loads(entries["tpo_gym.json"])
    *parents, last = field.split(".")
    node = meta
    for key in parents:
        node = node[key]
    if value == "-":
        del node[last]
    else:
        node[last] = value
    text = json.dumps(meta)  # writes NaN / Infinity as JSON's non-standard constants, as a hand edit would
    return _write_zip(out, [("tpo_gym.json", text.encode()), ("weights.pt", entries["weights.pt"])])


BIG = 10**30
BAD_EDITS: list[tuple[str, Any]] = [
    ("state.num_timesteps", -1),
    ("state.num_timesteps", 1.5),
    ("state.num_timesteps", True),
    ("state.num_timesteps", 1e30),
    ("state.num_timesteps", "8"),
    ("state.n_updates", float("nan")),
    ("state.n_updates", None),
    ("state.iteration", float("inf")),
    ("state.iteration", -1),
    ("state.rollout_index", float("-inf")),
    ("state.rollout_index", [1]),
    ("state.base_seed", -5),
    ("state.base_seed", 2**70),
    ("state.base_seed", 0.5),
    ("state.history", {}),
    ("state.history", [1]),
    ("state.history", "[]"),
    ("state.num_timesteps", "-"),
    ("state", {}),
    ("kwargs", {}),
    ("kwargs", []),
    ("kwargs.batch_size", "-"),
    ("kwargs.verbose", "1"),
    ("kwargs.verbose", float("nan")),
    ("kwargs.verbose", -1),
    ("kwargs.policy_kwargs", [1]),
    ("kwargs.policy_kwargs", "net_arch"),
    ("kwargs.policy_kwargs", {"net_arch": [-1]}),
    ("kwargs.policy_kwargs", {"bogus": 1}),
    ("kwargs.tensorboard_log", 5),
    ("kwargs.batch_size", 0),
    ("kwargs.batch_size", 1.5),
    ("kwargs.batch_size", BIG),
    ("kwargs.group_size", 1),
    ("kwargs.n_epochs", 0),
    ("kwargs.eta", float("nan")),
    ("kwargs.eta", "1"),
    ("kwargs.anchor", 1),
    ("kwargs.candidates", "all"),
    ("kwargs.level", 3),
    ("kwargs.budget", None),
    ("kwargs.learning_rate", float("inf")),
    ("kwargs.learning_rate", -1),
    ("kwargs.learning_rate", BIG**14),
    ("kwargs.learning_rate", {"schedule": "linear", "start": float("nan"), "end": 0.0, "end_fraction": 1.0}),
    ("kwargs.learning_rate", {"schedule": "linear", "start": 1.0, "end": 0.0, "end_fraction": 0.0}),
    ("kwargs.max_grad_norm", -1),
    ("kwargs.n_threads", 0),
    ("kwargs.stats_window_size", 0),
    ("kwargs.seed", -1),
    ("kwargs.rollouts_on_device", 1),
    ("action_space.n", BIG),
    ("action_space.n", float("inf")),
    ("action_space.n", 10.0),
    ("action_space.n", 10**9),
    ("action_space.start", "0"),
    ("observation_space.shape", [2]),
    ("observation_space.dtype", "object"),
    ("observation_space.n", 3),
    ("observation_space", "Box"),
    ("tpo_gym_version", 5),
]


@pytest.mark.parametrize(("field", "value"), BAD_EDITS, ids=[f"{f}={v!r:.20}" for f, v in BAD_EDITS])
def test_a_bad_field_is_refused_at_load_naming_it(tmp_path: Path, field: str, value: Any) -> None:
    model = small_tpo()
    model.save(tmp_path / "m.zip")
    path = _edited(tmp_path / "m.zip", tmp_path / "edited.zip", field, value)
    with pytest.raises(AgentFileError) as info:
        TPO.load(path)
    named = field.rsplit(".", 1)[-1] if isinstance(value, str) and value == "-" else field  # deleted: its name
    assert named in str(info.value)


SYSTEM_EDITS: list[tuple[str, Any, str]] = [
    ("kwargs.n_threads", 10**6, r"n_threads must be an integer >= 1 and <= 4096, got 1000000"),
    ("kwargs.n_threads", 2.0, r"n_threads must be an integer >= 1 and <= 4096, got 2.0 \(float\)"),
    ("kwargs.tensorboard_log", "", r"tensorboard_log must be None or a non-empty directory path .*, got ''"),
    ("kwargs.tensorboard_log", "runs\x00/x", r"tensorboard_log must be None or .* without NUL, got 'runs\\x00/x'"),
    ("kwargs.tensorboard_log", "r" * 5000,
     r"tensorboard_log must be .* at most 4096 characters without NUL, got 'rrr.*\.\.\. \(5002 characters\)"),
]


@pytest.mark.parametrize(("field", "value", "message"), SYSTEM_EDITS, ids=["threads-huge", "threads-float",
                                                                          "log-empty", "log-nul", "log-long"])
def test_threads_and_log_dir_from_a_file_are_checked_as_the_constructor_checks_them(
        tmp_path: Path, field: str, value: Any, message: str) -> None:
    small_tpo().save(tmp_path / "m.zip")
    with pytest.raises(AgentFileError, match=rf"field '{field}' is not valid: {message}"):
        TPO.load(_edited(tmp_path / "m.zip", tmp_path / "edited.zip", field, value))
    with pytest.raises(ValueError, match=message):
        small_tpo(**{field.split(".")[1]: value})
    good = TPO.load(_edited(tmp_path / "m.zip", tmp_path / "ok.zip", field, 2 if "threads" in field else "runs"))
    assert (good.n_threads, good.tensorboard_log) == ((2, None) if "threads" in field else (1, "runs"))


def test_missing_settings_are_listed(tmp_path: Path) -> None:
    model = small_tpo()
    model.save(tmp_path / "m.zip")
    with pytest.raises(AgentFileError, match=r"'kwargs' lacks the settings \['eta', 'anchor', 'candidates'"):
        TPO.load(_edited(tmp_path / "m.zip", tmp_path / "e.zip", "kwargs", {}))
    with pytest.raises(AgentFileError, match=r"lacks the settings \['seed'\]"):
        TPO.load(_edited(tmp_path / "m.zip", tmp_path / "e.zip", "kwargs.seed", "-"))
    loaded = TPO.load(tmp_path / "e.zip", seed=3)  # a setting the caller passes may be absent from the file
    assert loaded.seed == 3


def test_a_bad_setting_passed_by_the_caller_is_the_callers_error(tmp_path: Path) -> None:
    small_tpo().save(tmp_path / "m.zip")
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1") as info:
        TPO.load(tmp_path / "m.zip", batch_size=0)
    assert not isinstance(info.value, AgentFileError)


def test_a_good_file_round_trips_exactly(tmp_path: Path) -> None:
    model = small_tpo()
    model.learn(2 * model.steps_per_iteration)
    model.save(tmp_path / "m.zip")
    loaded = TPO.load(tmp_path / "m.zip")
    loaded.save(tmp_path / "again.zip")
    first, again = _entries(tmp_path / "m.zip"), _entries(tmp_path / "again.zip")
    assert json.loads(again["tpo_gym.json"]) == json.loads(first["tpo_gym.json"])
    for k, v in params_of(model).items():
        assert torch.equal(params_of(loaded)[k], v)
    assert (loaded.num_timesteps, loaded._n_updates, loaded._iteration, loaded._rollout_index, loaded._base_seed) == (
        model.num_timesteps, model._n_updates, model._iteration, model._rollout_index, model._base_seed)


def _rewrite_zip(src: Path, dst: Path, replace: dict[str, bytes], drop: tuple[str, ...] = ()) -> None:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for name in zin.namelist():
            if name in drop:
                continue
            zout.writestr(name, replace.get(name, zin.read(name)))
        for name, data in replace.items():
            if name not in zin.namelist():
                zout.writestr(name, data)


# ---------------------------------------------------------------------------------------------
# security: loading executes nothing
# ---------------------------------------------------------------------------------------------
def test_sb3_style_serialized_field_never_runs(tmp_path: Path) -> None:
    """A crafted SB3 zip whose ``data`` holds a cloudpickled payload: load refuses, nothing runs."""
    import base64

    marker = tmp_path / "pwned"
    payload = base64.b64encode(pickle.dumps(Boom(marker))).decode()
    data = {"policy_class": {":type:": "<class 'x'>", ":serialized:": payload}, "learning_rate": 1e-3}
    path = tmp_path / "evil.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("data", json.dumps(data))
        zf.writestr("policy.pth", b"")
        zf.writestr("_stable_baselines3_version", "2.9.2")
    for cls in (TPO, GroupAlgorithm):
        with pytest.raises(ValueError, match="Stable-Baselines3"):
            cls.load(path)
    assert not marker.exists()


def test_serialized_field_inside_tpo_gym_file_is_refused(tmp_path: Path) -> None:
    model = small_tpo()
    model.save(tmp_path / "m.zip")
    with zipfile.ZipFile(tmp_path / "m.zip") as zf:
        meta = json.loads(zf.read("tpo_gym.json"))
    meta["kwargs"]["policy_kwargs"] = {"net_arch": {":serialized:": "gASV..."}}
    _rewrite_zip(tmp_path / "m.zip", tmp_path / "bad.zip", {"tpo_gym.json": json.dumps(meta).encode()})
    with pytest.raises(AgentFileError, match=r"serialized \(pickled\) field ':serialized:'"):
        TPO.load(tmp_path / "bad.zip")
    meta["kwargs"]["policy_kwargs"] = {"activation_fn": {"__class__": "os:system"}}
    _rewrite_zip(tmp_path / "m.zip", tmp_path / "bad2.zip", {"tpo_gym.json": json.dumps(meta).encode()})
    with pytest.raises(AgentFileError, match="outside torch.nn, torch.optim and tpo_gym"):
        TPO.load(tmp_path / "bad2.zip")
    meta["surprise"] = 1
    _rewrite_zip(tmp_path / "m.zip", tmp_path / "bad3.zip", {"tpo_gym.json": json.dumps(meta).encode()})
    with pytest.raises(AgentFileError, match="unexpected fields"):
        TPO.load(tmp_path / "bad3.zip")


def test_pickled_weights_are_refused_without_running(tmp_path: Path) -> None:
    model = small_tpo()
    model.save(tmp_path / "m.zip")
    marker = tmp_path / "pwned"
    buffer = io.BytesIO()
    torch.save({"policy": Boom(marker)}, buffer)
    _rewrite_zip(tmp_path / "m.zip", tmp_path / "bad.zip", {"weights.pt": buffer.getvalue()})
    with pytest.raises(AgentFileError, match="weights.pt.*plain tensors"):
        TPO.load(tmp_path / "bad.zip")
    assert not marker.exists()


def test_files_of_other_classes_are_refused(tmp_path: Path) -> None:
    import stable_baselines3

    sb3 = stable_baselines3.PPO("MlpPolicy", "CartPole-v1", n_steps=16, batch_size=16)
    sb3.save(tmp_path / "sb3.zip")
    with pytest.raises(AgentFileError, match="written by Stable-Baselines3"):
        TPO.load(tmp_path / "sb3.zip")
    small_tpo().save(tmp_path / "tpo.zip")
    with pytest.raises(AgentFileError, match=r"holds a TPO agent, not GRPO: use TPO.load"):
        GRPO.load(tmp_path / "tpo.zip")
    generic = GroupAlgorithm.load(tmp_path / "tpo.zip")
    assert type(generic) is TPO


def test_truncated_and_corrupt_files_say_what_is_wrong(tmp_path: Path) -> None:
    model = small_tpo()
    model.save(tmp_path / "m.zip")
    raw = (tmp_path / "m.zip").read_bytes()
    (tmp_path / "trunc.zip").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(AgentFileError, match="not a zip archive"):
        TPO.load(tmp_path / "trunc.zip")
    _rewrite_zip(tmp_path / "m.zip", tmp_path / "json.zip", {"tpo_gym.json": b"{not json"})
    with pytest.raises(AgentFileError, match="'tpo_gym.json' is not valid JSON"):
        TPO.load(tmp_path / "json.zip")
    _rewrite_zip(tmp_path / "m.zip", tmp_path / "noweights.zip", {}, drop=("weights.pt",))
    with pytest.raises(AgentFileError, match="no 'weights.pt' entry"):
        TPO.load(tmp_path / "noweights.zip")
    _rewrite_zip(tmp_path / "m.zip", tmp_path / "badweights.zip", {"weights.pt": b"garbage"})
    with pytest.raises(AgentFileError, match="'weights.pt' cannot be read"):
        TPO.load(tmp_path / "badweights.zip")
    other = TPO("MlpPolicy", bandit_env(), batch_size=8, seed=0, policy_kwargs={"net_arch": [7]})
    other.save(tmp_path / "other.zip")
    with zipfile.ZipFile(tmp_path / "other.zip") as zf:
        weights = zf.read("weights.pt")
    _rewrite_zip(tmp_path / "m.zip", tmp_path / "mismatch.zip", {"weights.pt": weights})
    with pytest.raises(AgentFileError, match="weights in the file do not fit the policy"):
        TPO.load(tmp_path / "mismatch.zip")
    with pytest.raises(FileNotFoundError):
        TPO.load(tmp_path / "missing.zip")


# ---------------------------------------------------------------------------------------------
# settings round-trip: learning-rate schedules, custom objects (every agent: tests/agents/method_checks.py)
# ---------------------------------------------------------------------------------------------
def test_schedules_and_custom_objects(tmp_path: Path) -> None:
    model = small_tpo(learning_rate=LinearSchedule(1e-3, 1e-4, 0.5))
    model.save(tmp_path / "m.zip")
    loaded = TPO.load(tmp_path / "m.zip")
    assert loaded.lr_schedule(1.0) == pytest.approx(1e-3) and loaded.lr_schedule(0.0) == pytest.approx(1e-4)
    with pytest.raises(ValueError, match="cannot save learning_rate"):
        small_tpo(learning_rate=lambda p: 1e-3 * p).save(tmp_path / "lambda.zip")
    again = TPO.load(tmp_path / "m.zip", custom_objects={"learning_rate": 5e-3}, eta=0.5)
    assert again.lr_schedule(1.0) == pytest.approx(5e-3) and again.eta == 0.5


PROMPTS = ["say a", "say b"]


def _lm_agent(**policy: Any) -> TPO:
    return TPO("CausalLMPolicy", say_letter_env(), batch_size=4, group_size=4, seed=0,
               policy_kwargs={**lm_kwargs(), **policy})


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("saved") / "agent"
    _lm_agent().save(path)
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
# language-model directories: no code run, no network
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
    model = _lm_agent(model_kwargs={"revision": "main", "attn_implementation": "eager", "trust_remote_code": True})
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
# damaged language-model directories: one clear error naming the file
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
# language-model directories: strict weights
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
    model = _lm_agent(model=net)
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
# language-model directories: writes follow no planted link
# --------------------------------------------------------------------------------------------
def test_save_follows_no_link_planted_at_a_temporary_name(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine")
    (tmp_path / ".agent.tmp").symlink_to(victim)
    (tmp_path / ".agent.old").symlink_to(victim)
    model = _lm_agent()
    model.save(tmp_path / "agent")
    model.save(tmp_path / "agent")  # over an existing agent
    assert sorted(p.name for p in victim.iterdir()) == ["keep.txt"] and (victim / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".agent.old", ".agent.tmp", "agent", "victim"]
    expected = model.predict(PROMPTS, deterministic=True)[0].tolist()
    assert TPO.load(tmp_path / "agent").predict(PROMPTS, deterministic=True)[0].tolist() == expected
