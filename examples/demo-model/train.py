#!/usr/bin/env python3
"""Trains the demo model end to end: tokenizer, model, HF export, held-out evaluation.

    python3 train.py --out OUT            # on a GPU; see README.md for the exact run

Everything is seeded: the tokenizer corpus, the training stream (one generator per data-loader worker)
and the initial weights. The defaults are the committed model's run (6500 steps, 10 data workers: the
worker count is part of the data order). --steps 0 instead calibrates the step count from the first
steps' speed to fill --minutes (which overestimates the step time: the first steps include start-up).
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_data  # noqa: E402
import llama  # noqa: E402
import tok  # noqa: E402
from eval import evaluate, load_hf  # noqa: E402

CHAT_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0]['role'] == 'system' %}"
    "{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) or "
    "(message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>' + message.role }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}{%- if tool_call.function is defined %}"
    "{%- set tool_call = tool_call.function %}{%- endif %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' }}{{- tool_call.name }}{{- '\", \"arguments\": ' }}"
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != 'tool') %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def encode_example(enc, ex, max_len):
    """Token ids (BOS first) and a loss mask that is 1 on the assistant replies' tokens."""
    ids, mask = [enc.bos], [0]
    for text, trained in gen_data.render_chatml(ex["messages"], ex["tools"]):
        t = enc.encode(text)
        ids += t
        mask += [1 if trained else 0] * len(t)
    return ids[:max_len], mask[:max_len]


class Stream(torch.utils.data.IterableDataset):
    """Endless padded batches; worker w draws from gen_data with seed (seed, w)."""

    def __init__(self, sp_model, seed, batch, max_len):
        self.sp_model, self.seed, self.batch, self.max_len = sp_model, seed, batch, max_len

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        wid = info.id if info else 0
        enc = tok.Encoder(tok.spm.SentencePieceProcessor(model_file=self.sp_model))
        it = gen_data.generate(self.seed * 1000 + wid, 1 << 40)
        while True:
            rows = [encode_example(enc, next(it), self.max_len) for _ in range(self.batch)]
            n = max(len(r[0]) for r in rows)
            ids = torch.zeros(len(rows), n, dtype=torch.long)
            tgt = torch.full((len(rows), n), -100, dtype=torch.long)
            for i, (x, m) in enumerate(rows):
                ids[i, :len(x)] = torch.tensor(x)
                y = torch.tensor(x[1:] + [0])
                keep = torch.tensor(m[1:] + [0], dtype=torch.bool)
                tgt[i, :len(x)] = torch.where(keep, y, torch.full_like(y, -100))
            yield ids, tgt


def write_tokenizer_files(out, enc):
    cfg = {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "<|im_end|>",
           "unk_token": "<unk>", "pad_token": None, "model_max_length": 1024, "tokenizer_class": "LlamaTokenizer",
           "clean_up_tokenization_spaces": False, "legacy": False, "add_prefix_space": False,
           "added_tokens_decoder": {str(enc.control[c]): {"content": c, "special": True, "normalized": False,
                                                          "lstrip": False, "rstrip": False, "single_word": False}
                                    for c in tok.CONTROL},
           "chat_template": CHAT_TEMPLATE}
    with open(out + "/tokenizer_config.json", "w") as f:
        json.dump(cfg, f, indent=2)
    with open(out + "/special_tokens_map.json", "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": "<|im_end|>", "unk_token": "<unk>"}, f, indent=2)
    with open(out + "/generation_config.json", "w") as f:
        json.dump({"bos_token_id": enc.bos, "eos_token_id": [enc.im_end, 2], "do_sample": False}, f, indent=2)


def lr_at(step, total, peak, warmup):
    if step < warmup:
        return peak * (step + 1) / warmup
    p = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, p))))


def make_optimizer(model, lr, wd):
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": wd}, {"params": other, "weight_decay": 0.0}]
    try:
        return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=torch.cuda.is_available())
    except TypeError:
        return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))


def train(a, out, cfg, enc, dev, log):
    torch.manual_seed(a.seed)
    model = llama.Llama(cfg).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"params {n_params / 1e6:.2f}M")
    opt = make_optimizer(model, a.lr, a.weight_decay)
    extra = {"prefetch_factor": 4} if a.workers else {}
    data = torch.utils.data.DataLoader(Stream(out + "/tokenizer.model", a.seed, a.batch, a.max_len), batch_size=None,
                                       num_workers=a.workers, pin_memory=dev.type == "cuda", **extra)
    total = a.steps or 10 ** 9
    t0, seen, step = time.time(), 0, 0
    autocast = torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda")
    for ids, tgt in data:
        if step >= total:
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total, a.lr, a.warmup)
        ids, tgt = ids.to(dev, non_blocking=True), tgt.to(dev, non_blocking=True)
        with autocast:
            logits = model(ids)
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), tgt.view(-1), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        seen += ids.numel()
        step += 1
        if not a.steps and step == a.calib_steps:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            per = (time.time() - t0) / step
            total = max(step + 1, int(a.minutes * 60 / per))
            log(f"calibrated: {per * 1000:.1f} ms/step -> {total} steps")
        if step % 100 == 0 or step == total:
            log(f"step {step}/{total} loss {loss.item():.4f} lr {opt.param_groups[0]['lr']:.2e} "
                f"tok/s {seen / (time.time() - t0):.0f} elapsed {time.time() - t0:.0f}s")
    return model, step, time.time() - t0, n_params


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--tokenizer", default="", help="reuse this SentencePiece model instead of training one "
                    "(e.g. model/tokenizer.model, for a larger model the demo model can draft for)")
    ap.add_argument("--tok-examples", type=int, default=30000)
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--intermediate", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=96)
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=150)
    ap.add_argument("--steps", type=int, default=6500, help="0: calibrate the count to --minutes")
    ap.add_argument("--minutes", type=float, default=4.0)
    ap.add_argument("--calib-steps", type=int, default=40)
    ap.add_argument("--workers", type=int, default=10)
    ap.add_argument("--eval-count", type=int, default=500)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    out = a.out
    os.makedirs(out, exist_ok=True)
    logf = open(out + "/train_log.txt", "w")

    def log(msg):
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    log("args " + json.dumps(vars(a)))
    t0 = time.time()
    texts = ["".join(t for t, _ in gen_data.render_chatml(ex["messages"], ex["tools"]))
             for ex in gen_data.generate(a.seed + 7919, a.tok_examples)]
    if a.tokenizer:  # a model sharing another's tokenizer (a draft/target pair)
        import shutil
        import sentencepiece as spm
        shutil.copyfile(a.tokenizer, out + "/tokenizer.model")
        sp = spm.SentencePieceProcessor(model_file=out + "/tokenizer.model")
    else:
        sp = tok.train_tokenizer(texts, out + "/tokenizer", a.vocab)
    enc = tok.Encoder(sp)
    log(f"tokenizer: {sp.get_piece_size()} pieces in {time.time() - t0:.1f}s; control ids {enc.control}")
    cfg = llama.Config(vocab_size=sp.get_piece_size(), hidden_size=a.hidden, intermediate_size=a.intermediate,
                       num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                       max_position_embeddings=a.max_len)
    dev = torch.device(a.device)
    model, steps, secs, n_params = train(a, out, cfg, enc, dev, log)
    log(f"trained {steps} steps in {secs:.0f}s")
    if os.path.exists(out + "/tokenizer.vocab"):
        os.remove(out + "/tokenizer.vocab")
    llama.export_hf(model, out, enc.bos, [enc.im_end, 2])
    write_tokenizer_files(out, enc)
    del model
    model = load_hf(out, dev)
    res = evaluate(model, enc, a.eval_count, dev, log)
    res.update({"steps": steps, "train_seconds": round(secs), "params": n_params})
    with open(out + "/eval.json", "w") as f:
        json.dump(res, f, indent=2)
    log("result " + json.dumps(res))


if __name__ == "__main__":
    main()
