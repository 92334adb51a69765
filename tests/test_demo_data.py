"""The generated demo task: every problem once, right answers, and a checker that accepts only them."""

from __future__ import annotations

import pytest

from cortex_nb.demo_data import addition_answer, addition_problems, exact_match, is_correct


def test_addition_problems_are_every_single_digit_sum_once():
    rows = addition_problems()
    assert len(rows) == 100 and len({row["prompt"] for row in rows}) == 100
    assert rows[0] == {"prompt": "0+0=", "completion": "0"} and rows[-1] == {
        "prompt": "9+9=",
        "completion": "18",
    }
    for row in rows:
        a, b = map(int, row["prompt"][:-1].split("+"))
        assert row["completion"] == str(a + b)


def test_a_seed_shuffles_the_same_rows_reproducibly():
    shuffled = addition_problems(seed=3)
    assert shuffled == addition_problems(seed=3) and shuffled != addition_problems()
    assert sorted(shuffled, key=lambda row: row["prompt"]) == sorted(
        addition_problems(), key=lambda row: row["prompt"]
    )
    assert len(addition_problems(max_operand=2)) == 9


def test_the_checker_accepts_only_the_exact_sum():
    assert addition_answer("3+4=") == "7" and addition_answer(" 12 + 30 = ") == "42"
    assert is_correct("9+9=", "18") and is_correct("9+9=", " 18\n")
    for wrong in ("17", "018", "18 and more", "1818", "", "eighteen"):
        assert not is_correct("9+9=", wrong), wrong
    with pytest.raises(ValueError, match="not an addition prompt"):
        addition_answer("3*4=")


def test_exact_match_is_the_fraction_right():
    assert exact_match(["1+1=", "2+2=", "3+3=", "4+4="], ["2", "4", "5", ""]) == 0.5
    with pytest.raises(ValueError, match="2 prompts but 1 completions"):
        exact_match(["1+1=", "2+2="], ["2"])
    with pytest.raises(ValueError, match="no prompts"):
        exact_match([], [])
