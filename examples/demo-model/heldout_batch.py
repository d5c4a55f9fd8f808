#!/usr/bin/env python3
"""The held-out documents of the demo model's evaluation as an `exlagent batch` input: the first
--count of eval.py's held-out set (same seed, extraction only), one line per document with the
system prompt (instructions and the JSON Schema) and the document as the user turn, the schema
(so that the reply is generated under its grammar, unless --no-schema) and max_tokens. This is the
input of BENCHMARKS.md's speculation runs (issue #23). Standard library only.

    python3 heldout_batch.py --count 48 --out H.jsonl
    exlagent batch --backend cuda --model model --input H.jsonl --output out.jsonl --speculate auto
"""
import argparse
import json

import gen_data
from eval_common import TEST_SEED


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--no-schema", action="store_true", help="leave the schema out (no grammar)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    with open(a.out, "w", encoding="utf-8") as f:
        for i, ex in enumerate(gen_data.generate(TEST_SEED, a.count, tool_fraction=0.0)):
            line = {"id": f"doc-{i}", "messages": ex["messages"][:-1], "max_tokens": a.max_tokens}
            if not a.no_schema:
                line["schema"] = ex["schema"]
            f.write(json.dumps(line, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
