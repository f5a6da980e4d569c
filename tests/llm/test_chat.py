"""Episodes as conversations, on the real BPE tokenizer of SmolLM2-135M-Instruct (no weights are loaded): the ids
the rollout assembles turn by turn equal the chat template's rendering of the same conversation; a turn ends at
the template's end-of-turn token; self-reports parse from BPE completions."""

import pytest
import torch

from reflectrl.errors import ConfigError
from reflectrl.llm.batch import TokenBatch
from reflectrl.llm.chat import ChatFormat, chat_format
from reflectrl.llm.policy import Policy
from reflectrl.llm.rollout import Rollout
from reflectrl.tasks.base import Reply, chat_prompt, get_task
from reflectrl.tasks.selfreport import CHAT_QUESTIONS, parse_report, with_self_report

MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def tok():
    from reflectrl.llm.models import named_tokenizer

    return named_tokenizer(MODEL)


@pytest.fixture(scope="module")
def chat(tok):
    return ChatFormat(tok)


def template_ids(tok, messages):
    """The tokenizer's ids of the template's rendering, without the newline written after the last end-of-turn."""
    text = tok.apply_chat_template(messages, tokenize=False)
    assert text.endswith("<|im_end|>\n")
    return tok(text[:-1], add_special_tokens=False)["input_ids"]


def enc(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def test_the_format_learned_from_the_template(chat, tok):
    assert chat.end_text == "<|im_end|>" and chat.end_of_turn == tok.convert_tokens_to_ids("<|im_end|>")
    assert chat.reply_head == "\n<|im_start|>user\n" and chat.reply_tail == "<|im_end|>\n<|im_start|>assistant\n"
    assert chat.prompt_text("hi") == tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                                             add_generation_prompt=True)
    assert chat_format(tok, "off") is None and chat_format(tok, "auto") is not None


def test_a_multi_turn_episode_equals_the_templates_rendering(chat, tok):
    """Prompt, an agent turn closed by its end-of-turn, a query result, an answer cut at a stop sequence (not
    closed: the reply closes it), then the confidence question with its prefill and the report."""
    eot = [chat.end_of_turn]
    user, result = "Question: How many employees are there?", "rows: 1\nCOUNT(*)\n12"
    turn1, turn2, report = "<sql>SELECT COUNT(*) FROM employees</sql>", "<answer>SELECT COUNT(*) FROM employees</answer>", " 0.8"
    ask, prefill = CHAT_QUESTIONS["confidence"]
    ids = (chat.prompt_ids(user) + enc(tok, turn1) + eot + chat.reply_ids(result, closed=True)
           + enc(tok, turn2) + chat.reply_ids(ask, closed=False, prefill=prefill) + enc(tok, report) + eot)
    messages = [{"role": "user", "content": user}, {"role": "assistant", "content": turn1},
                {"role": "user", "content": result}, {"role": "assistant", "content": turn2},
                {"role": "user", "content": ask}, {"role": "assistant", "content": prefill + report}]
    assert ids == template_ids(tok, messages)


def test_bpe_merges_at_turn_boundaries(chat, tok):
    """A turn's ids are kept as sampled: where the text an agent turn opens with would merge with the template's
    newline before it, the template's own tokenization differs in those ids, never in the text."""
    user, turn = "What is 2 + 3?", "\n\n5"
    ours = chat.prompt_ids(user) + enc(tok, turn) + [chat.end_of_turn]
    theirs = template_ids(tok, [{"role": "user", "content": user}, {"role": "assistant", "content": turn}])
    assert ours != theirs  # "\n" + "\n\n" as two pieces, where the rendering holds "\n\n\n"
    assert tok.decode(ours) == tok.decode(theirs)
    # ordinary answers (words, digits, tags) start a fresh pre-token after the header's newline: no merge
    for turn in ("5", "The answer is 5.", "<answer>Paris</answer>", "```python\ndef f(x):\n    return x\n```"):
        ours = chat.prompt_ids(user) + enc(tok, turn) + [chat.end_of_turn]
        assert ours == template_ids(tok, [{"role": "user", "content": user}, {"role": "assistant", "content": turn}])


def test_self_reports_parse_from_bpe_completions(tok):
    def decoded(text):
        return tok.decode(enc(tok, text))

    assert parse_report("reflect", decoded("Yes.")) == 1.0 and parse_report("reflect", decoded("No, it is not.")) == 0.0
    assert parse_report("reflect", decoded("unsolved")) == 0.0
    assert parse_report("confidence", decoded(" 0.75")) == 0.75
    assert parse_report("confidence", decoded(" 80%")) == 0.8
    assert parse_report("confidence", decoded("<confidence>0.3</confidence>")) == 0.3
    assert parse_report("confidence", decoded(" 99.")) is None  # out of [0, 1] and not a percentage
    assert parse_report("confidence", decoded("I am sure")) is None


def test_inline_reports_parse_with_or_without_their_closing_tag(tok):
    """After the opened tag the report is the digits (or the word) the model wrote first, closed or cut short; what
    does not start with one is missing."""
    from reflectrl.tasks.selfreport import parse_inline

    def decoded(text):
        return tok.decode(enc(tok, text))

    assert parse_inline("confidence", decoded("95</confidence>")) == 0.95
    assert parse_inline("confidence", decoded("95</")) == 0.95 and parse_inline("confidence", decoded("7")) == 0.7
    assert parse_inline("confidence", decoded("05 or so")) == 0.05
    assert parse_inline("confidence", decoded(" high")) is None and parse_inline("confidence", None) is None
    assert parse_inline("reflect", decoded("solved</reflect>")) == 1.0
    assert parse_inline("reflect", decoded("unsolved</")) == 0.0
    assert parse_inline("reflect", decoded("solvedly")) is None and parse_inline("reflect", decoded("yes")) is None


class Scripted:
    """A generation engine that answers each call with the next scripted texts (encoded canonically) and the
    end-of-turn token; records the stop ids and the budgets it was given."""

    def __init__(self, tok, eot, turns):
        self.tok, self.eot, self.turns, self.calls, self.budgets = tok, eot, list(turns), [], []

    def generate(self, prompts, max_new_tokens, generator, greedy=False, stop_ids=()):
        self.calls.append((list(prompts), tuple(stop_ids)))
        self.budgets.append(list(max_new_tokens) if isinstance(max_new_tokens, (list, tuple)) else max_new_tokens)
        texts = self.turns.pop(0)
        out = []
        for text in texts[:len(prompts)]:
            ids = enc(self.tok, text)
            out.append(ids if text.endswith("</sql>") else ids + [self.eot])  # a stop sequence ends the first
        return out

    def sync(self, policy):
        pass


def tiny_chat_policy(tok):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=2048)
    return Policy(LlamaForCausalLM(cfg), tok, chat=ChatFormat(tok))


def test_a_rollout_assembles_the_conversation(tok):
    """The rollout on text2sql with a confidence question: its batch holds the template's rendering of the episode,
    agent tokens in the loss and the rest context."""
    policy = tiny_chat_policy(tok)
    task = with_self_report(get_task("text2sql", n_train_dbs=1, n_heldout_dbs=1, per_template=1), "confidence")
    problem = task.problems("train")[0]
    sql = f"<sql>{problem.meta['sql']}</sql>"
    answer = f"```sql\n{problem.meta['sql']}\n```"
    engine = Scripted(tok, policy.chat.end_of_turn, [[sql], [answer], [" 0.9"]])
    ro = Rollout(policy, engine, task, max_new_tokens=96, max_turns=task.max_turns, max_response_tokens=2000,
                 reward_workers=0)
    batch, _ = ro.run([problem], 1, torch.Generator().manual_seed(0))
    assert batch.correct.tolist() == [True] and batch.infos[0][-1]["confidence"] == 0.9
    row = _row_ids(batch)
    env = task.make_env()
    env.reset(problem)
    result = env.step(sql)[0]  # the database's reply to the query
    ask, prefill = CHAT_QUESTIONS["confidence"]
    messages = [{"role": "user", "content": chat_prompt(task, problem)}, {"role": "assistant", "content": sql},
                {"role": "user", "content": result.strip()}, {"role": "assistant", "content": answer},
                {"role": "user", "content": ask}, {"role": "assistant", "content": prefill + " 0.9"}]
    assert row == template_ids(tok, messages)
    trained = batch.response_ids[0][batch.completion_mask[0]].tolist()
    eot = [policy.chat.end_of_turn]
    assert trained == enc(tok, sql) + enc(tok, answer) + eot + enc(tok, " 0.9") + eot  # the sql turn: no eot sampled
    ro.close()


def test_generation_stops_at_the_end_of_turn(tok):
    """The sampler ends a row at the template's end-of-turn token: a model whose every next token is it answers
    with that token alone, whatever the budget."""
    from reflectrl.llm.engines import TorchSampler

    policy = tiny_chat_policy(tok)
    head = torch.nn.Linear(16, len(tok), bias=True)
    torch.nn.init.zeros_(head.weight)
    with torch.no_grad():
        head.bias.zero_()
        head.bias[policy.chat.end_of_turn] = 10.0
    policy.model.lm_head = head
    assert policy.chat.end_of_turn in policy.eos_ids
    prompts = [policy.encode_prompt("What is 2 + 3?")] * 2
    out = TorchSampler(policy).generate(prompts, 12, torch.Generator().manual_seed(0))
    assert out == [[policy.chat.end_of_turn]] * 2
    with torch.no_grad():
        head.bias[policy.chat.end_of_turn] = 0.0
        head.bias[tok.convert_tokens_to_ids("5")] = 10.0
    assert TorchSampler(policy).generate(prompts[:1], 4, torch.Generator(), greedy=True) == [[enc(tok, "5")[0]] * 4]


def _row_ids(batch: TokenBatch) -> list[int]:
    return (batch.prompt_ids[0][batch.prompt_mask[0]].tolist()
            + batch.response_ids[0][batch.response_attention[0]].tolist())


def test_every_task_has_a_chat_prompt_that_states_the_answer_format():
    for name, option in (("arith", {}), ("codegen", {}), ("text2sql", {"n_train_dbs": 1}), ("rag", {})):
        task = get_task(name, **option)
        text = chat_prompt(task, task.problems("train")[0])
        assert any(word in text for word in ("Reply with", "write <answer>", "reply with")), (name, text)
    arith = get_task("arith")
    p = next(p for p in arith.problems("train") if p.meta["ops"] == ["+"])
    a, b = p.meta["operands"]
    assert chat_prompt(arith, p) == f"What is {a} + {b}? Reply with only the number."
    assert arith.score(p, f"{a} + {b} = {a + b}") == 1.0 and arith.score(p, f"{a + b}") == 1.0


def test_reply_keeps_its_text_and_chat_form():
    import pickle

    r = Reply("\nconfidence (0-1)?\n", chat="How sure?", prefill="Confidence:")
    assert r == "\nconfidence (0-1)?\n" and r.chat == "How sure?" and r.prefill == "Confidence:"
    back = pickle.loads(pickle.dumps(r))
    assert back == r and back.chat == "How sure?" and back.prefill == "Confidence:"
    assert Reply("  rows: 1\n").chat == "rows: 1"


def test_warmup_demonstrations_are_conversations(tok):
    """A chat model's warm-up episode (text2sql, both turns, then the confidence question) is the template's
    rendering of that conversation, its agent turns trained and the rest context."""
    from reflectrl.llm.warmup import demonstration_rows

    policy = tiny_chat_policy(tok)
    task = get_task("text2sql", n_train_dbs=1, n_heldout_dbs=1, per_template=1)
    problem = task.problems("train")[0]
    (row,) = demonstration_rows(policy, task, [problem], self_report="confidence", multi_turn_share=1.0)
    ids = row.prompt_ids + [t for s in row.segments for t in s.ids]
    (query, result), (answer, _) = task.demonstration_turns(problem)
    ask, prefill = CHAT_QUESTIONS["confidence"]
    report = next(s for s in row.segments[::-1] if s.kind == "policy")
    said = tok.decode(report.ids[:-1])
    messages = [{"role": "user", "content": chat_prompt(task, problem)}, {"role": "assistant", "content": query},
                {"role": "user", "content": result.strip()}, {"role": "assistant", "content": answer},
                {"role": "user", "content": ask}, {"role": "assistant", "content": prefill + said}]
    assert ids == template_ids(tok, messages)
    assert parse_report("confidence", said) is not None
    assert [s.kind for s in row.segments] == ["policy", "env", "policy", "env", "policy"]


def _chat_model_dir(tok, folder):
    policy = tiny_chat_policy(tok)
    policy.model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _decodes_to_what_was_seen(tok, episode):
    """A logged episode's transcript is the decoding of its ids, turn by turn, and its trained tokens are its own."""
    ids = episode["prompt_ids"] + episode["response_ids"]
    texts = [text for _, text in episode["transcript"]]
    assert "".join(texts) == tok.decode(ids, skip_special_tokens=False)
    assert texts[0] == tok.decode(episode["prompt_ids"], skip_special_tokens=False)
    own = [t for t, m in zip(episode["response_ids"], episode["completion_mask"]) if m]
    said = "".join(text for kind, text in episode["transcript"] if kind == "policy")
    assert tok.decode(own, skip_special_tokens=False) == said
    ask, prefill = CHAT_QUESTIONS["confidence"]
    asked = [text for kind, text in episode["transcript"] if kind == "env"]
    assert asked and ask in asked[-1] and asked[-1].endswith(prefill) and "(0-1)" not in asked[-1]


def test_a_logged_chat_episode_is_what_the_engine_was_given(tok):
    """The rollout's record of a chat episode with a confidence question: the ids the engine was given for its last
    turn plus what it sampled are the logged ids, and the transcript is their decoding (the question in its chat
    wording with its prefill, not the raw prompt's question)."""
    from reflectrl.llm.rollout import logged_episode

    policy = tiny_chat_policy(tok)
    task = with_self_report(get_task("arith"), "confidence")
    problem = task.problems("train")[0]
    engine = Scripted(tok, policy.chat.end_of_turn, [["42"], [" 0.9"]])
    ro = Rollout(policy, engine, task, max_new_tokens=8, max_turns=2, max_response_tokens=200, reward_workers=0)
    batch, _ = ro.run([problem], 1, torch.Generator().manual_seed(0))
    episode = logged_episode(tok, True, batch.to_records()[0], batch.transcripts[0])
    _decodes_to_what_was_seen(tok, episode)
    given = engine.calls[-1][0][0]  # the context of the report turn, as the engine received it
    assert episode["prompt_ids"] + episode["response_ids"] == list(given) + enc(tok, " 0.9") + [policy.chat.end_of_turn]
    ro.close()


def test_samples_and_eval_transcripts_log_what_the_model_saw(tok, tmp_path):
    """samples.jsonl of a chat model's rlcr run and ``llm eval --transcripts`` hold strict JSON episodes whose
    transcripts decode from their ids, the chat question and prefill included."""
    import json

    from reflectrl.algos import config_for_algo, get_algo
    from reflectrl.cli import main

    model = _chat_model_dir(tok, tmp_path / "m")
    cfg = config_for_algo("rlcr", task="arith", model=str(model), run_dir=str(tmp_path / "run"), updates=1,
                          prompts_per_update=2, group_size=2, max_new_tokens=3, progress=False, tensorboard=False,
                          threads=1, reward_workers=0, sample_interval=1, export_model=False)
    get_algo("llm", "rlcr").make(cfg).learn()
    lines = (tmp_path / "run" / "samples.jsonl").read_text().splitlines()
    assert lines
    for line in lines:
        _decodes_to_what_was_seen(tok, json.loads(line, parse_constant=lambda c: pytest.fail(f"not JSON: {c}")))
    out = tmp_path / "eval.jsonl"
    assert main(["llm", "eval", str(model), "--task", "arith", "--limit", "2", "--max-new-tokens", "3",
                 "--self-report", "confidence", "--transcripts", str(out), "--json", "--no-progress"]) == 0
    episodes = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(episodes) == 2
    for episode in episodes:
        _decodes_to_what_was_seen(tok, episode)


def test_the_inline_report_is_completed_in_the_answers_own_message(tok):
    """The inline form on a chat model: the first message asks for the tag, the environment opens it after the
    answer in the same assistant message (the end-of-turn the model sampled dropped), and the model completes it:
    the row is the template's rendering of one user message and one assistant message, the answer's and the
    report's tokens trained and the opened tag context; a malformed report is a missing one, never an error. The
    report's completion gets its own small budget, and the response budget is the inner task's plus room for it."""
    from reflectrl.llm.config import GRPOConfig, response_budget
    from reflectrl.tasks.selfreport import INLINE_ASKS, INLINE_OPENINGS, INLINE_REPORT_TOKENS, INLINE_ROOM

    policy = tiny_chat_policy(tok)
    task = with_self_report(get_task("arith"), "inline", chat=True)
    assert with_self_report(get_task("arith"), "inline") is not task and \
        type(with_self_report(get_task("arith"), "inline", chat=False)).__name__ == "ArithTask"
    p = task.problems("train")[0]
    value = p.meta["value"]
    engine = Scripted(tok, policy.chat.end_of_turn, [[str(value), str(value + 1)], ["8</confidence>", "x"]])
    ro = Rollout(policy, engine, task, max_new_tokens=8, max_turns=task.max_turns, max_response_tokens=200,
                 reward_workers=0)
    batch, _ = ro.run([p], 2, torch.Generator().manual_seed(0))
    prompt = chat_prompt(task, p)
    assert prompt.endswith(INLINE_ASKS["confidence"]) and "<confidence>" in prompt
    first, second = batch.infos[0][-1], batch.infos[1][-1]
    assert batch.correct.tolist() == [True, False]
    assert engine.budgets == [[8, 8], [INLINE_REPORT_TOKENS] * 2]
    resolved = GRPOConfig(model="m", max_new_tokens=8).resolved(task, chat=True)
    assert resolved.max_turns == 2 and resolved.max_response_tokens == response_budget(8, 1, False) + INLINE_ROOM
    assert first["confidence"] == 0.8 and first["self_report_valid"] and first["self_report"] == "confidence"
    assert "confidence" not in second and second["self_report_valid"] is False
    eot = policy.chat.end_of_turn
    message = f"{value}{INLINE_OPENINGS['confidence']}8</confidence>"
    assert _row_ids(batch) == template_ids(tok, [{"role": "user", "content": prompt},
                                                 {"role": "assistant", "content": message}])
    trained = batch.response_ids[0][batch.completion_mask[0]].tolist()
    assert trained == enc(tok, str(value)) + enc(tok, "8</confidence>") + [eot]  # the opened tag is context
    from reflectrl.llm.rollout import logged_episode

    shown = logged_episode(tok, True, batch.to_records()[0], batch.transcripts[0])["transcript"]
    assert [k for k, _ in shown] == ["prompt", "policy", "env", "policy"]
    assert "".join(t for _, t in shown[1:]) == message + "<|im_end|>"
    ro.close()


@pytest.mark.parametrize("algo,flags", [
    ("rlcr", {"self_report": "inline"}),
    ("rlcr", {"self_report": "inline", "rlcr_credit": "split", "rlcr_calibration": "batch-rank"}),
    ("refgrpo", {"self_report": "inline-reflect", "refgrpo_credit": "split"}),
])
def test_methods_train_on_inline_reports_of_a_chat_model(tok, tmp_path, algo, flags):
    """rlcr and refgrpo train an update on a chat model's inline reports (split credit on the report's own tokens);
    with raw prompts split credit is refused, the tag being part of the answer's turn."""
    import dataclasses
    import json

    from reflectrl.algos import config_for_algo, get_algo

    model = _chat_model_dir(tok, tmp_path / "m")
    cfg = config_for_algo(algo, task="arith", model=str(model), run_dir=str(tmp_path / "run"), updates=1,
                          prompts_per_update=2, group_size=2, max_new_tokens=3, progress=False, tensorboard=False,
                          threads=1, reward_workers=0, sample_interval=1, export_model=False, **flags)
    get_algo("llm", algo).make(cfg).learn()
    sample = json.loads((tmp_path / "run" / "samples.jsonl").read_text().splitlines()[0])
    assert any(kind == "env" and "<" in text for kind, text in sample["transcript"])  # the opened tag
    if flags.get("rlcr_credit") == "split" or flags.get("refgrpo_credit") == "split":
        with pytest.raises(ConfigError, match="turn of its own"):
            dataclasses.replace(cfg, chat="off").validate()
