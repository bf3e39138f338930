"""How a text env's question becomes a language model's prompt, and a completion becomes an answer.

One setting, :class:`PromptFormat`, recorded in every report: which system prompt, an optional
instruction appended to the question, and an optional **prefill** (text the assistant turn starts
with, e.g. ``"<answer>"``). The model sees ``chat_template([system, user: question + instruction],
add_generation_prompt=True) + prefill`` and generates the rest; the env scores
``prefill + generated`` (with the answer tag closed when the prefill opened it and the model did not),
so the env's own scorer reads exactly what the model wrote.

Small models rarely write answer tags on their own (SmolLM2-135M-Instruct with Reasoning Gym's
default system prompt never does: every score 0, nothing to learn); the preset
``PromptFormat.answer_prefill()`` is the format that gives them non-zero scores.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tpo_gym._validation import check_choice

__all__ = ["PromptFormat", "build_prompt", "completion_for_env"]

#: The instruction of :meth:`PromptFormat.answer_prefill`.
SHORT_INSTRUCTION = "Give only the final answer."


@dataclasses.dataclass(frozen=True)
class PromptFormat:
    """The prompt format of a text task (a setting of the LM policy; JSON-able).

    :param system: ``"env"`` (the env's own system prompt, from ``info["system_prompt"]``), ``"none"``
        (no system message), or ``"custom"`` (``system_text``).
    :param system_text: the system message when ``system="custom"``.
    :param instruction: text appended to the question (after a blank line), or ``""``.
    :param prefill: text the assistant turn starts with (e.g. ``"<answer>"``), or ``""``.
    :param close_tag: closing tag appended to the scored completion when ``prefill`` opened the tag
        and the completion does not close it (``""``: never).
    :param chat_template: apply the tokenizer's chat template (default); ``False`` joins the
        system text, the question and the prefill with newlines (for base models without a template).
    """

    system: str = "env"
    system_text: str = ""
    instruction: str = ""
    prefill: str = ""
    close_tag: str = ""
    chat_template: bool = True

    def __post_init__(self) -> None:
        check_choice("system", self.system, ("env", "none", "custom"))
        for name in ("system_text", "instruction", "prefill", "close_tag"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name} must be a str, got {getattr(self, name)!r}")
        if not isinstance(self.chat_template, bool):
            raise ValueError(f"chat_template must be True or False, got {self.chat_template!r}")

    @classmethod
    def answer_prefill(cls) -> PromptFormat:
        """No system prompt, the short instruction, the assistant turn prefilled with ``<answer>``."""
        return cls(system="none", instruction=SHORT_INSTRUCTION, prefill="<answer>", close_tag="</answer>")

    @classmethod
    def from_data(cls, data: Any) -> PromptFormat:
        """From a dict of fields, the name ``"env"`` / ``"answer_prefill"``, or a ``PromptFormat``."""
        if isinstance(data, PromptFormat):
            return data
        if data is None or data == "env":
            return cls()
        if data == "answer_prefill":
            return cls.answer_prefill()
        if isinstance(data, dict):
            unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
            if unknown:
                raise ValueError(f"prompt_format has unknown fields {unknown}; allowed: "
                                 f"{[f.name for f in dataclasses.fields(cls)]}")
            return cls(**data)
        raise ValueError(f"prompt_format must be 'env', 'answer_prefill', a dict or a PromptFormat, got {data!r}")

    def to_data(self) -> dict[str, Any]:
        """The fields as a plain dict."""
        return dataclasses.asdict(self)


def build_prompt(tokenizer: Any, question: str, env_system_prompt: str | None, fmt: PromptFormat) -> str:
    """The prompt text the model continues: chat template (or plain text) + prefill."""
    if fmt.system == "env":
        system = env_system_prompt or ""
    elif fmt.system == "custom":
        system = fmt.system_text
    else:
        system = ""
    user = question if not fmt.instruction else f"{question}\n\n{fmt.instruction}"
    if fmt.chat_template and getattr(tokenizer, "chat_template", None):
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    else:
        text = "\n".join(p for p in (system, user) if p) + "\n"
    return text + fmt.prefill


def completion_for_env(generated: str, fmt: PromptFormat) -> str:
    """What the env scores: ``prefill + generated``, with ``close_tag`` added when it is missing."""
    text = fmt.prefill + generated
    if fmt.close_tag and fmt.close_tag not in generated:
        text += fmt.close_tag
    return text
