"""The exported formats run full attention: local, Linformer, BigBird and LSH models are refused, one line."""

import pytest
import torch

from transduce.config import ModelConfig
from transduce.interop import ExportError, export_model
from transduce.model import Transformer, save_model
from extra_helpers import need_extra

# What each format's exporter imports (the refusal is checked after it).
PACKAGES = {"hf": ("transformers",), "ctranslate2": ("ctranslate2",), "onnx": ("onnx", "onnxscript")}


@pytest.mark.parametrize("fmt", ["hf", "ctranslate2", "onnx"])
@pytest.mark.parametrize("kw, named", [
    (dict(attention=dict(kind="local")), "model.attention.kind=local"),
    (dict(attention=dict(kind="linformer", linformer_k=8)), "model.attention.kind=linformer"),
    (dict(attention=dict(cross="local")), "model.attention.cross=local"),
    (dict(attention=dict(kind="bigbird", block=4)), "model.attention.kind=bigbird"),
    (dict(attention=dict(kind="lsh", block=4)), "model.attention.kind=lsh"),
])
def test_non_full_attention_is_refused(tmp_path, fmt, kw, named):
    need_extra("export", *PACKAGES[fmt])
    torch.manual_seed(0)
    cfg = ModelConfig(src_vocab_size=30, tgt_vocab_size=30, d_model=16, n_heads=2, n_encoder_layers=1,
                      n_decoder_layers=1, d_ff=32, max_positions=32, **kw)
    save_model(Transformer(cfg), tmp_path / "m")
    with pytest.raises(ExportError, match=named.replace(".", r"\.")) as e:
        export_model(tmp_path / "m", fmt, tmp_path / "out")
    assert "\n" not in str(e.value)
    assert not (tmp_path / "out").exists()
