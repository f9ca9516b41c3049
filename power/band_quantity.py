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

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from edgekit.power.sample import PowerSample


@dataclass(frozen=True)
class BandQuantity:
    measured_total: bool  # the input rail (or the device's figure), not a sum of rails
    parts: frozenset[str]  # the total's source, or the rails summed

    @classmethod
    def of(cls, sample: PowerSample) -> "BandQuantity | None":
        return cls._of(sample.total_mw, sample.total_source, sample.rails_sum_mw, sample.rails_sum_of)

    @classmethod
    def of_record(cls, d: Mapping[str, Any]) -> "BandQuantity | None":
        """Of a sample as logged (PowerSample.to_dict)."""
        return cls._of(d.get("total_mw"), d.get("total_source"), d.get("rails_sum_mw"), d.get("rails_sum_of"))

    @classmethod
    def _of(cls, total_mw, total_source, rails_sum_mw, rails_sum_of) -> "BandQuantity | None":
        if total_mw is not None:
            return cls(True, frozenset([total_source or ""]))
        if rails_sum_mw is not None:
            return cls(False, frozenset(rails_sum_of or []))
        return None

    def covers(self, other: "BandQuantity") -> bool:
        """Whether this is the same quantity as ``other`` or a more complete one."""
        if self.measured_total != other.measured_total:
            return self.measured_total
        return self.parts == other.parts if self.measured_total else self.parts >= other.parts


def fullest(quantities: Iterable[BandQuantity | None]) -> BandQuantity | None:
    """The most complete of these (a measured total, else the sum of the most rails; the commoner on a tie): the one
    a mean, a peak or an energy may be taken of. Averaged together, 27.2 W sums of four rails and 21 W sums of two
    made a mean of neither, under the first one's name."""
    counts = Counter(q for q in quantities if q is not None)
    return max(counts, key=lambda q: (q.measured_total, len(q.parts), counts[q]), default=None)
