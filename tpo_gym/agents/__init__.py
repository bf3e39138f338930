"""Stable-Baselines3-style agents: TPO and the paper's baselines."""
