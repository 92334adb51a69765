"""The losses forward_backward accepts and the tensors each needs besides `input_ids`.

Losses sum over tokens (never average): scale with `weights` or `advantages`. Shared by the client
(to check a batch before sending it) and the backend (to validate and compute).
"""

LOSS_INPUTS: dict[str, tuple[str, ...]] = {
    # loss = sum(weights * -logprob(target))
    "cross_entropy": ("target_tokens", "weights"),
    # loss = -sum(exp(logprob - sampling_logprob) * advantage)
    "importance_sampling": ("target_tokens", "logprobs", "advantages"),
    # loss = -sum(min(ratio * adv, clip(ratio, low, high) * adv)); config: clip_low_threshold, clip_high_threshold
    "ppo": ("target_tokens", "logprobs", "advantages"),
}
LOSS_FUNCTIONS = tuple(LOSS_INPUTS)
