"""What one instruction costs (kernels_nki/emulator/timing.py): the DMA payload curve read off AWS's figure."""

from __future__ import annotations

import pytest

from kernels_nki.emulator import timing


def test_payload_curve_is_monotone_and_saturates():
    sizes = [2 ** k for k in range(3, 17)]
    shares = [timing.payload_share(b) for b in sizes]
    assert shares == sorted(shares) and shares[-1] == 1.0
    assert timing.payload_share(128) == pytest.approx(0.05) and timing.payload_share(2048) == pytest.approx(0.813)
