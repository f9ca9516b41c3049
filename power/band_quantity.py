"""Which power reading the power band holds: one quantity for a whole run, not whatever each sample happened to read.

A sample's power is the board's measured total (its input rail, e.g. VDD_IN, or a device's own figure) or, on a
board without one, the sum of the rails it read. A rail missing from one reading (an INA3221 channel that failed a
read, a tegrastats line cut off in its last rail, a garbled ``VDD_IN NaNmW``) turns that reading into the sum of
fewer rails: a smaller number that is not the board's power. Held against a band around the full sum, it read as a
drop of several watts and raised a power_band event (and, in the runtime, ran its action: shed_load).

So the band keeps the most complete quantity it has seen and compares only readings of that quantity: a measured
total covers any sum of rails, and a sum covers the sums of its subsets. A reading that covers more than the one
held (the first line of a log was the cut one) takes its place, and a centre learnt on the lesser one is learnt
again.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgekit.power.sample import PowerSample


@dataclass(frozen=True)
class BandQuantity:
    measured_total: bool  # the input rail (or the device's figure), not a sum of rails
    parts: frozenset[str]  # the total's source, or the rails summed

    @classmethod
    def of(cls, sample: PowerSample) -> "BandQuantity | None":
        if sample.total_mw is not None:
            return cls(True, frozenset([sample.total_source or ""]))
        if sample.rails_sum_mw is not None:
            return cls(False, frozenset(sample.rails_sum_of))
        return None

    def covers(self, other: "BandQuantity") -> bool:
        """Whether this is the same quantity as ``other`` or a more complete one."""
        if self.measured_total != other.measured_total:
            return self.measured_total
        return self.parts == other.parts if self.measured_total else self.parts >= other.parts
