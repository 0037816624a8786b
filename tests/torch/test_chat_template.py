"""The hf engine encodes a chat prompt exactly as transformers' apply_chat_template does."""

from __future__ import annotations

import numpy as np
import pytest
from transformers import AutoTokenizer

from yeto_core.errors import ConfigError
from yeto_core.ports.sampler import encode_prompt
from yeto_core.records import Prompt, SamplingParams
from yeto_core.sampler.loop import SamplerLoop
from yeto_core.testing.fake_backend import MemoryBuffer
from yeto_torch import model as tiny
from yeto_torch.engine import HFEngine

#: a chat template over the tiny character vocabulary: "<bos>" then each message's
#: content followed by "=", and ":" as the generation prompt
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['content'] }}={% endfor %}"
    "{% if add_generation_prompt %}:{% endif %}"
)

MESSAGES = [
    {"role": "system", "content": "9"},
    {"role": "user", "content": "3+4"},
]


def _base(path, template):
    tok = tiny.build_tokenizer()
    if template:
        tok.chat_template = template
    tiny.build_model(tiny.build_config(), seed=0).save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def chat_base(tmp_path_factory):
    return _base(tmp_path_factory.mktemp("chat"), TEMPLATE)


def test_hf_engine_applies_the_chat_template_as_transformers_does(chat_base):
    engine = HFEngine(model_dir=str(chat_base), seed=0)
    want = AutoTokenizer.from_pretrained(str(chat_base), local_files_only=True).apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=True
    )["input_ids"]
    got = encode_prompt(engine, Prompt(messages=MESSAGES, answer="7"))
    assert got == list(want)
    assert engine.decode(got) == "9=3+4=:"  # the generation prompt ends it
    # a text prompt is encoded as is (no template)
    assert encode_prompt(engine, Prompt(text="3+4=")) == engine.encode("3+4=")


def test_a_chat_prompt_through_the_loop_lands_with_the_template_ids(chat_base):
    class ChatTask:
        PLUGIN_NAME = "chat"

        def prompt(self, index):
            return Prompt(messages=MESSAGES, answer="7", row_id=f"r{index}")

        def reward(self, answer, completion):
            return 1.0

    engine = HFEngine(model_dir=str(chat_base), seed=0)
    buf = MemoryBuffer()
    loop = SamplerLoop(
        buf,
        engine,
        ChatTask(),
        host="s",
        incarnation=0,
        group_size=2,
        prompts_per_call=1,
        sampling=SamplingParams(max_new_tokens=2),
    )
    loop.run_round()
    (group,) = buf.groups
    want = engine.encode_messages(MESSAGES)
    for s in group.samples:
        assert s.prompt_len == len(want)
        assert np.asarray(s.tokens[: s.prompt_len]).tolist() == want
    assert group.row_id.startswith("r")


def test_a_base_without_a_chat_template_is_refused_naming_it(tmp_path):
    engine = HFEngine(model_dir=str(_base(tmp_path / "plain", None)), seed=0)
    with pytest.raises(ConfigError, match="no chat_template"):
        encode_prompt(engine, Prompt(messages=MESSAGES))
