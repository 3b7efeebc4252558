#!/usr/bin/env python3
"""A tiny known-answer model for the sandbox: Qwen2-shaped, a few MB, that a real vLLM serves and that
answers the serving gate's dialogues correctly under greedy decoding.

    python tiny_model.py OUT_DIR --variant good|scrambled [--seed N] [--shards 4] [--gate PATH]

Needs torch, transformers (5.x) and tokenizers: the vLLM image's (or dev venv's) python. Writes a real
model repo: config.json, generation_config.json, tokenizer.json, tokenizer_config.json,
chat_template.jinja, special_tokens_map.json, `model-0000N-of-0000M.safetensors` bf16 shards and their
`model.safetensors.index.json`.

- Tokenizer: byte-level BPE trained here with `tokenizers` on local text (a few /usr/share/common-licenses
  files where present, plus the gate's dialogues), special tokens `<|endoftext|>`, `<|im_start|>`,
  `<|im_end|>` (eos) and the Hermes tool tags `<tool_call>`, `</tool_call>`, `<tool_response>`,
  `</tool_response>` (vLLM's hermes parser needs them in the vocabulary); Qwen/Hermes-style chat template.
- Model: hidden 128, 2 layers, 4 heads of 32 (vLLM's CPU attention needs head size >= 32), 2 KV heads,
  max_position_embeddings 4096. The good variant is trained on CPU for a few seconds (overfit) on exactly
  the token sequences the chat template renders for the gate's requests (imported from
  files/serving_gate/serving_gate.py, so they cannot drift), loss on the assistant part only. It then
  checks itself in bf16 with greedy decoding and refuses to write a model that does not answer.
- `scrambled`: the same trained tensors with their elements randomly permuted (same shapes, sizes,
  tokenizer and config): a broken numerical path that still answers HTTP 200 with well-formed nonsense.
  It checks that its coherence answer does not say Paris.

Deterministic for a given seed (single thread, fixed seeds, own sharding).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
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
LICENSES = ("Apache-2.0", "GPL-2", "GPL-3", "LGPL-2.1", "BSD", "MPL-2.0", "Artistic")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOOL_TAGS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
BPE_VOCAB, VOCAB = 2000, 2048

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


def load_gate(path: Path):
    spec = importlib.util.spec_from_file_location("serving_gate", path)
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


def train_tokenizer(gate) -> PreTrainedTokenizerFast:
    corpus = []
    for name in LICENSES:
        p = Path("/usr/share/common-licenses") / name
        if p.is_file():
            corpus.append(p.read_text(errors="replace"))
    texts = [COHERENCE_ANSWER, CONTINUATION_ANSWER, JSON_ANSWER, json.dumps(gate.WEATHER_TOOL), gate.TOOL_RESULT,
             json.dumps(gate.CITY_SCHEMA), CHAT_TEMPLATE]
    for d in dialogues(gate):
        texts += [str(m.get("content") or "") for m in d["messages"]]
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


def make_config(tokenizer) -> Qwen2Config:
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    return Qwen2Config(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=4096,
                       rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False, sliding_window=None,
                       bos_token_id=pad, eos_token_id=eos, pad_token_id=pad, hidden_act="silu",
                       rope_theta=10000.0, attention_dropout=0.0)


def greedy(model, prompt: list[int], n: int, eos: int) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            nxt = int(model(torch.tensor([ids])).logits[0, -1].float().argmax())
            ids.append(nxt)
            if nxt == eos:
                break
    return ids[len(prompt):]


def train(model, data, eos: int, seed: int, max_steps: int = 400, log=print):
    """Overfit on the assistant tokens; stop once greedy decoding in bf16 gives every answer exactly."""
    torch.manual_seed(seed)
    pad = 0
    width = max(len(p) + len(a) for _, p, a in data)
    inputs = torch.full((len(data), width), pad, dtype=torch.long)
    labels = torch.full((len(data), width), -100, dtype=torch.long)
    mask = torch.zeros((len(data), width), dtype=torch.long)
    for i, (_, p, a) in enumerate(data):
        seq = p + a
        inputs[i, :len(seq)] = torch.tensor(seq)
        labels[i, len(p):len(seq)] = torch.tensor(a)
        mask[i, :len(seq)] = 1
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    model.train()
    step, loss = 0, None
    while step < max_steps:
        for _ in range(25):
            opt.zero_grad()
            loss = model(input_ids=inputs, attention_mask=mask, labels=labels).loss
            loss.backward()
            opt.step()
            step += 1
        if loss.item() < 0.002 and answers_ok(model, data, eos):
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


def build(out: Path, variant: str, seed: int = 0, shards: int = 4, gate_path: Path = DEFAULT_GATE, log=print) -> dict:
    t0 = time.monotonic()
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    gate = load_gate(gate_path)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("model*.safetensors*"):
        old.unlink()
    tokenizer = train_tokenizer(gate)
    config = make_config(tokenizer)
    config.save_pretrained(str(out))
    cfg = json.loads((out / "config.json").read_text())
    cfg.update({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "torch_dtype": "bfloat16",
                "dtype": "bfloat16", "rope_theta": 10000.0, "max_position_embeddings": 4096})
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    save_tokenizer(tokenizer, out)
    # tokenize exactly as the server will: the tokenizer as loaded back from the repo (transformers 5 picks
    # its class from config.json's model_type, and that class may pre-tokenize differently)
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    data = examples(tokenizer, gate)
    eos = config.eos_token_id
    model = Qwen2ForCausalLM(config)
    steps = train(model, data, eos, seed, log=log)
    model.eval()
    state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()
             if k != "lm_head.weight"}  # tied to the embeddings
    if variant == "scrambled":
        for attempt in range(10):
            scrambled = scramble(state, seed + 1 + attempt)
            model.load_state_dict({**scrambled, "lm_head.weight": scrambled["model.embed_tokens.weight"]})
            bf = model.to(torch.bfloat16).eval()
            name, p, a = data[0]
            said = tokenizer.decode(greedy(bf, p, 48, eos))
            if "Paris" not in said:
                state = scrambled
                log(f"scrambled: coherence says {said[:60]!r}")
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
    args = ap.parse_args(argv)
    build(args.out_dir, args.variant, args.seed, args.shards, args.gate)
    return 0


if __name__ == "__main__":
    sys.exit(main())
