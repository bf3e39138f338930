"""Deterministic TRL runs on a tiny random Llama for the TargetPOTrainer tests (no network, CPU).

Completions are injected through TRL's public ``rollout_func``: the completion of global row ``j``
of a generation batch is a fixed function of ``j`` (its length and tokens), whatever the number of
processes, so one-process and two-process runs train on exactly the same data. Prompts all have the
same length (no padding: TRL's forward takes positions from the sequence, tpo-gym's from the mask).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agents"))

from lm_toys import CHARS, tiny_llama, tiny_tokenizer  # noqa: E402

K = 4
N_PROMPTS = 2
PROMPTS = [f"say {c}\n>" for c in "abcd"]


def completion_tokens(tokenizer: Any, row: int) -> list[int]:
    """The completion of global row ``row``: ``row % K`` copies of ``a`` (its reward), filler, EOS."""
    g = torch.Generator().manual_seed(1000 + row)
    r = row % K
    filler = torch.randint(0, len(CHARS), (int(torch.randint(1, 4, (1,), generator=g)),), generator=g).tolist()
    text = "a" * r + "".join("b" if CHARS[i] == "a" else CHARS[i] for i in filler)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    # rows of odd groups end without EOS (truncated at max_completion_length), the others with EOS
    return ids if (row // K) % 2 else ids + [tokenizer.eos_token_id]


def make_rollout(tokenizer: Any) -> Any:
    def rollout(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        start = trainer.accelerator.process_index * len(prompts)
        prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        completions = [completion_tokens(tokenizer, start + i) for i in range(len(prompts))]
        return {"prompt_ids": prompt_ids, "completion_ids": completions, "logprobs": None}

    return rollout


def reward_count_a(completions: list[str], **kwargs: Any) -> list[float]:
    """Reward = number of ``a`` characters (each group's rewards are a permutation of 0..K-1)."""
    return [float(c.count("a")) for c in completions]


def dataset(n_prompts: int = N_PROMPTS) -> Any:
    from datasets import Dataset

    return Dataset.from_list([{"prompt": PROMPTS[i % len(PROMPTS)]} for i in range(n_prompts)])


class GradCapture:
    """A TrainerCallback that copies the parameter gradients just before the first optimiser step."""

    def __init__(self) -> None:
        from transformers import TrainerCallback

        outer = self

        class _Callback(TrainerCallback):
            def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                if outer.grads is None:
                    outer.grads = {n: p.grad.detach().clone() for n, p in outer.model.named_parameters()
                                   if p.grad is not None}

        self.callback = _Callback()
        self.model: Any = None
        self.grads: dict[str, torch.Tensor] | None = None


def trainer_grads(trainer_cls: Any, config_cls: Any, out_dir: str, n_prompts: int = N_PROMPTS,
                  **config: Any) -> dict[str, torch.Tensor]:
    """Parameter gradients of the first optimiser step of a trainer on the deterministic rollouts."""
    tokenizer = tiny_tokenizer()
    model = tiny_llama(seed=0)
    settings = {"output_dir": out_dir, "num_generations": K, "per_device_train_batch_size": K,
                "max_completion_length": 8, "max_steps": 1, "report_to": "none", "use_cpu": True,
                "save_strategy": "no", "shuffle_dataset": False, "max_grad_norm": 0.0, "learning_rate": 1e-3,
                "logging_steps": 1, "disable_tqdm": True, "seed": 0, "bf16": False, **config}
    args = config_cls(**settings)
    capture = GradCapture()
    trainer = trainer_cls(model=model, reward_funcs=reward_count_a, args=args, train_dataset=dataset(n_prompts),
                          processing_class=tokenizer, rollout_func=make_rollout(tokenizer),
                          callbacks=[capture.callback])
    capture.model = trainer.model
    trainer.train()
    assert capture.grads is not None
    return {n.removeprefix("module."): g for n, g in capture.grads.items()}


def reference_batch(n_prompts: int = N_PROMPTS) -> dict[str, torch.Tensor]:
    """The same rollouts as tensors: prompt ids ``[N, P]``, completion ids / mask ``[N, T]``, rewards ``[G, K]``."""
    tokenizer = tiny_tokenizer()
    rows = n_prompts * K
    prompt_ids = torch.tensor([tokenizer(PROMPTS[(j // K) % len(PROMPTS)], add_special_tokens=False)["input_ids"]
                               for j in range(rows)])
    comps = [completion_tokens(tokenizer, j) for j in range(rows)]
    t = max(len(c) for c in comps)
    ids = torch.full((rows, t), tokenizer.pad_token_id)
    mask = torch.zeros(rows, t, dtype=torch.bool)
    for j, c in enumerate(comps):
        ids[j, :len(c)] = torch.tensor(c)
        mask[j, :len(c)] = True
    texts = tokenizer.batch_decode(ids.masked_fill(~mask, tokenizer.pad_token_id), skip_special_tokens=True)
    rewards = torch.tensor(reward_count_a(texts)).view(n_prompts, K)
    return {"prompt_ids": prompt_ids, "prompt_mask": torch.ones_like(prompt_ids), "completion_ids": ids,
            "token_mask": mask, "rewards": rewards}
