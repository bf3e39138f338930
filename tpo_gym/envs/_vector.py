"""Old private path of :mod:`tpo_gym.envs.vector` (the native vector env base classes), kept as an alias."""

from tpo_gym.envs.vector import NativeTensorEnv, NativeVectorEnv

__all__ = ["NativeVectorEnv", "NativeTensorEnv"]
