import pytest
from exprlex import (
    balanced,
    count_tokens,
    eval_rpn,
    evaluate,
    is_number,
    precedence,
    to_rpn,
    tokenize,
    variables,
)


def test_tokenize_simple():
    assert tokenize("1 + 23") == ["1", "+", "23"]


def test_tokenize_names_and_parens():
    assert tokenize("(x_1*y)") == ["(", "x_1", "*", "y", ")"]


def test_tokenize_decimal():
    assert tokenize("3.25/2") == ["3.25", "/", "2"]


def test_tokenize_rejects_symbol():
    with pytest.raises(ValueError):
        tokenize("2 $ 3")


def test_is_number():
    assert is_number("42") is True


def test_is_number_decimal():
    assert is_number("4.2") is True


def test_is_number_two_dots():
    assert is_number("4.2.1") is False


def test_is_number_lone_dot():
    assert is_number(".") is False


def test_is_number_name():
    assert is_number("x1") is False


def test_precedence_order():
    assert [precedence(op) for op in "+-*/^"] == [1, 1, 2, 2, 3]


def test_precedence_unknown():
    with pytest.raises(ValueError):
        precedence("(")


def test_to_rpn_precedence():
    assert to_rpn(["1", "+", "2", "*", "3"]) == ["1", "2", "3", "*", "+"]


def test_to_rpn_left_associative():
    assert to_rpn(["8", "-", "3", "-", "2"]) == ["8", "3", "-", "2", "-"]


def test_to_rpn_right_associative_power():
    assert to_rpn(["2", "^", "3", "^", "2"]) == ["2", "3", "2", "^", "^"]


def test_to_rpn_parentheses():
    assert to_rpn(tokenize("(1 + 2) * 3")) == ["1", "2", "+", "3", "*"]


def test_to_rpn_unbalanced_close():
    with pytest.raises(ValueError):
        to_rpn(tokenize("1 + 2)"))


def test_to_rpn_unbalanced_open():
    with pytest.raises(ValueError):
        to_rpn(tokenize("(1 + 2"))


def test_eval_rpn_subtraction_order():
    assert eval_rpn(["10", "4", "-"]) == 6


def test_eval_rpn_division_order():
    assert eval_rpn(["8", "2", "/"]) == 4.0


def test_eval_rpn_power():
    assert eval_rpn(["2", "5", "^"]) == 32


def test_eval_rpn_env():
    assert eval_rpn(["x", "3", "*"], {"x": 5}) == 15


def test_eval_rpn_unknown_name():
    with pytest.raises(NameError):
        eval_rpn(["y"])


def test_eval_rpn_missing_operand():
    with pytest.raises(ValueError):
        eval_rpn(["1", "+"])


def test_evaluate():
    assert evaluate("2 * (3 + 4) - 5") == 9


def test_evaluate_precedence():
    assert evaluate("2 + 3 * 4 ^ 2") == 50


def test_evaluate_chain():
    assert evaluate("20 / 2 / 5") == 2.0


def test_evaluate_with_names():
    assert evaluate("rate * hours + 1.5", {"rate": 10, "hours": 3}) == 31.5


def test_evaluate_malformed():
    with pytest.raises(ValueError):
        evaluate("1 2")


def test_balanced():
    assert balanced("((a)(b))") is True


def test_balanced_close_first():
    assert balanced(")(") is False


def test_balanced_unclosed():
    assert balanced("((a)") is False


def test_variables():
    assert variables("x * y + x - _z / 2") == ["x", "y", "_z"]


def test_count_tokens():
    assert count_tokens("(a + 12) * b2 - 3.5") == {"number": 2, "name": 2, "operator": 3, "paren": 2}
