"""``model.attention``: which keys each query sees, in one section (``{kind, window, ...}``).

The layers receive it whole: :func:`~transduce.model.layers.attention_pattern` derives one
block's value from it (its kind, the layer's window and seed), which
:class:`~transduce.model.attention.MultiHeadAttention` builds its kernel from. The checks that
need the rest of the model (``arch``, ``max_positions``, ``positions``) are ModelConfig's.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import check, non_negative, one_of, typecheck

KINDS = ("full", "local", "linformer", "bigbird", "lsh")


@dataclass(frozen=True)
class AttentionConfig:
    """Self- and encoder-decoder attention: the paper's (``full``) or a long-input kind."""

    kind: str = "full"
    """Self-attention: ``full`` (the paper); ``local``: a sliding window of ``window``
    positions each side (causal in the decoder) plus ``global_tokens``, as Longformer (Beltagy et
    al., 2020, https://arxiv.org/abs/2004.05150), O(T * W) time and memory; ``linformer``: encoder
    self-attention with keys and values projected along the sequence to ``linformer_k`` rows (Wang
    et al., 2020, https://arxiv.org/abs/2006.04768) over ``model.max_positions`` positions.
    Linformer is not causal, so decoder self-attention stays full (arch=decoder_only refuses it);
    ``bigbird``: encoder self-attention in blocks of ``block`` tokens, each block seeing its
    neighbour blocks, the first and last block (global) and ``random_blocks`` random blocks (Zaheer
    et al., 2020, https://arxiv.org/abs/2007.14062), also not causal; ``lsh``: Reformer's
    locality-sensitive hashing attention (Kitaev et al., 2020, https://arxiv.org/abs/2001.04451),
    shared query/key projections, ``lsh_hashes`` rounds into ``lsh_buckets`` buckets, attention
    within chunks of ``block`` sorted positions; causal in the decoder, with the cache."""
    cross: str = "full"
    """Encoder-decoder attention: ``full`` (the paper) or ``local``: the source positions within
    ``window`` of the target position (long, monotone, similar-length pairs such as documents)."""
    window: int = 256
    """Positions each side that local attention sees."""
    windows: tuple = ()
    """Local attention's window for each encoder layer, one per layer (Longformer's per-layer
    ``attention_window``, halved); empty: ``window`` in every layer (encoder_only)."""
    global_tokens: int = 0
    """With local self-attention: the first G positions, which every query sees and which see
    every position."""
    global_projections: bool = False
    """With local self-attention: the global tokens' rows use projections of their own
    (``q_global_proj``, ``k_global_proj``, ``v_global_proj``) over every position, as Longformer's
    ``query_global`` / ``key_global`` / ``value_global`` (Sec. 3.1, "Linear Projections for
    Global Attention"); the other rows, and the global tokens as their keys, keep q/k/v_proj.
    Unused while ``global_tokens`` is 0 (encoder_only, not with rope)."""
    linformer_k: int = 256
    """Rows linformer projects keys and values to, at most ``model.max_positions``."""
    block: int = 64
    """bigbird: the block size (queries and keys go in blocks of this many; a sequence that does
    not divide is padded); lsh: the chunk size of sorted positions."""
    random_blocks: int = 3
    """bigbird: random key blocks per query block (r in the paper)."""
    lsh_hashes: int = 2
    """lsh: rounds of hashing (n_rounds); more rounds, fewer keys missed, more work."""
    lsh_buckets: int = 32
    """lsh: buckets per round (even: angular LSH takes argmax over [xR; -xR])."""
    seed: int = 0
    """bigbird's random blocks and lsh's random rotations: drawn from this seed (and the layer's
    index), so the same pattern is used in training, decoding and after loading."""

    def __post_init__(self) -> None:
        if isinstance(self.windows, list):
            object.__setattr__(self, "windows", tuple(self.windows))
        typecheck(self, "model.attention")
        one_of(self.kind, "model.attention.kind", KINDS)
        where = "self-attention" if self.cross == "lsh" else "encoder self-attention"
        check(self.cross not in ("linformer", "bigbird", "lsh"), "model.attention.cross",
              f"{self.cross} applies to {where} only; use full or local")
        one_of(self.cross, "model.attention.cross", ("full", "local"))
        check(self.window >= 1, "model.attention.window", f"must be >= 1; got {self.window}")
        check(all(isinstance(w, int) and not isinstance(w, bool) and w >= 1 for w in self.windows),
              "model.attention.windows", f"must be integers >= 1; got {list(self.windows)}")
        non_negative(self, "model.attention", ("global_tokens", "random_blocks"))
        check(self.block >= 1, "model.attention.block", f"must be >= 1; got {self.block}")
        check(self.lsh_hashes >= 1, "model.attention.lsh_hashes",
              f"must be >= 1 (rounds of hashing); got {self.lsh_hashes}")
        check(self.lsh_buckets >= 2 and self.lsh_buckets % 2 == 0, "model.attention.lsh_buckets",
              f"must be even and >= 2; got {self.lsh_buckets}")

    @property
    def full(self) -> bool:
        """Whether every attention block is the paper's (self and cross)."""
        return self.kind == self.cross == "full"
