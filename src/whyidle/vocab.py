"""Vocabularies that the layer recording a run and the layers reading it both need.

The in-process instrument writes these names into the run's records and the analysis and rules
read them back; keeping them here, below both, lets every import point down
(``../shared/DESIGN.md``, "Architecture"): :mod:`whyidle.instrument` and :mod:`whyidle.env`
import them to write, :mod:`whyidle.analysis` and :mod:`whyidle.diagnose` to read, and neither
side imports the other. Standard library only (the agent imports it inside the observed program).
"""

from __future__ import annotations

# -- experiment trackers -------------------------------------------------------------------------

#: Packages whose hooks are an experiment tracker's (``wandb.watch`` and the like): timed, as the
#: program's own are (:mod:`whyidle.instrument.hooks`), and named as logging work by the rules
#: (:mod:`whyidle.diagnose.rules_work`, :mod:`whyidle.diagnose.rules_job`). Other libraries' hooks
#: (DeepSpeed's parameter gathering, PEFT, Lightning) are the framework's cost and stay as they are.
TRACKERS = frozenset({"wandb", "tensorboard", "tensorboardX", "mlflow", "comet_ml", "neptune", "clearml", "aim",
                      "dvclive"})

# -- whole-job regions ---------------------------------------------------------------------------

#: Kinds of ``region`` records (:mod:`whyidle.instrument.regions`): the parts of a job outside its
#: training steps that whyidle times by the frameworks' entry points.
REGION_KINDS = ("evaluation", "checkpoint", "logging")

#: Region kinds called from the training loop's own body (not a loop of their own, like an
#: evaluation): their time inside a training step is left out of the step's shares by the analysis
#: (:mod:`whyidle.analysis.accounting`) and out of the hooks' time by the instrument
#: (:attr:`whyidle.instrument.regions.Regions.outside_ns`).
OUTSIDE_STEP = ("checkpoint", "logging")
