"""Small training steps for the profile tests: each builds its model on the device given."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, HIDDEN, TOKENS, LAYERS, HEADS = 512, 64, 32, 2, 4


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, device: torch.device, sdpa: bool = False) -> None:
        super().__init__()
        self.heads = heads
        self.sdpa = sdpa
        self.norm1 = nn.LayerNorm(hidden, device=device)
        self.qkv = nn.Linear(hidden, 3 * hidden, device=device)
        self.proj = nn.Linear(hidden, hidden, device=device)
        self.norm2 = nn.LayerNorm(hidden, device=device)
        self.up = nn.Linear(hidden, 4 * hidden, device=device)
        self.down = nn.Linear(4 * hidden, hidden, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(h, dim=-1)
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2) for t in (q, k, v))
        if self.sdpa:
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(att.transpose(1, 2).reshape(b, s, h))
            return x + self.down(F.gelu(self.up(self.norm2(x))))
        scores = (q @ k.transpose(-2, -1)) / (h // self.heads) ** 0.5
        mask = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
        att = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, h))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class TinyGPT(nn.Module):
    def __init__(
        self, device: torch.device, vocab: int = VOCAB, hidden: int = HIDDEN, sdpa: bool = False
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden, device=device)
        self.blocks = nn.ModuleList(Block(hidden, HEADS, device, sdpa) for _ in range(LAYERS))
        self.norm = nn.LayerNorm(hidden, device=device)
        self.lm_head = nn.Linear(hidden, vocab, bias=False, device=device)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm(x))


def gpt_step(device: torch.device) -> None:
    """Forward, cross-entropy, backward and an SGD step of a two-layer GPT."""
    torch.manual_seed(0)
    model = TinyGPT(device)
    ids = torch.randint(0, VOCAB, (1, TOKENS), device=device)
    logits = model(ids)
    loss = F.cross_entropy(logits.float().view(-1, VOCAB), ids.view(-1))
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9).step()


def sdpa_step(device: torch.device) -> None:
    """The same step with attention through F.scaled_dot_product_attention and AdamW."""
    model = TinyGPT(device, sdpa=True)
    ids = torch.randint(0, VOCAB, (1, TOKENS), device=device)
    loss = F.cross_entropy(model(ids).float().view(-1, VOCAB), ids.view(-1))
    loss.backward()
    torch.optim.AdamW(model.parameters()).step()


def item_step(device: torch.device) -> None:
    """Reads a value: impossible on meta."""
    x = torch.ones(4, device=device, requires_grad=True)
    if (x * 2).sum().item() > 0:
        x.sum().backward()


def takes_nothing() -> None:
    """Not a step: no device parameter."""
