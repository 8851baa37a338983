"""`export --format onnx|ctranslate2` of imported GPT-2, BERT and RoBERTa models (random tiny
transformers ones, with their tokenizers): ONNX Runtime's logits within 1e-4 of ours and GPT-2's
greedy continuations identical; CTranslate2's Generator the same, its Encoder's final states and
pooled output within 1e-4 of ours; on real text too, fed as the runtimes' users feed it (the
exported vocabulary is the tokenizer's pieces). A failed verification writes nothing."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from transduce.cli import main
from transduce.config import GenerationConfig
from transduce.data.batch import pad
from transduce.data.tokenizer import load_tokenizer
from transduce.interop import ExportError, export_model
from transduce.interop import import_hf
from transduce.inference.search.lm import generate_ids
from transduce.model import load_model
from bert_fixtures import bert_tokenizer_dirs, build_hf
from extra_helpers import need_extra
from gpt2_fixtures import random_gpt2
from hf_tokenizer_fixtures import HARD_CASES
from toy_model import toy_pairs

need_extra("export", "transformers")
need_extra("pretrained", "tokenizers")

TEXTS = [en for en, _ in toy_pairs(5, 3)] + HARD_CASES[:5]


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpt2")
    import_hf(random_gpt2(root / "hf", [en for en, _ in toy_pairs(400, 0)] + HARD_CASES), root / "model")
    return root / "model"


@pytest.fixture(scope="module")
def tokenizer_dirs(tmp_path_factory):
    return bert_tokenizer_dirs(tmp_path_factory.mktemp("tokenizers"))


def _bert(tmp_path, tokenizer_dirs, case):
    build_hf(tmp_path / "hf", case, tokenizer_dirs)
    import_hf(tmp_path / "hf", tmp_path / "model")
    return tmp_path / "model"


def _prompts(tok):
    return [torch.tensor([[tok.bos_id, *tok.encode(t)[:8]]]) for t in TEXTS]  # each (1, P), BOS first


def test_gpt2_import_to_onnx_same_logits_and_greedy_on_real_text(gpt2, tmp_path):
    from transduce.inference.backends.onnx import OnnxLM

    report = export_model(gpt2, "onnx", tmp_path / "onnx")
    assert report.checks["max_logit_diff"] < 1e-4 and report.checks["greedy_differences"] == 0
    assert load_tokenizer(tmp_path / "onnx").digest() == load_tokenizer(gpt2).digest()
    model, tok, runner = load_model(gpt2), load_tokenizer(gpt2), OnnxLM(tmp_path / "onnx")
    gen = GenerationConfig(max_new_tokens=20, temperature=0)
    with torch.no_grad():
        for prompt in _prompts(tok):
            torch.testing.assert_close(runner.decode(prompt).logits, model(prompt), rtol=0, atol=1e-4)
            want = generate_ids(model, prompt, gen)
            assert generate_ids(runner, prompt, gen) == want  # the same search over the graph: the same tokens
        shortest = min(p.shape[1] for p in _prompts(tok))
        prompts = torch.cat([p[:, :shortest] for p in _prompts(tok)])  # a batch: rows ending at different steps
        assert generate_ids(runner, prompts, gen) == generate_ids(model, prompts, gen)
        # sampled (temperature, top-k, top-p) from one seed: the graph's logits differ from ours by
        # < 1e-4, which moves a draw only when it lands that close to a boundary of the cumulative sum
        sampled = GenerationConfig(max_new_tokens=20, temperature=0.8, top_k=20, top_p=0.9)
        seeded = lambda: torch.Generator().manual_seed(3)  # noqa: E731  (the front door's, from generation.seed)
        want = generate_ids(model, prompts, sampled, seeded())
        assert generate_ids(runner, prompts, sampled, seeded()) == want
        assert want != generate_ids(model, prompts, gen)


def test_gpt2_import_to_ctranslate2_same_logits_and_greedy_on_real_text(gpt2, tmp_path):
    ctranslate2 = need_extra("export", "ctranslate2")
    report = export_model(gpt2, "ctranslate2", tmp_path / "ct2")
    assert report.checks["max_logit_diff"] < 1e-4 and report.checks["greedy_differences"] == 0
    model, tok = load_model(gpt2), load_tokenizer(gpt2)
    generator = ctranslate2.Generator(str(tmp_path / "ct2"), compute_type="float32", intra_threads=1)
    with torch.no_grad():
        for prompt in _prompts(tok):
            got = np.array(generator.forward_batch(prompt.tolist()))
            torch.testing.assert_close(torch.from_numpy(got), model(prompt), rtol=0, atol=1e-4)
            want = generate_ids(model, prompt, GenerationConfig(max_new_tokens=20, temperature=0))
            # as a CTranslate2 user: the tokenizer's pieces in, pieces out (GPT-2 stops at <|endoftext|>)
            result = generator.generate_batch([tok.pieces(prompt[0].tolist())], max_length=20, sampling_topk=1,
                                              include_prompt_in_result=False)[0]
            assert result.sequences[0] == tok.pieces(want[0])


@pytest.mark.parametrize("case", ["BertForSequenceClassification", "RobertaForMaskedLM", "BertForPreTraining"])
def test_bert_imports_to_onnx_same_logits_on_real_text(tmp_path, tokenizer_dirs, case):
    from transduce.inference.backends.onnx import OnnxEncoder

    model_dir = _bert(tmp_path, tokenizer_dirs, case)
    report = export_model(model_dir, "onnx", tmp_path / "onnx")
    assert all(v < 1e-4 for k, v in report.checks.items() if k.startswith("max_")), report.checks
    model, tok, runner = load_model(model_dir), load_tokenizer(model_dir), OnnxEncoder(tmp_path / "onnx")
    ids = pad([tok.encode(t) for t in TEXTS], 0, bos=True, eos=True)[:, : model.config.max_positions]  # (B, T)
    types = torch.zeros_like(ids) if model.config.type_vocab_size >= 2 else None
    assert runner.meta["token_types"] == (types is not None)
    got = runner.run(ids.numpy(), None if types is None else types.numpy())
    with torch.no_grad():
        states = model(ids, types)
        head = model.classify(states) if model.config.n_classes else model.mlm_logits(states)
        torch.testing.assert_close(torch.from_numpy(got["logits"]), head, rtol=0, atol=1e-4)
        if model.config.nsp:
            torch.testing.assert_close(torch.from_numpy(got["nsp_logits"]), model.next_sentence_logits(states),
                                       rtol=0, atol=1e-4)


@pytest.mark.parametrize("case", ["BertForSequenceClassification", "RobertaForMaskedLM", "BertForPreTraining"])
def test_bert_imports_to_ctranslate2_encoder_same_states_on_real_text(tmp_path, tokenizer_dirs, case, caplog):
    ctranslate2 = need_extra("export", "ctranslate2")
    model_dir = _bert(tmp_path, tokenizer_dirs, case)
    with caplog.at_level("WARNING", logger="transduce.interop"):
        report = export_model(model_dir, "ctranslate2", tmp_path / "ct2")
    assert all(v < 1e-4 for k, v in report.checks.items() if k.startswith("max_")), report.checks
    assert ("max_pooled_diff" in report.checks) == (case != "RobertaForMaskedLM")
    assert [r.getMessage() for r in caplog.records if "CTranslate2" in r.getMessage()] == [
        "CTranslate2's Encoder returns the final states and the pooled output: the "
        + {"BertForSequenceClassification": "classification head is",
           "BertForPreTraining": "masked-LM and next-sentence heads are"}[case] + " not in the export"
        if case != "RobertaForMaskedLM" else
        "CTranslate2's Encoder returns the final states: the masked-LM head is not in the export"]
    model, tok = load_model(model_dir), load_tokenizer(model_dir)
    encoder = ctranslate2.Encoder(str(tmp_path / "ct2"), compute_type="float32", intra_threads=1)
    rows = [[tok.bos_id, *tok.encode(t)[:20], tok.eos_id] for t in TEXTS]
    given = [[0] * len(r) for r in rows] if model.config.type_vocab_size >= 2 else None
    out = encoder.forward_batch([tok.pieces(r) for r in rows], token_type_ids=given)  # as a CTranslate2 user
    ids = pad(rows, 0)
    with torch.no_grad():
        states = model(ids, None if given is None else torch.zeros_like(ids))
        keep = ids != 0
        got = torch.from_numpy(np.array(out.last_hidden_state))[:, : ids.shape[1]]
        torch.testing.assert_close(got[keep], states[keep], rtol=0, atol=1e-4)
        head = model.cls_head or model.nsp_head
        if head is not None:
            torch.testing.assert_close(torch.from_numpy(np.array(out.pooler_output)),
                                       torch.tanh(head.pooler(states[:, 0])), rtol=0, atol=1e-4)


def test_a_failed_verification_writes_nothing(tmp_path, tokenizer_dirs, gpt2, monkeypatch):
    from transduce.interop import ct2_family, onnx

    model_dir = _bert(tmp_path, tokenizer_dirs, "BertForSequenceClassification")
    forward = onnx.EncoderOnlyGraph.forward

    def shifted(self, ids, token_types=None):  # the graph's logits off by 1e-2
        return tuple(t + 1e-2 for t in forward(self, ids, token_types))

    monkeypatch.setattr(onnx.EncoderOnlyGraph, "forward", shifted)
    with pytest.raises(ExportError, match=r"^verification failed: ONNX Runtime class logits differs from the eager "
                                          r"model"):
        export_model(model_dir, "onnx", tmp_path / "onnx")
    common, relu = ct2_family._common, need_extra("export", "ctranslate2").specs.common_spec.Activation.RELU
    monkeypatch.setattr(ct2_family, "_common", lambda cfg: {**common(cfg), "activation": relu})  # not GPT-2's GELU
    with pytest.raises(ExportError, match=r"^verification failed: CTranslate2 logits differs"):
        export_model(gpt2, "ctranslate2", tmp_path / "ct2")
    assert not (tmp_path / "onnx").exists() and not (tmp_path / "ct2").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "model"]  # no staging directory left either


def test_what_the_family_cannot_take_is_one_line(gpt2, tmp_path, capsys):
    with pytest.raises(ExportError, match=r"^export.format triton: exports encoder_decoder models; this one "
                                          r"is decoder_only \(use export.format hf, onnx or ctranslate2\)$"):
        export_model(gpt2, "triton", tmp_path / "t")
    assert main(["export", str(gpt2), "--format", "ctranslate2", "--quantization", "int8",
                 "--out", str(tmp_path / "q")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("--quantization int8: exports encoder_decoder models; this one is decoder_only")
    assert "\n" not in err and not (tmp_path / "q").exists()
    assert main(["export", str(gpt2), "--format", "ctranslate2", "--out", str(tmp_path / "c")]) == 0
    assert "greedy_differences=0" in capsys.readouterr().out
    assert json.loads((tmp_path / "c" / "config.json").read_text())["eos_token"] == "<|endoftext|>"


def test_load_with_the_onnx_backend_generates_as_eager(gpt2, tmp_path):
    from transduce.config import Runtime
    from transduce.inference import load
    from transduce.inference.backends.onnx import OnnxLM

    export_model(gpt2, "onnx", tmp_path / "onnx")
    gen = GenerationConfig(max_new_tokens=12, temperature=0)
    with load(gpt2) as eager, load(gpt2, Runtime(backend="onnx", engines=str(tmp_path / "onnx"))) as graphs:
        assert isinstance(graphs.model, OnnxLM)  # the front door ran the graph, not the weights
        want = eager.generate(TEXTS, gen)
        assert graphs.generate(TEXTS, gen) == want
        assert want != eager.generate(TEXTS, GenerationConfig(max_new_tokens=12, temperature=1.0, seed=1))


def test_load_with_the_onnx_backend_classifies_as_eager(tmp_path, tokenizer_dirs):
    from transduce.config import Runtime
    from transduce.errors import ConfigError
    from transduce.inference import load
    from transduce.inference.backends.onnx import OnnxClassifier

    model_dir = _bert(tmp_path, tokenizer_dirs, "BertForSequenceClassification")
    export_model(model_dir, "onnx", tmp_path / "onnx")
    runtime = Runtime(backend="onnx", engines=str(tmp_path / "onnx"))
    with load(model_dir) as eager, load(model_dir, runtime) as graphs:
        assert isinstance(graphs.model, OnnxClassifier)
        assert graphs.classify(TEXTS) == eager.classify(TEXTS)
        tok = load_tokenizer(model_dir)
        ids = pad([tok.encode(t) for t in TEXTS], 0, bos=True, eos=True)  # (B, T)
        types = torch.zeros_like(ids)
        with torch.no_grad():
            want = eager.model.classify(eager.model(ids, types))            # (B, K)
        assert len(set(want.argmax(-1).tolist())) > 1 or want.std() > 0  # logits that tell texts apart
        torch.testing.assert_close(graphs.model.classify(graphs.model(ids, types)), want, rtol=0, atol=1e-4)
    with pytest.raises(ConfigError, match="runtime.backend: tensorrt runs translation models"):
        load(model_dir, Runtime(backend="tensorrt", engines=str(tmp_path / "onnx")))
