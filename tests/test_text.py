"""Offsets: property tests over messy mixed-script strings, for a WordPiece and for e5-small's tokenizer."""

import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zhie.core.text import TextTokenizer, reporting_window, windows
from zhie.encoders import wordpiece_tokenizer

PIECES = st.one_of(
    st.text(alphabet=st.characters(min_codepoint=0x4E00, max_codepoint=0x4FFF), min_size=1, max_size=4),  # CJK
    st.sampled_from(["Google", "python", "Hello", "naïve", "iPhone", "COVID-19", "e\u0301", "n\u0303o"]),
    st.text(alphabet="0123456789", min_size=1, max_size=4),
    st.text(alphabet="ＡＢＣａｂｃ０１２３，。！？（）：", min_size=1, max_size=3),  # full-width forms
    st.sampled_from(["😀", "👍🏽", "🇨🇳", "\u0301", "\u0308"]),  # emoji, modifiers, flags, lone combining marks
    st.sampled_from([" ", "  ", "   ", "\t", "\n", "\u3000", " \u3000 ", "\r\n"]),  # whitespace runs
    st.sampled_from(["，", "。", "、", "“", "”", "《", "》", "·", "…", "-", "'", "$", "%"]),
)
TEXTS = st.lists(PIECES, min_size=0, max_size=25).map("".join)
SETTINGS = settings(max_examples=150, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def wordpiece():
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "google", "python", "hello", "##s", "##o", "##n",
             "iphone", "co", "##vid", "-", "19", "naive", "e", "n", "o", "a", "b", "c", "$", "%"]
    vocab += [chr(c) for c in range(0x4E00, 0x4E80)] + list("0123456789，。！？（）：、“”《》·…'")
    vocab += ["##" + d for d in "0123456789"]
    return wordpiece_tokenizer(vocab, lowercase=True)


@pytest.fixture(scope="module", params=["wordpiece", "e5"])
def hf_tokenizer(request, wordpiece):
    return wordpiece if request.param == "wordpiece" else request.getfixturevalue("e5_tokenizer")


def check_offsets(text, enc):
    n = len(enc.ids)
    assert len(enc.starts) == len(enc.ends) == n
    for t in range(n):
        assert 0 <= enc.starts[t] <= enc.ends[t] <= len(text)
        if t:
            assert enc.starts[t] >= enc.starts[t - 1] and enc.ends[t] >= enc.ends[t - 1]
        piece = text[enc.starts[t]:enc.ends[t]]
        assert piece == piece.strip(), "token ranges never start or end on whitespace"
    # char -> token -> chars round trip
    for c, t in enumerate(enc.char_to_token):
        if t >= 0:
            assert enc.starts[t] <= c < enc.ends[t]
        else:
            assert not any(enc.starts[u] <= c < enc.ends[u] for u in range(n))
    # token -> chars -> token round trip
    for t in range(n):
        if enc.starts[t] < enc.ends[t]:
            first = enc.char_to_token[enc.starts[t]]
            assert 0 <= first <= t and enc.starts[first] == enc.starts[t]
            lo, hi = enc.char_span_to_tokens(enc.starts[t], enc.ends[t])
            assert lo <= t < hi


def check_spans(text, enc):
    """Every token range maps to characters whose text is the span's text, and back to the same tokens."""
    real = [t for t in range(len(enc.ids)) if enc.starts[t] < enc.ends[t]]
    for i, a in enumerate(real):
        for b in real[i:i + 6]:
            s, e = enc.token_span_to_chars(a, b + 1)
            assert s < e and text[s:e] == text[s:e].strip()
            lo, hi = enc.char_span_to_tokens(s, e)
            assert lo <= a and hi >= b + 1
            assert all(enc.starts[u] < e and enc.ends[u] > s for u in range(lo, hi) if enc.starts[u] < enc.ends[u])


@pytest.fixture(scope="module")
def char_tok(hf_tokenizer):
    return TextTokenizer(hf_tokenizer, "char")


@pytest.fixture(scope="module")
def subword_tok(hf_tokenizer):
    return TextTokenizer(hf_tokenizer, "subword")


@SETTINGS
@given(text=TEXTS)
def test_char_mode_offsets(char_tok, text):
    tok = char_tok
    enc = tok(text)
    check_offsets(text, enc)
    check_spans(text, enc)
    # one token per character, except whitespace and characters that normalise to nothing
    assert enc.ends == [s + 1 for s in enc.starts]
    assert enc.starts == [i for i, c in enumerate(text) if tok.char_id(c) is not None]
    assert all(text[i].isspace() or tok.char_id(text[i]) is not None for i in enc.starts)
    for i, c in enumerate(text):
        if c.isspace():
            assert enc.char_to_token[i] == -1
        elif unicodedata.category(c)[0] in "LN":
            assert enc.char_to_token[i] >= 0, f"{c!r} lost"


@SETTINGS
@given(texts=st.lists(TEXTS, min_size=1, max_size=4))
def test_char_mode_reads_each_character_as_its_own_lookup_does(hf_tokenizer, texts):
    """encode_char reads the characters from its cache in one pass (the fast path), after adding those it has not
    seen (the first call of a text): either way, the ids and offsets are those of looking each character up alone,
    uncached (_lookup), with whitespace, emoji, full-width and unknown characters."""
    tok = TextTokenizer(hf_tokenizer, "char")  # a fresh cache: the first call of each text may take the slow path
    for text in [*texts, *texts, "丁 Z龘\t丁😀ＡＢ\u3000。"]:
        want = [(i, tok._lookup(c)) for i, c in enumerate(text) if tok._lookup(c) is not None]
        enc = tok(text)
        assert list(zip(enc.starts, enc.ids)) == want
        assert enc.ends == [i + 1 for i, _ in want]


@SETTINGS
@given(text=TEXTS)
def test_subword_mode_offsets(subword_tok, text):
    enc = subword_tok(text)
    check_offsets(text, enc)
    check_spans(text, enc)
    for i, c in enumerate(text):  # letters and digits are always covered by some token
        if unicodedata.category(c)[0] in "LN" and unicodedata.category(c) != "Lm":
            assert enc.char_to_token[i] >= 0, f"{c!r} at {i} not covered"


def test_char_mode_unknown_characters_keep_offsets(wordpiece):
    tok = TextTokenizer(wordpiece, "char")
    text = "丁 Z龘\t丁"
    enc = tok(text)
    assert enc.starts == [0, 2, 3, 5]
    assert enc.ids[1] == enc.ids[2] == wordpiece.unk_token_id
    assert tok.model_input(enc.ids)[0] == wordpiece.cls_token_id


def test_e5_char_mode_pieces(e5_tokenizer):
    tok = TextTokenizer(e5_tokenizer, "char")
    enc = tok("北京ＡＢ c")
    assert e5_tokenizer.convert_ids_to_tokens(enc.ids) == ["北", "京", "A", "B", "c"]
    assert enc.starts == [0, 1, 2, 3, 5]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(n=st.integers(1, 300), size=st.integers(1, 64), data=st.data())
def test_windows_cover_and_every_short_span_is_reported_once(n, size, data):
    overlap = data.draw(st.integers(0, size - 1))
    cuts = windows(n, size, overlap)
    assert cuts[0][0] == 0 and cuts[-1][1] == n
    for (a, b), (c, d) in zip(cuts, cuts[1:]):
        assert b - a <= size and c == b - overlap and d > b
    for tagger in (False, True):
        for length in range(1, overlap + 1):
            for start in range(n - length + 1):
                w = reporting_window(cuts, start, start + length, cut_at_right_edge=tagger)
                assert w is not None, (start, length)  # a span of up to `overlap` tokens is whole in some window
                a, b = cuts[w]
                assert a <= start and start + length <= b and not (tagger and start + length == b < n)


def test_windows_reject_bad_arguments():
    with pytest.raises(ValueError):
        list(windows(10, 4, 4))
