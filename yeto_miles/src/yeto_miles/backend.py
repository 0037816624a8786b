"""The ``miles`` trainer backend: Miles' trainer (Megatron) fed round by round by yeto.

A trainer incarnation's driver (:class:`~yeto_core.lifecycle.DriverLifecycle`)
takes each round with yeto's batch reader, and this backend hands it to a Miles
process it launched:

- :meth:`MilesBackend.restore` lays out the cut's Megatron checkpoint, starts
  ``python train.py`` with yeto's plug-ins on Miles' path flags
  (:func:`yeto_miles.inventory.miles_command`) and waits until Miles' rollout
  function asks for its first round; Miles must resume exactly at the cut.
- :meth:`train_round` puts the round on the bridge and returns once Miles'
  post-save hook says the round is trained and saved (``--save-interval 1``):
  only then does the driver record the ledger and commit the watermark.
- :meth:`publish_release` turns the round's HF export into a release.
- :meth:`save_cut` writes Megatron's ``iter_*/`` checkpoint of the last round,
  ``latest_checkpointed_iteration.txt``, the round's HF export and
  ``yeto_miles.json``; the core commits the manifest last.
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
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from yeto_core.errors import ConfigError, CutError
from yeto_core.ports import TrainerBackend
from yeto_core.records import Trigger
from yeto_miles import inventory
from yeto_miles.bridge import Bridge
from yeto_miles.release import publish_from_export

CUT_FORMAT = 1
STATE_FILE = "yeto_miles.json"
TRACKER = "latest_checkpointed_iteration.txt"


def iter_name(rollout_id: int) -> str:
    """Megatron's checkpoint directory of iteration (Miles rollout) ``rollout_id``."""
    return f"iter_{int(rollout_id):07d}"


def base_fingerprint(model_dir: Path) -> str:
    """sha256 of the base's ``config.json`` and weight file names and sizes."""
    h = hashlib.sha256((Path(model_dir) / "config.json").read_bytes())
    for p in sorted(Path(model_dir).glob("*.safetensors")):
        h.update(f"{p.name}:{p.stat().st_size}".encode())
    return "sha256:" + h.hexdigest()


def _run_config() -> Any:
    run_dir = os.environ.get("YETO_RUN_DIR")
    if not run_dir or not (Path(run_dir) / "config.json").is_file():
        return None
    from yeto_core.island_main import load_run_config

    return load_run_config(run_dir)


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


def _stop(proc: Optional[subprocess.Popen], bridge: Optional[Bridge], grace_s: float) -> None:
    if bridge is not None:
        try:
            bridge.close()
        except Exception:
            pass
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=grace_s)


class MilesBackend(TrainerBackend):
    """GRPO with Miles (Megatron) on the trainer island. Options: ``docs/miles.md``."""

    PLUGIN_NAME = "miles"

    def __init__(
        self,
        model_dir: str,
        *,
        miles_dir: str = "/root/miles",
        entry: str = "train.py",
        python: Optional[str] = None,
        miles_args: Sequence[str] = (),
        ref_load: Optional[str] = None,
        num_rollout: Optional[int] = None,
        group_size: Optional[int] = None,
        groups_per_round: Optional[int] = None,
        rollout_form: str = "function",
        routed_experts: bool = False,
        workdir: Optional[str] = None,
        bridge_url: Optional[str] = None,
        bridge_prefix: Optional[str] = None,
        start_timeout_s: float = 3600.0,
        round_timeout_s: float = 3600.0,
        poll_s: float = 0.2,
        seed: int = 0,
        env: Optional[dict[str, str]] = None,
    ) -> None:
        cfg = _run_config()
        if group_size is None and cfg is not None and cfg.samplers:
            group_size = cfg.samplers[0].group_size
        if groups_per_round is None and cfg is not None:
            groups_per_round = cfg.trainer.groups_per_round
        if num_rollout is None and cfg is not None and cfg.trainer.total_rounds:
            num_rollout = cfg.trainer.total_rounds
        missing = [
            n
            for n, v in (
                ("group_size", group_size),
                ("groups_per_round", groups_per_round),
                ("num_rollout", num_rollout),
            )
            if not v
        ]
        if missing:
            raise ConfigError(
                f"trainer.backend_options: {', '.join(missing)} not set and not found in the run "
                "config (num_rollout comes from trainer.total_rounds when that is > 0)"
            )
        self.model_dir = Path(model_dir)
        self.miles_dir = Path(miles_dir)
        self.entry = entry
        self.python = python or sys.executable
        self.miles_args = [str(a) for a in miles_args]
        self.ref_load = ref_load
        self.num_rollout = int(num_rollout)
        self.group_size = int(group_size)
        self.groups_per_round = int(groups_per_round)
        self.rollout_form = rollout_form
        self.routed_experts = bool(routed_experts)
        self.seed = int(seed)
        self.env = dict(env or {})
        self.start_timeout_s, self.round_timeout_s, self.poll_s = (
            float(start_timeout_s),
            float(round_timeout_s),
            float(poll_s),
        )
        problems = inventory.check_user_args(self.miles_args)
        if problems:
            raise ConfigError("trainer.backend_options.miles_args: " + "; ".join(problems))
        inc = os.environ.get("YETO_INCARNATION", "0")
        island = os.environ.get("YETO_ISLAND", "trainer")
        if workdir is None:
            run_dir = os.environ.get("YETO_RUN_DIR")
            workdir = (
                str(Path(run_dir) / "work" / f"{island}-i{inc}-miles")
                if run_dir
                else tempfile.mkdtemp(prefix="yeto-miles-")
            )
        self.workdir = Path(workdir)
        if bridge_url is None:
            bridge_url = os.environ.get("YETO_STORE") or str(self.workdir / "bridge")
        self.bridge_url = str(bridge_url)
        self.bridge_prefix = bridge_prefix or f"trainer/{inc}/miles"
        self.proc: Optional[subprocess.Popen] = None
        self.bridge: Optional[Bridge] = None
        self.next_id = 0
        self.last_saved: Optional[dict[str, Any]] = None
        self.restored: Optional[Path] = None
        self.restored_state: Optional[dict[str, Any]] = None
        self._finalizer: Optional[weakref.finalize] = None

    # -- the command ----------------------------------------------------------------------

    @property
    def save_dir(self) -> Path:
        return self.workdir / "megatron"

    @property
    def hf_template(self) -> str:
        return str(self.workdir / "hf" / "{rollout_id}")

    def custom_config(self) -> dict[str, Any]:
        return {
            "yeto_bridge_url": self.bridge_url,
            "yeto_bridge_prefix": self.bridge_prefix,
            "yeto_parent": f"{socket.gethostname()}:{os.getpid()}",
            "yeto_wait_s": self.round_timeout_s * 24,
            "yeto_poll_s": self.poll_s,
        }

    def command(self, load_dir: Optional[Path] = None) -> list[str]:
        """The exact Miles command line of this incarnation (``--dry-run`` prints it)."""
        return inventory.miles_command(
            python=self.python,
            entry=self.entry,
            model_dir=str(self.model_dir.absolute()),
            load_dir=str(load_dir if load_dir is not None else self.save_dir),
            save_dir=str(self.save_dir),
            hf_template=self.hf_template,
            num_rollout=self.num_rollout,
            groups_per_round=self.groups_per_round,
            group_size=self.group_size,
            custom_config=str(self.workdir / "yeto_custom_config.yaml"),
            seed=self.seed,
            ref_load=self.ref_load,
            routed_experts=self.routed_experts,
            rollout_form=self.rollout_form,
            miles_args=self.miles_args,
        )

    # -- the Miles process ----------------------------------------------------------------

    def _alive(self) -> Optional[str]:
        if self.proc is None:
            return "Miles was not started"
        code = self.proc.poll()
        if code is None:
            return None
        return f"Miles exited with code {code}; last lines of {self.log_path}:\n{self.log_tail()}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "miles.log"

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def _launch(self, load_dir: Optional[Path]) -> None:
        from yeto_core.plugins import get_plugins

        self.close()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.bridge = Bridge(get_plugins().open_store(self.bridge_url), self.bridge_prefix)
        for key in list(self.bridge.store.list(self.bridge_prefix + "/")):
            self.bridge.store.delete(key)  # a fresh channel per Miles process
        (self.workdir / "yeto_custom_config.yaml").write_text(
            inventory.custom_config_text(self.custom_config())
        )
        cmd = self.command(load_dir)
        (self.workdir / "miles_command.json").write_text(json.dumps(cmd, indent=1) + "\n")
        log = open(self.log_path, "ab")
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
        finally:
            log.close()
        self._finalizer = weakref.finalize(self, _stop, self.proc, self.bridge, 30.0)

    def close(self) -> None:
        """Stop the Miles process (and tell its rollout function to stop waiting)."""
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        self.proc = None

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
            cut = Path(cut_dir)
            state = self._read_state(cut)
            self.restored, self.restored_state = cut, state
            if not state["from_base"]:
                load_dir = cut
                self.next_id = int(state["rollout_id"]) + 1
        if load_dir is None:
            shutil.rmtree(self.save_dir, ignore_errors=True)  # Miles starts from --hf-checkpoint
        self._launch(load_dir)
        assert self.bridge is not None
        bridge = self.bridge

        def first_request() -> Optional[int]:
            ids = bridge.requests()
            return ids[0] if ids else None

        got = bridge.wait(
            first_request,
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
        if not path.is_file():
            raise CutError(f"{cut} has no {STATE_FILE}; it is not a cut of the miles backend")
        state = json.loads(path.read_text())
        if state.get("format") != CUT_FORMAT:
            raise CutError(f"{path}: cut format {state.get('format')!r}, this backend reads 1")
        for key in ("group_size", "groups_per_round"):
            if state.get(key) != getattr(self, key):
                raise CutError(
                    f"{path}: the cut was taken with {key}={state.get(key)!r}, this trainer has "
                    f"{getattr(self, key)!r}; restore with the same setting"
                )
        if state.get("base_fingerprint") != base_fingerprint(self.model_dir):
            raise CutError(
                f"{path}: the cut was trained from another base than {self.model_dir} "
                "(config.json or weight files differ)"
            )
        if not state["from_base"]:
            tracker = (cut / TRACKER).read_text().strip() if (cut / TRACKER).is_file() else None
            if tracker != str(state["rollout_id"]) or not (cut / iter_name(tracker)).is_dir():
                raise CutError(
                    f"{cut}: {TRACKER} says {tracker!r} but the cut holds rollout "
                    f"{state['rollout_id']} ({iter_name(state['rollout_id'])}/ expected)"
                )
        return state

    def train_round(self, batch: Any) -> dict[str, float]:
        """Hand the round to Miles; return once Miles trained and saved it."""
        if self.bridge is None or self.proc is None:
            raise RuntimeError("train_round before restore(); call restore(None) first")
        r = self.next_id
        t0 = time.monotonic()
        self.bridge.put_batch(r, batch)
        bridge = self.bridge
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
        self.last_saved = saved
        self.next_id = r + 1
        return {
            "miles_rollout_id": float(r),
            "miles_round_s": time.monotonic() - t0,
            "padded_samples": float(len(batch.padding)),
        }

    def publish_release(self, out_dir: Path) -> dict[str, Any]:
        """The release of the last trained round's HF export (the base before the first)."""
        if self.last_saved is not None:
            src = Path(
                self.last_saved.get("hf_dir")
                or self.hf_template.format(rollout_id=self.last_saved["rollout_id"])
            )
        elif self.restored is not None and (self.restored / "hf").is_dir():
            src = self.restored / "hf"
        else:
            src = self.model_dir
        info = publish_from_export(src, self.model_dir, Path(out_dir))
        if self.last_saved is not None:
            info["miles_rollout_id"] = int(self.last_saved["rollout_id"])
        return info

    def save_cut(self, out_dir: Path, trigger: Trigger) -> None:
        """Megatron's iter_* of the last round, its HF export, and yeto_miles.json."""
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
        }
        if self.last_saved is None:
            prev = self.restored_state
            if prev is None or prev["from_base"]:
                state.update(from_base=True, rollout_id=-1, trained_rounds=0)
            else:  # no round since the restore: the restored checkpoint again
                assert self.restored is not None
                r = int(prev["rollout_id"])
                _link_tree(self.restored / iter_name(r), out / iter_name(r))
                if (self.restored / "hf").is_dir():
                    _link_tree(self.restored / "hf", out / "hf")
                (out / TRACKER).write_text(f"{r}\n")
                state.update(from_base=False, rollout_id=r, trained_rounds=r + 1)
        else:
            r = int(self.last_saved["rollout_id"])
            ckpt = Path(self.last_saved["checkpoint_dir"])
            tracker = self.save_dir / TRACKER
            said = tracker.read_text().strip() if tracker.is_file() else None
            if said != str(r) or not ckpt.is_dir():
                raise CutError(
                    f"Megatron's {tracker} says {said!r} but round {r} was saved to {ckpt}; "
                    "the checkpoint is not complete (is --async-save on?)"
                )
            _link_tree(ckpt, out / iter_name(r))
            hf = Path(self.last_saved.get("hf_dir") or self.hf_template.format(rollout_id=r))
            if hf.is_dir():
                _link_tree(hf, out / "hf")
            (out / TRACKER).write_text(f"{r}\n")
            state.update(from_base=False, rollout_id=r, trained_rounds=r + 1)
        (out / STATE_FILE).write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")


__all__ = ["MilesBackend", "base_fingerprint", "iter_name"]
