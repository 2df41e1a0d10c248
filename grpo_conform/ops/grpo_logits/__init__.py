"""The first operation: the GRPO loss family over materialised logits [batch, seq + 1, vocab].

Its modules (seeded inputs, member inputs, the float64 reference, the generators per input kind,
diagnosis of neighbouring semantics, exploration, declared cases, the traffic model) moved here
unchanged from the package root (issue 30); `operation.py` implements `grpo_conform.ops.interface`
by delegating to them.
"""
