"""The generation section: how a decoder-only language model continues a prompt, and the
sampling checks it shares with sequence-to-sequence sampling."""

from __future__ import annotations

from dataclasses import dataclass

from .base import check, positive, typecheck


def check_sampling(temperature: float, top_k: int, top_p: float, section: str = "") -> None:
    """One-line ConfigError for an invalid sampling setting, named ``section.key`` (``key`` alone
    without a section: a call's argument)."""
    prefix = f"{section}." if section else ""
    check(temperature > 0, f"{prefix}temperature", f"must be > 0; got {temperature}")
    check(top_k >= 0, f"{prefix}top_k", f"must be >= 0 (0 = off); got {top_k}")
    check(0 < top_p <= 1, f"{prefix}top_p", f"must be in (0, 1]; got {top_p}")


@dataclass(frozen=True)
class GenerationConfig:
    """How to continue a prompt (:class:`~transduce.inference.Generator`): greedy or sampled,
    token by token, until EOS, ``max_new_tokens`` or the model's ``max_positions``."""

    max_new_tokens: int = 50
    """Tokens to add at most."""
    temperature: float = 1.0
    """Divides the logits before sampling (< 1 sharpens, > 1 flattens); 0 = greedy."""
    top_k: int = 0
    """Sample among the k most probable tokens only (Fan et al., 2018); 0 = off."""
    top_p: float = 1.0
    """Sample among the most probable tokens covering this mass (nucleus sampling, Holtzman et
    al., 2020); 1.0 = off."""
    seed: int | None = None
    """Seeds a private random generator, so samples are reproducible; None: the global RNG."""
    batch_size: int = 32
    """Prompts continued at a time."""
    min_new_tokens: int = 0
    """EOS is forbidden for the first this many new tokens (as Hugging Face's ``min_new_tokens``);
    equal to ``max_new_tokens``, every continuation is that long unless ``max_positions`` comes first."""

    def __post_init__(self) -> None:
        typecheck(self, "generation")
        positive(self, "generation", ("max_new_tokens",))
        check(0 <= self.min_new_tokens <= self.max_new_tokens, "generation.min_new_tokens",
              f"must be in [0, generation.max_new_tokens={self.max_new_tokens}]; got {self.min_new_tokens}")
        positive(self, "generation", ("batch_size",))
        check(self.temperature >= 0, "generation.temperature",
              f"must be >= 0 (0 = greedy); got {self.temperature}")
        check_sampling(self.temperature or 1.0, self.top_k, self.top_p, "generation")
