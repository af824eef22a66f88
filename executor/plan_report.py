"""What an executor's start chose and measured, as `specexec run` and `specexec tune` print it: one line
per choice (quantization and drafter, dtype, forward, kernels, CUDA graphs), and a table of the start's
measurements (measured now, or read from the store, and how long each took)."""

from __future__ import annotations

from .kernel_plan.measurement.journal import MeasurementNote


def plan_lines(executor) -> list[str]:
    """One line per choice the executor's start made, each with its reason."""
    lines = [executor.setup.auto_choices.summary()]
    choice = executor.setup.dtype_choice
    lines.append(f"dtype {choice.dtype}: {choice.reason}")
    impl = executor.setup.model_impl
    lines.append(f"model_impl {impl.impl}: {impl.reason}")
    if executor.setup.quantization is not None:
        lines.append(executor.setup.quantization.summary())
    if executor.model.device.type == "cpu":
        from .layers.cpu_kernels import describe_cpu_kernels

        lines.append(f"cpu kernels: {describe_cpu_kernels()}")
        linear = executor.setup.linear_backend
        lines.append(f"cpu_linear {linear.backend}: {linear.reason}")
        if executor.setup.quantization is not None:
            kernel = executor.setup.quantized_kernel
            lines.append(f"quantized_kernel {kernel.kernel}: {kernel.reason}")
    lines += [report.describe() for report in executor.setup.cuda_graphs]
    return lines


def measurement_table(notes: list[MeasurementNote]) -> str:
    """The start's measurements, one row each: what, how it was had, seconds, its file."""
    if not notes:
        return "no measurements (every choice was configured)"
    rows = [("measurement", "how", "seconds", "stored at")]
    rows += [(n.kind, n.how, f"{n.seconds:.1f}", str(n.path or "-")) for n in notes]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = ["  ".join([*(cell.ljust(w) for cell, w in zip(row[:3], widths)), row[3]]) for row in rows]
    total = sum(n.seconds for n in notes)
    return "\n".join([*lines, f"measuring took {total:.1f} s in all"])
