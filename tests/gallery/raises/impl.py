def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    raise NotImplementedError(f"vocab {logits.shape[-1]} is not a multiple of 128")
