"""Policies and optimisers: the networks that act (:class:`MlpPolicy`, :class:`TransformerPolicy`) and how they step.

=========================  ==========================================================================
``categorical``            :class:`CategoricalPolicy` (the base: a categorical head over Discrete actions,
                           safe policy save / load), :class:`MlpPolicy`
``gaussian``               :class:`GaussianMlpPolicy` (Box actions: a diagonal-Gaussian head, what
                           ``"MlpPolicy"`` builds on a Box action space)
``transformer``            :class:`TransformerPolicy` (the token tasks' causal transformer, both setups)
``optimizers``             :class:`MuonAdamW` (Muon on 2-D weights, AdamW on the rest)
``reference_setup``        the reference code's Muon and initialisers (``setup="reference"``)
``stacked_optim``          the optimisers of S seeds stacked in one process (``SeedBatch``)
=========================  ==========================================================================

This package imports only :mod:`tpo_gym.agents.files` below it; language-model policies are
:mod:`tpo_gym.agents.lm`.
"""

from tpo_gym.agents.policies.categorical import (
    SETUPS,
    CategoricalPolicy,
    MlpPolicy,
    check_observations,
    is_empty_batch,
    stacked_linear,
)
from tpo_gym.agents.policies.gaussian import GaussianMlpPolicy
from tpo_gym.agents.policies.optimizers import MuonAdamW
from tpo_gym.agents.policies.transformer import TransformerPolicy, stacked_embedding, stacked_layer_norm

__all__ = ["CategoricalPolicy", "MlpPolicy", "GaussianMlpPolicy", "TransformerPolicy", "MuonAdamW",
           "check_observations", "SETUPS", "is_empty_batch", "stacked_linear", "stacked_embedding",
           "stacked_layer_norm"]
