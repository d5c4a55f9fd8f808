"""The demo model's SentencePiece tokenizer: training on the synthetic corpus, and encoding exactly as
exlagent does (text is cut at the control pieces <|im_start|> / <|im_end|>, which become their ids;
each stretch between them is encoded by SentencePiece; no dummy prefix)."""
import os
import re

import sentencepiece as spm

CONTROL = ["<|im_start|>", "<|im_end|>"]
USER_DEFINED = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
_SPLIT = re.compile("(" + "|".join(re.escape(c) for c in CONTROL) + ")")


def train_tokenizer(texts, prefix, vocab_size):
    """Trains `prefix`.model on the lines of `texts` (control pieces removed from the text)."""
    corpus = prefix + ".corpus.txt"
    with open(corpus, "w", encoding="utf-8") as f:
        for t in texts:
            for seg in _SPLIT.split(t):
                if seg in CONTROL:
                    continue
                for line in seg.split("\n"):
                    if line.strip():
                        f.write(line + "\n")
    spm.SentencePieceTrainer.train(
        input=corpus, model_prefix=prefix, vocab_size=vocab_size, model_type="bpe", byte_fallback=True,
        character_coverage=1.0, split_digits=True, add_dummy_prefix=False, remove_extra_whitespaces=False,
        normalization_rule_name="identity", unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        control_symbols=CONTROL, user_defined_symbols=USER_DEFINED, max_sentence_length=8192,
        num_threads=os.cpu_count() or 1, minloglevel=2)
    os.remove(corpus)
    return spm.SentencePieceProcessor(model_file=prefix + ".model")


class Encoder:
    def __init__(self, sp):
        self.sp = sp
        self.control = {c: sp.piece_to_id(c) for c in CONTROL}
        self.bos = sp.bos_id()
        self.im_end = self.control["<|im_end|>"]

    def encode(self, text):
        ids = []
        for seg in _SPLIT.split(text):
            if not seg:
                continue
            if seg in self.control:
                ids.append(self.control[seg])
            else:
                ids.extend(self.sp.encode(seg))
        return ids

    def decode(self, ids):
        out, run = [], []
        for i in ids:
            if self.sp.is_control(i):
                out.append(self.sp.decode(run))
                out.append(self.sp.id_to_piece(i))
                run = []
            else:
                run.append(i)
        out.append(self.sp.decode(run))
        return "".join(out)
