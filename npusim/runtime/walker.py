"""The one graph walk: a plan's steps (each with its `.op`) in order over a dict of tensor values.

The integer Interpreter (interpreter.py), the float reference (reference.py) and zo's float suffix
(zo/float_suffix.py) all run on it; what differs between them is a hook of a Walker subclass:

- `reads(position, step)`: the tensors a step reads, or None to skip it (a PAD folded into its
  reader, an op inside a chain);
- `sources(position, values)`: the dicts an input is looked up in, first hit wins (overrides or
  trainable parameters before the activations, a form's real-valued constants after them), and
  `missing(step, t)` for a tensor none holds (the model's constant, an error, or None);
- `call(position, step, args)`: the evaluation (a kernel, a grouped run, a chain's lookup, a
  float form with its hybrid path);
- `output(step, t, y)`: each output, checked against its declared shape and clamped (a range, an
  activation the int8 graph folded);
- `after(position, step, reads, values)`: what follows a step (a tape for the backward pass,
  dropping the activations whose last reader it was).
"""

from __future__ import annotations

from ..errors import NpusimError


def kind_of(step) -> str:
    """The name errors give a step: its kernel's kind (an op's, or a wrapper's), else its op's."""
    return getattr(step, "kind", "") or step.op.kind


class Walker:
    """The walk; subclasses override the hooks. The defaults read every input from `values`."""

    def reads(self, position, step):
        return step.op.inputs

    def sources(self, position, values) -> tuple:
        return (values,)

    def missing(self, step, t):
        raise NpusimError(
            f"op {step.op.index} ({kind_of(step)}): no value for tensor {t}; "
            "expected every graph input to be given"
        )

    def call(self, position, step, args):
        return step(*args)

    def output(self, step, t, y):
        return y

    def after(self, position, step, reads, values) -> None:
        pass

    def args(self, position, step, reads, values) -> list:
        """The values of `reads` (a negative index, an absent optional input: None)."""
        sources = self.sources(position, values)
        out = []
        for t in reads:
            if t < 0:
                out.append(None)
                continue
            for source in sources:
                if t in source:
                    out.append(source[t])
                    break
            else:
                out.append(self.missing(step, t))
        return out

    def step(self, position, step, values, reads=None) -> tuple:
        """One step on values: its outputs, a tuple in the op's output order, through output()."""
        reads = self.reads(position, step) if reads is None else reads
        result = self.call(position, step, self.args(position, step, reads, values))
        results = result if isinstance(result, tuple) else (result,)
        outputs = step.op.outputs
        if len(results) != len(outputs):
            raise NpusimError(
                f"op {step.op.index} ({kind_of(step)}): computed {len(results)} outputs, "
                f"the model declares {len(outputs)}"
            )
        return tuple(self.output(step, t, y) for t, y in zip(outputs, results))

    def walk(self, steps, values: dict) -> dict:
        """Every step in order, its outputs added to values; returns values (the same dict)."""
        for position, step in enumerate(steps):
            reads = self.reads(position, step)
            if reads is None:
                continue
            for t, y in zip(step.op.outputs, self.step(position, step, values, reads)):
                values[t] = y
            self.after(position, step, reads, values)
        return values
