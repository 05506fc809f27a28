"""Built-in tasks: infer-dataset, infer-one, wait, finish."""

from __future__ import annotations

import json
import logging
from typing import Any

from experiment_design.constants import IMAGENET_MEAN, IMAGENET_STD
from experiment_design.errors import TracrError
from experiment_design.models import get_model_spec
from experiment_design.tasks.base import Task, register_task

log = logging.getLogger(__name__)


@register_task("infer-dataset")
class InferDataset(Task):
    """Run inferences over the preloaded inputs, each at the partitioner's next split.

    The count is ``params.count`` if given, else ``sweeps`` (default ``run.repeats``, 1) times the
    partitioner's sweep length (cyclic: valid splits x repeats, inputs cycled),
    else one pass over the dataset. The ``i``-th inference infers input ``i`` (cycled), or
    input ``item`` where the partitioner has one (cyclic: the how-many-th visit of this
    split, so every split sees the same inputs in any order). A partitioner with a
    ``finished()`` method that turns true (cyclic's race, once decided) ends the task
    there, before the count.
    """

    requires = "infer"

    def total(self, participant: Any) -> int:
        """How many inferences this task will run."""
        if self.params.get("count") is not None:
            return int(self.params["count"])
        sweep = participant.partitioner.sweep_length() if participant.partitioner else None
        if sweep:
            run = participant.config.run
            default = (run.repeats if run else 1) or 1
            return int(self.params.get("sweeps", default)) * int(sweep)
        return len(participant.inputs)

    def run(self, participant: Any) -> None:
        """Infer ``total`` times; inputs are cycled; stop early if asked."""
        self.check(participant)
        if participant.partitioner is None or participant.partitioner.ctx is None:
            raise TracrError("infer-dataset: the partitioner was not prepared")
        inputs = participant.inputs
        total = self.total(participant)
        participant.progress(done=0, total=total)
        log.info("infer-dataset: %d inferences over %d inputs", total, len(inputs))
        finished = getattr(participant.partitioner, "finished", None)
        for i in range(total):
            if participant.cancel_event.is_set() or participant.stop_event.is_set():
                raise TracrError("stopped before the end of infer-dataset")
            if finished is not None and finished():
                participant.progress(total=i)
                break
            k = participant.partitioner.next_split()
            j = getattr(participant.partitioner, "item", None)  # cyclic: the pair's visit
            x, label, item = inputs[(i if j is None else j) % len(inputs)]
            row = participant.infer(x, label, item, k)
            participant.partitioner.observe(k, row)
            probe = getattr(participant.partitioner, "link_probe", None)  # adaptive's
            nbytes = probe() if probe is not None else None
            if nbytes:
                participant.partitioner.observe_probe(participant.probe_bandwidth(nbytes))
            participant.progress(done=i + 1, split=k)
        if finished is not None and finished():
            log.info("infer-dataset: the partitioner finished: %s",
                     json.dumps(participant.partitioner.decision().get("race"), default=str))


@register_task("infer-one")
class InferOne(Task):
    """One inference on one input: ``index`` into the dataset or an image ``path``;
    ``split`` (default: the partitioner's next split)."""

    requires = "infer"

    def run(self, participant: Any) -> None:
        """Infer once and record the row (top1 and an output checksum included)."""
        self.check(participant)
        if self.params.get("path"):
            x, label, item = _load_image(participant, self.params["path"])
        else:
            idx = int(self.params.get("index", 0))
            if not participant.inputs:
                raise TracrError("infer-one: this participant has no inputs")
            x, label, item = participant.inputs[idx % len(participant.inputs)]
        k = self.params.get("split")
        if k is None:
            k = participant.partitioner.next_split()
        participant.progress(done=0, total=1, split=int(k))
        participant.infer(x, label, item, int(k))
        participant.progress(done=1)


def _load_image(participant: Any, path: str) -> tuple[Any, Any, str]:
    from PIL import Image
    from torchvision.transforms import functional as F

    spec = get_model_spec(participant.config.model.name)
    c, h, w = spec.input_shape
    img = Image.open(path).convert("RGB").resize((w, h))
    x = F.normalize(F.to_tensor(img), list(IMAGENET_MEAN), list(IMAGENET_STD))
    return x.unsqueeze(0), None, str(path)


@register_task("wait")
class Wait(Task):
    """Idle until the partners are done or the observer says finish (``timeout_s`` optional)."""

    def run(self, participant: Any) -> None:
        """Block on the participant's finish event."""
        timeout = self.params.get("timeout_s")
        if not participant.finish_event.wait(float(timeout) if timeout else None):
            raise TracrError(f"wait: nothing finished within {timeout} s")


@register_task("finish")
class Finish(Task):
    """Say goodbye to downstream partners (edge) or end a wait (anyone)."""

    def run(self, participant: Any) -> None:
        """Close data channels politely and set the finish event."""
        if hasattr(participant, "finish_partners"):
            participant.finish_partners()
        participant.finish_event.set()
