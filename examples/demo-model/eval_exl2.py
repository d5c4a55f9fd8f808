#!/usr/bin/env python3
"""Held-out field-level exact match of an exlagent model directory (e.g. the EXL2 `model/`),
through `exlagent generate` on the CPU, greedy, without a grammar. Standard library only.

    python3 eval_exl2.py --exlagent ../../build/exlagent --model model --count 100

The documents are the first --count of eval.py's held-out set (same seed), so the numbers are
comparable with the PyTorch evaluation of the unquantized model.
"""
import argparse
import json
import subprocess

import gen_data
from eval_common import TEST_SEED, score


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exlagent", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--count", type=int, default=100)
    a = ap.parse_args()
    pairs = []
    for ex in gen_data.generate(TEST_SEED, a.count, tool_fraction=0.0):
        prompt = "".join(t for t, _ in gen_data.render_chatml(ex["messages"][:-1], [], add_generation_prompt=True))
        out = subprocess.run([a.exlagent, "generate", "--model", a.model, "--prompt", prompt, "--temperature", "0",
                              "--max-tokens", "120", "--threads", "2"], capture_output=True, text=True, check=True)
        pairs.append((ex["answer"], out.stdout))
    print(json.dumps(score(pairs)))


if __name__ == "__main__":
    main()
