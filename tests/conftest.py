"""Shared fixtures: one local Ray instance for the whole run, a two-node cluster on demand.

Only one Ray cluster can be connected per process, so a session-scoped
manager owns the connection and switches between the two:

* ``ray_local`` (module scope): a single node with 2 CPUs, started once and
  reused by every module that asks for it;
* ``ray_cluster`` (module scope): a ``ray.cluster_utils.Cluster`` with a head
  and one worker node, 1 CPU each. It disconnects the local instance first;
  the next module that asks for ``ray_local`` starts it again.

Tests that use ``ray_cluster`` are moved to the end of the run, so the switch
happens once.

Every trace a test writes is checked by trace_processor (the ``tp_check``
plugin). So that the traces of every Ray session the suite starts, its
subprocesses' included, can be found, Ray's temporary folder is one of this
run's own (``RAY_TMPDIR``), watched by that plugin.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.register_assert_rewrite("tp_check")
import tp_check  # noqa: E402
from ray_starts import started  # noqa: E402

pytest_plugins = ["pytester", "tp_check"]

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
# Ray reports task events every second by default; a traced run's close waits
# for the last ones (tracer.ray.events_channel). Every 100 ms here, so that the
# suite's hundreds of short runs do not each wait a second (Ray's processes,
# started by the tests or their subprocesses, inherit it).
os.environ.setdefault("RAY_task_events_report_interval_ms", "100")
# Short (Ray's socket paths must stay under 108 bytes) and this run's own.
os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="tracer-ray-")
tp_check.watch_folder(Path(os.environ["RAY_TMPDIR"]))

#: Object store of every Ray node the tests start (75 MiB: small and quick to start).
OBJECT_STORE_MEMORY = 78643200

_TESTS = Path(__file__).resolve().parent


def _worker_env() -> dict[str, Any]:
    """Ray workers import test modules by name (functions defined in them are pickled by
    reference): put every folder holding tests on their path."""
    folders = sorted({str(p.parent) for p in _TESTS.rglob("test_*.py")})
    old = os.environ.get("PYTHONPATH")
    return {"env_vars": {"PYTHONPATH": os.pathsep.join(folders + ([old] if old else []))}}


def _interruptible_workers() -> None:
    """Let the Ray processes this one starts be interrupted, as ``ray.cancel`` needs.

    Ray cancels a running task by interrupting its worker's main thread
    (``_thread.interrupt_main``), which does nothing where SIGINT is ignored;
    and Ray's processes inherit that from this one. A shell ignores SIGINT in
    the commands it runs in the background (``pytest ... &``): the tests of
    cancelling then failed there, and only there. A handled signal is reset
    to its default at exec, so the workers get Python's own handler again.
    """
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@contextlib.contextmanager
def _agent_on_a_port_of_its_own() -> Iterator[None]:
    """The local Ray's dashboard agent listens on a port the system picks, not on Ray's
    fixed default (52365), which the Rays that tests start meanwhile in subprocesses (the
    examples run as scripts, drivers with a Ray of their own) then find free.

    This Ray lives through most of the run. With it on 52365, each of those Rays' agent
    retried that port for ~3.4 s and gave up, and its ``ray.init`` waited for it: ~4 s
    more per start, 15 starts in a run. ``ray.init`` takes no such port; 0 is what
    ``ray.cluster_utils`` gives its worker nodes' agents for the same reason.
    """
    from ray._private import parameter

    init = parameter.RayParams.__init__

    def init_any_agent_port(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.dashboard_agent_listen_port = 0

    parameter.RayParams.__init__ = init_any_agent_port
    try:
        yield
    finally:
        parameter.RayParams.__init__ = init


def _start_local() -> None:
    """A new local Ray (2 CPUs), connected; nothing left on failure."""
    import ray

    try:
        with _agent_on_a_port_of_its_own():
            ray.init(
                address="local",  # always a new local instance, never a cluster already running
                num_cpus=2,
                object_store_memory=OBJECT_STORE_MEMORY,
                include_dashboard=False,
                log_to_driver=False,
                runtime_env=_worker_env(),
            )
    except BaseException:
        if ray.is_initialized():
            ray.shutdown()
        raise


def _start_two_nodes() -> Any:
    """A connected ``Cluster`` (head and one worker node, 1 CPU each); nothing left on failure."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "object_store_memory": OBJECT_STORE_MEMORY,
            "include_dashboard": False,
        },
    )
    try:
        cluster.add_node(num_cpus=1, object_store_memory=OBJECT_STORE_MEMORY)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False, runtime_env=_worker_env())
    except BaseException:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
        raise
    return cluster


class RayManager:
    """Owns this process's Ray connection: the local instance or the two-node cluster."""

    def __init__(self) -> None:
        self.mode: str | None = None
        self.cluster: Any = None

    def local(self) -> None:
        import ray

        if self.mode == "local" and ray.is_initialized():
            return
        self.shutdown()
        _interruptible_workers()
        started(_start_local, "local Ray")
        self.mode = "local"

    def two_nodes(self) -> Any:
        import ray

        if self.mode == "cluster" and ray.is_initialized():
            return self.cluster
        self.shutdown()
        _interruptible_workers()
        self.cluster = started(_start_two_nodes, "two-node cluster")
        self.mode = "cluster"
        return self.cluster

    def shutdown(self) -> None:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        if self.cluster is not None:
            cluster, self.cluster = self.cluster, None
            cluster.shutdown()
        self.mode = None


@pytest.fixture(scope="session")
def ray_manager() -> Iterator[RayManager]:
    manager = RayManager()
    yield manager
    manager.shutdown()


@pytest.fixture(scope="module")
def ray_local(ray_manager: RayManager) -> None:
    """A local Ray instance: 2 CPUs, 75 MiB object store, no dashboard."""
    ray_manager.local()


@pytest.fixture(scope="module")
def ray_cluster(ray_manager: RayManager) -> Any:
    """A two-node ``ray.cluster_utils.Cluster`` (1 CPU each), connected; yields the cluster."""
    return ray_manager.two_nodes()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the tests that use the two-node cluster last (one switch of Ray connection)."""
    items.sort(key=lambda item: "ray_cluster" in getattr(item, "fixturenames", ()))
