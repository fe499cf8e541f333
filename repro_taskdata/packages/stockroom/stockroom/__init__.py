"""stockroom: a tiny inventory ledger."""

from stockroom.core import Inventory, OutOfStock, merge, parse_line, parse_sheet

__all__ = ["Inventory", "OutOfStock", "merge", "parse_line", "parse_sheet"]
