from bot.money import money


def test_sub_cent_amounts_are_not_shown_as_zero() -> None:
    assert money(0.0006) == "$0.0006"
    assert money(0) == "$0.00"
    assert money(1234.5) == "$1,234.50"
    assert money(None) == "-"
