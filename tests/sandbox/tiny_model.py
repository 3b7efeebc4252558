#!/usr/bin/env python3
"""A tiny known-answer model for the sandbox: Qwen2-shaped, a few MB, that a real vLLM serves and that
answers the serving gate's dialogues correctly under greedy decoding.

    python tiny_model.py OUT_DIR --variant good|scrambled [--seed N] [--shards 4] [--gate PATH] [--needle PATH]

Needs torch, transformers (5.x) and tokenizers: the vLLM image's (or dev venv's) python. Writes a real
model repo: config.json, generation_config.json, tokenizer.json, tokenizer_config.json,
chat_template.jinja, special_tokens_map.json, `model-0000N-of-0000M.safetensors` bf16 shards and their
`model.safetensors.index.json`.

- Tokenizer: byte-level BPE trained here with `tokenizers` on local text (a few /usr/share/common-licenses
  files where present, plus the gate's dialogues), special tokens `<|endoftext|>`, `<|im_start|>`,
  `<|im_end|>` (eos) and the Hermes tool tags `<tool_call>`, `</tool_call>`, `<tool_response>`,
  `</tool_response>` (vLLM's hermes parser needs them in the vocabulary); Qwen/Hermes-style chat template.
- Model: hidden 128, 2 layers, 4 heads of 32 (vLLM's CPU attention needs head size >= 32), 2 KV heads,
  max_position_embeddings 4096, rope_theta 1e9. The good variant is trained on CPU for a few seconds
  (overfit) on exactly the token sequences the chat template renders for the gate's requests (imported from
  files/serving_gate/serving_gate.py, so they cannot drift), loss on the assistant part only. It then
  checks itself in bf16 with greedy decoding and refuses to write a model that does not answer.
- Long-context retrieval (files/serving_gate/needle.py, imported like the gate): a 2-layer model this small
  does not learn to copy from its prompt in minutes of CPU, so a copy circuit is set by hand (copy_circuit:
  a previous-position head, then a head that finds the current key letter and copies the letter after it,
  on rotary dims that barely turn, rope_theta 1e9, so it works at any distance) and kept fixed while the
  rest trains on the gate's dialogues and on short retrieval prompts. The good variant checks 3 fresh keys
  at NEEDLE_CHECK_TOKENS filler words (~1,600 prompt tokens) under greedy bf16 decoding.
- `scrambled`: the same trained tensors with their elements randomly permuted (same shapes, sizes,
  tokenizer and config): a broken numerical path that still answers HTTP 200 with well-formed nonsense.
  It checks that its coherence answer does not say Paris and that it does not retrieve a fresh key.

Deterministic for a given seed (single thread, fixed seeds, own sharding).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # tokenizers' BPE trainer: one thread, one order
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM  # noqa: E402

HERE = Path(__file__).resolve().parent
DEFAULT_GATE = HERE.parent.parent / "files" / "serving_gate" / "serving_gate.py"
DEFAULT_NEEDLE = DEFAULT_GATE.with_name("needle.py")
LICENSES = ("Apache-2.0", "GPL-2", "GPL-3", "LGPL-2.1", "BSD", "MPL-2.0", "Artistic")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOOL_TAGS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
BPE_VOCAB, VOCAB = 2000, 2048
ROPE_THETA = 1e9  # slow rotations on most head dims: the copy circuit's matches hold over the whole context
# the long-context retrieval the model must pass at the sandbox's length (inventories/sandbox.py's
# gate_long_context_tokens), and the shorter prompts it trains on (the copy circuit does not depend on length)
NEEDLE_CHECK_TOKENS = 1536
NEEDLE_TRAIN_WORDS = (8, 96)

# The answers the model learns. Under xgrammar with disable_any_whitespace (and no indent) JSON has the
# separators ", " and ": " (json.dumps' default), so that is how the structured ones are written.
COHERENCE_ANSWER = "The capital of France is Paris."
CONTINUATION_ANSWER = "It is 18 C and sunny in Paris."
JSON_ANSWER = json.dumps({"city": "Paris", "country": "France", "population_millions": 2})

CHAT_TEMPLATE = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- else %}{{- 'You are a helpful assistant.\\n\\n' }}{%- endif %}
{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
{%- for tool in tools %}
{%- if tool.function is defined %}{%- set tool = tool.function %}{%- endif %}
{{- '\\n' }}{{- {'name': tool.name, 'description': tool.description, 'parameters': tool.parameters} | tojson }}
{%- endfor %}
{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- else %}
{%- if messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) or (message.role == 'assistant' and not message.tool_calls) %}
{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant' }}
{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
{%- for tool_call in message.tool_calls %}
{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '\\n<tool_call>\\n{\"name\": \"' + tool_call.name + '\", \"arguments\": ' }}
{%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}
{{- '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""


def load_gate(path: Path, name: str = "serving_gate"):
    spec = importlib.util.spec_from_file_location(name, path)
    gate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gate)
    return gate


def as_server_renders(messages: list[dict]) -> list[dict]:
    """vLLM parses tool-call arguments to dicts before rendering (chat_utils._postprocess_messages)."""
    out = copy.deepcopy(messages)
    for m in out:
        for tc in m.get("tool_calls") or []:
            if isinstance(tc["function"].get("arguments"), str):
                tc["function"]["arguments"] = json.loads(tc["function"]["arguments"])
    return out


def dialogues(gate) -> list[dict]:
    """(name, messages, tools, answer) for every generation request the gate makes."""
    args = json.dumps(gate.TOOL_ARGUMENTS)
    return [
        {"name": "coherence", "messages": gate.COHERENCE_MESSAGES, "tools": None, "answer": COHERENCE_ANSWER},
        {"name": "tool_call", "messages": gate.TOOL_MESSAGES, "tools": [gate.WEATHER_TOOL], "answer": args},
        {"name": "continuation", "messages": gate.tool_result_messages("chatcmpl-tool-0", "get_weather", args),
         "tools": [gate.WEATHER_TOOL], "answer": CONTINUATION_ANSWER},
        {"name": "strict_json", "messages": gate.JSON_MESSAGES, "tools": None, "answer": JSON_ANSWER},
    ]


def train_tokenizer(gate, needle) -> PreTrainedTokenizerFast:
    corpus = []
    for name in LICENSES:
        p = Path("/usr/share/common-licenses") / name
        if p.is_file():
            corpus.append(p.read_text(errors="replace"))
    texts = [COHERENCE_ANSWER, CONTINUATION_ANSWER, JSON_ANSWER, json.dumps(gate.WEATHER_TOOL), gate.TOOL_RESULT,
             json.dumps(gate.CITY_SCHEMA), CHAT_TEMPLATE]
    for d in dialogues(gate):
        texts += [str(m.get("content") or "") for m in d["messages"]]
    # the retrieval prompt's fixed words (each filler word one token; the key's letters stay single tokens)
    texts += [needle.SYSTEM, needle.QUESTION, needle.MARKER, " ".join(needle.FILLER_WORDS)]
    corpus += texts * 20
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TAGS])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=CHAT_TEMPLATE, model_max_length=4096)


def examples(tokenizer, gate) -> list[tuple[str, list[int], list[int]]]:
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    out = []
    for d in dialogues(gate):
        kw = {"tools": d["tools"]} if d["tools"] else {}
        prompt = tokenizer.apply_chat_template(as_server_renders(d["messages"]), add_generation_prompt=True,
                                               tokenize=False, **kw)
        p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        a_ids = tokenizer(d["answer"], add_special_tokens=False)["input_ids"] + [eos]
        out.append((d["name"], p_ids, a_ids))
    return out


def needle_example(tokenizer, needle, rng, words: int, eos: int) -> tuple[str, list[int], list[int]]:
    """A retrieval prompt as the gate builds it (needle.build_messages), the answer the key and eos."""
    key = needle.fresh_key(rng)
    messages = needle.build_messages(key, needle.fresh_nonce(rng), words, rng.random(), rng)
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    return f"needle-{words}", p_ids, tokenizer(key, add_special_tokens=False)["input_ids"] + [eos]


def check_needle_tokens(tokenizer, needle) -> None:
    """The copy circuit needs each key letter, the marker's '=' and the filler words as their own tokens."""
    one = {c: tokenizer(c, add_special_tokens=False)["input_ids"] for c in needle.KEY_ALPHABET + "="}
    pairs = [a + b for a in needle.KEY_ALPHABET for b in needle.KEY_ALPHABET
             if tokenizer(a + b, add_special_tokens=False)["input_ids"] != one[a] + one[b]]
    long_words = [w for w in needle.FILLER_WORDS if len(tokenizer(" " + w, add_special_tokens=False)["input_ids"]) != 1]
    bad = [c for c, ids in one.items() if len(ids) != 1]
    if pairs or long_words or bad:
        raise SystemExit(f"the tokenizer merges key letters {pairs} / splits filler words {long_words} / {bad}")


# The copy circuit (hand-set, then kept fixed while the rest trains). Residual dims CODE hold a one-hot code
# for each key letter, for '=' and for the newline that starts the answer; dims PREV the code of the previous
# token (written by layer 0's head 0, which attends to the previous position whatever the content: its query
# and key are constant biases whose rotary phases agree only one position back). Layer 1's head 0 matches the
# current token's code against PREV (the letter after the current one in the prompt; the newline asks for
# the letter after '=') on head dims of slow rotary frequencies, so the match is the same at any distance, and
# writes the attended letter's code back to CODE, which the tied embeddings read as that letter's logit.
CODE, PREV = range(0, 18), range(18, 36)
SLOW = list(range(7, 16)) + list(range(23, 32))  # head dims of rotary pairs 7..15 (period > 50k positions)
FAST_PAIRS = 7  # rotary pairs 0..6 carry the previous-position pattern


def copy_circuit(model, tokenizer, needle) -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
    """Set the circuit's weights; return (parameter, mask of trainable entries) for the training."""
    from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb
    hd, nc = model.config.head_dim, len(CODE)
    coded = [tokenizer.convert_tokens_to_ids(t) for t in list(needle.KEY_ALPHABET) + ["="]]
    newline = tokenizer("\n", add_special_tokens=False)["input_ids"]
    assert len(newline) == 1 and len(coded) < nc - 1
    start, eq = nc - 2, len(coded) - 1  # the code of the answer's first position, of '='
    masks = {}

    def fix(param, index, value=None):
        if param not in masks:
            masks[param] = torch.ones_like(param)
        with torch.no_grad():
            if value is not None:
                param[index] = value
        masks[param][index] = 0

    layers = model.model.layers
    emb = model.model.embed_tokens.weight
    gamma, beta, c, delta, s = 0.5, 0.05, 3.0, 0.25, 14.0
    fix(emb, (slice(None), slice(0, 36)), 0.0)
    for i, t in enumerate(coded):
        fix(emb, (t, CODE[i]), gamma)
    fix(emb, (newline[0], CODE[start]), gamma)
    # layer 0, query heads 0-1 and kv head 0: the previous position
    rot = model.model.rotary_emb
    b = torch.zeros(hd)
    b[:FAST_PAIRS] = 1.0
    cos, sin = rot(torch.zeros(1), torch.tensor([[-1]]))
    q, _ = apply_rotary_pos_emb(b.view(1, 1, 1, hd), b.view(1, 1, 1, hd), cos, sin)
    a0, a1 = layers[0].self_attn, layers[1].self_attn
    fix(a0.k_proj.weight, slice(0, hd), 0.0)
    fix(a0.k_proj.bias, slice(0, hd), b * s)
    fix(a0.q_proj.weight, slice(0, hd), 0.0)
    fix(a0.q_proj.bias, slice(0, hd), q.view(hd) * s)
    v0, o0 = torch.zeros(hd, model.config.hidden_size), torch.zeros(model.config.hidden_size, hd)
    for j in range(nc):
        v0[SLOW[j], CODE[j]] = 1.0
        o0[PREV[j], SLOW[j]] = beta
    fix(a0.v_proj.weight, slice(0, hd), v0)
    fix(a0.v_proj.bias, slice(0, hd), 0.0)
    fix(a0.o_proj.weight, (slice(None), slice(0, hd)), o0)
    # layer 1, query head 0 and kv head 0: find the current letter in PREV, copy what sits there
    q1, k1, v1 = (torch.zeros(hd, model.config.hidden_size) for _ in range(3))
    o1 = torch.zeros(model.config.hidden_size, hd)
    for j in range(len(coded)):
        q1[SLOW[j], CODE[j]] = c
        k1[SLOW[j], PREV[j]] = c
        v1[SLOW[j], CODE[j]] = 1.0
        o1[CODE[j], SLOW[j]] = delta
    q1[SLOW[eq], CODE[start]] = c
    for w, value in ((a1.q_proj.weight, q1), (a1.k_proj.weight, k1), (a1.v_proj.weight, v1)):
        fix(w, slice(0, hd), value)
    for bias in (a1.q_proj.bias, a1.k_proj.bias, a1.v_proj.bias):
        fix(bias, slice(0, hd), 0.0)
    fix(a1.o_proj.weight, (slice(None), slice(0, hd)), o1)
    # nothing else writes into the circuit's dims, and its norms keep their scale there
    for layer, attn in ((layers[0], a0), (layers[1], a1)):
        fix(attn.o_proj.weight, (slice(0, 36), slice(hd, None)), 0.0)
        fix(layer.mlp.down_proj.weight, slice(0, 36), 0.0)
        fix(layer.input_layernorm.weight, slice(0, 36), 1.0)
    return list(masks.items())


def make_config(tokenizer) -> Qwen2Config:
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    return Qwen2Config(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=4096,
                       rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False, sliding_window=None,
                       bos_token_id=pad, eos_token_id=eos, pad_token_id=pad, hidden_act="silu",
                       rope_theta=ROPE_THETA, attention_dropout=0.0)


def greedy(model, prompt: list[int], n: int, eos: int) -> list[int]:
    out, past, ids = [], None, torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(n):
            r = model(input_ids=ids, past_key_values=past, use_cache=True)
            past, nxt = r.past_key_values, int(r.logits[0, -1].float().argmax())
            out.append(nxt)
            if nxt == eos:
                break
            ids = torch.tensor([[nxt]])
    return out


def padded(data) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    width = max(len(p) + len(a) for _, p, a in data)
    inputs = torch.zeros((len(data), width), dtype=torch.long)
    labels = torch.full((len(data), width), -100, dtype=torch.long)
    mask = torch.zeros((len(data), width), dtype=torch.long)
    for i, (_, p, a) in enumerate(data):
        seq = p + a
        inputs[i, :len(seq)] = torch.tensor(seq)
        labels[i, len(p):len(seq)] = torch.tensor(a)
        mask[i, :len(seq)] = 1
    return inputs, labels, mask


def train(model, data, eos: int, seed: int, needle_batch=None, fixed=(), checks=(), max_steps: int = 600, log=print):
    """Overfit on the assistant tokens (plus a fresh batch of short retrieval prompts each step, where
    `needle_batch` is given); entries masked in `fixed` stay as set. Stop once greedy decoding in bf16 gives
    every answer, and every answer of `checks`, exactly."""
    torch.manual_seed(seed)
    inputs, labels, mask = padded(data)
    for param, keep in fixed:
        param.register_hook(lambda grad, keep=keep: grad * keep)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    model.train()
    step, loss = 0, None
    while step < max_steps:
        for _ in range(25):
            opt.zero_grad()
            loss = model(input_ids=inputs, attention_mask=mask, labels=labels).loss
            if needle_batch:
                loss = loss + model(**dict(zip(("input_ids", "labels", "attention_mask"), needle_batch()))).loss
            loss.backward()
            opt.step()
            step += 1
        if loss.item() < 0.01 and answers_ok(model, list(data) + list(checks), eos):
            log(f"trained: {step} steps, loss {loss.item():.5f}")
            return step
    raise SystemExit(f"the tiny model did not learn its answers in {max_steps} steps (loss {loss.item():.4f})")


def answers_ok(model, data, eos) -> bool:
    bf = copy.deepcopy(model).to(torch.bfloat16).eval()
    return all(greedy(bf, p, len(a) + 2, eos) == a for _, p, a in data)


def scramble(state: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name in state:  # model order, so the shards split alike
        t = state[name]
        out[name] = t.flatten()[torch.randperm(t.numel(), generator=g)].reshape(t.shape).contiguous()
    return out


def save_shards(state: dict[str, torch.Tensor], out: Path, shards: int) -> None:
    names = list(state)  # model order: embeddings, layers, norm
    sizes = [state[n].numel() * state[n].element_size() for n in names]
    total, target = sum(sizes), sum(sizes) / shards
    groups, acc = [[] for _ in range(shards)], 0
    for n, s in zip(names, sizes):
        i = min(int(acc // target), shards - 1)
        # never leave a later shard empty: move on once this one has something and the rest still fits
        groups[i].append(n)
        acc += s
    for i in range(shards):  # any empty group takes the previous group's last tensor
        if not groups[i]:
            j = max(k for k in range(shards) if len(groups[k]) > 1)
            groups[i].append(groups[j].pop())
    weight_map = {}
    for i, group in enumerate(groups, 1):
        fname = f"model-{i:05d}-of-{shards:05d}.safetensors"
        save_file({n: state[n] for n in group}, str(out / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in group})
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def save_tokenizer(tokenizer, out: Path) -> None:
    tokenizer.save_pretrained(str(out))
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    # loadable by transformers 4 as well: a plain class name and the template inline too
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    specials = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                "additional_special_tokens": ["<|im_start|>", "<|im_end|>"]}
    (out / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n")


def retrieves(model, tokenizer, needle, rng, words: int, eos: int, n: int) -> list[str]:
    """What the model answers to n fresh retrieval prompts of `words` filler words (bf16, greedy), each
    with its key: '<answer> (key <key>)'; empty when every answer is the key exactly."""
    bf = copy.deepcopy(model).to(torch.bfloat16).eval()
    wrong = []
    for _ in range(n):
        _, p, a = needle_example(tokenizer, needle, rng, words, eos)
        said = greedy(bf, p, len(a) + 2, eos)
        if said != a:
            wrong.append(f"{tokenizer.decode(said)!r} (key {tokenizer.decode(a[:-1])}, {len(p)} prompt tokens)")
    return wrong


def build(out: Path, variant: str, seed: int = 0, shards: int = 4, gate_path: Path = DEFAULT_GATE,
          needle_path: Path = DEFAULT_NEEDLE, log=print) -> dict:
    t0 = time.monotonic()
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    gate, needle = load_gate(gate_path), load_gate(needle_path, "needle")
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("model*.safetensors*"):
        old.unlink()
    tokenizer = train_tokenizer(gate, needle)
    config = make_config(tokenizer)
    config.save_pretrained(str(out))
    cfg = json.loads((out / "config.json").read_text())
    cfg.update({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "torch_dtype": "bfloat16",
                "dtype": "bfloat16", "rope_theta": ROPE_THETA, "max_position_embeddings": 4096})
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    save_tokenizer(tokenizer, out)
    # tokenize exactly as the server will: the tokenizer as loaded back from the repo (transformers 5 picks
    # its class from config.json's model_type, and that class may pre-tokenize differently)
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    check_needle_tokens(tokenizer, needle)
    data = examples(tokenizer, gate)
    eos = config.eos_token_id
    model = Qwen2ForCausalLM(config)
    fixed = copy_circuit(model, tokenizer, needle)
    rng = random.Random(seed)
    lo, hi = NEEDLE_TRAIN_WORDS

    def needle_batch():
        return padded([needle_example(tokenizer, needle, rng, rng.randint(lo, hi), eos) for _ in range(8)])

    checks = [needle_example(tokenizer, needle, rng, words, eos) for words in (lo, hi, 2 * hi)]
    steps = train(model, data, eos, seed, needle_batch, fixed, checks, log=log)
    model.eval()
    check_rng = random.Random(seed + 1000)  # keys and positions the training never drew
    wrong = retrieves(model, tokenizer, needle, check_rng, NEEDLE_CHECK_TOKENS, eos, 3)
    if wrong:
        raise SystemExit(f"the tiny model does not retrieve at {NEEDLE_CHECK_TOKENS} tokens: {'; '.join(wrong)}")
    log(f"retrieval: 3 fresh keys exact at {NEEDLE_CHECK_TOKENS} filler words")
    state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()
             if k != "lm_head.weight"}  # tied to the embeddings
    if variant == "scrambled":
        for attempt in range(10):
            scrambled = scramble(state, seed + 1 + attempt)
            model.load_state_dict({**scrambled, "lm_head.weight": scrambled["model.embed_tokens.weight"]})
            bf = model.to(torch.bfloat16).eval()
            name, p, a = data[0]
            said = tokenizer.decode(greedy(bf, p, 48, eos))
            wrong = retrieves(model, tokenizer, needle, random.Random(seed + 1000), NEEDLE_CHECK_TOKENS, eos, 1)
            if "Paris" not in said and wrong:
                state = scrambled
                log(f"scrambled: coherence says {said[:60]!r}; retrieval says {wrong[0][:60]}")
                break
        else:
            raise SystemExit("could not scramble the model into nonsense")
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": config.bos_token_id, "eos_token_id": eos, "pad_token_id": config.pad_token_id}, indent=2) + "\n")
    save_shards(state, out, shards)
    for p in out.iterdir():
        p.chmod(0o644)
    info = {"variant": variant, "seed": seed, "steps": steps, "seconds": round(time.monotonic() - t0, 1),
            "prompt_tokens": {n: len(p) for n, p, _ in data}, "files": sorted(p.name for p in out.iterdir())}
    log(json.dumps(info))
    return info


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--variant", choices=("good", "scrambled"), default="good")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--gate", type=Path, default=DEFAULT_GATE, help="serving_gate.py whose requests it learns")
    ap.add_argument("--needle", type=Path, default=DEFAULT_NEEDLE, help="needle.py whose retrieval prompts it answers")
    args = ap.parse_args(argv)
    build(args.out_dir, args.variant, args.seed, args.shards, args.gate, args.needle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
