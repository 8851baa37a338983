"""A random tiny Hugging Face GPT2LMHeadModel directory, as from the hub (no hub access here):
for the import, fine-tuning and export tests."""

from __future__ import annotations

import json

import torch

from hf_tokenizer_fixtures import byte_bpe_dir


def random_gpt2(out, lines, seed: int = 0, eot_last: bool = False, **overrides):
    """A random GPT2LMHeadModel over a byte-level BPE tokenizer trained on ``lines``, saved to
    ``out`` as from the hub; every weight (LayerNorms included) drawn, not left at its init.
    ``<|endoftext|>`` is id 0, or with ``eot_last`` the last id (as GPT-2's 50256): not our PAD 0."""
    import transformers

    byte_bpe_dir(out, lines, flavour="gpt2", vocab_size=400, eot_last=eot_last)
    eot = json.loads((out / "tokenizer.json").read_text())["added_tokens"][0]["id"]
    size = len(transformers.AutoTokenizer.from_pretrained(out))
    options = dict(vocab_size=size, n_positions=48, n_embd=32, n_layer=2, n_head=4, bos_token_id=eot,
                   eos_token_id=eot, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**{**options, **overrides}))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))  # logits far apart: no near-ties for greedy to split
    model.save_pretrained(out)
    return out
