"""Demand: what the limiter reports for one group, by the one definition every Tollgate client
uses (the Rust model's ``demand`` module; a shared table of cases keeps the two in step).

- **demand** is the rate of units asked since the last report (admitted or not, unthrottled
  work included, each request once however long it waited), or its moving average (folding
  time 0.2 s) when that is higher;
- a group whose requests had to wait since the last report asks for at least half again the
  rate it holds;
- units waiting now are reported as they are; unthrottled units as a rate;
- demand counts settled units: the asked rate is scaled by units consumed (settled) per unit
  admitted as asked, a moving average with folding time ``COST_FACTOR_FOLDING_S``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Optional

from .cost import Consumption

DEMAND_FOLDING_S = 0.2
"""Folding time of the demand smoother, seconds."""
HUNGRY_FACTOR = 1.5
"""How much more than its grant a group whose requests waited asks for."""
COST_FACTOR_FOLDING_S = 2.0
"""Folding time of the settled-to-asked cost factor, seconds."""
COST_FACTOR_BOUNDS = (1.0 / 64.0, 64.0)
"""The bounds of the settled-to-asked cost factor."""
MIN_INTERVAL_S = 0.1
"""The shortest interval a rate is measured over."""


@dataclass
class Counts:
    """A group's running totals."""

    asked: float = 0.0
    consumed: float = 0.0
    admitted_units: float = 0.0
    """Units admitted as asked, before settlements."""
    unthrottled: float = 0.0
    admitted: int = 0
    throttled: int = 0
    waited: int = 0
    would_refuse: int = 0
    """Admitted in shadow mode, and would have been refused."""
    detail: Consumption = field(default_factory=Consumption)

    def copy(self) -> "Counts":
        return replace(self, detail=replace(self.detail))


@dataclass
class Report:
    """One report for one group, what an exchange carries."""

    demand: float
    unthrottled: float
    waiting: float
    consumed: float
    requests: float
    throttled: float
    held: float
    waited: float
    detail: Consumption
    would_refuse: float = 0.0


class DemandMeter:
    """Turns a group's running totals into reports."""

    def __init__(self, now: float) -> None:
        self.last = Counts()
        self.last_at = now
        self.average = 0.0
        self.last_moved = now
        self.cost_factor = 1.0

    def copy(self) -> "DemandMeter":
        m = DemandMeter(self.last_at)
        m.last, m.average, m.last_moved = self.last.copy(), self.average, self.last_moved
        m.cost_factor = self.cost_factor
        return m

    def report(self, now: float, counts: Counts, waiting: float, granted: Optional[float]) -> Report:
        """The report for what happened since the last one, given the totals now, the units
        waiting now and the rate held (``None``: unlimited or not granted yet)."""
        dt = max(now - self.last_at, MIN_INTERVAL_S)
        last = self.last
        rate = max((counts.asked - last.asked) / dt, 0.0)
        keep = math.exp(-dt / DEMAND_FOLDING_S)
        self.average = self.average * keep + rate * (1.0 - keep)
        admitted = counts.admitted_units - last.admitted_units
        if admitted > 0.0:
            low, high = COST_FACTOR_BOUNDS
            factor = min(max((counts.consumed - last.consumed) / admitted, low), high)
            fold = math.exp(-dt / COST_FACTOR_FOLDING_S)
            self.cost_factor = self.cost_factor * fold + factor * (1.0 - fold)
        demand = max(rate, self.average) * self.cost_factor
        if counts.waited > last.waited and granted is not None and math.isfinite(granted):
            demand = max(demand, granted * HUNGRY_FACTOR)
        report = Report(
            demand=demand,
            unthrottled=max(max(counts.unthrottled - last.unthrottled, 0.0) / dt, 0.0),
            waiting=max(waiting, 0.0),
            consumed=max(counts.consumed - last.consumed, 0.0),
            requests=float(max(counts.admitted - last.admitted, 0)),
            throttled=float(max(counts.throttled - last.throttled, 0)),
            held=max(granted if granted is not None else 0.0, 0.0),
            waited=float(max(counts.waited - last.waited, 0)),
            detail=counts.detail.since(last.detail),
            would_refuse=float(max(counts.would_refuse - last.would_refuse, 0)),
        )
        if self.moved(counts):
            self.last_moved = now
        self.last = counts.copy()
        self.last_at = now
        return report

    def moved(self, counts: Counts) -> bool:
        """Whether the totals moved since the last report."""
        return counts.asked != self.last.asked or counts.consumed != self.last.consumed

    def idle(self, now: float, counts: Counts, expiry: float) -> bool:
        """Nothing seen for at least ``expiry`` seconds: the group is no longer reported."""
        return not self.moved(counts) and now - self.last_moved >= expiry
