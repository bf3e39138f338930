"""Reasoning Gym tasks as one-step text environments (the RLVR setting of the TPO paper)."""

from __future__ import annotations

import difflib
import string
from typing import Any

import gymnasium as gym
from gymnasium import spaces

from tpo_gym.envs._common import check_int_kwarg

#: The system prompt shown before every question; it asks for the answer inside answer tags.
SYSTEM_PROMPT = (
    "Given a problem, your task is to answer the question by thinking step-by-step in a clear and "
    "specific manner.\nOnce you have thought about the reasoning process, provide the answer in the "
    "following format:\n<answer>answer here</answer>\nDo not explain your reasoning inside the answer "
    "tags, provide only the final answer. When an example is provided, you should strictly follow the "
    "format of the output/answer in that example.\n"
)
#: Printable ASCII plus common whitespace, and the non-ASCII symbols Reasoning Gym questions use.
CHARSET = frozenset(string.printable) | frozenset("×÷−–—…°²³½¼¾πθ√∞≤≥≠≈→←↑↓∧∨¬⊕∀∃∈∉∪∩ ‘’“”·•✓✗")
MAX_QUESTION_LENGTH = 65536
MAX_COMPLETION_LENGTH = 65536


def _dataset_names() -> list[str]:
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def check_dataset_name(dataset: Any) -> str:
    """Return ``dataset`` if Reasoning Gym registers it, else raise ``ValueError`` with close names."""
    names = _dataset_names()
    if isinstance(dataset, str) and dataset in names:
        return dataset
    close = difflib.get_close_matches(str(dataset), names, n=5, cutoff=0.4)
    hint = f"did you mean {close}?" if close else f"valid names include {names[:10]}..."
    raise ValueError(f"unknown reasoning_gym dataset {dataset!r}: {hint} ({len(names)} datasets registered)")


class ReasoningGymEnv(gym.Env[str, str]):
    """A Reasoning Gym dataset as a one-step text environment: question in, completion out.

    ## Description
    Each episode shows one question of a Reasoning Gym dataset (``reasoning_gym.create_dataset``)
    preceded by :data:`SYSTEM_PROMPT`, which asks for the final answer inside
    ``<answer>...</answer>`` tags. The action is the model's completion text. This is the LLM RLVR
    setting of the TPO paper (graph coloring, Knights & Knaves, ...).

    For LLM agents that apply a chat template, ``reset``'s ``info`` carries ``system_prompt``,
    ``question`` (raw), ``answer`` is *not* given; the entry index is ``info["index"]``. The same are
    attributes: :attr:`system_prompt`, :attr:`question`.

    ## Action Space
    ``Text(max_length=65536, charset=CHARSET)``: the completion (printable text; ``step`` checks it).

    ## Observation Space
    ``Text(max_length=65536, charset=CHARSET)``: ``system_prompt + "\\n" + question``.

    ## Rewards
    The dataset's own score, ``dataset.score_answer(reasoning_gym.utils.extract_answer(completion),
    entry)`` (0 when no answer tags are found; partial credit where the dataset gives it). Scoring
    is never re-implemented here.

    ## Starting State
    The entry index is drawn uniformly from ``self.np_random`` over ``range(size)``; the dataset
    itself is fixed by the ``seed`` argument.

    ## Episode End
    After one step: ``terminated=True, truncated=False``. ``info`` then carries ``answer`` (the
    reference), ``extracted_answer`` and ``is_success`` (score == 1).

    ## Arguments
    * ``dataset`` (str, default "graph_color"): any name of Reasoning Gym's registry; an unknown
      name raises ``ValueError`` listing the closest valid names.
    * ``size`` (int, default 500), ``seed`` (int, default 0): passed to ``create_dataset``.
    * any other keyword: that dataset's config, passed through to ``create_dataset``.

    ## Vectorized environment
    No native batched twin; use ``gym.make_vec(..., vectorization_mode="sync")``, or "async" with
    ``vector_kwargs={"shared_memory": False}`` (Gymnasium's shared memory cannot carry ``Text``
    observations). For K completions
    of one question, score them with :meth:`score_candidates`.

    ## Group API
    ``score_candidates(completions: list[str]) -> float32 [K]`` scores K completions of the current
    question without stepping.

    ## Version History
    * v0: Initial version.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, dataset: str = "graph_color", size: int = 500, seed: int = 0, **config: Any) -> None:
        self.dataset_name = check_dataset_name(dataset)
        self.size = check_int_kwarg("size", size, 1)
        self.seed = check_int_kwarg("seed", seed, 0)
        self.config = dict(config)
        import reasoning_gym

        self.dataset = reasoning_gym.create_dataset(self.dataset_name, seed=self.seed, size=self.size, **self.config)
        self.system_prompt = SYSTEM_PROMPT
        self.observation_space = spaces.Text(max_length=MAX_QUESTION_LENGTH, min_length=0, charset=CHARSET)
        self.action_space = spaces.Text(max_length=MAX_COMPLETION_LENGTH, min_length=0, charset=CHARSET)
        self.index: int | None = None
        self.entry: dict[str, Any] | None = None
        self.question: str | None = None

    def _observation(self) -> str:
        assert self.question is not None
        return self._sanitize(self.system_prompt + "\n" + self.question)

    @staticmethod
    def _sanitize(text: str) -> str:
        """Replace characters outside :data:`CHARSET` with ``?`` so the observation is in its space."""
        return "".join(ch if ch in CHARSET else "?" for ch in text)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Draw a question."""
        super().reset(seed=seed)
        self.index = int(self.np_random.integers(self.size))
        self.entry = self.dataset[self.index]
        self.question = str(self.entry["question"])
        info = {"system_prompt": self.system_prompt, "question": self.question, "index": self.index}
        return self._observation(), info

    def _check_completion(self, completion: Any, what: str = "action") -> str:
        if not isinstance(completion, str):
            raise ValueError(f"{what} must be a str (the completion text), got {type(completion).__name__}")
        if len(completion) > MAX_COMPLETION_LENGTH:
            raise ValueError(f"{what} is {len(completion)} characters, max_length is {MAX_COMPLETION_LENGTH}")
        return completion

    def _score(self, completion: str) -> tuple[float, str | None]:
        from reasoning_gym.utils import extract_answer

        assert self.entry is not None
        extracted = extract_answer(completion)
        return float(self.dataset.score_answer(extracted, self.entry)), extracted

    def _require_entry(self) -> dict[str, Any]:
        if self.entry is None:
            raise RuntimeError("ReasoningGymEnv: the episode is over (or never started); call reset() first")
        return self.entry

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Score the completion with the dataset's own ``score_answer``; the episode ends."""
        completion = self._check_completion(action)
        entry = self._require_entry()
        reward, extracted = self._score(completion)
        obs = self._observation()
        self.entry = None
        info = {"answer": entry["answer"], "extracted_answer": extracted, "is_success": reward >= 1.0}
        return obs, reward, True, False, info

    def score_candidates(self, candidates: Any) -> Any:
        """Scores ``float32 [K]`` of K completions of the current question, without stepping."""
        import numpy as np

        if isinstance(candidates, str) or not hasattr(candidates, "__len__") or len(candidates) < 1:
            raise ValueError("candidates must be a non-empty list of completion strings")
        self._require_entry()
        return np.array([self._score(self._check_completion(c, "candidate"))[0] for c in candidates], dtype=np.float32)
