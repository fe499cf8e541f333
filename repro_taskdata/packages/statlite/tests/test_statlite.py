import pytest
from statlite import (
    clamp,
    cumulative_sum,
    histogram,
    mean,
    median,
    mode,
    moving_average,
    normalize,
    percentile,
    stdev,
    variance,
    weighted_mean,
    zscores,
)


def test_mean():
    assert mean([1, 2, 3, 4]) == 2.5


def test_mean_single():
    assert mean([7]) == 7


def test_mean_empty_raises():
    with pytest.raises(ValueError):
        mean([])


def test_median_odd():
    assert median([5, 1, 3]) == 3


def test_median_even():
    assert median([4, 1, 3, 2]) == 2.5


def test_median_empty_raises():
    with pytest.raises(ValueError):
        median([])


def test_mode():
    assert mode([1, 2, 2, 3, 3, 3]) == 3


def test_mode_tie_first_seen():
    assert mode([4, 5, 5, 4]) == 4


def test_variance_sample():
    assert variance([2, 4, 4, 4, 5, 5, 7, 9]) == pytest.approx(4.571428571)


def test_variance_population():
    assert variance([2, 4, 4, 4, 5, 5, 7, 9], sample=False) == 4


def test_variance_too_short():
    with pytest.raises(ValueError):
        variance([1])


def test_stdev_population():
    assert stdev([2, 4, 4, 4, 5, 5, 7, 9], sample=False) == 2


def test_stdev_sample():
    assert stdev([1, 3]) == pytest.approx(1.414213562)


def test_percentile_median():
    assert percentile([1, 2, 3, 4, 5], 50) == 3


def test_percentile_interpolates():
    assert percentile([10, 20, 30, 40], 25) == 17.5


def test_percentile_bounds():
    assert percentile([3, 1, 2], 100) == 3


def test_percentile_zero():
    assert percentile([3, 1, 2], 0) == 1


def test_percentile_invalid():
    with pytest.raises(ValueError):
        percentile([1, 2], 101)


def test_clamp_inside():
    assert clamp(5, 0, 10) == 5


def test_clamp_below():
    assert clamp(-3, 0, 10) == 0


def test_clamp_above():
    assert clamp(12, 0, 10) == 10


def test_clamp_on_edge():
    assert clamp(10, 0, 10) == 10


def test_clamp_empty_interval():
    with pytest.raises(ValueError):
        clamp(1, 5, 2)


def test_normalize():
    assert normalize([2, 4, 6]) == [0.0, 0.5, 1.0]


def test_normalize_constant():
    assert normalize([3, 3]) == [0.0, 0.0]


def test_moving_average():
    assert moving_average([1, 2, 3, 4, 5], 2) == [1.5, 2.5, 3.5, 4.5]


def test_moving_average_full_window():
    assert moving_average([2, 4, 6], 3) == [4.0]


def test_moving_average_bad_window():
    with pytest.raises(ValueError):
        moving_average([1, 2], 0)


def test_cumulative_sum():
    assert cumulative_sum([1, 2, 3, 4]) == [1, 3, 6, 10]


def test_cumulative_sum_empty():
    assert cumulative_sum([]) == []


def test_histogram():
    assert histogram([0, 1, 2, 3, 4, 9, 10], 5, 0, 10) == [2, 2, 1, 0, 2]


def test_histogram_ignores_outside():
    assert histogram([-1, 0.5, 11], 2, 0, 10) == [1, 0]


def test_weighted_mean():
    assert weighted_mean([1, 2, 3], [3, 0, 1]) == 1.5


def test_weighted_mean_length_mismatch():
    with pytest.raises(ValueError):
        weighted_mean([1, 2], [1])


def test_weighted_mean_zero_weights():
    with pytest.raises(ValueError):
        weighted_mean([1, 2], [0, 0])


def test_zscores():
    assert zscores([2, 4, 4, 4, 5, 5, 7, 9]) == [-1.5, -0.5, -0.5, -0.5, 0.0, 0.0, 1.0, 2.0]
