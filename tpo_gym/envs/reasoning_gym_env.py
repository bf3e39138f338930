"""Reasoning Gym tasks as one-step text environments (the RLVR setting of the TPO paper).

The text spaces are :class:`UnicodeText`: Gymnasium ``Text`` spaces over a broad, fixed charset
(:func:`text_charset`: every assigned Unicode character except control characters other than ASCII
whitespace, surrogates and private-use characters), so real Reasoning Gym questions (Greek,
accented Latin, box drawing, emoji, variation selectors, ...) are observed unchanged.
"""

from __future__ import annotations

import difflib
import functools
import sys
import unicodedata
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import create_shared_memory

from tpo_gym._validation import check_int
from tpo_gym.envs._common import check_reset_args, check_size
from tpo_gym.envs.vector import RenderMixin

#: The system prompt shown before every question; it asks for the answer inside answer tags.
SYSTEM_PROMPT = (
    "Given a problem, your task is to answer the question by thinking step-by-step in a clear and "
    "specific manner.\nOnce you have thought about the reasoning process, provide the answer in the "
    "following format:\n<answer>answer here</answer>\nDo not explain your reasoning inside the answer "
    "tags, provide only the final answer. When an example is provided, you should strictly follow the "
    "format of the output/answer in that example.\n"
)
MAX_QUESTION_LENGTH = 65536
MAX_COMPLETION_LENGTH = 65536
#: Reasoning Gym seeds entry ``idx`` of a dataset with ``seed + idx``, and some datasets hand that to
#: numpy's legacy seeding, which needs it below 2**32: so ``size <= 2**32`` and
#: ``seed <= 2**32 - size``.
SEED_LIMIT = 1 << 32
#: Stands in for a character outside :func:`text_charset` in the *observation* only (none occurs in
#: the questions of Reasoning Gym's datasets); ``info["question"]`` is always the raw text.
REPLACEMENT_CHARACTER = "\ufffd"

_EXCLUDED_CATEGORIES = frozenset({"Cc", "Cs", "Co", "Cn"})
_ASCII_WHITESPACE = frozenset("\t\n\x0b\x0c\r")


@functools.lru_cache(maxsize=1)
def _charset_data() -> tuple[frozenset[str], tuple[str, ...], np.ndarray]:
    chars = tuple(
        c
        for c in map(chr, range(sys.maxunicode + 1))
        if c in _ASCII_WHITESPACE or unicodedata.category(c) not in _EXCLUDED_CATEGORIES
    )
    codes = np.fromiter(map(ord, chars), dtype="<u4", count=len(chars))
    return frozenset(chars), chars, codes


@functools.lru_cache(maxsize=1)
def _charset_index() -> dict[str, np.int32]:
    return {c: np.int32(i) for i, c in enumerate(_charset_data()[1])}


@functools.lru_cache(maxsize=1)
def _charset_str() -> str:
    return "".join(_charset_data()[1])


def text_charset() -> frozenset[str]:
    """The charset of the ReasoningGym text spaces: broad, fixed and documented.

    Every character of the Unicode database of this Python (``unicodedata.unidata_version``) whose
    general category is not ``Cc`` (control), ``Cs`` (surrogate), ``Co`` (private use) or ``Cn``
    (unassigned), plus the ASCII whitespace ``\\t \\n \\x0b \\x0c \\r``: letters, marks (e.g.
    variation selectors), numbers, punctuation, symbols (e.g. emoji), spaces (e.g. no-break space)
    and format characters (e.g. zero-width joiner). About 145,000 characters; built once per process
    (a fraction of a second) and shared by every :class:`UnicodeText`.
    """
    return _charset_data()[0]


class UnicodeText(spaces.Text):
    """A Gymnasium ``Text`` space over :func:`text_charset`, cheap to build, copy and pickle.

    It behaves as ``gymnasium.spaces.Text(max_length, min_length=min_length, charset=text_charset())``
    (and compares equal to it) but shares one charset table per process instead of building one per
    space, so vector envs, ``deepcopy`` and pickling stay fast.

    Gymnasium's ``AsyncVectorEnv`` shared memory cannot carry ``Text`` observations (it decodes the
    shared buffer into a tuple of strings once, when the vector env is built, so every later
    observation would come back as that same padding string); building such a vector env with a
    ``UnicodeText`` observation space raises ``ValueError`` naming
    ``vector_kwargs={"shared_memory": False}``, which works.
    """

    def __init__(self, max_length: int, *, min_length: int = 0, seed: Any = None) -> None:
        # The base class validates the lengths and sets up the RNG; its own (tiny) charset tables
        # are never used: the accessors below serve the shared ones.
        super().__init__(max_length=max_length, min_length=min_length, charset=" ", seed=seed)

    @property
    def character_set(self) -> frozenset[str]:
        """The characters of the space, :func:`text_charset`."""
        return _charset_data()[0]

    @property
    def character_list(self) -> tuple[str, ...]:
        """The characters of the space in code point order."""
        return _charset_data()[1]

    def character_index(self, char: str) -> np.int32:
        """The index of ``char`` in :attr:`character_list`."""
        return _charset_index()[char]

    @property
    def characters(self) -> str:
        """All characters of the space as one string, in code point order."""
        return _charset_str()

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """A random string: uniform length in ``[min_length, max_length]``, uniform characters.

        Without ``mask`` / ``probability`` it draws character indices directly (fast: the charset is
        large); with them it is ``Text.sample``.
        """
        if mask is not None or probability is not None:
            return super().sample(mask=mask, probability=probability)
        codes = _charset_data()[2]
        length = int(self.np_random.integers(self.min_length, self.max_length + 1))
        return codes[self.np_random.integers(0, len(codes), size=length)].tobytes().decode("utf-32-le")

    def __eq__(self, other: object, /) -> bool:
        if isinstance(other, UnicodeText):
            return self.min_length == other.min_length and self.max_length == other.max_length
        return super().__eq__(other)

    def __repr__(self) -> str:
        n = len(self.character_set)
        return f"UnicodeText({self.min_length}, {self.max_length}, charset=<{n} Unicode characters>)"


@create_shared_memory.register(UnicodeText)
def _no_shared_memory(space: UnicodeText, n: int = 1, ctx: Any = None) -> Any:
    raise ValueError(
        "AsyncVectorEnv's shared memory cannot carry Text observations (Gymnasium decodes the shared "
        "buffer once, when the vector env is built, so every observation would come back as the same "
        'padding string). Pass vector_kwargs={"shared_memory": False}, e.g. gym.make_vec(env_id, n, '
        'vectorization_mode="async", vector_kwargs={"shared_memory": False}), or use '
        'vectorization_mode="sync".'
    )


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
    raise ValueError(
        f"dataset must be one of the {len(names)} datasets Reasoning Gym registers, got {dataset!r} "
        f"(unknown reasoning_gym dataset): {hint}"
    )


def observation_text(system_prompt: str, question: str) -> str:
    """The observation for a question: ``system_prompt + "\\n" + question``, in :func:`text_charset`.

    A character outside the charset (none occurs in Reasoning Gym's questions) becomes
    :data:`REPLACEMENT_CHARACTER`; everything else is kept as is.
    """
    text = system_prompt + "\n" + question
    charset = text_charset()
    if all(ch in charset for ch in text):
        return text
    return "".join(ch if ch in charset else REPLACEMENT_CHARACTER for ch in text)


class ReasoningGymEnv(RenderMixin, gym.Env[str, str]):
    """A Reasoning Gym dataset as a one-step text environment: question in, completion out.

    ## Description
    Each episode shows one question of a Reasoning Gym dataset (``reasoning_gym.create_dataset``)
    preceded by :data:`SYSTEM_PROMPT`, which asks for the final answer inside
    ``<answer>...</answer>`` tags. The action is the model's completion text. This is the LLM RLVR
    setting of the TPO paper (graph coloring, Knights & Knaves, ...).

    **What the policy reads.** An LLM policy uses ``reset``'s ``info["system_prompt"]`` and
    ``info["question"]`` (the raw text, never altered) with its chat template (system message,
    user message). The observation is the same text joined for policies without a chat template.
    ``info["index"]`` is the entry index; the reference answer is *not* given before the step. The
    same are attributes: :attr:`system_prompt`, :attr:`question`, :attr:`index`.

    ## Action Space
    :class:`UnicodeText` ``(max_length=65536)`` over :func:`text_charset`: the completion. ``step``
    accepts any ``str`` of at most 65536 characters (a completion is scored as the model wrote it).

    ## Observation Space
    :class:`UnicodeText` ``(max_length=65536)`` over :func:`text_charset` (every assigned Unicode
    character except control characters other than ASCII whitespace, surrogates and private-use
    characters): ``system_prompt + "\\n" + question``, unchanged; a character outside the charset
    would be shown as U+FFFD (none occurs in Reasoning Gym's datasets; ``info`` keeps the raw text).

    ## Rewards
    The dataset's own score, ``dataset.score_answer(reasoning_gym.utils.extract_answer(completion),
    entry)`` (0 when no answer tags are found; partial credit where the dataset gives it). Scoring
    is never re-implemented here. ``reward_credit = "step"`` (one step: the score is the episode's).

    ## Starting State
    The entry index is drawn uniformly from ``self.np_random`` over ``range(size)``; the dataset
    itself is fixed by the ``seed`` argument. ``reset(options={"index": i})`` shows entry ``i``
    instead (evaluation on a fixed list of questions; no random draw).

    ## Episode End
    After one step: ``terminated=True, truncated=False`` (registered with ``max_episode_steps=1``,
    so ``gym.make`` adds a ``TimeLimit`` that also sets ``truncated=True`` on that step). ``info``
    then carries ``answer`` (the reference), ``extracted_answer``, ``is_success`` (score == 1),
    ``score`` (float: the dataset's score, = the reward) and ``error`` (float: ``1 - score``).

    ## Arguments
    * ``dataset`` (str, default "graph_color"): any name of Reasoning Gym's registry; an unknown
      name raises ``ValueError`` listing the closest valid names.
    * ``size`` (int, ``1 <= size <= 2**32``, default 500), ``seed`` (int, ``0 <= seed <= 2**32 -
      size``, default 0): passed to ``create_dataset`` (entry ``idx`` is generated from
      ``seed + idx``, which some datasets need below 2**32).
    * ``render_mode`` (``None``, ``"ansi"`` or ``"rgb_array"``): ``render()`` then returns the question and,
      after the step, the completion, its extracted answer, the reference answer and the score, as text
      (``"ansi"``) or as that text drawn on an RGB ``uint8 [h, w, 3]`` picture (``"rgb_array"``, the mode SB3's
      ``make_vec_env`` asks for; drawn with matplotlib, only when ``render()`` is called).
    * any other keyword: that dataset's config, passed through to ``create_dataset``.

    ## Vectorized environment
    No native batched twin; use ``gym.make_vec(..., vectorization_mode="sync")``, or "async" with
    ``vector_kwargs={"shared_memory": False}``: Gymnasium's shared memory cannot carry ``Text``
    observations (it would return the same padding string for every observation), so the default
    async path raises ``ValueError`` saying so. For K completions of one question, score them with
    :meth:`score_candidates`.

    ## Checkers
    ``gymnasium.utils.env_checker.check_env(env.unwrapped)`` passes. Stable-Baselines3's
    ``stable_baselines3.common.env_checker.check_env`` rejects this env (SB3 needs numpy array
    observations; text observations fail its first check): use Gymnasium's checker instead, and an
    LLM agent (one that reads ``info["system_prompt"]`` / ``info["question"]`` and scores
    completions with :meth:`score_candidates`) rather than SB3's algorithms.

    ## Group API
    ``score_candidates(completions: list[str]) -> float32 [K]`` scores K completions of the current
    question without stepping.

    ## Version History
    * v0: Initial version.
    """

    metadata: dict[str, Any] = {"render_modes": ["ansi", "rgb_array"], "render_fps": 1}
    reward_credit: str = "step"

    def __init__(self, dataset: str = "graph_color", size: int = 500, seed: int = 0, render_mode: str | None = None,
                 **config: Any) -> None:
        self._set_render_mode(render_mode)
        self.dataset_name = check_dataset_name(dataset)
        self.size = check_size("size", size, 1, SEED_LIMIT, "Reasoning Gym seeds entry idx with seed + idx < 2**32")
        why = f"Reasoning Gym seeds entry idx with seed + idx < 2**32; size={self.size}"
        self.seed = check_size("seed", seed, 0, SEED_LIMIT - self.size, why)
        self.config = dict(config)
        import reasoning_gym

        self.dataset = reasoning_gym.create_dataset(self.dataset_name, seed=self.seed, size=self.size, **self.config)
        self.system_prompt = SYSTEM_PROMPT
        self.observation_space = UnicodeText(max_length=MAX_QUESTION_LENGTH)
        self.action_space = UnicodeText(max_length=MAX_COMPLETION_LENGTH)
        self.index: int | None = None
        self.entry: dict[str, Any] | None = None
        self.question: str | None = None
        self._last: dict[str, Any] | None = None

    def _observation(self) -> str:
        assert self.question is not None
        return observation_text(self.system_prompt, self.question)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Draw a question."""
        seed, options = check_reset_args(seed, options)
        super().reset(seed=seed)
        if options is not None and "index" in options:
            self.index = check_int("options['index']", options["index"], 0, self.size - 1)
        else:
            self.index = int(self.np_random.integers(self.size))
        self.entry = self.dataset[self.index]
        self.question = str(self.entry["question"])
        self._last = None
        info = {"system_prompt": self.system_prompt, "question": self.question, "index": self.index}
        return self._observation(), info

    def _check_completion(self, completion: Any, what: str = "action") -> str:
        if not isinstance(completion, str):
            raise ValueError(f"{what} must be a str (the completion text), got {type(completion).__name__}")
        if len(completion) > MAX_COMPLETION_LENGTH:
            raise ValueError(
                f"{what} must be at most {MAX_COMPLETION_LENGTH} characters long, got {len(completion)} characters"
            )
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
        info = {
            "answer": entry["answer"],
            "extracted_answer": extracted,
            "is_success": reward >= 1.0,
            "score": reward,
            "error": 1.0 - reward,
        }
        self._last = {"completion": completion, **info}
        return obs, reward, True, False, info

    def _render_text(self) -> str:
        """The question (entry index and dataset), then after the step the completion and how it scored."""
        if self.question is None:
            return f"{self.dataset_name}: no question yet (call reset())\n"
        lines = [f"{self.dataset_name} #{self.index}", f"Question: {self.question}"]
        if self._last is not None:
            last = self._last
            lines += [f"Completion: {last['completion']}", f"Extracted answer: {last['extracted_answer']}",
                      f"Reference answer: {last['answer']}", f"Score: {last['score']:.4g}"]
        return "\n".join(lines) + "\n"

    def _render_rgb(self) -> np.ndarray:
        """:meth:`_render_text` drawn in black on white, lines wrapped at 100 characters (at most 40 lines)."""
        import textwrap

        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        lines = [part for line in self._render_text().splitlines()
                 for part in (textwrap.wrap(line, 100, replace_whitespace=False) or [""])][:40]
        figure = Figure(figsize=(8.0, 0.2 * len(lines) + 0.3), dpi=100, facecolor="white")
        figure.text(0.01, 0.98, "\n".join(lines), va="top", ha="left", family="monospace", fontsize=8)
        canvas = FigureCanvasAgg(figure)
        canvas.draw()
        return np.ascontiguousarray(np.asarray(canvas.buffer_rgba())[..., :3])

    def score_candidates(self, candidates: Any) -> Any:
        """Scores ``float32 [K]`` of K completions of the current question, without stepping."""
        if isinstance(candidates, str) or not hasattr(candidates, "__len__") or len(candidates) < 1:
            got = type(candidates).__name__
            raise ValueError(f"candidates must be a non-empty list of completion strings, got {got}")
        self._require_entry()
        return np.array([self._score(self._check_completion(c, "candidate"))[0] for c in candidates], dtype=np.float32)
