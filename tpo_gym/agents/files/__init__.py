"""Files: the containers and plain-data encodings of saved agents; loading executes nothing from a file.

=========================  ==========================================================================
``agent_files``            the agent zip (plain JSON + ``weights_only`` tensors) and a language model's directory
``serialization``          spaces, classes, settings and schedules as plain data, and back, checked
=========================  ==========================================================================

The bottom of :mod:`tpo_gym.agents`: it imports nothing else of the agents. What ``tpo_gym.json`` holds, field
by field, is :mod:`tpo_gym.agents.common.persistence`; a language model's own files are
:mod:`tpo_gym.agents.lm.files`.
"""
