"""Training and evaluating what the C2C and translation handoffs run: records aligned for fusion
(``examples``), NLL through the frozen receiver (``scoring``), the communication measure
(``communication``), ``train-fuser`` (``train``) and ``eval-fuser`` (``evaluate``), the
translator's second stage (``translator_train``) and ``eval-translator`` (``translator_eval``).
"""
