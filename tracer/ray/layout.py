"""The names in a runner trace: the contract between writer, queries and users.

Queries (``tracer.query``), tests and user SQL rely on these names; change
them only together with those. Annotation names appear in trace_processor
as ``debug.<name>`` (nested: ``debug.resource_request.num_cpus``).
"""

from __future__ import annotations

# Slice categories: every slice carries exactly one.
CAT_SCHEDULER = "scheduler"
CAT_TASK = "task"
CAT_STAGE = "stage"
CAT_EXECUTION = "execution"

# Tracks.
SCHEDULER_PROCESS = "Scheduler"
DISPATCH_LOOP_THREAD = "Dispatch loop"
TASKS_TRACK = "Ray tasks"
TASK_LANE = "tasks"
STAGES_TRACK = "Stages"
NODE_PROCESS_PREFIX = "Node"
WORKER_THREAD_PREFIX = "worker"

COUNTER_INFLIGHT = "tasks in flight"
COUNTER_AVAILABLE_CPUS = "available CPUs"
COUNTER_AVAILABLE_GPUS = "available GPUs"
COUNTER_AVAILABLE_MEMORY = "available memory"

# Dispatch-loop slices (category scheduler).
SLICE_EXECUTION = "execution"
SLICE_WAVE = "wave"
SLICE_PLAN_POLLING = "plan polling"
SLICE_BATCHING = "batching"
SLICE_DISPATCHING = "dispatching"
SLICE_AWAITING = "awaiting"
SLICE_NOOP_TASK = "no-op task"

# Dispatch-loop instants (category scheduler).
INSTANT_NOTHING_READY = "plan: nothing ready"
INSTANT_MATERIALIZED = "plan: result materialised"
INSTANT_TASK_ADDED = "plan: task added to batch"
INSTANT_DISPATCH_TASK = "dispatch task"
INSTANT_DISPATCH_ACTOR_TASK = "dispatch actor task"
INSTANT_METRICS_LOST = "task measurements lost"

# Task slices (category task): the outer slice is named after the stage.
SLICE_DISPATCHED = "dispatched"

# Instants on a worker or node (category execution).
INSTANT_TASK_FAILED = "task failed"

# Annotation names.
ARG_TASK_ID = "task_id"
ARG_STAGE_ID = "stage_id"
ARG_STAGE = "stage"
ARG_INSTRUCTIONS = "instructions"
ARG_RESOURCE_REQUEST = "resource_request"
ARG_RAY_TASK_ID = "ray_task_id"
ARG_ASSIGNED_RESOURCES = "assigned_resources"
ARG_WORKER_PID = "worker_pid"
ARG_NODE_ID = "node_id"
ARG_ERROR_TYPE = "error_type"
ARG_ERROR = "error"
ARG_STATUS = "status"
ARG_ATTEMPT = "attempt"
