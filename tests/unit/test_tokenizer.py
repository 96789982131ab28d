import numpy as np
import pytest

from raydp_llm.core.tokenizer import CharTokenizer, load_tokenizer


def test_char_round_trip_and_order(tmp_path):
    tok = CharTokenizer("hello, world\n")
    assert tok.chars == "\n ,dehlorw"  # sorted by code point
    ids = tok.encode("world, hello\n")
    assert ids.dtype == np.uint16
    assert tok.decode(ids) == "world, hello\n"
    tok.save(tmp_path)
    again = load_tokenizer(tmp_path)
    assert again.chars == tok.chars and again.decode(again.encode("hello")) == "hello"


def test_unicode_beyond_the_basic_plane():
    tok = CharTokenizer("aé😀")
    assert tok.decode(tok.encode("😀éa")) == "😀éa"


def test_unknown_character_is_named():
    tok = CharTokenizer("abc")
    with pytest.raises(ValueError, match="'z'"):
        tok.encode("abz")
