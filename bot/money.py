"""How tunebot writes dollar amounts, everywhere: cents, or four decimals for sub-cent sums."""

from __future__ import annotations


def money(amount: float | None) -> str:
    """$1,234.50, $0.25, $0.0006 (a tiny CPU job must not read as $0.00), or "-" for unknown."""
    if amount is None:
        return "-"
    if amount != 0 and abs(amount) < 0.01:
        return f"${amount:.4f}"
    return f"${amount:,.2f}"
