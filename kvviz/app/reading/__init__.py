"""A run, read once, typed and torch-free: what each column showed and what it is evidence of.

* ``catalog``: the page's methods without their code (names, labels, controls, groups, page order);
* ``evidence``: the one evidence rule and the words every surface says it in;
* ``questions``: the one vocabulary of questions that presets, exercises and the walk-through ask;
* ``contradicted``: what a column did with an inserted contradiction (which answer, both probabilities);
* ``reading``: ``read(payload, answers)``, the ``Reading`` of a run and its ``answer(question)``.
"""
