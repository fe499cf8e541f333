"""strkit: small text utilities."""

from strkit.core import (
    camel_to_snake,
    capitalize_words,
    common_prefix,
    count_vowels,
    is_palindrome,
    pad_center,
    reverse_words,
    rle_decode,
    rle_encode,
    slugify,
    snake_to_camel,
    truncate,
    word_count,
    wrap,
)

__all__ = [
    "camel_to_snake",
    "capitalize_words",
    "common_prefix",
    "count_vowels",
    "is_palindrome",
    "pad_center",
    "reverse_words",
    "rle_decode",
    "rle_encode",
    "slugify",
    "snake_to_camel",
    "truncate",
    "word_count",
    "wrap",
]
