"""Calibration against real PyTorch runs: measure kernels and collectives on the hardware at hand
(``microbench``), fit a hardware profile from them (``fit``), and check the simulator's
prediction against a real hybrid-parallel training job (``compare``).

Only ``microbench``, ``launch``, ``gpt``, ``pipeline`` and ``train`` import torch (the optional
``clustersim[calibrate]`` extra); ``fit``, ``compare``'s prediction side and ``report`` do not.
"""
