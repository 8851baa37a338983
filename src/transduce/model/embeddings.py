"""Token embeddings and position encodings (Sec. 3.4 and 3.5)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def sinusoidal_table(n_positions: int, dim: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)) (Sec. 3.5).

    Shape: (n_positions, dim). Computed in float64 then cast, so long tables stay accurate.
    """
    pos = torch.arange(n_positions, dtype=torch.float64)[:, None]          # (P, 1)
    i2 = torch.arange(0, dim, 2, dtype=torch.float64)[None, :]              # (1, ceil(D/2))
    angle = pos / torch.pow(10000.0, i2 / dim)                               # (P, ceil(D/2))
    table = torch.zeros(n_positions, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : dim // 2])
    return table.float()


# fairseq numbers positions from padding_idx + 1 = 2 (M2M-100, NLLB): our position p is its row p + 2
FAIRSEQ_OFFSET = 2


def fairseq_table(n_positions: int, dim: int) -> Tensor:
    """fairseq's sinusoidal positions (``model.positions: fairseq``; M2M-100 and NLLB-200 in
    transformers): every frequency's sine, then every frequency's cosine (not interleaved as
    :func:`sinusoidal_table`), frequencies 10000^(-i / (D/2 - 1)) (not 10000^(-2i / D)), row p
    for position p + 2 (:data:`FAIRSEQ_OFFSET`), an odd D's last column zero. Computed in float32
    as fairseq does, so the table is bit for bit theirs.

    Shape: (n_positions, dim).
    """
    half = dim // 2
    freq = torch.exp(torch.arange(half, dtype=torch.int64).float() * -(math.log(10000) / (half - 1)))  # (D/2,)
    angle = (torch.arange(n_positions, dtype=torch.int64) + FAIRSEQ_OFFSET).float()[:, None] * freq[None]
    table = torch.zeros(n_positions, dim)
    table[:, :2 * half] = torch.cat([torch.sin(angle), torch.cos(angle)], dim=1)  # (P, 2 * (D/2))
    return table


def _rows(table: Tensor, start: int | Tensor, length: int) -> Tensor:
    """Rows start..start+length-1 of a (P, D) position table. A 0-dim tensor ``start`` (a
    position kept on the device, as a decoding step replayed from a CUDA graph keeps it) is read
    through ``index_select``, which needs no host read; the table must already reach that far.
    A 1-dim ``start`` (B,) gives each row of a batch its own first position (rows that joined a
    running batch at different steps, as continuous batching does) -> (B, length, D)."""
    if isinstance(start, Tensor):
        steps = torch.arange(length, device=table.device)
        if start.dim() == 1:
            return table[start.unsqueeze(1) + steps]                           # (B, length, D)
        return table.index_select(0, steps + start)                            # (length, D)
    return table[start:start + length]


class SinusoidalPositions(nn.Module):
    """Fixed sinusoidal positions; the table grows on demand, so any length works. ``layout``:
    the paper's table (:func:`sinusoidal_table`) or fairseq's (:func:`fairseq_table`)."""

    def __init__(self, dim: int, n_positions: int = 1024, layout: str = "sinusoidal"):
        super().__init__()
        self.dim = dim
        self.make_table = fairseq_table if layout == "fairseq" else sinusoidal_table
        self.register_buffer("table", self.make_table(n_positions, dim), persistent=False)

    def forward(self, start: int | Tensor, length: int) -> Tensor:
        """Positions start..start+length-1 (``start`` an int or a 0-dim tensor). Shape: (length, D)."""
        if not isinstance(start, Tensor) and start + length > self.table.shape[0]:
            self.table = self.make_table(max(start + length, 2 * self.table.shape[0]), self.dim).to(self.table.device)
        return _rows(self.table, start, length)


class LearnedPositions(nn.Module):
    """Learned absolute positions (the paper's Table 3 row (E) alternative)."""

    def __init__(self, dim: int, n_positions: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_positions, dim))
        nn.init.normal_(self.weight, std=dim ** -0.5)

    def forward(self, start: int | Tensor, length: int) -> Tensor:
        """Positions start..start+length-1 (``start`` an int or a 0-dim tensor). Shape: (length, D)."""
        n = self.weight.shape[0]
        if not isinstance(start, Tensor) and start + length > n:
            raise ValueError(f"sequence of {start + length} positions exceeds model.max_positions={n}")
        return _rows(self.weight, start, length)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding, RoPE (Su et al., 2021, https://arxiv.org/abs/2104.09864).

    Each 2-D pair of a head's dimensions is rotated by an angle proportional to the position, so
    q·k depends only on the position difference. Pairs use the half-split convention (dim i with
    dim i + Dh/2, as GPT-NeoX and Llama), not interleaved (even, odd) dims.
    """

    def __init__(self, head_dim: int, base: float = 10000.0):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)

    def forward(self, x: Tensor, start: int | Tensor = 0) -> Tensor:
        """Rotate x by its positions start..start+T-1 (``start`` an int or a 0-dim tensor).
        x: (B, H, T, Dh) -> same shape."""
        t = x.shape[-2]
        pos = torch.arange(t, device=x.device, dtype=torch.float32) + start
        freqs = torch.outer(pos, self.inv_freq)                          # (T, Dh/2)
        cos = torch.cat([freqs.cos(), freqs.cos()], dim=-1).to(x.dtype)  # (T, Dh)
        sin = torch.cat([freqs.sin(), freqs.sin()], dim=-1).to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        rotated = torch.cat([-x2, x1], dim=-1)
        return x * cos + rotated * sin


def relative_buckets(relative: Tensor, bidirectional: bool, n_buckets: int, max_distance: int) -> Tensor:
    """T5's bucket of each relative position ``key - query`` (Raffel et al., 2020, Sec. 2.1;
    Mesh TensorFlow's ``_relative_position_bucket``). Bidirectional: half the buckets for keys
    after the query. Of a direction's buckets, half are exact distances 0, 1, ...; the rest
    cover distances up to ``max_distance`` in log-spaced bins, and farther ones share the last.
    Causal: keys after the query (never attended) fall in bucket 0. Shape: any -> same, long."""
    bucket = torch.zeros_like(relative)
    if bidirectional:
        n_buckets //= 2
        bucket = bucket + (relative > 0).long() * n_buckets
        distance = relative.abs()
    else:
        distance = (-relative).clamp(min=0)
    exact = n_buckets // 2
    # (float32 on purpose: the bins follow the reference's float arithmetic)
    far = exact + (torch.log(distance.float() / exact) / math.log(max_distance / exact)
                   * (n_buckets - exact)).long()
    far = far.clamp(max=n_buckets - 1)
    return bucket + torch.where(distance < exact, distance, far)


class RelativePositionBias(nn.Module):
    """T5's relative position bias: a learned scalar per (bucket, head) added to the attention
    scores, computed once per stack and shared by its layers (Raffel et al., 2020, Sec. 2.1).

    Args:
        n_heads: H.
        n_buckets, max_distance: see :func:`relative_buckets`.
        bidirectional: True for the encoder, False for the decoder's causal self-attention.
    """

    def __init__(self, n_heads: int, n_buckets: int, max_distance: int, bidirectional: bool):
        super().__init__()
        self.bidirectional, self.n_buckets, self.max_distance = bidirectional, n_buckets, max_distance
        self.weight = nn.Parameter(torch.empty(n_buckets, n_heads))
        nn.init.normal_(self.weight, std=n_heads ** -0.5)

    def forward(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """The bias of queries at positions ``q_pos`` (Tq,) over keys at ``k_pos`` (Tk,) -> (1, H, Tq, Tk)."""
        relative = k_pos[None, :] - q_pos[:, None]                          # (Tq, Tk)
        bucket = relative_buckets(relative, self.bidirectional, self.n_buckets, self.max_distance)
        return nn.functional.embedding(bucket, self.weight).permute(2, 0, 1)[None]  # (1, H, Tq, Tk)


class TokenEmbedding(nn.Module):
    """Embedding lookup multiplied by sqrt(d_model) (Sec. 3.4) when ``scale`` is set.
    ``init_std`` overrides the initial spread (T5 starts its unscaled embeddings at 1.0)."""

    def __init__(self, vocab_size: int, dim: int, pad_id: int | None, scale: bool = True,
                 init_std: float | None = None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, dim))
        self.pad_id = pad_id
        self.scale = math.sqrt(dim) if scale else 1.0
        # N(0, D^-0.5) so that after the sqrt(D) scale embeddings have unit variance, the
        # usual choice when the matrix is shared with the output projection (fairseq, T2T).
        nn.init.normal_(self.weight, std=dim ** -0.5 if init_std is None else init_std)
        if pad_id is not None:  # PAD's row stays zero (no gradient through the lookup)
            with torch.no_grad():
                self.weight[pad_id].zero_()

    def forward(self, tokens: Tensor) -> Tensor:
        """(B, T) ids -> (B, T, D)."""
        x = nn.functional.embedding(tokens, self.weight, self.pad_id)
        # unscaled (T5, GPT-2, BERT): no multiply by 1, a pass over (B, T, D) each way for nothing
        return x if self.scale == 1.0 else x * self.scale


class TokenTypeEmbedding(nn.Module):
    """BERT's token-type (segment) embeddings, added to the token and position embeddings
    (Devlin et al., 2019, Sec. 3, "Input/Output Representations")."""

    def __init__(self, n_types: int, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_types, dim))
        nn.init.normal_(self.weight, std=dim ** -0.5)

    def forward(self, token_types: Tensor | None) -> Tensor:
        """Embeddings of ``token_types`` (B, T) -> (B, T, D); None means type 0 everywhere
        -> (1, 1, D), broadcast over the batch."""
        if token_types is None:
            return self.weight[:1][None]                                  # (1, 1, D)
        return nn.functional.embedding(token_types, self.weight)
