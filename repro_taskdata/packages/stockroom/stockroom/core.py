"""An inventory of named items with quantities, plus parsing of ``"apple x3"`` stock lines."""


class OutOfStock(Exception):
    """Raised when more items are taken than are in stock."""


class Inventory:
    """Quantities by item name; items whose quantity drops to zero disappear."""

    def __init__(self):
        self.items = {}

    def add(self, name, qty=1):
        """Put ``qty`` (> 0) more of ``name`` in stock."""
        if qty <= 0:
            raise ValueError("quantity must be positive")
        self.items[name] = self.items.get(name, 0) + qty

    def remove(self, name, qty=1):
        """Take ``qty`` of ``name`` out; raises OutOfStock when there are not enough."""
        have = self.items.get(name, 0)
        if qty > have:
            raise OutOfStock(name)
        left = have - qty
        if left == 0:
            del self.items[name]
        else:
            self.items[name] = left

    def count(self, name):
        """How many of ``name`` are in stock (0 when none)."""
        return self.items.get(name, 0)

    def total(self):
        """Total number of units over all items."""
        total = 0
        for qty in self.items.values():
            total += qty
        return total

    def low_stock(self, threshold):
        """Names with fewer than ``threshold`` units, sorted."""
        return sorted(name for name, qty in self.items.items() if qty < threshold)

    def restock_plan(self, target):
        """How many of each item to order so every item reaches ``target`` units."""
        plan = {}
        for name, qty in self.items.items():
            missing = target - qty
            if missing > 0:
                plan[name] = missing
        return plan

    def value(self, prices):
        """Stock value at ``prices`` (items without a price count as 0)."""
        worth = 0
        for name, qty in self.items.items():
            worth += prices.get(name, 0) * qty
        return worth

    def most_stocked(self, n):
        """The ``n`` items with the most units, largest first (ties by name)."""
        ranked = sorted(self.items.items(), key=lambda pair: (-pair[1], pair[0]))
        return [name for name, _ in ranked[:n]]


def parse_line(line):
    """``"apple x3"`` -> ``("apple", 3)``; a line without ``x<n>`` means one unit."""
    parts = line.strip().split()
    if not parts:
        raise ValueError("empty line")
    last = parts[-1]
    if len(parts) > 1 and last.startswith("x") and last[1:].isdigit():
        return " ".join(parts[:-1]), int(last[1:])
    return " ".join(parts), 1


def parse_sheet(text):
    """An Inventory from one stock line per row; blank rows and ``#`` comments are skipped."""
    inventory = Inventory()
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, qty = parse_line(line)
        inventory.add(name, qty)
    return inventory


def merge(first, second):
    """A new Inventory holding the stock of both."""
    merged = Inventory()
    for source in (first, second):
        for name, qty in source.items.items():
            merged.add(name, qty)
    return merged
