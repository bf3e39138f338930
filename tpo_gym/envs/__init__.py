"""Gymnasium environments of tpo-gym, registered under the ``tpo_gym/`` namespace.

``import tpo_gym`` registers them (one idempotent function, :func:`register_envs`, called at
import). Gymnasium 1.x has no plugin entry points, so make the import explicit where a linter
would drop it::

    import gymnasium as gym
    import tpo_gym

    gym.register_envs(tpo_gym)  # no-op that documents why tpo_gym is imported
    env = gym.make("tpo_gym/TokenReversal-v0")
    venv = gym.make_vec("tpo_gym/TokenReversal-v0", num_envs=1024, vectorization_mode="vector_entry_point")

Registered ids
--------------
===================================== =========================================================
id                                    task and settings
===================================== =========================================================
``tpo_gym/Bandit-v0``                 K-armed single-context bandit (``n_arms=100``)
``tpo_gym/ContextualBandit-v0``       100 contexts x 10 arms (``table_seed`` fixes the table)
``tpo_gym/MNISTBandit-v0``            MNIST contextual bandit (``split``, ``root``)
``tpo_gym/TokenTask-v0``              token task, all kwargs (default reverse_copy, bag, V=2, H=10)
``tpo_gym/TokenCopy-v0``              copy, bag, V=2, H=10
``tpo_gym/TokenFlip-v0``              flip, bag, V=2, H=10
``tpo_gym/TokenReversal-v0``          reverse_copy, bag, V=2, H=10 (Table 1)
``tpo_gym/TokenReverseFlip-v0``       reverse_flip, bag, V=2, H=10
``tpo_gym/TokenCopySequential-v0``    copy, sequential, V=2, H=10 (Table 2)
``tpo_gym/TokenFlipSequential-v0``    flip, sequential, V=2, H=10
``tpo_gym/TokenReversalSequential-v0`` reverse_copy, sequential, V=2, H=10
``tpo_gym/TokenReverseFlipSequential-v0`` reverse_flip, sequential, V=2, H=10
``tpo_gym/TokenReversalTerminal-v0``  reverse_copy, terminal, V=2, H=10 (Table 3; pass ``length``)
``tpo_gym/ReasoningGym-v0``           any Reasoning Gym dataset (``dataset``, ``size``, ``seed``, config);
                                      one-step text episodes, ``max_episode_steps=1``
===================================== =========================================================

Tables 1-3 are the paper's token-task tables (docs/method.md section 6; the tasks: section 3).
Every kwarg of the short ids can still be overridden, e.g.
``gym.make("tpo_gym/TokenReversal-v0", vocab_size=8)``. All but ReasoningGym have a native batched
twin (``vector_entry_point``, ``NEXT_STEP`` autoreset like ``SyncVectorEnv``).

Group API (relied on by the agents)
-----------------------------------
Stated as two ``typing.Protocol`` s, :class:`GroupEnv` and :class:`GroupVectorEnv`, and checked on
any env, yours included, by :func:`check_group_env` (Gymnasium's ``check_env`` plus the group checks;
a broken contract raises :class:`GroupEnvError` naming what is wrong):

* ``env.unwrapped.score_candidates(candidates) -> float32 [K]``: the reward each of K candidate
  actions would get now, at the current state, with no side effects (no step, no copy, no RNG use).
* ``venv.score_candidates(int [num_envs, K]) -> float32 [num_envs, K]`` on native vector envs.
* ``venv.reset(seed=..., options={"group_size": G})`` on native vector envs: sub-envs
  ``i*G..(i+1)*G-1`` share one context; ``num_envs % G != 0`` raises ``ValueError``.
  :class:`NativeVectorEnv` (:mod:`tpo_gym.envs.vector`) implements the reset, autoreset, seeding and
  groups of a native vector env; a subclass adds the task (:class:`NativeTensorEnv`: its on-device form).
* :func:`tpo_gym.envs.group.group_rollout_envs` + :func:`tpo_gym.envs.group.group_reset` for any
  other Gymnasium env: K copies reset with one seed.

Episode summary and reward credit (relied on by the agents' rollout code, which reads no
task-specific field):

* ``info["score"]`` and ``info["error"]``, two Python ``float`` in ``[0, 1]``, in the ``info`` of
  the step that ends an episode (``terminated=True``) and only there:

  ========================= ============================================ ============================
  env                       ``score`` (the paper's episode score)        ``error`` (the logged error)
  ========================= ============================================ ============================
  token, bag / sequential   mean per-step reward, return / H             token error (= ``token_error``)
  token, terminal           exact match, 0.0 or 1.0 (= the return)       1 - exact match
  bandits, MNIST            the reward                                   1 - reward
  ReasoningGym              the dataset's score (= the reward)           1 - score
  ========================= ============================================ ============================

  Native vector envs give them as ``float64 [num_envs]`` arrays with the boolean masks
  ``info["_score"]`` / ``info["_error"]`` (True for the sub-envs whose episode ended at this step,
  entries elsewhere 0.0), exactly as ``SyncVectorEnv`` batches the single envs' infos; the keys
  are absent when no episode ends. The task-specific keys stay (``token_error``, ``exact_match``,
  ``is_success``, ``label``, ...).
* ``reward_credit``, a ``str`` attribute of every env (``env.unwrapped.reward_credit`` or
  ``env.get_wrapper_attr("reward_credit")``) and native vector env (``venv.reward_credit``):
  ``"step"`` (each step's reward is its own credit; the default) or ``"episode"`` (the task's reward
  belongs to the whole episode: single-sample methods credit every step with the episode's total
  reward). Only the terminal token task (``reward="terminal"``, e.g.
  ``tpo_gym/TokenReversalTerminal-v0``) is ``"episode"``: docs/method.md section 3 defines
  ``r_t = 1{all correct}`` at every position, while the env pays it once, at the last step.

Arguments: every env checks its kwargs, ``reset``'s ``seed`` (None or an integer >= 0; numpy
integers too; native vector envs also take a list of one such seed per sub-env) and ``options``
(None or a dict with str keys), raising ``ValueError`` worded ``"<name> must be <allowed>, got
<value>"``. Sizes have maxima that fit the spaces and arrays (e.g. ``vocab_size <= 2**62``,
``length <= 2**16``, ``n_contexts <= 2**24``, ``num_envs <= 2**20``), named in the error.
Native vector envs' ``observation_space`` / ``action_space`` equal ``SyncVectorEnv``'s
(``gymnasium.vector.utils.batch_space`` of the single spaces).

Details in :mod:`tpo_gym.envs.group`. Pure helpers: :func:`tpo_gym.envs.token_task.token_targets`,
:func:`tpo_gym.envs.token_task.step_rewards`, :func:`tpo_gym.envs.bandit.correct_arm_table`,
:func:`tpo_gym.envs.mnist_data.load_mnist`.
"""

from __future__ import annotations

from typing import Any

from gymnasium.envs.registration import register, registry

from tpo_gym.envs.checker import GroupEnvError, check_group_env
from tpo_gym.envs.group import GroupEnv, GroupVectorEnv, group_reset, group_rollout_envs, score_candidates
from tpo_gym.envs.vector import NativeTensorEnv, NativeVectorEnv

__all__ = [
    "register_envs",
    "ENV_IDS",
    "GroupEnv",
    "GroupVectorEnv",
    "NativeVectorEnv",
    "NativeTensorEnv",
    "check_group_env",
    "GroupEnvError",
    "score_candidates",
    "group_rollout_envs",
    "group_reset",
]

_M = "tpo_gym.envs"

_TOKEN_SHORT_IDS: dict[str, dict[str, Any]] = {
    "TokenCopy-v0": {"target": "copy", "reward": "bag"},
    "TokenFlip-v0": {"target": "flip", "reward": "bag"},
    "TokenReversal-v0": {"target": "reverse_copy", "reward": "bag"},
    "TokenReverseFlip-v0": {"target": "reverse_flip", "reward": "bag"},
    "TokenCopySequential-v0": {"target": "copy", "reward": "sequential"},
    "TokenFlipSequential-v0": {"target": "flip", "reward": "sequential"},
    "TokenReversalSequential-v0": {"target": "reverse_copy", "reward": "sequential"},
    "TokenReverseFlipSequential-v0": {"target": "reverse_flip", "reward": "sequential"},
    "TokenReversalTerminal-v0": {"target": "reverse_copy", "reward": "terminal"},
}

_SPECS: dict[str, dict[str, Any]] = {
    "Bandit-v0": {
        "entry_point": f"{_M}.bandit:BanditEnv",
        "vector_entry_point": f"{_M}.bandit:BanditVectorEnv",
    },
    "ContextualBandit-v0": {
        "entry_point": f"{_M}.bandit:ContextualBanditEnv",
        "vector_entry_point": f"{_M}.bandit:ContextualBanditVectorEnv",
    },
    "MNISTBandit-v0": {
        "entry_point": f"{_M}.mnist_bandit:MNISTBanditEnv",
        "vector_entry_point": f"{_M}.mnist_bandit:MNISTBanditVectorEnv",
    },
    "TokenTask-v0": {
        "entry_point": f"{_M}.token_task:TokenTaskEnv",
        "vector_entry_point": f"{_M}.token_task:TokenTaskVectorEnv",
    },
    **{
        name: {
            "entry_point": f"{_M}.token_task:TokenTaskEnv",
            "vector_entry_point": f"{_M}.token_task:TokenTaskVectorEnv",
            "kwargs": {**kw, "vocab_size": 2, "length": 10},
        }
        for name, kw in _TOKEN_SHORT_IDS.items()
    },
    "ReasoningGym-v0": {"entry_point": f"{_M}.reasoning_gym_env:ReasoningGymEnv", "max_episode_steps": 1},
}

#: Every id this package registers.
ENV_IDS: tuple[str, ...] = tuple(f"tpo_gym/{name}" for name in _SPECS)


def register_envs() -> None:
    """Register every tpo_gym environment; safe to call any number of times (skips known ids)."""
    for name, spec in _SPECS.items():
        env_id = f"tpo_gym/{name}"
        if env_id in registry:
            continue
        register(id=env_id, **spec)


register_envs()
