"""A running job against its quote: how much slower than quoted it runs, what it costs at this pace, where
its cap stops it, and when the cap's stop is due (issue 36). Pure: figures in, a Pace (or a yes/no) out.

The pace is read from the job's own figures: what the ledger has billed so far at the locked price (the bot's
clock), the steps done and left, and the runner's own estimate of the time left (``eta_seconds``, a host's
claim). The bot's clock over the steps done includes the start (image, model load), so it reads a pace
slower than the steady one; the runner's estimate reads the steady pace. The projection takes the faster of
the two: a job is said to run slow only when even the kinder reading says so, and a host that claims to be
slow cannot make it look slower than the bot's own clock does. What it says decides no money: the cap's stop
does (``cap_due``), on the spend the bot bills.

Said once in the job's thread after the first few percent of steps (bot/engine/money/slow_jobs.py), again only
when it gets materially worse (``worse``); `status JOB` and `tunebot jobs` show it while it holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bot.money import cap_covering, money

WARM_SHARE = 0.05  # the first 5% of steps (start, warm-up, the base model's eval) say little of the pace
MIN_STEPS = 3  # ... nor do fewer steps than this
SLOWER = 1.5  # a job projected at this many times its quoted hours is said to run slow
WORSE = 1.25  # said again only once the pace is this much slower than when it was last said


@dataclass(frozen=True)
class Pace:
    """A running job's projection at its pace so far."""

    step: int
    max_steps: int
    slower: float  # projected hours / quoted hours
    cost: float  # the job's spend at the end at this pace (billed compute, the locked price)
    hours: float  # the job's billed hours at the end at this pace
    max_cost: float | None = None
    cap_step: int | None = None  # where the cap stops it at this pace; None: it finishes within its cap

    @property
    def slow(self) -> bool:
        """Worth telling: well over its quoted time, or its cap stops it before its last step."""
        return self.slower >= SLOWER or self.cap_step is not None

    def line(self, job_id: str) -> str:
        """'running 2.4x slower than quoted: at this pace $0.41 and 3.2 h; the cap ($0.20) stops it near step
        410 of 1000. ...' with what to do."""
        head = f"running {self.slower:.1f}x slower than quoted" if self.slower >= 1.1 else "running"
        out = f"{head}: at this pace {money(self.cost)} and {hours_text(self.hours)}"
        if self.cap_step is None:
            return f"{out}, within its cap. `stop {job_id}` ends it now with what it has trained."
        raise_to = cap_covering(self.cost * 1.1)
        cap = money(self.max_cost)
        return (
            f"{out}; the cap ({cap}) stops it near step {self.cap_step} of {self.max_steps}. To finish it, "
            f"`resume {job_id} max_cost={money(raise_to)}` once the cap stops it (it continues from its "
            f"checkpoint); `stop {job_id}` ends it now with what it has trained."
        )


def pace(
    *,
    step: int | None,
    max_steps: int | None,
    spent: float,
    price_per_hour: float | None,
    quoted_hours: float | None,
    eta_seconds: float | None = None,
    max_cost: float | None = None,
) -> Pace | None:
    """The projection of a running job, or None while there is too little to go on (before WARM_SHARE of
    its steps, no price, no quote) or nothing left to project (its last step, its cap reached)."""
    if not (step and max_steps and price_per_hour and quoted_hours and spent > 0):
        return None
    if step < max(MIN_STEPS, WARM_SHARE * max_steps) or step >= max_steps:
        return None
    if max_cost is not None and spent >= max_cost:
        return None  # the cap's stop is due: nothing to warn of
    ran_h = spent / price_per_hour
    left = max_steps - step
    left_h = ran_h / step * left  # the bot's clock, the start included: the slow reading
    if eta_seconds is not None and math.isfinite(eta_seconds) and eta_seconds >= 0:
        left_h = min(left_h, eta_seconds / 3600.0)  # the runner's steady pace, never slower than the bot's
    hours = ran_h + left_h
    cost = spent + left_h * price_per_hour
    cap_step = None
    if max_cost is not None and cost > max_cost and left_h > 0:
        per_step_h = left_h / left
        cap_step = min(max_steps - 1, step + int((max_cost - spent) / price_per_hour / per_step_h))
    return Pace(step, max_steps, hours / quoted_hours, cost, hours, max_cost, cap_step)


def worse(now: Pace, said_slower: float | None, said_capped: bool = False) -> bool:
    """Whether to say it (again): never said, materially slower than when it was said, or its cap now
    stops it where it did not."""
    if said_slower is None:
        return True
    return now.slower >= said_slower * WORSE or (now.cap_step is not None and not said_capped)


def cap_due(spent: float, burn_per_hour: float, max_cost: float, soonest_s: float) -> bool:
    """Whether the cap's stop is due now: the spend has reached the cap, or will have by the soonest the bot
    can look again (the low end of the spend projected at its next chance to act: its next tick). Not the
    far end: 9a0c9c1 stopped on the spend a whole reconcile period ahead, so a small cap stopped its job at
    50% and 82% of it; the runner stops itself at the cap on its own clock (runner.contract.spec.CostSpec)."""
    return spent >= max_cost or spent + burn_per_hour * soonest_s / 3600.0 >= max_cost


def hours_text(h: float) -> str:
    """'3.2 h', '25 min', '40 s' (as the cards write durations)."""
    if h >= 1:
        return f"{h:.1f} h"
    return f"{h * 60:.0f} min" if h * 60 >= 1 else f"{h * 3600:.0f} s"
