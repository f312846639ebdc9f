"""Cached packet decodings: what makes reading a tracer trace cheap.

The writer repeats byte-identical packets that differ only in their
timestamp, so the tokenizer decodes such a packet once, keeps a
:class:`_Template` of it, and replays the template for every later packet
with the same bytes (in Python, :meth:`tracer.format._tokenizer._Tokenizer.replay`;
in C, ``_readspeedups.c``, which reads the same attributes).
"""

from __future__ import annotations

from typing import Any

from tracer.format._sequence import _Sequence

__all__: list[str] = []


class _Template:
    """What a simple, problem-free packet decoded to, apart from its timestamp.

    The writer repeats byte-identical packets (same track, name, category and
    often the same args; only the timestamp differs), so the reader caches
    their decoding (args included, when their values are flat) by the bytes
    around the timestamp field (the packet's last field, or its first in
    traces from earlier versions). It is reused only on the same sequence
    generation: interned tables only grow (a redefinition is ignored), so a
    lookup that succeeded once gives the same answer until the next clear.
    """

    __slots__ = (
        "args",
        "category",
        "clock",
        "generation",
        "kind",
        "name",
        "seq",
        "seq_id",
        "uuid",
        "value",
    )

    def __init__(
        self,
        seq: _Sequence,
        seq_id: int,
        clock: int,
        kind: int,
        uuid: int,
        name: str | None,
        category: str | None,
        value: int | float,
        args: dict[str, Any] | None,
    ) -> None:
        self.seq = seq
        self.seq_id = seq_id
        self.generation = seq.generation
        self.clock = clock
        self.kind = kind
        self.uuid = uuid
        self.name = name
        self.category = category
        self.value = value
        self.args = args


#: At most this many cached packet decodings (see _Template).
_TEMPLATE_LIMIT = 4096
#: At most this many packets seen once and not cached yet (see _Tokenizer.record).
_SEEN_LIMIT = 4 * _TEMPLATE_LIMIT
#: The TracePacket fields a cacheable packet may have.
_SIMPLE_PACKET_FIELDS = frozenset(
    {"timestamp", "timestamp_clock_id", "trusted_packet_sequence_id", "track_event"}
)
#: The TrackEvent fields a cacheable event may have.
_SIMPLE_EVENT_FIELDS = frozenset(
    {
        "type",
        "track_uuid",
        "name",
        "name_iid",
        "categories",
        "category_iids",
        "counter_value",
        "double_counter_value",
        "debug_annotations",
    }
)
#: Annotation values a cached decoding may hold (see _Tokenizer.remember).
_FLAT = frozenset({bool, int, float, str, type(None)})

