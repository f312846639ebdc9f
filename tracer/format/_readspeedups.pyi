"""Type stub of the readers' C fast path (tracer/format/_readspeedups.c)."""

from typing import Any

def replay_run(reader: Any, data: bytes, pos: int, file_offset: int, in_bundle: bool) -> int: ...
