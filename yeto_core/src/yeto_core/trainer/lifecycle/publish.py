"""Publishing the driver's releases: :class:`DriverPublishing`, a mixin of
:class:`~yeto_core.trainer.lifecycle.driver.DriverLifecycle`.

After every trained round (every ``publish_every``-th, and the last of each ``train``
call, with ``publish_every`` > 1; and at start) the backend exports a release, which
is fingerprinted and committed to the :class:`~yeto_core.release.store.ReleaseStore`,
in this thread or (``overlap_uploads``) on a background upload thread; with
``overlap_commits`` it becomes visible only after the commit of the round it was
trained on (:mod:`~yeto_core.trainer.lifecycle.pipeline`).
"""

from __future__ import annotations

import functools
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from yeto_core.records import ReleaseInfo
from yeto_core.sampler import fingerprint
from yeto_core.stage_profile import stage


class DriverPublishing:
    """Export, fingerprint and upload of a release (the host holds the backend, the
    release store, the counters, the scratch dir and the upload thread)."""

    def _publish(self, *, overlap: bool = False) -> None:
        """Export this round's release and commit it to the release store.

        ``overlap``: the upload (files, manifest, pointer) runs on a background thread
        while the next round is read and trained; the fingerprint, which needs the
        weights, stays here, and so does the export unless the backend offers a
        :meth:`~yeto_core.ports.TrainerBackend.release_writer` (a copy of the weights
        taken here, written to files on that thread). At most one upload is pending;
        every wait point (the next publication, the end of :meth:`train`, :meth:`drain`)
        waits for it and raises its error, so when ``train`` returns its newest round is
        published (every round with ``publish_every = 1``), as without overlap.
        """
        self._released_version = self.counters.policy_version
        if self.releases is None:
            return
        assert self.backend is not None
        self._wait_upload()
        out = self._scratch(f"release-{self.counters.policy_version}")
        writer = None
        if overlap:
            with stage("trainer.publish.snapshot"):
                writer = self.backend.release_writer()
        written: dict[str, Any] = {}
        if writer is None:
            with stage("trainer.publish.export"):
                written = ReleaseInfo.coerce(self.backend.publish_release(out)).as_dict()
        driver: dict[str, Any] = {
            "version": self.counters.policy_version,
            "buffer_watermark": self.counters.buffer_watermark,
        }
        if fingerprint.INFO_KEY not in written:
            # scored under the weights of this moment (the next round changes them)
            with stage("trainer.publish.fingerprint"):
                recorded = fingerprint.for_backend(self.backend)
            if recorded is not None:
                driver[fingerprint.INFO_KEY] = recorded.to_json()
        info = driver if writer is not None else _with_driver_keys(written, driver)
        if overlap:
            # visible only after the commit of its round (pipeline, overlap_commits)
            ready = self._release_ready()
            self._submit_upload(functools.partial(self._upload, out, info, writer, ready))
        else:
            self._upload(out, info)

    def _submit_upload(self, job: Callable[[], None]) -> None:
        """Run ``job`` (an upload) on the upload thread: the pending upload from now on."""
        if self._uploader is None:
            from concurrent.futures import ThreadPoolExecutor

            self._uploader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="upload")
        self._upload_pending = self._uploader.submit(job)

    def _upload(
        self,
        out: Path,
        info: dict[str, Any],
        writer: Any = None,
        ready: Optional[Callable[[], None]] = None,
    ) -> None:
        """Commit the release in ``out`` (first written there by ``writer``, the backend's
        :meth:`~yeto_core.ports.TrainerBackend.release_writer`, when given; visible once
        ``ready`` returned)."""
        assert self.releases is not None
        if writer is not None:  # ``info`` holds the driver's keys only
            with stage("trainer.publish.export"):
                written = ReleaseInfo.coerce(writer(out)).as_dict()
            info = _with_driver_keys(written, info)
        with stage("trainer.publish.upload"):
            rel = self.releases.publish(out, info, handoff=True, ready=ready)  # out is removed next
        shutil.rmtree(out, ignore_errors=True)
        self._event(
            "trainer_published",
            release_id=rel.release_id,
            version=rel.version,
            **self.releases.last_publish,
        )

    def _wait_upload(self) -> None:
        """Wait for the pending background upload (raises its error)."""
        pending, self._upload_pending = self._upload_pending, None
        if pending is not None:
            with stage("trainer.publish.wait_upload"):
                pending.result()


def _with_driver_keys(written: dict[str, Any], driver: dict[str, Any]) -> dict[str, Any]:
    """The backend's release info plus the driver's keys: its ``version`` always, its
    ``buffer_watermark`` and recorded fingerprint where the backend set none of its own."""
    out = dict(written)
    out["version"] = driver["version"]
    for key in ("buffer_watermark", fingerprint.INFO_KEY):
        if key in driver:
            out.setdefault(key, driver[key])
    return out
