"""The shared base of every tpo-gym agent: :class:`GroupAlgorithm`, the iteration on top of :class:`AlgorithmBase`.

An iteration ("episode" in the paper's sense) is::

    batch = self.collect_rollouts()                 # pi_old: K candidates or K rollouts per context
    update = self.begin_update()                    # view(logp_old) -> prepare(): frozen targets / advantages
    stats = run_epochs(n_epochs, ...)               # full-batch optimiser steps on compute_loss()
    self.record_iteration(batch, self.finish_update(update, stats))

The parts, one job each, on Stable-Baselines3's lines: :mod:`~tpo_gym.agents.common.algorithm_base` (SB3's
``BaseAlgorithm``: settings, env, seeding, policy, ``predict``, ``save`` / ``load``); this module (SB3's
``OnPolicyAlgorithm``: rollouts, update, ``learn``, logging); :mod:`~tpo_gym.agents.common.grouping` (what a group is,
the G x K view, scores, group diagnostics); :mod:`~tpo_gym.agents.common.sampling` and
:mod:`~tpo_gym.agents.lm.text_rollouts` (rollouts, discrete and text); :mod:`~tpo_gym.agents.common.update` (the typed
batches ``prepare`` hands ``compute_loss``, and the one epoch loop, which :class:`~tpo_gym.agents.SeedBatch`
reuses); :mod:`~tpo_gym.agents.common.persistence` (the whole file schema, zip and language-model directory).
Subclasses supply only :meth:`GroupAlgorithm.prepare` and :meth:`GroupAlgorithm.compute_loss`, each a few lines
that call the objectives of :mod:`tpo_gym.objectives`.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TypeVar

import numpy as np
import torch
from stable_baselines3.common.callbacks import BaseCallback, ConvertCallback
from stable_baselines3.common.type_aliases import MaybeCallback
from stable_baselines3.common.utils import safe_mean

from tpo_gym._validation import check_bool, check_int
from tpo_gym.agents.common import grouping as groups
from tpo_gym.agents.common.algorithm_base import BUDGETS, LEVELS, AlgorithmBase
from tpo_gym.agents.common.env_copies import reward_wrappers
from tpo_gym.agents.common.grouping import Grouping
from tpo_gym.agents.common.sampling import RolloutBatch, collect_rollouts
from tpo_gym.agents.common.sb3_conventions import (
    IterationProgressBar,
    complete_signature,
    count_progress_by_steps,
    record_in_monitors,
    step_order,
    user_monitors,
)
from tpo_gym.agents.common.update import Update, accumulate_text_gradients, resolve_records, run_epochs
from tpo_gym.agents.lm.text_rollouts import TextBatch, collect_text_rollouts
from tpo_gym.agents.policies.gaussian import box_view, is_box_policy

__all__ = ["GroupAlgorithm", "Grouping", "resolve_records", "LEVELS", "BUDGETS"]

_IterationProgressBar = IterationProgressBar  # the name tests patch
#: Hooks of the agent class before its split (2026-12), and what a subclass overrides now: a subclass that still
#: defines an old one is refused at class creation (it would be silently ignored).
RENAMED_HOOKS = {
    "_grouping": "choose_grouping", "_needs_reference": "needs_reference", "_begin_update": "begin_update",
    "_train_update": "train (or compute_loss)", "_accumulate_text_gradients": "compute_loss / token_penalty",
    "_resolve_env": "set_env", "_settings": "nothing (persistence.agent_settings reads the constructor)",
    "_record_iteration": "record_iteration", "_episode_means": "episode_infos", "_iteration_seed": "rollout_seed",
    "_get_rollout_env": "get_rollout_env", "_rollout_device": "rollout_device", "_learn": "learn",
    "_save_language_model": "save", "_trained_parameters": "begin_update",
    "episode_means": "episode_infos (rollout/ep_*_mean are read from ep_info_buffer, as in SB3)",
}
SelfGroupAlgorithm = TypeVar("SelfGroupAlgorithm", bound="GroupAlgorithm")


class GroupAlgorithm(AlgorithmBase):
    """Base of TPO, GRPO, Group PG, PPO, REINFORCE, DG and the CE oracle (not used directly).

    Subclasses take their own arguments and forward the rest by keyword; the full signature and the
    ``:param:`` lines of the inherited arguments are added to each subclass automatically.

    :param policy: ``"MlpPolicy"``, ``"TransformerPolicy"`` or a :class:`CategoricalPolicy` subclass.
    :param env: a Gymnasium env instance or a registered id (``"tpo_gym/TokenReversal-v0"``), a Gymnasium
        ``VectorEnv`` made by ``gym.make_vec``, or an SB3 ``DummyVecEnv`` / ``SubprocVecEnv`` of registered
        envs; its action space must be ``Discrete``. Rollouts run in the agent's own ``gym.make_vec``
        copies of the env (``vector_entry_point`` for tpo_gym envs), rebuilt from its spec.
    :param learning_rate: learning rate (float or SB3 schedule of the remaining progress); ``None``
        (default): 1e-3, or 1e-5 with ``CausalLMPolicy`` (AdamW, as the paper's LLM runs).
    :param batch_size: B, contexts (prompts, images) per iteration.
    :param group_size: K, candidates per context (group methods) or the interaction multiplier
        (single-sample methods with ``budget="interaction"``).
    :param n_epochs: E, full-batch optimiser steps per batch.
    :param level: ``"token"`` (each state is a group of K candidate actions scored by the env's group
        API; for one-step tasks: K candidates per context), ``"sequence"`` (K complete rollouts per
        context, scored by the env's episode ``score``), or ``"auto"`` (token when the env has the
        group API, else sequence). Group methods only.
    :param budget: ``"prompt"`` (every method sees B contexts) or ``"interaction"`` (single-sample
        methods see B*K contexts and use ``learning_rate * sqrt(K)``; no effect on group methods).
    :param max_grad_norm: clip the gradient to this global L2 norm; ``None`` (default): no clipping.
    :param skip_uninformative_steps: an ablation (off by default; group methods): in an iteration where no group
        carries signal (every group's scores are equal, ``zero_variance_fraction == 1``, e.g. the all-fail plateau
        of a terminal reward), take no optimiser step at all. The true gradient there is 0 for TPO and GRPO
        without KL; what is left is rounding noise (and GRPO's KL term), which Muon and Adam would turn into a
        full step (docs/method.md section 5a). The iteration still logs its loss and first-epoch gradient norm
        (one epoch, no step; the logger's ``train/step_skipped`` is 1).
    :param n_threads: torch CPU threads during ``learn`` (restored afterwards). Default 1: these models
        are tiny, and one thread is fastest (more threads only add OpenMP synchronisation, which
        is many times slower on a busy machine). ``None`` keeps torch's setting.
    :param stats_window_size: SB3's window of the episode statistics: ``rollout/ep_rew_mean`` and
        ``rollout/ep_len_mean`` are means over the last ``stats_window_size`` episodes (``ep_info_buffer``).
    :param tensorboard_log: tensorboard log dir, or ``None``.
    :param policy_kwargs: keyword arguments of the policy (``net_arch``, ``optimizer_class``,
        ``optimizer_kwargs``, ``d_model``, ...).
    :param verbose: 0 silent, 1 training logs, 2 debug.
    :param seed: seed of the initialisation, the env resets and the action draws.
    :param device: torch device (default ``"cpu"``: these models are small); ``"cuda"`` / ``"cuda:N"``
        need that CUDA device here (else ``ValueError``); ``"auto"``: CUDA when available, else the CPU.
    :param rollouts_on_device: roll out in the env's on-device tensor form (the token tasks:
        :class:`~tpo_gym.envs.token_task.TokenTaskTensorEnv`; MNIST:
        :class:`~tpo_gym.envs.mnist_bandit.MNISTBanditTensorEnv`), so rollout, candidate scoring and the
        batch stay on ``device`` with no host round trip inside an iteration. ``None`` (default): when
        ``device`` is CUDA and the env has that form; ``True``: always (an env without one raises);
        ``False``: the numpy envs. Same values either way (tested on CPU).
    :param _init_setup_model: build the networks (``False`` is used by ``load``).
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Give each agent class its full signature and the ``:param:`` lines of inherited arguments."""
        super().__init_subclass__(**kwargs)
        renamed = {name: new for name, new in RENAMED_HOOKS.items() if name in cls.__dict__}
        if renamed:
            raise TypeError(f"{cls.__name__} overrides {', '.join(sorted(renamed))}, which GroupAlgorithm no longer "
                            f"calls: override {', '.join(renamed[n] for n in sorted(renamed))} instead "
                            "(docs/architecture.md)")
        if "spec" in cls.__dict__:
            cls.sampling = cls.spec.sampling
        if "__init__" in cls.__dict__:
            complete_signature(cls, AlgorithmBase.__init__, GroupAlgorithm.__doc__ or "", cls.fixed_params)

    # ------------------------------------------------------------------------------------------
    # one iteration
    # ------------------------------------------------------------------------------------------
    def rollout_seed(self) -> int:
        """The seed of this agent's next rollout: a function of its seed and the rollout's index only."""
        return int(np.random.SeedSequence([self._base_seed, self._rollout_index]).generate_state(1, np.uint64)[0] >> 2)

    def next_rollout_seed(self) -> int:
        """:meth:`rollout_seed`, and the index moves on (for a caller that collects the rollout itself)."""
        seed = self.rollout_seed()
        self._rollout_index += 1
        return seed

    def collect_rollouts(self) -> RolloutBatch | TextBatch:
        """Collect the batch of the next iteration with the current policy (pi_old).

        The rollout index moves on only once the batch is collected: a rollout stopped by an exception (an
        interrupt, an env error) is drawn again, with the same seed, by the next call.
        """
        grouping = self.require_grouping()
        if self._text:
            batch: RolloutBatch | TextBatch = collect_text_rollouts(
                self.policy, self._get_text_env(), self.batch_size, self.group_size, seed=self.rollout_seed(),
                with_reference=self.needs_reference())
        else:
            batch = collect_rollouts(self.policy, self.get_rollout_env(), seed=self.rollout_seed(),
                                     n_candidates=grouping.n_candidates, score_all_actions=grouping.score_all_actions,
                                     group_size=grouping.rollout_group)
        self._rollout_index += 1
        return batch

    def view(self, logp: torch.Tensor, batch: RolloutBatch) -> torch.Tensor:
        """The log-probs the objective reads (:func:`~tpo_gym.agents.common.grouping.view` by this agent's grouping; Box
        actions: :func:`~tpo_gym.agents.policies.gaussian.box_view`)."""
        if is_box_policy(self.policy):
            return box_view(self.require_grouping().kind, logp, batch, self.policy.length_normalize)
        return groups.view(self.require_grouping(), logp, batch)

    def needs_reference(self) -> bool:
        """Whether the rollouts must also score completions under a frozen reference model."""
        return False

    def token_penalty(self, batch: TextBatch, start: int, stop: int, token_logp: torch.Tensor) -> torch.Tensor | None:
        """A per-token term added to the loss of groups ``start .. stop-1`` of a language model (``None``: none).

        ``token_logp`` are the completions' token log-probs under the current policy (with gradient); the
        term is a mean over those completions, weighted like the loss in micro-batches (TPO's ``beta`` KL).
        """
        return None

    single_candidate_scores = staticmethod(groups.single_candidate_scores)
    group_diagnostics = staticmethod(groups.group_diagnostics)

    def group_scores(self, batch: RolloutBatch | TextBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Scores of the groups and their validity mask, shaped like :meth:`view`: a sequence-level group scores
        its rollouts by the rewards of the user's reward wrappers where the rollouts apply any
        (:func:`~tpo_gym.agents.common.grouping.group_scores`)."""
        grouping = self.require_grouping()
        if grouping.kind != "rollouts" or isinstance(batch, TextBatch):
            return groups.group_scores(grouping, batch)
        env = self.get_rollout_env()
        wrapped = reward_wrappers(env.venv.envs[0]) if hasattr(env.venv, "envs") else []
        return groups.group_scores(grouping, batch, wrapped, env.horizon)

    def prepare(self, batch: RolloutBatch, old: torch.Tensor) -> tuple[Any, dict[str, Any]]:
        """Frozen quantities of the update (a typed batch of :mod:`~tpo_gym.agents.common.update`: targets,
        advantages) and diagnostics of the batch.

        :param batch: the rollouts.
        :param old: :meth:`view` of the rollout-time log-probs.
        """
        raise NotImplementedError

    def compute_loss(self, batch: RolloutBatch, prepared: Any, current: torch.Tensor) -> torch.Tensor:
        """The objective for the current log-probs ``current`` (:meth:`view` of ``log pi_theta``)."""
        raise NotImplementedError

    def group_weights(self, prepared: Any, n_groups: int) -> torch.Tensor:
        """``[G]`` weights of the groups in the loss's mean (all 1; GRPO zv-masked: informative only).

        Micro-batches scale their loss by their share of the total weight, so accumulating them
        gives exactly the full-batch gradient.
        """
        return torch.ones(n_groups)

    def loss_from_logits(self, batch: RolloutBatch, prepared: Any, logits: torch.Tensor) -> torch.Tensor:
        """The objective of one epoch from the policy's step logits ``[N, T, n_actions]`` of ``batch.obs`` (Box
        actions: the Gaussian's parameters, read at the batch's own actions)."""
        if is_box_policy(self.policy):
            return self.compute_loss(batch, prepared, self.view(self.policy.batch_log_probs(logits, batch), batch))
        return self.compute_loss(batch, prepared, self.view(torch.log_softmax(logits, dim=-1), batch))

    def begin_update(self) -> Update:
        """The part of an update before the epochs: the batch, its prepared quantities, its diagnostics."""
        batch = self.rollout_batch
        if batch is None:
            raise RuntimeError("no rollout batch: call collect_rollouts() first")
        self.policy.set_training_mode(True)
        if not hasattr(self, "_logger"):  # train() called outside learn()
            from stable_baselines3.common.utils import configure_logger

            self._logger = configure_logger(0)
        self._update_learning_rate(self.policy.optimizer)
        old = batch.logp_old if isinstance(batch, TextBatch) else self.view(batch.logp_old, batch)
        prepared, diagnostics = self.prepare(batch, old)
        params = [p for p in self.policy.parameters() if p.requires_grad]
        return Update(batch, prepared, diagnostics, params)

    def backward_loss(self, update: Update) -> torch.Tensor:
        """One epoch's loss of ``update``, back-propagated (a language model: over micro-batches)."""
        if isinstance(update.batch, TextBatch):
            return accumulate_text_gradients(self, update.batch, update.prepared)
        batch = update.batch
        if self.policy.shares_group_prefix and self.require_grouping().kind == "rollouts":  # a prompt once per group
            logits = self.policy.step_logits(batch.obs, group_size=batch.group_size)
        else:
            logits = self.policy.step_logits(batch.obs)
        loss = self.loss_from_logits(batch, update.prepared, logits)
        loss.backward()
        return loss

    def finish_update(self, update: Update, stats: dict[str, float]) -> dict[str, Any]:
        """The update's record: the epoch loop's ``stats`` and the batch's diagnostics."""
        self._n_updates += self.n_epochs
        diagnostics = update.diagnostics
        batch = update.batch
        if isinstance(batch, TextBatch):  # timings go to the logger only: the history stays a pure function of the seed
            batch.stats["update_s"] = time.perf_counter() - update.started
            diagnostics = {**diagnostics, "completion_length": batch.stats["completion_length"],
                           "mean_score": float(batch.scores.mean())}
        return {**stats, **diagnostics}

    def train(self) -> dict[str, Any]:
        """Update the policy on ``self.rollout_batch``: ``n_epochs`` full-batch optimiser steps
        (:func:`~tpo_gym.agents.common.update.run_epochs`).

        The objectives' value checks of the whole update are read back together at its end
        (:func:`~tpo_gym.objectives.deferred_checks`; immediate on CPU).
        """
        from tpo_gym.objectives import deferred_checks

        with deferred_checks():
            update = self.begin_update()
            optimizer = self.policy.optimizer
            skip = self.skips_step(update)
            (stats,) = run_epochs(1 if skip else self.n_epochs, [update.params], [self.max_grad_norm],
                                  lambda: optimizer.zero_grad(set_to_none=True), lambda: [self.backward_loss(update)],
                                  (lambda: None) if skip else optimizer.step)
            if skip:
                optimizer.zero_grad(set_to_none=True)
            return self.finish_update(update, stats)

    def skips_step(self, update: Update) -> bool:
        """Whether ``skip_uninformative_steps`` skips this update's optimiser step: no group carries signal
        (``zero_variance_fraction`` is 1). Logged as ``train/step_skipped``."""
        if not self.skip_uninformative_steps:
            return False
        fraction = update.diagnostics.get("zero_variance_fraction")
        skip = fraction is not None and float(fraction) >= 1.0
        if hasattr(self, "_logger"):
            self.logger.record("train/step_skipped", int(skip))
        return skip

    # ------------------------------------------------------------------------------------------
    # learn
    # ------------------------------------------------------------------------------------------
    def _setup_learn(
        self,
        total_timesteps: int,
        callback: MaybeCallback = None,
        reset_num_timesteps: bool = True,
        tb_log_name: str = "run",
        progress_bar: bool = False,
    ) -> tuple[int, BaseCallback]:
        """SB3's setup; in addition ``reset_num_timesteps`` restarts ``history`` (rollout seeds go on)."""
        if reset_num_timesteps:
            self._iteration = 0
            self.history = []
        return super()._setup_learn(total_timesteps, callback, reset_num_timesteps, tb_log_name, progress_bar)

    def _init_callback(self, callback: MaybeCallback, progress_bar: bool = False) -> BaseCallback:
        callback = super()._init_callback(callback, progress_bar)
        count_progress_by_steps(callback)
        return callback

    def learn(
        self: SelfGroupAlgorithm,
        total_timesteps: int,
        callback: MaybeCallback = None,
        log_interval: int = 1,
        tb_log_name: str = "run",
        reset_num_timesteps: bool = True,
        progress_bar: bool = False,
    ) -> SelfGroupAlgorithm:
        """Train until ``num_timesteps``, the env steps actually taken, reaches ``total_timesteps``.

        As SB3's ``learn`` stops at a rollout's end, this one stops at the end of the first iteration whose
        steps bring ``num_timesteps`` to ``total_timesteps`` or past it. On fixed-length envs (every tpo_gym env)
        an iteration takes exactly ``steps_per_iteration`` steps, so ``n * steps_per_iteration`` is ``n``
        iterations; on an env whose episodes vary (CartPole) an iteration takes as many steps as its episodes
        last (``history[i]["num_timesteps"]``).

        Callbacks see SB3's counts: ``on_step`` once per ``n_envs`` env steps (``n_envs`` is 1 for one env),
        replayed after the rollout and before the update (:meth:`after_rollout`), so ``eval_freq`` /
        ``save_freq`` of SB3 callbacks count env steps as with SB3's own agents; returning ``False`` stops.
        ``ep_info_buffer`` gets every episode rolled out (``rollout/ep_rew_mean`` is its mean, as in SB3).

        Calling ``learn`` again continues with fresh rollouts (the rollout seeds go on, as SB3's agents keep
        their env and RNG); ``reset_num_timesteps=True`` restarts the step count and ``history`` only.

        :param total_timesteps: env steps to train for (an int, or an integral float such as ``1e5``).
        :param callback: SB3 callback(s).
        :param log_interval: dump the logs every ``log_interval`` iterations.
        :param tb_log_name: tensorboard run name.
        :param reset_num_timesteps: start the step count (and ``history``) from 0, or continue them.
        :param progress_bar: show a progress bar (tqdm / rich) over the env steps.
        :return: self.
        """
        total_timesteps = check_int("total_timesteps", total_timesteps, 0, allow_integral_float=True)
        log_interval = check_int("log_interval", log_interval, 1)
        check_bool("reset_num_timesteps", reset_num_timesteps)
        previous_threads = torch.get_num_threads()
        if self.n_threads is not None:
            torch.set_num_threads(self.n_threads)
        try:
            total_timesteps, callback = self.start_learning(total_timesteps, callback, reset_num_timesteps,
                                                            tb_log_name, progress_bar)
            while self.num_timesteps < total_timesteps:
                callback.on_rollout_start()
                batch = self.collect_rollouts()
                if not self.after_rollout(batch, callback, total_timesteps):
                    break
                self.record_iteration(batch, self.train(), log_interval)
            callback.on_training_end()
            return self
        finally:
            torch.set_num_threads(previous_threads)

    def start_learning(self, total_timesteps: int, callback: MaybeCallback = None, reset_num_timesteps: bool = True,
                       tb_log_name: str = "run", progress_bar: bool = False) -> tuple[int, BaseCallback]:
        """What ``learn`` does before its first iteration: SB3's setup (counters, logger, callbacks), the rollout
        env, ``on_training_start``. Returns the total step count to reach and the callback."""
        self.require_grouping()
        total_timesteps, callback = self._setup_learn(total_timesteps, callback, reset_num_timesteps, tb_log_name,
                                                      progress_bar)
        if self._text:
            self._get_text_env()
        else:
            self.get_rollout_env()
        callback.on_training_start(locals(), globals())
        return total_timesteps, callback

    def after_rollout(self, batch: RolloutBatch | TextBatch, callback: BaseCallback, total_timesteps: int) -> bool:
        """Take ``batch`` as the iteration's rollouts: count its env steps and call ``on_step`` for them as SB3
        does (``False``: stop, returned at once), fill ``ep_info_buffer``, call ``on_rollout_end`` and move the
        progress the learning-rate schedule reads.

        SB3 calls ``on_step`` once per ``env.step()`` of its ``n_envs`` envs, after ``num_timesteps += n_envs``.
        The rollout ran whole before this (the policy does not change within it), so its ``batch.n_steps`` env
        steps are replayed in the order they were taken
        (:func:`~tpo_gym.agents.common.sb3_conventions.step_order`): one ``on_step`` per ``n_envs`` of them (the
        last call may cover fewer), ``num_timesteps`` at each call counting the steps up to it, and the locals
        ``dones`` / ``infos`` (``[n_envs]``) marking the episodes that end there, with SB3 ``Monitor``'s
        ``{"episode": {"r", "l", "t"}}``. So ``n_calls * n_envs`` is ``num_timesteps`` (rounded up per
        iteration), and ``EvalCallback(eval_freq=N)`` / ``CheckpointCallback(save_freq=N)`` with one env fire
        every N env steps. An env step is one step of one episode: candidates scored at a state are not
        steps (one is taken), a one-step episode (bandit, MNIST, one text completion) is one step. Stopped by
        a callback, ``num_timesteps`` still counts the whole rollout (its steps were taken).
        """
        self.rollout_batch = batch
        if isinstance(batch, TextBatch) or batch.step_mask is None:  # every episode as long as the batch: no read-back
            lengths = np.full(len(batch.returns), 1 if isinstance(batch, TextBatch) else batch.obs.shape[1], np.int64)
        else:
            lengths = batch.lengths.cpu().numpy()
        episodes = self.episode_infos(batch, lengths)
        start, n_envs = self.num_timesteps, max(int(getattr(self, "n_envs", 1)), 1)
        end = start + int(lengths.sum())
        ends, which = step_order(lengths)
        callback.update_locals(locals())
        n_calls, ended = -(-(end - start) // n_envs), 0
        if type(callback) is ConvertCallback and callback.callback is None:  # no callback: the counts only
            callback.n_calls, callback.num_timesteps, ended, n_calls = callback.n_calls + n_calls, end, len(ends), 0
        for call in range(n_calls):
            self.num_timesteps = stop = min(start + (call + 1) * n_envs, end)
            dones, infos = np.zeros(n_envs, np.bool_), [{} for _ in range(n_envs)]
            first = ended
            while ended < len(ends) and start + ends[ended] < stop:
                k = int(ends[ended]) - call * n_envs
                dones[k], infos[k] = True, episodes[int(which[ended])]
                ended += 1
            callback.update_locals({"dones": dones, "infos": infos})
            if not callback.on_step():
                self.num_timesteps = end
                self.fill_info_buffer(episodes, ends, which[:first], n_envs)
                return False
        self.num_timesteps = end
        self.fill_info_buffer(episodes, ends, which[:ended], n_envs)
        callback.on_rollout_end()
        self._update_current_progress_remaining(self.num_timesteps, total_timesteps)
        return True

    def episode_infos(self, batch: RolloutBatch | TextBatch, lengths: np.ndarray) -> list[dict[str, Any]]:
        """Each episode's info at its end as SB3 reads it: the env's ``"episode"`` entry (a ``Monitor`` or
        ``RecordEpisodeStatistics`` the rollouts kept) and ``"is_success"``, else the episode as SB3's own
        ``Monitor`` records it: ``{"episode": {"r": return, "l": env steps, "t": seconds since learn began}}``.
        """
        returns = batch.returns.float().cpu().numpy()
        given = getattr(batch, "end_infos", None) or [{}] * len(lengths)
        t = round((time.time_ns() - self.start_time) / 1e9, 6)
        return [info if "episode" in info else {**info, "episode": {"r": float(r), "l": int(n), "t": t}}
                for info, r, n in zip(given, returns, lengths, strict=True)]

    def fill_info_buffer(self, episodes: list[dict[str, Any]], ends: np.ndarray, done: np.ndarray,
                         n_envs: int) -> None:
        """SB3's ``_update_info_buffer`` for the episodes ``done`` (indices into ``episodes``, the infos), in
        rollout order (the window of the last ``stats_window_size`` episodes does not favour long ones), and the
        same episodes recorded in the user's own ``Monitor`` s
        (:func:`~tpo_gym.agents.common.sb3_conventions.record_in_monitors`), each in the sub-env it ended in as the
        callbacks saw it (``ends[j] % n_envs`` for the ``j``-th episode to end)."""
        infos = [episodes[i] for i in sorted(done)]
        self._update_info_buffer(infos, np.ones(len(infos), np.bool_))
        record_in_monitors(user_monitors(self.env), [(int(ends[j]) % n_envs, episodes[int(i)])
                                                     for j, i in enumerate(done)])

    def record_iteration(self, batch: RolloutBatch | TextBatch, stats: dict[str, Any], log_interval: int) -> None:
        """Append the iteration's record to ``history``, log it, dump the logs every ``log_interval``.

        Tensor values of ``stats`` (diagnostics computed on the device) are read back here, all at once
        (:func:`~tpo_gym.agents.common.update.resolve_records`; a :class:`~tpo_gym.agents.SeedBatch` resolves every
        seed's in one go before).
        """
        resolve_records([stats])
        record = {"iteration": self._iteration, "num_timesteps": self.num_timesteps, "error": batch.error, **stats}
        self.history.append(record)
        self._iteration += 1
        self._log(record, batch)
        if self._iteration % log_interval == 0:
            self.logger.dump(step=self.num_timesteps)

    def _log(self, record: dict[str, float], batch: RolloutBatch | TextBatch) -> None:
        elapsed = max((time.time_ns() - self.start_time) / 1e9, sys.float_info.epsilon)
        self.logger.record("rollout/error", record["error"])
        if self.ep_info_buffer:  # SB3's dump_logs: the last stats_window_size episodes
            self.logger.record("rollout/ep_rew_mean", safe_mean([ep["r"] for ep in self.ep_info_buffer]))
            self.logger.record("rollout/ep_len_mean", safe_mean([ep["l"] for ep in self.ep_info_buffer]))
        if self.ep_success_buffer:
            self.logger.record("rollout/success_rate", safe_mean(self.ep_success_buffer))
        for key, value in record.items():
            if key not in ("iteration", "num_timesteps", "error"):
                self.logger.record(f"train/{key}", value)
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("time/iterations", self._iteration, exclude="tensorboard")
        self.logger.record("time/fps", int((self.num_timesteps - self._num_timesteps_at_start) / elapsed))
        self.logger.record("time/time_elapsed", int(elapsed), exclude="tensorboard")
        self.logger.record("time/total_timesteps", self.num_timesteps, exclude="tensorboard")
        for key, value in getattr(batch, "stats", {}).items():
            if key != "completion_length":
                self.logger.record(f"time/{key}", value)
