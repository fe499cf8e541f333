import pytest
from stockroom import Inventory, OutOfStock, merge, parse_line, parse_sheet


def make():
    inv = Inventory()
    inv.add("apple", 5)
    inv.add("pear", 2)
    inv.add("fig", 9)
    return inv


def test_add_new_item():
    inv = Inventory()
    inv.add("apple", 3)
    assert inv.count("apple") == 3


def test_add_accumulates():
    inv = Inventory()
    inv.add("apple", 3)
    inv.add("apple", 4)
    assert inv.count("apple") == 7


def test_add_default_quantity():
    inv = Inventory()
    inv.add("plum")
    assert inv.count("plum") == 1


def test_add_rejects_zero():
    with pytest.raises(ValueError):
        Inventory().add("apple", 0)


def test_remove_some():
    inv = make()
    inv.remove("apple", 2)
    assert inv.count("apple") == 3


def test_remove_all_drops_item():
    inv = make()
    inv.remove("pear", 2)
    assert "pear" not in inv.items


def test_remove_too_many():
    inv = make()
    with pytest.raises(OutOfStock):
        inv.remove("pear", 3)


def test_remove_exact_amount_allowed():
    inv = make()
    inv.remove("fig", 9)
    assert inv.count("fig") == 0


def test_count_missing():
    assert make().count("kiwi") == 0


def test_total():
    assert make().total() == 16


def test_total_empty():
    assert Inventory().total() == 0


def test_low_stock():
    assert make().low_stock(6) == ["apple", "pear"]


def test_low_stock_strict():
    assert make().low_stock(5) == ["pear"]


def test_restock_plan():
    assert make().restock_plan(6) == {"apple": 1, "pear": 4}


def test_restock_plan_nothing_missing():
    assert make().restock_plan(2) == {}


def test_value():
    assert make().value({"apple": 2, "fig": 1}) == 19


def test_most_stocked():
    assert make().most_stocked(2) == ["fig", "apple"]


def test_most_stocked_ties_by_name():
    inv = Inventory()
    inv.add("b", 2)
    inv.add("a", 2)
    inv.add("c", 1)
    assert inv.most_stocked(2) == ["a", "b"]


def test_parse_line_with_quantity():
    assert parse_line("green apple x3") == ("green apple", 3)


def test_parse_line_without_quantity():
    assert parse_line("  melon ") == ("melon", 1)


def test_parse_line_word_starting_with_x():
    assert parse_line("xigua") == ("xigua", 1)


def test_parse_line_empty():
    with pytest.raises(ValueError):
        parse_line("   ")


def test_parse_sheet():
    inv = parse_sheet("# stock\napple x2\n\nfig\napple x1\n")
    assert inv.items == {"apple": 3, "fig": 1}


def test_merge():
    first = make()
    second = Inventory()
    second.add("apple", 1)
    second.add("kiwi", 4)
    assert merge(first, second).items == {"apple": 6, "pear": 2, "fig": 9, "kiwi": 4}


def test_merge_leaves_inputs_alone():
    first = make()
    merge(first, make())
    assert first.count("apple") == 5
