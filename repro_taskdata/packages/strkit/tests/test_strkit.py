from strkit import (
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


def test_slugify_words():
    assert slugify("Hello World") == "hello-world"


def test_slugify_punctuation():
    assert slugify("  Rock & Roll!! 2024 ") == "rock-roll-2024"


def test_slugify_empty():
    assert slugify("!!!") == ""


def test_truncate_short_text_unchanged():
    assert truncate("hello", 5) == "hello"


def test_truncate_long_text():
    assert truncate("hello world", 8) == "hello..."


def test_truncate_tiny_width():
    assert truncate("hello world", 2) == ".."


def test_truncate_custom_suffix():
    assert truncate("abcdefgh", 5, suffix="~") == "abcd~"


def test_word_count():
    assert word_count("one two  three") == 3


def test_word_count_leading_space():
    assert word_count("  lead and trail  ") == 3


def test_word_count_empty():
    assert word_count("") == 0


def test_capitalize_words():
    assert capitalize_words("hello bIG world") == "Hello Big World"


def test_is_palindrome_true():
    assert is_palindrome("A man, a plan, a canal: Panama") is True


def test_is_palindrome_false():
    assert is_palindrome("abcdba") is False


def test_is_palindrome_odd_length():
    assert is_palindrome("racecar") is True


def test_reverse_words():
    assert reverse_words("one two three") == "three two one"


def test_reverse_words_single():
    assert reverse_words("solo") == "solo"


def test_wrap():
    assert wrap("the quick brown fox jumps", 10) == ["the quick", "brown fox", "jumps"]


def test_wrap_exact_width():
    assert wrap("ab cd ef", 5) == ["ab cd", "ef"]


def test_wrap_long_word():
    assert wrap("a extraordinary b", 4) == ["a", "extraordinary", "b"]


def test_count_vowels():
    assert count_vowels("Programming in Python") == 5


def test_count_vowels_none():
    assert count_vowels("rhythm") == 0


def test_camel_to_snake():
    assert camel_to_snake("parseHttpResponse") == "parse_http_response"


def test_camel_to_snake_leading_capital():
    assert camel_to_snake("Value") == "value"


def test_snake_to_camel():
    assert snake_to_camel("parse_http_response") == "parseHttpResponse"


def test_snake_to_camel_extra_underscores():
    assert snake_to_camel("__private__name") == "privateName"


def test_snake_to_camel_empty():
    assert snake_to_camel("___") == ""


def test_pad_center_odd():
    assert pad_center("ab", 5, "*") == "*ab**"


def test_pad_center_even():
    assert pad_center("ab", 6) == "  ab  "


def test_pad_center_too_long():
    assert pad_center("abcdef", 4) == "abcdef"


def test_common_prefix():
    assert common_prefix(["interview", "internet", "interval"]) == "inter"


def test_common_prefix_none_shared():
    assert common_prefix(["abc", "xyz"]) == ""


def test_common_prefix_no_words():
    assert common_prefix([]) == ""


def test_common_prefix_shorter_word():
    assert common_prefix(["flower", "flow"]) == "flow"


def test_rle_encode():
    assert rle_encode("aaabccdddd") == "3a1b2c4d"


def test_rle_encode_empty():
    assert rle_encode("") == ""


def test_rle_decode():
    assert rle_decode("3a1b2c") == "aaabcc"


def test_rle_decode_multi_digit():
    assert rle_decode("12x1y") == "xxxxxxxxxxxxy"


def test_rle_round_trip():
    text = "wwwwwwwwwwwwbbbx"
    assert rle_decode(rle_encode(text)) == text
