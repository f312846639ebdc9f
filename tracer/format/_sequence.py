"""What the tokenizer keeps per packet sequence, and the small pieces all its rooms share.

trace_processor keeps incremental state (interned strings, packet defaults,
the sequence's clock snapshot) per ``trusted_packet_sequence_id``; so do we,
in :class:`_Sequence`. The tokenizer's rooms (:mod:`._clocks`,
:mod:`._event_fields`, :mod:`._templates`, :mod:`._tokenizer`) all read it.
"""

from __future__ import annotations

__all__: list[str] = []


class _Sequence:
    """Incremental state of one packet sequence (trusted_packet_sequence_id)."""

    __slots__ = (
        "anchor",
        "anchor_epoch",
        "ann_names",
        "categories",
        "clock_default",
        "counter_totals",
        "extra_default",
        "extra_double_default",
        "generation",
        "names",
        "running",
        "snapshot",
        "strings",
        "track_default",
        "valid",
    )

    def __init__(self) -> None:
        # trace_processor starts every sequence with its incremental state
        # invalid: interned data is ignored until SEQ_INCREMENTAL_STATE_CLEARED.
        self.valid = False
        # Bumped whenever what a packet decodes to may change (clear, defaults,
        # packet loss): cached decodings of an older generation are not reused.
        self.generation = 0
        self.names: dict[int, str] = {}
        self.categories: dict[int, str] = {}
        self.ann_names: dict[int, str] = {}
        self.strings: dict[int, str] = {}
        self.clock_default = 0
        self.track_default: int | None = None
        self.extra_default: list[int] = []
        self.extra_double_default: list[int] = []
        self.counter_totals: dict[int, int | float] = {}
        # The last ClockSnapshot on this sequence: clock id -> (ns, unit
        # multiplier, incremental); and the running value (ns) of its
        # incremental clocks. A clear does not reset clocks; a snapshot does.
        self.snapshot: dict[int, tuple[int, int, bool]] = {}
        self.running: dict[int, int] = {}
        # The snapshot's trace time (Tokenizer.convert), valid while anchor_epoch is the
        # number of global snapshots so far.
        self.anchor: int | None = None
        self.anchor_epoch = -1

    def clear(self) -> None:
        self.valid = True
        self.generation += 1
        self.names = {}
        self.categories = {}
        self.ann_names = {}
        self.strings = {}
        self.clock_default = 0
        self.track_default = None
        self.extra_default = []
        self.extra_double_default = []
        self.counter_totals = {}



class _Skip(Exception):
    """Drops the packet being tokenized (its problem is already recorded)."""



def _text(value: str | bytes) -> str:
    """A protobuf string as ``str``: upb hands back ``bytes`` for invalid UTF-8."""
    if isinstance(value, str):
        return value
    try:
        return value.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return value.decode("utf-8", "replace")

