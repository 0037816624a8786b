"""The ``modal`` island provider: each island incarnation is one ``spawn`` of the run's
deployed Modal app, journaled in ``<state_dir>/modal/`` (docs/modal.md: A head that dies)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Optional

from yeto_core.errors import YetoError
from yeto_core.head.run_dir import write_json_atomic
from yeto_core.ports import IslandProvider
from yeto_core.providers.dists import build_wheels, lock_env
from yeto_core.providers.env import ENV_VERSIONS, stamp_submitted
from yeto_core.records import Event, IslandStatus
from yeto_modal import app as modal_app
from yeto_modal.entry import ENV_ENTRY, ENV_MOUNTS

ENDED = ("success", "failure", "timeout", "terminated", "expired", "missing")


def split_env(env: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(the call's ``YETO_*`` but ``YETO_STORE_*``; the Secret's: the rest but ``MODAL_*``)."""
    ident = {
        k: v for k, v in env.items() if k.startswith("YETO_") and not k.startswith("YETO_STORE_")
    }
    return ident, {k: v for k, v in env.items() if k not in ident and not k.startswith("MODAL_")}


class ModalError(YetoError):
    """Modal refused or failed an island operation."""


class CallSeam:
    """The Modal calls the provider makes (tests put a double here)."""

    def __init__(self) -> None:
        import modal  # noqa: F401  (fail early when the SDK is missing)

    def deploy(self, built: Any) -> None:
        built.app.deploy(name=built.app_name, environment_name=built.environment)

    def spawn(self, built: Any, function: str, env: dict[str, str]) -> str:
        return built.functions[function].spawn(env).object_id

    def poll(self, call_id: str) -> tuple[str, str]:
        """(state, detail): ``pending`` or one of :data:`ENDED`."""
        import modal
        import modal.exception as mx

        try:
            modal.FunctionCall.from_id(call_id).get(timeout=0)
            return "success", ""
        except mx.FunctionTimeoutError as exc:
            return "timeout", str(exc)
        except mx.OutputExpiredError:
            return "expired", "the call ended and its output expired"
        except mx.TimeoutError:
            return "pending", ""
        except mx.NotFoundError as exc:
            return "missing", str(exc)
        except mx.InputCancellation:
            return "terminated", "cancelled"
        except (mx.AuthError, mx.ConnectionError, mx.ServiceError, mx.InternalError) as exc:
            raise ModalError(f"cannot ask Modal about call {call_id}: {exc}") from exc
        except Exception as exc:  # the island's own failure, re-raised by get()
            return "failure", f"{type(exc).__name__}: {exc}"

    def cancel(self, call_id: str, terminate_containers: bool) -> None:
        import modal

        modal.FunctionCall.from_id(call_id).cancel(terminate_containers=terminate_containers)


def _load_config(store_url: str) -> Any:
    from yeto_core.config.run_store import read_config
    from yeto_core.plugins import get_plugins

    return read_config(get_plugins().open_store(store_url))


class ModalIslands(IslandProvider):
    """Islands as Modal function calls; ``seam`` (default :class:`CallSeam`) makes the calls,
    ``load_config`` reads a store URL's run config, ``release_timeout_s`` bounds a cancel."""

    PLUGIN_NAME = "modal"

    #: Builds the seam; tests replace it with a double.
    seam_factory: Callable[[], Any] = CallSeam

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        *,
        seam: Any = None,
        load_config: Callable[[str], Any] = _load_config,
        plugins: Any = None,
        release_timeout_s: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.dir = Path(state_dir) / "modal"
        self.dir.mkdir(parents=True, exist_ok=True)
        #: The run's yeto wheels, built at the first launch (the images copy them).
        self.wheel_dir = Path(state_dir) / "wheels"
        self.seam = seam if seam is not None else type(self).seam_factory()
        self.load_config = load_config
        self.plugins = plugins
        self.release_timeout_s = release_timeout_s
        self.clock, self.sleep = clock, sleep
        self.built: Any = None
        self._launched: set[str] = set()
        self._events: dict[str, list[Event]] = {}
        self._reported: dict[str, str] = {}

    def _path(self, handle: str) -> Path:
        return self.dir / f"{handle}.json"

    def record(self, handle: str) -> Optional[dict[str, Any]]:
        try:
            return json.loads(self._path(handle).read_text())
        except (OSError, ValueError):
            return None

    def _event(self, handle: str, kind: str, **data: Any) -> None:
        self._events.setdefault(handle, []).append(
            Event(kind=kind, time=time.time(), source=handle, data=data)
        )

    def app_for(self, launch: Any) -> Any:
        """Build and deploy the run's app once (credentials from the launch's variables)."""
        if self.built is None:
            from yeto_core.config.load import config_to_dict
            from yeto_core.plugins import get_plugins

            config = self.load_config(launch.store_url)
            plans = modal_app.plan(config, self.plugins or get_plugins(), self.wheel_dir)
            # the run's own yeto: its wheels built now, copied into the images at deploy
            build_wheels(modal_app.shipped_of(plans), self.wheel_dir)
            built = modal_app.build(
                config,
                plans,
                credentials=split_env(launch.env)[1],
                config_json=config_to_dict(config),
            )
            try:
                self.seam.deploy(built)
            except Exception as exc:
                raise ModalError(
                    f"cannot deploy Modal app {built.app_name!r}: {exc}. Check `modal token new` "
                    "(or MODAL_TOKEN_ID/MODAL_TOKEN_SECRET) and the workspace's limits"
                ) from exc
            self.built = built
        return self.built

    def launch(self, launch: Any) -> str:
        handle = launch.handle
        if self.record(handle) is not None:
            raise ModalError(f"island {handle} is already in the journal {self._path(handle)}")
        built = self.app_for(launch)
        group = next((p for p in built.plans.values() if launch.island in p.islands), None)
        if group is None:
            raise ModalError(
                f"island {launch.island!r} is in no Modal function of app {built.app_name!r} "
                f"({sorted(built.plans)}); is its provider 'modal' in the run config?"
            )
        env = {
            **split_env(launch.env)[0],
            ENV_MOUNTS: json.dumps(group.volumes),
            ENV_ENTRY: launch.entry_module,
        }
        # each spawn its own submission time: the deployed function's environment was
        # built once, at the run's launch (the seed's T_s bug)
        env = stamp_submitted(env)
        if group.shipped:  # the island refuses to start on other yeto versions
            env[ENV_VERSIONS] = lock_env(group.shipped)
        try:
            call_id = self.seam.spawn(built, group.name, env)
        except Exception as exc:
            self._event(handle, "modal_spawn_refused", function=group.name, error=str(exc))
            raise ModalError(
                f"Modal refused to start island {handle} ({group.name}): {exc}"
            ) from exc
        write_json_atomic(  # before launch returns: a head that dies now leaves it journaled
            self._path(handle),
            {
                "handle": handle,
                "call_id": call_id,
                "app": built.app_name,
                "function": group.name,
                "island": launch.island,
                "role": launch.role,
                "incarnation": launch.incarnation,
                "launched_at": time.time(),
            },
        )
        self._launched.add(handle)
        self._event(handle, "modal_spawned", call_id=call_id, function=group.name)
        return handle

    def _state(self, handle: str) -> tuple[Optional[dict[str, Any]], str, str]:
        rec = self.record(handle)
        if rec is None:
            return None, "gone", ""
        try:
            state, detail = self.seam.poll(rec["call_id"])
        except ModalError as exc:  # Modal unreachable: unknown is not lost; ask again later
            self._event(handle, "modal_poll_failed", call_id=rec["call_id"], error=str(exc))
            return rec, "pending", str(exc)
        if state in ENDED and self._reported.get(handle) != state:
            self._reported[handle] = state
            self._event(
                handle, "modal_call_ended", call_id=rec["call_id"], state=state, detail=detail
            )
        return rec, state, detail

    def status(self, handle: str) -> Any:
        rec, state, _ = self._state(handle)
        if rec is None:
            return IslandStatus.GONE
        return IslandStatus.RUNNING if state == "pending" else IslandStatus.EXITED

    def returncode(self, handle: str) -> Optional[int]:
        rec, state, _ = self._state(handle)
        if rec is None or state == "pending":
            return None
        return 0 if state == "success" else 1

    def events(self, handle: str) -> Iterator[Event]:
        return iter(self._events.pop(handle, []))

    def log_hint(self, handle: str) -> str:
        rec = self.record(handle)
        return f"modal app logs {rec['app']} (call {rec['call_id']})" if rec else ""

    def release(self, handle: str) -> bool:
        """Cancel the call (terminating its container) and confirm it ended."""
        rec, state, _ = self._state(handle)
        if rec is None:
            return True
        if state == "pending":
            try:
                self.seam.cancel(rec["call_id"], terminate_containers=True)
            except Exception as exc:
                self._event(handle, "modal_cancel_failed", call_id=rec["call_id"], error=str(exc))
            deadline = self.clock() + self.release_timeout_s
            while state == "pending":
                if self.clock() >= deadline:
                    self._event(handle, "modal_release_unverified", call_id=rec["call_id"])
                    return False
                self.sleep(0.2)
                _, state, _ = self._state(handle)
        self._event(handle, "modal_released", call_id=rec["call_id"], state=state)
        self._path(handle).unlink(missing_ok=True)
        self._launched.discard(handle)
        return True

    def orphans(self) -> list[str]:
        """Journaled calls that this provider did not start (a previous head's)."""
        return sorted(p.stem for p in self.dir.glob("*.json") if p.stem not in self._launched)
