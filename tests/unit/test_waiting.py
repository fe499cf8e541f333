"""Waiting on a descriptor numbered past 1024 (a long run's): ``readable`` answers where ``select.select`` raises."""

from __future__ import annotations

import os
import resource
import select

import pytest

from repro.common.waiting import readable

HIGH_FD = 1500


def test_readable_works_past_selects_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= HIGH_FD:
        pytest.skip(f"this machine allows {hard} descriptors")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, HIGH_FD + 1), hard))
    r, w = os.pipe()
    high = os.dup2(r, HIGH_FD)
    try:
        with pytest.raises(ValueError, match="out of range"):  # the control: what a long run hit
            select.select([high], [], [], 0)
        assert not readable(high, 0.05)
        os.write(w, b"x")
        assert readable(high, 1.0)
        os.close(w)
        w = -1
        assert readable(high, 1.0)  # a hang-up wakes it too
    finally:
        for fd in (r, high, w):
            if fd >= 0:
                os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
