"""Text helpers: slugs, truncation, wrapping, case conversion, run-length coding."""

VOWELS = "aeiou"


def slugify(text):
    """Lower-case words joined by single hyphens; anything but letters and digits separates words."""
    words = []
    current = ""
    for char in text.lower():
        if char.isalnum():
            current += char
        elif current:
            words.append(current)
            current = ""
    if current:
        words.append(current)
    return "-".join(words)


def truncate(text, width, suffix="..."):
    """Cut ``text`` to at most ``width`` characters, ending with ``suffix`` when something was cut."""
    if len(text) <= width:
        return text
    keep = width - len(suffix)
    if keep < 0:
        return suffix[:width]
    return text[:keep] + suffix


def word_count(text):
    """Number of whitespace-separated words."""
    count = 0
    in_word = False
    for char in text:
        if char.isspace():
            in_word = False
        elif not in_word:
            count += 1
            in_word = True
    return count


def capitalize_words(text):
    """Upper-case the first letter of every word, lower-case the rest."""
    parts = text.split(" ")
    return " ".join(part[:1].upper() + part[1:].lower() for part in parts)


def is_palindrome(text):
    """True when the letters and digits read the same both ways, ignoring case."""
    chars = [c.lower() for c in text if c.isalnum()]
    left = 0
    right = len(chars) - 1
    while left < right:
        if chars[left] != chars[right]:
            return False
        left += 1
        right -= 1
    return True


def reverse_words(text):
    """The words of ``text`` in reverse order, single-spaced."""
    words = text.split()
    result = []
    for index in range(len(words) - 1, -1, -1):
        result.append(words[index])
    return " ".join(result)


def wrap(text, width):
    """Greedy word wrap: lines of at most ``width`` characters (a longer word gets its own line)."""
    lines = []
    line = ""
    for word in text.split():
        if not line:
            line = word
        elif len(line) + 1 + len(word) <= width:
            line = line + " " + word
        else:
            lines.append(line)
            line = word
    if line:
        lines.append(line)
    return lines


def count_vowels(text):
    """How many characters of ``text`` are vowels (a, e, i, o, u; any case)."""
    total = 0
    for char in text.lower():
        if char in VOWELS:
            total += 1
    return total


def camel_to_snake(name):
    """``parseHttpResponse`` -> ``parse_http_response``."""
    out = []
    for index, char in enumerate(name):
        if char.isupper() and index > 0:
            out.append("_")
        out.append(char.lower())
    return "".join(out)


def snake_to_camel(name):
    """``parse_http_response`` -> ``parseHttpResponse``."""
    parts = [p for p in name.split("_") if p]
    if not parts:
        return ""
    head = parts[0].lower()
    tail = [p[0].upper() + p[1:].lower() for p in parts[1:]]
    return head + "".join(tail)


def pad_center(text, width, fill=" "):
    """Center ``text`` in ``width`` characters; the extra fill character goes to the right."""
    missing = width - len(text)
    if missing <= 0:
        return text
    left = missing // 2
    right = missing - left
    return fill * left + text + fill * right


def common_prefix(words):
    """The longest prefix shared by every word ("" for no words)."""
    if not words:
        return ""
    prefix = words[0]
    for word in words[1:]:
        size = 0
        while size < len(prefix) and size < len(word) and prefix[size] == word[size]:
            size += 1
        prefix = prefix[:size]
    return prefix


def rle_encode(text):
    """Run-length encoding: ``aaab`` -> ``3a1b``."""
    if not text:
        return ""
    out = []
    run_char = text[0]
    run_len = 1
    for char in text[1:]:
        if char == run_char:
            run_len += 1
        else:
            out.append(f"{run_len}{run_char}")
            run_char = char
            run_len = 1
    out.append(f"{run_len}{run_char}")
    return "".join(out)


def rle_decode(code):
    """Inverse of :func:`rle_encode`: ``3a1b`` -> ``aaab``."""
    out = []
    digits = ""
    for char in code:
        if char.isdigit():
            digits += char
        else:
            out.append(char * int(digits))
            digits = ""
    return "".join(out)
