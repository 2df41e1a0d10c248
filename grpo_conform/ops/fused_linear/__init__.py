"""grpo-fused-linear (issue 31): hidden states x lm_head weight (+ bias), then a GRPO-family loss.

`inputs.py`: the input layout (how a model's output is sliced to get `hidden`) and seeded values;
`reference.py`: the float64 reference, chunked over rows and the vocabulary; `operation.py`: the
`Operation` interface (work terms: 2NHV FLOPs per GEMM).
"""
