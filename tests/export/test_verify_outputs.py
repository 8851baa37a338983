"""How export verification compares searched outputs (export/verify.py, check_same_outputs): equal
outputs and near ties pass; for beam search an exported output the eager model scores higher than
its own passes too (two approximate searches parted by rounding); any other difference fails."""

import pytest
import torch

from transduce.config import ModelConfig
from transduce.export.base import ExportError
from transduce.export.verify import check_same_outputs, sequence_log_prob
from transduce.model.transformer import Transformer

V = 24


def _model():
    torch.manual_seed(0)
    return Transformer(ModelConfig(src_vocab_size=V, tgt_vocab_size=V, d_model=16, n_heads=2, n_encoder_layers=1,
                                   n_decoder_layers=1, d_ff=32, dropout=0.0)).eval()


def test_a_likelier_exported_beam_output_passes_and_a_less_likely_one_fails():
    model, eos = _model(), 2
    src = torch.tensor([[5, 6, 7, 8]])
    candidates = [[t, u, eos] for t in range(4, V) for u in range(4, V)]
    scores = sorted((sequence_log_prob(model, src[0], c), c) for c in candidates)
    (low, worse), (high, better) = scores[0], scores[-1]
    assert high - low > 0.1
    assert check_same_outputs("probe", model, src, [worse], [better], beam=True) == 1
    with pytest.raises(ExportError, match=r"probe output for probe 0 is .*\(log-prob difference -"):
        check_same_outputs("probe", model, src, [better], [worse], beam=True)
    with pytest.raises(ExportError, match="verification failed"):  # greedy: only ties pass
        check_same_outputs("probe", model, src, [worse], [better], beam=False)
    assert check_same_outputs("probe", model, src, [better], [better + [0, 0]], beam=True) == 0  # pads stripped
