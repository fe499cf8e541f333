"""exprlex: tokenize and evaluate small arithmetic expressions."""

from exprlex.core import (
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

__all__ = [
    "balanced",
    "count_tokens",
    "eval_rpn",
    "evaluate",
    "is_number",
    "precedence",
    "to_rpn",
    "tokenize",
    "variables",
]
