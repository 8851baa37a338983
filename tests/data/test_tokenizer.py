import itertools

import pytest

from transduce.data.corpus import read_lines
from transduce.data.spm_model import model_type as read_model_type
from transduce.data.tokenizer import (BOS_ID, EOS_ID, JOINT_MODEL, META_FILE, PAD_ID, SIDE_MODELS,
                                      UNK_ID, Tokenizer)
from transduce.checksums import MANIFEST
from transduce.errors import CheckpointError, ConfigError, DataError


def _sides(pairs):
    return [s for s, _ in pairs], [t for _, t in pairs]


def test_special_ids_are_fixed(toy_tokenizer):
    assert (PAD_ID, BOS_ID, EOS_ID, UNK_ID) == (0, 1, 2, 3)
    for side in ("src", "tgt"):
        assert toy_tokenizer.pieces([0, 1, 2, 3], side) == ["<pad>", "<s>", "</s>", "<unk>"]


@pytest.mark.parametrize("side", ["src", "tgt"])
def test_round_trip_on_toy_text(toy_tokenizer, toy_pairs, side):
    texts = [p[0] if side == "src" else p[1] for p in toy_pairs[:300]]
    for text in texts:
        ids = toy_tokenizer.encode(text, side)
        assert ids and min(ids) > UNK_ID  # no specials, no unknowns, no BOS/EOS added
        assert toy_tokenizer.decode(ids, side) == text


def test_decode_stops_at_eos_and_skips_pad_and_bos(toy_tokenizer):
    ids = toy_tokenizer.encode("Der Mann sieht den Hund.", "tgt")
    noisy = [BOS_ID] + ids[:2] + [PAD_ID] + ids[2:] + [EOS_ID] + ids + [PAD_ID, PAD_ID]
    assert toy_tokenizer.decode(noisy, "tgt") == "Der Mann sieht den Hund."


def test_encode_batch_matches_encode(toy_tokenizer, toy_pairs):
    texts = [s for s, _ in toy_pairs[:50]]
    assert toy_tokenizer.encode_batch(texts, "src") == [toy_tokenizer.encode(t) for t in texts]


def test_pieces_spell_the_text(toy_tokenizer):
    ids = toy_tokenizer.encode("The man sees the dog.")
    assert "".join(toy_tokenizer.pieces(ids, "src")).replace("\u2581", " ").strip() == \
        "The man sees the dog."


@pytest.mark.parametrize("side", ["src", "tgt"])
def test_pieces_are_sentencepieces_own_for_every_id(toy_tokenizer, side):
    """pieces() reads a table made once; it gives SentencePiece's piece of every id, takes
    tensor elements, and an id out of range is SentencePiece's error, as before the table."""
    import torch

    sp = toy_tokenizer._side(side)
    ids = list(range(sp.get_piece_size()))
    assert toy_tokenizer.pieces(ids, side) == [sp.id_to_piece(i) for i in ids]
    assert toy_tokenizer.pieces(torch.tensor([4, 5]), side) == [sp.id_to_piece(4), sp.id_to_piece(5)]
    for bad in (-1, sp.get_piece_size()):
        with pytest.raises(IndexError):
            toy_tokenizer.pieces([4, bad], side)


def test_unknown_side_is_rejected(toy_tokenizer):
    with pytest.raises(ValueError, match="side"):
        toy_tokenizer.encode("x", side="source")


@pytest.mark.parametrize("model_type,joint", list(itertools.product(["bpe", "unigram"], [True, False])))
def test_train_save_load(toy_pairs, tmp_path, model_type, joint):
    src, tgt = _sides(toy_pairs[:800])
    tok = Tokenizer.train(src, tgt, tmp_path / "tok", vocab_size=300, model_type=model_type,
                          joint=joint)
    assert tok.joint is joint
    assert tok.src_vocab_size == tok.tgt_vocab_size == 300
    names = {p.name for p in (tmp_path / "tok").iterdir()}
    expected = {JOINT_MODEL} if joint else set(SIDE_MODELS.values())
    assert names == expected | {META_FILE, MANIFEST}
    assert Tokenizer.exists(tmp_path / "tok")
    loaded = Tokenizer.load(tmp_path / "tok")
    assert loaded.joint is joint
    for side, texts in (("src", src[:50]), ("tgt", tgt[:50])):
        assert loaded.encode_batch(texts, side) == tok.encode_batch(texts, side)
        assert [loaded.decode(tok.encode(t, side), side) for t in texts] == texts
    assert {read_model_type(p) for p in loaded.protos if p is not None} == {model_type}


@pytest.mark.parametrize("kind", ["unigram", "bpe", "word", "char"])
def test_model_type_is_read_from_the_model_itself(toy_pairs, kind):
    """The type comes from the serialized model without the protobuf package (``transduce info``
    reports it with only the README's install)."""
    import io

    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter([s for s, _ in toy_pairs[:300]]), model_writer=model,
                                   model_type=kind, vocab_size=60, hard_vocab_limit=False, minloglevel=2)
    assert read_model_type(model.getvalue()) == kind


def test_separate_models_have_separate_vocabularies(toy_pairs, tmp_path):
    src, tgt = _sides(toy_pairs[:800])
    tok = Tokenizer.train(src, tgt, tmp_path, vocab_size=300, joint=False)
    src_pieces = set(tok.pieces(range(4, 300), "src"))
    tgt_pieces = set(tok.pieces(range(4, 300), "tgt"))
    assert "\u2581Hund" in tgt_pieces and "\u2581Hund" not in src_pieces


def test_training_is_deterministic(toy_pairs, tmp_path):
    src, tgt = _sides(toy_pairs[:800])
    for model_type in ("bpe", "unigram"):
        a = Tokenizer.train(src, tgt, tmp_path / f"a{model_type}", 300, model_type, seed=3)
        b = Tokenizer.train(src, tgt, tmp_path / f"b{model_type}", 300, model_type, seed=3)
        assert (tmp_path / f"a{model_type}" / JOINT_MODEL).read_bytes() == \
            (tmp_path / f"b{model_type}" / JOINT_MODEL).read_bytes()
        assert a.encode_batch(src[:20]) == b.encode_batch(src[:20])


def test_max_sentences_samples_deterministically(toy_pairs, tmp_path):
    src, tgt = _sides(toy_pairs)
    a = Tokenizer.train(src, tgt, tmp_path / "a", 200, max_sentences=300, seed=5)
    b = Tokenizer.train(src, tgt, tmp_path / "b", 200, max_sentences=300, seed=5)
    c = Tokenizer.train(src, tgt, tmp_path / "c", 200, max_sentences=300, seed=6)
    assert a.pieces(range(200)) == b.pieces(range(200))
    assert a.pieces(range(200)) != c.pieces(range(200))


def test_too_large_vocab_falls_back_to_a_smaller_one(tmp_path, caplog):
    src = ["a cat sat on a mat", "the dog ran"] * 20
    tok = Tokenizer.train(src, src, tmp_path, vocab_size=5000, model_type="unigram")
    assert 4 < tok.src_vocab_size < 5000
    assert "too large" in caplog.text
    assert tok.decode(tok.encode("the cat ran")) == "the cat ran"


def test_bad_training_arguments(tmp_path):
    with pytest.raises(ConfigError, match="model_type"):
        Tokenizer.train(["a b"], ["c d"], tmp_path, 100, model_type="wordpiece")
    with pytest.raises(DataError, match="no non-empty lines"):
        Tokenizer.train(["", "  "], [""], tmp_path, 100)


def test_load_missing_directory(tmp_path):
    assert not Tokenizer.exists(tmp_path / "nope")
    with pytest.raises(DataError, match="no saved tokenizer"):
        Tokenizer.load(tmp_path / "nope")


def test_load_corrupt_model(toy_tokenizer, tmp_path):
    """One flipped byte in the model file is a one-line error naming it (the checksum recorded
    when it was saved), not a tokenizer that segments differently."""
    toy_tokenizer.save(tmp_path)
    data = bytearray((tmp_path / JOINT_MODEL).read_bytes())
    data[len(data) // 2] ^= 0x01
    (tmp_path / JOINT_MODEL).write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"spm.model: corrupt: it does not match the checksum") as info:
        Tokenizer.load(tmp_path)
    assert "\n" not in str(info.value)
    (tmp_path / MANIFEST).unlink()  # saved before checksums were recorded: still loads
    (tmp_path / JOINT_MODEL).write_bytes(b"this is not a sentencepiece model")
    with pytest.raises(DataError, match="not a valid SentencePiece model") as info:
        Tokenizer.load(tmp_path)
    assert "\n" not in str(info.value)
    toy_tokenizer.save(tmp_path / "old")
    (tmp_path / "old" / MANIFEST).unlink()
    assert Tokenizer.load(tmp_path / "old").digest() == toy_tokenizer.digest()


def test_load_missing_side_model(toy_pairs, tmp_path):
    src, tgt = _sides(toy_pairs[:500])
    Tokenizer.train(src, tgt, tmp_path, 200, joint=False)
    (tmp_path / SIDE_MODELS["tgt"]).unlink()
    assert not Tokenizer.exists(tmp_path)
    with pytest.raises(DataError, match="spm.tgt.model"):
        Tokenizer.load(tmp_path)


def test_load_corrupt_metadata(toy_tokenizer, tmp_path):
    toy_tokenizer.save(tmp_path)
    (tmp_path / META_FILE).write_text("joint: [unclosed\n")
    with pytest.raises(CheckpointError, match=r"tokenizer.yaml: corrupt: it does not match the checksum"):
        Tokenizer.load(tmp_path)
    (tmp_path / MANIFEST).unlink()  # saved before checksums were recorded: the parser's error
    with pytest.raises(DataError, match="tokenizer.yaml"):
        Tokenizer.load(tmp_path)


def test_round_trip_on_multi30k(multi30k_root, tmp_path):
    src = list(itertools.islice(read_lines(multi30k_root / "train.en.gz"), 3000))
    tgt = list(itertools.islice(read_lines(multi30k_root / "train.de.gz"), 3000))
    tok = Tokenizer.train(src, tgt, tmp_path, vocab_size=2000)
    checked = 0
    for side, name in (("src", "val.en.gz"), ("tgt", "val.de.gz")):
        for line in itertools.islice(read_lines(multi30k_root / name), 200):
            ids = tok.encode(line, side)
            if UNK_ID in ids:  # a character never seen in the 3,000 training lines
                continue
            assert tok.decode(ids, side) == tok.normalize(line, side)
            checked += 1
    assert checked > 350


def test_normalize_matches_what_decode_returns(toy_tokenizer):
    messy = "  The\u00a0man   sees\tthe dog. "
    assert toy_tokenizer.normalize(messy) == "The man sees the dog."
    assert toy_tokenizer.decode(toy_tokenizer.encode(messy, "src"), "src") == \
        toy_tokenizer.normalize(messy)


# ---- BPE-dropout ------------------------------------------------------------------------------

def test_bpe_dropout_is_seeded_lossless_and_finer(toy_pairs, toy_tokenizer):
    texts = [s for s, _ in toy_pairs[:300]]
    plain = toy_tokenizer.encode_batch(texts, "src")
    a = toy_tokenizer.sample_batch(texts, "src", 0.3, seed=5)
    toy_tokenizer.sample_batch(texts, "src", 0.3, seed=6)  # another draw in between changes nothing
    assert toy_tokenizer.sample_batch(texts, "src", 0.3, seed=5) == a
    assert toy_tokenizer.sample_batch(texts, "src", 0.3, seed=6) != a
    assert toy_tokenizer.sample_batch(texts, "src", 0.0, seed=5) == plain
    assert sum(map(len, a)) > 1.1 * sum(map(len, plain))  # merges were skipped: more, smaller pieces
    assert [toy_tokenizer.decode(ids, "src") for ids in a] == [toy_tokenizer.decode(ids, "src") for ids in plain]
    with pytest.raises(ValueError, match="dropout"):
        toy_tokenizer.sample_batch(texts, "src", 1.0, seed=5)


DOMAIN = ["The chlorophyll in chloroplasts drives photosynthesis.", "Mitochondria burn glucose.",
          "Photosynthesis makes glucose from light."] * 30


@pytest.mark.parametrize("model_type,joint", [("bpe", True), ("bpe", False), ("unigram", True)])
def test_extended_keeps_every_old_id(toy_pairs, tmp_path, model_type, joint):
    src, tgt = _sides(toy_pairs[:400])
    old = Tokenizer.train(src, tgt, tmp_path / "old", vocab_size=200, model_type=model_type, joint=joint)
    new, added = old.extended(DOMAIN, DOMAIN, max_new=30)
    assert 0 < added[0] <= 30 and new.src_vocab_size == old.src_vocab_size + added[0]
    assert new.tgt_vocab_size == old.tgt_vocab_size + added[1] and new.joint == joint
    assert new.extends(old) and not old.extends(new)
    for side in ("src", "tgt"):
        n = (old.src_vocab_size, old.tgt_vocab_size)[side == "tgt"]
        assert new.pieces(range(n), side) == old.pieces(range(n), side)
        fresh = [p.replace("\u2581", " ") for p in new.pieces(range(n, n + added[side == "tgt"]), side)]
        # text none of the new pieces occurs in encodes exactly as before; the rest decodes the same
        text = src if side == "src" else tgt
        untouched = [s for s in text if not any(p in " " + new.normalize(s, side) for p in fresh)]
        assert len(untouched) > 20
        assert [new.encode(s, side) for s in untouched] == [old.encode(s, side) for s in untouched]
        assert all(new.decode(new.encode(s, side), side) == s for s in text[:50] + DOMAIN[:3])
    assert len(new.encode("photosynthesis chlorophyll")) < len(old.encode("photosynthesis chlorophyll"))
    flat, lengths = new.encode_flat(src[:50] + DOMAIN[:3])  # the prepare path (a word cache) agrees
    assert flat.tolist() == [i for row in new.encode_batch(src[:50] + DOMAIN[:3]) for i in row]
    new.save(tmp_path / "new")
    assert Tokenizer.load(tmp_path / "new").digest() == new.digest()


def test_extended_adds_characters_first_and_nothing_for_known_text(toy_pairs, tmp_path):
    src, tgt = _sides(toy_pairs[:400])
    old = Tokenizer.train(src, tgt, tmp_path / "old", vocab_size=200)
    new, (n, _) = old.extended(["Ωmega Ωmega ΩΩ"] * 20, [], max_new=1)
    assert n == 1 and len(new.pieces([old.src_vocab_size])[0]) == 1  # the new character
    assert UNK_ID in old.encode("Ω")
    assert UNK_ID not in new.encode("Ω")
    same, added = old.extended(src, tgt, max_new=100)  # the text it was trained on: the same model
    assert added == (0, 0) and same.digest() == old.digest()
    with pytest.raises(ConfigError, match="^train.extend_vocab: must be at least 1"):
        old.extended(DOMAIN, DOMAIN, max_new=0)
