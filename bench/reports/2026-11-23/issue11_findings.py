"""Each finding of issue 11, tried through the public API on whichever specexec is imported (run it with
PYTHONPATH pointing at an older checkout to see the old behaviour). Usage: python issue11_findings.py CASE
(cases: see the branches below; findings.txt has both outputs)."""

import json
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
from specexec import Executor, ExecutorConfig, Request, SamplingParams
from specexec.drafters import Drafter, DraftProposal
from test_grammar_support import smollm2_tokenizer
from tiny_models import make_tiny_model

case = sys.argv[1]
V = 49152


def guided_ex(tok=None, **kw):
    _, m = make_tiny_model("llama", vocab_size=V)
    return Executor(
        m,
        ExecutorConfig(
            num_kv_blocks=128, block_size=8, dtype="float64", device="cpu", guided_json_max_whitespace=0, **kw
        ),
        tokenizer=tok or smollm2_tokenizer(),
    )


def fmt(s):
    return {"type": "json_schema", "json_schema": {"schema": s}}


GOOD = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
CHAT = [{"role": "user", "content": "hi"}]

if case == "1-dead-grammar":
    ex = guided_ex()
    bad = Request(
        CHAT, SamplingParams(max_tokens=8), response_format={"type": "regex", "regex": "[^\\x00-\\U0010FFFF]"}
    )
    try:
        outs = ex.run([Request(CHAT, SamplingParams(max_tokens=8), response_format=fmt(GOOD)), bad])
        print("outputs:", [(o.finish_reason.value, (o.error or "")[:60]) for o in outs])
    except Exception as e:
        print("run raised:", type(e).__name__, str(e)[:80])
    try:
        print(
            "next run:",
            [o.finish_reason.value for o in ex.run([Request(CHAT, SamplingParams(max_tokens=4))])],
        )
    except Exception as e:
        print("next run raised:", type(e).__name__, str(e)[:80])
elif case == "2-infinite-grammar":
    ex = guided_ex()
    (out,) = ex.run(
        [
            Request(
                CHAT,
                SamplingParams(max_tokens=8),
                response_format={"type": "grammar", "grammar": 'root ::= a\na ::= "x" a'},
            )
        ]
    )
    print("finished:", out.finish_reason.value, repr(out.text))
elif case == "3-anyof":
    import jsonschema

    S = {
        "type": "object",
        "properties": {
            "a": {"type": "integer"},
            "b": {"type": "integer"},
            "c": {"type": "string", "maxLength": 3},
        },
        "required": ["b"],
        "anyOf": [{"required": ["a"]}, {"required": ["c"]}],
    }
    ex = guided_ex()
    outs = ex.run(
        [
            Request(CHAT, SamplingParams(max_tokens=48, temperature=1.0, seed=i), response_format=fmt(S))
            for i in range(40)
        ]
    )
    bad = 0
    fin = 0
    for o in outs:
        if o.finish_reason.value != "stop":
            continue
        fin += 1
        try:
            jsonschema.validate(json.loads(o.text), S)
        except Exception:
            bad += 1
    print(f"{fin} finished outputs, {bad} rejected by jsonschema")
elif case in ("4-release-raises", "4-slots-2.5"):

    class D(Drafter):
        def num_draft_slots(self, r):
            return 2.5 if case == "4-slots-2.5" else 2

        def propose(self, r, n, res):
            return DraftProposal([1] * n)

        def release(self, r):
            if case == "4-release-raises":
                raise RuntimeError("release broke")

    _, m = make_tiny_model("llama")
    ex = Executor(
        m, ExecutorConfig(num_kv_blocks=64, block_size=4, dtype="float64", device="cpu"), drafter=D(3)
    )
    try:
        print(
            "outputs:",
            [
                o.finish_reason.value
                for o in ex.run([Request([1, 2, 3], SamplingParams(max_tokens=6, ignore_eos=True))] * 1)
            ],
        )
    except Exception as e:
        print("run raised:", type(e).__name__, str(e)[:80])
elif case == "5-no-eos":
    tok = smollm2_tokenizer()
    tok.eos_token = None
    ex = guided_ex(tok)
    outs = ex.run(
        [
            Request(CHAT, SamplingParams(max_tokens=30), response_format=fmt(GOOD)),
            Request(CHAT, SamplingParams(max_tokens=8), response_format=fmt({"type": 5})),
        ]
    )
    print("outputs:", [(o.finish_reason.value, (o.error or o.text)[:70]) for o in outs])
elif case == "6-nan-logits":
    _, m = make_tiny_model("llama")
    ex = Executor(m, ExecutorConfig(num_kv_blocks=64, block_size=4, dtype="float64", device="cpu"))

    def hook(mod, args, out):  # NaN embeddings where token 255 is: the second request's prompt only
        out = out.clone()
        out[args[0] == 255] = float("nan")
        return out

    m.model.embed_tokens.register_forward_hook(hook)
    try:
        print(
            "outputs:",
            [
                (o.finish_reason.value, (o.error or "")[:50])
                for o in ex.run(
                    [
                        Request([1, 2, 3], SamplingParams(max_tokens=4, ignore_eos=True)),
                        Request([255, 4], SamplingParams(max_tokens=4, ignore_eos=True, temperature=1.0)),
                    ]
                )
            ],
        )
    except Exception as e:
        print("run raised:", type(e).__name__, str(e)[:80])
elif case == "7-draft-slots-cap":
    _, m = make_tiny_model("llama")
    cfg = ExecutorConfig(
        num_kv_blocks=8,
        block_size=4,
        dtype="float64",
        device="cpu",
        speculative_config={"decoding_type": "NGram", "max_draft_len": 4},
    )
    (out,) = Executor(m, cfg).run(
        [Request([9, 10, 11] * 9 + [9], SamplingParams(max_tokens=4, ignore_eos=True))]
    )
    print("output:", out.finish_reason.value, (out.error or "")[:80])
elif case == "8-abort":
    _, m = make_tiny_model("llama")
    ex = Executor(m, ExecutorConfig(num_kv_blocks=64, block_size=4, dtype="float64", device="cpu"))
    print("abort_request:", hasattr(ex, "abort_request"))
elif case == "threads":
    _, m = make_tiny_model("llama")
    ex = Executor(m, ExecutorConfig(num_kv_blocks=100, block_size=4, dtype="float64", device="cpu"))
    errs = []

    def go(seed):
        try:
            ex.run(
                [
                    Request(list(range(1 + i, 9 + i)), SamplingParams(max_tokens=12, ignore_eos=True))
                    for i in range(8)
                ]
            )
        except Exception as e:
            errs.append(f"{type(e).__name__}: {str(e)[:60]}")

    ts = [threading.Thread(target=go, args=(s,)) for s in (0, 1)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    print("thread errors:", errs)
    try:
        ex.run([Request([1, 2], SamplingParams(max_tokens=2))])
        print("next run ok")
    except Exception as e:
        print("next run raised:", type(e).__name__)
elif case == "config":
    for make in (
        lambda: ExecutorConfig(unknown_key=1),
        lambda: ExecutorConfig(speculative_config={"method": "ngram", "num_speculative_tokens": 3}),
    ):
        try:
            make()
            print("accepted")
        except Exception as e:
            print(type(e).__name__, str(e)[:90])
