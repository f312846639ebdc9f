"""Reading what a task raised out of the text of its traceback (Ray's errors are text)."""

from __future__ import annotations

from typing import Any

import pytest

from tracer.ray import layout as L
from tracer.ray.task_errors import (
    exception_message,
    exceptions_in_traceback,
    kill_args,
    killed_workers,
    memory_at_kill,
    raised_in_traceback,
    top_memory_users,
    where_from_error,
)

_HEADER = "\x1b[36mray::f()\x1b[39m (pid=1, ip=10.0.0.1)\n"
_FRAME = '  File "/job.py", line 8, in f\n    raise exc("x")\n    ^^^^^^^^^^^^^^\n'
_CAUSE = "\n\nThe above exception was the direct cause of the following exception:\n\n"
_DURING = "\n\nDuring handling of the above exception, another exception occurred:\n\n"
_WRAPPER = "ray.exceptions.UserCodeException: UDF failed to process a data block.\n"


@pytest.mark.parametrize(("text", "raised"), [
    # A task's own exception, as Ray's error text ends.
    ("User exception:\n" + _HEADER + _FRAME + "ValueError: boom",
     ("ValueError", "ValueError: boom")),
    # A message of several lines: its first; a class alone.
    (_HEADER + _FRAME + "mymod.Outer.BadRecord: a\nsecond: line", ("BadRecord",
                                                                    "mymod.Outer.BadRecord: a")),
    (_HEADER + _FRAME + "BadRecord", ("BadRecord", "BadRecord")),
    # Raised from another, or while handling one: the one raised last.
    (_HEADER + _FRAME + "KeyError: 1" + _CAUSE + _HEADER + _FRAME + "RuntimeError: no key",
     ("RuntimeError", "RuntimeError: no key")),
    (_HEADER + _FRAME + "KeyError: 1" + _DURING + _HEADER + _FRAME + "RuntimeError: x",
     ("RuntimeError", "RuntimeError: x")),
    # Ray Data's wrapper (no frames of its own): what it wraps.
    (_HEADER + _FRAME + "ValueError: no 7 here" + _CAUSE + _HEADER + _WRAPPER
     + "To change retry attempts: configure `DataContext`\n",
     ("ValueError", "ValueError: no 7 here")),
    # Cut before the wrapped exception (Ray 2.55 keeps the text's last ~500 characters).
    ("User exception:\n_\n    res = self._fn(batch)\n" + _FRAME + _WRAPPER,
     ("UserCodeException", _WRAPPER.strip())),
    # Cut with no frame or header left to say where the exception's line is.
    ("User exception:\n_\n    res = self._fn(batch)\n" + _WRAPPER, None),
    # Not a traceback: Ray's reports of a killed worker, a cut-off head.
    ("Task was killed due to the node running low on memory.\nMemory on the node", None),
    ("RayTaskError(ValueError): bad", None),
    ("", None),
])
def test_the_exception_a_task_raised_is_read_out_of_its_traceback(
    text: str, raised: tuple[str, str] | None
) -> None:
    assert raised_in_traceback(text) == raised


def test_every_exception_of_a_chain_innermost_first() -> None:
    text = (_HEADER + _FRAME + "KeyError: 1" + _DURING + _FRAME + "ValueError: v" + _CAUSE
            + _HEADER + _WRAPPER)
    assert [t for t, _ in exceptions_in_traceback(text)] == [
        "KeyError", "ValueError", "UserCodeException"]


def test_an_exception_s_message_beside_its_type() -> None:
    assert exception_message("mymod.BadRecord: record 5: bad", "BadRecord") == "record 5: bad"
    assert exception_message("ValueError: x", "ValueError") == "x"
    assert exception_message("BadRecord", "BadRecord") == ""
    assert exception_message("Task was killed: OOM", "OutOfMemoryError") == (
        "Task was killed: OOM")


class OutOfMemoryError(Exception):
    """Ray's, as task_errors tells it: by class name."""


def gb(amount: float) -> int:
    """Ray's "GB" in its reports, in bytes: GiB (a report says "23.54GB limit" and
    "25276194816B limit" of one node)."""
    return int(amount * (1 << 30))


_NODE_ID = "090fd2f5bdd1f837bd4d4fbea4d95942d44ede2dd164760b006a0bdd"
#: Ray 2.50's report: one worker, the task's.
_OOM_250 = (
    "Task was killed due to the node running low on memory.\nMemory on the node (IP: "
    f"10.0.62.231, ID: {_NODE_ID}) where the task (task ID: 43534ce9375fa8e4cd0d0ec285d997"
    "4a6a95897401000000, name=allocate_memory, pid=11362, memory used=1.25GB) was running "
    "was 1.89GB / 2.00GB (0.945815), which exceeds the memory usage threshold of 0.95."
)


def _oom_260(*workers: tuple[Any, ...], actors: tuple[tuple[int, str], ...] = ()) -> str:
    """Ray 2.60's report of the workers killed in one round (as real runs printed it);
    a worker is (pid, memory used), or (pid, memory used, the name of its Ray task)."""
    selected = "".join(
        "Selected to kill: (Task: job ID=01000000, lease ID=0300000001000000ffff, task "
        f"name={w[2] if len(w) > 2 else 'explode'}, required resources={{CPU: 1, memory: "
        f"1e+08}}, pid={w[0]}, actual memory used={w[1]}, worker ID=d85c436c8c73e9c1)\n"
        for w in workers
    ) + "".join(
        "Selected to kill: (Actor(8a1fa46c0c2ca8511437cb3401000000): job ID=01000000, lease "
        "ID=020000004f3e, task name=tracer-metrics-raydata-01000000-0:MetricsActor.__init__, "
        f"required resources={{}}, pid={pid}, actual memory used={used}, worker ID=9770e6df)\n"
        for pid, used in actors
    )
    return (
        f"{len(workers)} worker(s) were killed due to the node running low on memory. Memory "
        f"on the node (IP: 192.0.2.2, ID: {_NODE_ID}) was 2.02GB used / 23.54GB limit\n"
        "OOM kill reason: Memory usage 2100740096B exceeded threshold of 2095396608B\n"
        f"Ray killed {len(workers)} worker(s) based on the killing policy\n"
        f"Considered workers: [\n{selected}]\n"
    )


@pytest.mark.parametrize(("text", "pid", "at_kill", "killed"), [
    (_OOM_250, 11362, gb(1.25), {11362: gb(1.25)}),
    (_oom_260((25292, "0.50GB")), 25292, gb(0.5), {25292: gb(0.5)}),
    # Several killed at once: each task gets this same text, which does not say which
    # worker ran it. No pid (not the first worker's for all), and the least memory of
    # theirs (the task's worker used at least that), not the first worker's.
    (_oom_260((25292, "0.50GB"), (25291, "0.53GB")), 0, gb(0.5),
     {25292: gb(0.5), 25291: gb(0.53)}),
    (_oom_260((7, "0.90GB"), (8, "0.25GB"), (9, "0.60GB")), 0, gb(0.25),
     {7: gb(0.9), 8: gb(0.25), 9: gb(0.6)}),
    # Actors killed with it (Ray Data's stats actor, tracer's metrics actor) ran no task:
    # one task worker named is the task's, several are its candidates.
    (_oom_260((25292, "0.67GB"), actors=((27551, "0.06GB"), (27464, "0.10GB"))), 25292,
     gb(0.67), {25292: gb(0.67), 27551: gb(0.06), 27464: gb(0.1)}),
    (_oom_260((5, "0.67GB"), (6, "0.26GB"), actors=((27551, "0.06GB"),)), 0, gb(0.26),
     {5: gb(0.67), 6: gb(0.26), 27551: gb(0.06)}),
])
def test_an_oom_report_says_where_only_what_it_knows(
    text: str, pid: int, at_kill: int, killed: dict[int, int]
) -> None:
    error = OutOfMemoryError(text)
    assert where_from_error(error) == (_NODE_ID, pid)
    assert memory_at_kill(error) == at_kill
    assert killed_workers(error) == killed
    # What a killed task's slice says: the workers it may have run in, when not one.
    args = kill_args(error)
    assert args[L.ARG_MEMORY_AT_KILL] == at_kill
    if pid:
        assert L.ARG_OOM_KILLED_WORKERS not in args
    else:
        named = {int(p): used for p, used in args[L.ARG_OOM_KILLED_WORKERS].items()}
        assert len(named) > 1 and min(named.values()) == at_kill
        assert named.items() <= killed.items()


def test_a_report_of_several_workers_names_the_task_each_ran() -> None:
    """Ray 2.60 names the Ray task each killed worker ran (Ray Data's tasks are named
    after their operator, the reference runner's after their stage): a killed task gets
    its own worker's figure, not the least of all (a map task that used 0.40 GB was said
    to have used the 0.07 GB of a read task killed with it, and was told to ask for
    less); where several workers ran tasks of its name, the least of theirs."""
    text = _oom_260((13643, "0.07GB", "ReadRange"), (13570, "0.40GB", "MapBatches(hog)"),
                    (13571, "0.30GB", "MapBatches(f, g)"), (13572, "0.20GB", "MapBatches(f, g)"),
                    actors=((13560, "0.06GB"),))
    error = OutOfMemoryError(text)
    assert where_from_error(error, "MapBatches(hog)") == (_NODE_ID, 13570)
    assert kill_args(error, "MapBatches(hog)") == {L.ARG_MEMORY_AT_KILL: gb(0.4)}
    assert kill_args(error, "ReadRange") == {L.ARG_MEMORY_AT_KILL: gb(0.07)}
    # Two workers ran tasks of that name: either may have been this one's.
    assert where_from_error(error, "MapBatches(f, g)") == (_NODE_ID, 0)
    assert kill_args(error, "MapBatches(f, g)") == {
        L.ARG_MEMORY_AT_KILL: gb(0.2),
        L.ARG_OOM_KILLED_WORKERS: {"13571": gb(0.3), "13572": gb(0.2)},
    }
    # A name the report does not have (or none): every task worker is a candidate.
    for name in (None, "other"):
        assert where_from_error(error, name) == (_NODE_ID, 0)
        args = kill_args(error, name)
        assert args[L.ARG_MEMORY_AT_KILL] == gb(0.07)
        assert set(args[L.ARG_OOM_KILLED_WORKERS]) == {"13643", "13570", "13571", "13572"}
    assert killed_workers(error) == {13643: gb(0.07), 13570: gb(0.4), 13571: gb(0.3),
                                     13572: gb(0.2), 13560: gb(0.06)}


def test_an_oom_report_lists_the_nodes_largest_processes() -> None:
    """Ray's report ends with its node's top memory users (as Ray 2.60 printed them): the
    task that took the memory is there (its worker's command names it) even where Ray
    killed another."""
    text = _oom_260((13643, "0.07GB", "ReadRange")) + (
        "Top 10 memory users: PID\tMEM(GB)\tCOMMAND\n"
        "13570\t0.40\tray::MapBatches(hog)\n"
        "13323\t0.13\t/usr/bin/python pipe.py oom\n"
        "13643\t0.07\tray::IDLE\n"
        "Refer to the documentation on how to address the out of memory issue: ...\n"
    )
    assert top_memory_users(OutOfMemoryError(text)) == [
        {"pid": 13570, "memory": gb(0.40), "command": "ray::MapBatches(hog)"},
        {"pid": 13323, "memory": gb(0.13), "command": "/usr/bin/python pipe.py oom"},
        {"pid": 13643, "memory": gb(0.07), "command": "ray::IDLE"},
    ]
    assert top_memory_users(OutOfMemoryError(_OOM_250)) == []  # none listed
    assert top_memory_users(RuntimeError(text)) == []  # not an OOM kill


def test_only_an_oom_kill_names_killed_workers() -> None:
    """A crashed worker's error names its pid, and it is no OOM report."""
    crash = RuntimeError("The worker died unexpectedly (pid=77, ip=10.0.0.1)")
    assert killed_workers(crash) == {}
    assert where_from_error(crash) == (None, 77)
