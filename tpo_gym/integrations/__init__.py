"""Optional integrations of tpo-gym with other libraries (each imports its library only in its module).

* :mod:`tpo_gym.integrations.trl`: TPO as a TRL trainer (``TargetPOTrainer``), Reasoning Gym prompt
  datasets and reward functions for TRL (``pip install 'tpo-gym[llm]'``).
"""
