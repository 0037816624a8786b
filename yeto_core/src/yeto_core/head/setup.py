"""The head's set-up before its loop: :class:`HeadSetup`, a mixin of
:class:`~yeto_core.head.run.Head`.

``write_config`` puts the resolved config and the base model into the store
(islands read them there), ``prepare_base`` builds a missing base model through
the backend, and ``claim`` takes the store's head lease and marks the run dir.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from yeto_core.config import run_store
from yeto_core.config.load import config_to_dict
from yeto_core.errors import YetoError
from yeto_core.head.islands import _host
from yeto_core.head.lease import HeadBusyError, HeadLease
from yeto_core.head.run_dir import CONFIG_FILE, DOWN_FILE, HEAD_FILE, live_head, write_json_atomic


class HeadSetup:
    """Set-up steps of a run's head (the host holds the config, plugins, store, run dir,
    clock, events and head state)."""

    def write_config(self) -> None:
        """The resolved config and the base model into the store (islands read them there)."""
        write_json_atomic(self.run_dir / CONFIG_FILE, config_to_dict(self.config))
        run_store.write_config(self.store, self.config)
        model = Path(self.config.model.path)
        if model.is_dir():
            if run_store.publish_model(self.store, model):
                self.events.emit("model_published", path=str(model.absolute()))

    def prepare_base(self, say: Callable[[str], None] = print) -> None:
        """Build the base model through the backend when ``model.path`` holds none and
        ``model.base_options`` asks for one (never for a mistyped path)."""
        path = Path(self.config.model.path)
        if (path / "config.json").is_file():
            return
        if not self.config.model.base_options:
            raise YetoError(
                f"model.path {str(path)!r} holds no model (no config.json); check it for a "
                "typo, or set model.base_options to have the backend build a base"
            )
        backend_cls = self.plugins.trainer_backend(self.config.trainer.backend)
        if not backend_cls.implements("prepare_base"):
            raise YetoError(
                f"model.path {str(path)!r} has no model and the {self.config.trainer.backend!r} "
                "backend cannot build one; point model.path at a model directory"
            )
        options = dict(self.config.model.base_options)
        options.setdefault("task", self.config.task.name)
        options.setdefault("seed", self.config.seed)
        say(f"building the base model in {path} (first run only) ...")
        t0 = self.clock()
        backend_cls.prepare_base(options, path)
        say(f"base model ready in {self.clock() - t0:.1f} s")

    def claim(self) -> None:
        """Become this run's head: take the store's head lease (refused while another head
        holds a live one; a lapsed lease is taken over and its holder fenced)."""
        other = live_head(self.run_dir)
        lease = HeadLease(
            self.leased.inner,
            ttl_s=self.config.scheduler.head_lease_s,
            clock=self.clock,
            host=_host(),
        )
        taken = lease.acquire()
        if other is not None and int(other["pid"]) != os.getpid() and taken is None:
            lease.release()  # a live head that holds no lease in this store
            raise HeadBusyError(
                f"another head (pid {other['pid']}) runs on {self.run_dir}; stop it with "
                f"`yeto run down {self.run_dir}` or wait for it"
            )
        self.lease = lease
        self.leased.lease = lease
        lease.start_renewing()
        if taken is not None:
            self.events.emit(
                "head_lease_taken_over",
                lapsed=taken,
                now=self.clock(),
                message=f"the previous head's lease had lapsed; it is fenced: it stops "
                f"without writing when it wakes (pid {taken.get('pid')} on {taken.get('host')})",
            )
        write_json_atomic(
            self.run_dir / HEAD_FILE, {"pid": os.getpid(), "started_at": self.state.started_at}
        )
        run_store.write_head(
            self.store, started_at=self.state.started_at, pid=os.getpid(), host=_host()
        )
        (self.run_dir / DOWN_FILE).unlink(missing_ok=True)
