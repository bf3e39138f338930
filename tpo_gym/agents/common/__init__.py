"""The shared machinery of the agents, as Stable-Baselines3's ``common/``: base classes, rollouts, update, saving.

=========================  ==========================================================================
``spec``                   :class:`~tpo_gym.agents.common.spec.AlgorithmSpec`: what an agent class is
``registry``               :func:`~tpo_gym.agents.common.registry.register_algorithm` and the lookups
``algorithm_base``         ``AlgorithmBase`` (SB3's ``BaseAlgorithm``: settings, env, policy, save / load)
``base``                   ``GroupAlgorithm`` (SB3's ``OnPolicyAlgorithm``: rollouts, update, ``learn``)
``grouping``               what a group is in a run, and the group diagnostics
``update``                 the typed batches of each method family and the one epoch loop
``sampling``               rollouts and candidate sampling in Discrete envs
``env_setup``              which env forms an agent accepts
``env_copies``             how rollout envs are rebuilt from the agent's env
``sb3_conventions``        SB3's callbacks, logger and progress bar, as SB3 runs them
``persistence``            the agent file's schema: ``save`` / ``load``
``seed_batch``             ``SeedBatch`` / ``train_seeds``: S seeds of one agent in one process
=========================  ==========================================================================
"""
