"""The narrow seam between the ``sky`` provider and SkyPilot's SDK.

Every SkyPilot call the provider makes goes through a :class:`SkySeam`:
:class:`SkyPilotSeam` calls the real SDK (``sky.launch``, ``sky.get``,
``sky.status``, ``sky.job_status``, ``sky.down``, ``sky.tail_logs``); tests
put a double behind the same six methods.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Mapping
from typing import Any, Optional

#: Job states after which the island's process has ended.
TERMINAL_JOB_STATES = frozenset(
    {"SUCCEEDED", "FAILED", "FAILED_SETUP", "FAILED_DRIVER", "CANCELLED"}
)


class SkyLaunchError(RuntimeError):
    """SkyPilot could not launch a cluster; the message is SkyPilot's."""


class SkySeam(abc.ABC):
    """What the provider needs from SkyPilot, and nothing more."""

    @abc.abstractmethod
    def launch(self, task_config: Mapping[str, Any], cluster: str, autostop_minutes: int) -> str:
        """Submit the launch of ``cluster`` running the task; return the request id at once."""

    @abc.abstractmethod
    def wait_launch(self, request_id: str) -> Optional[int]:
        """Block until the launch finished; return the job id of the task's run command.

        :raises SkyLaunchError: the launch failed (the cluster may still exist).
        """

    @abc.abstractmethod
    def clusters(self, names: Optional[list[str]] = None) -> dict[str, str]:
        """Cluster name -> status (``INIT``, ``UP``, ``STOPPED``), refreshed from the cloud.

        A terminated cluster (torn down, or a preempted spot cluster) is absent.
        ``names=None``: every cluster of this user.
        """

    @abc.abstractmethod
    def job_status(self, cluster: str, job_id: int) -> Optional[str]:
        """The job's state (``RUNNING``, ``SUCCEEDED``, ``FAILED``, ...), None if unknown."""

    @abc.abstractmethod
    def down(self, cluster: str) -> None:
        """Tear ``cluster`` down and wait for the request; a missing cluster is no error."""

    @abc.abstractmethod
    def logs(self, cluster: str, job_id: int) -> Iterator[str]:
        """Follow the job's output, line by line, until the job ends."""


class SkyPilotSeam(SkySeam):
    """The real SDK (SkyPilot 0.14 client; it talks to the user's API server)."""

    def __init__(self) -> None:
        import sky
        from sky import exceptions

        self.sky = sky
        self.exceptions = exceptions

    def launch(self, task_config: Mapping[str, Any], cluster: str, autostop_minutes: int) -> str:
        task = self.sky.Task.from_yaml_config(dict(task_config))
        request_id = self.sky.launch(
            task, cluster_name=cluster, idle_minutes_to_autostop=autostop_minutes, down=True
        )
        return str(request_id)

    def wait_launch(self, request_id: str) -> Optional[int]:
        try:
            job_id, _handle = self.sky.get(request_id)
        except Exception as exc:  # SkyPilot raises many types; keep its message
            raise SkyLaunchError(f"{type(exc).__name__}: {exc}") from exc
        return None if job_id is None else int(job_id)

    def clusters(self, names: Optional[list[str]] = None) -> dict[str, str]:
        records = self.sky.get(self.sky.status(names, refresh=self.sky.StatusRefreshMode.AUTO))
        out = {}
        for r in records:
            name = r["name"] if isinstance(r, Mapping) else r.name
            status = r["status"] if isinstance(r, Mapping) else r.status
            out[str(name)] = str(getattr(status, "value", status))
        return out

    def job_status(self, cluster: str, job_id: int) -> Optional[str]:
        try:
            states = self.sky.get(self.sky.job_status(cluster, [job_id]))
        except self.exceptions.ClusterDoesNotExist:
            return None
        state = states.get(job_id)
        return None if state is None else str(getattr(state, "value", state))

    def down(self, cluster: str) -> None:
        try:
            self.sky.get(self.sky.down(cluster))
        except self.exceptions.ClusterDoesNotExist:
            return

    def logs(self, cluster: str, job_id: int) -> Iterator[str]:
        stream = self.sky.tail_logs(cluster, job_id, follow=True, preload_content=False)
        pending = ""
        for chunk in stream:
            if chunk is None:
                break
            pending += chunk
            *lines, pending = pending.split("\n")
            yield from lines
        if pending:
            yield pending
