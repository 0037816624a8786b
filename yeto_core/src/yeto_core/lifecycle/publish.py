"""Publishing the driver's releases: :class:`DriverPublishing`, a mixin of
:class:`~yeto_core.lifecycle.driver.DriverLifecycle`.

After every trained round (and at start) the backend exports a release, which
is fingerprinted and committed to the :class:`~yeto_core.release.ReleaseStore`,
in this thread or (``overlap_uploads``) on a background upload thread.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from yeto_core import fingerprint
from yeto_core.records import ReleaseInfo
from yeto_core.stage_profile import stage


class DriverPublishing:
    """Export, fingerprint and upload of a release (the host holds the backend, the
    release store, the counters, the scratch dir and the upload thread)."""

    def _publish(self, *, overlap: bool = False) -> None:
        """Export this round's release and commit it to the release store.

        ``overlap``: the upload (files, manifest, pointer) runs on a background thread
        while the next round is read and trained; the export and the fingerprint, which
        need the weights, stay here. At most one upload is pending; every wait point
        (the next publication, the end of :meth:`train`, :meth:`drain`) waits for it and
        raises its error, so when ``train`` returns every trained round is published, as
        without overlap.
        """
        if self.releases is None:
            return
        assert self.backend is not None
        self._wait_upload()
        out = self._scratch(f"release-{self.counters.policy_version}")
        with stage("trainer.publish.export"):
            info = ReleaseInfo.coerce(self.backend.publish_release(out)).as_dict()
        if fingerprint.INFO_KEY not in info:
            with stage("trainer.publish.fingerprint"):
                recorded = fingerprint.for_backend(self.backend)
            if recorded is not None:
                info[fingerprint.INFO_KEY] = recorded.to_json()
        info["version"] = self.counters.policy_version
        info.setdefault("buffer_watermark", self.counters.buffer_watermark)
        if overlap:
            if self._uploader is None:
                from concurrent.futures import ThreadPoolExecutor

                self._uploader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="upload")
            self._upload_pending = self._uploader.submit(self._upload, out, info)
        else:
            self._upload(out, info)

    def _upload(self, out: Path, info: dict[str, Any]) -> None:
        assert self.releases is not None
        with stage("trainer.publish.upload"):
            rel = self.releases.publish(out, info)
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
