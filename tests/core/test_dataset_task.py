"""The built-in ``dataset`` task: rows from a JSONL file, checked when it is built (a bad
row is a preflight failure naming file:line), seeded shuffles stable across restarts,
and each epoch through the store dispenser hands every row exactly once, a small
dataset's wrap included (two positions of one row in one round never share a key)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomllib

from yeto_core.buffer.dispenser import StoreDispenser
from yeto_core.config.load import parse_config
from yeto_core.config.preflight import Report, check_task
from yeto_core.errors import ConfigError
from yeto_core.plugins import Plugins
from yeto_core.records import Prompt
from yeto_core.sampler.loop import SamplerLoop
from yeto_core.stores.dir_store import DirStore
from yeto_core.tasks.dataset import DatasetTask
from yeto_core.testing.fake_backend import MemoryBuffer
from yeto_core.testing.fakes import WeightFileEngine


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def qa(n: int) -> list[dict]:
    return [{"prompt": f"q{i}", "answer": str(i)} for i in range(n)]


def test_rows_become_prompts_with_row_ids_answers_and_metadata(tmp_path):
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [
            {"prompt": "2+2=", "answer": 4, "level": "easy"},
            "",
            {"messages": [{"role": "user", "content": "hi"}], "answer": "yo"},
        ],
    )
    task = DatasetTask(path=str(path))
    assert (task.rows, task.epochs) == (2, 1)
    assert task.prompt_at(0) == Prompt(
        text="2+2=",
        answer="4",
        row_id="1",
        metadata={"prompt": "2+2=", "answer": 4, "level": "easy"},
    )
    chat = task.prompt_at(1)
    assert chat.messages == ({"role": "user", "content": "hi"},) and chat.row_id == "3"
    assert task.score(task.prompt_at(0), " 4\n") == 1.0
    assert task.score(task.prompt_at(0), "5") == 0.0


def test_system_prompt_and_id_field(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"id": "a7", "q": "x", "a": "y"}])
    task = DatasetTask(
        path=str(path), prompt_field="q", answer_field="a", id_field="id", system_prompt="Be brief."
    )
    p = task.prompt_at(0)
    assert p.row_id == "a7" and p.answer == "y" and p.text is None
    assert p.messages == (
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "x"},
    )


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ('{"prompt": "a", "answer": ', "not valid JSON"),
        ("[1, 2]", "a row is a JSON object, not list"),
        ('{"answer": "1"}', 'no "prompt" (a string) or "messages"'),
        ('{"prompt": "a"}', 'no "answer"'),
        ('{"messages": [{"content": "x"}], "answer": "1"}', 'has no string "role"'),
        ('{"messages": [], "answer": "1"}', "not a non-empty list"),
    ],
)
def test_an_unreadable_row_is_refused_naming_file_line_and_the_fix(tmp_path, line, says):
    path = write_jsonl(tmp_path / "d.jsonl", [*qa(2), line])
    with pytest.raises(ConfigError) as err:
        DatasetTask(path=str(path))
    assert f"{path}:3: " in str(err.value) and says in str(err.value)


def test_many_bad_rows_are_listed_then_counted_and_ids_must_be_unique(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ["{"] * 8)
    with pytest.raises(ConfigError, match=r"(?s)8 unreadable row\(s\).*and 3 more"):
        DatasetTask(path=str(path))
    path = write_jsonl(tmp_path / "e.jsonl", [{"id": 1, "prompt": "a", "answer": "b"}] * 2)
    with pytest.raises(ConfigError, match="e.jsonl:2: id '1' is also the id of line 1"):
        DatasetTask(path=str(path), id_field="id")


def test_bad_options_are_named(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", qa(1))
    with pytest.raises(ConfigError, match="does not exist"):
        DatasetTask(path=str(tmp_path / "missing.jsonl"))
    with pytest.raises(ConfigError, match="needs options.path"):
        DatasetTask()
    with pytest.raises(ConfigError, match='"unbounded"'):
        DatasetTask(path=str(path), epochs=0)
    with pytest.raises(TypeError, match="unknown options \\['colour'\\]"):
        DatasetTask(path=str(path), colour=1)
    assert DatasetTask(path=str(path), epochs="unbounded").epochs is None


def test_a_shuffle_is_a_seeded_permutation_per_epoch_the_same_after_a_restart(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", qa(50))
    a, b = (
        DatasetTask(path=str(path), shuffle=True, seed=3),
        DatasetTask(path=str(path), shuffle=True, seed=3),
    )
    for epoch in range(3):
        assert sorted(a.order(epoch)) == list(range(50))
        assert [a.prompt_at(r, epoch).row_id for r in range(50)] == [
            b.prompt_at(r, epoch).row_id for r in range(50)
        ]
    assert a.order(0) != a.order(1)
    assert DatasetTask(path=str(path)).order(1) == list(range(50))


def _config(tmp_path, path, dispenser):
    text = f"""
run_dir = "{tmp_path / "run"}"
store = "{tmp_path / "store"}"
[model]
path = "{tmp_path / "m"}"
[task]
name = "dataset"
options = {{ path = "{path}", epochs = 2 }}
[[samplers]]
engine = "hf"
[trainer]
backend = "torch"
{dispenser}
"""
    return parse_config(tomllib.loads(text), source="t.toml")


@pytest.mark.parametrize(
    ("dispenser", "fails", "says"),
    [
        ('[dispenser]\nkind = "store"', False, "3 rows, 2 epoch(s)"),
        ("", True, 'set [dispenser] kind = "store"'),
        ('[dispenser]\nkind = "store"\nrows = 5', True, "task 'dataset' has 3 rows"),
    ],
)
def test_preflight_builds_the_task_and_asks_for_the_store_dispenser(
    tmp_path, dispenser, fails, says
):
    path = write_jsonl(tmp_path / "d.jsonl", qa(3))
    report = Report()
    check_task(_config(tmp_path, path, dispenser), DatasetTask, report)
    assert [c.detail for c in (report.failures() if fails else report.checks)][-1].count(says) == 1


def test_preflight_refuses_a_bad_row_naming_the_line(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [*qa(3), "nope"])
    report = Report()
    check_task(_config(tmp_path, path, '[dispenser]\nkind = "store"'), DatasetTask, report)
    (failure,) = report.failures()
    assert failure.name == "task.options" and f"{path}:4: not valid JSON" in failure.detail


def test_the_dataset_task_is_built_in():
    assert Plugins(entry_points=False).task("dataset") is DatasetTask


def _loop(store, buf, task, island="s", inc=0, per_call=8, range_size=8):
    disp = StoreDispenser(
        store,
        island=island,
        incarnation=inc,
        range_size=range_size,
        rows=task.rows,
        limit=task.rows * task.epochs,
        rescan_s=0.0,
    )
    loop = SamplerLoop(
        buf,
        WeightFileEngine(),
        task,
        host=island,
        incarnation=inc,
        task_name="dataset",
        group_size=2,
        prompts_per_call=per_call,
        dispenser=disp,
    )
    return loop, disp


def test_a_small_datasets_wrap_in_one_round_never_collides_and_the_end_is_marked(tmp_path):
    """3 rows, 4 epochs, 8 prompts a call: one call holds a row two or three times."""
    task = DatasetTask(path=str(write_jsonl(tmp_path / "d.jsonl", qa(3))), shuffle=True, epochs=4)
    buf, store = MemoryBuffer(), DirStore(tmp_path / "s")
    loop, disp = _loop(store, buf, task)
    first = loop.run_round()
    assert len(first) == 8 and len({g.row_id for g in buf.groups[:8]}) == 3
    while not loop.data_end_marked:
        loop.run_round()
    ids = [g.group_id for g in buf.groups]
    pids = [g.prompt_id for g in buf.groups]
    assert len(ids) == len(set(ids)) == 12 and len(set(pids)) == 12
    assert sorted((g.epoch, g.row_id) for g in buf.groups) == sorted(
        (e, str(r)) for e in range(4) for r in (1, 2, 3)
    )
    assert buf.data_ended()
    assert disp.take(8) == [] and loop.run_round() == []  # nothing more after the end
    assert len(buf.groups) == 12
