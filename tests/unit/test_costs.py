"""hvdkit.costs: the alpha-beta formulas at hand-computed points, the rate parser; and the
paired-round statistics the collectives benchmark reports (hvdkit.bench._common)."""
import math

import numpy as np
import pytest

from hvdkit import costs
from hvdkit.bench._common import paired_ratio_ci, quartiles

GBIT = 1e9 / 8  # bytes/s of a 1 Gbit/s link
MB = 1e6


def test_parse_rate_reads_tc_units_in_bits_per_second():
    assert costs.parse_rate("1gbit") == 1e9
    assert costs.parse_rate("200mbit") == 2e8
    assert costs.parse_rate(" 2.5 Mbit ") == 2.5e6
    assert costs.parse_rate("100kbit") == 1e5 and costs.parse_rate("8bit") == 8
    assert costs.parse_rate(".5tbit") == 5e11
    for bad in ("1", "1gb", "1 gbps", "fast", "", "-1gbit", "0mbit"):
        with pytest.raises(ValueError, match="rate"):
            costs.parse_rate(bad)


def test_ring_allreduce_time_by_hand():
    # N = 4, S = 1 MB, 1 Gbit/s, alpha 0: 2 * 3/4 * 1e6 / 1.25e8 = 12 ms
    assert costs.ring_allreduce_time(MB, 4, GBIT) == pytest.approx(0.012)
    # with alpha = 50 us: + 2 * 3 * 50 us = 0.3 ms
    assert costs.ring_allreduce_time(MB, 4, GBIT, 50e-6) == pytest.approx(0.0123)
    # N = 2: 2 * 1/2 * S/B = S/B = 8 ms; one rank: nothing to move
    assert costs.ring_allreduce_time(MB, 2, GBIT) == pytest.approx(0.008)
    assert costs.ring_allreduce_time(MB, 1, GBIT, 1e-3) == 0.0


def test_ps_time_server_link_is_the_bottleneck_with_three_workers_and_one_server():
    # W = 3, K = 1: the server's link carries 3 S each way: 2 * 3e6 / 1.25e8 = 48 ms (+ 2 alpha)
    assert costs.ps_time(MB, 3, 1, GBIT) == pytest.approx(0.048)
    assert costs.ps_time(MB, 3, 1, GBIT, 1e-4) == pytest.approx(0.0482)
    # K = 2: each server receives 3/2 S: 2 * 1.5e6 / 1.25e8 = 24 ms
    assert costs.ps_time(MB, 3, 2, GBIT) == pytest.approx(0.024)
    # K >= W: the workers' own links (S each way) are the limit: 2 * 1e6 / 1.25e8 = 16 ms
    assert costs.ps_time(MB, 3, 3, GBIT) == pytest.approx(0.016)
    assert costs.ps_time(MB, 2, 4, GBIT) == pytest.approx(0.016)
    # one worker, one server: S each way, the same as the workers' bound
    assert costs.ps_time(MB, 1, 1, GBIT) == pytest.approx(0.016)


def test_serial_replies_overlap_the_pulls_with_the_next_pushes():
    # W = 3, K = 1, replies one at a time: 3 pulls of S one after another, then the last worker's
    # push of S: 4 S / B = 32 ms (+ 2 alpha), against the 6 S / B = 48 ms of the two phases
    assert costs.ps_time(MB, 3, 1, GBIT, serial=True) == pytest.approx(0.032)
    assert costs.ps_time(MB, 3, 1, GBIT, 1e-4, serial=True) == pytest.approx(0.0322)
    # K = 2: (W + K) S / K = 2.5 S: 20 ms; one worker or K >= W: the worker's own 2 S, as without
    assert costs.ps_time(MB, 3, 2, GBIT, serial=True) == pytest.approx(0.020)
    assert costs.ps_time(MB, 1, 1, GBIT, serial=True) == costs.ps_time(MB, 1, 1, GBIT)
    assert costs.ps_time(MB, 3, 3, GBIT, serial=True) == costs.ps_time(MB, 3, 3, GBIT)


def test_colocated_ps_moves_what_a_ring_moves():
    # N = 4: 2 * 3/4 * S / B = 12 ms, as the ring; latency 2 alpha instead of 2 (N-1) alpha
    assert costs.colocated_ps_time(MB, 4, GBIT) == pytest.approx(0.012)
    assert costs.colocated_ps_time(MB, 4, GBIT, 1e-4) == pytest.approx(0.0122)
    assert costs.colocated_ps_time(MB, 1, GBIT) == 0.0
    for n in (2, 3, 8):
        assert costs.colocated_ps_time(MB, n, GBIT) == pytest.approx(costs.ring_allreduce_time(MB, n, GBIT))


def test_busbw_of_the_ring_prediction_is_the_link_rate():
    for n in (2, 3, 4, 16):
        t = costs.ring_allreduce_time(64 * MB, n, GBIT)
        assert costs.busbw(64 * MB, n, t) == pytest.approx(GBIT)
    # the K = 1 PS with 3 workers (N = 4 ranks) reaches a quarter of the link: 0.75 S / (3 S / B) = B / 4
    assert costs.busbw(MB, 4, costs.ps_time(MB, 3, 1, GBIT)) == pytest.approx(GBIT / 4)


@pytest.mark.parametrize("call", [lambda: costs.ring_allreduce_time(-1, 2, GBIT),
                                  lambda: costs.ring_allreduce_time(1, 0, GBIT),
                                  lambda: costs.ps_time(1, 1, 0, GBIT),
                                  lambda: costs.ps_time(1, 0, 1, GBIT),
                                  lambda: costs.colocated_ps_time(1, 2, 0.0),
                                  lambda: costs.colocated_ps_time(1, 2, GBIT, -1.0),
                                  lambda: costs.busbw(1, 2, 0.0)])
def test_out_of_range_arguments_are_named(call):
    with pytest.raises(ValueError, match="="):
        call()


def test_quartiles():
    assert quartiles([1, 2, 3, 4, 5]) == (2.0, 3.0, 4.0)
    assert quartiles([7.0]) == (7.0, 7.0, 7.0)
    with pytest.raises(ValueError):
        quartiles([])


def test_paired_ratio_ci_is_the_ratio_of_medians_with_an_interval_around_it():
    rng = np.random.default_rng(1)
    load = rng.uniform(1.0, 3.0, 40)                 # a shared machine: both methods slowed alike per round
    a, b = 2.0 * load * rng.uniform(0.98, 1.02, 40), load
    r, lo, hi = paired_ratio_ci(a, b)
    assert r == pytest.approx(np.median(a) / np.median(b))
    assert lo <= r <= hi and lo < hi
    assert paired_ratio_ci(a, b) == (r, lo, hi)      # seeded: the same input gives the same interval
    # the same values with the pairs broken: the interval no longer benefits from pairing, so is wider
    _, lo2, hi2 = paired_ratio_ci(a, rng.permutation(b))
    assert hi2 - lo2 > hi - lo
    # exact multiples: a degenerate interval at the ratio
    assert paired_ratio_ci([2, 4, 6], [1, 2, 3]) == (2.0, 2.0, 2.0)
    assert paired_ratio_ci([5.0], [2.0]) == (2.5, 2.5, 2.5)
    for bad in (([], []), ([1, 2], [1])):
        with pytest.raises(ValueError, match="equal non-empty"):
            paired_ratio_ci(*bad)
    assert math.isfinite(paired_ratio_ci([1, 2, 100], [1, 1, 1], level=0.5)[1])
