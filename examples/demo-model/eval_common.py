"""The held-out set's seed and the scoring shared by eval.py (PyTorch) and eval_exl2.py (exlagent)."""
import json

TEST_SEED = 424242


def same_value(a, b):
    if isinstance(b, bool) or isinstance(a, bool):
        return a is b
    if isinstance(b, (int, float)) and isinstance(a, (int, float)):
        return float(a) == float(b)
    return a == b


def score(pairs):
    """pairs: (expected object, reply text). Field-level and whole-object exact match, JSON validity."""
    fields = hits = valid = exact = 0
    for gold, text in pairs:
        try:
            pred = json.loads(text)
        except ValueError:
            pred = None
        ok = isinstance(pred, dict)
        valid += ok
        n_ok = sum(1 for k, v in gold.items() if ok and k in pred and same_value(pred[k], v))
        fields += len(gold)
        hits += n_ok
        exact += ok and n_ok == len(gold) and len(pred) == len(gold)
    n = max(1, len(pairs))
    return {"documents": len(pairs), "fields": fields, "field_exact_match": round(hits / max(1, fields), 4),
            "json_valid": round(valid / n, 4), "object_exact_match": round(exact / n, 4)}
