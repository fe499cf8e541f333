"""Problem statements written like issue reports: the observed misbehaviour, never the diff.

``multi_step``: only the symptom (a reproduction and what it returned); the code must be inspected first.
``one_step``: the symptom plus the location; with ``quote_line`` (the procedural family, as in the CPU
miniature's working recipe) the faulty line is quoted and the fix named ("the `-` should be `+`").
``one_step_brief``: the failing test and its symptom in one sentence, then the location (no reproduction
block): about half the tokens of ``one_step``, which is what a 2-core SFT budget can afford.
``locate``: as ``one_step_brief``, but the faulty line is named only by its first words (the shortest prefix
found on no other line of the file), so its text and number must be looked up before it can be edited: the
rollouts of this distribution take several calls (look, edit, check and submit).
"""

from __future__ import annotations

import re
import textwrap

from repro.tasks.mutate import Mutation, token_pattern
from repro.tasks.probe import Symptom

ONE_STEP = "one_step"
MULTI_STEP = "multi_step"
ONE_STEP_BRIEF = "one_step_brief"
LOCATE = "locate"
DIFFICULTIES = (ONE_STEP, MULTI_STEP, ONE_STEP_BRIEF, LOCATE)
MIN_PREFIX_WORDS = 2
MIXED_CHOICES = (ONE_STEP, MULTI_STEP)  # what difficulty "mixed" draws from


def multi_step_statement(symptom: Symptom) -> str:
    """Symptom only: what was called, what came back, what was expected, and which test fails."""
    return (f"{symptom.sentence()}\n\nTo reproduce:\n\n```python\n{symptom.snippet()}\n```\n\n"
            f"The test `{symptom.test_id}` fails because of this.\n")


ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth")


def occurrence(mutation: Mutation, clean_source: str) -> tuple[int, int]:
    """(index, count) of the faulty token among the same tokens of its line; index -1 when not found."""
    line_start = clean_source.rfind("\n", 0, mutation.start) + 1
    column = mutation.start - line_start
    symbol = mutation.wrong
    pattern = (r"(?<![\w.])" + re.escape(symbol) + r"(?![\w.])") if symbol[:1].isalnum() else token_pattern(symbol)
    starts = [m.start() for m in re.finditer(pattern, mutation.buggy_line(clean_source))]
    return (starts.index(column) if column in starts else -1), len(starts)


def fix_hint(mutation: Mutation, clean_source: str) -> str:
    """The fix in words: "The `-` should be `+`." ("The second `-` ..." when the line has several), or, for a
    dropped statement, the missing line."""
    if mutation.operator != "dropped_statement":
        index, count = occurrence(mutation, clean_source)
        which = f"{ORDINALS[index]} " if count > 1 and 0 <= index < len(ORDINALS) else ""
        return f"The {which}`{mutation.wrong}` should be `{mutation.right}`."
    previous = clean_source.splitlines()[mutation.lineno - 2].strip()
    missing = textwrap.dedent(mutation.original).strip("\n")
    if "\n" not in missing:
        return f"A line is missing: `{missing}` should come right after `{previous}`."
    return f"These lines are missing right after `{previous}`:\n\n```python\n{missing}\n```"


def location(mutation: Mutation, clean_source: str, quote_line: bool) -> str:
    """Where the fault is: function and file (and line number), or the quoted faulty line and its fix."""
    where = f"`{mutation.function}` in `{mutation.path}`"
    if not quote_line:
        return f"The problem is in {where} (around line {mutation.lineno})."
    if mutation.operator == "dropped_statement":
        return f"The bug is in {where}. {fix_hint(mutation, clean_source)}"
    line = mutation.buggy_line(clean_source).strip()
    return f"The bug is in {where}, on the line `{line}`. {fix_hint(mutation, clean_source)}"


def unique_prefix(line: str, source: str, min_words: int = MIN_PREFIX_WORDS) -> str | None:
    """The shortest run of ``line``'s first words (at least ``min_words``; ``line`` stripped) that occurs on no
    other line of ``source`` (as a substring, what ``grep -F`` matches); None when no prefix is unique."""
    stripped = line.strip()
    words = stripped.split(" ")
    lines = source.splitlines()
    for n in range(min(min_words, len(words)), len(words) + 1):
        prefix = " ".join(words[:n])
        if sum(prefix in other for other in lines) == 1:
            return prefix
    return None


def locate_statement(symptom: Symptom, mutation: Mutation, clean_source: str) -> str | None:
    """The failing test and symptom, the function and file, the faulty line's first words and the fix; None for a
    dropped statement or a line with no unique prefix in the buggy file."""
    if mutation.operator == "dropped_statement":
        return None
    prefix = unique_prefix(mutation.buggy_line(clean_source), mutation.apply(clean_source))
    if prefix is None:
        return None
    return (f"The test `{symptom.test_id}` fails: {symptom.sentence()}\n\n"
            f"The bug is in `{mutation.function}` in `{mutation.path}`, on the line that starts with `{prefix}`. "
            f"{fix_hint(mutation, clean_source)}\n")


def one_step_statement(symptom: Symptom, mutation: Mutation, clean_source: str, quote_line: bool) -> str:
    return multi_step_statement(symptom) + "\n" + location(mutation, clean_source, quote_line) + "\n"


def revealing_lines(mutation: Mutation, clean_source: str) -> list[str]:
    """Code a multi-step statement must not quote: the faulty line and the fixed line(s)."""
    lines = [mutation.buggy_line(clean_source), *mutation.fixed_line(clean_source).splitlines()]
    return [line.strip() for line in lines if line.strip()]


def make_statement(difficulty: str, symptom: Symptom, mutation: Mutation, clean_source: str,
                   quote_line: bool) -> str | None:
    """The statement for ``difficulty``; None when a multi-step statement would quote the faulty code, or a locate
    statement cannot name the line by a unique prefix."""
    if difficulty == ONE_STEP:
        return one_step_statement(symptom, mutation, clean_source, quote_line)
    if difficulty == ONE_STEP_BRIEF:
        return f"The test `{symptom.test_id}` fails: {symptom.sentence()}\n\n" \
               f"{location(mutation, clean_source, quote_line)}\n"
    if difficulty == LOCATE:
        return locate_statement(symptom, mutation, clean_source)
    if difficulty != MULTI_STEP:
        raise ValueError(f"unknown difficulty {difficulty!r}; choose from {DIFFICULTIES}")
    text = multi_step_statement(symptom)
    if any(line in text for line in revealing_lines(mutation, clean_source)):
        return None
    return text
