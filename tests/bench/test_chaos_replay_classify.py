"""The chaos bench tells a replay the bench itself made impossible from a replay mismatch."""

from __future__ import annotations

from yeto_bench.chaos import _replay_refused_bench_damage

REFUSAL = (
    "yeto: error: ledger round 28 trained position 118, whose buffer index record was "
    "damaged after it was trained (it fails its checksum and is quarantined); the round "
    "cannot be rebuilt: restore that record from a copy"
)


def test_a_refused_replay_of_a_record_the_bench_flipped_after_training_is_not_a_mismatch():
    assert _replay_refused_bench_damage(REFUSAL, {118})


def test_any_other_refusal_stays_a_mismatch():
    assert not _replay_refused_bench_damage(REFUSAL, {117})  # not a record the bench damaged
    assert not _replay_refused_bench_damage("yeto: error: the replay diverged", {118})
