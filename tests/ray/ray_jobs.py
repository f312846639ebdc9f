"""The driver's Ray job and tasks run in it, for the tests that read Ray's own events."""

from __future__ import annotations


def job_id() -> str:
    """The driver's Ray job id (hex)."""
    import ray

    return str(ray.get_runtime_context().get_job_id())


def task_ids(n: int) -> list[str]:
    """Run ``n`` no-op tasks to the end; their Ray task ids (hex)."""
    import ray

    @ray.remote
    def noop(i: int) -> int:
        return i

    refs = [noop.remote(i) for i in range(n)]
    ray.get(refs)
    return [ref.task_id().hex() for ref in refs]
