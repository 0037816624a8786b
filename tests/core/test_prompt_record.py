"""A prompt is a record: text or chat messages, the answer, the row id and its metadata.

Legacy ``(text, answer)`` tasks keep working through the loop; the buffer records each
group's row id and epoch in the payload (absent from payloads written before: "" / 0).
"""

from __future__ import annotations

import attrs
import pytest

from yeto_core.buffer.group_codec import decode_group, encode_group
from yeto_core.errors import ConfigError
from yeto_core.ports import Task
from yeto_core.ports.sampler import encode_prompt, prompt_record, score_prompt
from yeto_core.records import Prompt
from yeto_core.testing.fake_backend import MemoryBuffer
from yeto_core.testing.fakes import DigitsTask, WeightFileEngine, digits_sampler
from yeto_core.testing.groups import build_group


def test_a_prompt_has_exactly_one_of_text_and_messages():
    with pytest.raises(ValueError, match="exactly one"):
        Prompt()
    with pytest.raises(ValueError, match="exactly one"):
        Prompt(text="a", messages=[{"role": "user", "content": "a"}])
    with pytest.raises(ValueError, match="'role'"):
        Prompt(messages=[{"content": "a"}])
    with pytest.raises(ValueError, match="at least one message"):
        Prompt(messages=[])
    p = Prompt(messages=[{"role": "user", "content": "hi"}], answer="x", metadata={"k": 1})
    assert p.messages == ({"role": "user", "content": "hi"},) and p.metadata == {"k": 1}


def test_a_legacy_pair_becomes_a_prompt_and_a_bad_value_is_named():
    assert Prompt.of(("3+4=", "7")) == Prompt(text="3+4=", answer="7")
    with pytest.raises(TypeError, match="Prompt or a \\(text, answer\\) pair"):
        Prompt.of("3+4=")


def test_task_defaults_call_prompt_and_reward_and_duck_typed_tasks_work():
    task = DigitsTask()
    assert prompt_record(task, 5) == Prompt(text="p5", answer="1")
    assert score_prompt(task, Prompt(text="p5", answer="1"), "1") == 1.0

    class Duck:  # not a Task subclass: prompt/reward only
        def prompt(self, i):
            return f"q{i}", "a"

        def reward(self, answer, completion):
            return float(answer == completion)

    assert prompt_record(Duck(), 2, 3) == Prompt(text="q2", answer="a")
    assert score_prompt(Duck(), Prompt(text="q", answer="a"), "a") == 1.0
    assert Task.rows == 0 and Task.epochs is None  # unbounded unless a task says so


def test_an_engine_without_a_chat_template_refuses_messages_naming_itself():
    engine = WeightFileEngine()
    assert encode_prompt(engine, Prompt(text="ab")) == engine.encode("ab")
    with pytest.raises(ConfigError, match="'weight-file' engine cannot apply a chat template"):
        encode_prompt(engine, Prompt(messages=[{"role": "user", "content": "a"}], row_id="7"))


def test_the_group_payload_records_row_id_and_epoch_and_old_payloads_read_as_none():
    group = build_group("g1")
    old = encode_group(group)  # a group without a row id: the bytes it always had
    assert "row_id" not in old[:400].decode(errors="replace")
    back = decode_group(old)
    assert (back.row_id, back.epoch) == ("", 0)
    tagged = attrs.evolve(group, row_id="line-12", epoch=3)
    back = decode_group(encode_group(tagged))
    assert (back.row_id, back.epoch) == ("line-12", 3)
    assert encode_group(tagged) == encode_group(tagged)  # still a function of the group


def test_the_loop_records_each_groups_row_id():
    buf = MemoryBuffer()
    loop = digits_sampler(buf)
    loop.run_round()
    assert [g.row_id for g in buf.groups] == [str(loop.offset + k) for k in range(4)]

    class RowTask(DigitsTask):
        def prompt(self, index):
            return Prompt(text=f"p{index}", answer=str(index % 4), row_id=f"row-{index % 2}")

    buf = MemoryBuffer()
    loop = digits_sampler(buf)
    loop.task = RowTask()
    loop.run_round()
    assert {g.row_id for g in buf.groups} == {"row-0", "row-1"}
