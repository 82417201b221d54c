"""TinyBERT layer mapping g(m) and per-layer weights."""

from __future__ import annotations

import pytest

from harness.api.layer_mapping import layer_map, layer_weights


@pytest.mark.parametrize(("student", "teacher", "expected"), [
    (4, 12, [3, 6, 9, 12]),
    (3, 6, [2, 4, 6]),
    (6, 12, [2, 4, 6, 8, 10, 12]),
    (4, 4, [1, 2, 3, 4]),
    (1, 6, [6]),
])
def test_uniform_takes_every_kth_teacher_layer_ending_at_the_top(student, teacher, expected):
    assert layer_map(student, teacher, "uniform") == expected
    assert layer_map(student, teacher) == expected


def test_uniform_with_indivisible_depths_names_both_and_suggests_a_list():
    with pytest.raises(ValueError, match=r"N=6.*M=4") as error:
        layer_map(4, 6, "uniform")
    assert "explicit list of 4 teacher layers in 1..6" in str(error.value)


def test_top_and_bottom():
    assert layer_map(4, 12, "top") == [9, 10, 11, 12]
    assert layer_map(4, 6, "top") == [3, 4, 5, 6]
    assert layer_map(4, 12, "bottom") == [1, 2, 3, 4]
    assert layer_map(3, 3, "top") == layer_map(3, 3, "bottom") == [1, 2, 3]


def test_explicit_list_is_validated_and_returned():
    assert layer_map(4, 6, [1, 3, 5, 6]) == [1, 3, 5, 6]
    assert layer_map(2, 6, (2, 5)) == [2, 5]


@pytest.mark.parametrize(("layers", "message"), [
    ([2, 4, 6], "has 3 entries; the student has 4"),
    ([1, 2, 3, 4, 5], "has 5 entries"),
    ([0, 2, 4, 6], r"\[0\] are outside 1..6"),
    ([2, 4, 6, 7], r"\[7\] are outside 1..6"),
    ([1, 3, 3, 5], "strictly increasing"),
    ([4, 3, 5, 6], "strictly increasing"),
    ([1, 2.0, 3, 4], "integer"),
])
def test_explicit_list_errors(layers, message):
    with pytest.raises(ValueError, match=message):
        layer_map(4, 6, layers)


def test_bad_depths_and_strategy_names():
    with pytest.raises(ValueError, match="5-layer student cannot be mapped onto a 4-layer"):
        layer_map(5, 4, "top")
    with pytest.raises(ValueError, match="num_student must be a positive integer"):
        layer_map(0, 4, "bottom")
    with pytest.raises(ValueError, match="num_teacher must be a positive integer"):
        layer_map(2, -1, "bottom")
    with pytest.raises(ValueError, match="unknown layer mapping strategy 'middle'"):
        layer_map(2, 4, "middle")  # type: ignore[arg-type]


def test_layer_weights_default_to_one_for_embeddings_layers_and_prediction():
    assert layer_weights(4) == [1.0] * 6
    assert layer_weights(2, 0.5) == [0.5] * 4
    assert layer_weights(2, [0, 1, 2, 3]) == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(ValueError, match="3 layer weights given; a 2-layer student needs 4"):
        layer_weights(2, [1, 1, 1])
    with pytest.raises(ValueError, match="finite and non-negative"):
        layer_weights(2, [1, -1, 1, 1])
    with pytest.raises(ValueError, match="finite and non-negative"):
        layer_weights(1, float("nan"))
