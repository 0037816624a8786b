"""The ``miles`` trainer backend: Miles' trainer (Megatron) fed round by round by yeto.

The trainer incarnation's driver (:class:`~yeto_core.lifecycle.DriverLifecycle`)
takes each round with yeto's batch reader; this backend hands it to a Miles
process it launched with yeto's plug-ins on Miles' path flags:

- :meth:`restore` starts Miles (``--load`` the cut's ``iter_*`` checkpoint, or
  the base) and waits for its first rollout request, which must be the cut's.
- :meth:`train_round` puts the round on the bridge and returns once Miles'
  post-save hook says it is trained and saved (``--save-interval 1``); only
  then does the driver record the ledger and commit the watermark.
- :meth:`publish_release` makes a release of the round's HF export.
- :meth:`save_cut` writes the round's ``iter_*/``, Megatron's
  ``latest_checkpointed_iteration.txt``, the HF export and ``yeto_miles.json``;
  the core commits its manifest last.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any, Optional

import attrs

from yeto_core.errors import ConfigError, CutError
from yeto_core.ports import TrainerBackend
from yeto_core.records import ReleaseInfo, Trigger
from yeto_miles import inventory
from yeto_miles.bridge import Bridge
from yeto_miles.release import publish_from_export

CUT_FORMAT = 1
#: ``--num-rollout`` unless set: yeto decides when training ends (``total_rounds`` is a
#: target after which the trainer still drains the backlog), so Miles must not stop first.
NUM_ROLLOUT = 1_000_000
STATE_FILE = "yeto_miles.json"
TRACKER = "latest_checkpointed_iteration.txt"


def iter_name(rollout_id: Any) -> str:
    """Megatron's checkpoint directory of iteration (Miles rollout) ``rollout_id``."""
    return f"iter_{int(rollout_id):07d}"


def base_fingerprint(model_dir: Path) -> str:
    """sha256 of the base's ``config.json`` and its weight files' names and sizes."""
    h = hashlib.sha256((Path(model_dir) / "config.json").read_bytes())
    for p in sorted(Path(model_dir).glob("*.safetensors")):
        h.update(f"{p.name}:{p.stat().st_size}".encode())
    return "sha256:" + h.hexdigest()


def _link_tree(src: Path, dst: Path) -> None:
    """Hard-link (copy across file systems) every file of ``src`` under ``dst``."""
    for path in sorted(Path(src).rglob("*")):
        target = dst / path.relative_to(src)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, target)
        except OSError:
            shutil.copyfile(path, target)


def _stop(proc: subprocess.Popen, bridge: Bridge, grace_s: float) -> None:
    try:
        bridge.close()
    except Exception:
        pass
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=grace_s)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            continue


def _from_run(name: str) -> Any:
    """``group_size`` or ``groups_per_round`` from the run config in the store."""
    url = os.environ.get("YETO_STORE")
    if not url:
        return None
    from yeto_core.plugins import get_plugins
    from yeto_core.run_store import read_config

    cfg = read_config(get_plugins().open_store(url))
    return {
        "group_size": cfg.samplers[0].group_size if cfg.samplers else None,
        "groups_per_round": cfg.trainer.groups_per_round,
    }[name]


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default)


def _default_workdir() -> str:
    """The island's own scratch space (``.yeto-<island>-i<incarnation>-miles`` in its cwd)."""
    if "YETO_ISLAND" not in os.environ:
        return tempfile.mkdtemp(prefix="yeto-miles-")
    island, inc = _env("YETO_ISLAND", "trainer"), _env("YETO_INCARNATION", "0")
    return str(Path.cwd() / f".yeto-{island}-i{inc}-miles")


@attrs.define(eq=False)
class MilesBackend(TrainerBackend):
    """GRPO with Miles (Megatron) on the trainer island. Options: ``docs/miles.md``."""

    PLUGIN_NAME = "miles"

    model_dir: Path = attrs.field(converter=Path)
    miles_dir: Path = attrs.field(default="/root/miles", converter=Path)
    entry: str = "train.py"
    python: str = attrs.field(factory=lambda: sys.executable)
    miles_args: list[str] = attrs.field(default=(), converter=lambda a: [str(x) for x in a])
    ref_load: Optional[str] = None
    num_rollout: int = NUM_ROLLOUT
    group_size: Optional[int] = None
    groups_per_round: Optional[int] = None
    rollout_form: str = "function"
    routed_experts: bool = False
    workdir: Path = attrs.field(factory=_default_workdir, converter=Path)
    bridge_url: Optional[str] = None
    bridge_prefix: str = attrs.field(
        factory=lambda: f"trainer/{_env('YETO_INCARNATION', '0')}/miles"
    )
    start_timeout_s: float = 3600.0
    round_timeout_s: float = 3600.0
    poll_s: float = 0.2
    seed: int = 0
    env: dict[str, str] = attrs.field(factory=dict)
    proc: Optional[subprocess.Popen] = attrs.field(default=None, init=False)
    bridge: Optional[Bridge] = attrs.field(default=None, init=False)
    next_id: int = attrs.field(default=0, init=False)
    last_saved: Optional[dict[str, Any]] = attrs.field(default=None, init=False)
    restored: Optional[Path] = attrs.field(default=None, init=False)
    restored_state: Optional[dict[str, Any]] = attrs.field(default=None, init=False)
    _finalizer: Any = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        missing = []
        for name in ("group_size", "groups_per_round"):
            value = getattr(self, name) or _from_run(name)
            if not value:
                missing.append(name)
            setattr(self, name, int(value or 0))
        if missing:
            raise ConfigError(
                f"trainer.backend_options: {', '.join(missing)} not set and not found in the run "
                "config ([[samplers]] group_size, [trainer] groups_per_round)"
            )
        problems = inventory.check_user_args(self.miles_args)
        if problems:
            raise ConfigError("trainer.backend_options.miles_args: " + "; ".join(problems))
        if self.bridge_url is None:
            self.bridge_url = _env("YETO_STORE", str(self.workdir / "bridge"))

    @property
    def save_dir(self) -> Path:
        return self.workdir / "megatron"

    hf_template = property(lambda self: str(self.workdir / "hf" / "{rollout_id}"))
    log_path = property(lambda self: self.workdir / "miles.log")

    def custom_config(self) -> dict[str, Any]:
        """What the plug-ins inside Miles read as ``args.yeto_*``."""
        return {
            "yeto_bridge_url": self.bridge_url,
            "yeto_bridge_prefix": self.bridge_prefix,
            "yeto_parent": f"{socket.gethostname()}:{os.getpid()}",
            "yeto_wait_s": self.round_timeout_s * 24,
            "yeto_poll_s": self.poll_s,
        }

    def command(self, load_dir: Optional[Path] = None) -> list[str]:
        """The exact Miles command line of this incarnation (``--dry-run`` prints it)."""
        load = load_dir if load_dir is not None else self.save_dir
        config = self.workdir / "yeto_custom_config.yaml"
        return inventory.miles_command(self, load_dir=str(load), custom_config=str(config))

    # -- the Miles process ----------------------------------------------------------------

    def _alive(self) -> Optional[str]:
        code = None if self.proc is None else self.proc.poll()
        if self.proc is not None and code is None:
            return None
        try:
            tail = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-30:])
        except OSError:
            tail = "(no log)"
        done = f" (it ran its --num-rollout {self.num_rollout})" if code == 0 else ""
        return f"Miles exited with code {code}{done}; last lines of {self.log_path}:\n{tail}"

    def _launch(self, load_dir: Optional[Path]) -> Bridge:
        from yeto_core.plugins import get_plugins

        self.close()
        self.workdir.mkdir(parents=True, exist_ok=True)
        bridge = Bridge(get_plugins().open_store(self.bridge_url), self.bridge_prefix)
        for key in list(bridge.store.list(self.bridge_prefix + "/")):
            bridge.store.delete(key)  # a fresh channel per Miles process
        cfg = json.dumps(self.custom_config(), indent=1) + "\n"  # JSON is YAML
        (self.workdir / "yeto_custom_config.yaml").write_text(cfg)
        cmd = self.command(load_dir)
        (self.workdir / "miles_command.json").write_text(json.dumps(cmd, indent=1) + "\n")
        with open(self.log_path, "ab") as log:
            try:
                self.proc = subprocess.Popen(
                    cmd,
                    cwd=str(self.miles_dir),
                    env=dict(os.environ, **self.env),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            except OSError as exc:
                raise ConfigError(
                    f"cannot start Miles ({cmd[0]} {cmd[1]} in {self.miles_dir}): {exc}; set "
                    "trainer.backend_options.miles_dir to Miles' checkout on the trainer image"
                ) from None
        self.bridge = bridge
        self._finalizer = weakref.finalize(self, _stop, self.proc, bridge, 30.0)
        return bridge

    def close(self) -> None:
        """Stop the Miles process (and tell its rollout function to stop waiting)."""
        if self._finalizer is not None:
            self._finalizer()
        self._finalizer, self.proc = None, None

    # -- port ----------------------------------------------------------------------------

    def restore(self, cut_dir: Optional[Path]) -> None:
        """Start Miles from the base (``cut_dir`` None) or from a cut's iter_* checkpoint."""
        if not (self.model_dir / "config.json").is_file():
            raise ConfigError(
                f"model.path {str(self.model_dir)!r} has no config.json; the miles backend needs "
                "the base as a Hugging Face checkpoint (it is Miles' --hf-checkpoint)"
            )
        load_dir: Optional[Path] = None
        self.next_id, self.last_saved, self.restored, self.restored_state = 0, None, None, None
        if cut_dir is not None:
            self.restored = Path(cut_dir)
            self.restored_state = state = self._read_state(self.restored)
            if not state["from_base"]:
                load_dir, self.next_id = self.restored, int(state["rollout_id"]) + 1
        if load_dir is None:
            shutil.rmtree(self.save_dir, ignore_errors=True)  # Miles starts from --hf-checkpoint
        bridge = self._launch(load_dir)
        got = bridge.wait(
            lambda: (bridge.requests() or [None])[0],
            what="Miles' first rollout request",
            timeout_s=self.start_timeout_s,
            alive=self._alive,
            poll_s=self.poll_s,
        )
        if got != self.next_id:
            self.close()
            raise CutError(
                f"Miles resumed at rollout {got} but the cut holds {self.next_id} trained rounds "
                f"(iter_* of rollout {self.next_id - 1}); --load {load_dir} is not this cut"
            )

    def _read_state(self, cut: Path) -> dict[str, Any]:
        path = cut / STATE_FILE
        state = json.loads(path.read_text()) if path.is_file() else {}
        tracker = (cut / TRACKER).read_text().strip() if (cut / TRACKER).is_file() else None
        mine = {"format": CUT_FORMAT, "group_size": self.group_size,
                "groups_per_round": self.groups_per_round,
                "base_fingerprint": base_fingerprint(self.model_dir)}  # fmt: skip
        for key, want in mine.items():
            if state.get(key) != want:
                raise CutError(
                    f"{path}: {key} is {state.get(key)!r}, this trainer has {want!r}; restore a cut "
                    "of the miles backend taken with the same base, G and groups per round"
                )
        if not state["from_base"] and (
            tracker != str(state["rollout_id"]) or not (cut / iter_name(tracker)).is_dir()
        ):
            raise CutError(
                f"{cut}: {TRACKER} says {tracker!r} but the cut holds rollout "
                f"{state['rollout_id']} ({iter_name(state['rollout_id'])}/ expected)"
            )
        return state

    def train_round(self, batch: Any) -> dict[str, float]:
        """Hand the round to Miles; return once Miles trained and saved it."""
        bridge = self.bridge
        if bridge is None or self.proc is None:
            raise RuntimeError("train_round before restore(); call restore(None) first")
        r, t0 = self.next_id, time.monotonic()
        bridge.put_batch(r, batch)
        saved = bridge.wait(
            lambda: bridge.get_json(bridge.saved_key(r)),
            what=f"Miles to train and save round {r}",
            timeout_s=self.round_timeout_s,
            alive=self._alive,
            poll_s=self.poll_s,
        )
        bridge.drop_batch(r)
        if self.last_saved is not None:  # only the newest round's checkpoint is kept here
            prev = int(self.last_saved["rollout_id"])
            shutil.rmtree(self.save_dir / iter_name(prev), ignore_errors=True)
            shutil.rmtree(self.hf_template.format(rollout_id=prev), ignore_errors=True)
        self.last_saved, self.next_id = saved, r + 1
        return {"miles_rollout_id": float(r), "miles_round_s": time.monotonic() - t0}

    def _hf_dir(self) -> Path:
        s = self.last_saved or {}
        return Path(s.get("hf_dir") or self.hf_template.format(rollout_id=s.get("rollout_id")))

    def publish_release(self, out_dir: Path) -> ReleaseInfo:
        """The release of the last round's HF export (before the first: the cut's, or the base)."""
        if self.last_saved is not None:
            src = self._hf_dir()
        elif self.restored is not None and (self.restored / "hf").is_dir():
            src = self.restored / "hf"
        else:
            src = self.model_dir
        return publish_from_export(src, self.model_dir, Path(out_dir))

    def save_cut(self, out_dir: Path, trigger: Trigger) -> None:
        """Megatron's iter_* of the last round, its HF export, and ``yeto_miles.json``."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        state: dict[str, Any] = {
            "format": CUT_FORMAT,
            "backend": self.PLUGIN_NAME,
            "trigger": Trigger(trigger).value,
            "group_size": self.group_size,
            "groups_per_round": self.groups_per_round,
            "base_fingerprint": base_fingerprint(self.model_dir),
            "miles_commits": list(inventory.MILES_COMMITS),
            "from_base": True,
            "rollout_id": -1,
        }
        if self.last_saved is not None:
            r = int(self.last_saved["rollout_id"])
            ckpt, hf = Path(self.last_saved["checkpoint_dir"]), self._hf_dir()
            tracker = self.save_dir / TRACKER
            said = tracker.read_text().strip() if tracker.is_file() else None
            if said != str(r) or not ckpt.is_dir():
                raise CutError(
                    f"Megatron's {tracker} says {said!r} but round {r} was saved to {ckpt}; "
                    "the checkpoint is not complete (is --async-save on?)"
                )
        elif self.restored_state is not None and not self.restored_state["from_base"]:
            assert self.restored is not None  # no round since the restore: cut it again
            r = int(self.restored_state["rollout_id"])
            ckpt, hf = self.restored / iter_name(r), self.restored / "hf"
        else:
            r = -1
        if r >= 0:
            _link_tree(ckpt, out / iter_name(r))
            if hf.is_dir():
                _link_tree(hf, out / "hf")
            (out / TRACKER).write_text(f"{r}\n")
            state.update(from_base=False, rollout_id=r)
        state["trained_rounds"] = r + 1
        (out / STATE_FILE).write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")
