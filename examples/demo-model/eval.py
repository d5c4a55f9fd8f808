#!/usr/bin/env python3
"""Held-out evaluation of the demo model in PyTorch, greedy, without a grammar.

    python3 eval.py --model HF_DIR [--count 500]

The test set is drawn from gen_data with a seed the training stream never uses. Reports
field-level exact match (every field of every expected object, compared by JSON value), the share
of replies that parse as a JSON object, whole-object exact match, and tool-call exact match on
tool-use conversations.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_data  # noqa: E402
import llama  # noqa: E402
import tok  # noqa: E402
from eval_common import TEST_SEED, score  # noqa: E402


def read_safetensors(path):
    codes = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        b, e = h["data_offsets"]
        t = torch.frombuffer(bytearray(data[b:e]), dtype=codes[h["dtype"]])
        out[name] = t.reshape(h["shape"])
    return out


def load_hf(model_dir, dev):
    with open(model_dir + "/config.json") as f:
        c = json.load(f)
    cfg = llama.Config(**{k: c[k] for k in llama.Config.__dataclass_fields__})
    model = llama.Llama(cfg)
    sd = {k: v.float() for k, v in read_safetensors(model_dir + "/model.safetensors").items()}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    return model.to(dev).eval()


@torch.no_grad()
def greedy(model, prompts, stop_id, max_new, dev):
    """Greedy continuations of token-id prompts, batched; stops at stop_id (not included)."""
    b = len(prompts)
    lens = torch.tensor([len(p) for p in prompts], device=dev)
    buf = torch.zeros(b, int(lens.max()) + max_new, dtype=torch.long, device=dev)
    for i, p in enumerate(prompts):
        buf[i, :len(p)] = torch.tensor(p)
    start = lens.clone()
    done = torch.zeros(b, dtype=torch.bool, device=dev)
    autocast = torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda")
    for _ in range(max_new):
        n = int(lens.max())
        with autocast:
            logits = model(buf[:, :n])
        nxt = logits[torch.arange(b, device=dev), lens - 1].argmax(-1)
        nxt = torch.where(done, torch.zeros_like(nxt), nxt)
        buf[torch.arange(b, device=dev), lens] = nxt
        done |= nxt == stop_id
        lens = lens + (~done).long()
        if bool(done.all()):
            break
    return [buf[i, int(start[i]):int(lens[i])].tolist() for i in range(b)]


def prompt_ids(enc, messages, tools):
    text = "".join(t for t, _ in gen_data.render_chatml(messages, tools, add_generation_prompt=True))
    return [enc.bos] + enc.encode(text)


def evaluate(model, enc, count, dev, log, batch=250, max_new=120):
    exs = list(gen_data.generate(TEST_SEED, count, tool_fraction=0.0))
    pairs = []
    shown = 0
    for i in range(0, len(exs), batch):
        part = exs[i:i + batch]
        outs = greedy(model, [prompt_ids(enc, ex["messages"][:-1], []) for ex in part], enc.im_end, max_new, dev)
        for ex, ids in zip(part, outs):
            pairs.append((ex["answer"], enc.decode(ids)))
            if score(pairs[-1:])["field_exact_match"] < 1 and shown < 8:
                shown += 1
                log(f"miss: {ex['messages'][1]['content']!r}\n  gold {json.dumps(pairs[-1][0])}\n  got  {pairs[-1][1]}")
    tools = list(gen_data.generate(TEST_SEED + 1, max(20, count // 5), tool_fraction=1.0))
    outs = greedy(model, [prompt_ids(enc, ex["messages"][:2], ex["tools"]) for ex in tools], enc.im_end, max_new, dev)
    tool_ok = 0
    for ex, ids in zip(tools, outs):
        call = ex["messages"][2]["tool_calls"][0]
        want = "<tool_call>\n" + json.dumps({"name": call["name"], "arguments": call["arguments"]}) + "\n</tool_call>"
        tool_ok += enc.decode(ids) == want
    res = {"test_seed": TEST_SEED, **score(pairs), "tool_calls": len(tools),
           "tool_call_exact_match": round(tool_ok / len(tools), 4)}
    log("eval " + json.dumps(res))
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--count", type=int, default=500)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    dev = torch.device(a.device)
    enc = tok.Encoder(tok.spm.SentencePieceProcessor(model_file=a.model + "/tokenizer.model"))
    evaluate(load_hf(a.model, dev), enc, a.count, dev, print)


if __name__ == "__main__":
    main()
