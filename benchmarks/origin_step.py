"""The origin story's training step, for ``memprobe profile`` (README: "From an OOM to a fit").

    memprobe profile origin_step:train_step --out step.pickle      # from benchmarks/

20,000 tokens (``TOKENS`` in the environment), a 131,072 vocabulary, bf16: an embedding,
``LAYERS`` MLP blocks of width 4H (H = 4096) and an lm_head, AdamW. The log-probs are the
naive ``log_softmax(logits.float())`` + gather under autograd, as the story's job had them.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
from torch import nn

VOCAB, HIDDEN = 131_072, 4096
TOKENS = int(os.environ.get("TOKENS", "20000"))
LAYERS = int(os.environ.get("LAYERS", "32"))

Logprobs = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def token_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Each token's log-probability: a float32 copy and log-softmax of the whole [B, S, V]."""
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)


def model_for(device: torch.device, layers: int, hidden: int = HIDDEN) -> nn.Module:
    # Built on the device given: on meta nothing real is ever allocated.
    kw = {"device": device, "dtype": torch.bfloat16}
    blocks = [
        nn.Sequential(
            nn.Linear(hidden, 4 * hidden, **kw), nn.GELU(), nn.Linear(4 * hidden, hidden, **kw)
        )
        for _ in range(layers)
    ]
    head = nn.Linear(hidden, VOCAB, bias=False, **kw)
    return nn.Sequential(nn.Embedding(VOCAB, hidden, **kw), *blocks, head)


def step_with(
    device: torch.device,
    logprobs: Logprobs = token_logprobs,
    *,
    tokens: int = TOKENS,
    layers: int = LAYERS,
    hidden: int = HIDDEN,
) -> None:
    model = model_for(device, layers, hidden)
    opt = torch.optim.AdamW(model.parameters())
    ids = torch.randint(0, VOCAB, (1, tokens), device=device)
    logits = model(ids)
    loss = -logprobs(logits, ids).mean()
    loss.backward()
    opt.step()


def train_step(device: torch.device) -> None:
    """Forward, the naive log-probs, backward and AdamW at the origin story's scale."""
    step_with(device)
