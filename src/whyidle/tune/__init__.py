"""``whyidle tune``: what-if trials that measure the fixes for the user.

The command runs as it is (the baseline), its diagnosis names the candidate settings
(:mod:`whyidle.tune.plan`), and each is tried by re-running the unchanged command with the
settings applied inside it (:mod:`whyidle.instrument.overrides`) until enough steady steps give a
confidence interval (:mod:`whyidle.tune.trial`); :mod:`whyidle.tune.session` runs the search
within the budget and :mod:`whyidle.tune.result` builds ``whyidle.tune/1``.
"""
