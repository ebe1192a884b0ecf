"""Studies: packages that use qkvlab like any user would, each answering its own questions.

A study registers its experiments and profiles with ``qkvlab.experiments.registry`` when it is
imported, and is found through the ``qkvlab.studies`` entry-point group; the library below
(attention, models, data, train, experiments, analysis, report) never imports a study.
"""
