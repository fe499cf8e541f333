"""``repro``'s public names: the lazy exports, ``__all__`` and the ``TYPE_CHECKING`` block (what IDEs and type
checkers read) name the same objects, and each resolves."""

from __future__ import annotations

import ast
from pathlib import Path

import repro

INIT = Path(repro.__file__)


def type_checking_imports() -> dict[str, str]:
    """Name -> module of every import inside ``if TYPE_CHECKING:``."""
    tree = ast.parse(INIT.read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    return {alias.name: node.module for node in block.body if isinstance(node, ast.ImportFrom) and node.module
            for alias in node.names}


def test_exports_all_and_the_type_checking_block_agree() -> None:
    seen = type_checking_imports()
    assert sorted(repro.__all__) == sorted(repro._EXPORTS) == sorted(seen)
    assert {name: module for name, module in repro._EXPORTS.items()} == seen


def test_every_public_name_resolves_and_an_unknown_one_is_refused() -> None:
    for name in repro.__all__:
        assert getattr(repro, name) is not None, name
    try:
        repro.NoSuchThing  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("an unknown name resolved")
