#!/usr/bin/env python3
"""Held-out field-level exact match of an exlagent model directory (e.g. the EXL2 `model/`),
through `exlagent generate` on the CPU, greedy, without a grammar or (--grammar) under each
document's JSON Schema (`--json-schema`, json.dumps spacing as in training). Standard library only.

    python3 eval_exl2.py --exlagent ../../build/exlagent --model model --count 100 [--grammar]

The documents are the first --count of eval.py's held-out set (same seed), so the numbers are
comparable with the PyTorch evaluation of the unquantized model.
"""
import argparse
import json
import subprocess
import tempfile

import gen_data
from eval_common import TEST_SEED, score


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exlagent", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--grammar", action="store_true", help="constrain each reply by the document's schema")
    a = ap.parse_args()
    pairs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, ex in enumerate(gen_data.generate(TEST_SEED, a.count, tool_fraction=0.0)):
            prompt = "".join(t for t, _ in gen_data.render_chatml(ex["messages"][:-1], [], add_generation_prompt=True))
            cmd = [a.exlagent, "generate", "--model", a.model, "--prompt", prompt, "--temperature", "0",
                   "--max-tokens", "120", "--threads", "2"]
            if a.grammar:
                schema = f"{tmp}/schema{i}.json"
                with open(schema, "w") as f:
                    json.dump(ex["schema"], f)
                cmd += ["--json-schema", schema, "--whitespace", "spaced"]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True)
            pairs.append((ex["answer"], out.stdout))
    result = score(pairs)
    result["grammar"] = a.grammar
    print(json.dumps(result))


if __name__ == "__main__":
    main()
