"""The names the rest of the project reads: calibrator families and input kinds.

Pure Python with no imports, so a command-line parser can offer these as choices without
loading numpy, scipy or scikit-learn. ``cord_ops.calibrators`` builds its registry in this
order and refuses to import if a family's ``name`` is missing here (or the other way round).
"""

#: Every calibrator ``make_calibrator`` accepts, in the paper's order: the seven maps that
#: may change a top-1 decision (VS, SVS, MS, SMS, Dir-ODIR, IROvA, IROvA-TS, as in Tables
#: 7 and 8), then the fit-time preserving baselines TS and IRM, TS-TvA and MCCT-I (Table 4).
CALIBRATOR_NAMES = ("vs", "svs", "ms", "sms", "dir-odir", "irova", "irova-ts", "ts", "irm",
                    "ts-tva", "mcct-i")

#: The map with no parameters: the classifier's own probabilities (softmax of its logits,
#: or its probability rows renormalised). Not one of the paper's families, so not in
#: CALIBRATOR_NAMES (the reproduction and the per-family tables iterate those); it is what
#: every family is compared against and what is served when none improves a model.
IDENTITY = "identity"

#: Every calibrator that can be fitted, registered and exported: the families and identity.
FAMILY_NAMES = (*CALIBRATOR_NAMES, IDENTITY)

#: ``--calibrator auto``: the family is chosen per model by cross-validation on the
#: calibration split (``cord_ops.select``).
AUTO = "auto"

#: What ``--calibrator`` and ``CORDCalibratedClassifier(calibrator=...)`` accept.
CALIBRATOR_CHOICES = (AUTO, *FAMILY_NAMES)

#: Calibrators whose map never changes a row's top-1 class (up to float64 ties).
TOP1_PRESERVING = ("ts", "irm", "ts-tva", "mcct-i")

#: Calibrators that can be fitted from sums over partitions of the rows (``cord_ops.reduce``);
#: the others need every row in one process.
REDUCIBLE = ("ts", "vs")

#: What a score matrix holds: raw logits, or probabilities on the simplex.
INPUT_KINDS = ("logits", "probs")
