"""Each built-in drafter owns itself: its options are parsed once per executor, and what the executor
decides for a run (grammar masks, tree shape, confidence stop) reaches it as one `DraftBinding` when it
is bound, never as attributes written onto it afterwards."""

from __future__ import annotations

import pytest
from eagle3_heads import make_head_dir
from medusa_heads import make_medusa_dir
from rest_stores import token_datastore_file
from specexec.drafters.base import DraftBinding, DrafterContext
from specexec.executor.config import ExecutorConfig
from specexec.executor.engine.speculation.speculation_stage import choose_drafter
from specexec.executor.engine.speculation.speculative_config import SpeculativeConfig
from specexec.executor.executor import Executor
from specexec.plugins import get_plugin_manager
from tiny_models import make_tiny_model

SETTINGS = dict(
    num_kv_blocks=64, block_size=4, max_num_tokens=64, max_batch_size=4, dtype="float64", device="cpu"
)


def options_of(kind: str, tmp_path) -> dict:
    """``speculative_config`` for one built-in drafter on the tiny llama target."""
    if kind == "REST":
        return {"datastore": token_datastore_file([[9, 10, 11] * 6])}
    if kind == "Eagle":
        return {"speculative_model": str(make_head_dir(tmp_path / "eagle"))}
    if kind == "Medusa":
        return {"speculative_model": str(make_medusa_dir(tmp_path / "medusa"))}
    if kind == "LayerSkip":
        return {"skip_layers": [1]}
    if kind == "UserProvided":
        return {"drafter": "specexec.drafters.ngram:NGramDrafter", "drafter_options": {"is_keep_all": False}}
    return {}


BUILT_IN = (
    "NGram",
    "Suffix",
    "REST",
    "Lookahead",
    "LayerSkip",
    "DraftTarget",
    "Eagle",
    "Medusa",
    "UserProvided",
)


def spec_for(kind: str, tmp_path, **extra) -> SpeculativeConfig:
    return SpeculativeConfig.from_dict(
        {"decoding_type": kind, "max_draft_len": 3, **options_of(kind, tmp_path), **extra}
    )


@pytest.mark.parametrize("kind", BUILT_IN)
def test_a_drafters_options_are_parsed_once_per_executor(kind, tmp_path, monkeypatch):
    spec = spec_for(kind, tmp_path)
    options_type = choose_drafter(spec, get_plugin_manager()).factory.options
    checks = []
    real = options_type.__post_init__
    monkeypatch.setattr(options_type, "__post_init__", lambda self: (checks.append(1), real(self))[1])
    _, model = make_tiny_model("llama")
    Executor(model, ExecutorConfig(speculative_config=spec, **SETTINGS)).close()
    assert len(checks) == 1


@pytest.mark.parametrize("kind", BUILT_IN)
def test_binding_writes_nothing_onto_a_built_drafter_but_its_binding(kind, tmp_path):
    """Build the drafter as the config would, note ``vars()``, hand it to an executor that turns
    draft-side masks off and, where the drafter can, drafts trees and ends chains by confidence: the
    drafter's attributes are the same objects afterwards, except ``binding``, which carries those
    decisions (LayerSkip's own `bind_target` also records the layers it chose)."""
    _, model = make_tiny_model("llama")
    probe = spec_for(kind, tmp_path)
    context = DrafterContext(model, None, model.config.vocab_size, ExecutorConfig(**SETTINGS), None, 3)
    drafter = choose_drafter(probe, get_plugin_manager()).build(context)
    extra = {"draft_tree": True} if drafter.default_tree is not None else {}
    if drafter.reports_confidence:
        extra["draft_len_policy"] = "confidence"
    before = dict(vars(drafter))
    config = ExecutorConfig(
        speculative_config=spec_for(kind, tmp_path, **extra), draft_side_grammar_masks=False, **SETTINGS
    )
    Executor(model, config, drafter=drafter).close()
    after = vars(drafter)
    own = {"skipped", "choice", "_layers"} if kind == "LayerSkip" else set()
    assert set(after) == set(before)
    changed = {name for name in before if after[name] is not before[name]}
    assert changed - own == {"binding"}
    binding = drafter.binding
    assert isinstance(binding, DraftBinding) and binding.use_grammar_masks is False
    assert drafter.use_grammar_masks is False
    assert (binding.draft_tree is not None) == ("draft_tree" in extra)
    assert (binding.confidence_stop is not None) == drafter.reports_confidence


def test_an_old_style_factory_gets_a_clear_error():
    from specexec.plugins import hookimpl

    class OldStyle:
        @hookimpl
        def specexec_drafter_factories(self):
            return {"Old": lambda spec_config, context: None}

    plugins = get_plugin_manager()  # (a fresh manager: the plugin stays in this test)
    plugins.register(OldStyle(), name="old_style")
    with pytest.raises(ValueError, match=r"\(options, context\)"):
        choose_drafter(SpeculativeConfig.from_dict({"decoding_type": "Old"}), plugins)
