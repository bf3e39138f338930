"""A tiny character-level tokenizer, a tiny random Llama and a toy text env for the LM tests (no network)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces

LETTERS = "abcd"
CHARS = LETTERS + " syX>\n"
TEMPLATE = (
    "{% for m in messages %}{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}>{% endif %}"
)


def tiny_tokenizer() -> Any:
    """Characters of :data:`CHARS` plus ``<pad>``, ``<eos>`` and ``<unk>``; a minimal chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{c: i + 3 for i, c in enumerate(CHARS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    fast.chat_template = TEMPLATE
    return fast


def tiny_llama(seed: int = 0, hidden: int = 32, layers: int = 2, dtype: torch.dtype = torch.float32) -> Any:
    """A randomly initialised Llama for the tiny tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=3 + len(CHARS), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=128, pad_token_id=0, eos_token_id=1, bos_token_id=1,
                         tie_word_embeddings=False)
    return LlamaForCausalLM(config).to(dtype)


class SayLetterEnv(gym.Env[str, str]):
    """Question ``"say X"`` for a letter X; score = fraction of the first 3 characters equal to X."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self) -> None:
        self.observation_space = spaces.Text(64, charset=CHARS)
        self.action_space = spaces.Text(64, charset=CHARS)
        self.letter: str | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self.letter = LETTERS[int(self.np_random.integers(len(LETTERS)))]
        question = f"say {self.letter}"
        return question, {"question": question, "system_prompt": "X"}

    def _score(self, completion: str) -> float:
        assert self.letter is not None
        head = completion[:3]
        return sum(c == self.letter for c in head) / 3.0

    def score_candidates(self, candidates: list[str]) -> np.ndarray:
        return np.array([self._score(c) for c in candidates], dtype=np.float32)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        reward = self._score(action)
        return f"say {self.letter}", reward, True, False, {"score": reward, "error": 1.0 - reward}


def say_letter_env() -> gym.Env[str, str]:
    return gym.wrappers.TimeLimit(SayLetterEnv(), max_episode_steps=1)


def lm_kwargs(**extra: Any) -> dict[str, Any]:
    """policy_kwargs of a tiny LM policy."""
    return {"model": tiny_llama(), "tokenizer": tiny_tokenizer(), "max_new_tokens": 4, **extra}
