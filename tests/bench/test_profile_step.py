"""profile_step's accounting of a step's time (`bench/profile_step.py`): the C++ layer and stack ops are
containers whose linear and attention calls count as such, and the per-op table of a stacked forward is
its ops over the layer count."""

from __future__ import annotations

from dataclasses import dataclass, field

from specexec.bench.profile_step import MODEL, STEP, layer_ops, split


@dataclass(eq=False)
class Event:
    name: str
    cpu_time_total: float
    cpu_parent: Event | None = None
    cpu_children: list[Event] = field(default_factory=list)

    def child(self, name: str, micros: float) -> Event:
        event = Event(name, micros, self)
        self.cpu_children.append(event)
        return event


def a_stacked_step() -> list[Event]:
    """One step: 1000 us, the model 800 of it, a stack op of two layers (600 us) whose calls are two
    q4_linear (100 each), two paged attentions (150 each) and an add (20), and a sampling op outside."""
    step = Event(STEP, 1000.0)
    model = step.child(MODEL, 800.0)
    stack = model.child("specexec_cpu::prenorm_stack", 600.0)
    children = [
        stack.child("specexec_cpu::q4_linear", 100.0),
        stack.child("specexec_cpu::paged_attention_short", 150.0),
        stack.child("specexec_cpu::q4_linear", 100.0),
        stack.child("specexec_cpu::paged_attention_short", 150.0),
        stack.child("aten::add", 20.0),
    ]
    head = model.child("specexec_cpu::q8_linear", 50.0)
    sample = step.child("aten::argmax", 30.0)
    return [step, model, stack, *children, head, sample]


def test_the_stack_ops_calls_count_as_linear_and_attention():
    totals = split(a_stacked_step())
    assert totals["linear"] == 250.0  # the two q4_linear and the head
    assert totals["attention"] == 300.0
    assert totals["other ops"] == 20.0 + 80.0  # the add and the stack op's own glue (600 - 520)
    assert totals["Python in model"] == 800.0 - 250.0 - 300.0 - 100.0
    assert totals["outside: ops"] == 30.0


def test_a_stacked_forward_is_tabled_as_its_average_layer():
    rows = {name: (calls, micros) for name, calls, micros in layer_ops(a_stacked_step(), 1, 2)}
    assert rows["specexec_cpu::q4_linear"] == (1.0, 100.0)
    assert rows["specexec_cpu::paged_attention_short"] == (1.0, 150.0)
    assert rows["specexec_cpu::prenorm_stack"] == (0.5, 40.0)  # its 80 us of glue over 2 layers
    assert rows["aten::add"] == (0.5, 10.0)
