import time


def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    while True:
        time.sleep(1)
