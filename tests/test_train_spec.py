"""The %%cortex train YAML spec and its data: every problem is one line naming the key or row."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from cortex_nb.train_data import load_examples
from cortex_nb.train_spec import SpecError, accepted_keys, parse_train_spec


def test_a_full_spec_parses_into_its_parts():
    spec = parse_train_spec(
        """
        base_model: small-gpt2
        lora: {r: 8, alpha: 16, dropout: 0.05, target_modules: [c_attn]}
        optimizer: {lr: 0.001, weight_decay: 0.01}
        data: train.jsonl
        batch_size: 4
        max_seq_len: 256
        epochs: 2
        eval: {every: 50, data: $held_out}
        sample: {every: 100, prompts: "Once upon a time", max_tokens: 20}
        save: {every: 200, type: weights-only}
        seed: 3
        """.replace("\n        ", "\n")
    )
    assert spec.base_model == "small-gpt2" and spec.lora["target_modules"] == ["c_attn"]
    assert spec.epochs == 2.0 and spec.steps is None
    assert spec.eval.every == 50 and spec.eval.data == "$held_out"
    assert spec.sample.prompts == ["Once upon a time"] and spec.sample.max_tokens == 20
    assert spec.save.every == 200 and spec.save.type == "weights-only"
    assert spec.seed == 3


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("data: a.jsonl\nsteps: 3\nstepz: 4\n", "unknown key stepz; allowed: base_model"),
        ("data: a.jsonl\nsteps: 3\nfoo: 1\nbar: 2\n", "unknown keys foo, bar"),
        (
            "data: a.jsonl\nsteps: 3\noptimizer: {learning_rate: 1}\n",
            "unknown key in optimizer optimizer.learning_rate",
        ),
        ("data: a.jsonl\nsteps: 0\n", "steps: must be >= 1, not 0"),
        ("data: a.jsonl\nsteps: 2.5\n", "steps: must be a whole number"),
        ("data: a.jsonl\nsteps: 2\nepochs: 1\n", "exactly one of steps"),
        ("steps: 2\n", "data: missing"),
        ("data: a.jsonl\nsteps: 2\neval: {every: 5}\n", "eval.data: missing"),
        (
            "data: a.jsonl\nsteps: 2\nsample: {every: 5, prompts: []}\n",
            "sample.prompts: must be a non-empty list",
        ),
        ("data: a.jsonl\nsteps: 2\noptimizer: {lr: 0}\n", "optimizer.lr: must be > 0"),
        (
            "data: a.jsonl\nsteps: 2\nsave: {every: 5, type: full}\n",
            "save.type: must be resumable or weights-only",
        ),
        ("- just\n- a list\n", "must be a YAML mapping"),
        ("", "the train spec is empty"),
        ("data: [a\n", "not valid YAML"),
    ],
)
def test_bad_specs_raise_one_line_naming_the_problem(text, message):
    with pytest.raises(SpecError) as caught:
        parse_train_spec(text)
    assert message in caught.value.message
    assert "\n" not in caught.value.message


def test_save_is_an_accepted_key():
    assert "save" in accepted_keys() and "steps" in accepted_keys()


def test_examples_from_jsonl_text_files_and_variables(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        json.dumps({"text": "plain"}) + "\n\n" + json.dumps({"prompt": "Q", "completion": "A"}) + "\n"
    )
    examples = load_examples(str(rows), {})
    assert [(e.prompt, e.text) for e in examples] == [(None, "plain"), ("Q", "A")]
    story = tmp_path / "story.txt"
    story.write_text("once\nupon\n")
    assert [e.text for e in load_examples(str(story), {})] == ["once\nupon\n"]
    frame = pd.DataFrame([{"prompt": "p", "completion": "c"}])
    assert load_examples("$frame", {"frame": frame})[0].prompt == "p"
    assert load_examples("$rows", {"rows": [{"text": "t"}, "bare string"]})[1].text == "bare string"
    with pytest.raises(SpecError, match=r"\$n is a int; give a list of dicts or a DataFrame"):
        load_examples("$n", {"n": 3})
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "ok"}\n{not json\n')
    with pytest.raises(SpecError, match="broken.jsonl line 2 is not valid JSON"):
        load_examples(str(broken), {})


def test_packing_is_a_boolean_and_unset_by_default():
    assert parse_train_spec("data: a.jsonl\nsteps: 1\n").packing is None
    assert parse_train_spec("data: a.jsonl\nsteps: 1\npacking: true\n").packing is True
    with pytest.raises(SpecError, match="packing: must be true or false, not 'yes please'"):
        parse_train_spec("data: a.jsonl\nsteps: 1\npacking: yes please\n")


def test_prompt_completion_examples_get_rows_of_their_own_unless_packed(client):
    """Packed pairs teach a model to answer from the pairs before it in the row; by default each pair
    stays alone in its row, while text keeps being packed into full rows."""
    from cortex_nb.train_data import Example, tokenize_and_pack

    pairs = [Example(f"{a}+{b}=", str(a + b)) for a in range(3) for b in range(3)]
    alone = tokenize_and_pack(client, "tiny", pairs, 32)
    assert len(alone.rows) == len(pairs)
    for (tokens, weights), pair in zip(alone.rows, pairs, strict=True):
        # BOS, the prompt (weight 0), the answer and EOS (weight 1): nothing of any other pair.
        assert tokens == client.tokenize("tiny", [pair.prompt])[0] + list(pair.text.encode()) + [257]
        assert weights == [0.0] * (1 + len(pair.prompt)) + [1.0] * (len(pair.text) + 1)
    packed = tokenize_and_pack(client, "tiny", pairs, 32, packing=True)
    assert len(packed.rows) == 2 and len(packed.rows[0][0]) == 33
    text = tokenize_and_pack(client, "tiny", [Example(None, "x" * 40), Example(None, "y" * 40)], 32)
    assert [len(tokens) for tokens, _ in text.rows] == [
        33,
        33,
        20,
    ]  # packed: 2 x (BOS + 40 + EOS) = 84 tokens, rows start every 32
    long_alone = tokenize_and_pack(
        client, "tiny", [Example(None, "x" * 40), Example(None, "y" * 40)], 32, packing=False
    )
    assert [len(tokens) for tokens, _ in long_alone.rows] == [33, 10, 33, 10]  # each cut on its own
