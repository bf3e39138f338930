"""The single-file example examples/tpo_minimal.py: self-contained, and the library's TPO_token bit for bit."""

from __future__ import annotations

import ast
import runpy
from pathlib import Path
from types import SimpleNamespace

import gymnasium as gym
import pytest
import torch

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tpo_minimal.py"


def _load_example() -> SimpleNamespace:
    return SimpleNamespace(**runpy.run_path(str(EXAMPLE), run_name="tpo_minimal"))


def test_tpo_minimal_uses_only_the_objectives_and_the_env() -> None:
    tree = ast.parse(EXAMPLE.read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert {m for m in imported if m.startswith("tpo_gym")} == {"tpo_gym", "tpo_gym.objectives"}
    assert len(EXAMPLE.read_text().splitlines()) <= 180, "one readable page"


def test_tpo_minimal_reproduces_the_library_tpo_token_curve_bit_for_bit() -> None:
    """Same seed, tiny size: the same error and loss at every iteration and the same final weights."""
    from tpo_gym import TPO

    example = _load_example()
    args = example.parse_args(["--length", "4", "--iterations", "5", "--batch-size", "8", "--group-size", "4",
                               "--d-model", "16", "--n-layers", "1", "--n-heads", "2", "--d-ff", "32", "--seed", "3"])
    threads = torch.get_num_threads()
    try:
        history, model = example.main(args)
    finally:
        torch.set_num_threads(threads)
    agent = TPO("TransformerPolicy", gym.make(args.env_id, vocab_size=args.vocab_size, length=args.length),
                level="token", batch_size=args.batch_size, group_size=args.group_size, n_epochs=args.epochs,
                eta=args.eta, learning_rate=args.learning_rate, seed=args.seed,
                policy_kwargs={"d_model": args.d_model, "n_layers": args.n_layers, "n_heads": args.n_heads,
                               "d_ff": args.d_ff})
    agent.learn(total_timesteps=args.iterations * agent.steps_per_iteration)
    assert [(h["error"], h["loss"]) for h in history] == [(h["error"], h["loss"]) for h in agent.history]
    assert len({h["error"] for h in history}) > 1, "the curve moves"
    ours, theirs = model.state_dict(), agent.policy.state_dict()
    assert list(ours) == list(theirs)
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), name


@pytest.mark.parametrize("flag", ["--iterations", "--eta"])
def test_tpo_minimal_flags_parse_to_their_field_type(flag: str) -> None:
    args = _load_example().parse_args([flag, "3"])
    assert getattr(args, flag[2:]) == 3 and type(getattr(args, flag[2:])) is type(getattr(type(args), flag[2:]))
