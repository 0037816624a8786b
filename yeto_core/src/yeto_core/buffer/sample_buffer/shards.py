"""Layout ``shards``: each host appends to its own ``shards/<host>/index.jsonl``; the head
merges them into ``index.jsonl``.

In each merge pass the head reads the complete new records of every shard,
orders them round-robin by their rank within the pass and then by host name,
assigns the next global positions and appends them in one write. Merged records
carry ``host`` and ``seq``, so a restarted head resumes each shard after the last
sequence number it merged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from yeto_core.buffer.sample_buffer.codec import encode_record
from yeto_core.buffer.sample_buffer.jsonl_index import JsonlIndex


def merge_shards(
    merged: JsonlIndex,
    shards_dir: Path,
    shard_readers: dict[str, JsonlIndex],
    merged_seq: dict[str, int],
) -> list[dict[str, Any]]:
    """One merge pass of the per-host shards into ``merged`` (see the module docstring).

    :returns: the records ``merged`` gained (read from other mergers, then written here).
    """
    with merged._lock():
        new = merged.read_new()
        merged._repair_tail()
        for rec in new:
            h = rec["host"]
            merged_seq[h] = max(merged_seq.get(h, 0), rec["seq"] + 1)
        hosts = []
        if shards_dir.is_dir():
            hosts = sorted(p.name for p in shards_dir.iterdir() if p.is_dir())
        batches: dict[str, list[dict[str, Any]]] = {}
        for h in hosts:
            reader = shard_readers.get(h)
            if reader is None:
                reader = JsonlIndex(shards_dir / h / "index.jsonl", fsync=merged.fsync)
                shard_readers[h] = reader
            done = merged_seq.get(h, 0)
            batches[h] = [r for r in reader.read_new() if r["position"] >= done]
        order = sorted(((rank, h) for h, recs in batches.items() for rank in range(len(recs))))
        lines = []
        for rank, h in order:
            rec = dict(batches[h][rank])
            rec["seq"] = rec["position"]
            rec["position"] = merged.count + len(lines)
            lines.append(rec)
            merged_seq[h] = rec["seq"] + 1
        if lines:
            merged.write_locked(b"".join(encode_record(r) for r in lines))
            for rec in lines:
                merged.ids.setdefault(rec["group_id"], rec["position"])
            merged.count += len(lines)
    return new + lines
