import gzip

import numpy as np
import pytest

from transduce.data.corpus import (FilterStats, decode_line, decode_lines, encode_chunk, read_lines, read_parallel,
                                   sample_tokens)
from transduce.errors import DataError


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


# ---- read_lines --------------------------------------------------------------------------------

def test_strips_only_line_terminators(tmp_path):
    path = _write(tmp_path / "a.txt", b"one\r\n  two  \n\nthree\tx\nlast")
    assert list(read_lines(path)) == ["one", "  two  ", "", "three\tx", "last"]


def test_strips_a_leading_byte_order_mark(tmp_path):
    path = _write(tmp_path / "bom.txt", "\ufeffHallo\nWelt\n".encode("utf-8"))
    assert list(read_lines(path)) == ["Hallo", "Welt"]


def test_gzip_is_detected_by_content_not_extension(tmp_path):
    text = "Größe\nÜbung\n"
    gz = _write(tmp_path / "plain.txt", gzip.compress(text.encode("utf-8")))
    fake_gz = _write(tmp_path / "not_really.gz", text.encode("utf-8"))
    assert list(read_lines(gz)) == ["Größe", "Übung"]
    assert list(read_lines(fake_gz)) == ["Größe", "Übung"]


def test_empty_file_has_no_lines(tmp_path):
    assert list(read_lines(_write(tmp_path / "empty", b""))) == []


def test_missing_file_fails_when_called(tmp_path):
    with pytest.raises(DataError, match="nope.txt: no such file"):
        read_lines(tmp_path / "nope.txt")  # eager: before any iteration


def test_directory_is_not_a_file(tmp_path):
    with pytest.raises(DataError, match="not a regular file"):
        read_lines(tmp_path)


@pytest.mark.parametrize("compress", [False, True])
def test_invalid_utf8_names_file_and_line(tmp_path, compress):
    data = b"fine\nstill fine\nbad \xff\xfe byte\n"
    path = _write(tmp_path / "latin.txt", gzip.compress(data) if compress else data)
    with pytest.raises(DataError, match=r"latin\.txt:3: invalid UTF-8") as info:
        list(read_lines(path))
    assert "\n" not in str(info.value)


def test_binary_file_is_rejected(tmp_path):
    path = _write(tmp_path / "model.bin", b"text\n\x00\x01\x02\x03\n")
    with pytest.raises(DataError, match=r"model\.bin:2: NUL byte"):
        list(read_lines(path))


def test_truncated_gzip_is_a_data_error(tmp_path):
    data = gzip.compress(b"".join(b"line %d\n" % i for i in range(5000)))
    path = _write(tmp_path / "cut.gz", data[: len(data) // 2])
    with pytest.raises(DataError, match=r"cut\.gz:\d+: cannot read"):
        list(read_lines(path))


# ---- read_parallel --------------------------------------------------------------------------

def test_read_parallel_zips_lines(tmp_path):
    src = _write(tmp_path / "s.en", b"a\nb\n")
    tgt = _write(tmp_path / "s.de", gzip.compress(b"x\ny\n"))
    assert list(read_parallel(src, tgt)) == [("a", "x"), ("b", "y")]


@pytest.mark.parametrize("n_src,n_tgt", [(3, 5), (5, 3)])
def test_misaligned_files_name_both_and_counts(tmp_path, n_src, n_tgt):
    src = _write(tmp_path / "s.en", b"".join(b"%d\n" % i for i in range(n_src)))
    tgt = _write(tmp_path / "s.de", b"".join(b"%d\n" % i for i in range(n_tgt)))
    it = read_parallel(src, tgt)
    assert [next(it) for _ in range(3)] == [("0", "0"), ("1", "1"), ("2", "2")]
    with pytest.raises(DataError) as info:
        next(it)
    message = str(info.value)
    assert "s.en" in message and "s.de" in message
    assert "after 3 lines" in message and "has 5" in message and "line 4" in message


def test_read_parallel_missing_target_fails_early(tmp_path):
    src = _write(tmp_path / "s.en", b"a\n")
    with pytest.raises(DataError, match="s.de: no such file"):
        read_parallel(src, tmp_path / "s.de")


# ---- encode_chunk -----------------------------------------------------------------------------

def _encode(pairs, tokenizer, max_len, max_ratio, texts=False):
    """encode_chunk on text pairs; the kept pairs as lists of ids, and the chunk."""
    chunk = encode_chunk([s.encode() for s, _ in pairs], [t.encode() for _, t in pairs], 1, ("s", "t"),
                         tokenizer, max_len, max_ratio, "<u2", texts)
    cuts = [np.cumsum(chunk.src_lens)[:-1], np.cumsum(chunk.tgt_lens)[:-1]]
    src, tgt = np.split(chunk.src_tokens, cuts[0]), np.split(chunk.tgt_tokens, cuts[1])
    kept = [(s.tolist(), t.tolist()) for s, t in zip(src, tgt)] if len(chunk.src_lens) else []
    return kept, chunk


def test_filter_counts_each_reason(toy_tokenizer):
    ok = ("The man sees the dog.", "Der Mann sieht den Hund.")
    long_src = " ".join(["The man sees the dog."] * 10)
    pairs = [
        ok,
        ("", "Der Hund."),                             # empty source
        ("The dog.", "   "),                           # target empty after normalisation
        (long_src, "Der Hund."),                       # too long
        ("He sleeps.", "Heute sieht der Mann, der ein Buch liest, den Hund."),  # bad ratio
        ("A cat sleeps.", "Eine Katze schläft."),
    ]
    kept, chunk = _encode(pairs, toy_tokenizer, max_len=30, max_ratio=2.5, texts=True)
    stats = chunk.stats
    assert stats == FilterStats(kept=2, empty=2, too_long=1, bad_ratio=1)
    assert stats.total == 6
    assert stats.summary() == "kept 2 of 6 pairs (empty 2, too long 1, bad ratio 1)"
    assert kept[0] == (toy_tokenizer.encode(ok[0], "src"), toy_tokenizer.encode(ok[1], "tgt"))
    assert len(kept) == 2
    assert chunk.kept.tolist() == [True, False, False, False, False, True]
    assert chunk.texts == pairs


def test_length_limit_is_inclusive(toy_tokenizer):
    src = "The man sees the dog."
    n = len(toy_tokenizer.encode(src, "src"))
    kept, _ = _encode([(src, src)], toy_tokenizer, max_len=n, max_ratio=10)
    assert len(kept) == 1
    kept, chunk = _encode([(src, src)], toy_tokenizer, max_len=n - 1, max_ratio=10)
    assert not kept and chunk.stats.too_long == 1


def test_encode_chunk_names_file_and_line_of_bad_bytes(toy_tokenizer):
    with pytest.raises(DataError, match=r"^t:12: invalid UTF-8 at byte 2"):
        encode_chunk([b"ok\n", b"ok\n"], [b"fine\n", b"ab\xff\n"], 11, ("s", "t"), toy_tokenizer, 50, 3, "<u2")
    with pytest.raises(DataError, match=r"^s:5: NUL byte"):
        encode_chunk([b"a\x00b\n"], [b"x\n"], 5, ("s", "t"), toy_tokenizer, 50, 3, "<u2")


def test_sample_tokens_resegments_only_the_chosen_side_within_max_len(toy_pairs, toy_tokenizer):
    kept, chunk = _encode(toy_pairs[:200], toy_tokenizer, max_len=50, max_ratio=3, texts=True)
    texts = [p for p, k in zip(chunk.texts, chunk.kept) if k]
    assert len(texts) == len(kept)
    assert [toy_tokenizer.encode(s, "src") for s, _ in texts] == [s for s, _ in kept]
    assert [toy_tokenizer.encode(t, "tgt") for _, t in texts] == [t for _, t in kept]
    usual = ([s for s, _ in kept], [t for _, t in kept])
    src_only = sample_tokens(texts, usual, toy_tokenizer, 0.3, "src", seed=1, max_len=50)
    assert src_only[1] == usual[1]
    assert src_only[0] != usual[0]
    both = sample_tokens(texts, usual, toy_tokenizer, 0.3, "both", seed=1, max_len=50)
    assert both[0] == src_only[0]  # same seed, same draw per side
    assert both[1] != usual[1]
    longest = max(len(s) for s in usual[0])
    capped = sample_tokens(texts, usual, toy_tokenizer, 0.5, "src", seed=1, max_len=longest)
    assert max(len(s) for s in capped[0]) <= longest
    assert any(c == k for c, k in zip(capped[0], usual[0]) if len(k) == longest)


def test_decode_lines_equals_decode_line_one_by_one():
    cases = [[b"a\n", b"b\r\n", b"c\r"], [b"\xef\xbb\xbfx\n", b"y"], [b"\r\n", b"\n", b"z\r\r\n"],
             [b"ok\n", b"bad\xff\n"], [b"a\x00\n"], [b"\xef\xbb\xbfq\n"], []]
    for first in (1, 7):
        for raws in cases:
            try:
                want = [decode_line(r, "p", first + i) for i, r in enumerate(raws)]
            except DataError as err:
                want = str(err)
            try:
                got = decode_lines(raws, "p", first)
            except DataError as err:
                got = str(err)
            assert got == want, (raws, first)


def test_decode_lines_takes_lines_without_newlines_one_by_one():
    assert decode_lines([b"a", b"b\n", b"c"], "p", 1) == ["a", "b", "c"]
    assert decode_lines([b"x\ny\n"], "p", 1) == ["x\ny"]  # not a file's line: decoded as it is
