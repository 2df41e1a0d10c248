"""H200 probe for the input-layouts failure of the Triton-based implementations at seed-b8/b16:
the same logits as a contiguous tensor and as an offset, padded view; the two gradients must be
bitwise equal (both paths end in the same kernel on a contiguous copy)."""
import importlib, sys, types

import torch

sys.path.insert(0, ".")
pkg = types.ModuleType("tri"); pkg.__path__ = ["implementations/triton"]; sys.modules["tri"] = pkg
impl = importlib.import_module("tri.impl")
for batch in (2, 8, 16):
    S, V = 1024, 128256
    g = torch.Generator(device="cuda").manual_seed(batch)
    base = torch.randn(batch + 1, S + 3, V + 5, device="cuda", generator=g).to(torch.bfloat16)
    view = base[1:, 2:, :V]
    dense = view.contiguous()
    ids = torch.randint(0, V, (batch, S), device="cuda", generator=g)
    adv = torch.randn(batch, device="cuda", generator=g)
    out = []
    for x in (dense, view):
        leaf = x.detach().requires_grad_(True)
        loss = impl.grpo_loss(logits=leaf, completion_ids=ids, advantages=adv, epsilon_low=0.2, epsilon_high=0.2,
                              temperature=1.3)
        loss.backward()
        out.append(leaf.grad.float())
    diff = (out[0] - out[1]).abs()
    rows = int((diff.amax(-1) > 0).sum())
    print(f"batch {batch}: rows differing between dense and view inputs: {rows} of {batch * (S + 1)}; "
          f"max diff {float(diff.max()):.3e}; dense finite {bool(torch.isfinite(out[0]).all())}")
    del base, view, dense, out, diff
    torch.cuda.empty_cache()
