"""Property tests (hypothesis) for the text path: tokenizer round trips on arbitrary Unicode,
the corpus reader on arbitrary bytes and line endings, and the batch planner's invariants.

Each property runs 100 generated cases in the quick tier and 1,000 in the slow one."""

from __future__ import annotations

import pytest

from extra_helpers import need_extra

need_extra("test", "hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from transduce.data.epoch_batches import padded_width, round_up, token_budget_batches  # noqa: E402
from transduce.data.corpus import decode_line, decode_lines, read_lines  # noqa: E402
from transduce.data.spm_model import UNK_ID  # noqa: E402
from transduce.errors import DataError  # noqa: E402

TIERS = [100, pytest.param(1000, marks=pytest.mark.slow)]


def check(examples: int, *strategies):
    """Run the decorated property over ``examples`` generated cases (no deadline: a loaded CI
    machine is slow, not wrong; no example database: every run draws afresh from its seed)."""
    def run(prop):
        settings(max_examples=examples, deadline=None, database=None, derandomize=True,
                 suppress_health_check=[HealthCheck.too_slow])(given(*strategies)(prop))()
    return run


# ---- tokenizer -----------------------------------------------------------------------------------

TOY_TEXT = st.text(alphabet="abcdefghijklmnopqrstuvwxyz .", max_size=80)


@pytest.mark.parametrize("examples", TIERS)
def test_any_unicode_encodes_to_valid_ids_and_decodes_to_its_normal_form(toy_tokenizer, examples):
    """Arbitrary Unicode (surrogates excluded: not encodable text) never raises; every id is in
    the vocabulary; without an unknown piece, decode gives back exactly :meth:`normalize`."""
    @check(examples, st.one_of(st.text(max_size=60), TOY_TEXT), st.sampled_from(["src", "tgt"]))
    def prop(text, side):
        ids = toy_tokenizer.encode(text, side)
        size = toy_tokenizer.src_vocab_size if side == "src" else toy_tokenizer.tgt_vocab_size
        assert all(0 <= i < size for i in ids)
        if UNK_ID not in ids:
            assert toy_tokenizer.decode(ids, side) == toy_tokenizer.normalize(text, side)
        assert toy_tokenizer.encode_batch([text, text], side) == [ids, ids]


@pytest.mark.parametrize("examples", TIERS)
def test_text_in_the_training_alphabet_round_trips(toy_tokenizer, toy_pairs, examples):
    """Text made of characters the tokenizer was trained on has no unknown piece and comes back
    with its whitespace collapsed."""
    alphabet = "".join(sorted({c for pair in toy_pairs for side in pair for c in side}))

    @check(examples, st.text(alphabet=alphabet, max_size=80))
    def prop(text):
        ids = toy_tokenizer.encode(text, "src")
        assert UNK_ID not in ids
        assert toy_tokenizer.decode(ids, "src") == " ".join(text.split())


# ---- corpus reader -------------------------------------------------------------------------------

LINE = st.one_of(st.binary(max_size=20), st.text(max_size=20).map(lambda t: t.encode("utf-8", "surrogatepass")))
ENDING = st.sampled_from([b"\n", b"\r\n", b"\r", b""])


def _expected(content: bytes) -> list[str] | None:
    """The lines a reader must give for ``content``, computed from first principles, or None if it
    must refuse it (NUL byte or invalid UTF-8 in some line)."""
    raws = content.split(b"\n")
    if raws[-1] == b"":
        raws.pop()
    lines = []
    for i, raw in enumerate(raws):
        ended = i < len(raws) - 1 or content.endswith(b"\n")
        if ended and raw.endswith(b"\r"):
            raw = raw[:-1]
        if b"\x00" in raw:
            return None
        try:
            lines.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            return None
    if lines and lines[0].startswith("\ufeff"):
        lines[0] = lines[0][1:]
    return lines


@pytest.mark.parametrize("examples", TIERS)
def test_reader_gives_every_line_or_a_one_line_error(tmp_path, examples):
    """Arbitrary bytes with \\n, \\r\\n and lone \\r: the lines as split at \\n (a \\r before it
    dropped, a BOM at the start dropped), or a DataError of one line naming the file; the fast
    path (decode_lines) and the line-by-line one agree."""
    path = tmp_path / "corpus.txt"

    @check(examples, st.lists(st.tuples(LINE, ENDING), max_size=8), st.booleans())
    def prop(parts, bom):
        content = (b"\xef\xbb\xbf" if bom else b"") + b"".join(line + end for line, end in parts)
        path.write_bytes(content)
        want = _expected(content)
        raws = content.splitlines(keepends=True) if b"\r" not in content else \
            [r + b"\n" for r in content.split(b"\n")[:-1]] + ([content.split(b"\n")[-1]] if not
                                                               content.endswith(b"\n") else [])
        raws = [r for r in raws if r]
        try:
            got = list(read_lines(path))
        except DataError as err:
            assert want is None and "\n" not in str(err) and str(path) in str(err)
            with pytest.raises(DataError):
                decode_lines(raws, path, 1)
            return
        assert got == want
        assert decode_lines(raws, path, 1) == got == [decode_line(r, path, i + 1) for i, r in enumerate(raws)]


# ---- batch planner -------------------------------------------------------------------------------

LENGTHS = st.lists(st.tuples(st.integers(0, 300), st.integers(0, 300)), max_size=200)


@pytest.mark.parametrize("examples", TIERS)
def test_the_plan_holds_every_fitting_pair_once_within_budget_and_is_seeded(examples):
    @check(examples, LENGTHS, st.integers(2, 2000), st.integers(0, 2**32 - 1), st.integers(0, 5),
           st.integers(1, 8), st.booleans())
    def prop(pairs, max_tokens, seed, epoch, multiple, shuffle):
        src = [s for s, _ in pairs]
        tgt = [t for _, t in pairs]
        plan = token_budget_batches(src, tgt, max_tokens, seed, epoch, shuffle=shuffle, multiple=multiple)
        fits = [i for i, (s, t) in enumerate(pairs) if round_up(padded_width(s, t), multiple) <= max_tokens]
        batches = plan.batches
        assert sorted(i for b in batches for i in b) == fits  # every pair that fits, exactly once
        assert plan.dropped == len(pairs) - len(fits)
        for b in batches:
            assert b and len(b) * max(round_up(padded_width(src[i], tgt[i]), multiple) for i in b) <= max_tokens
        again = token_budget_batches(src, tgt, max_tokens, seed, epoch, shuffle=shuffle, multiple=multiple)
        assert again.batches == batches  # deterministic per (seed, epoch)
