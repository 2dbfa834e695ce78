"""The lowest layer: plain Python, no torch. Where the project's folders are (``paths``), model
facts as plain data (``facts``), what a server allows (``policy``) and what a request may hold
(``limits``), how a prompt is laid out (``prompts``), the one request and the one result shape
(``results``), the figures' shared pieces (``plotkit``) and the ZeroGPU probe (``zerogpu``).
"""
