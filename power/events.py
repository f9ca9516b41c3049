"""A watchdog event: what was breached, by how much, and the evidence for it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from edgekit.power.sample import iso_time

Severity = Literal["info", "warning", "critical"]
# The kinds the policy rules raise (edgekit.power.policy): the keys a policy's actions may name
EVENT_KINDS = ("jitter", "power_band", "temperature", "sensor", "over_current", "throttle")


@dataclass
class ActionResult:
    action: str
    status: Literal["done", "failed", "dry_run", "not_registered"]
    detail: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"action": self.action, "status": self.status, "detail": self.detail}


@dataclass
class Event:
    t_s: float  # wall clock (or the replayed log's clock) when the breach was seen
    kind: str  # one of EVENT_KINDS
    severity: Severity
    message: str
    # What a human needs to judge the event: the rule, the window, the values
    # that breached and the budget they were held to.
    evidence: dict[str, Any] = field(default_factory=dict)
    actions: list[ActionResult] = field(default_factory=list)
    detected_mono_s: float | None = None  # monotonic time of detection, for latency-of-detection checks

    def to_dict(self) -> dict[str, Any]:
        return {
            "t_s": round(self.t_s, 6),
            "time": iso_time(self.t_s),
            "kind": self.kind,
            "severity": self.severity,
            "message": self.message,
            "evidence": self.evidence,
            "actions": [a.to_dict() for a in self.actions],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Event":
        return cls(
            t_s=float(d["t_s"]), kind=str(d["kind"]), severity=d.get("severity", "warning"),
            message=str(d.get("message", "")), evidence=dict(d.get("evidence") or {}),
            actions=[ActionResult(a.get("action", "?"), a.get("status", "done"), a.get("detail", "")) for a in d.get("actions") or []],
        )
