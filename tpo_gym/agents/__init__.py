"""Stable-Baselines3-style agents: TPO and the paper's baselines.

=============== ======================================================================
``TPO``         Target Policy Optimization (token / sequence level, ``candidates="single"``
                for MNIST, ``anchor=False`` ablation)
``GRPO``        GRPO with k3 KL (``beta=0.0``, ``mask_zero_variance=True`` ablations)
``GroupPG``     TPO's groups with scalar weighting (ablation)
``PPO``         the paper's critic-free PPO (not SB3's)
``REINFORCE``   policy gradient with a batch-mean or expected-reward baseline
``DG``          Delightful Policy Gradient
``CE``          the supervised oracle
=============== ======================================================================

All share :class:`~tpo_gym.agents.base.GroupAlgorithm` (on SB3's ``BaseAlgorithm``, split as SB3 splits its
own: :mod:`~tpo_gym.agents.algorithm_base` and :mod:`~tpo_gym.agents.base`; docs/architecture.md): ``learn``,
``predict``, ``save`` / ``load`` (plain JSON + ``weights_only`` tensors: loading runs no code from the
file), SB3 callbacks and logger, ``history``, ``steps_per_iteration``. Policies: ``MlpPolicy``,
``TransformerPolicy`` (Discrete actions) and ``CausalLMPolicy`` (a Hugging Face language model on a
text env such as ``tpo_gym/ReasoningGym-v0``; TPO, GRPO and GroupPG). :func:`train_seeds` /
:class:`SeedBatch` train S seeds of one agent in one process (``tpo_gym.agents.seed_batch``).
"""

# The import order is the registration order: the registry's, the report's, the paper's.
# isort: off
from tpo_gym.agents.tpo import TPO as TPO
from tpo_gym.agents.grpo import GRPO as GRPO
from tpo_gym.agents.group_pg import GroupPG as GroupPG
from tpo_gym.agents.single import DG as DG, PPO as PPO, REINFORCE as REINFORCE
from tpo_gym.agents.ce import CE as CE
# isort: on
from tpo_gym.agents.base import GroupAlgorithm
from tpo_gym.agents.lm import CausalLMPolicy
from tpo_gym.agents.policies import CategoricalPolicy, MlpPolicy, MuonAdamW, TransformerPolicy
from tpo_gym.agents.prompts import PromptFormat
from tpo_gym.agents.registry import AlgorithmSpec, algorithm_registry, register_algorithm
from tpo_gym.agents.seed_batch import SeedBatch, train_seeds

__all__ = [
    *algorithm_registry(),  # the agent classes: TPO, GRPO, GroupPG, PPO, REINFORCE, DG, CE
    "GroupAlgorithm",
    "CategoricalPolicy",
    "MlpPolicy",
    "TransformerPolicy",
    "CausalLMPolicy",
    "PromptFormat",
    "MuonAdamW",
    "SeedBatch",
    "train_seeds",
    "AlgorithmSpec",
    "algorithm_registry",
    "register_algorithm",
]
