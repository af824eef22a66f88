"""Re-check every output of a guided `specexec bench` report against its original schema (jsonschema):
no output marked valid may be rejected. Usage: python check_guided_verdicts.py REPORT.json"""

import collections
import json
import sys
from pathlib import Path

import jsonschema
from jsonschema.validators import validator_for

DATA = Path(__file__).resolve().parents[2] / "data" / "jsonschemabench" / "Github_trivial.jsonl"


def accepts(schema: dict, text: str) -> bool:
    try:
        validator = validator_for(schema, default=jsonschema.Draft202012Validator)(schema)
        return validator.is_valid(json.loads(text))
    except Exception:
        return False


def main(path: str) -> int:
    schemas = {r["id"]: r["schema"] for r in map(json.loads, DATA.read_text().splitlines()) if r}
    row = json.loads(Path(path).read_text())["results"][0]
    counts: collections.Counter = collections.Counter()
    wrongly_valid = []
    for rec in row["requests"]:
        error = rec.get("error") or ""
        kind = "refused" if "cannot enforce" in error else rec["finish_reason"]
        ok = accepts(schemas[rec["id"]], rec["text"])
        counts[f"{kind}: jsonschema {'accepts' if ok else 'rejects'}"] += 1
        counts[f"marked {rec['schema_valid']}"] += 1
        if rec["schema_valid"] is True and not ok:
            wrongly_valid.append(rec["id"])
    print(f"schema_valid_rate {row['schema_valid_rate']:.3f} over {len(row['requests'])} requests")
    for key, n in sorted(counts.items()):
        print(f"  {key}: {n}")
    print(f"outputs marked valid that jsonschema rejects: {len(wrongly_valid)} {wrongly_valid}")
    return 1 if wrongly_valid else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
