"""Training and evaluating what the C2C and translation handoffs run: records aligned for fusion
(``examples``), NLL through the frozen receiver (``scoring``), the communication measure
(``communication``), ``train-fuser`` (``train``) and ``eval-fuser`` (``evaluate``); the translator's
notes and paragraphs (``translator_data``), its objective (``translator_loss``), the research
objectives of its second stage (``translator_train``), ``train-translator`` (``train_translator``),
and ``eval-translator`` (``translator_eval`` over ``translator_sets``, ``translator_rows`` and
``translator_summary``).
"""
