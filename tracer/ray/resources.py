"""The resource request a task is submitted with."""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any


@dataclasses.dataclass(frozen=True)
class ResourceRequest:
    """CPUs, GPUs and memory asked of Ray for one task.

    ``memory_bytes`` is Ray's ``memory=`` option: a logical reservation that
    Ray schedules by and never enforces, which is why tracer compares it with
    what the task actually used.
    """

    num_cpus: float | None = 1.0
    num_gpus: float | None = None
    memory_bytes: int | None = None

    def __post_init__(self) -> None:
        for name in ("num_cpus", "num_gpus", "memory_bytes"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float, numbers.Real)):
                # A string ("1 GiB") failed below as "'<' not supported between str and int".
                raise TypeError(
                    f"ResourceRequest.{name} must be a number or None, got {value!r}"
                    + (" (in bytes)" if name == "memory_bytes" else "")
                )
            if not math.isfinite(value) or value < 0:
                # (NaN passed every check, then failed as "cannot convert float NaN to
                # integer" inside the tracer, or as a request no node could hold)
                raise ValueError(
                    f"ResourceRequest.{name} must be a finite number >= 0 or None, "
                    f"got {value!r}"
                )

    def ray_options(self) -> dict[str, Any]:
        """The matching keyword arguments of ``f.options(...)``."""
        opts: dict[str, Any] = {}
        if self.num_cpus is not None:
            opts["num_cpus"] = self.num_cpus
        if self.num_gpus is not None:
            opts["num_gpus"] = self.num_gpus
        if self.memory_bytes is not None:
            opts["memory"] = self.memory_bytes
        return opts

    def as_args(self) -> dict[str, int | float]:
        """The request as a trace annotation (absent fields written as 0)."""
        return {
            "num_cpus": _num(self.num_cpus),
            "num_gpus": _num(self.num_gpus),
            "memory_bytes": int(self.memory_bytes or 0),
        }


def as_request(request: Any) -> ResourceRequest:
    """A :class:`ResourceRequest` from what a runner has: one, None (the default
    request), a dict, or any object with ``num_cpus``/``num_gpus``/``memory_bytes``
    (Daft's ``ResourceRequest``)."""
    if isinstance(request, ResourceRequest):
        return request
    if request is None:
        return ResourceRequest()
    if isinstance(request, dict):
        # Ray's own spelling (`memory`, as in .options()) means the same: a runner that
        # passed its Ray options got "no request" before.
        memory = request.get("memory_bytes")
        ray_memory = request.get("memory")
        if memory is None:
            memory = ray_memory
        elif ray_memory is not None and ray_memory != memory:
            raise ValueError(
                f"a request of memory_bytes={memory!r} and memory={ray_memory!r}: give one"
            )
        return ResourceRequest(
            num_cpus=request.get("num_cpus"),
            num_gpus=request.get("num_gpus"),
            memory_bytes=memory,
        )
    return ResourceRequest(
        num_cpus=getattr(request, "num_cpus", None),
        num_gpus=getattr(request, "num_gpus", None),
        memory_bytes=getattr(request, "memory_bytes", None),
    )


def _num(value: float | None) -> int | float:
    if value is None:
        return 0
    return int(value) if float(value).is_integer() else float(value)
