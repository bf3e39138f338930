"""save / load, exact resumption and bit-identical reruns."""

from __future__ import annotations

import io
import json
import struct
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.agents.conftest import bandit_env, params_of, token_env
from tpo_gym import GRPO, TPO
from tpo_gym.agents.persistence import AgentFileError


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
# trust at the edges: atomic writes, bounded reads, one clear error for a damaged or edited file
# ---------------------------------------------------------------------------------------------
def _small_tpo() -> TPO:
    return TPO("MlpPolicy", bandit_env(), batch_size=8, seed=0)


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
    model = _small_tpo()
    model.save(tmp_path / "m.zip")
    assert victim.read_text() == "keep me"
    assert (tmp_path / ".m.zip.tmp").is_symlink()
    loaded = TPO.load(tmp_path / "m.zip")
    for k, v in params_of(model).items():
        assert torch.equal(params_of(loaded)[k], v)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".m.zip.tmp", "m.zip", "victim.txt"]  # no temp left


def test_policy_save_replaces_a_link_at_its_path_instead_of_writing_through_it(tmp_path: Path) -> None:
    from tpo_gym.agents.policies import MlpPolicy

    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (tmp_path / "policy.pt").symlink_to(victim)
    model = _small_tpo()
    model.policy.save(str(tmp_path / "policy.pt"))
    assert victim.read_text() == "keep me"
    assert not (tmp_path / "policy.pt").is_symlink()
    loaded = MlpPolicy.load(str(tmp_path / "policy.pt"))
    for k, v in model.policy.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v)


def test_save_to_a_file_object_round_trips() -> None:
    model = _small_tpo()
    buffer = io.BytesIO()
    model.save(buffer)
    buffer.seek(0)
    loaded = TPO.load(buffer)
    for k, v in params_of(model).items():
        assert torch.equal(params_of(loaded)[k], v)


def test_one_atomic_write_helper_shared_by_the_harness(tmp_path: Path) -> None:
    import tpo_gym._io as io_helper
    import tpo_gym.evaluation._io as harness_io

    for name in harness_io.__all__:
        assert getattr(harness_io, name) is getattr(io_helper, name)
    target = tmp_path / "a" / "b.json"
    io_helper.atomic_write_json(target, {"x": 1})
    with pytest.raises(RuntimeError), io_helper.atomic_writer(target) as fh:
        fh.write(b"half")
        raise RuntimeError("interrupted")
    assert json.loads(target.read_text()) == {"x": 1}  # the old file stays whole
    assert sorted(p.name for p in target.parent.iterdir()) == ["b.json"]  # the temp file is removed


def test_an_oversized_json_entry_is_refused_before_it_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tpo_gym.agents import persistence

    model = _small_tpo()
    model.save(tmp_path / "m.zip")
    entries = _entries(tmp_path / "m.zip")
    padded = entries["tpo_gym.json"] + b" " * (3 * 2**20)  # valid JSON: 3 MB of whitespace after the object
    path = _write_zip(tmp_path / "big.zip", [("tpo_gym.json", padded), ("weights.pt", entries["weights.pt"])])
    monkeypatch.setattr(persistence, "MAX_JSON_BYTES", 2**20)
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
    model = _small_tpo()
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
    model = _small_tpo()
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
    model = _small_tpo()
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
    model = _small_tpo()
    model.save(tmp_path / "m.zip")
    path = _edited(tmp_path / "m.zip", tmp_path / "edited.zip", field, value)
    with pytest.raises(AgentFileError) as info:
        TPO.load(path)
    named = field.rsplit(".", 1)[-1] if isinstance(value, str) and value == "-" else field  # deleted: its name
    assert named in str(info.value)


def test_missing_settings_are_listed(tmp_path: Path) -> None:
    model = _small_tpo()
    model.save(tmp_path / "m.zip")
    with pytest.raises(AgentFileError, match=r"'kwargs' lacks the settings \['eta', 'anchor', 'candidates'"):
        TPO.load(_edited(tmp_path / "m.zip", tmp_path / "e.zip", "kwargs", {}))
    with pytest.raises(AgentFileError, match=r"lacks the settings \['seed'\]"):
        TPO.load(_edited(tmp_path / "m.zip", tmp_path / "e.zip", "kwargs.seed", "-"))
    loaded = TPO.load(tmp_path / "e.zip", seed=3)  # a setting the caller passes may be absent from the file
    assert loaded.seed == 3


def test_a_bad_setting_passed_by_the_caller_is_the_callers_error(tmp_path: Path) -> None:
    _small_tpo().save(tmp_path / "m.zip")
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1") as info:
        TPO.load(tmp_path / "m.zip", batch_size=0)
    assert not isinstance(info.value, AgentFileError)


def test_a_good_file_round_trips_exactly(tmp_path: Path) -> None:
    model = _small_tpo()
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
