"""The world model's torch module (see ``dsbuild.bench.models``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dsbuild.bench.models.sizes import MLP, PATCH, Size


class Block(nn.Module):
    """Pre-norm self-attention (scaled_dot_product_attention) and MLP, each with a residual."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, MLP * dim)
        self.fc2 = nn.Linear(MLP * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d)
        x = x + self.proj(a)
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class WorldModel(nn.Module):
    """frames (B,T,H,W,3) uint8 and actions (B,T,A) -> loss of predicting actions[t+1] from step t."""

    def __init__(self, size: Size, frames: int, height: int, width: int, actions: int):
        super().__init__()
        d = size.dim
        self.size, self.frames, self.n_patch = size, frames, (height // PATCH) * (width // PATCH)
        self.patch = nn.Linear(3 * PATCH * PATCH, d)
        self.action = nn.Linear(actions, d)
        self.patch_pos = nn.Parameter(torch.zeros(self.n_patch, d))
        self.frame_pos = nn.Parameter(torch.zeros(frames, d))
        self.kind = nn.Parameter(torch.zeros(2, d))  # patch token, action token
        self.blocks = nn.ModuleList(Block(d, size.heads) for _ in range(size.depth))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, actions)
        for p in (self.patch_pos, self.frame_pos, self.kind):
            nn.init.normal_(p, std=0.02)

    def forward(self, frames: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        b, t, h, w, c = frames.shape
        x = frames.to(self.patch.weight.dtype if self.patch.weight.is_floating_point() else torch.float32) / 255.0
        x = x.view(b, t, h // PATCH, PATCH, w // PATCH, PATCH, c).permute(0, 1, 2, 4, 3, 5, 6)
        x = x.reshape(b, t, self.n_patch, PATCH * PATCH * c)
        p = self.patch(x) + self.patch_pos + self.frame_pos[:t, None] + self.kind[0]  # (B,T,N,D)
        a = self.action(actions.to(x.dtype)) + self.frame_pos[:t] + self.kind[1]  # (B,T,D)
        seq = torch.cat([p.reshape(b, t * self.n_patch, -1), a], dim=1)
        for block in self.blocks:
            seq = block(seq)
        pred = self.head(self.norm(seq[:, t * self.n_patch :]))  # one prediction per frame's action token
        return F.mse_loss(pred[:, :-1].float(), actions[:, 1:].float())
