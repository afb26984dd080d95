"""What the Inspector shows: events with their timings, grouped in event blocks."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from etlab.facts import display


class TimeScale(enum.Enum):
    """A unit of event times: the run's (source) and the Inspector's tables (target); CYCLES converts only to CYCLES."""

    NS = "ns"
    US = "us"
    MS = "ms"
    S = "s"
    CYCLES = "cycles"


_PER_SECOND = {TimeScale.NS: 1e9, TimeScale.US: 1e6, TimeScale.MS: 1e3, TimeScale.S: 1.0, TimeScale.CYCLES: 1.0}



def time_scale(value, arg: str) -> TimeScale:
    """A TimeScale from an enum member or its string value ("ns", "ms", ...)."""
    if isinstance(value, TimeScale):
        return value
    try:
        return TimeScale(str(value).lower())
    except ValueError:
        raise ValueError(f"{arg}: {value!r} is not a time scale; use one of "
                         f"{[t.value for t in TimeScale]}") from None


def time_scale_factor(source: TimeScale, target: TimeScale) -> float:
    """Divide a duration in `source` units by this to get `target` units."""
    return _PER_SECOND[source] / _PER_SECOND[target]


@dataclass
class PerfData:
    """Durations of one event over the runs of its block, in the Inspector's target time scale."""

    raw: list[float]

    @property
    def p10(self) -> float:
        """The 10th percentile duration."""
        return float(np.percentile(self.raw, 10))

    @property
    def p50(self) -> float:
        """The median duration: the number to compare across runs (robust to outliers)."""
        return float(np.percentile(self.raw, 50))

    @property
    def p90(self) -> float:
        """The 90th percentile duration."""
        return float(np.percentile(self.raw, 90))

    @property
    def avg(self) -> float:
        """The mean duration."""
        return float(np.mean(self.raw))

    @property
    def min(self) -> float:
        """The shortest duration."""
        return float(min(self.raw))

    @property
    def max(self) -> float:
        """The longest duration."""
        return float(max(self.raw))


@dataclass
class Event:
    """One operator, delegate call or framework step, as observed over the runs of its block.

    Fields from the ETDump: name, perf_data, start_time (raw clock values, one per run),
    instruction_id, chain_index, delegate_debug_identifier, is_delegated_op, debug_data
    (intermediate outputs; meta-device tensors when no debug buffer was given) and the raw
    delegate metadata. Fields from the ETRecord (empty without one): op_types, debug_handles,
    num_outputs, stack_traces and module_hierarchy (keyed by graph node name; events of the same
    nodes share these two dicts: copy one before changing it), and delegate_backend_name.
    """

    name: str
    perf_data: PerfData | None = None
    op_types: list[str] = field(default_factory=list)
    delegate_debug_identifier: int | str | None = None
    debug_handles: int | tuple[int, ...] | None = None
    num_outputs: int = 1
    stack_traces: dict[str, str | None] = field(default_factory=dict)
    module_hierarchy: dict[str, Any] = field(default_factory=dict)
    is_delegated_op: bool | None = None
    delegate_backend_name: str | None = None
    debug_data: list = field(default_factory=list)
    instruction_id: int | None = None
    chain_index: int | None = None
    start_time: list[int] | None = None
    raw_delegate_debug_metadatas: list[bytes] = field(default_factory=list)
    delegate_metadata_parser: Callable[[list[bytes]], Any] | None = field(default=None, repr=False)

    @cached_property
    def delegate_debug_metadatas(self):
        """The delegate metadata of each run, parsed by the Inspector's delegate_metadata_parser
        when there is one (and the event is delegated), else the raw bytes."""
        raw = self.raw_delegate_debug_metadatas
        if not raw or not self.is_delegated_op or self.delegate_metadata_parser is None:
            return raw
        return self.delegate_metadata_parser(self.raw_delegate_debug_metadatas)


@dataclass
class EventBlock:
    """Events of one kind of run: a method load ("Default") or executions with the same event
    sequence ("Execute"), merged over the runs. run_output holds the first run's outputs."""

    name: str
    events: list[Event] = field(default_factory=list)
    source_time_scale: TimeScale = TimeScale.NS
    target_time_scale: TimeScale = TimeScale.MS
    bundled_input_index: int | None = None
    run_output: list | None = None
    reference_output: list | None = None
    num_runs: int = 1

    def _repr_html_(self) -> str | None:
        return display.html(self)  # the views register it (etlab.facts.display)

    def to_dataframe(self, include_units: bool = False, include_delegate_debug_data: bool = False):
        """This block's events, one row each (same columns as Inspector.to_dataframe)."""
        from etlab.inspector._frames import events_to_dataframe

        return events_to_dataframe(self, include_units, include_delegate_debug_data)
