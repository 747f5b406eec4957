"""How tunebot writes dollar amounts, everywhere: cents, or enough decimals for sub-cent sums to read as
what they are (a CPU job's $0.0008, a cap of $0.002), never as $0.00 or $0.01."""

from __future__ import annotations

import math


def _decimals(amount: float) -> int:
    """Cents; four decimals under a cent; under $0.0001, two significant digits ($0.000021)."""
    if amount == 0 or abs(amount) >= 0.01:
        return 2
    if abs(amount) >= 0.0001:
        return 4
    return 1 - math.floor(math.log10(abs(amount)))


def money(amount: float | None) -> str:
    """$1,234.50, $0.25, $0.0006, $0.000021 (a tiny CPU job must not read as $0.00), or "-" for unknown."""
    if amount is None:
        return "-"
    return f"${amount:,.{_decimals(amount)}f}"


def cap_covering(amount: float) -> float:
    """The cap that covers ``amount``, rounded up to what money() writes: the cent, or a sub-cent sum's own
    decimals (a cap suggested for a $0.0008 job is $0.0008, not $0.01)."""
    scale = 10 ** _decimals(amount)
    return math.ceil(round(amount * scale, 6)) / scale
