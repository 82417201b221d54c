"""Independent, loop-by-loop computations that tests compare the harness against."""

from __future__ import annotations

import math

import torch


def manual_attention_scores(self_attention: torch.nn.Module, hidden: torch.Tensor,
                            num_heads: int) -> torch.Tensor:
    """(batch, heads, L, L) Q_i K_i^T / sqrt(d_k), head by head from a layer's own weights."""
    head_dim = hidden.shape[-1] // num_heads
    per_head = []
    for head in range(num_heads):
        rows = slice(head * head_dim, (head + 1) * head_dim)
        query = hidden @ self_attention.query.weight[rows].T + self_attention.query.bias[rows]
        key = hidden @ self_attention.key.weight[rows].T + self_attention.key.bias[rows]
        per_head.append(query @ key.transpose(1, 2) / math.sqrt(head_dim))
    return torch.stack(per_head, dim=1)
