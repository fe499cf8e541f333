"""Descriptive statistics over plain lists of numbers."""


def mean(values):
    """Arithmetic mean; raises ValueError for an empty list."""
    if not values:
        raise ValueError("mean of empty data")
    total = 0
    for value in values:
        total += value
    return total / len(values)


def median(values):
    """Middle value of the sorted data (mean of the two middle values for an even count)."""
    if not values:
        raise ValueError("median of empty data")
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2 == 1:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2


def mode(values):
    """Most frequent value; ties go to the value seen first."""
    counts = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    best = None
    best_count = 0
    for value in values:
        if counts[value] > best_count:
            best = value
            best_count = counts[value]
    return best


def variance(values, sample=True):
    """Variance; ``sample=True`` divides by n - 1, otherwise by n."""
    n = len(values)
    if n < 2:
        raise ValueError("variance needs at least two values")
    center = mean(values)
    squares = sum((value - center) ** 2 for value in values)
    if sample:
        return squares / (n - 1)
    return squares / n


def stdev(values, sample=True):
    """Standard deviation (square root of :func:`variance`)."""
    return variance(values, sample) ** 0.5


def percentile(values, p):
    """Linear-interpolated percentile, ``p`` in [0, 100]."""
    if not 0 <= p <= 100:
        raise ValueError("p must be within [0, 100]")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    frac = rank - low
    return ordered[low] + (ordered[high] - ordered[low]) * frac


def clamp(x, lo, hi):
    """``x`` limited to the closed interval [lo, hi]."""
    if lo > hi:
        raise ValueError("empty interval")
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def normalize(values):
    """Rescale to [0, 1] (all zeros when every value is equal)."""
    low = min(values)
    high = max(values)
    span = high - low
    if span == 0:
        return [0.0 for _ in values]
    return [(value - low) / span for value in values]


def moving_average(values, window):
    """Means of every run of ``window`` consecutive values."""
    if window <= 0:
        raise ValueError("window must be positive")
    out = []
    for start in range(len(values) - window + 1):
        chunk = values[start:start + window]
        out.append(sum(chunk) / window)
    return out


def cumulative_sum(values):
    """Running totals: ``[1, 2, 3]`` -> ``[1, 3, 6]``."""
    totals = []
    running = 0
    for value in values:
        running = running + value
        totals.append(running)
    return totals


def histogram(values, bins, lo, hi):
    """Counts per equal-width bin over [lo, hi); values outside are ignored, ``hi`` itself goes to the last bin."""
    counts = [0] * bins
    width = (hi - lo) / bins
    for value in values:
        if value < lo or value > hi:
            continue
        index = int((value - lo) / width)
        if index == bins:
            index = bins - 1
        counts[index] += 1
    return counts


def weighted_mean(values, weights):
    """Sum of value * weight divided by the sum of the weights."""
    if len(values) != len(weights):
        raise ValueError("values and weights differ in length")
    total_weight = sum(weights)
    if total_weight == 0:
        raise ValueError("weights sum to zero")
    acc = 0
    for value, weight in zip(values, weights, strict=True):
        acc += value * weight
    return acc / total_weight


def zscores(values):
    """Each value's distance from the mean in population standard deviations."""
    center = mean(values)
    spread = stdev(values, sample=False)
    return [(value - center) / spread for value in values]
