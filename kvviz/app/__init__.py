"""The lab in the browser and its Space: the page (``ui`` puts ``page`` together), a run read once
(``reading``: its marks, evidence, swaps and times, and the one vocabulary of questions every
surface asks), runs as text and tables (``present``), figures across handoffs (``plots``), what
crossed drawn (``tokenview``), two runs side by side (``compare``), the sweep (``sweep``), what the
page shows of each method (``methods``: its figure, the facts under its answer, its copy), the
presets and their lessons (``presets``, ``lessons``), the workshop's exercises (``exercises``,
``workshop``) and the Space export (``space``).
"""
