"""Models that export verification must refuse or accept (export/verify.py, check_same_outputs):
one with a corrupted weight, and two that differ only in which way a near tie between two output
tokens breaks, as a runtime within the logit tolerance may break it."""

from __future__ import annotations

import copy
import random
from collections import Counter

import pytest
import torch

from transduce.interop.base import ExportError
from transduce.interop.verify import N_SPECIAL, check_same_outputs, probe_batch, search_ids, strip_specials

MAX_LEN = 12  # the export checks' output limit
TIE = 3e-5    # each side of a near tie: the two models' logits differ by 2 * TIE, within LOGIT_TOL


def many_probes(model, n: int = 48, seed: int = 5) -> torch.Tensor:
    """``n`` probe sources of 1 to 12 tokens (+ EOS), more than the export checks' six. (n, S)."""
    cfg = model.config
    lengths = tuple(random.Random(seed).randint(1, 12) for _ in range(n))
    return probe_batch(cfg.src_vocab_size, cfg.pad_id, cfg.eos_id, lengths, seed)


def most_emitted(model, src: torch.Tensor) -> int:
    """The ordinary token the model's greedy outputs for ``src`` hold most often."""
    counts = Counter(t for out in search_ids(model, src, 1, MAX_LEN) for t in out if t >= N_SPECIAL)
    return counts.most_common(1)[0][0]


def corrupted(model, src: torch.Tensor):
    """A copy with one weight wrong: the output row of the token it emits most, times 1.5."""
    broken = copy.deepcopy(model).eval()
    with torch.no_grad():
        broken.output_proj.weight[most_emitted(model, src)] *= 1.5
    return broken


def near_tie(model, src: torch.Tensor, delta: float):
    """A copy (the model needs an output bias) whose output row for one more token ``b`` equals
    that of the token it emits most, ``a``, with a bias higher by ``delta``: each time ``a`` is the
    best token, ``b`` ties with it, and the sign of ``delta`` says which one wins."""
    a = most_emitted(model, src)
    b = N_SPECIAL if a != N_SPECIAL else N_SPECIAL + 1
    tied = copy.deepcopy(model).eval()
    with torch.no_grad():
        tied.output_proj.weight[b] = tied.output_proj.weight[a]
        tied.output_proj.bias[b] = tied.output_proj.bias[a] + delta
    return tied


def assert_each_difference_fails(name: str, model, src: torch.Tensor, want: list[list[int]],
                                 got: list[list[int]], beam: bool, renormalized: bool = False) -> int:
    """Verification of ``got`` against the eager ``model``'s ``want`` fails, and so does each
    differing probe on its own (a rule that let some through would pass the first check whenever
    one refused probe came before them). Returns how many probes differ."""
    cfg = model.config
    differ = [i for i, (w, g) in enumerate(zip(want, got))
              if strip_specials(w, cfg.eos_id, cfg.pad_id) != strip_specials(g, cfg.eos_id, cfg.pad_id)]
    assert len(differ) >= 5, f"{name}: the corrupted weight changed only {len(differ)} outputs"
    with pytest.raises(ExportError, match="verification failed"):
        check_same_outputs(name, model, src, want, got, beam=beam, renormalized=renormalized)
    for i in differ:
        with pytest.raises(ExportError, match="verification failed"):
            check_same_outputs(name, model, src[i:i + 1], want[i:i + 1], got[i:i + 1], beam=beam,
                               renormalized=renormalized)
    return len(differ)


def near_tie_export(tmp_path, trained_dir, fmt: str):
    """A small random model with an output bias, exported to ``fmt`` with its tie broken one way
    (+TIE), and as eager model with the tie broken the other (-TIE): a runtime within the logit
    tolerance whose outputs differ from eager's only by ties. -> (eager model, export directory)."""
    from transduce.config import ModelConfig
    from transduce.data.tokenizer import Tokenizer
    from transduce.interop import export_model
    from transduce.interop.verify import probe_sources
    from transduce.model import Transformer, save_model

    tok = Tokenizer.load(trained_dir)
    torch.manual_seed(0)
    model = Transformer(ModelConfig(src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size, d_model=16,
                                    n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=32, output_bias=True))
    torch.nn.init.normal_(model.output_proj.bias)  # zero at initialisation: make it matter
    src = probe_sources(model.eval())
    save_model(near_tie(model, src, TIE), tmp_path / "m")
    tok.save(tmp_path / "m")
    export_model(tmp_path / "m", fmt, tmp_path / "out")
    return near_tie(model, src, -TIE), tmp_path / "out"
